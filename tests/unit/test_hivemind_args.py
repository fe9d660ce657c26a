"""The hivemind drop-in maps hivemind 1.1.12's arguments onto chaosp2p and names what it refuses.

Nothing here starts a peer: ``DHT(start=False)`` only builds the configuration, and
``Optimizer(...)`` checks its arguments before it touches the DHT.
"""

from __future__ import annotations

import pytest

from chaosp2p.errors import ConfigError
from chaosp2p.hivemind import DHT, Float16Compression, NoCompression
from chaosp2p.hivemind.arguments import (
    DHT_ARGUMENTS,
    OPTIMIZER_ARGUMENTS,
    check_arguments,
    dht_peer_config,
    optimizer_settings,
)
from chaosp2p.runtime.config import PeerConfig
from chaosp2p.wire.identity import Identity
from chaosp2p.wire.multiaddr import Multiaddr

PEER = str(Identity.generate().peer_id)
BOOTSTRAP = f"/ip4/127.0.0.1/tcp/4001/p2p/{PEER}"


def settings(**changes: object) -> object:
    arguments: dict[str, object] = {
        "target_batch_size": 10000,
        "batch_size_per_step": 32,
        "use_local_updates": False,
        "matchmaking_time": 15.0,
        "averaging_timeout": 60.0,
        "allreduce_timeout": None,
        "load_state_timeout": 600.0,
        "shutdown_timeout": 5,
        "grad_compression": None,
        "state_averaging_compression": None,
        "delay_state_averaging": True,
        "verbose": False,
        "unsupported": {},
    }
    arguments.update(changes)
    return optimizer_settings(**arguments)  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ DHT
def test_hivemind_default_listens_on_loopback_with_the_local_profile() -> None:
    config = dht_peer_config(initial_peers=None, host_maddrs=None, identity_path=None)
    assert config.listen == ("/ip4/127.0.0.1/tcp/0",)
    assert config.profile == "local"
    assert config.bootstrap == ()


def test_a_wildcard_listen_address_selects_the_lan_profile() -> None:
    config = dht_peer_config(initial_peers=None, host_maddrs=["/ip4/0.0.0.0/tcp/0"], identity_path=None)
    assert config.listen == ("/ip4/0.0.0.0/tcp/0",)
    assert config.profile == "lan"
    assert config.transport == PeerConfig.lan().transport


def test_changes_take_effect_at_the_epoch_under_way() -> None:
    # A drop-in epoch is seconds of step() calls before its round: a decision (milliseconds) can
    # govern the epoch under way, as a hivemind newcomer adds its samples to it.
    for maddrs in (None, ["/ip4/0.0.0.0/tcp/0"]):
        config = dht_peer_config(initial_peers=None, host_maddrs=maddrs, identity_path=None)
        assert config.negotiation.max_margin_steps == 1
    given = dht_peer_config(initial_peers=None, host_maddrs=None, identity_path=None, base=PeerConfig.wan())
    assert given.negotiation == PeerConfig.wan().negotiation  # a configuration the script gave is kept


def test_initial_peers_become_bootstrap_addresses_whatever_their_type() -> None:
    config = dht_peer_config(
        initial_peers=[Multiaddr.parse(BOOTSTRAP), BOOTSTRAP.replace("4001", "4002")],
        host_maddrs=["/ip6/::1/tcp/0"],
        identity_path="/tmp/key",
    )
    assert config.bootstrap == (BOOTSTRAP, BOOTSTRAP.replace("4001", "4002"))
    assert config.profile == "local"  # ::1 is loopback too
    assert config.identity_path == "/tmp/key"


def test_a_given_peer_config_is_kept_and_only_addresses_are_replaced() -> None:
    base = PeerConfig.wan()
    config = dht_peer_config(initial_peers=[BOOTSTRAP], host_maddrs=None, identity_path=None, base=base)
    assert config.profile == "wan"
    assert config.membership == base.membership
    assert config.listen == ("/ip4/127.0.0.1/tcp/0",)


def test_non_tcp_listen_addresses_are_refused_naming_host_maddrs() -> None:
    with pytest.raises(ConfigError, match="host_maddrs"):
        DHT(start=False, host_maddrs=["/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/tcp/0/ws"])


def test_a_quic_listen_address_beside_a_tcp_one_is_dropped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    """issue 22, item 4: lightning-hivemind's default listens on TCP and QUIC; TCP is enough here."""
    dht = DHT(start=False, host_maddrs=["/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic"])
    assert dht.config.listen == ("/ip4/0.0.0.0/tcp/0",)
    assert "/ip4/0.0.0.0/udp/0/quic" in caplog.text and "TCP only" in caplog.text
    with pytest.raises(ConfigError, match="TCP only"):
        DHT(start=False, host_maddrs=["/ip4/0.0.0.0/udp/0/quic"])


def test_a_single_string_is_not_taken_for_a_list_of_peers() -> None:
    with pytest.raises(ConfigError, match="initial_peers must be a list"):
        DHT(BOOTSTRAP, start=False)


def test_dht_arguments_at_hivemind_defaults_are_accepted_without_starting() -> None:
    dht = DHT(start=False, client_mode=False, use_ipfs=False, tls=True, num_workers=4, record_validators=[])
    assert not dht.is_alive()
    assert dht.config.profile == "local"


def test_refused_dht_arguments_are_named_all_at_once_each_with_its_reason() -> None:
    with pytest.raises(ConfigError) as caught:
        DHT(start=False, use_ipfs=True, authorizer=object(), client_mode=True)
    message = str(caught.value)
    assert "use_ipfs" in message and "IPFS" in message
    assert "authorizer" in message and "swarm key" in message
    assert "client_mode" not in message  # accepted without effect, not refused


def test_tuning_dht_arguments_are_accepted_with_one_warning_naming_each(caplog: pytest.LogCaptureFixture) -> None:
    """issue 22, item 4: what albert and lightning pass (client_mode, announce_maddrs, ...) no longer refuses."""
    DHT(start=False, client_mode=True, announce_maddrs=["/ip4/1.2.3.4/tcp/5"], wait_timeout=10, num_workers=8)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    for name in ("client_mode=True", "announce_maddrs=", "wait_timeout=10", "num_workers=8"):
        assert name in warnings[0]
    assert "no client mode" in warnings[0]  # the reason, not only the name


def test_an_empty_announce_list_means_the_default_and_is_not_named(caplog: pytest.LogCaptureFixture) -> None:
    DHT(start=False, announce_maddrs=[], record_validators=[])
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_unknown_dht_arguments_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"unknown argument.*bogus_option"):
        DHT(start=False, bogus_option=1)


def test_every_listed_default_is_accepted_by_the_checker_without_a_note() -> None:
    for rules in (DHT_ARGUMENTS, OPTIMIZER_ARGUMENTS):
        defaults = {name: rule.default for name, rule in rules.items()}
        assert check_arguments("X", defaults, rules) == ()
        assert check_arguments("X", defaults, rules, local_updates=True) == ()


# ------------------------------------------------------------------------------------ Optimizer
def test_gradient_averaging_maps_to_sync_mode_with_the_target_as_global_batch() -> None:
    mapped = settings(averaging_timeout=10.0, matchmaking_time=3.0, load_state_timeout=120.0)
    config = mapped.collaboration_config("local")  # type: ignore[attr-defined]
    assert config.mode == "sync"
    assert config.global_batch == 10000
    assert config.round_timeout_min_s == 10.0
    assert config.retry_wait_s == 3.0
    assert config.join_timeout_s == 120.0
    assert config.wire_dtype == "float32"
    assert config.rebalance_interval_steps == 1  # epochs are long: shares follow throughput every epoch
    # ... and a newcomer loads the epoch completed last, which every member keeps
    assert (config.snapshot_ahead_steps, config.snapshot_every_step) == (0, True)


def test_allreduce_timeout_wins_over_averaging_timeout() -> None:
    config = settings(averaging_timeout=60.0, allreduce_timeout=7.5).collaboration_config("lan")  # type: ignore[attr-defined]
    assert config.round_timeout_min_s == 7.5
    assert config.retry_wait_s == 15.0


def test_none_timeouts_keep_the_profile_values() -> None:
    config = settings(averaging_timeout=None, matchmaking_time=None).collaboration_config("lan")  # type: ignore[attr-defined]
    from chaosp2p.training.config import CollaborationConfig

    assert config.round_timeout_min_s == CollaborationConfig.lan().round_timeout_min_s
    assert config.retry_wait_s == CollaborationConfig.lan().retry_wait_s


def test_local_updates_map_to_diloco_that_is_exact_parameter_averaging() -> None:
    config = settings(use_local_updates=True).collaboration_config("local")  # type: ignore[attr-defined]
    assert config.mode == "diloco"
    assert config.local_steps == 1
    assert config.outer_lr == 1.0
    assert config.outer_momentum == 0.0


def test_float16_compression_becomes_the_float16_wire_format() -> None:
    assert settings(grad_compression=Float16Compression()).wire_dtype == "float16"  # type: ignore[attr-defined]
    local = settings(use_local_updates=True, state_averaging_compression=Float16Compression())
    assert local.wire_dtype == "float16"  # type: ignore[attr-defined]
    assert settings(grad_compression=NoCompression()).wire_dtype == "float32"  # type: ignore[attr-defined]


def test_compression_that_does_not_apply_is_reported_not_dropped() -> None:
    mapped = settings(use_local_updates=True, grad_compression=Float16Compression())
    assert mapped.wire_dtype == "float32"  # type: ignore[attr-defined]
    assert any("grad_compression has no effect" in note for note in mapped.notes)  # type: ignore[attr-defined]


def test_compression_chaosp2p_cannot_do_is_refused_by_name() -> None:
    class ScaledFloat16Compression:
        pass

    with pytest.raises(ConfigError, match="grad_compression=ScaledFloat16Compression"):
        settings(grad_compression=ScaledFloat16Compression())


@pytest.mark.parametrize(
    ("name", "value", "local_updates"),
    [
        ("auxiliary", True, False),
        ("extra_tensors", [object()], False),
        ("grad_averager_factory", object(), False),
        ("average_state_every", 4, True),
        ("average_opt_statistics", ["exp_avg_sq"], True),
    ],
)
def test_optimizer_arguments_that_would_change_results_raise_naming_them(
    name: str, value: object, local_updates: bool
) -> None:
    with pytest.raises(ConfigError, match=name):
        settings(unsupported={name: value}, use_local_updates=local_updates)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("delay_optimizer_step", True),
        ("delay_grad_averaging", True),
        ("client_mode", True),
        ("average_state_every", 4),
        ("average_opt_statistics", ["exp_avg_sq"]),
        ("averager_opts", {"bandwidth": 1000.0}),
        ("tracker_opts", {"min_refresh_period": 0.5}),
        ("performance_ema_alpha", 0.5),
        ("next_chunk_timeout", 3.0),
    ],
)
def test_optimizer_tuning_arguments_are_accepted_and_named(name: str, value: object) -> None:
    """issue 22, item 4: albert passes delay_*, averager_opts, tracker_opts, client_mode; none changes results."""
    mapped = settings(unsupported={name: value})
    assert any(note.startswith(name + "=") for note in mapped.ignored)  # type: ignore[attr-defined]


def test_reuse_grad_buffers_is_honoured_and_needs_gradient_averaging() -> None:
    assert settings(reuse_grad_buffers=True).reuse_grad_buffers  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="reuse_grad_buffers"):
        settings(reuse_grad_buffers=True, use_local_updates=True)


def test_unsupported_optimizer_arguments_at_their_defaults_pass() -> None:
    defaults = {"client_mode": False, "auxiliary": False, "averager_opts": {}, "extra_tensors": ()}
    mapped = settings(unsupported={**defaults, "tracker_opts": None, "load_state_compression": NoCompression()})
    assert mapped.mode == "sync"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"target_batch_size": 0}, "target_batch_size"),
        ({"batch_size_per_step": -1}, "batch_size_per_step"),
        ({"averaging_timeout": -1.0}, "averaging_timeout"),
        ({"matchmaking_time": float("nan")}, "matchmaking_time"),
        ({"load_state_timeout": None}, "load_state_timeout"),
    ],
)
def test_invalid_values_are_refused(changes: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        settings(**changes)


# ------------------------------------------------------------------------- Optimizer (needs torch)
def test_the_optimizer_refuses_unsupported_arguments_before_joining_anything() -> None:
    torch = pytest.importorskip("torch")
    from chaosp2p.hivemind import Optimizer

    model = torch.nn.Linear(4, 2)
    dht = DHT(start=False)
    with pytest.raises(ConfigError) as caught:
        Optimizer(
            dht=dht,
            run_id="run",
            target_batch_size=64,
            batch_size_per_step=8,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            delay_grad_averaging=True,
            grad_averager_factory=object(),
            auxiliary=True,
        )
    assert "auxiliary" in str(caught.value) and "grad_averager_factory" in str(caught.value)
    assert "delay_grad_averaging" not in str(caught.value)  # accepted without effect
    assert not dht.is_alive()


def test_an_optimizer_factory_needs_params_and_an_instance_refuses_them() -> None:
    torch = pytest.importorskip("torch")
    from chaosp2p.hivemind.optimizer import _build_optimizer

    model = torch.nn.Linear(4, 2)
    built = _build_optimizer(lambda params: torch.optim.Adam(params), model.parameters())
    assert [p for g in built.param_groups for p in g["params"]] == list(model.parameters())
    with pytest.raises(ConfigError, match="params="):
        _build_optimizer(lambda params: torch.optim.Adam(params), None)
    with pytest.raises(ConfigError, match="params="):
        _build_optimizer(torch.optim.Adam(model.parameters()), model.parameters())


def test_the_parameter_module_holds_the_optimizers_own_parameters() -> None:
    torch = pytest.importorskip("torch")
    from chaosp2p.hivemind.optimizer import ParameterModule

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    module = ParameterModule(list(model.parameters()))
    assert all(a is b for a, b in zip(module.parameters(), model.parameters(), strict=True))
    assert "epoch" in module.state_dict()


def test_the_scheduler_steps_once_per_epoch_and_follows_a_downloaded_epoch() -> None:
    torch = pytest.importorskip("torch")
    from chaosp2p.hivemind.optimizer import EpochStepper, ParameterModule

    def stepper() -> EpochStepper:
        torch.manual_seed(0)
        model = torch.nn.Linear(2, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        return EpochStepper(optimizer, ParameterModule(list(model.parameters())), scheduler)

    member = stepper()
    for _ in range(5):
        member.step()
    assert member.module.epochs_done == 5
    assert member.optimizer.param_groups[0]["lr"] == 0.25  # halved at epochs 2 and 4

    # A newcomer loads the member's module and optimizer state: same lr from then on.
    newcomer = stepper()
    newcomer.module.load_state_dict(member.module.state_dict())
    newcomer.load_state_dict(member.state_dict())
    for stepped in (member, newcomer):
        stepped.step()  # epoch 6: halved again
    assert newcomer.optimizer.param_groups[0]["lr"] == member.optimizer.param_groups[0]["lr"] == 0.125
    assert newcomer.scheduler.last_epoch == member.scheduler.last_epoch == 6

    # A local-updates newcomer starts from a fresh optimizer: the schedule is replayed.
    fresh = stepper()
    fresh.sync_scheduler(6, lr_loaded=False)
    assert fresh.optimizer.param_groups[0]["lr"] == 0.125
