"""Scale-out: the paper's headline experiment -- how long a newcomer takes to contribute, and how
long the existing peers sit idle meanwhile, as the cluster grows.

    python benchmarks/scaleout.py --parts sim [--sim-sizes 4,8,...,256] [--seeds 5]
    python benchmarks/scaleout.py --parts real --sizes 4 [--state resnet50] [--link-scale 0.25]
    python benchmarks/scaleout.py --parts hivemind [--hivemind-python /work/hm-venv/bin/python]
    python benchmarks/scaleout.py --parts plot          # PNGs into docs/results/ from the JSON

Every part merges its results into ``--json`` (default ``benchmarks/results/scaleout.json``), so the
parts and cluster sizes can run one at a time (each under the machine's CPU lock) and ``plot``
draws whatever is there. Nothing here is in CI.

States (synthetic float32, parameters + Adam's two moments = 3x the model): ``resnet50`` 94 MB of
parameters -> 282 MB, ``vgg16`` 537 MB -> 1611 MB.

sim   (no processes; ``benchmarks/_scaleout_sim.py``) 4...256 members, one newcomer, every peer on
      a random 100-1000 Mbit/s link (seeded); negotiation on the real machines in virtual time,
      transfers from the shard planner's model. Methods: chaosp2p (all members, optimal plan, while
      they train), single source while they train (hivemind), single source at a barrier
      (Autoscaling), checkpoint-restart. Also the decision latency of scale-in (LEAVE), FAIL,
      connect-link and disconnect-link against the paper's 20 ms.
real  ``--sizes`` N real processes on 127.0.0.1: N-1 members train (``_scaleout_peer.py``), then a
      newcomer joins: chaosp2p (from every member), single source (``--max-snapshot-sources 1``),
      and checkpoint-restart (save, stop everyone, restart N processes, reload, gloo) -- the trial
      functions of ``benchmarks/training_elastic.py`` (b). Bytes and bandwidths are both scaled by
      ``--link-scale`` so transfer times match the unscaled setting: the state is ``scale x`` its
      size and each peer's upload is capped (``max_upload_bytes_per_s``) at ``scale x`` a rate drawn
      from 100-1000 Mbit/s with a fixed seed. Every join is checked bit-exact.
hivemind  hivemind 1.1.12 ``load_state_from_peers`` (one donor) next to chaosp2p from 1 and from 3
      uncapped sources, same bytes, same run (``benchmarks/_hivemind_baseline.py``,
      ``benchmarks/state.py``'s sources).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import machine, median, print_table

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_JSON = HERE / "results" / "scaleout.json"
STATES_MB = {"resnet50": 3 * 94.0, "vgg16": 3 * 537.0}
"""Parameters + Adam's two moments, MB."""
METHODS = ("chaosp2p", "chaos_rule", "single_live", "single_barrier", "restart")


def conditions() -> dict[str, Any]:
    return {
        "load_avg": os.getloadavg(),
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# ---------------------------------------------------------------------------------------- sim
def part_sim(args: argparse.Namespace) -> dict[str, Any]:
    from _scaleout_sim import compare, decision_latencies

    began = conditions()
    rows: list[dict[str, Any]] = []
    for state, mb in STATES_MB.items():
        for members in args.sim_sizes:
            for seed in range(args.seeds):
                for symmetric in (False, True):
                    entry = compare(
                        members,
                        int(mb * 1e6),
                        seed,
                        step_time_s=args.sim_step_s,
                        restart_overhead_s=args.restart_overhead_s,
                        disk_bytes_per_s=args.disk_mbs * 1e6,
                        symmetric=symmetric,
                    )
                    entry["state"] = state
                    rows.append(entry)
        print(f"[sim {state} done, load {os.getloadavg()[0]:.1f}]", flush=True)
    kinds = ("LEAVE", "FAIL", "LINK_UP", "LINK_DOWN", "JOIN")
    latency: list[dict[str, Any]] = []
    for network in ("lan", "wan"):
        for members in args.sim_sizes:
            samples: dict[str, list[float]] = {k: [] for k in kinds}
            for seed in range(args.latency_trials):
                for kind, value in decision_latencies(members, 1000 + seed, kinds, wan=network == "wan").items():
                    samples[kind].append(value)
            for kind, values in samples.items():
                latency.append(
                    {
                        "network": network,
                        "members": members,
                        "kind": kind,
                        "trials": len(values),
                        "p50_ms": 1000 * statistics.median(values) if values else None,
                        "max_ms": 1000 * max(values) if values else None,
                    }
                )
    return {
        "conditions": {"start": began, "end": conditions()},
        "step_time_s": args.sim_step_s,
        "restart_overhead_s": args.restart_overhead_s,
        "disk_mbs": args.disk_mbs,
        "seeds": args.seeds,
        "rows": rows,
        "decision_latency": latency,
    }


def show_sim(report: dict[str, Any]) -> None:
    for state in STATES_MB:
        rows = []
        sizes = sorted({r["members"] for r in report["rows"] if r["state"] == state})
        for members in sizes:
            mine = [
                r
                for r in report["rows"]
                if r["state"] == state and r["members"] == members and r.get("links", "upload") == "upload"
            ]

            def m(method: str, key: str, mine: list[dict[str, Any]] = mine) -> float:
                return median([r["methods"][method][key] for r in mine])

            rows.append(
                [members]
                + [m(k, "delay_s") for k in METHODS]
                + [m(k, "idle_total_s") for k in ("chaosp2p", "single_barrier", "restart")]
            )
        print_table(
            f"sim, {state} + Adam ({STATES_MB[state]:.0f} MB), uploads capped: delay and members' total idle s, "
            f"medians over {report['seeds']} seeds",
            [
                "members",
                "chaosp2p s",
                "Chaos rule s",
                "1 source, live s",
                "1 source, barrier s",
                "restart s",
                "idle: chaosp2p",
                "idle: barrier",
                "idle: restart",
            ],
            rows,
        )
    rows = [
        [r["network"], r["members"], r["kind"], r["p50_ms"], r["max_ms"], r["trials"]]
        for r in report["decision_latency"]
        if r["kind"] in ("LEAVE", "LINK_UP", "LINK_DOWN")
    ]
    print_table(
        "sim: decision latency (detection -> last member committed); lan: 0.5 ms RTTs, wan: 1-100 ms RTTs",
        ["network", "members", "event", "p50 ms", "max ms", "trials"],
        rows,
    )


# ---------------------------------------------------------------------------------------- real
def part_real(args: argparse.Namespace, size: int, state: str) -> dict[str, Any]:
    """One cluster size with real processes: chaosp2p join, single-source join, checkpoint-restart."""
    import training_elastic as te
    from _scaleout_sim import link_rates

    te.PEER = HERE / "_scaleout_peer.py"
    te.wait_steady = wait_steady_all  # join_trial waits with it too
    members = size - 1
    state_mb = STATES_MB[state] * args.link_scale
    caps = [rate / 1e6 for rate in link_rates(size + 1, args.link_seed + size, scale=args.link_scale)]
    member_caps, newcomer_cap = caps[:members], caps[members]
    began = conditions()
    root = Path(args.workdir or tempfile.mkdtemp(prefix="chaosp2p-scaleout-")) / f"{state}-{size}"
    root.mkdir(parents=True)
    stop_file, checkpoint = root / "stop-step", root / "checkpoint.pt"
    common = [
        "--state-mb",
        f"{state_mb:.3f}",
        "--train-mb",
        str(args.train_mb),
        "--batch",
        str(args.batch),
        "--compute-s",
        str(args.compute_s),
        "--ref-members",
        str(members),
        "--steps",
        "1000000",
        "--no-balance",
        "--digest-every",
        "1",
        "--upload-cap-mbs",
        f"{newcomer_cap:.4f}",  # the newcomers'; members override it below (the last flag wins)
    ]
    trial_args = argparse.Namespace(
        after_steps=3, newcomer_exit="kill", steady_steps=args.steady_steps, stop_file=stop_file, checkpoint=checkpoint
    )
    report: dict[str, Any] = {
        "size": size,
        "members": members,
        "state": state,
        "state_mb": state_mb,
        "member_caps_mbs": member_caps,
        "newcomer_cap_mbs": newcomer_cap,
        "bound_all_s": state_mb / sum(member_caps),
        "bound_single_mean_s": statistics.fmean(state_mb / c for c in member_caps),
    }
    with te.Cluster(root, common) as cluster:
        stopping = ["--stop-file", str(stop_file), "--checkpoint", str(checkpoint)]

        def extra(index: int) -> list[str]:
            return [*stopping, "--upload-cap-mbs", f"{member_caps[index]:.4f}"]

        started = time.monotonic()
        if args.join_batch and members > args.join_batch + 1:
            procs = start_members_staggered(te, cluster, members, extra, args.join_batch)
        else:
            procs = te.start_members(cluster, members, extra)
        te.wait_steady(procs, members, args.steady_steps)
        report["start_members_s"] = time.monotonic() - started
        founder_buffer = next(r["buffer_digest"] for r in procs[0].steps() if r.get("buffer_digest"))
        order = [("chaosp2p", 0), ("single", 1)]
        for kind, sources in order if size % 2 == 0 else order[::-1]:
            try:
                trial = te.join_trial(cluster, procs, trial_args, f"n-{kind}", sources)
            except (RuntimeError, TimeoutError) as exc:  # a failed trial is a result too; the restart still runs
                report[kind] = {"failed": f"{type(exc).__name__}: {str(exc)[-1500:]}"}
                print(f"[real {state} {size}: {kind} join FAILED: {str(exc)[-300:]}]", flush=True)
                continue
            trial["exact"] = join_exact(cluster.procs[-1], procs[0], founder_buffer)
            report[kind] = trial
            print(
                f"[real {state} {size}: {kind} join done, exact {trial['exact']}, load {os.getloadavg()[0]:.1f}]",
                flush=True,
            )
        report["restart"] = te.restart_trial(cluster, procs, trial_args)
        try:
            report["restart"]["exact"] = restart_exact(checkpoint, founder_buffer)
        except Exception as exc:
            report["restart"]["exact"] = f"not checked: {exc}"
        print(f"[real {state} {size}: restart done, load {os.getloadavg()[0]:.1f}]", flush=True)
    report["conditions"] = {"start": began, "end": conditions()}
    return report


def wait_steady_all(members: list[Any], count: int, steps: int) -> None:
    """``training_elastic.wait_steady``, but every member's liveness is checked on every poll (that
    one stops at the first unsteady member, so a member that died later in the list went unnoticed
    until its 900 s timeout)."""
    import training_elastic as te

    def steady() -> bool:
        for proc in members:
            proc.check_alive()
        return all(
            len(tail := proc.steps()[-steps:]) == steps and all(r["members"] == count for r in tail) for proc in members
        )

    te.wait_for(steady, f"{steps} steady steps with {count} members", te.SLOW_TIMEOUT_S)


def start_members_staggered(te: Any, cluster: Any, count: int, extra: Any, batch: int) -> list[Any]:
    """The founder, then the others ``batch`` at a time, each batch training with everyone before the
    next is launched (``te.start_members`` launches all at once: with 14 joiners on two cores the
    start-up storm itself was what the first 16-process run measured)."""
    founder = cluster.launch("m0", extra(0))
    cluster.wait_ready([founder])
    procs = [founder]
    while len(procs) < count:
        new = [
            cluster.launch(f"m{i}", ["--join", founder.addr, *extra(i)])
            for i in range(len(procs), min(count, len(procs) + batch))
        ]
        cluster.wait_ready(new)
        procs += new
        size = len(procs)

        def together(size: int = size, procs: list[Any] = procs) -> bool:
            for proc in procs:
                proc.check_alive()
            return all((s := p.steps()) and s[-1]["members"] == size for p in procs)

        te.wait_for(together, f"{size} members training together", te.SLOW_TIMEOUT_S)
        print(f"[{size} members training]", flush=True)
    return procs


def join_exact(newcomer: Any, founder: Any, founder_buffer: str) -> dict[str, Any]:
    """The newcomer's frozen buffer equals the founder's, and its parameters equal the founder's at
    every step both recorded a digest for."""
    mine = newcomer.steps()
    theirs = {r["step"]: r.get("param_digest") for r in founder.steps()}
    compared = [
        (r["step"], r["param_digest"] == theirs[r["step"]])
        for r in mine
        if r.get("param_digest") and theirs.get(r["step"])
    ]
    buffers = [r["buffer_digest"] for r in mine if r.get("buffer_digest")]
    return {
        "buffer": bool(buffers) and all(b == founder_buffer for b in buffers),
        "param_steps_compared": len(compared),
        "params": bool(compared) and all(ok for _, ok in compared),
    }


def restart_exact(checkpoint: Path, founder_buffer: str) -> bool:
    """The restarted processes loaded the founder's frozen buffer from the checkpoint."""
    import numpy as np
    import torch
    import xxhash

    state = torch.load(checkpoint, weights_only=True)
    buffer = state["model"]["frozen_state"].numpy()
    return bool(xxhash.xxh3_128_hexdigest(buffer.view(np.uint8)) == founder_buffer)


def show_real(runs: dict[str, Any]) -> None:
    rows = []
    for key in sorted(runs, key=lambda k: (runs[k]["state"], runs[k]["size"])):
        r = runs[key]
        for kind in ("chaosp2p", "single", "restart"):
            t = r[kind]
            if "failed" in t:
                rows.append([r["state"], r["size"], kind, "FAILED", t["failed"][-80:], "", "", "", "", ""])
                continue
            exact = t["exact"] if not isinstance(t["exact"], dict) else t["exact"]["buffer"] and t["exact"]["params"]
            rows.append(
                [
                    f"{r['state']} {r['state_mb']:.0f} MB",
                    r["size"],
                    kind,
                    (t["to_contribute_s"] if kind == "restart" else t["join_to_contribute_s"]),
                    t["to_contribute_s"],
                    t.get("load_s") if kind != "restart" else t["restart_to_loaded_s"],
                    t["lost_s"],
                    t.get("excess_idle_s", t["lost_s"]),
                    exact,
                    t["load_avg"],
                ]
            )
    print_table(
        "real processes: newcomer's scale-out delay and members' idle time",
        [
            "state",
            "N",
            "method",
            "scale-out delay s (restart: from the stop request)",
            "launch -> 1st step s",
            "state load s",
            "members' lost s",
            "members' idle s",
            "bit-exact",
            "load avg",
        ],
        rows,
    )


# ---------------------------------------------------------------------------------------- hivemind
def part_hivemind(args: argparse.Namespace) -> dict[str, Any]:
    """hivemind's load_state_from_peers next to chaosp2p pulls of the same bytes, uncapped."""
    import anyio

    out: dict[str, Any] = {"conditions": {"start": conditions()}}
    for state in args.hivemind_states:
        total = int(STATES_MB[state] * args.hivemind_scale * 1e6)
        entry: dict[str, Any] = {"bytes": total}
        with tempfile.TemporaryDirectory(prefix="chaosp2p-scaleout-hm-") as tmp:
            entry["chaosp2p"] = anyio.run(_chaosp2p_pulls, total, args.repeats, Path(tmp), backend="trio")
        entry["hivemind"] = _hivemind(args, total)
        out[state] = entry
        print(f"[hivemind {state} done, load {os.getloadavg()[0]:.1f}]", flush=True)
    out["conditions"]["end"] = conditions()
    return out


async def _chaosp2p_pulls(total: int, repeats: int, workdir: Path) -> dict[str, Any]:
    import state as bench_state
    from _state_data import model_and_adam_state

    from chaosp2p import open_peer

    expected = bench_state.state_hash(model_and_adam_state(total, 0))
    config = bench_state.transfer_config()
    result: dict[str, Any] = {}
    for count in (1, 3):
        sources = bench_state.start_sources(total, [None] * count, workdir)
        try:
            async with open_peer(bench_state.new_peer()) as newcomer:
                pulls = [
                    await bench_state.pull(newcomer, sources, expected, known=False, config=config)
                    for _ in range(repeats)
                ]
        finally:
            bench_state.stop(sources)
        result[f"{count}_sources"] = {"seconds": [p.seconds for p in pulls], "exact": all(p.exact for p in pulls)}
    return result


def _hivemind(args: argparse.Namespace, total: int) -> dict[str, Any]:
    import subprocess

    python = args.hivemind_python
    if not python or not Path(python).exists():
        return {"not_run": f"no hivemind interpreter at {python!r}"}
    result = subprocess.run(
        [python, str(HERE / "_hivemind_baseline.py"), "--bytes", str(total), "--repeats", str(args.repeats)],
        capture_output=True,
        text=True,
        timeout=900,
        env={**os.environ, "PYTHONPATH": str(HERE)},
        check=False,
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        return {"not_run": f"hivemind baseline failed: {result.stderr[-1500:]}"}
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def show_hivemind(report: dict[str, Any]) -> None:
    rows = []
    for state, entry in report.items():
        if not isinstance(entry, dict) or "bytes" not in entry:
            continue
        mb = entry["bytes"] / 1e6
        hm = entry["hivemind"]
        one = median(entry["chaosp2p"]["1_sources"]["seconds"])
        three = median(entry["chaosp2p"]["3_sources"]["seconds"])
        hm_s = median(hm["seconds"]) if "seconds" in hm else None
        rows.append(
            [
                f"{state} x scale, {mb:.0f} MB",
                "chaosp2p, 1 source",
                one,
                mb / one,
                entry["chaosp2p"]["1_sources"]["exact"],
            ]
        )
        rows.append(
            [
                f"{state} x scale, {mb:.0f} MB",
                "chaosp2p, 3 sources",
                three,
                mb / three,
                entry["chaosp2p"]["3_sources"]["exact"],
            ]
        )
        rows.append(
            [
                f"{state} x scale, {mb:.0f} MB",
                "hivemind load_state_from_peers",
                hm_s if hm_s else hm.get("not_run", "")[:60],
                mb / hm_s if hm_s else "-",
                "checked" if hm_s else "-",
            ]
        )
    print_table("uncapped loopback state loads (medians)", ["state", "method", "seconds", "MB/s", "bit-exact"], rows)


# ---------------------------------------------------------------------------------------- main
def load(path: Path) -> dict[str, Any]:
    if path.exists():
        return json.loads(path.read_text())  # type: ignore[no-any-return]
    return {"benchmark": "scaleout"}


def save(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    report["machine"] = machine()
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(report, indent=1))
    os.replace(temporary, path)


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="sim,plot", help="comma-separated: sim, real, hivemind, plot, markdown")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="results file (merged, not overwritten)")
    parser.add_argument("--sim-sizes", type=ints, default=[4, 8, 16, 32, 64, 128, 256], help="sim: existing members")
    parser.add_argument("--seeds", type=int, default=5, help="sim: newcomers (link draws) per size")
    parser.add_argument("--latency-trials", type=int, default=3, help="sim: decision-latency runs per size")
    parser.add_argument("--sim-step-s", type=float, default=1.0, help="sim: training step time")
    parser.add_argument("--restart-overhead-s", type=float, default=30.0, help="sim: restart cost beyond I/O")
    parser.add_argument("--disk-mbs", type=float, default=1000.0, help="sim: checkpoint write/read rate, MB/s")
    parser.add_argument("--sizes", type=ints, default=[4], help="real: processes including the newcomer")
    parser.add_argument("--state", choices=sorted(STATES_MB), default="resnet50", help="real: state size")
    parser.add_argument("--link-scale", type=float, default=0.25, help="real/hivemind: bytes and bandwidths x this")
    parser.add_argument("--link-seed", type=int, default=7, help="real: seed of the upload caps")
    parser.add_argument("--train-mb", type=float, default=2.0, help="real: averaged MLP + Adam, MB")
    parser.add_argument("--batch", type=int, default=60, help="real: global batch")
    parser.add_argument("--compute-s", type=float, default=0.3, help="real: stand-in compute per step")
    parser.add_argument("--steady-steps", type=int, default=6, help="real: steady steps before a trial")
    parser.add_argument("--workdir", help="real: keep logs and metrics here")
    parser.add_argument("--join-batch", type=int, default=0, help="real: start members this many at a time (0: all)")
    parser.add_argument("--hivemind-python", default="/work/hm-venv/bin/python")
    parser.add_argument("--hivemind-states", default="resnet50,vgg16")
    parser.add_argument("--repeats", type=int, default=3, help="hivemind: pulls per method")
    parser.add_argument("--hivemind-scale", type=float, default=1.0, help="hivemind: state size x this")
    parser.add_argument("--plots", type=Path, default=ROOT / "docs" / "results", help="plot: PNG folder")
    args = parser.parse_args()
    # ``timeout`` and the CPU lock's wrappers stop us with SIGTERM: unwind, so that every peer
    # process started here is killed by its context manager instead of being orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.hivemind_states = [s for s in args.hivemind_states.split(",") if s]
    os.environ.setdefault("COLUMNS", "200")
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    report = load(args.json)
    command = " ".join(["python", "benchmarks/scaleout.py", *sys.argv[1:]])
    if "sim" in parts:
        report["sim"] = part_sim(args)
        report["sim"]["command"] = command
        save(args.json, report)
        show_sim(report["sim"])
    if "real" in parts:
        for size in args.sizes:
            try:
                entry = part_real(args, size, args.state)
            except (RuntimeError, TimeoutError, KeyboardInterrupt, SystemExit) as exc:
                # Recorded: a cluster that could not be brought up or crashed is a result too.
                failure = {"state": args.state, "size": size, "command": command, "error": str(exc)[-3000:]}
                failure["conditions"] = conditions()
                report.setdefault("real_failed", []).append(failure)
                save(args.json, report)
                raise

            entry["command"] = command
            entry["link_scale"] = args.link_scale
            report.setdefault("real", {})[f"{args.state}-{size}"] = entry
            save(args.json, report)
        show_real(report["real"])
    if "hivemind" in parts:
        key = "hivemind" if args.hivemind_scale == 1.0 else f"hivemind_x{args.hivemind_scale:g}"
        earlier = report.get("hivemind", {})
        if earlier.get("link_scale", 1.0) != 1.0:  # a run from before --hivemind-scale: sized by --link-scale
            report[f"hivemind_x{earlier['link_scale']:g}"] = report.pop("hivemind")
        report[key] = part_hivemind(args)
        report[key]["command"] = command
        report[key]["scale"] = args.hivemind_scale
        save(args.json, report)
        show_hivemind(report[key])
    if "markdown" in parts:
        from _scaleout_plots import markdown

        print(markdown(report))
    if "plot" in parts:
        from _scaleout_plots import plot_all

        for path in plot_all(report, args.plots):
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
