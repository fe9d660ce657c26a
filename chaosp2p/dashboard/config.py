"""Settings of the built-in web dashboard: where it listens, who may read it, how much it buffers."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from chaosp2p.configbase import require, require_positive
from chaosp2p.errors import ConfigError

MIN_TOKEN_CHARS = 16
"""A token shorter than this is refused: it guards a page that shows the whole swarm."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DashboardConfig:
    """Every knob of :func:`chaosp2p.dashboard.open_dashboard`.

    The defaults bind to loopback. Any other address needs ``token``: every request must then
    present it (``Authorization: Bearer TOKEN``, ``?token=TOKEN`` once, or the cookie that sets).
    """

    host: str = "127.0.0.1"
    """Address to bind: an IPv4/IPv6 literal or ``localhost``."""
    port: int = 8765
    """TCP port (0: let the system choose; :attr:`Dashboard.url` tells which)."""
    token: str | None = None
    """Shared secret every request must present; required when ``host`` is not loopback."""
    role: str = "peer"
    """What the page calls this process: ``"peer"`` or ``"observer"`` (the ``dashboard`` command)."""
    snapshot_interval_s: float = 1.0
    """A fresh view is built at least this often (sent only if it changed)."""
    min_snapshot_spacing_s: float = 0.25
    """Bursts of events never cause more than one view per this interval."""
    client_queue_events: int = 256
    """Events a browser may fall behind by; older ones are dropped and counted."""
    max_clients: int = 16
    """Concurrent event streams; more are answered 503."""
    max_streams_per_client: int = 4
    """Concurrent event streams of one client -- a browser, known by the cookie the page sets, or
    else an address -- so that one cannot take every slot (more are answered 503)."""
    history_events: int = 200
    """Recent events a newly opened page receives at once."""
    keepalive_interval_s: float = 15.0
    """An idle stream gets a comment line this often (and a vanished browser is noticed)."""
    shutdown_grace_s: float = 1.0
    """Open requests get this long to end when the dashboard stops."""

    def __post_init__(self) -> None:
        require(0 <= self.port <= 65535, f"DashboardConfig.port must be in 0..65535 (got {self.port})")
        require(self.role in ("peer", "observer"), f"DashboardConfig.role must be peer or observer (got {self.role!r})")
        require_positive(
            self,
            "snapshot_interval_s",
            "min_snapshot_spacing_s",
            "client_queue_events",
            "max_clients",
            "max_streams_per_client",
            "history_events",
            "keepalive_interval_s",
            "shutdown_grace_s",
        )
        if self.token is not None:
            require(
                len(self.token) >= MIN_TOKEN_CHARS and self.token.isprintable() and " " not in self.token,
                f"the dashboard token must be at least {MIN_TOKEN_CHARS} printable characters without spaces",
            )
        require(
            self.token is not None or is_loopback(self.host),
            f"binding the dashboard to {self.host} (not loopback) needs a token (--http-token or CHAOSP2P_HTTP_TOKEN)",
        )

    @classmethod
    def from_bind(cls, bind: str, **changes: object) -> DashboardConfig:
        """Parse ``HOST:PORT`` (``[v6]:PORT`` for IPv6) into a config with ``changes`` on top."""
        host, port = parse_bind(bind)
        return cls(host=host, port=port, **changes)  # type: ignore[arg-type]


def parse_bind(bind: str) -> tuple[str, int]:
    """``"127.0.0.1:8765"`` -> ``("127.0.0.1", 8765)``; ``"[::1]:80"`` -> ``("::1", 80)``."""
    host, sep, port_text = bind.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ConfigError(f"--http wants HOST:PORT, e.g. 127.0.0.1:8765 (got {bind!r})")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host != "localhost":
        try:
            ipaddress.ip_address(host)
        except ValueError:
            raise ConfigError(f"--http host must be an IP address or localhost (got {host!r})") from None
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
