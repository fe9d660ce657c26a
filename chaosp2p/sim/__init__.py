"""In-memory network with a virtual clock for simulating hundreds of peers in seconds."""

from chaosp2p.sim.network import Delivery, LinkProfile, SimNetwork

__all__ = ["Delivery", "LinkProfile", "SimNetwork"]
