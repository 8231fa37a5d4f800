"""Few ``type: ignore`` in the sources, each saying why on its own line: one that is not
needed fails mypy (``warn_unused_ignores``); this keeps the needed ones few and explained,
so the next one is a choice, not a habit. The generated gRPC code is not counted."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_IGNORES = 5
IGNORE = re.compile(r"#\s*type:\s*ignore(?P<codes>\[[^\]]*\])?(?P<rest>.*)$")


def ignores() -> list[tuple[str, str]]:
    """(``path:line``, what follows the ignore on that line) for every ignore."""
    found = []
    for source in [*ROOT.glob("libs/*/src"), *ROOT.glob("services/*/src")]:
        for path in sorted(source.rglob("*.py")):
            if "grpc_gen" in path.parts:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if match := IGNORE.search(line):
                    where = f"{path.relative_to(ROOT)}:{number}"
                    found.append((where, match["rest"] if match["codes"] else ""))
    return found


def test_at_most_five_type_ignores_each_with_its_code_and_reason() -> None:
    found = ignores()
    assert len(found) <= MAX_IGNORES, [where for where, _ in found]
    unexplained = [where for where, rest in found if not re.match(r"\s+#\s*\w", rest)]
    assert unexplained == [], "each ignore names its error code and says why, same line"


def test_the_counter_reads_the_code_and_the_reason() -> None:
    explained = IGNORE.search("x = f(y)  # type: ignore[arg-type]  # untyped upstream")
    assert explained is not None and explained["rest"] == "  # untyped upstream"
    bare = IGNORE.search("x = f(y)  # type: ignore")
    assert bare is not None and bare["codes"] is None
