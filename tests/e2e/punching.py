"""Shared by the namespaced hole-punching tests: run ``punch_agent.py`` as relay, target and source."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .processes import ROOT, wait_until

AGENT = Path(__file__).with_name("punch_agent.py")


def run_agents(
    wrap: Callable[[str, list[str]], list[str]], ips: dict[str, str], folder: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Start the relay (and a ``witness`` when ``ips`` names one: a second public peer the target
    and the source connect to as well), the target and then the source, each ``wrap``-ped into its
    namespace (``ips``: role to its address); the source's ``result.json`` and the target's report.
    Every agent is stopped (``FOLDER/stop``, then killed if it lingers) before this returns or raises."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    processes, logs = [], []
    try:
        witnessed = "witness" in ips
        for role in ("relay", "witness", "target", "source") if witnessed else ("relay", "target", "source"):
            log = (folder / f"{role}.log").open("w")
            logs.append(log)
            extra = ["witnessed"] if witnessed and role in ("target", "source") else []
            command = wrap(role, [sys.executable, str(AGENT), role, ips[role], str(folder), *extra])
            processes.append(subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT))
        result_path = folder / "result.json"
        wait_until(
            lambda: result_path.exists() or any(p.poll() is not None for p in processes),
            timeout_s=60,
            what="the source's result",
        )
        assert result_path.exists(), (folder / "source.log").read_text()
        (folder / "stop").write_text("")
        wait_until(lambda: (folder / "target.json").exists(), timeout_s=20, what="the target's report")
        return json.loads(result_path.read_text()), json.loads((folder / "target.json").read_text())
    finally:
        (folder / "stop").write_text("")
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for log in logs:
            log.close()
