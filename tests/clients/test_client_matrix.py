"""The client matrix: the clients people point at Engram, each in the modes they use,
against one real stack (`engram up`'s gateway and retrieval processes, a real
nats-server) and a recording scripted upstream.

For every case: what the client gets back (the reply, streamed or not, tool calls,
headers, ``memory_hits``) and what reached the upstream, read from its
``GET /requests``: the memory controls stripped (body fields and ``X-Engram-*``
headers), one memory message injected right before the question, the caller's
``tools`` / ``response_format`` / ``user`` unchanged, no SDK call option forwarded.
Each client sends its memory controls the way its users would (``extra_body``, extra
fields, headers).

Clients: openai-python (sync and async: ``create``, ``create(stream=True)``,
``with_raw_response``, ``with_streaming_response``, tools, ``response_format``),
LangChain's ``ChatOpenAI`` (``invoke``, ``stream``, ``bind_tools``), LiteLLM's
``completion`` with ``api_base`` (its own locked environment: it pins openai<3), and the
official ``openai`` npm package (``create``, stream, ``.withResponse()``) under node.

The other APIs (issue 31): openai-python's ``responses.create`` (plain, streamed, a
function tool, a follow-up on ``previous_response_id``), the OpenAI Agents SDK running an
agent with one tool, the ``anthropic`` SDK's ``messages.create`` and ``messages.stream``
(``system`` as a string and as blocks, a tool), the ``ollama`` client's ``chat`` (plain
and streamed), and a fact told through one API recalled through the others (a stack
with its workers, so what is said is learned).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import openai
import pytest
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_openai import ChatOpenAI

from engram_cli.cli_common import CliSettings
from engram_cli.stack.nats_server import free_port
from engram_cli.stack.scripted_llm import ScriptedUpstream, ToolCall
from engram_cli.stack.up import Stack

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CLIENTS = Path(__file__).resolve().parent
MODEL = "matrix-model"
QUESTION = "What is my favourite colour?"
FACT = "User's favourite colour is teal."
ANSWER = "Your favourite colour is teal."
JSON_ANSWER = '{"colour": "teal"}'
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
RESPONSE_FORMAT: dict[str, Any] = {
    "type": "json_schema",
    "json_schema": {
        "name": "colour",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"colour": {"type": "string"}},
            "required": ["colour"],
            "additionalProperties": False,
        },
    },
}


def _answers_a_tool_result(body: dict[str, Any]) -> bool:
    """A Responses or Messages request handing back a tool's result: time to answer."""
    items = body.get("input")
    if isinstance(items, list) and items and isinstance(items[-1], dict):
        return items[-1].get("type") == "function_call_output"
    messages = body.get("messages") or [{}]
    content = messages[-1].get("content") if isinstance(messages[-1], dict) else None
    return isinstance(content, list) and any(
        isinstance(block, dict) and block.get("type") == "tool_result" for block in content
    )


def matrix_reply(body: dict[str, Any]) -> str | ToolCall:
    if _answers_a_tool_result(body):
        return ANSWER
    if body.get("tools"):
        return ToolCall("get_weather", {"city": "Lisbon"})
    if body.get("response_format"):
        return JSON_ANSWER
    return ANSWER


# --- the stack ------------------------------------------------------------------------


@dataclass
class Scope:
    user: str
    conversation: str


@dataclass
class Matrix:
    gateway: str  # base URL, no /v1
    upstream: ScriptedUpstream

    @property
    def base_url(self) -> str:
        return f"{self.gateway}/v1"

    def seed(self, scope: Scope) -> None:
        """The one memory every question of this scope should recall; nothing recorded."""
        created = httpx2.post(
            f"{self.base_url}/memories",
            json={"text": FACT, "user": scope.user, "conversation": scope.conversation},
            timeout=30,
        )
        assert created.status_code == 201, created.text
        httpx2.delete(f"{self._recorder}").raise_for_status()

    @property
    def _recorder(self) -> str:
        return f"http://127.0.0.1:{self.upstream.port}/requests"

    def received(self, path: str = "/v1/chat/completions") -> list[dict[str, Any]]:
        """The requests on ``path`` that reached the upstream since ``seed``, oldest first."""
        listed = httpx2.get(self._recorder, timeout=10).json()
        return [r for r in listed if r["path"] == path]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Matrix]:
    upstream = ScriptedUpstream(replies=[matrix_reply], model=MODEL).start()
    retrieval = f"127.0.0.1:{free_port()}"
    settings = CliSettings(
        data_dir=tmp_path_factory.mktemp("matrix"),
        nats_url=f"nats://127.0.0.1:{free_port()}",
        gateway_host="127.0.0.1",
        gateway_port=free_port(),
        retrieval_listen=retrieval,
        retrieval_address=retrieval,
    )
    stack = Stack(
        settings,
        echo=lambda _: None,
        relay_logs=False,
        workers=(),  # what reaches the upstream is the point; nothing needs learning
        extra_env={"ENGRAM_LLM_BASE_URL": upstream.base_url, "ENGRAM_LOG_FORMAT": "json"},
    )
    try:
        stack.start()
        yield Matrix(settings.local_gateway_url, upstream)
    finally:
        stack.stop()
        upstream.stop()


@pytest.fixture
def scope(matrix: Matrix, request: pytest.FixtureRequest) -> Scope:
    name = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:60]
    seeded = Scope(user=f"user-{name}", conversation=f"conv-{name}")
    matrix.seed(seeded)
    return seeded


# --- what reached the upstream ----------------------------------------------------------


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def assert_forwarded(
    request: dict[str, Any],
    scope: Scope,
    *,
    stream: bool,
    tools: list[dict[str, Any]] | None = None,
    response_format: dict[str, Any] | None = None,
) -> None:
    body, headers = request["body"], request["headers"]
    assert not [k for k in body if k.startswith("memory")], body  # controls stripped
    assert not [h for h in headers if h.startswith("x-engram-")], headers
    assert "x-stainless-raw-response" not in headers  # the caller's SDK option stays home
    assert body["model"] == MODEL and body.get("user") == scope.user
    assert bool(body.get("stream")) is stream
    messages = body["messages"]
    assert messages[-1]["role"] == "user" and text_of(messages[-1]) == QUESTION
    injected = messages[-2]
    assert injected["role"] == "system" and FACT.rstrip(".") in injected["content"]
    assert [m["role"] for m in messages].count("system") == 1
    assert body.get("tools") == tools
    assert body.get("response_format") == response_format


def assert_engram_headers(headers: Any) -> None:
    assert headers["x-request-id"]
    assert headers["x-engram-memory"] == "used"
    assert int(headers["x-engram-memory-hits"]) >= 1


def recalled(payload: dict[str, Any]) -> list[str]:
    return [hit["text"] for hit in payload.get("memory_hits") or []]


def first_chunk_hits(chunks: list[Any]) -> None:
    """Streamed ``memory_hits`` ride on the first chunk once they exist: if present, right."""
    extra = (chunks[0].model_extra or {}) if chunks else {}
    if "memory_hits" in extra:
        assert FACT in [hit["text"] for hit in extra["memory_hits"]]


# --- openai-python -------------------------------------------------------------------------

OPENAI_MODES = [
    "create",
    "stream",
    "raw",
    "raw_stream",
    "streaming",
    "tools",
    "tools_stream",
    "response_format",
]


def _openai_kwargs(scope: Scope, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": QUESTION}],
        "user": scope.user,
        "extra_body": {"memory_id": scope.conversation},
        **extra,
    }


def streamed_tool_call(chunks: list[Any]) -> tuple[str, dict[str, Any], str]:
    """(name, arguments, finish_reason) of the one tool call a stream carries."""
    name, arguments, finish = "", "", ""
    for chunk in chunks:
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or ():
                name += call.function.name or ""
                arguments += call.function.arguments or ""
            finish = choice.finish_reason or finish
    return name, json.loads(arguments), finish


def _check_openai_mode(mode: str, result: Any, matrix: Matrix, scope: Scope) -> None:
    (sent,) = matrix.received()
    stream = mode in ("stream", "raw_stream", "streaming", "tools_stream")
    if mode == "tools_stream":
        assert streamed_tool_call(result) == ("get_weather", {"city": "Lisbon"}, "tool_calls")
        assert_forwarded(sent, scope, stream=True, tools=[WEATHER_TOOL])
        return
    if mode == "tools":
        message = result.choices[0].message
        assert result.choices[0].finish_reason == "tool_calls"
        assert message.tool_calls[0].function.name == "get_weather"
        assert json.loads(message.tool_calls[0].function.arguments) == {"city": "Lisbon"}
        assert_forwarded(sent, scope, stream=False, tools=[WEATHER_TOOL])
        return
    if mode == "response_format":
        assert json.loads(result.choices[0].message.content) == {"colour": "teal"}
        assert_forwarded(sent, scope, stream=False, response_format=RESPONSE_FORMAT)
        return
    assert result == ANSWER
    assert_forwarded(sent, scope, stream=stream)


def _sync_openai(client: openai.OpenAI, mode: str, scope: Scope) -> Any:
    create = client.chat.completions.create
    if mode == "create":
        completion = create(**_openai_kwargs(scope))
        assert FACT in recalled(completion.model_dump())
        return completion.choices[0].message.content
    if mode == "stream":
        chunks = list(create(**_openai_kwargs(scope, stream=True)))
        first_chunk_hits(chunks)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    if mode == "raw":
        raw = client.chat.completions.with_raw_response.create(**_openai_kwargs(scope))
        assert_engram_headers(raw.headers)
        return raw.parse().choices[0].message.content
    if mode == "raw_stream":
        raw = client.chat.completions.with_raw_response.create(**_openai_kwargs(scope, stream=True))
        assert_engram_headers(raw.headers)
        return "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    if mode == "streaming":
        with client.chat.completions.with_streaming_response.create(
            **_openai_kwargs(scope, stream=True)
        ) as response:
            assert_engram_headers(response.headers)
            chunks = list(response.parse())
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    if mode == "tools":
        return create(**_openai_kwargs(scope, tools=[WEATHER_TOOL]))
    if mode == "tools_stream":
        return list(create(**_openai_kwargs(scope, tools=[WEATHER_TOOL], stream=True)))
    return create(**_openai_kwargs(scope, response_format=RESPONSE_FORMAT))


async def _async_openai(client: openai.AsyncOpenAI, mode: str, scope: Scope) -> Any:
    create = client.chat.completions.create
    if mode == "create":
        completion = await create(**_openai_kwargs(scope))
        assert FACT in recalled(completion.model_dump())
        return completion.choices[0].message.content
    if mode == "stream":
        chunks = [c async for c in await create(**_openai_kwargs(scope, stream=True))]
        first_chunk_hits(chunks)
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    if mode == "raw":
        raw = await client.chat.completions.with_raw_response.create(**_openai_kwargs(scope))
        assert_engram_headers(raw.headers)
        return raw.parse().choices[0].message.content
    if mode == "raw_stream":
        raw = await client.chat.completions.with_raw_response.create(
            **_openai_kwargs(scope, stream=True)
        )
        assert_engram_headers(raw.headers)
        return "".join([c.choices[0].delta.content or "" async for c in raw.parse() if c.choices])
    if mode == "streaming":
        async with client.chat.completions.with_streaming_response.create(
            **_openai_kwargs(scope, stream=True)
        ) as response:
            assert_engram_headers(response.headers)
            chunks = [c async for c in await response.parse()]
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    if mode == "tools":
        return await create(**_openai_kwargs(scope, tools=[WEATHER_TOOL]))
    if mode == "tools_stream":
        return [
            c
            async for c in await create(**_openai_kwargs(scope, tools=[WEATHER_TOOL], stream=True))
        ]
    return await create(**_openai_kwargs(scope, response_format=RESPONSE_FORMAT))


@pytest.mark.parametrize("mode", OPENAI_MODES)
def test_openai_python_sync(matrix: Matrix, scope: Scope, mode: str) -> None:
    with openai.OpenAI(base_url=matrix.base_url, api_key="sk-matrix", max_retries=0) as client:
        result = _sync_openai(client, mode, scope)
    _check_openai_mode(mode, result, matrix, scope)


@pytest.mark.parametrize("mode", OPENAI_MODES)
async def test_openai_python_async(matrix: Matrix, scope: Scope, mode: str) -> None:
    async with openai.AsyncOpenAI(
        base_url=matrix.base_url, api_key="sk-matrix", max_retries=0
    ) as client:
        result = await _async_openai(client, mode, scope)
    _check_openai_mode(mode, result, matrix, scope)


# --- LangChain ----------------------------------------------------------------------------


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"Sunny in {city}"


def _chat_model(matrix: Matrix, scope: Scope) -> ChatOpenAI:
    # LangChain users pass the user in model_kwargs and Engram's controls as headers or
    # extra_body; both ways here.
    return ChatOpenAI(
        model=MODEL,
        base_url=matrix.base_url,
        api_key="sk-matrix",
        max_retries=0,
        model_kwargs={"user": scope.user},
        extra_body={"memory_id": scope.conversation},
        default_headers={"X-Engram-Memory-Top-K": "3"},
    )


def test_langchain_chat_openai(matrix: Matrix, scope: Scope) -> None:
    model = _chat_model(matrix, scope)
    assert model.invoke(QUESTION).content == ANSWER
    streamed = "".join(str(chunk.content) for chunk in model.stream(QUESTION))
    assert streamed == ANSWER
    called = model.bind_tools([get_weather]).invoke(QUESTION)
    assert [(c["name"], c["args"]) for c in called.tool_calls] == [
        ("get_weather", {"city": "Lisbon"})
    ]
    invoked, stream, tools = matrix.received()
    assert_forwarded(invoked, scope, stream=False)
    assert_forwarded(stream, scope, stream=True)
    assert_forwarded(tools, scope, stream=False, tools=[convert_to_openai_tool(get_weather)])


# --- LiteLLM (its own locked environment) --------------------------------------------------


def _uv() -> str | None:
    found = shutil.which("uv")
    bootstrapped = REPO / ".tools" / "bin" / "uv"
    return found or (str(bootstrapped) if bootstrapped.exists() else None)


@pytest.fixture(scope="module")
def litellm_runner() -> list[str]:
    uv = _uv()
    if uv is None:
        pytest.skip("LiteLLM runs in its own uv project and no uv was found (make test has one)")
    project = CLIENTS / "litellm"
    env = {**os.environ, "UV_PYTHON_DOWNLOADS": "never"}
    installed = subprocess.run(
        [uv, "sync", "--project", str(project), "--frozen", "--quiet"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if installed.returncode != 0:
        pytest.skip(f"LiteLLM could not be installed from its lock: {installed.stderr[-500:]}")
    return [uv, "run", "--project", str(project), "--frozen", "--no-sync", "python"]


def test_litellm_completion_with_api_base(
    matrix: Matrix, scope: Scope, litellm_runner: list[str]
) -> None:
    config = {
        "base_url": matrix.base_url,
        "model": MODEL,
        "user": scope.user,
        "conversation": scope.conversation,
        "question": QUESTION,
        "tool": WEATHER_TOOL,
    }
    result = _run_client(
        [*litellm_runner, str(CLIENTS / "litellm" / "litellm_client.py"), json.dumps(config)],
        # LiteLLM would fetch its model price list from GitHub at import.
        {"LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    assert result["completion"]["text"] == ANSWER
    assert result["stream"]["text"] == ANSWER
    assert result["tools"] == {
        "finish_reason": "tool_calls",
        "name": "get_weather",
        "arguments": {"city": "Lisbon"},
    }
    completion, stream, tools = matrix.received()
    assert_forwarded(completion, scope, stream=False)
    assert_forwarded(stream, scope, stream=True)
    assert_forwarded(tools, scope, stream=False, tools=[WEATHER_TOOL])


# --- the openai npm package under node ----------------------------------------------------


@pytest.fixture(scope="module")
def node_modules() -> Path:
    """``npm ci`` of tests/clients/node's lock, into a cache under .tools/ that later runs
    reuse (keyed by the lock's hash)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node/npm not on this machine (CI has node 20): the npm client is not run")
    lock = (CLIENTS / "node" / "package-lock.json").read_bytes()
    cache = REPO / ".tools" / "clients" / f"node-{hashlib.sha256(lock).hexdigest()[:16]}"
    modules = cache / "node_modules"
    if not (modules / "openai" / "package.json").exists():
        cache.mkdir(parents=True, exist_ok=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copyfile(CLIENTS / "node" / name, cache / name)
        installed = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=cache,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if installed.returncode != 0:
            shutil.rmtree(modules, ignore_errors=True)
            pytest.skip(f"npm ci of the openai package failed: {installed.stderr[-500:]}")
    return modules


def test_openai_npm_package(matrix: Matrix, scope: Scope, node_modules: Path) -> None:
    config = {
        "base_url": matrix.base_url,
        "model": MODEL,
        "user": scope.user,
        "conversation": scope.conversation,
        "question": QUESTION,
    }
    result = _run_client(
        ["node", str(CLIENTS / "node" / "openai_client.cjs"), json.dumps(config)],
        {"NODE_PATH": str(node_modules)},
    )
    assert result["create"]["text"] == ANSWER and FACT in result["create"]["memory_hits"]
    assert result["stream"]["text"] == ANSWER
    if result["stream"]["first_chunk_hits"]:
        assert FACT in result["stream"]["first_chunk_hits"]
    assert result["with_response"] == {
        "text": ANSWER,
        "status": 200,
        "request_id": result["with_response"]["request_id"],
        "memory": "used",
    }
    assert result["with_response"]["request_id"]
    created, stream, with_response = matrix.received()
    assert_forwarded(created, scope, stream=False)
    assert_forwarded(stream, scope, stream=True)
    assert_forwarded(with_response, scope, stream=False)


def _run_client(command: list[str], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run(
        command,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{command[0]} failed:\n{done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{Path(command[-2]).name}: client version {result['version']}", file=sys.stderr)
    return result


# --- the other APIs: what reached the upstream --------------------------------------------


def assert_controls_stripped(request: dict[str, Any]) -> None:
    body, headers = request["body"], request["headers"]
    assert not [k for k in body if k.startswith("memory")], body
    assert not [h for h in headers if h.startswith("x-engram-")], headers
    assert "x-stainless-raw-response" not in headers


def assert_responses_forwarded(
    request: dict[str, Any], scope: Scope, *, stream: bool, tools: Any = None
) -> None:
    """Memory appended to ``instructions``; the input, user and tools as the SDK sent them."""
    assert_controls_stripped(request)
    body = request["body"]
    assert body["model"] == MODEL and body.get("user") == scope.user
    assert bool(body.get("stream")) is stream
    assert FACT.rstrip(".") in body["instructions"]
    assert body.get("tools") == tools


def _responses_kwargs(scope: Scope, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "input": QUESTION,
        "user": scope.user,
        "extra_body": {"memory_id": scope.conversation},
        **extra,
    }


RESPONSES_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": WEATHER_TOOL["function"]["parameters"],
    "strict": False,
}


def test_openai_python_responses(matrix: Matrix, scope: Scope) -> None:
    with openai.OpenAI(base_url=matrix.base_url, api_key="sk-matrix", max_retries=0) as client:
        created = client.responses.create(**_responses_kwargs(scope))
        assert created.output_text == ANSWER
        assert FACT in recalled(created.model_dump())

        with client.responses.stream(**_responses_kwargs(scope)) as stream:
            streamed = "".join(
                event.delta for event in stream if event.type == "response.output_text.delta"
            )
            final = stream.get_final_response()
        assert streamed == ANSWER and final.output_text == ANSWER

        called = client.responses.create(**_responses_kwargs(scope, tools=[RESPONSES_TOOL]))
        (call,) = [item for item in called.output if item.type == "function_call"]
        assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Lisbon"})

        follow_up = client.responses.create(
            **_responses_kwargs(
                scope,
                previous_response_id=called.id,
                input=[
                    {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}
                ],
                tools=[RESPONSES_TOOL],
            )
        )
        assert follow_up.output_text == ANSWER

    plain, streamed_request, tool_request, chained = matrix.received("/v1/responses")
    assert_responses_forwarded(plain, scope, stream=False)
    assert plain["body"]["input"] == QUESTION
    assert_responses_forwarded(streamed_request, scope, stream=True)
    assert_responses_forwarded(tool_request, scope, stream=False, tools=[RESPONSES_TOOL])
    # The chained follow-up carries a tool's result, not the person's words: nothing to
    # search for, so nothing injected, and the body goes as it was sent.
    assert_controls_stripped(chained)
    assert chained["body"]["previous_response_id"] == called.id
    assert "instructions" not in chained["body"]
    assert chained["body"]["input"] == [
        {"type": "function_call_output", "call_id": call.call_id, "output": "Sunny"}
    ]


async def test_openai_agents_sdk_runs_an_agent_with_a_tool(matrix: Matrix, scope: Scope) -> None:
    from agents import (
        Agent,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)  # the SDK would export its traces to OpenAI
    looked_up: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        looked_up.append(city)
        return f"Sunny in {city}"

    client = openai.AsyncOpenAI(base_url=matrix.base_url, api_key="sk-matrix", max_retries=0)
    agent = Agent(
        name="assistant",
        instructions="You are helpful.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=MODEL, openai_client=client),
        model_settings=ModelSettings(
            extra_body={"user": scope.user},
            extra_headers={"X-Engram-Memory-Id": scope.conversation},
        ),
    )
    result = await Runner.run(agent, QUESTION)
    await client.close()
    assert result.final_output == ANSWER and looked_up == ["Lisbon"]
    first, second = matrix.received("/v1/responses")
    for request in (first, second):
        assert_controls_stripped(request)
        assert request["body"]["user"] == scope.user
        assert request["body"]["instructions"].startswith("You are helpful.\n\n")
        assert FACT.rstrip(".") in request["body"]["instructions"]
    # The agent resends the whole run: the question, the call and its result.
    kinds = [item.get("type", "message") for item in second["body"]["input"]]
    assert kinds == ["message", "function_call", "function_call_output"]


ANTHROPIC_TOOL: dict[str, Any] = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": WEATHER_TOOL["function"]["parameters"],
}


def _messages_kwargs(scope: Scope, system: Any, **extra: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "max_tokens": 256,
        "system": system,
        "messages": [{"role": "user", "content": QUESTION}],
        "metadata": {"user_id": scope.user},
        "extra_body": {"memory_id": scope.conversation},
        **extra,
    }


def test_anthropic_sdk_messages(matrix: Matrix, scope: Scope) -> None:
    import anthropic

    blocks = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    with anthropic.Anthropic(base_url=matrix.gateway, api_key="sk-matrix", max_retries=0) as client:
        created = client.messages.create(**_messages_kwargs(scope, "Be brief."))
        assert created.content[0].text == ANSWER
        assert FACT in recalled(created.model_dump())
        with client.messages.stream(**_messages_kwargs(scope, blocks)) as stream:
            streamed = "".join(stream.text_stream)
        assert streamed == ANSWER
        called = client.messages.create(
            **_messages_kwargs(scope, "Be brief.", tools=[ANTHROPIC_TOOL])
        )
        assert called.stop_reason == "tool_use"
        (use,) = [block for block in called.content if block.type == "tool_use"]
        assert (use.name, use.input) == ("get_weather", {"city": "Lisbon"})

    as_string, as_blocks, with_tool = matrix.received("/v1/messages")
    for request in (as_string, as_blocks, with_tool):
        assert_controls_stripped(request)
        body = request["body"]
        assert body["model"] == MODEL and body["metadata"] == {"user_id": scope.user}
        assert body["messages"] == [{"role": "user", "content": QUESTION}]
        assert request["headers"]["anthropic-version"]
    assert as_string["body"]["system"].startswith("Be brief.\n\n")
    assert FACT.rstrip(".") in as_string["body"]["system"]
    assert as_blocks["body"]["system"][:-1] == blocks
    assert FACT.rstrip(".") in as_blocks["body"]["system"][-1]["text"]
    assert as_blocks["body"]["stream"] is True
    assert with_tool["body"]["tools"] == [ANTHROPIC_TOOL]


def test_ollama_client_chat(matrix: Matrix, scope: Scope) -> None:
    import ollama

    headers = {"X-OpenWebUI-User-Id": scope.user, "X-Engram-Memory-Id": scope.conversation}
    messages = [{"role": "user", "content": QUESTION}]
    with ollama.Client(host=matrix.gateway, headers=headers) as client:
        assert client.chat(model=MODEL, messages=messages).message.content == ANSWER
        parts = client.chat(model=MODEL, messages=messages, stream=True)
        assert "".join(part.message.content or "" for part in parts) == ANSWER
    plain, streamed = matrix.received("/api/chat")
    for request, stream in ((plain, False), (streamed, True)):
        assert_controls_stripped(request)
        body = request["body"]
        assert body["model"] == MODEL and body["stream"] is stream
        injected, question = body["messages"]
        assert injected["role"] == "system" and FACT.rstrip(".") in injected["content"]
        assert question == {"role": "user", "content": QUESTION}


# --- one person, four APIs --------------------------------------------------------------


@pytest.fixture(scope="module")
def learning_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Matrix]:
    """A stack with its workers (the rule-based brain learns what is said)."""
    from engram_testing.stack import start_stack

    stack, upstream = start_stack(tmp_path_factory.mktemp("cross") / "data")
    try:
        yield Matrix(stack.settings.local_gateway_url, upstream)
    finally:
        stack.stop()
        upstream.stop()


def _until_recalled(stack: Matrix, user: str, query: str, text: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = httpx2.post(
            f"{stack.base_url}/memories/search",
            json={"query": query, "user": user, "conversation": "cross"},
            timeout=10,
        ).json()
        if any(text in hit["text"] for hit in found.get("hits", [])):
            return
        time.sleep(0.25)
    raise AssertionError(f"{text!r} never became recallable for {user}")


def test_a_fact_told_through_one_api_is_recalled_through_the_others(
    learning_stack: Matrix,
) -> None:
    import anthropic
    import ollama

    stack, user = learning_stack, "user-cross-protocol"
    engram = {"X-Engram-Memory-Id": "cross"}
    with openai.OpenAI(base_url=stack.base_url, api_key="sk-x", max_retries=0) as client:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "My favourite colour is teal."}],
            user=user,
            extra_headers=engram,
        )
        _until_recalled(stack, user, "favourite colour", "teal")
        client.responses.create(model=MODEL, input=QUESTION, user=user, extra_headers=engram)
    with anthropic.Anthropic(base_url=stack.gateway, api_key="sk-x", max_retries=0) as claude:
        claude.messages.create(
            model=MODEL,
            max_tokens=64,
            messages=[{"role": "user", "content": QUESTION}],
            metadata={"user_id": user},
            extra_headers=engram,
        )
    with ollama.Client(
        host=stack.gateway, headers={**engram, "X-OpenWebUI-User-Id": user}
    ) as local:
        local.chat(model=MODEL, messages=[{"role": "user", "content": QUESTION}])
    (responses,) = stack.upstream.api_requests("/v1/responses")
    (messages,) = stack.upstream.api_requests("/v1/messages")
    (ollama_chat,) = stack.upstream.api_requests("/api/chat")
    assert "teal" in responses["instructions"]
    assert "teal" in messages["system"]
    assert ollama_chat["messages"][0]["role"] == "system"
    assert "teal" in ollama_chat["messages"][0]["content"]

    # ... and back: told through Messages, recalled through Chat Completions.
    with anthropic.Anthropic(base_url=stack.gateway, api_key="sk-x", max_retries=0) as claude:
        claude.messages.create(
            model=MODEL,
            max_tokens=64,
            messages=[{"role": "user", "content": "My dog is called Rex."}],
            metadata={"user_id": user},
            extra_headers=engram,
        )
    _until_recalled(stack, user, "dog name", "Rex")
    with openai.OpenAI(base_url=stack.base_url, api_key="sk-x", max_retries=0) as client:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "What is my dog called?"}],
            user=user,
            extra_headers=engram,
        )
    asked = stack.upstream.conversation_requests()[-1]["messages"]
    assert asked[-2]["role"] == "system" and "Rex" in asked[-2]["content"]
