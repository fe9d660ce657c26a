"""``chaosp2p state serve`` and ``chaosp2p state pull``: seed and fetch checkpoints through the swarm."""

from __future__ import annotations

import json
import signal
import time
from dataclasses import dataclass
from typing import Any

import anyio
import click
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from chaosp2p.api.async_peer import open_peer
from chaosp2p.cli.common import PeerOptions, announce_ready, console, fail, load_config, peer_options, setup_logging
from chaosp2p.errors import ChaosError, ConfigError
from chaosp2p.protocols.transfer import DropReason, TransferProgress
from chaosp2p.protocols.transfer.messages import MANIFEST_DIGEST_BYTES
from chaosp2p.runtime.config import PeerConfig
from chaosp2p.state.checkpoint_file import read_checkpoint, write_checkpoint
from chaosp2p.state.snapshot import SnapshotStore
from chaosp2p.wire.identity import PeerID


@click.group()
def state() -> None:
    """Seed and fetch training state (checkpoints) through the swarm."""


@state.command()
@click.argument("checkpoint", type=click.Path(dir_okay=False, exists=True))
@click.option("--run", "run", required=True, help="Training run id the state belongs to.")
@click.option("--step", default=0, show_default=True, help="Training step (version) of this state.")
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write {peer_id, addrs} as JSON here once serving.",
)
@peer_options
def serve(checkpoint: str, run: str, step: int, ready_file: str | None, peer: PeerOptions) -> None:
    """Serve CHECKPOINT (.npz, .pt) as run RUN's state to newcomers until interrupted."""
    setup_logging("info")
    try:
        config = load_config(peer, any_port=True)
        flat = read_checkpoint(checkpoint)
        store = SnapshotStore(config.transfer)
        info = store.publish(run, step, flat)
    except ConfigError as exc:
        fail(str(exc))
    console.print(
        f"serving run [bold]{run}[/] step {step}: {info.total_bytes / 2**20:.1f} MiB, {len(flat.arrays)} arrays, "
        f"digest {info.digest.hex()}",
        highlight=False,
    )
    try:
        anyio.run(_serve, config, store, run, ready_file, backend=peer.backend)
    except ChaosError as exc:
        fail(str(exc))


async def _serve(config: PeerConfig, store: SnapshotStore, run: str, ready_file: str | None) -> None:
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_peer(config) as peer:
            await peer.serve_state(store, runs=[run])
            await announce_ready(peer.peer_id, peer.addrs, ready_file)
            async for _ in signals:
                break


@state.command()
@click.option("--run", "run", required=True, help="Training run id to fetch.")
@click.option("--out", "out", required=True, type=click.Path(dir_okay=False), help="Where to write it (.npz or .pt).")
@click.option("--step", type=int, default=None, help="A particular step (default: the newest all sources hold).")
@click.option(
    "--source",
    "sources",
    multiple=True,
    metavar="MULTIADDR",
    help="Pull from these peers instead of looking the run up in the DHT (repeatable).",
)
@click.option("--max-sources", default=8, show_default=True, help="Use at most this many sources.")
@click.option(
    "--digest",
    "digest_hex",
    default=None,
    metavar="HEX",
    help="Pull only the snapshot with this digest (SHA-256 of its manifest, as `state serve` prints).",
)
@click.option(
    "--trust",
    "trusted",
    multiple=True,
    metavar="PEERID",
    help="Only versions these sources hold are eligible (repeatable); others still serve chunks of it.",
)
@click.option(
    "--resume",
    "resume_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Remember verified chunks here so an interrupted pull resumes.",
)
@click.option("--timeout", "timeout_s", default=600.0, show_default=True, help="Give up after this many seconds.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary instead of a table.")
@peer_options
def pull(
    run: str,
    out: str,
    step: int | None,
    sources: tuple[str, ...],
    max_sources: int,
    digest_hex: str | None,
    trusted: tuple[str, ...],
    resume_path: str | None,
    timeout_s: float,
    as_json: bool,
    peer: PeerOptions,
) -> None:
    """Fetch run RUN's state from several peers in parallel and write it to --out.

    The state pulled is the step and digest that most sources agree on; a source announcing
    anything else is reported and not used. --digest and --trust pin the state.
    """
    setup_logging("warning")
    if not sources and not peer.bootstrap:
        fail("give --bootstrap (to find the run's sources in the DHT) or --source")
    try:
        digest = _parse_digest(digest_hex)
        trust = tuple(PeerID.parse(p) for p in trusted)
    except (ValueError, ChaosError) as exc:
        fail(str(exc))
    pins = _Pins(digest=digest, trusted=trust)
    try:
        config = load_config(peer, any_port=True)
        summary = anyio.run(
            _pull,
            config,
            run,
            out,
            step,
            sources,
            max_sources,
            pins,
            resume_path,
            timeout_s,
            as_json,
            backend=peer.backend,
        )
    except TimeoutError:
        fail(f"the pull did not finish within {timeout_s:g} s")
    except ChaosError as exc:
        fail(str(exc))
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        console.print(
            f"wrote run [bold]{run}[/] step {summary['step']} to {out}: {summary['bytes'] / 2**20:.1f} MiB in "
            f"{summary['seconds']:.2f} s ({summary['bytes_per_s'] / 1e6:.0f} MB/s) "
            f"from {len(summary['sources'])} sources"
        )


@dataclass(frozen=True, slots=True)
class _Pins:
    digest: bytes | None
    trusted: tuple[PeerID, ...]


def _parse_digest(text: str | None) -> bytes | None:
    if text is None:
        return None
    try:
        digest = bytes.fromhex(text)
    except ValueError:
        raise ConfigError(f"--digest must be hexadecimal (got {text!r})") from None
    if len(digest) != MANIFEST_DIGEST_BYTES:
        raise ConfigError(f"--digest must be {MANIFEST_DIGEST_BYTES * 2} hex digits (SHA-256 of the manifest)")
    return digest


async def _pull(
    config: PeerConfig,
    run: str,
    out: str,
    step: int | None,
    sources: tuple[str, ...],
    max_sources: int,
    pins: _Pins,
    resume_path: str | None,
    timeout_s: float,
    quiet: bool,
) -> dict[str, Any]:
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[detail]}"),
        console=console,
        disable=quiet,
    )
    bar: TaskID | None = None

    def update(report: TransferProgress) -> None:
        nonlocal bar
        if bar is None:
            bar = progress.add_task(f"{run} step {report.step}", total=report.bytes_total, detail="")
        active = [s for s in report.sources if s.active]
        detail = "  ".join(f"{s.peer.short()} {s.rate_bytes_per_s / 1e6:.0f} MB/s" for s in active[:4])
        progress.update(bar, completed=report.bytes_done, detail=detail)

    started = time.perf_counter()
    with anyio.fail_after(timeout_s):
        async with open_peer(config) as peer:
            peer_started = time.perf_counter() - started
            with progress:
                loaded = await peer.state.load(
                    run,
                    step=step,
                    sources=list(sources) or None,
                    max_sources=max_sources,
                    progress=update,
                    resume_path=resume_path,
                    digest=pins.digest,
                    trusted=pins.trusted,
                )
                # From the start of the peer to a verified state: discovery included, leaving the
                # swarm and writing --out not (they do not depend on the links).
                elapsed = time.perf_counter() - started
                if bar is not None:
                    progress.update(bar, completed=loaded.completed.manifest.total_bytes)
    await anyio.to_thread.run_sync(write_checkpoint, out, loaded.state)
    total = loaded.completed.manifest.total_bytes
    timings = loaded.timings
    conflicts = [d for d in loaded.result.dropped if d.reason is DropReason.CONFLICT]
    for conflict in conflicts:
        console.print(f"[yellow]ignored source {conflict.source}[/]: {conflict.detail}", highlight=False)
    return {
        "run": run,
        "step": loaded.step,
        "out": out,
        "bytes": total,
        "seconds": elapsed,
        # What ``seconds`` is made of: starting this peer, finding the sources, agreeing on the
        # version and leasing it, the data phase (``verify_s`` is the chunk checking inside it),
        # and handing over the verified state.
        "peer_start_s": peer_started,
        "discovery_s": timings.discovery_s,
        "setup_s": timings.setup_s,
        "data_s": timings.data_s,
        "verify_s": timings.verify_s,
        "commit_s": timings.commit_s,
        "bytes_per_s": total / elapsed if elapsed > 0 else None,
        "data_bytes_per_s": total / timings.data_s if timings.data_s > 0 else None,
        "sources": {str(peer): count for peer, count in loaded.completed.bytes_by_source},
        "source_rates": {str(peer): rate for peer, rate in loaded.result.source_rates},
        "plans": [
            {
                "at_s": record.at_s,
                "reason": record.plan.reason.value,
                "chunks": record.plan.chunks,
                "shares": {str(k): n for k, n in record.plan.shares},
                "rates": {str(k): r for k, r in record.plan.rates},
            }
            for record in loaded.result.plans
        ],
        "penalised": [str(p.source) for p in loaded.result.penalised],
        "dropped": [str(d.source) for d in loaded.result.dropped],
        "conflicting": {str(d.source): d.detail for d in conflicts},
        "digest": loaded.completed.digest.hex(),
    }
