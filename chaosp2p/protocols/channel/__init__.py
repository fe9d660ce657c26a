"""The secure channel every connection speaks, as sans-I/O pieces (spec: ``protocols/wire.md``).

In the order a connection meets them: :mod:`.handshake` (Noise XXpsk0: mutual authentication bound
to Ed25519 PeerIDs, gated by the swarm key; :mod:`.replay` refuses a copied first message),
:mod:`.record_layer` (the AEAD records every later byte travels in), :mod:`.hello` (the first
record each side sends: agent, protocols, addresses) and :mod:`.mux` (streams and flow control over
the records). None of them touches a socket or a clock; :mod:`chaosp2p.transport.connection`
drives them.
"""
