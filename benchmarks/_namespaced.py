"""Child processes in the namespaces of a ``SiteNetwork`` (nat_relay.py, holepunch_nat.py).

A child is the benchmark script itself with a hidden role argument; it announces itself with one
JSON line on stdout (its address, its pid) before it serves. :func:`parser` holds the arguments
such a script shares: its docstring as help, ``--json``, and the hidden role arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chaosp2p.cluster.sites import SiteNetwork


def parser(doc: str | None, roles: dict[str, int | None]) -> argparse.ArgumentParser:
    """A namespaced benchmark's parser: ``doc`` as help, ``--json`` (where results go), and the hidden
    role arguments of its children: ``--serve`` and each of ``roles`` (flag -> how many values;
    None: one). The script adds its own measuring options."""
    found = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    found.add_argument("--json", default=None, help="write results here")
    found.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    for flag, nargs in roles.items():
        found.add_argument(flag, nargs=nargs, default=None, help=argparse.SUPPRESS)
    return found


def start_in(net: SiteNetwork, host: str, script: str, *args: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """Run ``python script *args`` in ``host``'s namespace; the process and its first JSON line."""
    command = net.wrap(host, [sys.executable, str(Path(script).resolve()), *args])
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line:
        process.kill()
        process.wait()
        process.stdout.close()
        raise RuntimeError(f"{host} did not start")
    return process, json.loads(line)


def stop_all(processes: Sequence[subprocess.Popen[str]]) -> None:
    """Kill the children (before their namespaces are deleted) and close their pipes."""
    for process in processes:
        process.kill()
        process.wait()
        if process.stdout is not None:
            process.stdout.close()
