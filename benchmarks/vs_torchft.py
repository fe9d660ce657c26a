"""torchft 0.2.0 beside chaosp2p in one run: the same model, data and stand-in compute on both sides.

    python benchmarks/vs_torchft.py --torchft-python /work/torchft-venv/bin/python
        [--repeats 3] [--members 3] [--state-mb 50] [--batch 24] [--compute-s 0.1]
        [--steady-steps 20] [--observe-s 20] [--json PATH] [--workdir DIR]

Both sides train ``benchmarks/_elastic_model.py``'s MLP (parameters + Adam = ``--state-mb`` MB) on
its synthetic data with its stand-in compute sleep; every peer is a process on 127.0.0.1.
chaosp2p's peers are ``benchmarks/_elastic_peer.py`` (``local`` profile; encrypted transport);
torchft's are ``benchmarks/_torchft_peer.py --mode torchft`` run by ``--torchft-python`` (a replica
group of one process each: ``Manager``, reconfigurable ``ProcessGroupGloo``, unencrypted), with a
``torchft_lighthouse`` the harness starts (the binary beside that interpreter). Plain DDP
(``_torchft_peer.py --mode ddp``: ``torch.distributed`` gloo, fixed world) is the steady-state floor.
Without ``--torchft-python`` (or where it cannot import torchft) the torchft rows are skipped and
the reason is printed and stored.

Each repeat runs, alternating which system goes first, per system:

1. **default cluster** (torchft's default timeouts: Lighthouse heartbeat 5 s, join 60 s, Manager
   60 s; chaosp2p's ``local`` profile with LAN membership timings, as the examples run):
   ``--members`` members train until steady;
   *steady state*: the median step period over ``--steady-steps`` steps;
   *join*: a newcomer (``--state-mb`` of state) is launched; time from its launch to its first
   step, and the members' lost time -- over the steps they complete after the newcomer built its
   model up to the step it first took part in, the sum of (period - steady period), averaged over
   members (the same measure as ``training_elastic.py``);
   *kill -9*: once everyone trains together, the newcomer is SIGKILLed; kill -> every survivor
   completed a step without it (given up after 200 s, or as soon as a survivor exits: torchft's
   default 60 s timeouts can end a survivor's process);
   *bootstrap dies* (only where every survivor of the kill stepped again): the Lighthouse
   (torchft) or the founder every member joined through (chaosp2p, itself a member) is
   SIGKILLed; for ``--observe-s``: do the survivors step (their steps and whether they are
   alive), and does a newcomer launched then get a first step (torchft's points at the
   Lighthouse's address, the only one it has; chaosp2p's gets ``--join`` the dead founder, then a
   survivor -- the list of several bootstrap addresses a deployment configures).
2. **tuned cluster** (torchft: Lighthouse ``--heartbeat_timeout_ms 500 --join_timeout_ms 1000``,
   Manager and Gloo timeout 1 s, quorum and connect timeout 5 s; chaosp2p:
   ``--fast-failure-detection``, the ``local`` profile's own detector): ``--members`` + 1 members
   train, one is SIGKILLed, kill -> survivors step again; then the bootstrap dies as above.

The bare DDP floor runs once per repeat after the clusters (``--steady-steps`` + 10 steps, the
first 10 dropped), so its load may differ from theirs: compare the systems' step periods directly.
Nothing here is in CI; report the load averages printed with the tables.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import training_elastic as te
from _common import median, print_table, write_json

HERE = Path(__file__).resolve().parent
TORCHFT_PEER = HERE / "_torchft_peer.py"
# torchft's own defaults (Lighthouse and Manager; ProcessGroupGloo's is 60 s too), and tuned ones: a
# dead replica is dropped after 0.5 s, a collective waiting on it gives up after 1 s, and the
# Lighthouse waits 1 s (not 60) for a heartbeating replica that has not asked for the quorum yet.
DEFAULT_TIMEOUTS = {"heartbeat_timeout_ms": 5000, "join_timeout_ms": 60000, "timeout_s": 60.0, "quorum_timeout_s": 60.0}
TUNED_TIMEOUTS = {"heartbeat_timeout_ms": 500, "join_timeout_ms": 1000, "timeout_s": 1.0, "quorum_timeout_s": 5.0}
KILL_WAIT_S = 200.0  # torchft's default timeouts are 60 s; a survivor may also give up (exit)
DDP_WARMUP_STEPS = 10


def torchft_available(python: str | None) -> str | None:
    """None when ``python`` runs torchft 0.2.0 and its Lighthouse binary is beside it; else why not."""
    if not python:
        return "no --torchft-python given"
    if not Path(python).exists():
        return f"{python} does not exist"
    if not (Path(python).parent / "torchft_lighthouse").exists():
        return f"no torchft_lighthouse beside {python}"
    check = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('torchft'))"],
        capture_output=True,
        text=True,
        check=False,
    )
    if check.returncode != 0:
        return f"{python} cannot import torchft: {check.stderr.strip()[-200:]}"
    if check.stdout.strip() != "0.2.0":
        return f"{python} has torchft {check.stdout.strip()}, not 0.2.0"
    return None


# ---------------------------------------------------------------------------------------- clusters
class System:
    """How one system starts members and newcomers and what its bootstrap process is."""

    name = ""

    def __init__(self, args: argparse.Namespace, workdir: Path, tuned: bool) -> None:
        self.args, self.workdir, self.tuned = args, workdir, tuned
        common = ["--state-mb", str(args.state_mb), "--batch", str(args.batch), "--compute-s", str(args.compute_s)]
        self.common = [*common, "--ref-members", str(args.members), "--steps", "1000000"]
        self.cluster = self.make_cluster()
        self.members: list[te.Proc] = []
        self.count = 0

    def make_cluster(self) -> te.Cluster:
        raise NotImplementedError

    def size(self) -> int:
        """Members at the start: the tuned cluster starts with one more, so that its kill, like the
        default cluster's (of the newcomer), takes 1 of ``--members`` + 1, and the bootstrap's death
        after it still leaves chaosp2p a majority (2 of 3) to decide with."""
        return self.args.members + (1 if self.tuned else 0)

    def start(self) -> None:
        raise NotImplementedError

    def newcomer(self, name: str, dead_bootstrap: bool = False) -> te.Proc:
        raise NotImplementedError

    def kill_bootstrap(self) -> None:
        raise NotImplementedError

    def wait_together(self, procs: list[te.Proc], count: int) -> None:
        def together() -> bool:
            for proc in procs:
                proc.check_alive()
            return all((s := p.steps()) and s[-1]["members"] == count for p in procs)

        te.wait_for(together, f"{count} members training together", te.SLOW_TIMEOUT_S)

    def close(self) -> None:
        self.cluster.__exit__(None, None, None)


class Chaosp2p(System):
    name = "chaosp2p"

    def make_cluster(self) -> te.Cluster:
        extra = ["--no-balance", "--digest-every", "0"] + (["--fast-failure-detection"] if self.tuned else [])
        return te.Cluster(self.workdir, [*self.common, *extra])

    def start(self) -> None:
        self.members = te.start_members(self.cluster, self.size(), lambda _: [])
        self.count = len(self.members)
        self.founder = self.members[0].addr  # every other member joined through it

    def newcomer(self, name: str, dead_bootstrap: bool = False) -> te.Proc:
        joins = [self.founder, self.members[0].addr] if dead_bootstrap else [self.founder]
        return self.cluster.launch(name, [arg for addr in joins for arg in ("--join", addr)])

    def kill_bootstrap(self) -> None:
        founder = self.members.pop(0)
        founder.process.send_signal(signal.SIGKILL)
        self.count -= 1


class Torchft(System):
    name = "torchft"

    def make_cluster(self) -> te.Cluster:
        timeouts = TUNED_TIMEOUTS if self.tuned else DEFAULT_TIMEOUTS
        self.port = te.free_port()
        binary = Path(self.args.torchft_python).parent / "torchft_lighthouse"
        command = [str(binary), "--bind", f"127.0.0.1:{self.port}", "--min_replicas", "1"]
        command += ["--heartbeat_timeout_ms", str(timeouts["heartbeat_timeout_ms"])]
        command += ["--join_timeout_ms", str(timeouts["join_timeout_ms"])]
        with (self.workdir / "lighthouse.log").open("wb") as log:
            self.lighthouse = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        common = [*self.common, "--mode", "torchft", "--lighthouse", f"http://127.0.0.1:{self.port}"]
        common += ["--timeout-s", str(timeouts["timeout_s"]), "--quorum-timeout-s", str(timeouts["quorum_timeout_s"])]
        common += ["--connect-timeout-s", str(timeouts["quorum_timeout_s"])]
        self.next_index = 0
        return te.Cluster(self.workdir, common, python=self.args.torchft_python, script=TORCHFT_PEER)

    def launch(self, name: str) -> te.Proc:
        self.next_index += 1
        return self.cluster.launch(name, ["--index", str(self.next_index - 1)])

    def start(self) -> None:
        self.members = [self.launch(f"m{i}") for i in range(self.size())]
        self.cluster.wait_ready(self.members)
        self.count = len(self.members)
        self.wait_together(self.members, self.count)

    def newcomer(self, name: str, dead_bootstrap: bool = False) -> te.Proc:
        return self.launch(name)

    def kill_bootstrap(self) -> None:
        self.lighthouse.send_signal(signal.SIGKILL)
        self.lighthouse.wait()

    def close(self) -> None:
        super().close()
        if self.lighthouse.poll() is None:
            self.lighthouse.kill()
            self.lighthouse.wait()


# ---------------------------------------------------------------------------------------- measures
def period_before(proc: te.Proc, moment: float, count: int = 8) -> float:
    """Median period of the ``count`` steps a member completed before ``moment``."""
    return median([p for _, p in te.periods([r for r in proc.steps() if r["time"] <= moment][-(count + 1) :])])


def first_after(proc: te.Proc, moment: float, members: int) -> dict[str, Any] | None:
    return next((r for r in proc.steps() if r["time"] > moment and r["members"] == members), None)


def steady(system: System) -> dict[str, Any]:
    """Median step period over ``--steady-steps`` steps of every member, after the members are steady."""
    te.wait_steady(system.members, system.count, 5)
    began = time.time()
    want = system.args.steady_steps + 1
    te.wait_for(
        lambda: all(len([r for r in p.steps() if r["time"] > began]) >= want for p in system.members),
        "steady steps",
        te.SLOW_TIMEOUT_S,
    )
    per_member = []
    for proc in system.members:
        window = [r for r in proc.steps() if r["time"] > began][:want]
        per_member.append(median([p for _, p in te.periods(window)]))
    return {"period_s": median(per_member), "per_member_s": per_member, "load_avg": os.getloadavg()[0]}


def join(system: System, name: str) -> tuple[te.Proc, dict[str, Any]]:
    """A newcomer joins the training members: its launch -> first step, the members' lost time."""
    load_avg = os.getloadavg()[0]
    arrived = time.time()
    newcomer = system.newcomer(name)

    def contributed() -> bool:  # a healing torchft replica's first step does not count: it adds no gradient
        newcomer.check_alive()
        return first_after(newcomer, arrived, system.count + 1) is not None

    te.wait_for(contributed, f"{name} to contribute a step", te.SLOW_TIMEOUT_S)
    first = first_after(newcomer, arrived, system.count + 1)
    assert first is not None
    system.wait_together([*system.members, newcomer], system.count + 1)
    te.wait_for(lambda: all(p.steps()[-1]["step"] >= first["step"] + 2 for p in system.members), "steps after", 300)
    joining = (newcomer.event("started") or {}).get("model_built", arrived)
    lost, stall = [], []
    for proc in system.members:
        period0 = period_before(proc, arrived)
        during = [(r, p) for r, p in te.periods(proc.steps()) if r["time"] > joining and r["step"] <= first["step"]]
        lost.append(sum(p - period0 for _, p in during))
        stall.append(max((p - period0 for _, p in during), default=0.0))
    period = median([period_before(p, arrived) for p in system.members])
    result = {
        "lost_s": sum(lost) / len(lost),
        "lost_rounds": sum(lost) / len(lost) / period,
        "max_stall_s": max(stall),
        "steady_period_s": period,
        "to_first_step_s": first["time"] - arrived,
        "to_model_built_s": joining - arrived,
        "join_to_first_step_s": first["time"] - joining,
        "load_avg": load_avg,
    }
    return newcomer, result


def kill(system: System, victim: te.Proc) -> dict[str, Any]:
    """SIGKILL ``victim`` (a member); kill -> every other member completed a step without it."""
    survivors = [p for p in system.members if p is not victim]
    te.wait_steady([*survivors, victim], len(survivors) + 1, 5)
    load_avg = os.getloadavg()[0]
    killed = time.time()
    victim.process.send_signal(signal.SIGKILL)
    victim.process.wait()
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        firsts = [first_after(p, killed, len(survivors)) for p in survivors]
        if all(firsts) or any(p.process.poll() is not None for p in survivors):
            break
        time.sleep(0.05)
    before = [r["time"] for r in survivors[0].steps() if r["time"] < killed]
    alive = [p.process.poll() is None for p in survivors]
    system.members, system.count = survivors, len(survivors)
    return {
        "resume_s": max(r["time"] for r in firsts) - killed if all(firsts) else None,  # type: ignore[index]
        "survivors": len(survivors),
        "survivors_alive": sum(alive),
        "step_period_s": median([b - a for a, b in itertools.pairwise(before[-9:])] or [float("nan")]),
        "load_avg": load_avg,
    }


def bootstrap_dies(system: System) -> dict[str, Any]:
    """SIGKILL the Lighthouse / the founder; do the others step on, and can a newcomer join?"""
    observe = system.args.observe_s
    load_avg = os.getloadavg()[0]
    killed = time.time()
    system.kill_bootstrap()
    time.sleep(observe)
    survivors = system.members
    steps_after = [len([r for r in p.steps() if r["time"] > killed]) for p in survivors]
    alive = [p.process.poll() is None for p in survivors]
    resumed = [first_after(p, killed, system.count) for p in survivors]
    newcomer = system.newcomer("late", dead_bootstrap=True)
    launched = time.time()
    deadline = launched + observe
    while time.time() < deadline and not newcomer.steps() and newcomer.process.poll() is None:
        time.sleep(0.1)
    first = newcomer.steps()[0]["time"] - launched if newcomer.steps() else None
    return {
        "survivors": len(survivors),
        "survivors_alive": sum(alive),
        "min_steps_after": min(steps_after),
        "resume_s": max(r["time"] for r in resumed) - killed if all(resumed) else None,
        "observe_s": observe,
        "newcomer_first_step_s": first,
        "newcomer_alive": newcomer.process.poll() is None,
        "exit_codes": [p.process.poll() for p in survivors],
        "load_avg": load_avg,
    }


def default_cluster(system: System) -> dict[str, Any]:
    system.start()
    out: dict[str, Any] = {"steady": steady(system)}
    newcomer, out["join"] = join(system, "newcomer")
    system.members.append(newcomer)
    system.count += 1
    out["kill_default"] = kill(system, newcomer)
    if out["kill_default"]["resume_s"] is not None and all(p.process.poll() is None for p in system.members):
        te.wait_steady(system.members, system.count, 5)
        out["bootstrap_dies"] = bootstrap_dies(system)
    return out


def tuned_cluster(system: System) -> dict[str, Any]:
    system.start()
    out = {"kill_tuned": kill(system, system.members[-1])}
    if out["kill_tuned"]["resume_s"] is not None and all(p.process.poll() is None for p in system.members):
        te.wait_steady(system.members, system.count, 5)
        out["bootstrap_dies_tuned"] = bootstrap_dies(system)
    return out


def ddp_floor(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Plain gloo DDP with the same model and compute: the median step period after a warm-up."""
    common = ["--mode", "ddp", "--state-mb", str(args.state_mb), "--batch", str(args.batch)]
    common += ["--compute-s", str(args.compute_s), "--ref-members", str(args.members)]
    common += ["--gloo-init", f"tcp://127.0.0.1:{te.free_port()}", "--world", str(args.members)]
    common += ["--steps", str(args.steady_steps + DDP_WARMUP_STEPS + 1)]
    with te.Cluster(workdir, common, script=TORCHFT_PEER) as cluster:
        ranks = [cluster.launch(f"ddp{i}", ["--index", str(i)], ready=False) for i in range(args.members)]
        te.wait_for(lambda: all(p.process.poll() is not None for p in ranks), "the DDP ranks", te.SLOW_TIMEOUT_S)
        for proc in ranks:
            if proc.process.returncode != 0:
                proc.check_alive()
        per_member = [median([p for _, p in te.periods(r.steps()[DDP_WARMUP_STEPS:])]) for r in ranks]
    return {"period_s": median(per_member), "per_member_s": per_member, "load_avg": os.getloadavg()[0]}


def run(args: argparse.Namespace, root: Path, skip: str | None) -> list[dict[str, Any]]:
    systems: list[type[System]] = [Chaosp2p] if skip else [Chaosp2p, Torchft]
    repeats = []
    for repeat in range(args.repeats):
        trial: dict[str, Any] = {"load_avg_start": os.getloadavg()}
        began = time.monotonic()
        order = systems if repeat % 2 == 0 else systems[::-1]
        for kind in ("default", "tuned"):
            for cls in order:
                workdir = root / f"r{repeat}-{cls.name}-{kind}"
                workdir.mkdir()
                system = cls(args, workdir, tuned=kind == "tuned")
                try:
                    result = default_cluster(system) if kind == "default" else tuned_cluster(system)
                finally:
                    system.close()
                trial.setdefault(cls.name, {}).update(result)
                print(f"[repeat {repeat + 1}: {cls.name} {kind} done, load {os.getloadavg()[0]:.1f}]", flush=True)
        ddp_dir = root / f"r{repeat}-ddp"
        ddp_dir.mkdir()
        trial["ddp"] = ddp_floor(args, ddp_dir)
        trial["load_avg_end"] = os.getloadavg()
        print(f"[repeat {repeat + 1} done in {time.monotonic() - began:.0f} s]", flush=True)
        repeats.append(trial)
    return repeats


# ---------------------------------------------------------------------------------------- output
ROWS = (
    ("kill_default", "resume_s", "kill -9 -> survivors step again, default timeouts (s)"),
    ("kill_tuned", "resume_s", "kill -9 -> survivors step again, tuned timeouts (s)"),
    ("steady", "period_s", "steady step period (s)"),
    ("join", "to_first_step_s", "join: newcomer launch -> its first step (s)"),
    ("join", "join_to_first_step_s", "join: of it, after its model was built (s)"),
    ("join", "lost_s", "join: members' lost time (s per member)"),
    ("join", "max_stall_s", "join: members' worst step, + s over steady"),
    ("kill_default", "survivors_alive", "kill -9, default timeouts: survivors still running"),
    ("bootstrap_dies", "resume_s", "bootstrap killed -> survivors step again, default timeouts (s)"),
    ("bootstrap_dies", "newcomer_first_step_s", "bootstrap killed, a newcomer's launch -> first step, default (s)"),
    ("bootstrap_dies_tuned", "resume_s", "bootstrap killed -> survivors step again, tuned timeouts (s)"),
    ("bootstrap_dies_tuned", "survivors_alive", "bootstrap killed, tuned: survivors alive after --observe-s"),
    ("bootstrap_dies_tuned", "newcomer_first_step_s", "bootstrap killed, a newcomer's launch -> first step, tuned (s)"),
)


def values(trials: list[dict[str, Any]], system: str, part: str, key: str) -> list[float | None]:
    """Each repeat's figure; None where the repeat never got there (or never ran that part)."""
    return [t[system].get(part, {}).get(key) for t in trials if system in t]


def summarize(trials: list[dict[str, Any]], systems: list[str]) -> list[dict[str, Any]]:
    """One row per measure: each system's median (None where a repeat never got there) and the ratio.

    A measure that some repeats never reached (a newcomer that never stepped, survivors that never
    resumed) is the median of those that did, and ``<system>_reached`` says how many that was.
    """
    rows = []
    for part, key, label in ROWS:
        row: dict[str, Any] = {"measure": label, "part": part, "key": key}
        for system in systems:
            got = values(trials, system, part, key)
            reached = [v for v in got if v is not None]
            row[system] = median(reached) if reached else None
            row[f"{system}_reached"] = f"{len(reached)}/{len(got)}"
        if "torchft" in systems and row["chaosp2p"] and row["torchft"] is not None:
            row["torchft_over_chaosp2p"] = row["torchft"] / row["chaosp2p"]
        rows.append(row)
    ddp = [t["ddp"]["period_s"] for t in trials if "ddp" in t]
    if ddp:
        floor = median(ddp)
        row = {"measure": "steady step period over plain DDP (gloo), x", "part": "steady", "key": "over_ddp"}
        for system in systems:
            periods = values(trials, system, "steady", "period_s")
            row[system] = median([p / d for p, d in zip(periods, ddp, strict=False) if p is not None])
        row["ddp_period_s"] = floor
        rows.append(row)
    return rows


def show(rows: list[dict[str, Any]], systems: list[str], args: argparse.Namespace, skip: str | None) -> None:
    def cell(row: dict[str, Any], system: str) -> str:
        value = row.get(system)
        reached = row.get(f"{system}_reached", "")
        text = "never" if value is None else f"{value:.3f}"
        return text if not reached or reached.split("/")[0] == reached.split("/")[1] else f"{text} ({reached})"

    columns = ["measure", *systems] + (["torchft / chaosp2p"] if "torchft" in systems else [])
    table = []
    for row in rows:
        ratio = row.get("torchft_over_chaosp2p")
        table.append(
            [row["measure"], *(cell(row, s) for s in systems)]
            + (["-" if ratio is None else f"{ratio:.2f}x"] if "torchft" in systems else [])
        )
    print_table(
        f"{args.members} members, {args.state_mb:g} MB params+Adam, batch {args.batch}, "
        f"compute {args.compute_s:g} s/step; medians of {args.repeats}",
        columns,
        table,
    )
    if skip:
        print(f"torchft rows skipped: {skip}")


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--torchft-python", default=None, help="an interpreter with torchft 0.2.0 (skipped without)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--members", type=int, default=3, help="members training before the join")
    parser.add_argument("--state-mb", type=float, default=50.0, help="parameters + Adam moments, MB")
    parser.add_argument("--batch", type=int, default=24, help="global batch at --members (samples per step)")
    parser.add_argument("--compute-s", type=float, default=0.1, help="stand-in compute per step at an equal share")
    parser.add_argument("--steady-steps", type=int, default=20, help="steps measured for the steady period")
    parser.add_argument("--observe-s", type=float, default=20.0, help="how long to watch after the bootstrap dies")
    parser.add_argument("--json", default=None)
    parser.add_argument("--workdir", type=Path, help="keep the peers' logs and metrics here (default: a temporary dir)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    if args.members < 2:
        raise SystemExit("--members must be at least 2 (one is killed, the others must step on)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # clean up the peers on SIGTERM too
    os.environ.setdefault("COLUMNS", "200")
    skip = torchft_available(args.torchft_python)
    if skip:
        print(f"torchft rows skipped: {skip}", flush=True)
    systems = ["chaosp2p"] if skip else ["chaosp2p", "torchft"]
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="chaosp2p-vs-torchft-") as tmp:
        root = Path(tmp)
        if args.workdir is not None:
            args.workdir.mkdir(parents=True)
            root = args.workdir
        trials = run(args, root, skip)
    rows = summarize(trials, systems)
    show(rows, systems, args, skip)
    load_end = os.getloadavg()
    print(
        f"conditions: {os.cpu_count()} cores shared; "
        f"load average {load_start[0]:.2f} at start, {load_end[0]:.2f} at end"
    )
    stored = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    payload = {"benchmark": "vs_torchft", "args": stored, "torchft_skipped": skip, "rows": rows, "trials": trials}
    write_json(
        args.json,
        {
            **payload,
            "load_avg_start": load_start,
            "load_avg_end": load_end,
            "timeouts": {"default": DEFAULT_TIMEOUTS, "tuned": TUNED_TIMEOUTS},
        },
    )


if __name__ == "__main__":
    sys.exit(main())
