"""Pieces every ``chaosp2p`` command shares: logging, profiles, peer options, errors, ready files."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import anyio
import anyio.to_thread
import click
from rich.console import Console
from rich.logging import RichHandler

from chaosp2p.atomic_file import write_bytes_atomically
from chaosp2p.runtime.config import PROFILES, PeerConfig
from chaosp2p.wire.multiaddr import Multiaddr

console = Console(stderr=True)
BACKENDS = ("trio", "asyncio")


def setup_logging(level: str) -> None:
    """Rich logs on a terminal; one plain, greppable line per record when logging to a file or pipe."""
    if console.is_terminal:
        handler: logging.Handler = RichHandler(console=console, show_path=False, rich_tracebacks=False)
        handler.setFormatter(logging.Formatter("%(message)s", datefmt="[%X]"))
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=level.upper(), handlers=[handler])


DEFAULT_PROFILE = "lan"
"""What the commands run when ``--profile`` is not given: listen on every interface, announce the
host's routable addresses, LAN timings. ``local`` (loopback, fast timers) is for the demo and tests."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerOptions:
    """The options every command that runs a peer takes (see :func:`peer_options`)."""

    profile: str = DEFAULT_PROFILE
    """A built-in profile name or a TOML profile file."""
    listen: tuple[str, ...] = ()
    bootstrap: tuple[str, ...] = ()
    identity_path: str | None = None
    swarm_key_path: str | None = None
    backend: str = "trio"


PEER_OPTION_NAMES = tuple(field.name for field in dataclasses.fields(PeerOptions))


def load_config(options: PeerOptions, *, any_port: bool = False) -> PeerConfig:
    """A PeerConfig from a built-in profile name or a TOML file, with the command line's options on top.

    ``any_port``: without ``--listen``, a built-in profile listens on a free port instead of its
    fixed one (for short-lived commands that may run beside a ``chaosp2p peer`` on the same host).
    """
    profile = options.profile
    if profile.endswith(".toml") or Path(profile).is_file():
        config = PeerConfig.from_toml(profile)
    else:
        config = PeerConfig.profile_named(profile)
        if any_port and not options.listen:
            config = config.replace(listen=[str(Multiaddr(a.host_kind, a.host, 0)) for a in config.listen_addrs()])
    if options.listen:
        config = config.replace(listen=options.listen)
    if options.bootstrap:
        config = config.replace(bootstrap=options.bootstrap)
    if options.identity_path is not None:
        config = config.replace(identity_path=options.identity_path)
    if options.swarm_key_path is not None:
        config = config.replace(swarm_key_path=options.swarm_key_path)
    return config


def fail(message: str) -> NoReturn:
    """Print ``message`` as an error and exit with status 2."""
    console.print(f"[bold red]error:[/] {message}")
    sys.exit(2)


def peer_options(function: Callable[..., Any]) -> Callable[..., Any]:
    """Options of every command that runs a peer: addresses, identity, admission, profile, backend.

    The decorated command receives them as one ``peer: PeerOptions`` argument.
    """
    options = [
        click.option(
            "--listen",
            "listen",
            multiple=True,
            metavar="MULTIADDR",
            help="Address to listen on, e.g. /ip4/0.0.0.0/tcp/4001 (repeatable). Default: the profile's.",
        ),
        click.option(
            "--bootstrap",
            "bootstrap",
            multiple=True,
            metavar="MULTIADDR",
            help="A peer to join through, e.g. /ip4/10.0.0.5/tcp/4001/p2p/12D3KooW... (repeatable).",
        ),
        click.option(
            "--identity",
            "identity_path",
            type=click.Path(dir_okay=False),
            default=None,
            help="Ed25519 key file; created with mode 0600 if missing, so the PeerID stays stable.",
        ),
        click.option(
            "--swarm-key",
            "swarm_key_path",
            type=click.Path(dir_okay=False, exists=True),
            default=None,
            help="Pre-shared swarm key: only peers with the same key can connect.",
        ),
        click.option(
            "--profile",
            default=DEFAULT_PROFILE,
            show_default=True,
            metavar="NAME|FILE.toml",
            help=f"Built-in profile ({', '.join(PROFILES)}) or a TOML profile file such as peers/lan.toml. "
            "lan listens on all interfaces with LAN timings; local (loopback only) is for one machine.",
        ),
        click.option("--backend", default="trio", show_default=True, type=click.Choice(BACKENDS)),
    ]

    @functools.wraps(function)
    def command(*args: Any, **options: Any) -> Any:
        # click passes every option by name; the peer's ones become one PeerOptions, the rest stay.
        peer = PeerOptions(**{name: options.pop(name) for name in PEER_OPTION_NAMES})
        return function(*args, peer=peer, **options)

    wrapped: Callable[..., Any] = command
    for option in reversed(options):
        wrapped = option(wrapped)
    return wrapped


async def announce_ready(peer_id: object, addrs: Sequence[Multiaddr], ready_file: str | None) -> None:
    """Print the peer's id and addresses, and write them to ``ready_file`` (atomically) if given."""
    click.echo(f"peer id: {peer_id}")
    for addr in addrs:
        click.echo(f"listening on {addr}")
    sys.stdout.flush()
    if ready_file:
        # Write then rename, so a script polling for the file never reads half of it; the
        # temporary name is created without following a link planted there.
        data = json.dumps({"peer_id": str(peer_id), "addrs": [str(a) for a in addrs]}).encode()
        await anyio.to_thread.run_sync(functools.partial(write_bytes_atomically, ready_file, data))
