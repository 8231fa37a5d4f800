"""engram bench scale: the synthetic corpus is deterministic and laid out as documented;
the table reports skipped sizes."""

from __future__ import annotations

from collections import Counter

from engram_cli.bench.scale import format_table, parse_list
from engram_cli.bench.scale_corpus import Layout, memories, queries


def test_corpus_is_deterministic_and_grows_by_prefix() -> None:
    small, large = memories(200), memories(1000)
    assert small == large[:200] == memories(200)
    assert len({m.source_id for m in large}) == 1000
    assert len({m.text for m in large}) > 500  # varied sentences, not one template


def test_layout_spreads_tenants_evenly_and_conversations_unevenly() -> None:
    layout = Layout()
    corpus = memories(5000, layout)
    tenants = Counter(m.tenant for m in corpus)
    assert len(tenants) == layout.tenants and set(tenants.values()) == {250}
    sizes = Counter(m.conversation_id for m in corpus if m.tenant == "tenant-00")
    assert sizes.most_common(1)[0][1] > 5 * sorted(sizes.values())[len(sizes) // 2]
    for m in corpus:
        conversation = int(m.conversation_id.removeprefix("conv-"))
        assert m.user_id == f"{m.tenant.replace('tenant', 'user')}-{conversation % layout.users}"
    kinds = Counter(m.kind for m in corpus)
    assert 0.1 < kinds["fact"] / len(corpus) < 0.2
    assert {m.role for m in corpus if m.kind == "turn"} == {"user", "assistant"}


def test_questions_are_asked_where_memories_are() -> None:
    corpus = memories(300)
    scopes = {(m.tenant, m.user_id, m.conversation_id) for m in corpus}
    asked = queries(corpus, 50)
    assert asked == queries(corpus, 50)
    assert all(q[:3] in scopes and q[3].endswith("?") for q in asked)


def test_table_lists_skipped_sizes() -> None:
    row = {
        "memories": 10,
        "upsert_per_s": 1.0,
        "search_ms": {"p50": 1, "p95": 2, "p99": 3},
        "search_all_scopes_ms": {"p50": 1, "p95": 2, "p99": 3},
        "search": {"stage_mean_ms": {"candidates_ms": 0.5}},
        "rss_mb": 100.0,
        "peak_rss_mb": 120.0,
    }
    table = format_table(
        {"edge": {"10": row}, "qdrant-local": {"100": {"skipped": "above --local-max 10"}}}
    )
    assert "skipped: above --local-max 10" in table and "edge" in table
    assert parse_list(" 1000, ,10000 ") == ["1000", "10000"]
