"""Reading request bodies: bounded in size, JSON objects only."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request

from engram_gateway.errors import INVALID_REQUEST, GatewayError, bad_request


def too_large(limit: int) -> GatewayError:
    return GatewayError(
        413,
        f"Request body larger than {limit} bytes",
        type=INVALID_REQUEST,
        code="request_too_large",
    )


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _reject_constant(name: str) -> Any:
    # Python's json accepts NaN/Infinity; they are not JSON and no upstream would take them.
    raise ValueError(f"{name} is not valid JSON")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise bad_request("The request body is empty; expected a JSON object.", code="invalid_json")
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(
            f"The request body is not valid JSON: {exc}", code="invalid_json"
        ) from None
    if not isinstance(value, dict):
        raise bad_request("The request body must be a JSON object.", code="invalid_json")
    return value
