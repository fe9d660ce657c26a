"""Liveness: PING and its echo, the round-trip time, and closing dead or idle connections.

Theory of operation
-------------------
The keepalive task sleeps until something can be due (``_keepalive_delay``: the connection quiet
for ``keepalive_interval_s``, or idle; every half interval while streams are open). A connection from which nothing
arrived for ``dead_connection_timeout_s`` is closed as dead; one with no open stream and no DATA or
MESSAGE for ``idle_connection_timeout_s`` is closed with GOAWAY(IDLE); a quiet one is pinged, so
that a healthy connection always has traffic to prove it alive and the peer measures its RTT for
free. Each wake also runs the handlers' idle sweep.

A PING carries an opaque counter; the remote echoes it with ACK from its control writer (never its
reader, which must not block on the socket). The echo of a counter still remembered here sets
``rtt_s``; only the last eight outstanding pings are remembered. :meth:`Keepalive.ping` measures
one round trip on demand through the same path.
"""

from __future__ import annotations

import logging

import anyio

from chaosp2p.errors import ChaosError
from chaosp2p.protocols.channel.record_layer import Flag, FrameType, GoAwayCode, RecordHeader
from chaosp2p.transport.connection.handlers import InboundStreams

log = logging.getLogger("chaosp2p.transport")

_REMEMBERED_PINGS = 8


class Keepalive(InboundStreams):
    """Round trips and the keepalive task."""

    async def ping(self) -> float:
        """Measure one round trip at the connection level (seconds)."""
        value = self._next_ping()
        waiter = anyio.Event()
        self._ping_waiters[value] = waiter
        started = self._clock.now()
        self._ping_sent_at[value] = started
        try:
            await self._send_record(FrameType.PING, Flag.NONE, 0, value, b"")
            await waiter.wait()
        finally:
            self._ping_waiters.pop(value, None)
            self._ping_sent_at.pop(value, None)
        return self._clock.now() - started

    def _keepalive_delay(self, interval: float) -> float:
        """How long the keepalive task may sleep: until the connection has been quiet for
        ``interval`` (a ping is due; the dead timeout is later still) or idle for the idle timeout,
        whichever comes first. Traffic moves that moment on, so a busy connection's task wakes
        about once per interval instead of twice, and never just to find nothing to do. With open
        streams the handlers' idle sweep keeps the half-interval cadence; a ping that is not
        answered is retried every half interval, as before."""
        half = interval / 2
        if self._streams:
            return half
        now = self._clock.now()
        due = min(self.last_received + interval, self.last_activity + self.config.idle_connection_timeout_s)
        delay = due - now
        return half if delay <= 0 else min(delay, interval)

    def _next_ping(self) -> int:
        self._ping_counter = (self._ping_counter + 1) & 0xFFFFFFFF
        return self._ping_counter

    def _on_ping(self, header: RecordHeader, payload: memoryview) -> None:
        if header.flags & Flag.ACK:
            sent = self._ping_sent_at.pop(header.value, None)
            if sent is not None:
                self.rtt_s = self._clock.now() - sent
            waiter = self._ping_waiters.pop(header.value, None)
            if waiter is not None:
                waiter.set()
            return
        self._pending_pong = header.value
        self._control_event.set()

    async def _keepalive_loop(self) -> None:
        try:
            await self._keep_alive()
        except ChaosError as exc:  # a failed ping write: the connection is gone, nothing to report
            self._mark_closed(self._close_reason or str(exc))

    async def _keep_alive(self) -> None:
        interval = self.config.keepalive_interval_s
        while True:
            await anyio.sleep(self._keepalive_delay(interval))
            self.keepalive_wakeups += 1
            now = self._clock.now()
            if now - self.last_received > self.config.dead_connection_timeout_s:
                log.info(
                    "closing connection to %s: nothing received for %.1f s", self.remote_peer, now - self.last_received
                )
                self._mark_closed("remote stopped answering")
                return
            self._cancel_idle_handlers(now)
            if not self._streams and now - self.last_activity > self.config.idle_connection_timeout_s:
                await self.aclose("idle", GoAwayCode.IDLE)
                return
            if now - self.last_received >= interval:
                value = self._next_ping()
                self._ping_sent_at[value] = now
                if len(self._ping_sent_at) > _REMEMBERED_PINGS:
                    self._ping_sent_at.pop(next(iter(self._ping_sent_at)))
                await self._send_record(FrameType.PING, Flag.NONE, 0, value, b"")
