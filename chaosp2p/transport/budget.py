"""How much receive buffer remote peers may make this host hold, per peer and in total.

Theory of operation
-------------------
A stream's receive window is memory the remote may fill before our application reads: a stream a
remote peer opens costs us up to its window. Per connection the mux already bounds the number of
remote-opened streams; this budget bounds them across *all* connections of one peer and across all
peers, so neither many connections from one identity nor many identities can multiply it
(1024 connections x 256 streams x 256 KiB would otherwise be 64 GiB).

Each remote-opened stream reserves its initial window (and one stream slot) when it opens; a
receiver that raises the window of such a stream reserves the difference, or gets only what is
left. A stream that cannot get its initial window is refused with RST, like one beyond the
per-connection limit. Everything is released when the stream is forgotten. The accounting is pure
(no I/O, no clock); connections call it from their reader.
"""

from __future__ import annotations

from dataclasses import dataclass

from chaosp2p.wire.identity import PeerID


@dataclass(frozen=True, slots=True)
class BudgetStatistics:
    """Counters of a :class:`ReceiveBudget`."""

    reserved_bytes: int
    """Receive window currently granted on remote-opened streams, over all peers."""
    peers: int
    """Peers holding any reservation."""
    streams_refused: int
    """Remote-opened streams refused because the peer's or the global budget was used up."""


class ReceiveBudget:
    """Stream slots and receive-window bytes granted to remote peers."""

    def __init__(self, *, max_streams_per_peer: int, max_bytes_per_peer: int, max_bytes_total: int) -> None:
        self.max_streams_per_peer = max_streams_per_peer
        self.max_bytes_per_peer = max_bytes_per_peer
        self.max_bytes_total = max_bytes_total
        self._streams: dict[PeerID, int] = {}
        self._bytes: dict[PeerID, int] = {}
        self._total = 0
        self._refused = 0

    def open_stream(self, peer: PeerID, window_bytes: int) -> bool:
        """Reserve a stream slot and ``window_bytes`` for a stream ``peer`` opened; False: refuse it."""
        if (
            self._streams.get(peer, 0) >= self.max_streams_per_peer
            or self._bytes.get(peer, 0) + window_bytes > self.max_bytes_per_peer
            or self._total + window_bytes > self.max_bytes_total
        ):
            self._refused += 1
            return False
        self._streams[peer] = self._streams.get(peer, 0) + 1
        self._add(peer, window_bytes)
        return True

    def grow(self, peer: PeerID, wanted_bytes: int) -> int:
        """Reserve up to ``wanted_bytes`` more for a stream of ``peer``; returns what was reserved."""
        room = min(self.max_bytes_per_peer - self._bytes.get(peer, 0), self.max_bytes_total - self._total)
        granted = max(0, min(wanted_bytes, room))
        if granted:
            self._add(peer, granted)
        return granted

    def close_stream(self, peer: PeerID, reserved_bytes: int) -> None:
        """Release a stream's slot and everything reserved for it."""
        left = self._streams.get(peer, 0) - 1
        if left > 0:
            self._streams[peer] = left
        else:
            self._streams.pop(peer, None)
        self._add(peer, -reserved_bytes)

    def streams_of(self, peer: PeerID) -> int:
        """Remote-opened streams of ``peer`` holding a reservation."""
        return self._streams.get(peer, 0)

    def bytes_of(self, peer: PeerID) -> int:
        """Window bytes reserved for ``peer``'s streams."""
        return self._bytes.get(peer, 0)

    def statistics(self) -> BudgetStatistics:
        """A snapshot of the counters."""
        return BudgetStatistics(reserved_bytes=self._total, peers=len(self._bytes), streams_refused=self._refused)

    def _add(self, peer: PeerID, delta: int) -> None:
        value = self._bytes.get(peer, 0) + delta
        if value > 0:
            self._bytes[peer] = value
        else:
            self._bytes.pop(peer, None)
        self._total += delta
