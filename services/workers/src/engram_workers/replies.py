"""A model's reply read as a task's answer, the way local models really write it.

Small and reasoning models (qwen3, deepseek-r1, gpt-oss, phi, llama served by Ollama,
LM Studio, vLLM) rarely answer with bare JSON: they think out loud first, fence the
answer, talk around it, or write JSON5. :func:`parse_reply` turns what they send into
the task's output model, or raises :class:`UnusableReply` saying why:

1. **Reasoning is set apart.** ``<think>…</think>``, ``<thinking>…`` and
   ``<reasoning>…`` blocks; a closing tag whose opener the chat template wrote (all
   before it is reasoning); an opener never closed (all after it is reasoning); gpt-oss's
   ``analysis`` channel when served raw. The answer is looked for in what is left.
2. **Every balanced JSON value is a candidate**: fenced blocks first (with or without a
   language), then each complete ``{…}`` or ``[…]`` of the text, the last one first (a
   model's final answer comes after its drafts), each followed by the values nested in it.
3. **Each is parsed strictly, then leniently**: ``json_repair`` reads trailing commas,
   single quotes, comments, unquoted keys and Python's ``True``/``None`` — only in a
   candidate that quotes its strings, so ``[No facts]`` never becomes a fact.
4. **The first candidate that validates wins.** An object must name at least one field
   of the schema (so a draft ``{}`` or a profile entry is not taken for the answer); a
   list where the schema has list fields is tried as each of them (a bare list of facts).
   A value that does not validate is never accepted.
5. **The reasoning is the last resort**: searched the same way (the reply's
   ``reasoning_content`` / ``reasoning`` field included) only when nothing is left
   outside it and the reply was not cut at the token limit — a draft in the reasoning
   must not stand in for an answer that was written but cut off.
"""

from __future__ import annotations

import json
import re
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import json_repair
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

#: Candidates tried per reply at most, and characters scanned for them: a reply is
#: bounded by the model's token limit, these bound the work on a pathological one (a
#: long run of unclosed brackets costs about 0.3 s, not seconds).
MAX_CANDIDATES = 64
MAX_SCANNED_CHARS = 400_000

_TAGS = r"think|thinking|reasoning"
_BLOCK = re.compile(rf"<({_TAGS})\b[^>]*>(.*?)</\1\s*>", re.DOTALL | re.IGNORECASE)
_CLOSER = re.compile(rf"</(?:{_TAGS})\s*>", re.IGNORECASE)
_OPENER = re.compile(rf"<(?:{_TAGS})\b[^>]*>", re.IGNORECASE)
#: gpt-oss's harmony format, when a server passes it through unparsed.
_HARMONY_FINAL = re.compile(r"<\|channel\|>\s*final\s*<\|message\|>", re.IGNORECASE)
_HARMONY_TOKENS = re.compile(r"<\|(?:return|end|start|call)\|>(?:assistant)?")
_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n?(.*?)```", re.DOTALL)
_CLOSING = {"{": "}", "[": "]"}


class UnusableReply(ValueError):
    """No candidate in the reply validates; the message says why (shown in the re-ask)."""


@dataclass(frozen=True)
class ModelReply:
    """What a chat completion brought back for a task."""

    content: str
    #: The message's ``reasoning_content`` (vLLM, DeepSeek, LM Studio) or ``reasoning``
    #: (Ollama, OpenRouter) field.
    reasoning: str = ""
    #: ``finish_reason == "length"``: cut at the token limit.
    truncated: bool = False


def split_reasoning(content: str) -> tuple[str, str]:
    """(the text outside any reasoning, the reasoning), as described in the module."""
    thoughts: list[str] = []
    final = list(_HARMONY_FINAL.finditer(content))
    if final:
        thoughts.append(content[: final[-1].start()])
        content = content[final[-1].end() :]
    content = _HARMONY_TOKENS.sub("", content)

    def keep_thought(match: re.Match[str]) -> str:
        thoughts.append(match.group(2))
        return "\n"

    visible = _BLOCK.sub(keep_thought, content)
    closers = list(_CLOSER.finditer(visible))
    if closers:  # the template opened the block: everything before its end is thought
        thoughts.append(visible[: closers[-1].start()])
        visible = visible[closers[-1].end() :]
    opener = _OPENER.search(visible)
    if opener is not None:  # never closed: the model was still thinking
        thoughts.append(visible[opener.end() :])
        visible = visible[: opener.start()]
    return visible.strip(), "\n".join(t.strip() for t in thoughts if t.strip())


def parse_reply(reply: ModelReply, schema: type[M]) -> M:
    """The first candidate of ``reply`` that validates against ``schema``."""
    visible, in_content = split_reasoning(reply.content)
    errors: list[str] = []
    answer = _first_valid(visible, schema, errors)
    if answer is not None:
        return answer
    if not visible and not reply.truncated:
        reasoning = "\n".join(r for r in (in_content, reply.reasoning.strip()) if r)
        answer = _first_valid(reasoning, schema, errors)
        if answer is not None:
            return answer
    raise UnusableReply(_why(reply, visible, errors))


def _why(reply: ModelReply, visible: str, errors: list[str]) -> str:
    cut = "the reply was cut at the token limit; " if reply.truncated else ""
    if errors:
        return cut + errors[0]
    if not visible and not reply.content.strip() and not reply.reasoning.strip():
        return cut + "the reply is empty"
    if not visible:
        return cut + "the reply holds only reasoning, and no answer in it"
    return cut + "no JSON value found in the reply"


def _first_valid(text: str, schema: type[M], errors: list[str]) -> M | None:
    for candidate in _candidates(text):
        value = _load(candidate)
        if value is None:
            continue
        try:
            return _validate(value, schema)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "the answer"
            errors.append(f"{where}: {first['msg']}"[:300])
        except ValueError as exc:
            errors.append(str(exc)[:300])
    return None


def _candidates(text: str) -> Iterator[str]:
    """Fenced values first, then the text's balanced values, last first; each once."""
    seen: set[str] = set()

    def fresh(spans: Iterator[str]) -> Iterator[str]:
        for span in spans:
            if span not in seen and len(seen) < MAX_CANDIDATES:
                seen.add(span)
                yield span

    budget = [MAX_SCANNED_CHARS]
    for fence in _FENCE.finditer(text):
        yield from fresh(_balanced_values(fence.group(2), budget))
    yield from fresh(_balanced_values(text, budget))


def _balanced_values(text: str, budget: list[int]) -> Iterator[str]:
    """Each complete top-level ``{…}``/``[…]`` of ``text``, the last first, each followed
    by the values nested in it; ``budget[0]``: characters left to scan (shared)."""
    spans: list[tuple[int, int]] = []
    position = 0
    while budget[0] > 0:
        starts = [i for i in (text.find("{", position), text.find("[", position)) if i >= 0]
        if not starts:
            break
        start = min(starts)
        end, scanned = _closing(text, start, budget[0])
        budget[0] -= scanned
        if end is None:
            position = start + 1
        else:
            spans.append((start, end))
            position = end
    for start, end in reversed(spans):
        yield text[start:end]
        yield from _balanced_values(text[start + 1 : end - 1], budget)


def _closing(text: str, start: int, budget: int) -> tuple[int | None, int]:
    """The index just after the value opened at ``text[start]`` (None when it is never
    closed — a reply cut off — or closed by the wrong bracket: not JSON), and how many
    characters were scanned (at most ``budget``)."""
    expected: list[str] = []
    quote = ""
    i = start
    stop = min(len(text), start + budget)
    while i < stop:
        ch = text[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch == '"' or (ch == "'" and _opens_string(text, i)):
            quote = ch
        elif text.startswith("//", i):
            newline = text.find("\n", i)
            i = len(text) if newline < 0 else newline
            continue
        elif text.startswith("/*", i):
            close = text.find("*/", i + 2)
            i = len(text) if close < 0 else close + 2
            continue
        elif ch in _CLOSING:
            expected.append(_CLOSING[ch])
        elif ch in "}]":
            if not expected or expected.pop() != ch:
                return None, i + 1 - start
            if not expected:
                return i + 1, i + 1 - start
        i += 1
    return None, max(i - start, 1)


def _opens_string(text: str, i: int) -> bool:
    """A single quote opens a string where a key or value may start, not in "User's"."""
    j = i - 1
    while j >= 0 and text[j].isspace():
        j -= 1
    return j < 0 or text[j] in "{[,:"


def _load(candidate: str) -> Any:
    """The candidate as JSON, else as the JSON5-ish text small models write; None when
    it is neither (or has no quoted string, so prose in brackets stays prose)."""
    try:
        return json.loads(candidate)
    except json.JSONDecodeError:
        pass
    if '"' not in candidate and "'" not in candidate:
        return None
    try:
        value = json_repair.loads(candidate, skip_json_loads=True)
    except Exception:  # the library's errors are not part of its interface
        return None
    return value if isinstance(value, dict | list) else None


def _validate(value: Any, schema: type[M]) -> M:
    if isinstance(value, dict):
        fields = _field_names(schema)
        if not fields & value.keys():
            raise ValueError(f"an object naming none of the fields {sorted(fields)}")
        return schema.model_validate(value)
    if isinstance(value, list):
        lists = _list_fields(schema)
        if not lists:
            raise ValueError("a list, where one JSON object was asked for")
        error: ValidationError | None = None
        for name in lists:
            try:
                return schema.model_validate({name: value})
            except ValidationError as exc:
                error = error or exc
        assert error is not None
        raise error
    raise ValueError("not a JSON object")


def _field_names(schema: type[BaseModel]) -> set[str]:
    return {
        name
        for field_name, info in schema.model_fields.items()
        for name in (field_name, info.alias)
        if name
    }


def _list_fields(schema: type[BaseModel]) -> list[str]:
    return [
        name
        for name, info in schema.model_fields.items()
        if typing.get_origin(info.annotation) is list
    ]
