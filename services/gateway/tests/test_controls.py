"""Memory controls: split from the body and headers in order, the body winning, the
operator's defaults filling the gaps, bad values a 400 naming the control."""

from __future__ import annotations

import pytest

from engram_gateway.controls import split_memory_controls
from engram_gateway.errors import GatewayError
from engram_gateway.settings import GatewaySettings


def test_controls_are_split_from_the_body_in_order() -> None:
    body = {
        "model": "m",
        "memory_id": "c1",
        "messages": [],
        "memory_top_k": 3,
        "user": "u",
        "memory": True,
        "x": 1,
    }
    controls, forwarded = split_memory_controls(body, {})
    assert list(forwarded) == ["model", "messages", "user", "x"]
    assert controls.memory_id == "c1"
    assert controls.memory_top_k == 3
    assert controls.enabled


def test_body_wins_over_header() -> None:
    controls, _ = split_memory_controls(
        {"memory_top_k": 2, "memory_id": None},
        {
            "x-engram-memory-top-k": "9",
            "x-engram-memory-id": "from-header",
            "x-engram-memory-recency-weight": "0.5",
            "x-engram-memory": "off",
        },
    )
    assert controls.memory_top_k == 2  # body
    assert controls.memory_id == "from-header"  # null in the body: not set
    assert controls.memory_recency_weight == 0.5
    assert controls.enabled is False


def test_operator_defaults_fill_the_gaps() -> None:
    settings = GatewaySettings(gateway_memory_top_k=7, gateway_memory_enabled=False)
    controls, _ = split_memory_controls({"memory_mmr_lambda": 1}, {})
    controls = controls.with_defaults(settings)
    assert (controls.memory_top_k, controls.memory_mmr_lambda, controls.enabled) == (7, 1.0, False)
    assert controls.memory_score_threshold is None


@pytest.mark.parametrize(
    ("body", "headers", "param"),
    [
        ({"memory_topk": 3}, {}, "memory_topk"),
        ({"memory_top_k": "3"}, {}, "memory_top_k"),
        ({"memory_top_k": 3.0}, {}, "memory_top_k"),
        ({"memory_top_k": 0}, {}, "memory_top_k"),
        ({"memory_recency_weight": 1.5}, {}, "memory_recency_weight"),
        ({"memory": "false"}, {}, "memory"),
        ({"memory_id": "../etc"}, {}, "memory_id"),
        ({"memory_id": ""}, {}, "memory_id"),
        ({}, {"x-engram-memory-top-k": "three"}, "X-Engram-Memory-Top-K"),
        ({}, {"x-engram-memory-score-threshold": "2"}, "X-Engram-Memory-Score-Threshold"),
        ({}, {"x-engram-memory": "maybe"}, "X-Engram-Memory"),
        ({}, {"x-engram-memory-colour": "blue"}, "x-engram-memory-colour"),
    ],
)
def test_bad_controls_are_400_naming_the_control(
    body: dict[str, object], headers: dict[str, str], param: str
) -> None:
    with pytest.raises(GatewayError) as info:
        split_memory_controls(body, headers)
    assert info.value.status == 400
    assert info.value.param == param
    assert param in info.value.message
