"""Configurations of a training run and everything derived from them, as pure functions.

A :class:`Configuration` C_e is what the members of a run agree on for epoch ``e``: who is in the
run (with incarnations and measured training throughput), each member's share of the global batch,
a snapshot of the links between members (up/down, bandwidth, RTT), the run parameters, a seed, and
the first training step it governs (``activation_step``). Its ``digest`` is the SHA-256 of its
canonical msgpack encoding, so two peers holding the same digest hold the same configuration.

C_{e+1} = :func:`next_configuration` (C_e, committed operations, activation step) is a pure
function: every member computes it locally from the decided value and checks the digest. So are
:func:`ring_order` (the all-reduce ring), :func:`quorum` and :func:`compute_shares`.

Performance: configurations of 1024 members are rebuilt on every commit, so members are stored
column-wise (sorted PeerIDs, incarnations, throughputs, since steps), lookups bisect the sorted raw ids,
and :attr:`Configuration.members` (one :class:`MemberEntry` per member) is built lazily. The
packed body (digest and wire form) is kept in pieces, and C_{e+1}'s are spliced from C_e's
(``configuration_columns.py``).
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from chaosp2p.protocols.negotiation.config import MAX_STEP
from chaosp2p.protocols.negotiation.configuration_columns import (
    DELETE,
    INSERT,
    SET,
    MemberEdits,
    departed_rows,
    digest_of,
    link_rows,
    pack_columns,
)
from chaosp2p.protocols.negotiation.operations import (
    DIGEST_BYTES,
    MEMBER_KINDS,
    WIRE_MAX_LINKS,
    WIRE_MAX_MEMBERS,
    WIRE_MAX_RATE,
    WIRE_MAX_RTT_S,
    Operation,
    OpKind,
    apply_order,
    check_count,
    check_number,
    check_run,
    check_uint,
    reject,
)
from chaosp2p.wire.framing import pack, unpack
from chaosp2p.wire.identity import PeerID

_CONFIG_DOMAIN = "chaosp2p/negotiation/config/1"
MODES = ("sync", "diloco")
MAX_OP_AGE_EPOCHS = 256
"""An operation raised at epoch E applies only to configurations of epoch <= E + this (a protocol
constant, not a setting: every member must judge an operation the same way). Departed members are
remembered as long, so a replayed JOIN cannot re-admit a peer that left or failed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunParams:
    """Parameters of a run that do not change with membership."""

    global_batch: int
    """Samples per step over all members (each member gets >= 1)."""
    mode: str = "sync"
    """``"sync"`` (average every step) or ``"diloco"`` (average every ``local_steps``)."""
    local_steps: int = 1

    def validate(self) -> None:
        """Reject nonsense parameters."""
        check_uint(self.global_batch, "global_batch")
        if self.global_batch < 1:
            raise reject("global_batch must be >= 1")
        if self.mode not in MODES:
            raise reject(f"mode must be one of {MODES}")
        check_uint(self.local_steps, "local_steps")
        if self.local_steps < 1:
            raise reject("local_steps must be >= 1")


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberEntry:
    """One member of a configuration."""

    peer_id: PeerID
    incarnation: int
    throughput_samples_per_s: float
    batch_share: int
    """Samples of the global batch this member computes per step (all members taking part)."""
    since_step: int
    """The first step this member takes part in (its admission step)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkEntry:
    """The link between members ``a`` < ``b`` as last agreed."""

    a: PeerID
    b: PeerID
    up: bool
    bandwidth_bytes_per_s: float = 0.0
    """0 = unknown."""
    rtt_s: float = 0.0
    """0 = unknown."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DepartedEntry:
    """A member removed at ``epoch`` while at ``incarnation`` (kept MAX_OP_AGE_EPOCHS epochs).

    ``activation_step`` is the step its removal took effect: a member that left gracefully still
    takes part in the steps before it, so a FAIL about it stays valid (if it crashes before that
    step, an urgent configuration must supersede the ones that still count on it).
    """

    peer_id: PeerID
    incarnation: int
    epoch: int
    activation_step: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Configuration:
    """C_e: the agreed state of one run for epoch ``epoch`` (see the module docstring)."""

    run: str
    epoch: int
    activation_step: int
    """The first training step this configuration governs."""
    peers: tuple[PeerID, ...]
    """Members, sorted by PeerID bytes."""
    incarnations: tuple[int, ...]
    throughputs: tuple[float, ...]
    since_steps: tuple[int, ...]
    """Per member, the first step it takes part in. Usually <= activation_step; larger only after
    an urgent configuration activated earlier than a pending one that admitted the member."""
    links: tuple[LinkEntry, ...]
    """Sorted by (a, b)."""
    params: RunParams
    seed: int
    digest: bytes
    departed: tuple[DepartedEntry, ...] = ()
    """Recently removed members, sorted by PeerID: a JOIN must use a higher incarnation."""
    _raws: tuple[bytes, ...] | None = field(default=None, init=False, repr=False, compare=False)
    _links_by_key: dict[bytes, LinkEntry] | None = field(default=None, init=False, repr=False, compare=False)
    _departed_raws: tuple[bytes, ...] | None = field(default=None, init=False, repr=False, compare=False)
    _members: tuple[MemberEntry, ...] | None = field(default=None, init=False, repr=False, compare=False)
    _shares: tuple[int, ...] | None = field(default=None, init=False, repr=False, compare=False)
    _columns: tuple[bytes, ...] | None = field(default=None, init=False, repr=False, compare=False)

    # Lookup tables are built on first use (next_configuration hands over the member ids it has).
    def ids(self) -> tuple[bytes, ...]:
        """The members' raw PeerIDs, sorted (what lookups bisect)."""
        raws = self._raws
        if raws is None:
            raws = tuple(p.raw for p in self.peers)
            object.__setattr__(self, "_raws", raws)
        return raws

    def _link_table(self) -> dict[bytes, LinkEntry]:
        table = self._links_by_key
        if table is None:
            table = {lk.a.raw + lk.b.raw: lk for lk in self.links}
            object.__setattr__(self, "_links_by_key", table)
        return table

    # ------------------------------------------------------------------ lookups
    @property
    def shares(self) -> tuple[int, ...]:
        """Per member, its samples of the global batch (a pure function of throughputs and the
        global batch, so it is not part of the encoding; computed on first use)."""
        shares = self._shares
        if shares is None:
            shares = compute_shares(self.throughputs, self.params.global_batch)
            object.__setattr__(self, "_shares", shares)
        return shares

    @property
    def members(self) -> tuple[MemberEntry, ...]:
        """One entry per member, sorted by PeerID (built on first use)."""
        members = self._members
        if members is None:
            members = tuple(
                MemberEntry(peer_id=p, incarnation=i, throughput_samples_per_s=t, batch_share=s, since_step=f)
                for p, i, t, s, f in zip(
                    self.peers, self.incarnations, self.throughputs, self.shares, self.since_steps, strict=True
                )
            )
            object.__setattr__(self, "_members", members)
        return members

    def __len__(self) -> int:
        return len(self.peers)

    def index_of(self, peer: PeerID) -> int:
        """Position of ``peer`` among the members, or -1."""
        raws = self._raws if self._raws is not None else self.ids()
        i = bisect.bisect_left(raws, peer.raw)
        return i if i < len(raws) and raws[i] == peer.raw else -1

    def has_member(self, peer: PeerID) -> bool:
        """Is ``peer`` a member?"""
        return self.index_of(peer) >= 0

    def takes_part(self, peer: PeerID, step: int) -> bool:
        """Is ``peer`` a member that takes part in ``step`` (admitted at or before it)?"""
        i = self.index_of(peer)
        return i >= 0 and self.since_steps[i] <= step

    def participants(self, step: int) -> tuple[PeerID, ...]:
        """The members taking part in ``step``: the all-reduce group of that step."""
        if self.since_steps and max(self.since_steps) <= step:
            return self.peers
        return tuple(p for p, since in zip(self.peers, self.since_steps, strict=True) if since <= step)

    def incarnation_of(self, peer: PeerID) -> int | None:
        """The member's incarnation, or None if it is not a member."""
        i = self.index_of(peer)
        return None if i < 0 else self.incarnations[i]

    def member(self, peer: PeerID) -> MemberEntry | None:
        """The member's entry, or None."""
        i = self.index_of(peer)
        return None if i < 0 else self.members[i]

    def link(self, a: PeerID, b: PeerID) -> LinkEntry | None:
        """The agreed link between ``a`` and ``b`` (either order), or None."""
        key = a.raw + b.raw if a.raw < b.raw else b.raw + a.raw
        return self._link_table().get(key)

    def departed_incarnation(self, peer: PeerID) -> int | None:
        """The incarnation ``peer`` had when it was removed (if within MAX_OP_AGE_EPOCHS), or None."""
        entry = self.departed_entry(peer)
        return None if entry is None else entry.incarnation

    def departed_entry(self, peer: PeerID) -> DepartedEntry | None:
        """The record of ``peer``'s removal (if within MAX_OP_AGE_EPOCHS), or None."""
        raws = self._departed_raws
        if raws is None:
            raws = tuple(d.peer_id.raw for d in self.departed)
            object.__setattr__(self, "_departed_raws", raws)
        i = bisect.bisect_left(raws, peer.raw)
        return self.departed[i] if i < len(raws) and raws[i] == peer.raw else None

    @property
    def quorum(self) -> int:
        """Majority of the members."""
        return quorum(self)

    # ------------------------------------------------------------------ encoding
    def body(self) -> list[Any]:
        """The canonical array the digest covers."""
        return [
            self.run,
            self.epoch,
            self.activation_step,
            list(self.ids()),
            list(self.incarnations),
            list(self.throughputs),
            list(self.since_steps),
            link_rows(self),
            [self.params.global_batch, self.params.mode, self.params.local_steps],
            self.seed,
            departed_rows(self),
        ]

    def packed_columns(self) -> tuple[bytes, ...]:
        """The body's packed items in ``configuration_columns.PIECES`` pieces (packed once; the
        next epoch's configuration reuses them)."""
        columns = self._columns
        if columns is None:
            columns = pack_columns(self, None)
            object.__setattr__(self, "_columns", columns)
        return columns

    def packed_body(self) -> bytes:
        """The msgpack encodings of the body's items, concatenated (no array header): the digest
        and the wire form are both a 12-item array around these bytes, so they are packed once."""
        return b"".join(self.packed_columns())

    def encode(self) -> bytes:
        """The wire form: the canonical array followed by the digest."""
        return _ARRAY_12 + self.packed_body() + pack(self.digest)


_ARRAY_12 = pack([None] * 12)[:1]
"""msgpack header of a 12-item array: the digest covers [domain, *11 body items] and the wire
form is [*11 body items, digest]."""
_DIGEST_PREFIX = _ARRAY_12 + pack(_CONFIG_DOMAIN)


def quorum(config: Configuration) -> int:
    """A majority of ``config``'s members: len // 2 + 1."""
    return len(config.peers) // 2 + 1


def compute_shares(throughputs: Sequence[float], global_batch: int) -> tuple[int, ...]:
    """Batch shares proportional to throughput by largest remainder, every member >= 1 sample.

    If the global batch is smaller than the member count every member gets 1 (the effective batch
    grows to the member count). Ties in the remainder go to the earlier member (smaller PeerID).
    """
    n = len(throughputs)
    if n == 0:
        return ()
    if global_batch <= n:
        return (1,) * n
    spare = global_batch - n
    first = throughputs[0]
    if all(t == first for t in throughputs):
        base, extra = divmod(spare, n)
        return tuple(1 + base + (1 if i < extra else 0) for i in range(n))
    total = float(sum(throughputs))
    quotas = [spare * t / total for t in throughputs]
    floors = [int(q) for q in quotas]
    left = spare - sum(floors)
    if left > 0:
        order = sorted(range(n), key=lambda i: (floors[i] - quotas[i], i))
        for i in order[:left]:
            floors[i] += 1
    return tuple(1 + f for f in floors)


def derive_seed(previous_seed: int, epoch: int, previous_digest: bytes) -> int:
    """The seed of epoch ``epoch`` from the previous configuration's seed and digest."""
    data = previous_seed.to_bytes(8, "big") + epoch.to_bytes(8, "big") + previous_digest
    return int.from_bytes(hashlib.sha256(data).digest()[:8], "big") >> 1


def make_configuration(
    *,
    run: str,
    epoch: int,
    activation_step: int,
    peers: Sequence[PeerID],
    incarnations: Sequence[int],
    throughputs: Sequence[float],
    links: Sequence[LinkEntry],
    params: RunParams,
    seed: int,
    shares: Sequence[int] | None = None,
    since_steps: Sequence[int] | None = None,
    departed: Sequence[DepartedEntry] = (),
    ids: Sequence[bytes] | None = None,
    spliced_from: tuple[Configuration, MemberEdits] | None = None,
) -> Configuration:
    """Build a configuration (peers already sorted) and its digest; ``shares``, if given, seeds the
    cache of the (derived) batch shares. ``spliced_from`` = (C_e, the edits of its member columns)
    lets ``next_configuration`` splice the packed body from C_e's (``configuration_columns``)."""
    config = Configuration(
        run=run,
        epoch=epoch,
        activation_step=activation_step,
        peers=tuple(peers),
        incarnations=tuple(incarnations),
        throughputs=tuple(throughputs),
        since_steps=tuple(since_steps) if since_steps is not None else (activation_step,) * len(peers),
        links=tuple(links),
        params=params,
        seed=seed,
        digest=b"",
        departed=tuple(departed),
    )
    if shares is not None:
        object.__setattr__(config, "_shares", tuple(shares))
    if ids is not None:
        object.__setattr__(config, "_raws", tuple(ids))
    columns = pack_columns(config, spliced_from)
    object.__setattr__(config, "_columns", columns)
    object.__setattr__(config, "digest", digest_of(_DIGEST_PREFIX, columns))
    return config


def genesis_configuration(
    run: str, founder: PeerID, *, incarnation: int, throughput: float, params: RunParams
) -> Configuration:
    """C_0 of a new run: the founder alone, governing from step 0."""
    seed = int.from_bytes(hashlib.sha256(run.encode() + founder.raw).digest()[:8], "big") >> 1
    return make_configuration(
        run=run,
        epoch=0,
        activation_step=0,
        peers=(founder,),
        incarnations=(incarnation,),
        throughputs=(throughput,),
        links=(),
        params=params,
        seed=seed,
    )


# ---------------------------------------------------------------------------------- validity
def check_operation(op: Operation, config: Configuration) -> str | None:
    """Why ``op`` may not apply to ``config`` (a rejection reason), or None if it may.

    This is the deterministic rule every acceptor applies: the same operation and configuration
    give the same answer everywhere.
    """
    if op.run != config.run:
        return "wrong_run"
    if op.epoch > config.epoch:
        return "future_epoch"
    if op.epoch + MAX_OP_AGE_EPOCHS < config.epoch:
        return "too_old"
    kind = op.kind
    if kind is OpKind.FAIL:
        if op.origin == op.subject or not config.has_member(op.origin):
            return "forged_origin"
        held = config.incarnation_of(op.subject)
        if held is None:
            # A member removed recently (typically a leaver that crashed before its leave took
            # effect): the FAIL makes the batch urgent, so its configuration supersedes the ones
            # that still count on the subject.
            held = config.departed_incarnation(op.subject)
            if held is None:
                return "subject_not_member"
        return "stale_incarnation" if op.incarnation < held else None
    if kind is OpKind.EVICT:
        # Any other member may sign one; it counts only as one of a quorum of distinct signers
        # (``evictions``), so one member alone can evict nobody. Exactly the subject's incarnation:
        # a rejoined subject (higher incarnation) starts with a clean slate.
        if op.origin == op.subject or not config.has_member(op.origin):
            return "forged_origin"
        held = config.incarnation_of(op.subject)
        if held is None:
            return "subject_not_member"
        return None if op.incarnation == held else "stale_incarnation"
    if kind in (OpKind.LINK_UP, OpKind.LINK_DOWN):
        other = op.other
        if other is None or (op.origin != op.subject and op.origin != other):
            return "forged_origin"
        if not (config.has_member(op.subject) and config.has_member(other)):
            return "subject_not_member"
        return None if config.incarnation_of(op.origin) == op.incarnation else "stale_incarnation"
    if op.origin != op.subject:
        return "forged_origin"
    held = config.incarnation_of(op.subject)
    if kind is OpKind.JOIN:
        if held is not None:
            return None if held < op.incarnation else "already_member"
        gone = config.departed_incarnation(op.subject)
        return None if gone is None or gone < op.incarnation else "replayed"
    if held is None:
        return "subject_not_member"
    if kind is OpKind.LEAVE:
        return "stale_incarnation" if op.incarnation < held else None
    return None if op.incarnation == held else "stale_incarnation"  # THROUGHPUT


# ---------------------------------------------------------------------------------- next epoch
@dataclass(frozen=True, slots=True, kw_only=True)
class AppliedOp:
    """What became of one operation of a committed batch."""

    op_id: bytes
    op: Operation
    applied: bool
    """False if incarnation precedence dropped it or it no longer applied when its turn came."""


def eviction_signers(config: Configuration, ops: Iterable[tuple[bytes, Operation]]) -> dict[bytes, set[bytes]]:
    """Per subject (raw id), the distinct members that signed an EVICT of it valid against ``config``."""
    signers: dict[bytes, set[bytes]] = {}
    for _, op in ops:
        if op.kind is OpKind.EVICT and check_operation(op, config) is None:
            signers.setdefault(op.subject.raw, set()).add(op.origin.raw)
    return signers


def eviction_cap(config: Configuration) -> int:
    """How many members one configuration change may evict: as many as leave a quorum of
    ``config`` (honest members are a majority, so honest evictions never come near it; without
    the cap, signatures enough to evict everyone would commit an empty configuration)."""
    return len(config.peers) - quorum(config)


def capped_evictions(config: Configuration, subjects: Iterable[bytes]) -> frozenset[bytes]:
    """The first :func:`eviction_cap` of ``subjects`` (raw ids) by raw id: the ones one change evicts."""
    return frozenset(sorted(subjects)[: eviction_cap(config)])


def evictions(config: Configuration, ops: Iterable[tuple[bytes, Operation]]) -> frozenset[bytes]:
    """The subjects (raw ids) that ``ops`` evict from ``config``: those with EVICTs signed by at
    least ``quorum(config)`` distinct members (the subject cannot sign its own), at most
    :func:`eviction_cap` of them (the lowest raw ids; the others' EVICTs are dropped)."""
    need = quorum(config)
    return capped_evictions(config, (raw for raw, who in eviction_signers(config, ops).items() if len(who) >= need))


def _settle_evictions(
    prev: Configuration, ops: list[tuple[bytes, Operation]]
) -> tuple[list[tuple[bytes, Operation]], list[tuple[bytes, Operation]]]:
    """(ops left to apply, ops dropped): EVICTs without a quorum of signers do nothing; a subject
    evicted by a quorum is removed whatever else the batch says about it (a JOIN at a higher
    incarnation, its own LEAVE or THROUGHPUT): the subject cannot refute its eviction."""
    evicted = evictions(prev, ops)
    keep: list[tuple[bytes, Operation]] = []
    dropped: list[tuple[bytes, Operation]] = []
    for ident, op in ops:
        if op.kind is OpKind.EVICT:
            (keep if op.subject.raw in evicted else dropped).append((ident, op))
        elif op.kind in MEMBER_KINDS and op.subject.raw in evicted:
            dropped.append((ident, op))
        else:
            keep.append((ident, op))
    return keep, dropped


def next_configuration(
    prev: Configuration, ops: Iterable[tuple[bytes, Operation]], activation_step: int
) -> tuple[Configuration, tuple[AppliedOp, ...]]:
    """C_{e+1} from C_e, the committed operations (with their ids) and the activation step.

    Operations are assumed to have passed :func:`check_operation` against ``prev``; each is checked
    again against the configuration as it evolves (an op about a member removed earlier in the
    same batch, a second FAIL of one subject, a link to a removed member are skipped).
    """
    ops = list(ops)
    unsettled: list[tuple[bytes, Operation]] = []
    if any(op.kind is OpKind.EVICT for _, op in ops):
        ops, unsettled = _settle_evictions(prev, ops)
    ordered, dropped = apply_order(ops)
    raws = list(prev.ids())
    peers = list(prev.peers)
    incs = list(prev.incarnations)
    thrs = list(prev.throughputs)
    since = list(prev.since_steps)
    links: dict[bytes, LinkEntry] | None = None
    removed: set[bytes] = set()
    departed = {d.peer_id.raw: d for d in prev.departed if d.epoch + MAX_OP_AGE_EPOCHS >= prev.epoch + 1}
    departed_changed = len(departed) != len(prev.departed)
    for raw, d in list(departed.items()):
        if d.activation_step > activation_step:
            # This configuration governs the steps from activation_step on and does not count on
            # the departed member: its participation now ends earlier (a lame duck learns this).
            departed[raw] = DepartedEntry(
                peer_id=d.peer_id, incarnation=d.incarnation, epoch=d.epoch, activation_step=activation_step
            )
            departed_changed = True
    members_changed = False
    # What changed in the member columns, in order: C_{e+1}'s packed columns are spliced from C_e's.
    edits: MemberEdits = ([], [], [], [])
    e_ids, e_incs, e_thrs, e_since = edits
    results: list[AppliedOp] = [AppliedOp(op_id=i, op=op, applied=False) for i, op in unsettled]
    results.extend(AppliedOp(op_id=i, op=op, applied=False) for i, op in _dropped(ops, dropped))
    for ident, op in ordered:
        raw = op.subject.raw
        i = bisect.bisect_left(raws, raw)
        present = i < len(raws) and raws[i] == raw
        applied = False
        kind = op.kind
        if kind is OpKind.FAIL or kind is OpKind.LEAVE or kind is OpKind.EVICT:
            # An EVICT got here only with a quorum of signers, at exactly the subject's incarnation.
            if present and op.incarnation >= incs[i]:
                departed[raw] = DepartedEntry(
                    peer_id=peers[i], incarnation=incs[i], epoch=prev.epoch + 1, activation_step=activation_step
                )
                del raws[i], peers[i], incs[i], thrs[i], since[i]
                for column in edits:
                    column.append((DELETE, i, None))
                removed.add(raw)
                members_changed = applied = departed_changed = True
        elif kind is OpKind.JOIN:
            if present and incs[i] < op.incarnation:
                incs[i] = op.incarnation
                thrs[i] = op.throughput_samples_per_s
                since[i] = activation_step
                e_incs.append((SET, i, op.incarnation))
                e_thrs.append((SET, i, op.throughput_samples_per_s))
                e_since.append((SET, i, activation_step))
                members_changed = applied = True
            elif not present:
                raws.insert(i, raw)
                peers.insert(i, op.subject)
                incs.insert(i, op.incarnation)
                thrs.insert(i, op.throughput_samples_per_s)
                since.insert(i, activation_step)
                e_ids.append((INSERT, i, raw))
                e_incs.append((INSERT, i, op.incarnation))
                e_thrs.append((INSERT, i, op.throughput_samples_per_s))
                e_since.append((INSERT, i, activation_step))
                removed.discard(raw)
                if departed.pop(raw, None) is not None:
                    departed_changed = True
                members_changed = applied = True
        elif kind is OpKind.THROUGHPUT:
            if present and incs[i] == op.incarnation:
                thrs[i] = op.throughput_samples_per_s
                e_thrs.append((SET, i, op.throughput_samples_per_s))
                members_changed = applied = True
        else:
            other = op.other
            assert other is not None
            j = bisect.bisect_left(raws, other.raw)
            if present and j < len(raws) and raws[j] == other.raw:
                if links is None:
                    links = dict(prev._link_table())
                up = kind is OpKind.LINK_UP
                old = links.get(raw + other.raw)
                if up or old is None:
                    bandwidth, rtt = op.bandwidth_bytes_per_s, op.rtt_s
                else:  # a link that goes down keeps its last figures
                    bandwidth, rtt = old.bandwidth_bytes_per_s, old.rtt_s
                links[raw + other.raw] = LinkEntry(
                    a=op.subject, b=other, up=up, bandwidth_bytes_per_s=bandwidth, rtt_s=rtt
                )
                applied = True
        results.append(AppliedOp(op_id=ident, op=op, applied=applied))
    if removed:
        if links is None:
            links = dict(prev._link_table())
        links = {k: lk for k, lk in links.items() if lk.a.raw not in removed and lk.b.raw not in removed}
    link_tuple = prev.links if links is None else tuple(links[k] for k in sorted(links))
    epoch = prev.epoch + 1
    config = make_configuration(
        run=prev.run,
        epoch=epoch,
        activation_step=activation_step,
        peers=peers,
        incarnations=incs,
        throughputs=thrs,
        links=link_tuple,
        params=prev.params,
        seed=derive_seed(prev.seed, epoch, prev.digest),
        shares=None if members_changed else prev._shares,
        since_steps=since,
        ids=raws,
        departed=tuple(departed[k] for k in sorted(departed)) if departed_changed else prev.departed,
        spliced_from=(prev, edits),
    )
    return config, tuple(results)


def _dropped(ops: Iterable[tuple[bytes, Operation]], dropped: set[bytes]) -> list[tuple[bytes, Operation]]:
    if not dropped:
        return []
    return [(i, op) for i, op in ops if i in dropped]


# ---------------------------------------------------------------------------------- ring
def batch_shares(config: Configuration, step: int) -> tuple[tuple[PeerID, int], ...]:
    """(member, samples) for the members taking part in ``step``; equal to ``config.shares`` unless
    a member admitted later than the configuration's activation step is not taking part yet."""
    peers = config.participants(step)
    if len(peers) == len(config.peers):
        return tuple(zip(config.peers, config.shares, strict=True))
    throughputs = [config.throughputs[config.index_of(p)] for p in peers]
    return tuple(zip(peers, compute_shares(throughputs, config.params.global_batch), strict=True))


def ring_order(config: Configuration, step: int | None = None) -> tuple[PeerID, ...]:
    """The all-reduce ring: a greedy bottleneck heuristic over the link snapshot.

    Start at the smallest PeerID; repeatedly go to the unvisited member joined to the current one
    by the widest agreed link at least as good as an unmeasured one, else to the next unvisited
    member in PeerID order whose link to the current one is neither down nor known to be narrower
    (else simply the next unvisited). Unknown bandwidths count as equal: the median of the known
    ones. Runs in O(members + links) and is deterministic. With ``step``, only the members taking
    part in that step (``Configuration.participants``) are in the ring.
    """
    peers = config.peers if step is None else config.participants(step)
    n = len(peers)
    if n <= 2:
        return peers
    index = {p.raw: i for i, p in enumerate(peers)}
    known = sorted(lk.bandwidth_bytes_per_s for lk in config.links if lk.up and lk.bandwidth_bytes_per_s > 0)
    unknown_bw = known[len(known) // 2] if known else 1.0
    better: list[list[tuple[float, int]]] = [[] for _ in range(n)]
    down: list[set[int]] = [set() for _ in range(n)]
    for lk in config.links:
        ia, ib = index.get(lk.a.raw), index.get(lk.b.raw)
        if ia is None or ib is None:
            continue
        if not lk.up or 0 < lk.bandwidth_bytes_per_s < unknown_bw:
            down[ia].add(ib)  # down, or known to be narrower than an unmeasured link is assumed
            down[ib].add(ia)
        elif lk.bandwidth_bytes_per_s >= unknown_bw:
            better[ia].append((-lk.bandwidth_bytes_per_s, ib))
            better[ib].append((-lk.bandwidth_bytes_per_s, ia))
    for candidates in better:
        candidates.sort()
    visited = [False] * n
    order = [0]
    visited[0] = True
    cursor = 1  # every index below it is visited
    current = 0
    for _ in range(n - 1):
        nxt = -1
        for _, j in better[current]:
            if not visited[j]:
                nxt = j
                break
        if nxt < 0:
            while visited[cursor]:
                cursor += 1
            nxt = cursor
            if nxt in down[current]:
                j = cursor + 1
                while j < n and (visited[j] or j in down[current]):
                    j += 1
                if j < n:
                    nxt = j
        visited[nxt] = True
        order.append(nxt)
        current = nxt
    return tuple(peers[i] for i in order)


# ---------------------------------------------------------------------------------- decoding
def _uints(values: list[Any]) -> bool:
    """Are all ``values`` ints in [0, MAX_STEP]? (column-wise: bools are not ints here)"""
    return set(map(type, values)) <= {int} and (not values or (min(values) >= 0 and max(values) <= MAX_STEP))


def decode_configuration(raw: bytes, *, max_members: int, max_links: int) -> Configuration:
    """Decode and check a configuration from the wire; a bad one is a RemoteProtocolError.

    Counts are checked before anything is built, and the digest is recomputed: a configuration
    whose digest does not match its content is refused.
    """
    obj = unpack(raw, max_bytes=len(raw))
    if not isinstance(obj, list) or len(obj) != 12:
        raise reject("configuration must be an array of 12 items")
    run, epoch, step, raws, incs, thrs, since, links, params, seed, gone, digest = obj
    if type(run) is not str or type(epoch) is not int or type(step) is not int or type(seed) is not int:
        raise reject("configuration header has wrong types")
    check_run(run)
    check_uint(epoch, "epoch")
    check_uint(step, "activation_step")
    if not 0 <= seed < (1 << 63):
        raise reject("seed out of range")
    if type(digest) is not bytes or len(digest) != DIGEST_BYTES:
        raise reject("digest must be 32 bytes")
    for column in (raws, incs, thrs, since, links, params, gone):
        if not isinstance(column, list):
            raise reject("configuration columns must be arrays")
    check_count(len(raws), min(max_members, WIRE_MAX_MEMBERS), "members")
    check_count(len(links), min(max_links, WIRE_MAX_LINKS), "links")
    check_count(len(gone), WIRE_MAX_MEMBERS, "departed members")
    n = len(raws)
    if not (len(incs) == len(thrs) == len(since) == n):
        raise reject("configuration columns differ in length")
    try:
        peers = PeerID.from_raws(raws)
    except ValueError:
        raise reject("configuration member is not a PeerID") from None
    if raws != sorted(raws) or len(set(raws)) != n:
        raise reject("members must be sorted and distinct")
    # A newcomer decodes a configuration of ~1000 members on its critical path: check each column
    # in one pass, and only on failure walk it again for the precise reason.
    if not _uints(incs):
        for value in incs:
            if type(value) is not int:
                raise reject("incarnation must be an int")
            check_uint(value, "incarnation")
    if not (set(map(type, thrs)) <= {float} and all(map(math.isfinite, thrs))) or (
        thrs and not 0.0 <= min(thrs) <= max(thrs) <= WIRE_MAX_RATE
    ):
        for value in thrs:
            if type(value) is not float:
                raise reject("throughput must be a float")
            check_number(value, WIRE_MAX_RATE, "throughput")
    if not _uints(since):
        for value in since:
            if type(value) is not int:
                raise reject("since step must be an int")
            check_uint(value, "since step")
    link_entries = []
    previous = b""
    for item in links:
        if not (isinstance(item, list) and len(item) == 5):
            raise reject("link must be an array of 5")
        a, b, up, bw, rtt = item
        if type(a) is not bytes or type(b) is not bytes or type(up) is not bool:
            raise reject("link has wrong types")
        if type(bw) is not float or type(rtt) is not float:
            raise reject("link figures must be floats")
        check_number(bw, WIRE_MAX_RATE, "bandwidth")
        check_number(rtt, WIRE_MAX_RTT_S, "rtt")
        if not a < b or not previous < a + b:
            raise reject("links must be sorted, with a < b")
        previous = a + b
        try:
            link_entries.append(LinkEntry(a=PeerID(a), b=PeerID(b), up=up, bandwidth_bytes_per_s=bw, rtt_s=rtt))
        except ValueError:
            raise reject("link endpoint is not a PeerID") from None
    if len(params) != 3 or type(params[0]) is not int or type(params[1]) is not str or type(params[2]) is not int:
        raise reject("run params must be [int, str, int]")
    run_params = RunParams(global_batch=params[0], mode=params[1], local_steps=params[2])
    run_params.validate()
    departed = []
    previous = b""
    for item in gone:
        if not (isinstance(item, list) and len(item) == 4 and type(item[0]) is bytes):
            raise reject("departed entry must be [PeerID, int, int, int]")
        if any(type(v) is not int for v in item[1:]) or not previous < item[0]:
            raise reject("departed entries must be sorted, with int fields")
        for value, what in zip(item[1:], ("incarnation", "epoch", "activation step"), strict=True):
            check_uint(value, f"departed {what}")
        previous = item[0]
        try:
            departed.append(
                DepartedEntry(peer_id=PeerID(item[0]), incarnation=item[1], epoch=item[2], activation_step=item[3])
            )
        except ValueError:
            raise reject("departed entry is not a PeerID") from None
    config = make_configuration(
        run=run,
        epoch=epoch,
        activation_step=step,
        peers=peers,
        incarnations=incs,
        throughputs=thrs,
        links=link_entries,
        params=run_params,
        seed=seed,
        since_steps=since,
        departed=departed,
        ids=raws,
    )
    if config.digest != digest:
        raise reject("configuration digest does not match its content")
    return config


__all__ = [
    "MAX_OP_AGE_EPOCHS",
    "AppliedOp",
    "Configuration",
    "DepartedEntry",
    "LinkEntry",
    "MemberEntry",
    "RunParams",
    "batch_shares",
    "capped_evictions",
    "check_operation",
    "compute_shares",
    "decode_configuration",
    "eviction_cap",
    "eviction_signers",
    "evictions",
    "genesis_configuration",
    "make_configuration",
    "next_configuration",
    "quorum",
    "ring_order",
]
