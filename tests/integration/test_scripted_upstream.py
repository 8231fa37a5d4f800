"""The scripted upstream's ``GET /requests``: what it received (what Engram sent
upstream), newest last, credentials redacted; ``?limit``, ``DELETE`` and ``keep``."""

from __future__ import annotations

from collections.abc import Iterator

import httpx2
import pytest

from engram_cli.stack.scripted_llm import RuleBasedBrain, ScriptedUpstream


@pytest.fixture
def upstream() -> Iterator[ScriptedUpstream]:
    server = ScriptedUpstream(replies=[RuleBasedBrain("Hi.")], keep=3).start()
    try:
        yield server
    finally:
        server.stop()


def chat(upstream: ScriptedUpstream, text: str) -> None:
    reply = httpx2.post(
        f"{upstream.base_url}/chat/completions",
        json={"model": "m", "messages": [{"role": "user", "content": text}]},
        headers={"Authorization": "Bearer sk-secret-123", "X-Custom": "kept"},
    )
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] == "Hi."


def recorded(upstream: ScriptedUpstream, query: str = "") -> httpx2.Response:
    return httpx2.get(f"http://127.0.0.1:{upstream.port}/requests{query}")


def test_requests_lists_what_was_received_newest_last(upstream: ScriptedUpstream) -> None:
    chat(upstream, "first")
    chat(upstream, "second")
    listed = recorded(upstream).json()
    assert [r["body"]["messages"][0]["content"] for r in listed] == ["first", "second"]
    first = listed[0]
    assert (first["method"], first["path"]) == ("POST", "/v1/chat/completions")
    assert first["headers"]["authorization"] == "Bearer <redacted>"
    assert "sk-secret-123" not in recorded(upstream).text
    assert first["headers"]["x-custom"] == "kept"
    assert first["received_at"] <= listed[1]["received_at"]
    only_last = recorded(upstream, "?limit=1").json()
    assert [r["body"]["messages"][0]["content"] for r in only_last] == ["second"]


def test_keep_bounds_the_memory_and_delete_forgets(upstream: ScriptedUpstream) -> None:
    for n in range(5):
        chat(upstream, f"m{n}")
    assert [r["body"]["messages"][0]["content"] for r in recorded(upstream).json()] == [
        "m2",
        "m3",
        "m4",
    ]
    assert httpx2.delete(f"http://127.0.0.1:{upstream.port}/requests").json() == {"deleted": 3}
    assert recorded(upstream).json() == []
    chat(upstream, "after")  # replies keep coming after the list was cleared
    assert len(recorded(upstream).json()) == 1


@pytest.mark.parametrize("limit", ["0", "-1", "ten"])
def test_a_bad_limit_is_a_400(upstream: ScriptedUpstream, limit: str) -> None:
    response = recorded(upstream, f"?limit={limit}")
    assert response.status_code == 400
    assert "limit" in response.json()["error"]["message"]
