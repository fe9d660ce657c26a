"""The Kademlia routing table: 256 k-buckets with liveness-based eviction.

Theory of operation: bucket ``i`` holds up to ``k`` peers whose XOR distance from us has its
highest set bit at position ``i``, ordered least- to most-recently seen. Only peers that talked to
us directly (a request they sent, or an answer to ours) are ever offered to :meth:`seen`; contacts
merely *named* by other peers never enter the table, so a peer handing out garbage cannot push good
entries out.

When a bucket is full, the newcomer does not replace anyone outright. The table starts an eviction
check instead: :meth:`seen` returns the bucket's least-recently-seen peer, the machine pings it, and

* if it answers (any message from it calls :meth:`seen`), it moves to the tail and stays, and the
  newcomer goes to the bucket's replacement cache;
* if it fails (:meth:`check_failed`, or :meth:`remove` because the driver reported it unreachable),
  it is dropped and the newcomer takes its place.

Long-lived peers are the likeliest to stay up (the Kademlia paper's observation), so the table
prefers them. While one check runs in a bucket, further newcomers wait in its replacement cache
(the ``k`` most recent), from which removed entries are refilled.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from chaosp2p.dht.keys import bucket_index, node_id
from chaosp2p.dht.messages import Contact
from chaosp2p.wire.identity import PeerID


@dataclass(slots=True)
class Entry:
    """One routing-table entry."""

    contact: Contact
    node_id: int
    last_seen: float
    failures: int = 0

    @property
    def peer_id(self) -> PeerID:
        """The entry's peer."""
        return self.contact.peer_id


@dataclass(slots=True)
class _Bucket:
    entries: OrderedDict[PeerID, Entry] = field(default_factory=OrderedDict)
    replacements: OrderedDict[PeerID, Entry] = field(default_factory=OrderedDict)
    pending_lrs: PeerID | None = None
    pending_candidate: Entry | None = None


class RoutingTable:
    """k-buckets around our own id. Pure data structure; the machine does the pinging."""

    def __init__(self, own: PeerID, *, k: int) -> None:
        self.own = own
        self.own_id = node_id(own)
        self.k = k
        self._buckets: dict[int, _Bucket] = {}
        self._all: dict[PeerID, Entry] = {}
        self.evictions = 0
        """Entries dropped because their eviction check failed."""

    # ------------------------------------------------------------------ queries
    def __len__(self) -> int:
        return len(self._all)

    def __contains__(self, peer: object) -> bool:
        return peer in self._all

    def __iter__(self) -> Iterator[Entry]:
        return iter(list(self._all.values()))

    def get(self, peer: PeerID) -> Entry | None:
        """The entry for ``peer``, if present."""
        return self._all.get(peer)

    def bucket(self, index: int) -> list[Entry]:
        """Entries of bucket ``index``, least-recently seen first."""
        bucket = self._buckets.get(index)
        return list(bucket.entries.values()) if bucket else []

    def replacements(self, index: int) -> list[Entry]:
        """The replacement cache of bucket ``index``, oldest first."""
        bucket = self._buckets.get(index)
        return list(bucket.replacements.values()) if bucket else []

    def pending_check(self, index: int) -> tuple[PeerID, PeerID] | None:
        """``(least-recently-seen peer being pinged, newcomer waiting)`` for a bucket, if any."""
        bucket = self._buckets.get(index)
        if bucket is None or bucket.pending_lrs is None or bucket.pending_candidate is None:
            return None
        return bucket.pending_lrs, bucket.pending_candidate.peer_id

    def bucket_indexes(self) -> list[int]:
        """Indexes of non-empty buckets, ascending."""
        return sorted(i for i, b in self._buckets.items() if b.entries)

    def closest(self, target: int, count: int, *, exclude: PeerID | None = None) -> list[Entry]:
        """Up to ``count`` entries closest to ``target`` by XOR distance, closest first.

        Walks the buckets in distance order instead of sorting the whole table. With ``x = target
        ^ own`` and ``i`` its highest bit: entries of bucket ``i`` are closer than ``2**i``; entries
        of every bucket below ``i`` lie in ``[2**i, 2**(i+1))``; bucket ``j > i`` lies in
        ``[2**j, 2**(j+1))``. So: bucket ``i``, then all lower buckets together, then upward.
        """
        split = (target ^ self.own_id).bit_length() - 1
        out: list[Entry] = []
        buckets = self._buckets

        def take(entries: list[Entry]) -> bool:
            entries.sort(key=lambda e: e.node_id ^ target)
            for entry in entries:
                if exclude is None or entry.contact.peer_id != exclude:
                    out.append(entry)
                    if len(out) >= count:
                        return True
            return False

        if split >= 0:
            home = buckets.get(split)
            if home is not None and home.entries and take(list(home.entries.values())):
                return out
            lower = [e for j, b in buckets.items() if j < split for e in b.entries.values()]
            if lower and take(lower):
                return out
        for j in range(split + 1, 256):
            bucket = buckets.get(j)
            if bucket is not None and bucket.entries and take(list(bucket.entries.values())):
                break
        return out

    # ------------------------------------------------------------------ updates
    def seen(
        self, now: float, peer: PeerID, addrs: tuple[str, ...], relay_addrs: tuple[str, ...] | None = None
    ) -> PeerID | None:
        """``peer`` just talked to us directly from ``addrs``; it is relayed at ``relay_addrs``
        (``None``: not said, an entry keeps the ones it has).

        Returns the peer to ping when this starts an eviction check (the bucket is full), else None.
        """
        if peer == self.own:
            return None
        entry = self._all.get(peer)
        if entry is not None:
            home = self._buckets[bucket_index(self.own_id, entry.node_id)]
            entry.last_seen = now
            entry.failures = 0
            relayed = entry.contact.relay_addrs if relay_addrs is None else relay_addrs
            if addrs and (addrs != entry.contact.addrs or relayed != entry.contact.relay_addrs):
                entry.contact = Contact(peer_id=peer, addrs=addrs, relay_addrs=relayed)
            home.entries.move_to_end(peer)
            if home.pending_lrs == peer:
                self._check_passed(home)
            return None
        if not addrs:
            return None  # a peer we cannot dial back is useless to others
        nid = node_id(peer)
        index = bucket_index(self.own_id, nid)
        bucket = self._buckets.get(index)
        if bucket is None:
            bucket = self._buckets[index] = _Bucket()
        new = Entry(contact=Contact(peer_id=peer, addrs=addrs, relay_addrs=relay_addrs or ()), node_id=nid,
                    last_seen=now)
        if len(bucket.entries) < self.k:
            self._insert(bucket, new)
            return None
        if bucket.pending_lrs is not None:
            self._remember_replacement(bucket, new)
            return None
        lrs = next(iter(bucket.entries))
        bucket.pending_lrs = lrs
        bucket.pending_candidate = new
        return lrs

    def check_failed(self, lrs: PeerID) -> bool:
        """The eviction-check ping to ``lrs`` failed: drop it, admit the waiting newcomer."""
        entry = self._all.get(lrs)
        if entry is None:
            return False
        bucket = self._buckets[bucket_index(self.own_id, entry.node_id)]
        if bucket.pending_lrs != lrs:
            return False
        self.evictions += 1
        self.remove(lrs)
        return True

    def record_failure(self, peer: PeerID, *, limit: int) -> bool:
        """A request to ``peer`` timed out; drop it after ``limit`` consecutive failures."""
        entry = self._all.get(peer)
        if entry is None:
            self._drop_replacement(peer)
            return False
        entry.failures += 1
        if entry.failures >= limit:
            self.remove(peer)
            return True
        return False

    def remove(self, peer: PeerID) -> bool:
        """Drop ``peer`` (unreachable, failed); refill from the pending newcomer or the cache."""
        entry = self._all.pop(peer, None)
        if entry is None:
            self._drop_replacement(peer)
            return False
        bucket = self._buckets[bucket_index(self.own_id, entry.node_id)]
        del bucket.entries[peer]
        if bucket.pending_lrs == peer:
            candidate = bucket.pending_candidate
            bucket.pending_lrs = bucket.pending_candidate = None
            if candidate is not None:
                self._insert(bucket, candidate)
        if len(bucket.entries) < self.k and bucket.replacements:
            replacement = max(bucket.replacements.values(), key=lambda e: e.last_seen)
            self._insert(bucket, replacement)  # also takes it out of the cache
        return True

    # ------------------------------------------------------------------ internals
    def _insert(self, bucket: _Bucket, entry: Entry) -> None:
        bucket.replacements.pop(entry.peer_id, None)
        bucket.entries[entry.peer_id] = entry
        self._all[entry.peer_id] = entry

    def _check_passed(self, bucket: _Bucket) -> None:
        candidate = bucket.pending_candidate
        bucket.pending_lrs = bucket.pending_candidate = None
        if candidate is not None:
            self._remember_replacement(bucket, candidate)

    def _remember_replacement(self, bucket: _Bucket, entry: Entry) -> None:
        bucket.replacements.pop(entry.peer_id, None)
        bucket.replacements[entry.peer_id] = entry
        while len(bucket.replacements) > self.k:
            bucket.replacements.popitem(last=False)

    def _drop_replacement(self, peer: PeerID) -> None:
        index = bucket_index(self.own_id, node_id(peer))
        bucket = self._buckets.get(index)
        if bucket is None:
            return
        bucket.replacements.pop(peer, None)
        if bucket.pending_candidate is not None and bucket.pending_candidate.peer_id == peer:
            bucket.pending_candidate = None
            bucket.pending_lrs = None

