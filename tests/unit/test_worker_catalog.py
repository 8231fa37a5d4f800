"""The worker list is defined once (engram_core.worker_catalog): the console scripts, the
worker settings' health ports, ``engram up``, the Dockerfile, the chart's values and its
schema all agree with it, and the check that says so (``make workers-check``) notices
when one of them does not."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from engram_cli.cli_common import WORKERS, CliSettings
from engram_core.worker_catalog import WORKER_CATALOG, worker_entry, worker_names

ROOT = Path(__file__).resolve().parents[2]


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "engram_check_workers", ROOT / "scripts" / "check_workers.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check = _checker()


def test_everything_that_names_the_workers_agrees_with_the_catalogue() -> None:
    assert check.problems() == []


def test_engram_up_reads_its_workers_and_ports_from_the_catalogue() -> None:
    assert worker_names() == WORKERS
    ports = CliSettings(health_port_base=WORKER_CATALOG[0].health_port).worker_health_ports()
    assert ports == {entry.name: entry.health_port for entry in WORKER_CATALOG}
    moved = CliSettings(health_port_base=9300).worker_health_ports()
    assert moved["evict"] == 9300 + worker_entry("evict").health_port - 8201


def test_the_catalogue_is_consistent() -> None:
    names = worker_names()
    assert len(set(names)) == len(names)
    ports = [entry.health_port for entry in WORKER_CATALOG]
    assert len(set(ports)) == len(ports)
    assert [e.name for e in WORKER_CATALOG if e.sidecar] == ["edits"]  # in the mirror's pod
    with pytest.raises(KeyError, match="known: ingest"):
        worker_entry("ingset")


def _text(name: str) -> str:
    return {
        "pyproject": check.PYPROJECT,
        "dockerfile": check.DOCKERFILE,
        "values": check.VALUES,
    }[name].read_text()


@pytest.mark.parametrize(
    ("source", "old", "new", "complaint"),
    [
        # a worker's port changed in one place only
        ("dockerfile", "ENGRAM_HEALTH_PORT=8204", "ENGRAM_HEALTH_PORT=8214", "target evict lacks"),
        ("dockerfile", "EXPOSE 8205 8206", "EXPOSE 8205", "exposes [8205], want [8205, 8206]"),
        ("dockerfile", 'CMD ["engram-evict"]', 'CMD ["engram-evicts"]', "target evict ends"),
        ("values", "healthPort: 8204", "healthPort: 8214", "components.evict.healthPort is 8214"),
        (
            "values",
            "healthPort: 8206",
            "healthPort: 8216",
            "components.file-mirror.edits.healthPort is 8216",
        ),
        (
            "pyproject",
            'engram-evict = "engram_workers.evict:main"',
            'engram-evict = "engram_workers.evict:run"',
            "engram-evict = 'engram_workers.evict:run'",
        ),
        # a worker added somewhere but not to the catalogue
        (
            "pyproject",
            'engram-edits = "engram_workers.edits:main"',
            'engram-edits = "engram_workers.edits:main"\nengram-tidy = "engram_workers.tidy:main"',
            "script engram-tidy is no worker",
        ),
        (
            "dockerfile",
            "FROM worker AS evict",
            'FROM worker AS tidy\nCMD ["engram-tidy"]\n\nFROM worker AS evict',
            "target tidy is no worker image",
        ),
        (
            "values",
            "  evict:\n",
            "  tidy:\n    enabled: true\n    healthPort: 8207\n\n  evict:\n",
            "components.tidy is no worker",
        ),
    ],
)
def test_a_disagreement_is_caught(source: str, old: str, new: str, complaint: str) -> None:
    text = _text(source)
    assert text.count(old) == 1, f"{old!r} is not in {source} once: update this test"
    changed = text.replace(old, new)
    found = {
        "pyproject": check.check_pyproject,
        "dockerfile": check.check_dockerfile,
        "values": check.check_values,
    }[source](changed)
    assert any(complaint in problem for problem in found), found


def test_a_worker_in_the_catalogue_only_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    extra = type(WORKER_CATALOG[0])(
        "tidy", "engram_workers.tidy", "TIDY", "TidySettings", 8207, "tidy"
    )
    monkeypatch.setattr(check, "WORKER_CATALOG", (*WORKER_CATALOG, extra))
    assert any("engram-tidy" in p for p in check.check_pyproject(_text("pyproject")))
    assert any("no target tidy" in p for p in check.check_dockerfile(_text("dockerfile")))
    assert any("no components.tidy" in p for p in check.check_values(_text("values")))


def test_a_settings_default_that_drifts_from_the_catalogue_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from engram_workers.evict import EvictSettings

    monkeypatch.setattr(EvictSettings.model_fields["health_port"], "default", 8214)
    assert any(
        re.search(r"EvictSettings.health_port defaults to 8214, want 8204", p)
        for p in check.check_modules()
    )
