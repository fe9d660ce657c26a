"""``hivemind.dht``: the DHT handle and the record validators.

``DHT`` is a handle on one chaosp2p peer (:mod:`chaosp2p.hivemind.dht.handle`); ``store``/``get``
keep hivemind's semantics (:mod:`chaosp2p.hivemind.dht.keyvalue`); ``crypto``, ``schema`` and
``validation`` are hivemind's validator modules. ``DHTNode`` (hivemind's in-process node) is not
provided: the handle runs the peer in this process already.
"""

from __future__ import annotations

from chaosp2p.hivemind.dht.handle import DHT
from chaosp2p.hivemind.dht.validation import CompositeValidator, DHTRecord, RecordValidatorBase
from chaosp2p.hivemind.utils.timed_storage import DHTExpiration, ValueWithExpiration

__all__ = ["DHT", "CompositeValidator", "DHTExpiration", "DHTRecord", "RecordValidatorBase", "ValueWithExpiration"]
