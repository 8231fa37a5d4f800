"""Fuzzing the gateway's OpenAPI schema against the whole stack (schemathesis): for every
operation, cases that fit the schema and cases that break it, from a fixed seed and a
bounded number of examples. Zero 5xx; every answer's status, content type and body are
what the schema documents."""

from __future__ import annotations

import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from engram_cli.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: Per operation and generation mode: about 20 operations x 2 modes x this many requests.
EXAMPLES = 25
SEED = 20261124
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def test_the_gateway_holds_its_schema_under_fuzzing(stack: Stack) -> None:
    base = f"http://{stack.settings.gateway_host}:{stack.settings.gateway_port}"
    schema = schemathesis.openapi.from_url(f"{base}/openapi.json", timeout=10)
    session = requests.Session()
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10, [op.label for op in operations]
    calls = 0

    for operation in operations:
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):

            @hypothesis.seed(SEED)
            @hypothesis.settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                phases=[Phase.explicit, Phase.generate, Phase.shrink],
                suppress_health_check=list(HealthCheck),
            )
            @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
            def fuzz(case: schemathesis.Case) -> None:
                nonlocal calls
                calls += 1
                case.call_and_validate(base_url=base, session=session, checks=CHECKS, timeout=30)

            fuzz()
    print(f"{calls} fuzzed requests over {len(operations)} operations")
    assert calls >= len(operations) * 2
    # the stack is still fine afterwards
    assert session.get(f"{base}/readyz", timeout=10).status_code == 200
