"""A memory file's front matter is exactly what yaml.safe_dump writes, whichever way it
is rendered: a file is never rewritten because the renderer changed. (That everyday
memories take the direct path is tested with the rest of the format, in
services/workers/tests/test_mirror_format.py.)"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram_core import front_matter

# Characters that change how YAML writes a string (indicators, quotes, comments,
# separators, escapes, line breaks, non-ASCII), among plain ones.
TRICKY = "aZ09_-.:/@+ #'\"!&*|>%`,?[]{}~=\\\t\n\r\x85\u2028\ufeffé中\x00"
words = st.sampled_from(
    [
        "yes",
        "No",
        "on",
        "null",
        "~",
        "true",
        "1",
        "-1",
        "0x1f",
        "0o17",
        "1_000",
        "1:20",
        "1.5",
        ".inf",
        "1e3",
        "2026-11-24",
        "2026-11-24T10:00:00Z",
        "---",
        "...",
        "-",
        "a b",
    ]
)
strings = st.one_of(words, st.text(alphabet=TRICKY, max_size=12), st.text(max_size=8))
scalars = st.one_of(
    strings,
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    # long id lists (a summary's folded_fact_ids) around the line width PyYAML wraps at
    st.tuples(st.integers(1, 40), st.integers(3900, 4200)).map(
        lambda t: " ".join(["a" * t[0]] * (t[1] // (t[0] + 1)))
    ),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(strings, inner, max_size=3)
    ),
    max_leaves=8,
)
fronts = st.dictionaries(
    st.one_of(strings, st.text(alphabet="k", min_size=99, max_size=130)), values, max_size=6
)


@settings(max_examples=1000, deadline=None)
@given(fronts)
def test_any_header_renders_as_pyyaml_does(front: dict[str, Any]) -> None:
    assert front_matter.dump(front) == front_matter.dump_with_pyyaml(front)


@pytest.mark.parametrize("length", range(3980, 4120, 7))
@pytest.mark.parametrize("word", [1, 36])
def test_long_lines_wrap_where_pyyaml_wraps_them(length: int, word: int) -> None:
    value = " ".join(["a" * word] * (length // (word + 1)))
    for front in (
        {"folded_fact_ids": value},
        {"metadata": {"folded_fact_ids": value}},
        {"tags": [value, "b"]},
    ):
        assert front_matter.dump(front) == front_matter.dump_with_pyyaml(front)
