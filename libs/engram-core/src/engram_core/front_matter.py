"""A memory file's YAML front matter: ``yaml.safe_dump`` byte for byte, faster.

The mirror renders a header for every memory change, and PyYAML's pure-Python emitter
was a fifth of the mirror worker's CPU. Headers almost always hold ids, names, times,
numbers and short lists, which :func:`dump` renders directly, asking PyYAML's own
resolver which strings need quotes; anything else (other characters, floats that are
not finite, long strings) is handed to ``yaml.safe_dump`` whole, so the bytes are the
same either way. libyaml's C emitter would be faster still but quotes and wraps some
strings differently, which would rewrite existing files (docs/benchmarks.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

import yaml

__all__ = ["dump", "dump_with_pyyaml"]

_STR_TAG = "tag:yaml.org,2002:str"
_RESOLVER = yaml.resolver.Resolver()
#: Strings PyYAML writes plain (or, when they would read back as another type, in
#: single quotes): a letter, digit or ``_`` first; ``:`` only before another character;
#: single spaces only before a letter, digit or ``_``. Nothing that starts an indicator,
#: a comment, a document marker or an escape.
_SIMPLE = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_.@/+-]|:(?=[A-Za-z0-9_.@/+-])| (?=[A-Za-z0-9_]))*")
#: Lines stay below the dump's width (4096), where PyYAML would wrap at a space; keys
#: stay simple keys (PyYAML writes a key of 128 characters or more as "? key").
_MAX_LINE = 4000
_MAX_KEY = 100


class _NotSimple(Exception):
    """A value :func:`dump` leaves to PyYAML."""


def dump_with_pyyaml(front: Mapping[str, Any]) -> str:
    """The reference rendering (every header could be written with it)."""
    return yaml.safe_dump(
        dict(front), sort_keys=False, allow_unicode=True, default_flow_style=False, width=4096
    )


def dump(front: Mapping[str, Any]) -> str:
    """``front`` as YAML, exactly as :func:`dump_with_pyyaml` writes it."""
    lines: list[str] = []
    try:
        _mapping(front, 0, lines)
    except _NotSimple:
        return dump_with_pyyaml(front)
    return "\n".join(lines) + "\n" if lines else "{}\n"


def _string(value: str, *, key: bool = False) -> str:
    if value == "":
        if key:  # PyYAML writes an empty key as a complex key ("? ''")
            raise _NotSimple
        return "''"
    if (key and len(value) > _MAX_KEY) or not _SIMPLE.fullmatch(value):
        raise _NotSimple
    # the tag a plain scalar reads as
    tag = _RESOLVER.resolve(  # type: ignore[no-untyped-call]  # untyped in types-pyyaml
        yaml.ScalarNode, value, (True, False)
    )
    if tag != _STR_TAG:
        return f"'{value}'"  # would read back as a number, a date, a bool...
    return value


def _scalar(value: Any) -> str:
    kind = type(value)  # exact types: PyYAML's safe representers are registered by type
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return str(value)
    if kind is float:
        if not math.isfinite(value):
            raise _NotSimple
        text = repr(value).lower()  # PyYAML's SafeRepresenter.represent_float
        if "." not in text and "e" in text:
            text = text.replace("e", ".0e", 1)
        return text
    if kind is str:
        return _string(value)
    raise _NotSimple


def _mapping(front: Mapping[Any, Any], indent: int, lines: list[str]) -> None:
    pad = " " * indent
    for key, value in front.items():
        if type(key) is not str:
            raise _NotSimple
        head = f"{pad}{_string(key, key=True)}:"
        if type(value) is dict:
            if not value:
                lines.append(f"{head} {{}}")
            else:
                lines.append(head)
                _mapping(value, indent + 2, lines)
        elif type(value) is list:
            if not value:
                lines.append(f"{head} []")
            else:
                lines.append(head)
                # a sequence in a mapping is not indented ("indentless")
                lines.extend(_line(f"{pad}- {_scalar(item)}") for item in value)
        else:
            lines.append(_line(f"{head} {_scalar(value)}"))


def _line(text: str) -> str:
    if len(text) > _MAX_LINE:
        raise _NotSimple
    return text
