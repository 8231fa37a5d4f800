"""The memory controls tables (docs/gateway.md, README.md) against the code: every control
of :class:`MemoryControls` has a row, its range is the model's, and the default a row
states is the one that applies (the gateway's ``ENGRAM_GATEWAY_MEMORY_*`` setting, else
retrieval's ``ENGRAM_SEARCH_*``). A control added to the model, or a default changed in
the code, fails here until the docs say it."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from engram_gateway.controls import HEADER_FOR_FIELD, MemoryControls
from engram_gateway.settings import GatewaySettings
from engram_retrieval.settings import RetrievalSettings

ROOT = Path(__file__).resolve().parents[2]
CONTROLS = list(MemoryControls.model_fields)
EN_DASH = "\N{EN DASH}"


def table_rows(document: str, first_header: str) -> dict[str, list[str]]:
    """The rows of the Markdown table whose first header cell is ``first_header``, keyed
    by their first cell without backticks."""
    rows: dict[str, list[str]] = {}
    inside = False
    for line in (ROOT / document).read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.lstrip().startswith("|"):
            if inside:
                break
            continue
        if cells[0] == first_header:
            inside = True
        elif inside and not set(cells[0]) <= set("-: "):
            rows[cells[0].strip("`")] = cells
    assert rows, f"{document} has no table headed {first_header!r}"
    return rows


def effective_default(control: str) -> Any:
    """What applies when a request does not set ``control``."""
    name = "gateway_memory_enabled" if control == "memory" else f"gateway_{control}"
    default = GatewaySettings.model_fields[name].default
    if default is None:
        search = "search_" + control.removeprefix("memory_")
        default = RetrievalSettings.model_fields[search].default
    return default


def documented_range(control: str) -> str | None:
    """The range as the docs write it ("integer 1", an en dash, "100"), from the model's
    JSON schema (None: not a number)."""
    schema = MemoryControls.model_json_schema()["properties"][control]
    (kind,) = [s for s in schema.get("anyOf", [schema]) if s.get("type") != "null"]
    if kind.get("type") not in ("integer", "number"):
        return None
    low, high = (kind["minimum"], kind["maximum"])
    return f"{kind['type']} {low:g}{EN_DASH}{high:g}"


def stated(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else f"{value:g}"


@pytest.mark.parametrize("control", CONTROLS)
def test_gateway_doc_states_each_controls_range_and_default(control: str) -> None:
    rows = table_rows("docs/gateway.md", "body field")
    assert control in rows, f"docs/gateway.md's controls table has no row for {control}"
    _, header, kind, meaning = rows[control]
    assert header == f"`{HEADER_FOR_FIELD[control]}`"
    if (expected := documented_range(control)) is not None:
        assert expected in kind, f"{control}: the model allows {expected}, the doc says {kind}"
    said = re.search(r"default[^0-9`]*(?:`ENGRAM_[A-Z_]+`, )?`?([0-9.]+|true|false)`?", meaning)
    if control in ("memory", "memory_id"):
        return  # on by default / the client's chat id: said in words
    assert said, f"docs/gateway.md states no default for {control}: {meaning}"
    assert said[1] == stated(effective_default(control)), (
        f"docs/gateway.md says {control} defaults to {said[1]}; "
        f"the code's default is {effective_default(control)}"
    )


@pytest.mark.parametrize("control", [c for c in CONTROLS if c != "memory_id"])
def test_readme_states_each_controls_default(control: str) -> None:
    rows = table_rows("README.md", "field")
    assert control in rows, f"README's memory controls table has no row for {control}"
    default_cell = rows[control][-1]
    said = re.search(r"[0-9.]+|true|false", default_cell)
    assert said and said[0] == stated(effective_default(control)), (
        f"README says {control} defaults to {default_cell!r}; "
        f"the code's default is {effective_default(control)}"
    )
