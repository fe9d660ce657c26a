"""The public API: one peer per style, and training with others from each.

* async code: :func:`open_peer` yields an :class:`AsyncPeer`; ``await peer.collaborate(...)``
  returns an :class:`~chaosp2p.training.AsyncCollaboration`;
* plain scripts: :class:`Peer` runs an ``AsyncPeer`` on a background event loop, and
  :class:`Collaboration` trains on it with blocking calls.

Everything here is also importable from the package root (``chaosp2p.Peer``, ...).
"""

from __future__ import annotations

from chaosp2p.api.async_peer import AsyncPeer, open_peer
from chaosp2p.api.blocking_collaboration import Collaboration
from chaosp2p.api.blocking_peer import Peer

__all__ = ["AsyncPeer", "Collaboration", "Peer", "open_peer"]
