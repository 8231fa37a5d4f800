"""Reading metrics back in a test: Prometheus text, the way a scrape sees them."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from engram_core.metrics import prometheus_exposition


def metric(name: str, text: str | None = None, **labels: str) -> float:
    """The sum of the samples called ``name`` whose labels include ``labels``, in
    ``text`` (this process's exposition when None); 0 when there are none."""
    if text is None:
        text = prometheus_exposition()[0].decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )
