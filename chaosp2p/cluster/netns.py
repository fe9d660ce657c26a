"""``chaosp2p cluster --netns``: run the peers in a network namespace whose loopback ``tc`` shapes.

A minimal version. All peers share one fresh namespace (``ip netns add chaosp2p-<pid>``), so the
machine's other traffic is untouched, and the scenario's *default* link (``[links]``) is applied by
the kernel on the namespace's loopback: ``netem`` for delay and loss (real packet loss, which TCP
retransmits) and ``tbf`` for bandwidth. Two differences from the in-transport shaper follow: the
bandwidth is shared by every pair (one loopback), and per-pair ``[[link]]`` overrides and link cuts
stay with the transport's shaper. Needs root, ``ip`` and ``tc``; ``netem`` also needs the kernel's
``sch_netem`` module (missing in many containers: then delay/loss fail with a clear error).
"""

from __future__ import annotations

import os
import shutil
import subprocess

from chaosp2p.cluster.scenario import Scenario
from chaosp2p.errors import ChaosError


class NetnsUnavailable(ChaosError):
    """``--netns`` cannot work here (not root, no ``ip``/``tc``, or a qdisc the kernel lacks)."""


class NetworkNamespace:
    """One namespace for the run's peers; :meth:`close` deletes it."""

    def __init__(self, name: str) -> None:
        self.name = name

    @classmethod
    def create(cls, scenario: Scenario) -> NetworkNamespace:
        """Create the namespace, bring its loopback up and shape it as the scenario's default link."""
        if os.geteuid() != 0:
            raise NetnsUnavailable("--netns needs root (ip netns add); run without it to shape inside the transport")
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                raise NetnsUnavailable(f"--netns needs the {tool!r} command (iproute2)")
        namespace = cls(f"chaosp2p-{os.getpid()}")
        _run(["ip", "netns", "add", namespace.name])
        try:
            _run(namespace.wrap(["ip", "link", "set", "lo", "up"]))
            link = scenario.default_link
            parent = ["root"]
            if link.delay_s or link.loss:
                netem = ["netem", "delay", f"{link.delay_s * 1e3:g}ms"]
                if link.loss:
                    netem += ["loss", f"{link.loss * 100:g}%"]
                _run(namespace.wrap(["tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", *netem]))
                parent = ["parent", "1:1"]
            if link.bandwidth_bytes_per_s is not None:
                rate = f"{link.bandwidth_bytes_per_s * 8:.0f}bit"
                burst = f"{max(64 * 1024, int(link.bandwidth_bytes_per_s / 100))}b"
                tbf = ["tbf", "rate", rate, "burst", burst, "latency", "100ms"]
                _run(namespace.wrap(["tc", "qdisc", "add", "dev", "lo", *parent, "handle", "2:", *tbf]))
        except BaseException:
            namespace.close()
            raise
        return namespace

    def wrap(self, command: list[str]) -> list[str]:
        """``command`` run inside the namespace (``ip netns exec`` execs it: the PID is the peer's)."""
        return ["ip", "netns", "exec", self.name, *command]

    def close(self) -> None:
        """Delete the namespace (its processes must have exited)."""
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True, check=False)


def _run(command: list[str]) -> None:
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        detail = result.stderr.strip() or result.stdout.strip()
        hint = " (the kernel lacks sch_netem: drop delay/loss from [links] or run without --netns)"
        raise NetnsUnavailable(f"{' '.join(command)} failed: {detail}" + (hint if "netem" in command else ""))
