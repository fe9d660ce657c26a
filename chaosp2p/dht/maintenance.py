"""The DHT machine's background work: bucket refresh, republishing, and the expiry sweep.

Theory of operation
-------------------
Three periodic timers keep a long-running peer useful; each re-arms itself (refresh and republish
with +-10% jitter, so a swarm started at once does not refresh in lockstep) and then works.

* **Refresh** (REFRESH, every ``refresh_interval_s``): a self-lookup, which keeps our neighbours
  current, plus one lookup towards a random id in each bucket that is neither empty nor full and
  saw no lookup within the interval. Lookups meet peers; peers that answer enter the table.
* **Republish** (REPUBLISH, every half ``republish_interval_s``): first our own signed records and
  provider records nearing the end of their signed life are re-signed (only their publisher can
  move ``issued_at_ms + ttl_ms``, so as long as this peer runs it keeps them alive -- Kademlia's
  "original publisher republishes"); then every held record nobody re-stored within
  ``republish_interval_s`` is stored again on the k closest peers we now know, which is how records
  outlive the peers that first held them.
* **Sweep** (SWEEP, every ``expiry_sweep_interval_s``): lapsed records leave the store.
"""

from __future__ import annotations

from chaosp2p.dht.keys import key_id
from chaosp2p.dht.messages import ProviderRecord, Record
from chaosp2p.dht.operation import LookupKind, LookupQuery, Operation
from chaosp2p.dht.querying import Querying
from chaosp2p.dht.records import make_provider_record, make_record
from chaosp2p.dht.timers import DHTTimer


class Maintenance(Querying):
    """Refresh, republish and expiry, each on its timer."""

    def refresh(self, now: float) -> None:
        """Refresh the routing table now: a self-lookup plus a random lookup in every bucket that is
        neither empty nor full and saw no lookup within ``refresh_interval_s``."""
        self._start_refresh(now)

    # ================================================================== timers
    def _sweep_due(self, now: float) -> None:
        self._store.expire(now)
        self._timers.arm(DHTTimer.SWEEP, now + self.config.expiry_sweep_interval_s)

    def _refresh_due(self, now: float) -> None:
        self._timers.arm(DHTTimer.REFRESH, now + self.config.refresh_interval_s * self._jitter())
        self._start_refresh(now)

    def _republish_due(self, now: float) -> None:
        self._timers.arm(DHTTimer.REPUBLISH, now + self.config.republish_interval_s / 2 * self._jitter())
        self._republish(now)

    # ================================================================== refresh
    def _start_refresh(self, now: float) -> None:
        if not len(self.routing_table):
            return
        own = self.routing_table.own_id
        ops = [self._new_op(now, LookupKind.REFRESH, LookupQuery.FIND_NODE, own, report=False)]
        indexes = self.routing_table.bucket_indexes()
        horizon = now - self.config.refresh_interval_s
        for index in range(indexes[0], 256):
            # Empty buckets: the self-lookup already asked the peers nearest to them. Full buckets
            # have every contact they can use. Neither is worth a lookup of its own.
            touched = self._bucket_touched.get(index, -1e18) > horizon
            if touched or not 0 < len(self.routing_table.bucket(index)) < self.config.k:
                continue
            target = own ^ ((1 << index) | self._rng.getrandbits(index))
            ops.append(self._new_op(now, LookupKind.REFRESH, LookupQuery.FIND_NODE, target, report=False))
        for op in ops:
            self._pump(now, op)

    def _refresh_done(self, now: float, op: Operation) -> None:
        self._finish(now, op, None)

    # ================================================================== republish
    def _republish(self, now: float) -> None:
        self._reissue_own(now)
        records, providers = self._store.due_for_republish(now, self.config.republish_interval_s)
        for record in records:
            self._republish_one(now, record, now + record.remaining_ms / 1000.0)
        for provider in providers:
            self._republish_one(now, provider, now + provider.remaining_ms / 1000.0)

    def _reissue_own(self, now: float) -> None:
        """Re-sign our own signed records and provider records before they lapse (module docstring)."""
        wall = self._store.wall_ms(now)
        margin_ms = self.config.republish_interval_s * 1000
        for held in self._store.records():
            record = held.record
            left_ms = record.issued_at_ms + record.ttl_ms - wall
            if record.publisher != self.peer_id or held.expires_at <= now or left_ms > record.ttl_ms / 2 + margin_ms:
                continue
            fresh = make_record(record.key, record.value, version=record.version, ttl_ms=record.ttl_ms,
                                issued_at_ms=wall, identity=self.identity)
            self._store.put_record(now, fresh, self.peer_id, verified=True)
            self._republish_one(now, fresh, now + fresh.ttl_ms / 1000.0)
        self._reissue_own_providers(now, every=False)

    def _reissue_own_providers(self, now: float, *, every: bool) -> None:
        """Re-sign our provider records past half their life (``every``: all of them, as when our
        relay addresses changed) with our current addresses, and store them again."""
        wall = self._store.wall_ms(now)
        margin_ms = self.config.republish_interval_s * 1000
        for prov in self._store.providers():
            provider = prov.record
            left_ms = provider.issued_at_ms + provider.ttl_ms - wall
            if provider.provider != self.peer_id or prov.expires_at <= now:
                continue
            if not every and left_ms > provider.ttl_ms / 2 + margin_ms:
                continue
            fresh_provider = make_provider_record(self.identity, provider.key, self._listen_addrs or provider.addrs,
                                                  seq=provider.seq, ttl_ms=provider.ttl_ms, issued_at_ms=wall,
                                                  relay_addrs=self._relay_addrs)
            self._store.put_provider(now, fresh_provider, self.peer_id)
            self._republish_one(now, fresh_provider, now + fresh_provider.ttl_ms / 1000.0)

    def _republish_one(self, now: float, item: Record | ProviderRecord, expires_at: float) -> None:
        """Store ``item`` again on the k closest peers a fresh lookup finds (the PUT: ``storing.py``)."""
        kind = LookupKind.REPUBLISH if isinstance(item, Record) else LookupKind.REPUBLISH_PROVIDER
        op = self._new_op(now, kind, LookupQuery.FIND_NODE, key_id(item.key), key=item.key, report=False)
        if isinstance(item, Record):
            op.record = item
        else:
            op.provider = item
        op.expires_at = expires_at
        self._counts["republished"] += 1
        self._pump(now, op)
