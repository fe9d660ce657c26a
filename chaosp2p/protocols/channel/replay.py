"""Freshness of handshake message 1 under a swarm key: a bounded replay cache of ephemerals.

Theory of operation
-------------------
Message 1 of the Noise handshake (``-> psk, e``) is the only message a responder answers before it
knows who is dialing. Under a swarm key its AEAD tag proves that the dialer holds the key -- but a
*copy* of a genuine message 1 proves the same thing, so without more a passive observer could
replay one sniffed message 1 on new connections and get an answer every time: two Diffie-Hellman
operations and a signature of ours per replay, a connection that counts as a real dialer in the
admission table, and an answer that tells the observer this address is in the swarm.

So message 1 carries the dialer's wall-clock time (milliseconds, encrypted and authenticated under
the swarm key: nobody without the key can make or alter one), and a responder answers it only if

1. the time is within ``max_clock_skew_s`` of its own wall clock, and
2. the dialer's ephemeral key was not seen in a message 1 before (within that window).

A replay inside the window repeats an ephemeral this cache holds; a replay after it is stale. The
cache holds each ephemeral until its time leaves the window, so it only ever needs the ephemerals of
the last ``2 x max_clock_skew_s``. It is also bounded (``max_entries``): when full, the entry with
the oldest time goes and the *floor* rises to that time -- nothing at or below the floor is
accepted again, so an evicted ephemeral can never come back. Only holders of the swarm key can add
entries (the tag is checked first), so the bound is reached only by key holders handshaking faster
than ``max_entries / (2 x max_clock_skew_s)`` per second; then dialers whose clocks lag by more
than the floor's age are refused until it falls behind again.

What it does not cover: the cache lives in memory, so after a restart a message 1 sniffed within
the last window is answered once more; and the check is pointless in an open swarm, where anyone
can make a fresh message 1 (the transport only enables it under a swarm key). The machine is pure:
the caller passes its wall clock in.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from chaosp2p.errors import AdmissionDenied


@dataclass(frozen=True, slots=True)
class ReplayGuardStatistics:
    """Counters of a :class:`ReplayGuard`."""

    remembered: int
    """Ephemerals currently held."""
    replays_refused: int
    """Message 1s refused because their ephemeral was seen before (or fell below the floor)."""
    stale_refused: int
    """Message 1s refused because their time was outside the window of our clock."""


class ReplayGuard:
    """Refuses a handshake message 1 that was seen before or is not fresh (module docstring)."""

    def __init__(self, *, max_clock_skew_s: float, max_entries: int) -> None:
        self.window_ms = int(max_clock_skew_s * 1000)
        self.max_entries = max_entries
        self._seen: set[bytes] = set()
        self._by_time: list[tuple[int, bytes]] = []  # heap: oldest message time first
        self._floor_ms = -1
        """Times at or below this were evicted while still in the window: never accepted again."""
        self._replays = 0
        self._stale = 0

    def admit(self, ephemeral: bytes, sent_at_ms: int, now_ms: int) -> None:
        """Accept (and remember) a message 1 sent at ``sent_at_ms`` with ``ephemeral``, or raise.

        Raises :class:`AdmissionDenied` for a stale or future time, or a repeated ephemeral.
        """
        self._forget_before(now_ms - self.window_ms)
        if abs(sent_at_ms - now_ms) > self.window_ms:
            self._stale += 1
            raise AdmissionDenied(
                f"handshake message 1 is {abs(sent_at_ms - now_ms) / 1000:.0f} s away from our clock "
                f"(more than {self.window_ms / 1000:g} s): a replay, or clocks that disagree"
            )
        if ephemeral in self._seen or sent_at_ms <= self._floor_ms:
            self._replays += 1
            raise AdmissionDenied("handshake message 1 was replayed (its ephemeral key was seen before)")
        if len(self._seen) >= self.max_entries:
            oldest, gone = heapq.heappop(self._by_time)
            self._seen.discard(gone)
            self._floor_ms = max(self._floor_ms, oldest)
            if sent_at_ms <= self._floor_ms:
                self._replays += 1
                raise AdmissionDenied("handshake message 1 is older than what the full replay cache still holds")
        self._seen.add(ephemeral)
        heapq.heappush(self._by_time, (sent_at_ms, ephemeral))

    def statistics(self) -> ReplayGuardStatistics:
        """A snapshot of the counters."""
        return ReplayGuardStatistics(
            remembered=len(self._seen), replays_refused=self._replays, stale_refused=self._stale
        )

    def _forget_before(self, oldest_ms: int) -> None:
        """Drop ephemerals whose time left the window: a replay of them is now refused as stale."""
        heap = self._by_time
        while heap and heap[0][0] < oldest_ms:
            _, gone = heapq.heappop(heap)
            self._seen.discard(gone)
