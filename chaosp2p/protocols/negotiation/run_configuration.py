"""A run's agreed configuration C_e: the value, its digest, and what is derived from it.

A :class:`Configuration` C_e is what the members of a run agree on for epoch ``e``: who is in the
run (with incarnations and measured training throughput), each member's share of the global batch,
a snapshot of the links between members (up/down, bandwidth, RTT), the run parameters, a seed, and
the first training step it governs (``activation_step``). Its ``digest`` is the SHA-256 of its
canonical msgpack encoding, so two peers holding the same digest hold the same configuration.

(Not to be confused with ``config.py``: :class:`NegotiationConfig` is this peer's local settings;
a configuration is what a run's members agreed on.)

The rest of the family: ``configuration_change.py`` computes C_{e+1} from C_e and the committed
operations (:func:`next_configuration`, a pure function every member evaluates and checks against
the digest), ``configuration_decode.py`` reads one from the wire, and ``configuration_body.py``
splices the packed body from one epoch to the next. Here: the value, :func:`make_configuration`
(which packs and digests it), :func:`ring_order` (the all-reduce ring), :func:`quorum` and
:func:`compute_shares`.

Performance: configurations of 1024 members are rebuilt on every commit, so members are stored
column-wise (sorted PeerIDs, incarnations, throughputs, since steps), lookups bisect the sorted raw ids,
and :attr:`Configuration.members` (one :class:`MemberEntry` per member) is built lazily. The
packed body (digest and wire form) is kept in pieces (:func:`pack_columns`), and C_{e+1}'s are
spliced from C_e's (``configuration_body.py``).
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from chaosp2p.protocols.negotiation.configuration_body import MemberEdits, digest_of, pack_ids, splice_column
from chaosp2p.protocols.negotiation.operations import check_uint, reject
from chaosp2p.wire.framing import pack
from chaosp2p.wire.identity import PeerID

_CONFIG_DOMAIN = "chaosp2p/negotiation/config/1"
MODES = ("sync", "diloco")
"""The training modes a run may use (:attr:`RunParams.mode`)."""
MAX_OP_AGE_EPOCHS = 256
"""An operation raised at epoch E applies only to configurations of epoch <= E + this (a protocol
constant, not a setting: every member must judge an operation the same way). Departed members are
remembered as long, so a replayed JOIN cannot re-admit a peer that left or failed."""
EVIDENCE_MAX_AGE_EPOCHS = 16
"""A FAIL or EVICT raised at epoch E counts only against configurations of epoch <= E + this: they
are evidence about a member's present state, and signers' observations many changes apart must not
add up to a removal (issue 20, finding 10). A protocol constant, like MAX_OP_AGE_EPOCHS."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunParams:
    """Parameters of a run that do not change with membership."""

    global_batch: int
    """Samples per step over all members (each member gets >= 1)."""
    mode: str = "sync"
    """``"sync"`` (average every step) or ``"diloco"`` (average every ``local_steps``)."""
    local_steps: int = 1
    admitted: tuple[PeerID, ...] = ()
    """Who may join and see the run (sorted by PeerID bytes, distinct): empty = an open run, which
    anyone may join; otherwise a *closed* run, whose members answer RUN_INFO, catch-up and snapshot
    requests only to these peers and refuse every other JOIN (``protocols/negotiation.md`` section
    6, "Closed runs"). Fixed by the founder in C_0 and carried unchanged."""

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
        raws = [p.raw for p in self.admitted]
        if any(a >= b for a, b in itertools.pairwise(raws)):
            raise reject("admitted peers must be sorted and distinct")

    def admits(self, peer: PeerID) -> bool:
        """May ``peer`` join the run (and see its configuration)? Always, in an open run."""
        listed = self.admitted
        if not listed:
            return True
        i = bisect.bisect_left(listed, peer.raw, key=_raw_of)
        return i < len(listed) and listed[i].raw == peer.raw

    def row(self) -> list[Any]:
        """The configuration body's params item: ``[global_batch, mode, local_steps]``, with the
        admitted peers' bytes appended only for a closed run (an open run's encoding, and so its
        digest, is what it was before closed runs existed)."""
        row: list[Any] = [self.global_batch, self.mode, self.local_steps]
        if self.admitted:
            row.append([p.raw for p in self.admitted])
        return row


def _raw_of(peer: PeerID) -> bytes:
    return peer.raw


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
        """How many members make a quorum (:func:`quorum`)."""
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
            self.params.row(),
            self.seed,
            departed_rows(self),
        ]

    def packed_columns(self) -> tuple[bytes, ...]:
        """The body's packed items in ``configuration_body.PIECES`` pieces (packed once; the
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
    """How many of ``config``'s members make a quorum (``protocols/negotiation.md`` section 9).

    With one dishonest member, two quorums must share at least two members (so that one honest
    member is in both): 2q - n >= 2. For an even n that is the plain majority n // 2 + 1; for an
    odd n >= 5 it is one more, n // 2 + 2 (one crash fewer tolerated). At n <= 3 no q keeps both a
    crash and a liar out (n >= 3f + 1), and crash tolerance is kept: the majority (the documented
    limit: one dishonest member of a run of three can split an epoch).
    """
    return quorum_of(len(config.peers))


def quorum_of(n: int) -> int:
    """:func:`quorum` of a configuration of ``n`` members."""
    if n <= 3 or n % 2 == 0:
        return n // 2 + 1
    return n // 2 + 2


def liar_tolerant(n: int) -> bool:
    """Do two quorums of ``n`` members always share an honest member when one member lies?"""
    return 2 * quorum_of(n) - n >= 2


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
    lets ``next_configuration`` splice the packed body from C_e's (``configuration_body``)."""
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


# ---------------------------------------------------------------------------------- packed body
def link_rows(config: Configuration) -> list[list[Any]]:
    """The body's links item: one [a, b, up, bandwidth, rtt] row per link."""
    return [[lk.a.raw, lk.b.raw, lk.up, float(lk.bandwidth_bytes_per_s), float(lk.rtt_s)] for lk in config.links]


def departed_rows(config: Configuration) -> list[list[Any]]:
    """The body's departed item: one [peer, incarnation, epoch, activation step] row per entry."""
    return [[d.peer_id.raw, d.incarnation, d.epoch, d.activation_step] for d in config.departed]


def pack_columns(config: Configuration, spliced_from: tuple[Configuration, MemberEdits] | None) -> tuple[bytes, ...]:
    """``config``'s body in ``configuration_body.PIECES`` packed pieces. With ``spliced_from`` =
    (C_e, edits) the member columns are spliced from C_e's pieces, and pieces that did not change
    are shared."""
    head = pack([config.run, config.epoch, config.activation_step])[1:]  # strip the fixarray header
    if spliced_from is not None and spliced_from[0].params is config.params:
        # The params never change, and a closed run's admission list can be long: reuse its bytes.
        prev_tail = spliced_from[0].packed_columns()[6]
        tail = prev_tail[: len(prev_tail) - len(pack(spliced_from[0].seed))] + pack(config.seed)
    else:
        tail = pack([config.params.row(), config.seed])[1:]
    if spliced_from is None:
        ids = pack_ids(config.ids())
        incs = pack(list(config.incarnations))
        thrs = pack(list(config.throughputs))
        since = pack(list(config.since_steps))
        prev = None
    else:
        prev, edits = spliced_from
        old = prev.packed_columns()
        n = len(prev.peers)
        ids = splice_column(old[1], n, edits[0], config.ids(), numeric=False)
        incs = splice_column(old[2], n, edits[1], config.incarnations, numeric=True)
        thrs = splice_column(old[3], n, edits[2], config.throughputs, numeric=True)
        since = splice_column(old[4], n, edits[3], config.since_steps, numeric=True)
    # Links and departed entries are shared objects when unchanged: their pieces are too.
    same_links = prev is not None and config.links is prev.links
    links = prev.packed_columns()[5] if prev is not None and same_links else pack(link_rows(config))
    same_departed = prev is not None and config.departed is prev.departed
    departed = prev.packed_columns()[7] if prev is not None and same_departed else pack(departed_rows(config))
    return (head, ids, incs, thrs, since, links, tail, departed)


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


__all__ = [
    "MAX_OP_AGE_EPOCHS",
    "MODES",
    "Configuration",
    "DepartedEntry",
    "LinkEntry",
    "MemberEntry",
    "RunParams",
    "batch_shares",
    "compute_shares",
    "departed_rows",
    "derive_seed",
    "genesis_configuration",
    "liar_tolerant",
    "link_rows",
    "make_configuration",
    "pack_columns",
    "quorum",
    "quorum_of",
    "ring_order",
]
