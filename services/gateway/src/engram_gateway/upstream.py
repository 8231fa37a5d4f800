"""The upstream LLM: chat completions through the official ``openai`` client, every
other ``/v1`` path through the same (shared, instrumented) HTTP client.

Transparency: the chat body is sent as the exact JSON the caller posted minus the
memory controls (plus the injected memory message); nothing goes through the SDK's
typed parameters, so no field is dropped, renamed or re-shaped.

Caller headers: an allowlist (:func:`is_forwarded`, docs/gateway.md). What SDKs and
chat front ends send for the model reaches it: ``Accept``, ``Accept-Language``,
``User-Agent``, ``Idempotency-Key``, ``OpenAI-*``, ``Anthropic-*``, OpenRouter's
``HTTP-Referer``, and every ``X-*`` extension header (``X-Stainless-*``,
``X-OpenWebUI-*``, a caller's own tags), plus ``Content-Type``/``Accept-Encoding`` on
pass-through (chat bodies are re-serialised and decoded by the gateway). Never: other
standard headers (``Cookie``, ``Origin``, ``Referer``, ``Forwarded``, ``If-*``,
``Range``, ``Sec-*``, hop-by-hop ones, ...), ``X-Forwarded-*``/``X-Real-IP`` (the
gateway is the upstream's client), trace context (the gateway's own span is the parent
upstream), ``X-Engram-*`` and the caller's ``Authorization`` (:meth:`Upstream._authorization`)
and ``X-Api-Key`` (Anthropic's SDKs' credential: relayed only when Engram has no keys of
its own and no upstream key is configured, as ``Authorization`` is).
A value is sent as the bytes that arrived (RFC 9110 allows bytes 0x80-0xFF, so a UTF-8
``X-OpenWebUI-User-Name: José`` is relayed as it came, not refused nor re-encoded); a
value with a control byte is dropped, never sent and never a 500.

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
import re
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any

import httpx2
from openai import APIConnectionError, APIStatusError, APITimeoutError, AsyncOpenAI, Omit
from opentelemetry.instrumentation.httpx import HTTPX2ClientInstrumentor
from opentelemetry.trace import TracerProvider
from starlette.responses import Response

from engram_core.logging import get_logger
from engram_core.urls import without_credentials
from engram_gateway.errors import UPSTREAM_ERROR, GatewayError, error_body
from engram_gateway.settings import GatewaySettings

log = get_logger(__name__)

#: Standard headers that reach the upstream (lower-case names).
_FORWARDED_NAMES = frozenset(
    {"accept", "accept-language", "user-agent", "idempotency-key", "http-referer"}
)
#: Header families that reach the upstream: extension headers and the providers' own.
_FORWARDED_PREFIXES = ("x-", "openai-", "anthropic-")
#: Within those: the gateway's own, proxy bookkeeping the gateway re-does as the
#: upstream's client, trace context and credentials handled apart.
_NEVER_FORWARDED_PREFIXES = ("x-engram-", "x-forwarded-")
_NEVER_FORWARDED = frozenset({"x-real-ip", "x-client-ip", "x-upstream-authorization"})
# The caller's SDK's per-call options (openai-python and openai-node): never a server's
# business, and they steer an SDK that reads them (the gateway's own client does).
_SDK_CALL_OPTIONS = frozenset({"x-stainless-raw-response", "____stainless_override_cast_to"})
# What the gateway's own client sets for its chat call.
_SDK_CALL_STATE = frozenset(
    {"x-stainless-retry-count", "x-stainless-read-timeout", "x-stainless-timeout"}
)
# Relayed on pass-through only: chat bodies are re-serialised and decoded by the gateway.
_PASSTHROUGH_ONLY = frozenset({"content-type", "accept-encoding"})
_CONTROL_BYTES = re.compile("[\x00-\x08\x0a-\x1f\x7f]")
UPSTREAM_AUTH_HEADER = "x-upstream-authorization"
API_KEY_HEADER = "x-api-key"
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
_DROP_RESPONSE = _HOP_BY_HOP | {"content-length", "date", "server"}


def is_forwarded(name: str, *, chat: bool) -> bool:
    """Whether a caller's header (lower-case name) reaches the upstream."""
    if name in _NEVER_FORWARDED or name.startswith(_NEVER_FORWARDED_PREFIXES):
        return False
    if name in _SDK_CALL_OPTIONS or (chat and name in _SDK_CALL_STATE):
        return False
    if name in _FORWARDED_NAMES or name.startswith(_FORWARDED_PREFIXES):
        return True
    return not chat and name in _PASSTHROUGH_ONLY


def _wire_value(value: str) -> bytes | None:
    """A header value as the bytes that arrived (Starlette decodes them as latin-1),
    without surrounding whitespace; None when it holds a control byte."""
    value = value.strip()
    if _CONTROL_BYTES.search(value):
        return None
    return value.encode("latin-1", "replace")


# The SDK re-reads its headers as text and encodes them as ASCII, so a non-ASCII value
# cannot travel through it: the chat call puts such values here and this hook sets them,
# as bytes, on the request the SDK built (in the same task, retries included).
_NON_ASCII_HEADERS: ContextVar[Mapping[str, bytes] | None] = ContextVar(
    "engram_non_ascii_headers", default=None
)


async def _set_non_ascii_headers(request: httpx2.Request) -> None:
    if raw := _NON_ASCII_HEADERS.get():
        # A new Headers: it works out its text encoding again, for readers such as the
        # tracing instrumentation (the old one settled on ASCII).
        kept = [(k, v) for k, v in request.headers.raw if k.lower().decode() not in raw]
        request.headers = httpx2.Headers([*kept, *((k.encode(), v) for k, v in raw.items())])


def make_http_client(settings: GatewaySettings) -> httpx2.AsyncClient:
    return httpx2.AsyncClient(
        timeout=httpx2.Timeout(settings.llm_timeout_s, connect=settings.llm_connect_timeout_s),
        limits=httpx2.Limits(max_connections=256, max_keepalive_connections=64),
        follow_redirects=False,
        event_hooks={"request": [_set_non_ascii_headers]},
    )


def instrument_http_client(
    client: httpx2.AsyncClient, tracer_provider: TracerProvider | None
) -> None:
    """A client span for every request ``client`` sends (the upstream LLM's client, the
    ``/mcp`` tools' in-process one)."""
    HTTPX2ClientInstrumentor.instrument_client(
        client,  # type: ignore[arg-type]  # annotated for httpx; instruments httpx2 too
        tracer_provider=tracer_provider,
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


url_without_credentials = without_credentials  # what messages and logs name


def upstream_failed(status: int | None, detail: str, url: str = "") -> GatewayError:
    """The 502 for an upstream that failed (``status``) or could not be reached (None):
    the latter names the URL tried (``url``, shown without credentials)."""
    if status is None:
        tried = f" at {url_without_credentials(url)}" if url else ""
        return GatewayError(
            502,
            f"Upstream LLM unreachable{tried}: {detail}",
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

    def forward_headers(
        self, incoming: Mapping[str, str], *, chat: bool, credential: str = "authorization"
    ) -> dict[str, bytes]:
        """The caller's allowed headers as bytes (:func:`is_forwarded`), plus the upstream
        credential. Lower-case names throughout: one spelling per header, no duplicates
        on merge. Values without surrounding whitespace, which is not part of a field
        value (RFC 9110) and which the HTTP client refuses to send ("Bearer ").
        ``credential``: the header the upstream API reads the configured key from
        (``x-api-key`` for the Anthropic Messages API)."""
        headers: dict[str, bytes] = {}
        for name, value in incoming.items():
            name = name.lower()
            if name == API_KEY_HEADER:
                continue  # a credential: below
            if is_forwarded(name, chat=chat) and (wire := _wire_value(value)) is not None:
                headers[name] = wire
        if credential == API_KEY_HEADER and self.settings.llm_api_key is not None:
            # Anthropic's own API takes its key here, and only the key.
            headers[API_KEY_HEADER] = self.settings.llm_api_key.get_secret_value().encode()
            return headers
        auth = _wire_value(self._authorization(incoming) or "")
        if auth:
            headers["authorization"] = auth
        # The caller's x-api-key (Anthropic's SDKs) is a credential like Authorization:
        # never forwarded when it may be the caller's Engram key.
        if self.settings.llm_api_key is None and self.settings.key_table is None:
            caller_key = next((v for k, v in incoming.items() if k.lower() == API_KEY_HEADER), "")
            if (wire := _wire_value(caller_key)) is not None and wire:
                headers[API_KEY_HEADER] = wire
        return headers

    async def chat(
        self, body: dict[str, Any], incoming: Mapping[str, str], *, stream: bool
    ) -> httpx2.Response:
        """POST /chat/completions. With ``stream`` the body is left unread for relaying."""
        return await self.post_json("/chat/completions", body, incoming, stream=stream)

    async def post_json(
        self,
        url: str,
        body: dict[str, Any],
        incoming: Mapping[str, str],
        *,
        stream: bool,
        credential: str = "authorization",
    ) -> httpx2.Response:
        """POST a chat-like body to ``url`` (a path under ``ENGRAM_LLM_BASE_URL`` or an
        absolute URL: another API's endpoint) through the same client, retries and
        error mapping as chats. With ``stream`` the body is left unread for relaying."""
        forwarded = self.forward_headers(incoming, chat=True, credential=credential)
        non_ascii = {k: v for k, v in forwarded.items() if not v.isascii()}
        headers: dict[str, Any] = {
            k: Omit() if k in non_ascii else v.decode("ascii") for k, v in forwarded.items()
        }
        headers.setdefault("authorization", Omit())  # no key at all: send none
        headers["content-type"] = "application/json"
        content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        token = _NON_ASCII_HEADERS.set(non_ascii)
        try:
            return await self.llm.post(
                url,
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
            tried = url if "://" in url else self.settings.llm_base_url.rstrip("/") + url
            log.warning("upstream.unreachable", error=detail, url=url_without_credentials(tried))
            raise upstream_failed(None, detail, tried) from None
        finally:
            _NON_ASCII_HEADERS.reset(token)

    async def send(
        self, method: str, path_and_query: str, content: bytes, incoming: Mapping[str, str]
    ) -> httpx2.Response:
        """Any other request, relayed as is; the response body is left unread (streamed)."""
        headers = self.forward_headers(incoming, chat=False)
        # Without the caller's preference, ask for what the caller surely understands:
        # the body is relayed byte for byte, encoding included.
        headers.setdefault("accept-encoding", b"identity")
        request = self.http.build_request(
            method,
            self.settings.llm_base_url + path_and_query,
            content=content or None,
            headers=[(name.encode(), value) for name, value in headers.items()],
        )
        try:
            return await self.http.send(request, stream=True)
        except httpx2.TimeoutException:
            raise upstream_timeout(self.settings.llm_timeout_s) from None
        except httpx2.HTTPError as exc:
            tried = str(request.url)
            log.warning("upstream.unreachable", error=str(exc), url=url_without_credentials(tried))
            raise upstream_failed(None, str(exc) or type(exc).__name__, tried) from None
