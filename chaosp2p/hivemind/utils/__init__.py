"""``hivemind.utils``: the helpers hivemind scripts import (see :mod:`chaosp2p.hivemind` for the rest)."""

from __future__ import annotations

from chaosp2p.hivemind.utils.logging import get_logger, use_hivemind_log_handler
from chaosp2p.hivemind.utils.multiaddr import Multiaddr
from chaosp2p.hivemind.utils.serializer import MSGPackSerializer
from chaosp2p.hivemind.utils.timed_storage import (
    MAX_DHT_TIME_DISCREPANCY_SECONDS,
    DHTExpiration,
    ValueWithExpiration,
    get_dht_time,
)

__all__ = [
    "MAX_DHT_TIME_DISCREPANCY_SECONDS",
    "DHTExpiration",
    "MSGPackSerializer",
    "Multiaddr",
    "ValueWithExpiration",
    "get_dht_time",
    "get_logger",
    "use_hivemind_log_handler",
]
