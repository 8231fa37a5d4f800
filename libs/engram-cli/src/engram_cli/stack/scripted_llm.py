"""A scripted OpenAI-compatible upstream server that records every request.

It speaks the Chat Completions wire format (JSON and SSE streaming) with
deterministic replies, so the gateway's production code path — the ``openai``
package over HTTP — is exercised unchanged; and, with the same scripted replies, the
OpenAI Responses API (``POST /v1/responses``), the Anthropic Messages API
(``POST /v1/messages``) and Ollama's native chat (``POST /api/chat``), each in its own
framing (:mod:`engram_cli.stack.scripted_apis`), as Ollama serves them all on one port.

``GET /requests`` returns what it received (what Engram sent upstream) as a JSON list,
newest last (``?limit=N``: the last N); ``DELETE /requests`` forgets them. Credentials
are shown redacted (``Bearer <redacted>``).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from engram_cli.stack import scripted_apis
from engram_cli.stack.nats_server import free_port
from engram_cli.stack.scripted_grammar import (
    SUBJECT,
    split_clauses,
    third_person,
    third_person_verb,
)


@dataclass(frozen=True)
class UpstreamError:
    """A scripted failure: the upstream answers with this status and message."""

    status: int
    message: str = "scripted failure"


@dataclass(frozen=True)
class ToolCall:
    """A scripted reply that calls a tool (``finish_reason: tool_calls``)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = "call_scripted_1"

    def message_part(self, index: int = 0) -> dict[str, Any]:
        return {
            "index": index,
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments)},
        }


@dataclass(frozen=True)
class Completion:
    """A scripted reply with what a reasoning model sends beside its text: its thinking in
    ``reasoning_field`` (vLLM and LM Studio say ``reasoning_content``, Ollama
    ``reasoning``), and ``finish_reason`` (``length``: cut at the token limit)."""

    content: str
    reasoning: str = ""
    reasoning_field: str = "reasoning_content"
    finish_reason: str = "stop"

    def message(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.reasoning:
            message[self.reasoning_field] = self.reasoning
        return message


Answer = str | UpstreamError | ToolCall | Completion
Reply = Answer | Callable[[dict[str, Any]], Answer]


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    method: str = "POST"
    received_at: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "path": self.path,
            "received_at": self.received_at,
            "headers": {k: _redacted(k, v) for k, v in self.headers.items()},
            "body": self.body,
        }


_CREDENTIALS = frozenset({"authorization", "x-upstream-authorization", "api-key", "x-api-key"})


def _redacted(name: str, value: str) -> str:
    if name.lower() not in _CREDENTIALS:
        return value
    scheme, _, secret = value.partition(" ")
    return f"{scheme} <redacted>" if secret else "<redacted>"


@dataclass
class ScriptedUpstream:
    """Replies with ``replies`` in order (the last one repeats); records requests."""

    replies: list[Reply] = field(default_factory=lambda: ["OK."])
    model: str = "scripted-model"
    requests: list[RecordedRequest] = field(default_factory=list)
    fail_with: int | None = None  # respond with this HTTP status instead
    delay_s: float = 0.0
    keep: int | None = None  # remember at most this many requests (None: all)

    def __post_init__(self) -> None:
        self._chats_received = 0
        self.port = free_port()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def chat_requests(self) -> list[dict[str, Any]]:
        return [r.body for r in self.requests if r.path.endswith("/chat/completions")]

    def conversation_requests(self) -> list[dict[str, Any]]:
        """Chat requests that came from users, without the workers' task calls."""
        return [body for body in self.chat_requests() if not is_task_request(body)]

    def _next_reply(self, body: dict[str, Any]) -> Answer:
        # Counted apart from ``requests`` (which may be capped or cleared); a chat
        # answered with ``fail_with`` still uses up its turn, as before.
        index = self._chats_received - 1
        reply = self.replies[min(index, len(self.replies) - 1)]
        return reply(body) if callable(reply) else reply

    def _record(self, request: Request, body: dict[str, Any]) -> None:
        self.requests.append(
            RecordedRequest(request.url.path, dict(request.headers), body, request.method)
        )
        if self.keep is not None and len(self.requests) > self.keep:
            del self.requests[: len(self.requests) - self.keep]

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        self._record(request, body)
        self._chats_received += 1
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_with is not None:
            return JSONResponse(
                {"error": {"message": "scripted failure", "type": "server_error", "code": None}},
                status_code=self.fail_with,
            )
        text = self._next_reply(body)
        if isinstance(text, UpstreamError):
            return JSONResponse(
                {"error": {"message": text.message, "type": "scripted_error", "code": None}},
                status_code=text.status,
            )
        created = int(time.time())
        completion_id = f"chatcmpl-{self._chats_received}"
        if body.get("stream"):
            chunks = (
                self._stream_tool_call(completion_id, created, text)
                if isinstance(text, ToolCall)
                else self._stream(
                    completion_id, created, text.content if isinstance(text, Completion) else text
                )
            )
            return StreamingResponse(chunks, media_type="text/event-stream")
        if isinstance(text, ToolCall):
            message: dict[str, Any] = {
                "role": "assistant",
                "content": None,
                "tool_calls": [{k: v for k, v in text.message_part().items() if k != "index"}],
            }
            finish, words = "tool_calls", 1
        elif isinstance(text, Completion):
            message, finish = text.message(), text.finish_reason
            words = len(f"{text.reasoning} {text.content}".split())
        else:
            message, finish, words = (
                {"role": "assistant", "content": text},
                "stop",
                len(text.split()),
            )
        return JSONResponse(
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": body.get("model", self.model),
                "choices": [{"index": 0, "finish_reason": finish, "message": message}],
                "usage": {
                    "prompt_tokens": 10,
                    "completion_tokens": words,
                    "total_tokens": 10 + words,
                },
            }
        )

    async def _other_api(self, request: Request) -> Response:
        """``/v1/responses``, ``/v1/messages`` and ``/api/chat``: the chat's scripted
        replies (the same turn count) in that API's format."""
        body = await request.json()
        self._record(request, body)
        self._chats_received += 1
        path = request.url.path
        reply, error = _API_FORMATS[path]
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.fail_with is not None:
            return error(self.fail_with, "scripted failure")
        answer = self._next_reply(body)
        if isinstance(answer, UpstreamError):
            return error(answer.status, answer.message)
        model = str(body.get("model", self.model))
        parts: str | scripted_apis.ToolCallParts
        if isinstance(answer, ToolCall):
            parts = (answer.name, answer.arguments, answer.id)
        else:
            parts = answer.content if isinstance(answer, Completion) else answer
        stream = body.get("stream", path == "/api/chat") is True
        return reply(self._chats_received, model, parts, stream)

    def api_requests(self, path: str) -> list[dict[str, Any]]:
        """The bodies received on one path (``/v1/responses``, ``/api/chat``, ...)."""
        return [r.body for r in self.requests if r.path == path]

    def _chunk(
        self, completion_id: str, created: int, delta: dict[str, Any], finish: str | None = None
    ) -> str:
        payload = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
        return f"data: {json.dumps(payload)}\n\n"

    async def _stream_tool_call(
        self, completion_id: str, created: int, call: ToolCall
    ) -> AsyncIterator[str]:
        part = call.message_part()
        arguments = part["function"]["arguments"]
        head = {**part, "function": {"name": call.name, "arguments": ""}}
        yield self._chunk(completion_id, created, {"role": "assistant", "tool_calls": [head]})
        tail = {"index": 0, "function": {"arguments": arguments}}
        yield self._chunk(completion_id, created, {"tool_calls": [tail]})
        yield self._chunk(completion_id, created, {}, "tool_calls")
        yield "data: [DONE]\n\n"

    async def _stream(self, completion_id: str, created: int, text: str) -> AsyncIterator[str]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            return self._chunk(completion_id, created, delta, finish)

        yield chunk({"role": "assistant", "content": ""})
        for word in text.split(" "):
            yield chunk(
                {"content": word + " "} if word != text.split(" ")[-1] else {"content": word}
            )
        yield chunk({}, "stop")
        yield "data: [DONE]\n\n"

    async def _models(self, request: Request) -> Response:
        self._record(request, {})
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"id": self.model, "object": "model", "created": 0, "owned_by": "scripted"}
                ],
            }
        )

    async def _recorded(self, request: Request) -> Response:
        if request.method == "DELETE":
            forgotten = len(self.requests)
            self.requests.clear()
            return JSONResponse({"deleted": forgotten})
        limit = request.query_params.get("limit", "")
        if limit and not (limit.isdigit() and int(limit) > 0):
            return JSONResponse(
                {"error": {"message": "limit must be a positive integer", "type": "invalid"}},
                status_code=400,
            )
        recorded = self.requests[-int(limit) :] if limit else list(self.requests)
        return JSONResponse([r.to_json() for r in recorded])

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
                *(Route(path, self._other_api, methods=["POST"]) for path in _API_FORMATS),
                Route("/requests", self._recorded, methods=["GET", "DELETE"]),
            ]
        )

    def start(self) -> ScriptedUpstream:
        config = uvicorn.Config(
            self.app(), host="127.0.0.1", port=self.port, log_level="warning", lifespan="off"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("scripted upstream did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)


_ApiReply = Callable[[int, str, "str | scripted_apis.ToolCallParts", bool], Response]
_API_FORMATS: dict[str, tuple[_ApiReply, Callable[[int, str], Response]]] = {
    "/v1/responses": (
        lambda n, model, answer, stream: scripted_apis.responses_reply(
            n, model, answer, stream=stream
        ),
        scripted_apis.responses_error,
    ),
    "/v1/messages": (
        lambda n, model, answer, stream: scripted_apis.messages_reply(
            n, model, answer, stream=stream
        ),
        scripted_apis.messages_error,
    ),
    "/api/chat": (
        lambda _, model, answer, stream: scripted_apis.ollama_reply(model, answer, stream=stream),
        scripted_apis.ollama_error,
    ),
}


# --- a deterministic, rule-based stand-in for a model ----------------------------------

_TASK_PREFIX = "engram-task:"
_CHIT_CHAT = re.compile(
    r"^(hi|hello|hey|thanks|thank you|ok|okay|bye|good (morning|night|evening)|"
    r"how are you|nice|cool|great|lol)\b[\s!.,]*$",
    re.IGNORECASE,
)
_FILLERS = re.compile(
    r"^(sorry,?\s*i misspoke:?|actually,?|well,?|oh,?|btw,?|by the way,?|also,?|so,?|"
    r"now,?|nowadays,?|these days,?)\s*",
    re.IGNORECASE,
)
_UNSURE = re.compile(
    r"\b(i think|i guess|maybe|probably)\b\s*|\b(might|may|could) be\b", re.IGNORECASE
)
_SURE = re.compile(r",?\s*\b(definitely|for sure|certainly)\b", re.IGNORECASE)
#: "I hate pizza now." says "I hate pizza." as a correction does.
_NOW = re.compile(r",?\s+\b(?:now|nowadays|these days)\b(?=[.!]?$)", re.IGNORECASE)
#: Time words that only mark a change ("anymore") and do not change the claim.
_CHANGE_MARKERS = re.compile(r",?\s+\b(?:now|nowadays|these days|anymore|any more)$")
_OPPOSITES = {"loves": "hates", "hates": "loves", "likes": "dislikes", "dislikes": "likes"}
_PROFILE_PATTERNS: list[tuple[re.Pattern[str], str, str]] = [
    (re.compile(r"^User's name is (\w+)", re.I), "identity", "name"),
    (re.compile(r"^User's wife's name is (\w+)", re.I), "identity", "wife_name"),
    (re.compile(r"^User is allergic to ([\w ]+)", re.I), "constraint", "allergy"),
    (re.compile(r"^User prefers ([\w ]+)", re.I), "preference", "general"),
]


def _statements(message: str) -> list[tuple[str, float]]:
    """The first-person statements of a message, one per clause, with a confidence:
    hedged ("I think…") 0.4, sure ("definitely") 0.95, else 0.9. Questions and
    greetings are not statements."""
    found = []
    for raw in re.split(r"(?<=[.!?])\s+", message):
        sentence = raw.strip()
        if not sentence or sentence.endswith("?") or _CHIT_CHAT.match(sentence):
            continue
        for clause in split_clauses(sentence):
            clause = _NOW.sub("", _FILLERS.sub("", clause))
            confidence = 0.9
            if _UNSURE.search(clause):
                confidence = 0.4
                clause = _UNSURE.sub(lambda m: "is" if m.group(2) else "", clause)
            if _SURE.search(clause):
                confidence = 0.95
                clause = _SURE.sub("", clause)
            if re.match(r"^(i|i'm|i've|i'll|i'd|my)\b", clause, re.IGNORECASE):
                found.append((clause, confidence))
    return found


def _claim(fact: str) -> tuple[list[str], bool]:
    """A third-person fact as (its words in the affirmative, whether it is negated):
    "User no longer likes pizza", "User doesn't like pizza anymore" and "User does not
    like pizza" are (["user", "likes", "pizza"], True)."""
    words = _CHANGE_MARKERS.sub("", fact.lower().rstrip(".!")).split()
    if len(words) >= 4 and words[1:3] == ["no", "longer"]:
        return [words[0], *words[3:]], True
    if len(words) >= 4 and words[1:3] == ["is", "not"]:
        return [words[0], "is", *words[3:]], True
    if len(words) >= 3 and (words[1] == "doesn't" or words[1:3] == ["does", "not"]):
        rest = words[2:] if words[1] == "doesn't" else words[3:]
        return [words[0], third_person_verb(rest[0]), *rest[1:]] if rest else words, True
    return words, False


def _contradicts(new: tuple[list[str], bool], old: tuple[list[str], bool]) -> bool:
    """ "User hates pizza" or "User no longer loves pizza" against "User loves pizza"."""
    (words, negated), (other_words, other_negated) = new, old
    if len(words) < 3 or len(words) != len(other_words) or words[0] != other_words[0]:
        return False
    if words[2:] != other_words[2:]:
        return False
    if words[1] == other_words[1]:
        return negated != other_negated
    return _OPPOSITES.get(words[1]) == other_words[1] and negated == other_negated


def is_task_request(body: dict[str, Any]) -> bool:
    """Whether a chat request is one of Engram's worker tasks (``engram-task:`` prompt)."""
    messages = body.get("messages") or []
    first = messages[0].get("content", "") if messages else ""
    return isinstance(first, str) and first.startswith(_TASK_PREFIX)


class RuleBasedBrain:
    """Answers Engram's worker tasks by simple rules, and chats with scripted replies.

    User chats get ``chat_reply``, then each of ``more_chat_replies`` in turn (the
    last one repeats). Deterministic and dependency-free: for tests, demos and
    write-path benchmarks where a real model is not the point. It understands
    first-person statements ("I love pizza", "My wife's name is Anne"), hedges
    ("I think…" lowers confidence),
    corrections of "<subject> is <value>" facts (UPDATE) and reversals — love/hate,
    like/dislike, "no longer", "doesn't … anymore" — (DELETE), with the usual ways of
    marking a correction ("Actually, …", "… now") set aside, and treats greetings and
    questions as chit-chat.
    """

    def __init__(self, chat_reply: str = "Noted.", *more_chat_replies: str) -> None:
        self.chat_replies = [chat_reply, *more_chat_replies]
        self.chats = 0

    def __call__(self, body: dict[str, Any]) -> str:
        messages = body.get("messages") or []
        if not is_task_request(body):
            reply = self.chat_replies[min(self.chats, len(self.chat_replies) - 1)]
            self.chats += 1
            return reply
        system = messages[0]["content"]
        task = system[len(_TASK_PREFIX) :].split("\n", 1)[0].strip()
        payload = json.loads(messages[1]["content"])
        handler = getattr(self, f"_task_{task}", None)
        if handler is None:
            return json.dumps({"error": f"unknown task {task}"})
        return json.dumps(handler(payload))

    def _task_extract_facts(self, payload: dict[str, Any]) -> dict[str, Any]:
        facts: list[str] = []
        profile: list[dict[str, Any]] = []
        for sentence, confidence in _statements(payload.get("message", "")):
            fact = third_person(sentence)
            if len(facts) < 3:
                facts.append(fact)
            for pattern, category, key in _PROFILE_PATTERNS:
                match = pattern.match(fact)
                if match:
                    profile.append(
                        {
                            "category": category,
                            "key": key,
                            "value": match.group(1).strip(),
                            "confidence": confidence,
                            "importance": 0.8,
                        }
                    )
        return {"facts": facts, "profile": profile}

    def _task_reconcile(self, payload: dict[str, Any]) -> dict[str, Any]:
        existing = {m["id"]: m["text"] for m in payload.get("existing", [])}
        decisions = []
        for index, fact in enumerate(payload.get("new_facts", [])):
            decisions.append({"fact": index, **self._decide(fact, existing)})
        return {"decisions": decisions}

    @staticmethod
    def _decide(fact: str, existing: dict[int, str]) -> dict[str, Any]:
        norm = fact.lower().rstrip(".")
        claim = _claim(fact)
        for mid, text in existing.items():
            other = text.lower().rstrip(".")
            if other == norm:
                return {"event": "NONE", "target": mid}
            if _contradicts(claim, _claim(text)):
                return {"event": "DELETE", "target": mid}
            if " is " in norm and " is " in other:
                subject, _, _ = norm.rpartition(" is ")
                other_subject, _, _ = other.rpartition(" is ")
                # "User's wife's name is …" names one thing; the user alone does not:
                # "User is a teacher" leaves "User is allergic to peanuts" as it was.
                if subject == other_subject and subject != SUBJECT.lower():
                    return {"event": "UPDATE", "target": mid, "text": fact}
        return {"event": "ADD"}

    def _task_summarize(self, payload: dict[str, Any]) -> dict[str, Any]:
        parts = [p for p in re.split(r"(?<=\.)\s+", payload.get("previous_summary", "")) if p]
        for fact in payload.get("new_facts", []):
            sentence = fact.rstrip(".") + "."
            if sentence not in parts:
                parts.append(sentence)
        return {"summary": " ".join(parts)[-2000:]}

    def _task_episode(self, payload: dict[str, Any]) -> dict[str, Any]:
        said = [t["text"].rstrip(".") for t in payload.get("turns", []) if t.get("role") == "user"]
        head = f"Turns {payload.get('first_turn')}-{payload.get('last_turn')}: "
        return {"summary": (head + "; ".join(said))[:2000]}
