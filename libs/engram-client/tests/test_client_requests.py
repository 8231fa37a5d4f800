"""What the client sends and how it reads answers, against a scripted transport (the
real gateway: tests/e2e/test_python_client.py)."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx2
import pytest
from pydantic import ValidationError

from engram_client import (
    AsyncEngramClient,
    EngramClient,
    EngramError,
    EventTimeout,
    Memory,
    NotFound,
    PreconditionFailed,
    ServiceUnavailable,
)

MEMORY = {"id": "0b7c4f7e-3f2a-4c7e-9a55-3c1f1a0e2b11", "kind": "fact", "text": "User likes tea."}


def scripted(
    answer: Callable[[httpx2.Request], httpx2.Response], seen: list[httpx2.Request]
) -> httpx2.MockTransport:
    def handle(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return answer(request)

    return httpx2.MockTransport(handle)


def test_the_key_the_etag_and_if_match() -> None:
    seen: list[httpx2.Request] = []
    transport = scripted(
        lambda r: httpx2.Response(200, json=MEMORY, headers={"ETag": '"v1"'}), seen
    )
    with EngramClient("http://gw/v1/", "sk-1", transport=transport) as engram:
        memory = engram.get(MEMORY["id"])
        assert memory.etag == '"v1"' and memory.text == "User likes tea."
        engram.patch(memory.id, tags=["drinks"], if_match=memory)
        engram.patch(memory.id, text="User likes green tea.", if_match="*")
    get, by_memory, by_star = seen
    assert str(get.url) == f"http://gw/v1/memories/{MEMORY['id']}"
    assert get.headers["authorization"] == "Bearer sk-1" and "if-match" not in get.headers
    assert by_memory.headers["if-match"] == '"v1"' and json.loads(by_memory.content) == {
        "tags": ["drinks"]
    }
    assert by_star.headers["if-match"] == "*"
    with pytest.raises(ValueError, match="no etag"):
        EngramClient("http://gw").patch(memory.id, text="x", if_match=Memory(**MEMORY))


def test_an_id_is_one_path_segment() -> None:
    seen: list[httpx2.Request] = []
    transport = scripted(lambda r: httpx2.Response(404, json={"error": {"message": "no"}}), seen)
    with EngramClient("http://gw", transport=transport) as engram, pytest.raises(NotFound):
        engram.history("../../v1/users")
    assert seen[0].url.raw_path == b"/v1/memories/..%2F..%2Fv1%2Fusers/history"


def test_list_follows_the_cursor_with_the_same_filters() -> None:
    seen: list[httpx2.Request] = []
    pages = iter(
        [
            {"data": [MEMORY], "has_more": True, "next_cursor": "c1"},
            {"data": [MEMORY], "has_more": False, "next_cursor": None},
        ]
    )
    transport = scripted(lambda r: httpx2.Response(200, json=next(pages)), seen)
    with EngramClient("http://gw", transport=transport) as engram:
        listed = list(engram.list(user="", kinds=["fact", "profile"], tags=["a"], page_size=1))
    assert len(listed) == 2
    first, second = (
        dict(r.url.params.multi_items()) | {"kind": r.url.params.get_list("kind")} for r in seen
    )
    assert first == {"user": "", "kind": ["fact", "profile"], "tag": "a", "limit": "1"}
    assert second == {**first, "cursor": "c1"}


def test_errors_carry_the_apis_code_and_headers() -> None:
    def answer(request: httpx2.Request) -> httpx2.Response:
        if request.method == "DELETE":
            body = {
                "error": {
                    "message": "stale",
                    "type": "x",
                    "param": "If-Match",
                    "code": "precondition_failed",
                }
            }
            return httpx2.Response(412, json=body, headers={"ETag": '"v2"', "X-Request-Id": "r1"})
        return httpx2.Response(502, text="<html>bad gateway</html>")

    with EngramClient("http://gw", transport=scripted(answer, [])) as engram:
        with pytest.raises(PreconditionFailed) as stale:
            engram.delete(MEMORY["id"], if_match='"v1"')
        with pytest.raises(ServiceUnavailable, match="bad gateway") as down:
            engram.get(MEMORY["id"])
    assert (stale.value.code, stale.value.param, stale.value.current_etag) == (
        "precondition_failed",
        "If-Match",
        '"v2"',
    )
    assert stale.value.request_id == "r1" and isinstance(down.value, EngramError)


def test_arguments_the_api_refuses_fail_before_any_request() -> None:
    seen: list[httpx2.Request] = []
    with EngramClient("http://gw", transport=scripted(lambda r: httpx2.Response(200), seen)) as e:
        with pytest.raises(ValidationError, match="memory_top_k"):
            e.search("tea", top_k=0)
        with pytest.raises(ValidationError, match="blank"):
            e.create("tea", user="   ")
    assert seen == []


async def test_wait_gives_up_with_the_last_statuses() -> None:
    pending = {
        "id": "e1",
        "status": "pending",
        "stage": "ingest",
        "accepted_at": None,
        "applied_at": None,
    }
    transport = httpx2.MockTransport(lambda r: httpx2.Response(200, json=pending))
    async with AsyncEngramClient("http://gw", transport=transport) as engram:
        with pytest.raises(EventTimeout, match=r"e1 \(ingest\)") as timed_out:
            await engram.wait(["e1"], timeout_s=0.05, poll_s=0.01)
    assert [e.status for e in timed_out.value.events] == ["pending"]
