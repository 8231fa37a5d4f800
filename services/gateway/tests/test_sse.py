"""Server-sent events: the extra field on a stream's first event, and the reader of the
upstream's chat stream across any chunk boundaries."""

from __future__ import annotations

from engram_gateway.sse import ChatStreamReader, with_first_event_field


async def test_the_first_stream_event_carries_an_extra_field() -> None:
    async def upstream():
        yield b'data: {"id":"c1","choices":[{"index":0,"delta":{"role":"assistant"}}]}'
        yield b'\r\n\r\ndata: {"id":"c1","choices":[]}\n\n'
        yield b"data: [DONE]\n\n"

    out = b"".join([c async for c in with_first_event_field(upstream(), "memory_hits", [1])])
    events = [e for e in out.replace(b"\r\n", b"\n").split(b"\n\n") if e]
    assert events[0].startswith(b"data: ") and b'"memory_hits":[1]' in events[0]
    assert events[1:] == [b'data: {"id":"c1","choices":[]}', b"data: [DONE]"]


def test_sse_reader_across_arbitrary_chunk_boundaries() -> None:
    stream = (
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\r\n\r\n'
        b": keep-alive\n\n"
        b'data: {"choices":[{"index":0,"delta":{"content":"Hel"}},'
        b'{"index":1,"delta":{"content":"Other"}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{"content":"lo \xc3\xa9"}}]}\n\n'
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'
        b'data: {"choices":[],"usage":{"total_tokens":3}}\n\n'
        b"data: [DONE]\n\n"
    )
    for size in (1, 7, len(stream)):
        reader = ChatStreamReader()
        for start in range(0, len(stream), size):
            reader.feed(stream[start : start + size])
        assert reader.text(0) == "Hello é"
        assert reader.text(1) == "Other"
        assert reader.done and reader.complete


def test_sse_reader_incomplete_and_error() -> None:
    reader = ChatStreamReader()
    reader.feed(b'data: {"choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n')
    assert not reader.complete
    reader.feed(b'data: {"error":{"message":"boom"}}\n\n')
    reader.feed(b"data: [DONE]\n\n")
    assert reader.error == {"message": "boom"} and not reader.complete
