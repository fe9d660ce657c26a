"""Which snapshot a newcomer pulls when its sources disagree.

Theory of operation
-------------------
Every source answers the version query with the snapshots of the run it holds. A snapshot is
identified by ``(step, digest)``, the digest being SHA-256 of its manifest body, so two sources
that name the same pair serve byte-identical state. A source is a peer like any other: nothing it
announces is believed on its word alone. The choice is therefore a vote:

1. Keep only versions this newcomer can use (known hash, sizes within its limits), and, if the
   caller pinned them, only the pinned step and the pinned digest.
2. If the caller named trusted sources, only versions a trusted source holds are eligible, ranked
   by how many trusted sources hold them.
3. Among eligible versions, the one held by the most sources wins; ties go to the newest step,
   then to the larger sum of known bandwidth, then to the larger digest (so every newcomer that
   sees the same answers picks the same version).
4. Every source holding the winner serves it. A source that offers something the winner
   contradicts -- the same step with another digest, or a newer step that lost the vote -- is
   reported as *conflicting* and never used: a lone source announcing a newer checkpoint cannot
   substitute the state that the other sources agree on.

What this does not defend against: a majority of colluding sources, or one lying source when it
is the only one that answers (pin ``digest`` or ``trusted`` then). Inside a training run the step
and digest should come from the run itself (a configuration vouched for by its members), not from
this vote.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from chaosp2p.protocols.transfer.messages import VersionInfo
from chaosp2p.wire.identity import PeerID


@dataclass(frozen=True, slots=True, kw_only=True)
class Conflict:
    """A source that offered a snapshot contradicting the chosen one."""

    peer: PeerID
    offered: VersionInfo
    supporters: int
    """How many sources (the conflicting one included) offered that snapshot."""


@dataclass(frozen=True, slots=True, kw_only=True)
class VersionChoice:
    """The outcome of the vote."""

    version: VersionInfo
    supporters: tuple[PeerID, ...]
    """Sources holding exactly ``version``, best link first."""
    conflicts: tuple[Conflict, ...]
    others: tuple[PeerID, ...]
    """Sources that answered but hold neither the winner nor anything contradicting it."""


def _key(info: VersionInfo) -> tuple[int, str, bytes, int, int]:
    return (info.step, info.hash_algorithm, info.digest, info.total_bytes, info.chunk_bytes)


def choose_version(
    offers: Mapping[PeerID, Iterable[VersionInfo]],
    *,
    step: int | None = None,
    digest: bytes | None = None,
    trusted: frozenset[PeerID] = frozenset(),
    rates: Mapping[PeerID, float] | None = None,
) -> VersionChoice | None:
    """Vote on ``offers`` (each source's usable versions); ``None`` if nothing is eligible."""
    rates = rates or {}
    holders: dict[tuple[int, str, bytes, int, int], list[PeerID]] = {}
    infos: dict[tuple[int, str, bytes, int, int], VersionInfo] = {}
    for peer, versions in offers.items():
        for info in versions:
            key = _key(info)
            if peer not in holders.setdefault(key, []):
                holders[key].append(peer)
                infos.setdefault(key, info)
    eligible = [
        key
        for key in holders
        if (step is None or key[0] == step)
        and (digest is None or key[2] == digest)
        and (not trusted or any(p in trusted for p in holders[key]))
    ]
    if not eligible:
        return None

    def rank(key: tuple[int, str, bytes, int, int]) -> tuple[int, int, int, float, bytes]:
        peers = holders[key]
        return (
            sum(1 for p in peers if p in trusted),
            len(peers),
            key[0],
            sum(rates.get(p, 0.0) for p in peers),
            key[2],
        )

    winner = max(eligible, key=rank)
    chosen = infos[winner]
    supporters = sorted(holders[winner], key=lambda p: -rates.get(p, 0.0))
    conflicts = []
    others = []
    for peer, versions in offers.items():
        if peer in holders[winner]:
            continue
        contradicting = [
            info for info in versions if info.step > chosen.step or (info.step == chosen.step and _key(info) != winner)
        ]
        if contradicting:
            worst = max(contradicting, key=lambda info: (len(holders[_key(info)]), info.step))
            conflicts.append(Conflict(peer=peer, offered=worst, supporters=len(holders[_key(worst)])))
        else:
            others.append(peer)
    return VersionChoice(version=chosen, supporters=tuple(supporters), conflicts=tuple(conflicts), others=tuple(others))


def describe_conflict(conflict: Conflict, chosen: VersionInfo, sources: int) -> str:
    """A one-line explanation for logs and the CLI."""
    offered = conflict.offered
    what = f"step {offered.step} (digest {offered.digest.hex()[:16]}…)"
    if conflict.supporters == 1:
        return f"offers {what}, which no other source confirms; using step {chosen.step} that the others agree on"
    return (
        f"offers {what}, held by {conflict.supporters} of {sources} sources; "
        f"using step {chosen.step} (digest {chosen.digest.hex()[:16]}…) that more sources agree on"
    )


def late_conflict(versions: Sequence[VersionInfo], chosen: VersionInfo) -> str | None:
    """Why a source that answered after the vote contradicts ``chosen`` (``None``: it does not)."""
    contradicting = [v for v in versions if v.step >= chosen.step and v != chosen]
    if not contradicting:
        return None
    offered = max(contradicting, key=lambda v: v.step)
    return f"offers step {offered.step} (digest {offered.digest.hex()[:16]}…), not the chosen snapshot"


def nothing_eligible(run: str, step: int | None, digest: bytes | None, trusted: frozenset[PeerID]) -> str:
    """The error when the vote has no candidate."""
    which = f"step {step}" if step is not None else "any step"
    if digest is not None:
        which += f" with digest {digest.hex()}"
    if trusted:
        which += " held by a trusted source"
    return f"no reachable source holds run {run!r} at {which}"
