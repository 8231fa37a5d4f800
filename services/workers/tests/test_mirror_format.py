"""The mirror's Markdown format: layout, path safety, render/parse round trip, bad files."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import PurePosixPath

import pytest

from engram_core.memory import MemoryRecord, ProposedProfileFact
from engram_core.mirror_format import (
    MirrorFormatError,
    Tombstone,
    classify,
    decode_component,
    encode_component,
    live_path,
    parse,
    render,
    tombstone_path,
)

ID = "3f0c0e1a-1111-4222-8333-444455556666"
CREATED = datetime(2026, 3, 1, 12, 30, tzinfo=UTC)


def record(**overrides: object) -> MemoryRecord:
    values: dict[str, object] = {
        "id": ID,
        "kind": "fact",
        "text": "The user's name is Anne.",
        "user_id": "u1",
        "conversation_id": "c1",
        "created_at": CREATED,
        **overrides,
    }
    return MemoryRecord(**values)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, f"acme/c1/facts/20260301T123000Z__{ID}.md"),
        ({"kind": "turn", "role": "user"}, f"acme/c1/turns/user/20260301T123000Z__{ID}.md"),
        (
            {"kind": "turn", "role": "assistant"},
            f"acme/c1/turns/assistant/20260301T123000Z__{ID}.md",
        ),
        ({"kind": "turn", "role": "weird"}, f"acme/c1/turns/other/20260301T123000Z__{ID}.md"),
        ({"kind": "profile"}, f"acme/c1/profile/20260301T123000Z__{ID}.md"),
        ({"kind": "episode"}, f"acme/c1/episodes/20260301T123000Z__{ID}.md"),
        ({"kind": "summary"}, "acme/c1/summaries/summary.md"),
        ({"created_at": None}, f"acme/c1/facts/undated__{ID}.md"),
    ],
)
def test_live_layout(overrides: dict[str, object], expected: str) -> None:
    assert str(live_path("acme", record(**overrides))) == expected


def test_tombstones_keep_the_sub_path_under_deleted() -> None:
    assert str(tombstone_path("acme", record())) == (
        f"acme/c1/deleted/facts/20260301T123000Z__{ID}.md"
    )
    summary = record(kind="summary")
    assert str(tombstone_path("acme", summary)).startswith("acme/c1/deleted/summaries/2026")


@pytest.mark.parametrize(
    "hostile",
    ["..", ".", ".git", "../../etc", "a/b", "a\\b", "", "x\x00y", "é 東京", "%2F", "~", "-" * 300],
)
def test_path_components_never_escape_and_round_trip(hostile: str) -> None:
    if not hostile:
        with pytest.raises(ValueError):
            encode_component(hostile)
        return
    encoded = encode_component(hostile)
    assert "/" not in encoded and "\\" not in encoded and "\x00" not in encoded
    assert not encoded.startswith(".")
    assert len(encoded) <= 120
    if len(hostile) < 40:
        assert decode_component(encoded) == hostile
    path = live_path(hostile, record(conversation_id=hostile))
    assert len(path.parts) == 4 and ".." not in path.parts


def test_long_ids_are_hashed_and_distinct() -> None:
    a, b = encode_component("x" * 300), encode_component("x" * 299 + "y")
    assert a != b
    assert decode_component(a) is None  # the ids come from the front matter instead


def test_render_parse_round_trip_with_every_field() -> None:
    full = record(
        role="",
        updated_at=datetime(2026, 3, 1, 12, 30, 1, 123456, tzinfo=UTC),
        source_id="D1:3",
        turn_index=7,
        source_turn_ids=["t1", "t2"],
        valid_from=CREATED,
        valid_to=datetime(2026, 4, 1, tzinfo=UTC),
        superseded_by="aaaaaaaa-1111-4222-8333-444455556666",
        tags=["name", "identity"],
        profile=ProposedProfileFact(category="identity", key="name", value="Anne", confidence=0.9),
        turn_range=(1, 20),
        metadata={"model": "gpt-test", "n": "1"},
        text="Line one.\n\nLine three: --- not a delimiter\n",
        conversation_id="c/../1 é",
    )
    tomb = Tombstone(reason="superseded", at=CREATED, cause="reconcile:UPDATE")
    text = render(full, "ac me", tomb)
    assert text.startswith(f"---\nid: {ID}\nkind: fact\ntombstone:\n  reason: superseded\n")
    assert "superseded_by: aaaaaaaa-1111-4222-8333-444455556666\n" in text
    assert "created_at: '2026-03-01T12:30:00Z'\n" in text
    assert "updated_at: '2026-03-01T12:30:01.123456Z'\n" in text
    path = tombstone_path("ac me", full)
    parsed = parse(text, classify(path))
    assert parsed.record == full
    assert parsed.tenant == "ac me"
    assert parsed.tombstone == tomb
    assert render(parsed.record, parsed.tenant, parsed.tombstone) == text  # deterministic


def test_classify() -> None:
    info = classify(f"acme/c1/turns/user/20260301T123000Z__{ID}.md")
    assert info is not None
    assert (info.tenant, info.conversation_id, info.kind, info.role) == (
        "acme",
        "c1",
        "turn",
        "user",
    )
    assert info.id_from_name == ID and not info.deleted
    gone = classify(f"acme/c1/deleted/facts/20260301T123000Z__{ID}.md")
    assert gone is not None and gone.deleted and gone.kind == "fact"
    for ignored in (
        "README.md",
        "acme/notes.md",
        ".git/x/y.md",
        "acme/c1/facts/.summary.md.abc.tmp",
        "acme/c1/facts/.hidden.md",
        "acme/c1/facts/notes.txt",
    ):
        assert classify(ignored) is None, ignored
    assert classify(PurePosixPath("acme/c1/free.md")) is not None  # kind from front matter


def test_hand_written_file_gets_defaults_from_its_place() -> None:
    parsed = parse(
        "---\ncreated_at: 2026-03-01 10:00:00\nsource_id: 12\n---\n\nI like tea.\n",
        classify("acme/c1/turns/user/my note.md"),
        new_id=lambda: ID,
    )
    assert parsed.assigned_id
    assert parsed.tenant == "acme"
    r = parsed.record
    assert (r.id, r.kind, r.role, r.conversation_id, r.text) == (
        ID,
        "turn",
        "user",
        "c1",
        "I like tea.",
    )
    assert r.created_at == datetime(2026, 3, 1, 10, tzinfo=UTC)
    assert r.source_id == "12"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("just text", "no front matter"),
        ("---\nid: x\n", "not closed"),
        ("---\nkind: [\n---\nx\n", "not valid YAML"),
        ("---\n- a\n- b\n---\nx\n", "must be a mapping"),
        (f"---\nid: {ID}\ntgs: [a]\n---\nx\n", "unknown front matter keys: tgs"),
        ("---\nid: not-a-uuid\n---\nx\n", "not a UUID"),
        (f"---\nid: {ID}\n---\n\n   \n", "body"),
        (f"---\nid: {ID}\nkind: opinion\n---\nx\n", "kind"),
        (f"---\nid: {ID}\ntenant: other\n---\nx\n", "differs from the directory"),
        (f"---\nid: {ID}\ncreated_at: yesterday\n---\nx\n", "created_at"),
        (
            f"---\nid: {ID}\nprofile: {{category: mood, key: k, value: v}}\n---\nx\n",
            "profile",
        ),
        (f"---\nid: {ID}\nturn_range: [1]\n---\nx\n", "turn_range"),
    ],
)
def test_malformed_files_are_rejected_with_a_reason(content: str, message: str) -> None:
    with pytest.raises(MirrorFormatError, match=message):
        parse(content, classify("acme/c1/facts/x.md"))


def test_a_missing_id_is_an_error_without_new_id() -> None:
    with pytest.raises(MirrorFormatError, match="no id"):
        parse("---\nkind: fact\n---\nx\n", classify("acme/c1/facts/x.md"))
