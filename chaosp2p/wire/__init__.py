"""Wire layer: frames, messages, identities, addresses and protocol ids. Pure; no I/O."""

from chaosp2p.wire.framing import FrameDecoder, encode_frame
from chaosp2p.wire.identity import Identity, PeerID
from chaosp2p.wire.messages import Message, MessageCodec
from chaosp2p.wire.multiaddr import Multiaddr
from chaosp2p.wire.protocol_ids import ProtocolId, choose_version

__all__ = [
    "FrameDecoder",
    "Identity",
    "Message",
    "MessageCodec",
    "Multiaddr",
    "PeerID",
    "ProtocolId",
    "choose_version",
    "encode_frame",
]
