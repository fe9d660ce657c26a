"""The owner's side of a round: receive the contributions to one shard, average, answer, revise.

Theory of operation
-------------------
Contribution streams reach the owner through the averager's stream handler and are accepted into
the :class:`RoundState`. For each one with values the owner starts a receiver that reads the
payload straight into that contributor's slot of a preallocated staging area, one chunk at a
time, and wakes the reducer. The reducer waits until every contribution's chunk *i* is in, then
reduces chunk *i* (while chunk *i + 1* is still arriving). When the shard is done the owner
answers every contributor with the same bytes, sent from the result array.

The result is written into the caller's buffer only at :meth:`OwnerRole.publish`, at the very end:
until then the buffer still holds this member's own contribution, which a revision (the shard
averaged again without a peer another owner excluded) needs.
"""

from __future__ import annotations

import logging

import anyio
import anyio.lowlevel
import numpy as np

from chaosp2p.clock import Clock
from chaosp2p.errors import ConnectionClosed, RemoteProtocolError, StreamReset
from chaosp2p.protocols.averaging.messages import Exclusion, Result, ResultStatus, WireDtype, codec
from chaosp2p.protocols.averaging.shard_reduce import Part, ShardReducer, decode, encode, storage_dtype
from chaosp2p.training.round_state import Inbound, RoundState
from chaosp2p.transport.stream import Stream
from chaosp2p.wire.identity import PeerID

log = logging.getLogger("chaosp2p.training")


def as_bytes(array: np.ndarray) -> memoryview:
    """The bytes of a contiguous array, without a copy."""
    return array.data.cast("B")


async def send_array(stream: Stream, values: np.ndarray, wire: WireDtype, chunk_elements: int, *, eof: bool) -> None:
    """Send float32 ``values`` in ``wire`` format, chunk by chunk (float32 straight from memory)."""
    size = min(chunk_elements, len(values))
    scratch = None if wire is WireDtype.FLOAT32 else np.empty(size, storage_dtype(wire))
    bits = np.empty(size, np.uint32) if wire is WireDtype.BFLOAT16 else None
    for start in range(0, len(values), chunk_elements):
        chunk = values[start : start + chunk_elements]
        if scratch is not None:
            encoded = scratch[: len(chunk)]
            encode(chunk, encoded, wire, bits)
            chunk = encoded
        await stream.send(as_bytes(chunk), eof=eof and start + chunk_elements >= len(values))


class OwnerRole:
    """Averages this member's shard of one round."""

    def __init__(self, round_: RoundState, *, staging: np.ndarray, clock: Clock, window_bytes: int) -> None:
        self.round = round_
        self._clock = clock
        self._window_bytes = window_bytes
        shard = round_.shard
        # An owner of an empty shard receives nothing: contributors skip it (spec section 4.1).
        self._others = [p for p in round_.members if p != round_.me] if shard.size else []
        slot_bytes = shard.size * round_.wire.itemsize
        if len(staging) < len(self._others) * slot_bytes + shard.size * 4:
            raise ValueError("staging area too small")
        self._slots = {
            peer: staging[i * slot_bytes : (i + 1) * slot_bytes].view(storage_dtype(round_.wire))
            for i, peer in enumerate(self._others)
        }
        start = len(self._others) * slot_bytes
        self.result = staging[start : start + shard.size * 4].view(np.float32)
        """The averaged shard (float32), sent from here and copied into the buffer at the end."""
        self._wire_result: np.ndarray | None = None
        self._reducer: ShardReducer | None = None

    @staticmethod
    def staging_bytes(round_: RoundState) -> int:
        """Size of the staging area :class:`OwnerRole` needs for ``round_``."""
        members = len(round_.members)
        return (members - 1) * round_.shard.size * round_.wire.itemsize + round_.shard.size * 4

    # ------------------------------------------------------------------ phase 1
    async def run(self) -> None:
        """Receive, reduce, answer every contributor."""
        round_ = self.round
        await self._reduce()
        if round_.shard.size and round_.total_weight <= 0:
            round_.fail("aborted", frozenset(), f"no valid contribution for the shard of {round_.me.short()}")
            return
        round_.shard_done_at = self._clock.now()
        log.debug("round %s: shard averaged", round_.tag)
        answer = self._answer(revision=0)
        round_.answers[round_.me] = answer
        await self._send_to_all(answer)

    async def _reduce(self) -> None:
        round_ = self.round
        shard = round_.shard
        started: set[PeerID] = set()
        async with anyio.create_task_group() as tg:
            # Start a receiver for each contribution as it arrives; go on once all have arrived.
            while True:
                for peer, inbound in list(round_.inbound.items()):
                    if peer in started:
                        continue
                    started.add(peer)
                    if inbound.reply is None and inbound.header.weight > 0 and shard.size:
                        inbound.values = self._slots[peer]
                        tg.start_soon(self._receive, inbound)
                if started.issuperset(self._others):
                    break
                await round_.arrived.wait()
            parts = []
            if round_.weight > 0 and shard.size:
                parts.append(Part(peer=round_.me, weight=round_.weight, values=round_.buffer[shard.start : shard.stop]))
            for inbound in round_.inbound.values():
                if inbound.values is not None:
                    parts.append(
                        Part(peer=inbound.peer, weight=inbound.header.weight, values=inbound.values, wire=round_.wire)
                    )
            reducer = self._reducer = ShardReducer(parts, self.result, chunk_elements=round_.chunk_elements)
            for index in range(reducer.chunk_count):
                _, stop = reducer.chunk_bounds(index)
                while True:
                    for inbound in round_.inbound.values():
                        if inbound.failed:
                            reducer.exclude(inbound.peer, round_.excluded[inbound.peer])
                    if all(i.values is None or i.failed or i.received >= stop for i in round_.inbound.values()):
                        break
                    await round_.progress.wait()
                began = self._clock.now()
                for peer in reducer.reduce_chunk(index):
                    round_.invalid_here.add(peer)
                    round_.exclude_here(peer, reducer.excluded[peer])
                round_.reduce_s += self._clock.now() - began
                await anyio.lowlevel.checkpoint()  # other connections get served between chunks
        for peer, reason in reducer.excluded.items():
            round_.exclude_here(peer, reason)
        round_.total_weight = reducer.total_weight if shard.size else 0.0

    async def _receive(self, inbound: Inbound) -> None:
        round_ = self.round
        values = inbound.values
        assert values is not None
        stream = inbound.stream
        stream.set_receive_window(self._window_bytes)
        itemsize = values.itemsize
        chunk_bytes = round_.chunk_elements * itemsize
        total_bytes = values.nbytes

        def progressed(filled: int) -> None:
            # Called by the connection's reader as records land: wake the reducer once per
            # completed chunk (and at the end), not once per record.
            if filled // chunk_bytes > inbound.received * itemsize // chunk_bytes or filled == total_bytes:
                inbound.received = filled // itemsize
                round_.progress.notify()

        try:
            # The whole slot stays posted, so records are decrypted straight into it; the reducer
            # still starts on each chunk as soon as every contribution's chunk is in.
            await stream.receive_into(as_bytes(values), on_progress=progressed)
            inbound.received = len(values)
            round_.bytes_received += total_bytes
            round_.progress.notify()
            log.debug("round %s: contribution of %s in", round_.tag, inbound.peer.short())
        except ConnectionClosed as exc:
            round_.unreachable.add(inbound.peer)
            round_.fail("aborted", frozenset({inbound.peer}), f"{inbound.peer.short()}: {exc}")
        except (StreamReset, RemoteProtocolError) as exc:
            # A reset with the connection still up: the contributor gave up on the round (its own
            # answers as an owner tell everyone why); its contribution is left out of this shard.
            round_.exclude_here(inbound.peer, f"contribution abandoned: {exc}")
            inbound.failed = True
            round_.progress.notify()

    def _answer(self, *, revision: int) -> Result:
        round_ = self.round
        shard = round_.shard
        reducer = self._reducer
        assert reducer is not None
        wire = self._encode()
        return Result(
            status=ResultStatus.OK,
            start=shard.start,
            stop=shard.stop,
            wire_dtype=round_.wire,
            payload_bytes=wire.nbytes,
            total_weight=round_.total_weight,
            # Refused headers too: every member must leave a contribution out that one owner refused,
            # or members would disagree about the round (its values stay in the other shards).
            excluded=tuple(
                Exclusion(peer=p, reason=r[:1024]) for p, r in sorted({**round_.refused, **reducer.excluded}.items())
            ),
            included=reducer.included if shard.size else (),
            revision=revision,
        )

    def _encode(self) -> np.ndarray:
        """The averaged shard as it goes on the wire (rounded once, so every member gets the same)."""
        round_ = self.round
        if round_.wire is WireDtype.FLOAT32:
            self._wire_result = self.result
        else:
            self._wire_result = np.empty(len(self.result), dtype=storage_dtype(round_.wire))
            bits = np.empty(min(len(self.result), round_.chunk_elements), np.uint32)
            for start in range(0, len(self.result), round_.chunk_elements):
                stop = start + round_.chunk_elements
                encode(self.result[start:stop], self._wire_result[start:stop], round_.wire, bits)
        return self._wire_result

    async def _send_to_all(self, answer: Result) -> None:
        async with anyio.create_task_group() as tg:
            for inbound in self.round.inbound.values():
                if not inbound.failed and (not inbound.answered or inbound.ok_sent):
                    tg.start_soon(self._send_answer, inbound, answer)

    async def _send_answer(self, inbound: Inbound, answer: Result) -> None:
        round_ = self.round
        payload = self._wire_result
        assert payload is not None
        inbound.answered = True
        try:
            await inbound.stream.send_message(codec, answer)
            view = as_bytes(payload)
            step = round_.chunk_elements * round_.wire.itemsize
            for start in range(0, len(view), step):
                await inbound.stream.send(view[start : start + step])
            round_.bytes_sent += len(view)
            inbound.ok_sent = True
            log.debug("round %s: answer to %s sent", round_.tag, inbound.peer.short())
        except ConnectionClosed as exc:
            round_.unreachable.add(inbound.peer)
            round_.fail("aborted", frozenset({inbound.peer}), f"{inbound.peer.short()}: {exc}")
        except StreamReset:
            inbound.failed = True  # the contributor gave up on the round; nothing left to tell it

    # ------------------------------------------------------------------ phase 2 and the end
    async def revise(self, excluded: dict[PeerID, str]) -> None:
        """Average the shard again without ``excluded`` peers and send it to every contributor."""
        reducer = self._reducer
        assert reducer is not None
        for peer in reducer.included:
            if peer in excluded:
                reducer.exclude(peer, excluded[peer])
        began = self._clock.now()
        reducer.recompute()
        self.round.reduce_s += self._clock.now() - began
        self.round.total_weight = reducer.total_weight
        if self.round.total_weight <= 0:
            self.round.fail(
                "aborted", frozenset(), f"no valid contribution left for the shard of {self.round.me.short()}"
            )
            return
        await self._send_to_all(self._answer(revision=1))

    def publish(self) -> None:
        """Put the averaged shard into the caller's buffer, exactly as the others received it."""
        round_ = self.round
        shard = round_.shard
        if not shard.size or self._wire_result is None:
            return
        target = round_.buffer[shard.start : shard.stop]
        if round_.wire is WireDtype.FLOAT32:
            np.copyto(target, self.result)
        else:
            decode(self._wire_result, target, round_.wire)
