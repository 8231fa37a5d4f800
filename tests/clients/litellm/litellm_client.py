"""LiteLLM against Engram, as its users point it at an OpenAI-compatible server:
``litellm.completion(model="openai/<model>", api_base=<gateway>/v1, ...)``, memory
controls in ``extra_body`` and ``extra_headers``, and the user in ``extra_body`` (LiteLLM
drops ``user=`` for a model outside OpenAI's catalog).

Runs in its own locked environment (LiteLLM pins openai<3):
``uv run --project tests/clients/litellm --frozen python litellm_client.py '<json>'``.
The argument names the gateway, model, user, conversation, question and tool; one JSON
object with what each call returned goes to stdout.
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version
from typing import Any

import litellm


def main(config: dict[str, Any]) -> dict[str, Any]:
    common: dict[str, Any] = {
        "model": f"openai/{config['model']}",
        "api_base": config["base_url"],
        "api_key": "sk-matrix",
        "messages": [{"role": "user", "content": config["question"]}],
        # LiteLLM sends `user` only for models in OpenAI's catalog and drops it
        # silently otherwise: with Engram, the user scope goes in extra_body.
        "extra_body": {"user": config["user"], "memory_id": config["conversation"]},
        "extra_headers": {"X-Engram-Memory-Top-K": "3"},
        "num_retries": 0,
    }
    reply = litellm.completion(**common)
    streamed = "".join(
        chunk.choices[0].delta.content or ""
        for chunk in litellm.completion(**common, stream=True)
        if chunk.choices
    )
    called = litellm.completion(**common, tools=[config["tool"]])
    call = called.choices[0].message.tool_calls[0]
    return {
        "version": version("litellm"),
        "completion": {"text": reply.choices[0].message.content},
        "stream": {"text": streamed},
        "tools": {
            "finish_reason": called.choices[0].finish_reason,
            "name": call.function.name,
            "arguments": json.loads(call.function.arguments),
        },
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
