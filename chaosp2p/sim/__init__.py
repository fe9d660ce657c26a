"""In-memory network with a virtual clock for simulating hundreds of peers in seconds.

The simulators of the real protocol machines live beside it: :mod:`~chaosp2p.sim.membership`
(SWIM swarms), :mod:`~chaosp2p.sim.negotiation` (training runs' negotiation) and
:mod:`~chaosp2p.sim.dht` (Kademlia clusters under churn).
"""

from chaosp2p.sim.network import Delivery, LinkProfile, SimNetwork

__all__ = ["Delivery", "LinkProfile", "SimNetwork"]
