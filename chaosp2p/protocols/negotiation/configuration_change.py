"""How a run's configuration changes: which operations may apply to it, and C_{e+1} from C_e.

:func:`check_operation` is the deterministic validity rule every acceptor applies to an operation
against the configuration it would change (the same operation and configuration give the same
answer everywhere). :func:`next_configuration` computes C_{e+1} = f(C_e, committed operations,
activation step); every member evaluates it locally from the decided value and checks the digest.

A committed batch is applied in three stages. Evictions are settled first (an EVICT counts only
with a quorum of distinct signers, :func:`evictions`); incarnation precedence and the apply order
come from ``operations.apply_order``; then each surviving operation is applied to a :class:`_Draft`
of C_{e+1} by the function :data:`APPLY_BY_KIND` names for its kind. Each is checked again against
the draft as it evolves: an op about a member removed earlier in the same batch, a second FAIL of
one subject, a link to a removed member do nothing. The draft records every edit of the member
columns, so C_{e+1}'s packed body is spliced from C_e's (``configuration_body.py``) rather than
packed afresh: at 1024 members that is most of what a commit costs.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from chaosp2p.protocols.negotiation.configuration_body import DELETE, INSERT, SET, MemberEdits
from chaosp2p.protocols.negotiation.operations import FAIL_KINDS, MEMBER_KINDS, Operation, OpKind, apply_order
from chaosp2p.protocols.negotiation.run_configuration import (
    EVIDENCE_MAX_AGE_EPOCHS,
    MAX_OP_AGE_EPOCHS,
    Configuration,
    DepartedEntry,
    LinkEntry,
    derive_seed,
    make_configuration,
    quorum,
)
from chaosp2p.wire.identity import PeerID


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
    if kind in (OpKind.FAIL, OpKind.EVICT, OpKind.STALL) and op.epoch + EVIDENCE_MAX_AGE_EPOCHS < config.epoch:
        return "too_old"
    if kind is OpKind.STALL:
        # Like a FAIL, but only of a present member: it says "it contributed nothing to my round".
        if op.origin == op.subject or not config.has_member(op.origin):
            return "forged_origin"
        held = config.incarnation_of(op.subject)
        if held is None:
            return "subject_not_member"
        return "stale_incarnation" if op.incarnation < held else None
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
        if not config.params.admits(op.subject):
            # A closed run: every member judges this alike, so no member alone admits an outsider.
            return "not_admitted"
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
    return _signers(config, ops, OpKind.EVICT)


def _signers(config: Configuration, ops: Iterable[tuple[bytes, Operation]], kind: OpKind) -> dict[bytes, set[bytes]]:
    signers: dict[bytes, set[bytes]] = {}
    for _, op in ops:
        if op.kind is kind and check_operation(op, config) is None:
            signers.setdefault(op.subject.raw, set()).add(op.origin.raw)
    return signers


FAIL_SIGNERS = 2
"""Distinct members (other than the subject) whose FAILs of one subject a change needs before it
removes the subject: no single member's word removes anyone (issue 20, finding 3). A protocol
constant: every member must judge a value the same way. Spec section 3b argues the choice."""


def fail_signers_needed(config: Configuration, subject: PeerID) -> int:
    """How many distinct signers a FAIL of ``subject`` needs against ``config``: FAIL_SIGNERS, or
    every other member when fewer remain (a run of two: the one other member)."""
    others = len(config.peers) - (1 if config.has_member(subject) else 0)
    return max(1, min(FAIL_SIGNERS, others))


def failures(config: Configuration, ops: Iterable[tuple[bytes, Operation]]) -> frozenset[bytes]:
    """The subjects (raw ids) that ``ops`` fail: those with FAILs valid against ``config`` from at
    least :func:`fail_signers_needed` distinct members."""
    subjects: dict[bytes, PeerID] = {}
    signers: dict[bytes, set[bytes]] = {}
    for _, op in ops:
        if op.kind in FAIL_KINDS and check_operation(op, config) is None:
            subjects[op.subject.raw] = op.subject
            signers.setdefault(op.subject.raw, set()).add(op.origin.raw)
    return frozenset(raw for raw, who in signers.items() if len(who) >= fail_signers_needed(config, subjects[raw]))


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


def _settle_failures(
    prev: Configuration, ops: list[tuple[bytes, Operation]]
) -> tuple[list[tuple[bytes, Operation]], list[tuple[bytes, Operation]]]:
    """(ops left to apply, ops dropped): FAILs of a subject without enough distinct signers do
    nothing (one member's word removes nobody)."""
    failed = failures(prev, ops)
    keep: list[tuple[bytes, Operation]] = []
    dropped: list[tuple[bytes, Operation]] = []
    for ident, op in ops:
        (dropped if op.kind in FAIL_KINDS and op.subject.raw not in failed else keep).append((ident, op))
    return keep, dropped


class _Draft:
    """C_{e+1} under construction: C_e's member columns as lists (``raws`` stays sorted, the other
    columns follow it), the links and departed entries, and what changed so far.

    A plain slotted class rather than a dataclass: one is made per commit, and a keyword
    ``__init__`` of a dozen fields costs a microsecond that a small run's commit notices.
    """

    __slots__ = (
        "activation_step",
        "departed",
        "departed_changed",
        "edits",
        "incs",
        "links",
        "members_changed",
        "peers",
        "prev",
        "raws",
        "removed",
        "since",
        "thrs",
    )

    def __init__(self, prev: Configuration, activation_step: int) -> None:
        self.prev = prev
        self.activation_step = activation_step
        self.raws: list[bytes] = list(prev.ids())
        self.peers: list[PeerID] = list(prev.peers)
        self.incs: list[int] = list(prev.incarnations)
        self.thrs: list[float] = list(prev.throughputs)
        self.since: list[int] = list(prev.since_steps)
        departed = {d.peer_id.raw: d for d in prev.departed if d.epoch + MAX_OP_AGE_EPOCHS >= prev.epoch + 1}
        departed_changed = len(departed) != len(prev.departed)
        for raw, d in list(departed.items()):
            if d.activation_step > activation_step:
                # This configuration governs the steps from activation_step on and does not count
                # on the departed member: its participation now ends earlier (a lame duck learns this).
                departed[raw] = DepartedEntry(
                    peer_id=d.peer_id, incarnation=d.incarnation, epoch=d.epoch, activation_step=activation_step
                )
                departed_changed = True
        self.departed: dict[bytes, DepartedEntry] = departed
        self.departed_changed = departed_changed
        self.edits: MemberEdits = ([], [], [], [])
        """What changed in the member columns, in order: C_{e+1}'s packed columns are spliced from C_e's."""
        self.links: dict[bytes, LinkEntry] | None = None
        """A copy of C_e's links, made by the first link change or removal."""
        self.removed: set[bytes] = set()
        self.members_changed = False

    def link_table(self) -> dict[bytes, LinkEntry]:
        """The draft's links by (a, b) raw ids, copied from C_e on first change."""
        links = self.links
        if links is None:
            links = self.links = dict(self.prev._link_table())
        return links


ApplyOp = Callable[[_Draft, Operation, int, bool], bool]
"""Applies one operation to the draft, given where its subject's raw id is (or would be inserted)
in ``draft.raws`` and whether it is there; returns whether it changed anything."""


def _remove(draft: _Draft, op: Operation, i: int, present: bool) -> bool:
    """FAIL, STALL, LEAVE, EVICT: the subject leaves, unless it already rejoined at a higher incarnation.
    (An EVICT got here only with a quorum of signers, at exactly the subject's incarnation.)"""
    if not present or op.incarnation < draft.incs[i]:
        return False
    raw = draft.raws[i]
    draft.departed[raw] = DepartedEntry(
        peer_id=draft.peers[i],
        incarnation=draft.incs[i],
        epoch=draft.prev.epoch + 1,
        activation_step=draft.activation_step,
    )
    del draft.raws[i], draft.peers[i], draft.incs[i], draft.thrs[i], draft.since[i]
    for column in draft.edits:
        column.append((DELETE, i, None))
    draft.removed.add(raw)
    draft.members_changed = draft.departed_changed = True
    return True


def _join(draft: _Draft, op: Operation, i: int, present: bool) -> bool:
    """JOIN: a newcomer is inserted in PeerID order; a member rejoining at a higher incarnation
    (it restarted) keeps its place with the new incarnation, throughput and admission step."""
    step = draft.activation_step
    if present:
        if draft.incs[i] >= op.incarnation:
            return False
        draft.incs[i] = op.incarnation
        draft.thrs[i] = op.throughput_samples_per_s
        draft.since[i] = step
        _, e_incs, e_thrs, e_since = draft.edits
        e_incs.append((SET, i, op.incarnation))
        e_thrs.append((SET, i, op.throughput_samples_per_s))
        e_since.append((SET, i, step))
        draft.members_changed = True
        return True
    raw = op.subject.raw
    draft.raws.insert(i, raw)
    draft.peers.insert(i, op.subject)
    draft.incs.insert(i, op.incarnation)
    draft.thrs.insert(i, op.throughput_samples_per_s)
    draft.since.insert(i, step)
    e_ids, e_incs, e_thrs, e_since = draft.edits
    e_ids.append((INSERT, i, raw))
    e_incs.append((INSERT, i, op.incarnation))
    e_thrs.append((INSERT, i, op.throughput_samples_per_s))
    e_since.append((INSERT, i, step))
    draft.removed.discard(raw)
    if draft.departed.pop(raw, None) is not None:
        draft.departed_changed = True
    draft.members_changed = True
    return True


def _throughput(draft: _Draft, op: Operation, i: int, present: bool) -> bool:
    """THROUGHPUT: the member's measured rate, if it is still at the incarnation that measured it."""
    if not present or draft.incs[i] != op.incarnation:
        return False
    draft.thrs[i] = op.throughput_samples_per_s
    draft.edits[2].append((SET, i, op.throughput_samples_per_s))
    draft.members_changed = True
    return True


def _set_link(draft: _Draft, op: Operation, present: bool, up: bool) -> bool:
    """LINK_UP / LINK_DOWN between the subject and ``op.other``, if both are still members."""
    other = op.other
    assert other is not None
    raws = draft.raws
    j = bisect.bisect_left(raws, other.raw)
    if not (present and j < len(raws) and raws[j] == other.raw):
        return False
    links = draft.link_table()
    key = op.subject.raw + other.raw
    old = links.get(key)
    if up or old is None:
        bandwidth, rtt = op.bandwidth_bytes_per_s, op.rtt_s
    else:  # a link that goes down keeps its last figures
        bandwidth, rtt = old.bandwidth_bytes_per_s, old.rtt_s
    links[key] = LinkEntry(a=op.subject, b=other, up=up, bandwidth_bytes_per_s=bandwidth, rtt_s=rtt)
    return True


def _link_up(draft: _Draft, op: Operation, i: int, present: bool) -> bool:
    """LINK_UP: the link is usable, with the figures the operation measured."""
    return _set_link(draft, op, present, True)


def _link_down(draft: _Draft, op: Operation, i: int, present: bool) -> bool:
    """LINK_DOWN: the link is unusable (its last figures are kept)."""
    return _set_link(draft, op, present, False)


APPLY_BY_KIND: dict[OpKind, ApplyOp] = {
    OpKind.JOIN: _join,
    OpKind.LEAVE: _remove,
    OpKind.FAIL: _remove,
    OpKind.LINK_UP: _link_up,
    OpKind.LINK_DOWN: _link_down,
    OpKind.THROUGHPUT: _throughput,
    OpKind.EVICT: _remove,
    OpKind.STALL: _remove,
}
"""What each operation kind does to the draft of C_{e+1} (every kind has an entry)."""


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
    if any(op.kind in FAIL_KINDS for _, op in ops):
        ops, short = _settle_failures(prev, ops)
        unsettled.extend(short)
    ordered, dropped = apply_order(ops)
    draft = _Draft(prev, activation_step)
    raws = draft.raws
    results: list[AppliedOp] = [AppliedOp(op_id=i, op=op, applied=False) for i, op in unsettled]
    results.extend(AppliedOp(op_id=i, op=op, applied=False) for i, op in _dropped(ops, dropped))
    for ident, op in ordered:
        raw = op.subject.raw
        i = bisect.bisect_left(raws, raw)
        present = i < len(raws) and raws[i] == raw
        results.append(AppliedOp(op_id=ident, op=op, applied=APPLY_BY_KIND[op.kind](draft, op, i, present)))
    links = draft.links
    removed = draft.removed
    if removed:
        if links is None:
            links = dict(prev._link_table())
        links = {k: lk for k, lk in links.items() if lk.a.raw not in removed and lk.b.raw not in removed}
    link_tuple = prev.links if links is None else tuple(links[k] for k in sorted(links))
    epoch = prev.epoch + 1
    departed = draft.departed
    config = make_configuration(
        run=prev.run,
        epoch=epoch,
        activation_step=activation_step,
        seed=derive_seed(prev.seed, epoch, prev.digest),
        params=prev.params,
        ids=raws,
        peers=draft.peers,
        incarnations=draft.incs,
        throughputs=draft.thrs,
        since_steps=draft.since,
        shares=None if draft.members_changed else prev._shares,
        links=link_tuple,
        departed=tuple(departed[k] for k in sorted(departed)) if draft.departed_changed else prev.departed,
        spliced_from=(prev, draft.edits),
    )
    return config, tuple(results)


def _dropped(ops: Iterable[tuple[bytes, Operation]], dropped: set[bytes]) -> list[tuple[bytes, Operation]]:
    if not dropped:
        return []
    return [(i, op) for i, op in ops if i in dropped]


__all__ = [
    "APPLY_BY_KIND",
    "FAIL_SIGNERS",
    "AppliedOp",
    "ApplyOp",
    "capped_evictions",
    "check_operation",
    "eviction_cap",
    "eviction_signers",
    "evictions",
    "fail_signers_needed",
    "failures",
    "next_configuration",
]
