"""Fail if anything that names the workers disagrees with the worker catalogue.

The catalogue (``engram_core.worker_catalog``) is the one list of workers: name, entry
point, health port, image. This checks what is written elsewhere against it, and says
what to change:

- ``services/workers/pyproject.toml``: a console script ``engram-<name>`` per worker,
  pointing at ``<module>:main``, and no other worker script but the all-in-one
  ``engram-workers``;
- each worker module: its ``WorkerSpec`` has the worker's name and its settings class's
  ``health_port`` defaults to the catalogue's port;
- ``deploy/Dockerfile``: a target per image, exposing the health ports of the workers it
  runs, with ``ENGRAM_HEALTH_PORT`` and ``CMD`` of its first worker, and no other worker
  target;
- ``deploy/helm/engram/values.yaml``: a component per image with its ``healthPort``, a
  sidecar worker's under ``components.<image>.<name>``, and no other worker component;
- ``values.schema.json``: what ``deploy/scripts/gen_values_schema.py`` generates from the
  catalogue.

``engram up``'s list and ports (``engram_cli.cli_common``) are read from the catalogue.
Run by ``make workers-check`` (part of ``make lint``) and by tests/unit/test_worker_catalog.py.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import yaml

from engram_core.worker_catalog import WORKER_CATALOG, WorkerEntry

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = ROOT / "services" / "workers" / "pyproject.toml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
VALUES = ROOT / "deploy" / "helm" / "engram" / "values.yaml"
SCHEMA_SCRIPT = ROOT / "deploy" / "scripts" / "gen_values_schema.py"
#: Every worker in one process (engram_workers.all_in_one), for a single machine.
ALL_IN_ONE_SCRIPT = ("engram-workers", "engram_workers.all_in_one:main")
#: The Dockerfile stage every worker image is built from.
WORKER_BASE_STAGE = "worker"


def _images() -> dict[str, list[WorkerEntry]]:
    """Image -> the workers it runs, the one its pod starts first."""
    images: dict[str, list[WorkerEntry]] = {}
    for entry in WORKER_CATALOG:
        images.setdefault(entry.image, []).append(entry)
    return images


def check_pyproject(text: str) -> list[str]:
    scripts: dict[str, str] = tomllib.loads(text)["project"].get("scripts", {})
    problems = []
    for entry in WORKER_CATALOG:
        found = scripts.get(entry.script)
        if found != entry.entry_point:
            problems.append(
                f"pyproject.toml: [project.scripts] {entry.script} = {found!r}, "
                f"want {entry.entry_point!r}"
            )
    known = {entry.script for entry in WORKER_CATALOG} | {ALL_IN_ONE_SCRIPT[0]}
    for script in sorted(set(scripts) - known):
        problems.append(f"pyproject.toml: script {script} is no worker of the catalogue")
    if scripts.get(ALL_IN_ONE_SCRIPT[0]) != ALL_IN_ONE_SCRIPT[1]:
        problems.append(
            f"pyproject.toml: [project.scripts] {ALL_IN_ONE_SCRIPT[0]} = {ALL_IN_ONE_SCRIPT[1]!r}"
            " missing"
        )
    return problems


def check_modules() -> list[str]:
    """Each worker's spec and settings, imported."""
    problems = []
    for entry in WORKER_CATALOG:
        module = importlib.import_module(entry.module)
        spec = getattr(module, entry.spec, None)
        settings = getattr(module, entry.settings, None)
        if getattr(spec, "name", None) != entry.name:
            problems.append(f"{entry.module}.{entry.spec}: no WorkerSpec named {entry.name!r}")
        if not callable(getattr(module, "main", None)):
            problems.append(f"{entry.module}: no main()")
        fields = getattr(settings, "model_fields", {})
        default = fields["health_port"].default if "health_port" in fields else None
        if default != entry.health_port:
            problems.append(
                f"{entry.module}.{entry.settings}.health_port defaults to {default}, "
                f"want {entry.health_port} (read it from the catalogue)"
            )
    return problems


def dockerfile_stages(text: str) -> dict[str, tuple[str, list[str]]]:
    """Stage name -> (the stage it is built FROM, its instructions), continuation lines
    joined and comments dropped."""
    text = re.sub(r"\\\n\s*", " ", text)
    stages: dict[str, tuple[str, list[str]]] = {}
    current: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+(\S+)\s+AS\s+(\S+)$", line, re.IGNORECASE)
        if match:
            current = []
            stages[match.group(2)] = (match.group(1), current)
        current.append(line)
    return stages


def check_dockerfile(text: str) -> list[str]:
    stages = dockerfile_stages(text)
    problems = []
    images = _images()
    for image, entries in images.items():
        first = entries[0]
        if image not in stages:
            problems.append(f"Dockerfile: no target {image} (runs {first.script})")
            continue
        base, instructions = stages[image]
        if base != WORKER_BASE_STAGE:
            problems.append(f"Dockerfile: target {image} is FROM {base}, want {WORKER_BASE_STAGE}")
        env = " ".join(i for i in instructions if i.startswith("ENV "))
        port_setting = f"ENGRAM_HEALTH_PORT={first.health_port}"
        if not re.search(rf"(^|\s){port_setting}(\s|$)", env):
            problems.append(f"Dockerfile: target {image} lacks ENV {port_setting}")
        exposed = {
            int(port.split("/")[0])
            for i in instructions
            if i.startswith("EXPOSE ")
            for port in i.split()[1:]
        }
        wanted = {entry.health_port for entry in entries}
        if exposed != wanted:
            problems.append(
                f"Dockerfile: target {image} exposes {sorted(exposed)}, want {sorted(wanted)}"
            )
        command = f'CMD ["{first.script}"]'
        if instructions[-1] != command:
            problems.append(f"Dockerfile: target {image} ends {instructions[-1]!r}, want {command}")
    for name, (base, _) in stages.items():
        if base == WORKER_BASE_STAGE and name not in images:
            problems.append(f"Dockerfile: target {name} is no worker image of the catalogue")
    return problems


def check_values(text: str) -> list[str]:
    components: dict[str, Any] = yaml.safe_load(text)["components"]
    problems = []
    images = _images()
    for image, entries in images.items():
        component = components.get(image)
        if not isinstance(component, dict):
            problems.append(f"values.yaml: no components.{image}")
            continue
        for entry in entries:
            where, values = (
                (f"components.{image}.{entry.name}", component.get(entry.name))
                if entry.sidecar
                else (f"components.{image}", component)
            )
            port = values.get("healthPort") if isinstance(values, dict) else None
            if port != entry.health_port:
                problems.append(
                    f"values.yaml: {where}.healthPort is {port}, want {entry.health_port}"
                )
    for name, component in components.items():
        if isinstance(component, dict) and "healthPort" in component and name not in images:
            problems.append(f"values.yaml: components.{name} is no worker of the catalogue")
    return problems


def _schema_module() -> Any:
    spec = importlib.util.spec_from_file_location("engram_values_schema", SCHEMA_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_schema() -> list[str]:
    generator = _schema_module()
    if generator.SCHEMA_PATH.read_text() != generator.render():
        return [
            "values.schema.json is stale: run .venv/bin/python deploy/scripts/gen_values_schema.py"
        ]
    return []


def problems() -> list[str]:
    return [
        *check_pyproject(PYPROJECT.read_text()),
        *check_modules(),
        *check_dockerfile(DOCKERFILE.read_text()),
        *check_values(VALUES.read_text()),
        *check_schema(),
    ]


def main() -> int:
    found = problems()
    if found:
        print(
            "the workers named elsewhere disagree with engram_core.worker_catalog:",
            *found,
            sep="\n  ",
        )
        return 1
    print(f"{len(WORKER_CATALOG)} workers: pyproject, specs, Dockerfile, chart agree")
    return 0


if __name__ == "__main__":
    sys.exit(main())
