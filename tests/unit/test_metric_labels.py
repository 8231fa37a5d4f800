"""Caller-chosen strings never grow ``/metrics`` without bound: the LLM metrics' model
label keeps the first names a process sees and counts every later one as ``_OTHER``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry.sdk.resources import Resource
from prometheus_client.parser import text_string_to_metric_families

from engram_core.genai import MAX_MODEL_LABELS, MODEL_LABEL, LlmCall
from engram_core.labels import OTHER, BoundedLabel
from engram_core.metrics import prometheus_exposition, setup_metrics


@pytest.fixture
def fresh_model_labels() -> Iterator[set[str]]:
    """The names holding a label before the test (earlier tests' models); the test's
    names are forgotten afterwards, so later tests' models keep theirs."""
    setup_metrics(Resource.create({"service.name": "engram-test"}))
    before = MODEL_LABEL.seen()
    yield set(before)
    MODEL_LABEL.forget(MODEL_LABEL.seen() - before)


def model_labels() -> set[str]:
    text = prometheus_exposition()[0].decode()
    return {
        sample.labels["gen_ai_request_model"]
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if "gen_ai_request_model" in sample.labels
    }


def test_2000_model_names_leave_metrics_bounded(fresh_model_labels: set[str]) -> None:
    # Series of names that earlier tests used and forgot stay in the exposition: only
    # the labels this test adds are counted against the slots it found free.
    earlier = model_labels()
    free = MAX_MODEL_LABELS - len(fresh_model_labels)
    for i in range(50):
        with LlmCall(f"warm-up-{i}", task="chat") as call:
            call.record_usage(3, 4)
    size_before, models_before = len(prometheus_exposition()[0]), len(model_labels())
    for i in range(2000):
        with LlmCall(f"caller-model-{i}", task="chat") as call:
            call.record_usage(3, 4)
    grown = len(prometheus_exposition()[0]) - size_before
    labels = model_labels()
    added = labels - earlier - {OTHER}
    assert len(added) <= free, (len(added), free)
    assert OTHER in labels
    # the series the limit still allowed (and _OTHER's), not one per name
    per_model = size_before / models_before
    allowed = max(free - 50, 0) + 1  # the slots the warm-up left, and _OTHER
    assert grown < per_model * allowed * 1.2, (grown, per_model, allowed)


def test_a_bounded_label_keeps_the_first_values_then_answers_other() -> None:
    label = BoundedLabel(2)
    assert [label(v) for v in ("a", "b", "c", "a", "d", "b")] == ["a", "b", OTHER, "a", OTHER, "b"]
    label.forget({"a"})
    assert label("e") == "e" and label("a") == OTHER
    with pytest.raises(ValueError):
        BoundedLabel(0)
