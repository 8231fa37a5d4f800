"""Searches as messages on one open ``SearchStream`` call (the gateway's).

A unary gRPC call costs a chat more than a message on a call already open: after the
100 ms between two chats, a unary round trip with a trace context and a deadline took
2.3 ms on the reference machine and a message on an open stream 1.2 ms (the call's
set-up, its metadata, its status and the completion-queue events for each; see
docs/retrieval.md, "The search stream"). So an interactive client sends each search
as a message tagged with an id and its trace context, and a reader task hands each
reply to the search waiting for that id.

A search on the stream behaves as a unary Search does for its caller: the same reply,
a failure raised as :class:`grpc.aio.AioRpcError` with the status the service gave it,
DEADLINE_EXCEEDED when ``timeout_s`` passes, UNAVAILABLE when the stream breaks (the
service restarting, the connection gone). A broken stream is not reused: the next
search opens another, as the channel reconnects. A service without ``SearchStream`` (an
older retrieval during a rolling upgrade) ends the first stream UNIMPLEMENTED; that
search and every later one go unary (:class:`StreamUnsupported`).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any, Protocol

import grpc

from engram_core.codec import pb

Metadata = tuple[tuple[str, str], ...]
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


class StreamUnsupported(Exception):
    """The service does not serve SearchStream; the search is to be made unary."""


class _OpenCall(Protocol):
    """What is used of a ``grpc.aio.StreamStreamCall``."""

    async def write(self, request: pb.StreamedSearch) -> None: ...
    async def read(self) -> Any: ...
    async def code(self) -> grpc.StatusCode: ...
    async def details(self) -> str: ...
    def cancel(self) -> bool: ...


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class _Stream:
    """One open call, the searches waiting on it, and the task reading its replies."""

    def __init__(self, call: _OpenCall) -> None:
        self.call = call
        self.waiting: dict[int, asyncio.Future[pb.StreamedSearchReply]] = {}
        self.writing = asyncio.Lock()  # one message at a time on the call
        self.ended = False
        self.reader: asyncio.Task[None] | None = None

    def end(self, error: BaseException) -> None:
        self.ended = True
        for waiter in self.waiting.values():
            if not waiter.done():
                waiter.set_exception(error)
        self.waiting.clear()


class SearchStream:
    """An interactive client's searches on one stream at a time.

    ``open_call(metadata)``: a new ``SearchStream`` call of the client's channel.
    """

    def __init__(self, open_call: Callable[[Metadata], _OpenCall], metadata: Metadata) -> None:
        self._open_call = open_call
        self._metadata = metadata
        self._ids = itertools.count(1)
        self._stream: _Stream | None = None
        #: the service said UNIMPLEMENTED: searches go unary from now on
        self.unsupported = False

    def _open(self) -> _Stream:
        stream = self._stream
        if stream is None or stream.ended:
            stream = self._stream = _Stream(self._open_call(self._metadata))
            stream.reader = asyncio.ensure_future(self._read(stream))
        return stream

    async def search(
        self, request: pb.SearchRequest, timeout_s: float, trace_context: Metadata
    ) -> pb.SearchResponse:
        """The service's reply to ``request``; raises as a unary Search call would."""
        if self.unsupported:
            raise StreamUnsupported
        stream = self._open()
        search_id = next(self._ids)
        waiter: asyncio.Future[pb.StreamedSearchReply] = asyncio.get_running_loop().create_future()
        stream.waiting[search_id] = waiter
        message = pb.StreamedSearch(
            id=search_id, request=request, trace_context=dict(trace_context)
        )
        try:
            async with asyncio.timeout(timeout_s):
                async with stream.writing:
                    try:
                        await stream.call.write(message)
                    except asyncio.InvalidStateError:  # the call ended meanwhile
                        if not waiter.done():
                            stream.end(rpc_error(grpc.StatusCode.UNAVAILABLE, "stream ended"))
                reply = await waiter
        except TimeoutError:
            raise rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded") from None
        finally:
            stream.waiting.pop(search_id, None)
        if reply.status_code:
            code = _STATUS_CODES.get(reply.status_code, grpc.StatusCode.UNKNOWN)
            raise rpc_error(code, reply.status_details)
        return reply.response

    async def _read(self, stream: _Stream) -> None:
        """Hands each reply to its search until the call ends, then fails those left."""
        error: BaseException
        try:
            while True:
                reply = await stream.call.read()
                if reply is grpc.aio.EOF:
                    break
                waiter = stream.waiting.get(reply.id)
                if waiter is not None and not waiter.done():
                    waiter.set_result(reply)
            code, details = await stream.call.code(), await stream.call.details()
            error = rpc_error(
                code if code != grpc.StatusCode.OK else grpc.StatusCode.UNAVAILABLE,
                details or "search stream ended",
            )
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                self.unsupported = True
                error = StreamUnsupported()
            else:
                error = exc
        except asyncio.CancelledError:
            stream.end(rpc_error(grpc.StatusCode.CANCELLED, "search stream closed"))
            raise
        except Exception as exc:  # nothing a reader expects: no search waits forever
            error = rpc_error(grpc.StatusCode.UNAVAILABLE, f"search stream failed: {exc!r}")
        stream.end(error)

    async def close(self) -> None:
        stream, self._stream = self._stream, None
        if stream is None:
            return
        stream.call.cancel()
        if stream.reader is not None:
            stream.reader.cancel()
            await asyncio.gather(stream.reader, return_exceptions=True)
