"""Request/response over streams: one request frame out, one response envelope back.

Theory of operation
-------------------
A request opens a new stream, sends one msgpack frame with FIN, and reads one frame back
(``protocols/wire.md`` §6.1). The answer is an envelope, ``[ReplyStatus.OK, result]`` or
``[ReplyStatus.ERROR, error text]``, built by the serving host
(:meth:`~chaosp2p.transport.host.Host.set_request_handler`); anything else is the remote's protocol
error. A request that times out or is cancelled resets its stream, which cancels the handler on
the remote side too, so an abandoned request leaves no work running there.
"""

from __future__ import annotations

import enum
from typing import Any

import anyio

from chaosp2p.errors import RemoteProtocolError, RequestTimeout
from chaosp2p.transport.connection.flow import StreamFlow


class ReplyStatus(enum.IntEnum):
    """The first element of a response envelope. ONLY APPEND TO THIS LIST: the numbers are on the wire."""

    OK = 0
    ERROR = 1


class RequestClient(StreamFlow):
    """The requesting side of request/response."""

    async def request(self, protocol_name: str, request: Any, *, timeout_s: float | None = None) -> Any:
        """Send one msgpack request on a new stream and return the decoded response.

        The response envelope is ``[0, result]`` or ``[1, error text]``; an error response raises
        :class:`RemoteProtocolError`. On timeout or cancellation the stream is reset, which cancels
        the handler on the remote side too.
        """
        timeout = self.config.request_timeout_s if timeout_s is None else timeout_s
        stream = self.open_stream(protocol_name)
        try:
            with anyio.fail_after(timeout):
                await stream.send_frame(request, eof=True)
                answer = await stream.receive_frame()
        except TimeoutError:
            stream.reset()
            raise RequestTimeout(
                f"{protocol_name} request to {self.remote_peer.short()} got no answer within {timeout:g} s"
            ) from None
        except BaseException:
            stream.reset()
            raise
        self._forget_stream(stream)
        if answer is None:
            raise RemoteProtocolError(f"{protocol_name}: the remote closed the stream without answering")
        if not (isinstance(answer, list) and len(answer) == 2 and answer[0] in _STATUSES):
            raise RemoteProtocolError(f"{protocol_name}: malformed response envelope")
        if answer[0] == ReplyStatus.ERROR:
            raise RemoteProtocolError(f"{protocol_name} request failed on {self.remote_peer.short()}: {answer[1]}")
        return answer[1]


_STATUSES = tuple(ReplyStatus)  # compared by ==: a peer may put any msgpack object there
