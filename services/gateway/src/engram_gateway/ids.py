"""Memory and event ids as callers send them: a UUID, in its canonical spelling.

Whatever builds a URL from an id (the MCP tools) checks it with :func:`canonical_uuid`
first, the check the memory API applies to its path parameters, so no id can carry a
``/``, ``..`` or ``?`` into a path.
"""

from __future__ import annotations

import uuid
from typing import Annotated

from pydantic import AfterValidator, Field


def canonical_uuid(value: str, what: str = "memory") -> str:
    """``value`` as a lower-case hyphenated UUID; ``ValueError`` (in the memory API's
    words) when it is not one."""
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise ValueError(f"{value[:64]!r} is not a valid {what} id (a UUID)") from None


MemoryId = Annotated[
    str,
    Field(min_length=1, max_length=64, description="The memory's id (a UUID)."),
    AfterValidator(canonical_uuid),
]
