"""Kademlia DHT: routing table, iterative lookups, signed records and provider records. Pure; no I/O.

The whole DHT is one sans-I/O machine, :class:`DHTMachine` (a core plus role modules, see
:mod:`chaosp2p.dht.machine`), run by :mod:`chaosp2p.sim` in tests (a swarm of them:
:mod:`chaosp2p.sim.dht`) and by the runtime over real connections; :func:`lookup` is the same lookup
over an injected async rpc. The wire format is specified in ``protocols/dht.md``.
"""

from chaosp2p.dht.config import DHTConfig
from chaosp2p.dht.events import (
    AddProviderResult,
    BootstrapDialRequested,
    BootstrapResult,
    BootstrapRetrying,
    DHTEvent,
    DHTOperationDone,
    DHTStatistics,
    FindPeerResult,
    GetProvidersResult,
    GetResult,
    LookupStats,
    OperationResult,
    StoreResult,
)
from chaosp2p.dht.keys import key_id, node_id, signed_key, state_provider_key
from chaosp2p.dht.lookup import LookupResult, LookupState, lookup
from chaosp2p.dht.machine import DHTMachine
from chaosp2p.dht.messages import DHT_CODEC, PROTOCOL, PROTOCOL_ID, Contact, ProviderRecord, Record, StoreStatus
from chaosp2p.dht.operation import BootstrapState
from chaosp2p.dht.records import make_provider_record, make_record
from chaosp2p.dht.routing import RoutingTable

__all__ = [
    "DHT_CODEC",
    "PROTOCOL",
    "PROTOCOL_ID",
    "AddProviderResult",
    "BootstrapDialRequested",
    "BootstrapResult",
    "BootstrapRetrying",
    "BootstrapState",
    "Contact",
    "DHTConfig",
    "DHTEvent",
    "DHTMachine",
    "DHTOperationDone",
    "DHTStatistics",
    "FindPeerResult",
    "GetProvidersResult",
    "GetResult",
    "LookupResult",
    "LookupState",
    "LookupStats",
    "OperationResult",
    "ProviderRecord",
    "Record",
    "RoutingTable",
    "StoreResult",
    "StoreStatus",
    "key_id",
    "lookup",
    "make_provider_record",
    "make_record",
    "node_id",
    "signed_key",
    "state_provider_key",
]
