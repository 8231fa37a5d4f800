"""How local models dress their answers: named reply styles for the scripted upstream.

Each style takes a clean JSON answer (what the rule-based brain, or a test, would send)
and returns it the way a family of small or reasoning models writes it: thinking out
loud first (with a draft answer inside, or not), thinking in a separate field, fencing
the JSON, talking around it, writing JSON5 or Python literals, answering with a list;
or not answering usably at all (cut at the token limit, empty, a refusal).
:func:`styled` applies one to the workers' task replies of any scripted reply, chats
untouched, so a test or ``engram scripted-llm --reply-style NAME`` drives the real
stack with it; the workers' parsing of each style is proven in
``services/workers/tests/test_reply_styles.py``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from engram_cli.stack.scripted_llm import Answer, Completion, Reply, is_task_request

Style = Callable[[str], Answer]


def _draft(answer: str) -> str:
    """The answer's shape with every value emptied: what a model guesses, then rejects."""
    value = json.loads(answer)
    if not isinstance(value, dict):
        return "[]"
    return json.dumps({key: type(item)() for key, item in value.items()})


def _think_with_draft(answer: str) -> str:
    # Word for word what issue 36 measured against a reasoning model's preamble.
    return (
        "<think>\nThe user said something. Maybe the answer is "
        f"{_draft(answer)}? No, wait, let me check again what they said before answering."
        f"\n</think>\n\n{answer}"
    )


def _think(answer: str) -> str:
    return (
        "<think>\nLet me read the input carefully and answer with the JSON the schema "
        f"asks for.\n</think>\n\n{answer}"
    )


def _think_opened_by_template(answer: str) -> str:
    # DeepSeek-R1's chat template writes the opening tag itself.
    return (
        f"Okay, a first guess would be {_draft(answer)}. Hmm, that misses what they "
        f"said.\n</think>\n\n{answer}"
    )


def _thinking_tags(answer: str) -> str:
    draft = _draft(answer)
    return f"<thinking>\nThe schema wants JSON; {draft} is empty, so no.\n</thinking>\n{answer}"


def _think_never_closed(answer: str) -> str:
    return f"<think>\nMaybe {_draft(answer)}? No: what they said is\n{answer}"


def _harmony(answer: str) -> str:
    # gpt-oss's channels, when a server passes them through unparsed.
    return (
        f"<|channel|>analysis<|message|>Draft: {_draft(answer)}. Not right.<|end|>"
        f"<|start|>assistant<|channel|>final<|message|>{answer}<|return|>"
    )


def _reasoning_field(answer: str) -> Completion:
    return Completion(answer, reasoning=f"A first draft: {_draft(answer)}. No, wait.")


def _answer_in_reasoning(answer: str) -> Completion:
    # A server that put the whole reply in the reasoning channel: the last resort.
    return Completion(
        "",
        reasoning=f"Maybe {_draft(answer)}? No. The answer is:\n{answer}",
        reasoning_field="reasoning",
    )


def _list(answer: str) -> str:
    """The answer's first non-empty list alone (a bare list of facts or decisions); an
    answer without one, inside a list."""
    value = json.loads(answer)
    for item in value.values() if isinstance(value, dict) else ():
        if isinstance(item, list) and item:
            return json.dumps(item)
    return f"[{answer}]"


def _json5(answer: str) -> str:
    """Trailing commas, a comment, single-quoted keys."""
    text = json.dumps(json.loads(answer), indent=2, ensure_ascii=False)
    text = re.sub(r'^(\s*)"(\w+)":', r"\1'\2':", text, flags=re.MULTILINE)
    text = re.sub(r"([^\s\[{,])(\n\s*[\]}])", r"\1,\2", text)
    return text.replace("{\n", "{\n  // what the user said, as asked\n", 1)


def _python(answer: str) -> str:
    """Python's repr: single quotes, True, False, None."""
    return repr(_with_python_literals(json.loads(answer)))


def _with_python_literals(value: Any) -> Any:
    if isinstance(value, dict):
        items = {key: _with_python_literals(item) for key, item in value.items()}
        return {"note": None, "sure": True, **items}
    if isinstance(value, list):
        return [_with_python_literals(v) for v in value]
    return value


REPLY_STYLES: dict[str, Style] = {
    "plain": lambda answer: answer,
    "think_with_draft": _think_with_draft,
    "think": _think,
    "think_opened_by_template": _think_opened_by_template,
    "thinking_tags": _thinking_tags,
    "think_never_closed": _think_never_closed,
    "harmony": _harmony,
    "reasoning_field": _reasoning_field,
    "answer_in_reasoning": _answer_in_reasoning,
    "fence_json": lambda answer: f"```json\n{answer}\n```",
    "fence_bare": lambda answer: f"```\n{answer}\n```",
    "prose_around": lambda answer: (
        f"Sure! Here is the JSON you asked for:\n{answer}\nLet me know if you need more."
    ),
    "list": _list,
    "object_in_list": lambda answer: f"[{answer}]",
    "json5": _json5,
    "python_literals": _python,
    "truncated": lambda answer: Completion(answer[: len(answer) // 2], finish_reason="length"),
    "empty": lambda answer: "",
    "refusal": lambda answer: "I'm sorry, but I can't help with that request.",
}
#: The styles no parser should take an answer from: each must end in the task's fallback.
UNUSABLE_STYLES = frozenset({"truncated", "empty", "refusal"})


def styled(reply: Reply, style: str) -> Callable[[dict[str, Any]], Answer]:
    """``reply`` with its task answers (``engram-task:`` prompts) dressed in ``style``."""
    dress = REPLY_STYLES[style]

    def answer(body: dict[str, Any]) -> Answer:
        text = reply(body) if callable(reply) else reply
        return dress(text) if is_task_request(body) and isinstance(text, str) else text

    return answer
