"""One raw HTTP/1.1 connection, for requests no HTTP client would send as written.

Clients normalise what they send: they resolve ``..`` segments, re-encode ``%2e``,
refuse non-ASCII header bytes. The gateway's edge has to hold against the bytes an
attacker types, so these tests write request lines and header bytes themselves, and
send requests one after another on the same keep-alive connection (so "the connection
survived" is a fact of the test, not a pool's choice).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def error(self) -> dict[str, Any]:
        """The OpenAI-shaped error of a JSON error answer."""
        assert self.headers["content-type"].startswith("application/json"), self.headers
        error = self.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        return dict(error)


class RawConnection:
    """One HTTP/1.1 connection; requests are sent one after another on it."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, url: str) -> RawConnection:
        host, port = url.removeprefix("http://").split("/")[0].split(":")
        return cls(*await asyncio.open_connection(host, int(port)))

    async def send(
        self,
        method: str,
        path: str | bytes,
        body: bytes | None = None,
        headers: list[bytes] | None = None,
    ) -> None:
        """``path`` is written as it is (bytes: byte for byte); ``headers`` are raw
        ``b"Name: value"`` lines, sent after Host and Connection."""
        target = path if isinstance(path, bytes) else path.encode("latin-1")
        lines = [method.encode() + b" " + target + b" HTTP/1.1", b"Host: gateway"]
        lines += [b"Connection: keep-alive", *(headers or [])]
        if body is not None:
            lines += [b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
        self.writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + (body or b""))
        await self.writer.drain()

    async def response(self, timeout_s: float = 15.0) -> Reply:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), timeout_s)
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in filter(None, header_lines):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding") == "chunked":
            body = await self._chunked_body(timeout_s)
        else:
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return Reply(int(status_line.split()[1]), headers, body)

    async def _chunked_body(self, timeout_s: float) -> bytes:
        parts: list[bytes] = []
        while True:
            size_line = await asyncio.wait_for(self.reader.readuntil(b"\r\n"), timeout_s)
            size = int(size_line.split(b";")[0], 16)
            chunk = await self.reader.readexactly(size + 2)
            if size == 0:
                return b"".join(parts)
            parts.append(chunk[:-2])

    async def request(
        self,
        method: str,
        path: str | bytes,
        body: Any = None,
        headers: list[bytes] | None = None,
    ) -> Reply:
        raw = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        await self.send(method, path, raw, headers)
        return await self.response()

    async def closed_by_server(self, timeout_s: float = 5.0) -> bool:
        return await asyncio.wait_for(self.reader.read(1), timeout_s) == b""

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()
