"""Sans-I/O protocol machines and pure protocol pieces, one package per protocol.

* :mod:`~chaosp2p.protocols.channel` -- the secure channel: handshake, record layer, hello, mux;
* :mod:`~chaosp2p.protocols.membership` -- SWIM membership, failure detection, the overlay's links;
* :mod:`~chaosp2p.protocols.negotiation` -- agreeing on a run's configurations (Paxos per epoch);
* :mod:`~chaosp2p.protocols.transfer` -- pulling a state snapshot from several sources at once;
* :mod:`~chaosp2p.protocols.averaging` -- the all-reduce's wire format, plan and arithmetic;
* :mod:`~chaosp2p.protocols.collab` -- a newcomer's catch-up and the vouches it trusts.

``base`` holds the message-machine interface the runtime drives; ``ratelimit`` the token buckets
every machine uses. Nothing here does I/O or reads a clock; the normative specs are the Markdown
files in the repository's ``protocols/`` folder.
"""
