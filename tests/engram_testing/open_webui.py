"""What the real Open WebUI sends to its OpenAI connection, replayed against a gateway.

The captures under ``tests/fixtures/open_webui/<version>/`` were recorded from a real
Open WebUI (its README says how); each holds the requests of one scenario in the order
they arrived, headers and bodies as sent, secrets removed. :func:`capture` reads one,
:func:`replay` sends one request of it to a gateway as Open WebUI would have.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "open_webui"
#: The Open WebUI release the captures came from.
OPEN_WEBUI_VERSION = "0.12.4"
CHAT_ID_HEADER = "x-openwebui-chat-id"
USER_ID_HEADER = "x-openwebui-user-id"
USER_NAME_HEADER = "x-openwebui-user-name"


@dataclass(frozen=True)
class CapturedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any

    @property
    def is_chat(self) -> bool:
        return self.path.endswith("/chat/completions")

    @property
    def chat_id(self) -> str:
        return self.headers.get(CHAT_ID_HEADER, "")

    @property
    def user_id(self) -> str:
        return self.headers.get(USER_ID_HEADER, "")

    @property
    def last_user_text(self) -> str:
        users = [m for m in self.body.get("messages", []) if m.get("role") == "user"]
        content = users[-1]["content"] if users else ""
        return content if isinstance(content, str) else ""

    @property
    def is_background_task(self) -> bool:
        """A title / tags / follow-up / query task: a '### Task:' around the pasted history."""
        text = self.last_user_text
        return text.startswith("### Task:") and "<chat_history>" in text


def capture(scenario: str, version: str = OPEN_WEBUI_VERSION) -> list[CapturedRequest]:
    recorded = json.loads((FIXTURES / version / f"{scenario}.json").read_text(encoding="utf-8"))
    assert recorded["open_webui_version"] == version
    return [
        CapturedRequest(r["method"], r["path"], dict(r["headers"]), r["body"])
        for r in recorded["requests"]
    ]


async def replay(
    client: httpx2.AsyncClient,
    request: CapturedRequest,
    *,
    headers: dict[str, Any] | None = None,
) -> httpx2.Response:
    """Send ``request`` to the gateway behind ``client`` (its ``/v1`` path, its headers
    with ``headers`` on top, its body); a streamed reply is read to its end."""
    sent = {name: value for name, value in request.headers.items() if name != "accept-encoding"}
    sent.update(headers or {})
    if request.method == "GET":
        return await client.get(request.path, headers=sent)
    return await client.request(
        request.method, request.path, headers=sent, content=json.dumps(request.body).encode()
    )
