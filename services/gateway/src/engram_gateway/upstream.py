"""The upstream LLM: chat completions through the official ``openai`` client, every
other ``/v1`` path through the same (shared, instrumented) HTTP client.

Transparency: the chat body is sent as the exact JSON the caller posted minus the
memory controls (plus the injected memory message); nothing goes through the SDK's
typed parameters, so no field is dropped, renamed or re-shaped. The caller's headers
are forwarded except hop-by-hop ones, cookies, trace context (the gateway's own span
is the parent upstream) and ``X-Engram-*``.

Nor are the caller's SDK *call options* forwarded (``X-Stainless-Raw-Response`` from
``with_raw_response``/``with_streaming_response``, the SDK's private cast override,
and, on chats, ``X-Stainless-Retry-Count``/``-Read-Timeout``/``-Timeout``): they tell
the caller's own client how to read its reply, and given to the gateway's client they
would switch it to raw mode. The gateway's client sets its own retry count and timeout.
The SDK's informational headers (``X-Stainless-Lang``, ``-Package-Version``, ...) pass.

Error mapping: upstream 4xx → same status and body; upstream 5xx or a connection
failure → 502; a timeout → 504. Always OpenAI-shaped, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import httpx2
from openai import APIConnectionError, APIStatusError, APITimeoutError, AsyncOpenAI, Omit
from starlette.responses import Response

from engram_core.logging import get_logger
from engram_gateway.errors import UPSTREAM_ERROR, GatewayError, error_body
from engram_gateway.settings import GatewaySettings

log = get_logger(__name__)

_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# Never forwarded upstream: rebuilt by the HTTP client, gateway-only, or the caller's
# credentials for something other than the LLM.
_DROP_REQUEST = _HOP_BY_HOP | {
    "host",
    "content-length",
    "expect",
    "cookie",
    "authorization",
    "x-upstream-authorization",
    "traceparent",
    "tracestate",
    "baggage",
}
# The caller's SDK's per-call options (openai-python and openai-node): never a server's
# business, and they steer an SDK that reads them (the gateway's own client does).
_SDK_CALL_OPTIONS = frozenset({"x-stainless-raw-response", "____stainless_override_cast_to"})
# What the gateway's own client sets for its chat call.
_SDK_CALL_STATE = frozenset(
    {"x-stainless-retry-count", "x-stainless-read-timeout", "x-stainless-timeout"}
)
_DROP_REQUEST = _DROP_REQUEST | _SDK_CALL_OPTIONS
# Chat bodies are re-serialised and decoded by the gateway.
_DROP_CHAT_REQUEST = _DROP_REQUEST | _SDK_CALL_STATE | {"content-type", "accept-encoding"}
UPSTREAM_AUTH_HEADER = "x-upstream-authorization"
_DROP_RESPONSE = _HOP_BY_HOP | {"content-length", "date", "server"}


def make_http_client(settings: GatewaySettings) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        timeout=httpx2.Timeout(settings.llm_timeout_s, connect=settings.llm_connect_timeout_s),
        limits=httpx2.Limits(max_connections=256, max_keepalive_connections=64),
        follow_redirects=False,
    )


def make_llm_client(settings: GatewaySettings, http: httpx2.AsyncClient) -> AsyncOpenAI:
    return AsyncOpenAI(
        # Authorization is set per request (configured key or the caller's); the SDK
        # only insists on having something here.
        api_key=settings.llm_api_key.get_secret_value() if settings.llm_api_key else "unused",
        base_url=settings.llm_base_url,
        http_client=http,
        max_retries=settings.llm_max_retries,
        timeout=httpx2.Timeout(settings.llm_timeout_s, connect=settings.llm_connect_timeout_s),
    )


class UpstreamRejected(GatewayError):
    """The upstream answered 4xx: the caller gets that status and body unchanged."""

    def __init__(self, status: int, content: bytes, headers: Mapping[str, str]) -> None:
        super().__init__(status, f"upstream returned HTTP {status}", type=UPSTREAM_ERROR)
        self.content = content
        self.upstream_headers = dict(headers)

    def response(self) -> Response:
        try:
            json.loads(self.content)
        except ValueError:
            # Not JSON (a proxy's HTML page, say): wrap it so SDKs can still read it.
            text = self.content.decode("utf-8", "replace").strip()[:2000]
            body = error_body(
                text or f"upstream returned HTTP {self.status}",
                type=UPSTREAM_ERROR,
                code=f"upstream_{self.status}",
            )
            return Response(
                json.dumps(body), status_code=self.status, media_type="application/json"
            )
        headers = response_headers(self.upstream_headers)
        headers.pop("content-encoding", None)
        return Response(
            self.content, status_code=self.status, headers=headers, media_type="application/json"
        )


def _upstream_message(response: httpx2.Response) -> str:
    try:
        error = response.json().get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str):
            return error
    except Exception:  # an error page that is not JSON
        pass
    return response.text.strip()[:500]


def upstream_failed(status: int | None, detail: str) -> GatewayError:
    if status is None:
        return GatewayError(
            502,
            f"Upstream LLM unreachable: {detail}",
            type=UPSTREAM_ERROR,
            code="upstream_unreachable",
        )
    return GatewayError(
        502,
        f"Upstream LLM failed with HTTP {status}: {detail}",
        type=UPSTREAM_ERROR,
        code="upstream_error",
    )


def upstream_timeout(timeout_s: float) -> GatewayError:
    return GatewayError(
        504,
        f"Upstream LLM did not answer within {timeout_s:g}s",
        type=UPSTREAM_ERROR,
        code="upstream_timeout",
    )


def response_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Upstream response headers worth relaying (rate limits, request ids, ...)."""
    return {k: v for k, v in headers.items() if k.lower() not in _DROP_RESPONSE}


class Upstream:
    def __init__(
        self, settings: GatewaySettings, http: httpx2.AsyncClient, llm: AsyncOpenAI
    ) -> None:
        self.settings = settings
        self.http = http
        self.llm = llm

    def _authorization(self, incoming: Mapping[str, str]) -> str | None:
        """The configured key; else the caller's ``X-Upstream-Authorization``; else,
        only when Engram has no API keys of its own, the caller's ``Authorization``."""
        if self.settings.llm_api_key is not None:
            return f"Bearer {self.settings.llm_api_key.get_secret_value()}"
        headers = {key.lower(): value for key, value in incoming.items()}
        if UPSTREAM_AUTH_HEADER in headers:
            return headers[UPSTREAM_AUTH_HEADER]
        if self.settings.key_table is None:
            return headers.get("authorization")
        return None  # the caller's Authorization is its Engram key: never forwarded

    def forward_headers(self, incoming: Mapping[str, str], *, chat: bool) -> dict[str, str]:
        drop = _DROP_CHAT_REQUEST if chat else _DROP_REQUEST
        # Lower-case names throughout: one spelling per header, no duplicates on merge.
        # Values without surrounding whitespace, which is not part of a field value
        # (RFC 9110) and which the HTTP client refuses to send ("Bearer ").
        headers = {
            k.lower(): v.strip()
            for k, v in incoming.items()
            if k.lower() not in drop and not k.lower().startswith("x-engram-")
        }
        auth = (self._authorization(incoming) or "").strip()
        if auth:
            headers["authorization"] = auth
        return headers

    async def chat(
        self, body: dict[str, Any], incoming: Mapping[str, str], *, stream: bool
    ) -> httpx2.Response:
        """POST /chat/completions. With ``stream`` the body is left unread for relaying."""
        headers: dict[str, Any] = self.forward_headers(incoming, chat=True)
        headers.setdefault("authorization", Omit())  # no key at all: send none
        headers["content-type"] = "application/json"
        content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        try:
            return await self.llm.post(
                "/chat/completions",
                cast_to=httpx2.Response,
                content=content,
                options={"headers": headers},
                stream=stream,
            )
        except APIStatusError as exc:
            response = exc.response
            if 400 <= response.status_code < 500:
                raise UpstreamRejected(
                    response.status_code, response.content, response.headers
                ) from None
            detail = _upstream_message(response)
            log.warning("upstream.error", status=response.status_code, detail=detail)
            raise upstream_failed(response.status_code, detail) from None
        except APITimeoutError:
            log.warning("upstream.timeout", timeout_s=self.settings.llm_timeout_s)
            raise upstream_timeout(self.settings.llm_timeout_s) from None
        except APIConnectionError as exc:
            detail = str(exc.__cause__ or exc)
            log.warning("upstream.unreachable", error=detail, base_url=self.settings.llm_base_url)
            raise upstream_failed(None, detail) from None

    async def send(
        self, method: str, path_and_query: str, content: bytes, incoming: Mapping[str, str]
    ) -> httpx2.Response:
        """Any other request, relayed as is; the response body is left unread (streamed)."""
        headers = self.forward_headers(incoming, chat=False)
        # Without the caller's preference, ask for what the caller surely understands:
        # the body is relayed byte for byte, encoding included.
        headers.setdefault("accept-encoding", "identity")
        request = self.http.build_request(
            method,
            self.settings.llm_base_url + path_and_query,
            content=content or None,
            headers=headers,
        )
        try:
            return await self.http.send(request, stream=True)
        except httpx2.TimeoutException:
            raise upstream_timeout(self.settings.llm_timeout_s) from None
        except httpx2.HTTPError as exc:
            log.warning("upstream.unreachable", error=str(exc), base_url=self.settings.llm_base_url)
            raise upstream_failed(None, str(exc) or type(exc).__name__) from None
