"""docs/security.md names the test behind each defect it lists: every name it gives is a
test that exists, and every file path it gives is a file of the repository."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"


def _test_sources() -> str:
    files = [
        *ROOT.glob("tests/**/test_*.py"),
        *ROOT.glob("services/*/tests/**/test_*.py"),
        *ROOT.glob("libs/*/tests/**/test_*.py"),
    ]
    return "\n".join(path.read_text(encoding="utf-8") for path in files)


def test_every_test_the_security_doc_names_exists() -> None:
    named = set(re.findall(r"\btest_\w+(?=`|,|\))", DOC.read_text(encoding="utf-8")))
    named = {name for name in named if not name.endswith(".py")}
    assert len(named) >= 20
    sources = _test_sources()
    missing = sorted(name for name in named if not re.search(rf"def {name}\b", sources))
    assert not missing, f"docs/security.md names tests that do not exist: {missing}"


def test_every_test_file_the_security_doc_names_exists() -> None:
    paths = set(
        re.findall(r"`((?:tests|services|libs)/[\w/-]+\.py)", DOC.read_text(encoding="utf-8"))
    )
    assert paths
    assert not sorted(p for p in paths if not (ROOT / p).is_file())
