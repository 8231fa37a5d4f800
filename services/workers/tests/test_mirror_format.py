"""The mirror's Markdown format: layout, path safety, render/parse round trip, bad files."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

import pytest

from engram_core import front_matter
from engram_core.memory import MemoryRecord, ProposedProfileFact
from engram_core.mirror_format import (
    MirrorFormatError,
    Tombstone,
    classify,
    decode_component,
    encode_component,
    live_path,
    memory_files,
    misplacement,
    parse,
    render,
    tombstone_path,
    under_deleted,
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
        ({}, f"acme/@u1/c1/facts/20260301T123000Z__{ID}.md"),
        ({"kind": "turn", "role": "user"}, f"acme/@u1/c1/turns/user/20260301T123000Z__{ID}.md"),
        (
            {"kind": "turn", "role": "assistant"},
            f"acme/@u1/c1/turns/assistant/20260301T123000Z__{ID}.md",
        ),
        ({"kind": "turn", "role": "weird"}, f"acme/@u1/c1/turns/other/20260301T123000Z__{ID}.md"),
        ({"kind": "profile"}, f"acme/@u1/c1/profile/20260301T123000Z__{ID}.md"),
        ({"kind": "episode"}, f"acme/@u1/c1/episodes/20260301T123000Z__{ID}.md"),
        ({"kind": "summary"}, "acme/@u1/c1/summaries/summary.md"),
        ({"created_at": None}, f"acme/@u1/c1/facts/undated__{ID}.md"),
        # No user: the level every single-user tree has always had.
        ({"user_id": ""}, f"acme/c1/facts/20260301T123000Z__{ID}.md"),
        ({"user_id": "", "kind": "summary"}, "acme/c1/summaries/summary.md"),
        (
            {"user_id": "", "conversation_id": "global"},
            f"acme/global/facts/20260301T123000Z__{ID}.md",
        ),
    ],
)
def test_live_layout(overrides: dict[str, object], expected: str) -> None:
    assert str(live_path("acme", record(**overrides))) == expected


def test_tombstones_keep_the_sub_path_under_deleted() -> None:
    assert str(tombstone_path("acme", record())) == (
        f"acme/@u1/c1/deleted/facts/20260301T123000Z__{ID}.md"
    )
    summary = record(kind="summary")
    assert str(tombstone_path("acme", summary)).startswith("acme/@u1/c1/deleted/summaries/2026")
    assert str(tombstone_path("acme", record(user_id=""))) == (
        f"acme/c1/deleted/facts/20260301T123000Z__{ID}.md"
    )


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
    path = live_path(hostile, record(conversation_id=hostile, user_id=hostile))
    assert len(path.parts) == 5 and ".." not in path.parts
    assert path.parts[1].startswith("@") and not path.parts[2].startswith("@")
    info = classify(path)
    assert info is not None and info.kind == "fact"
    if len(hostile) < 40:
        assert (info.tenant, info.user_id, info.conversation_id) == (hostile, hostile, hostile)


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
    assert (info.tenant, info.user_id, info.conversation_id, info.kind, info.role) == (
        "acme",
        "",
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
        "acme/@alice/notes.md",  # a user's folder holds conversations, not files
        "acme/@alice/.c1/facts/x.md",
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


PROFILE = "profile: {category: identity, key: name, value: Jane"


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("turn_index: 1000000000000000000000000000000", r"turn_index: out of range"),
        ("turn_index: 1.0e+30", r"turn_index: should be a whole number, not a float"),
        ("turn_index: 1e30", r"turn_index: should be a whole number, not a str"),
        ("turn_index: -1", r"turn_index: out of range \(-1"),
        ("turn_index: true", r"turn_index: should be a whole number, not a boolean"),
        ("turn_range: [3, 99999999999999999999]", r"turn_range.last_turn: out of range"),
        ("turn_range: {first_turn: -2, last_turn: 4}", r"turn_range.first_turn: out of range"),
        ("turn_range: [9, 3]", r"first_turn 9 is after last_turn 3"),
        (PROFILE + ", confidence: 1.0e+30}", r"profile.confidence: out of range"),
        (PROFILE + ", confidence: .nan}", r"profile.confidence: out of range"),
        (PROFILE + ", confidence: 0.9, importance: -.inf}", r"profile.importance: out of"),
        (PROFILE + ", confidence: true}", r"profile.confidence: should be a number"),
    ],
)
def test_numbers_out_of_range_are_the_files_error_with_the_field_named(
    header: str, message: str
) -> None:
    """A hand-typed number the index cannot store is refused where the file is read
    (reported, skipped), not published to fail its writes until it is dead-lettered."""
    with pytest.raises(MirrorFormatError, match=message):
        parse(f"---\nid: {ID}\nkind: fact\n{header}\n---\nx\n", classify("acme/c1/facts/x.md"))


def test_numbers_in_range_read_back() -> None:
    top = 2**63 - 1
    parsed = parse(
        f"---\nid: {ID}\nkind: episode\nturn_index: {top}\nturn_range: [0, {top}]\n---\nx\n",
        classify("acme/c1/episodes/x.md"),
    )
    assert (parsed.record.turn_index, parsed.record.turn_range) == (top, (0, top))
    profile = parse(
        f"---\nid: {ID}\nkind: profile\n{PROFILE}, confidence: 1, importance: 0}}\n---\nx\n",
        classify("acme/c1/profile/x.md"),
    ).record.profile
    assert profile is not None and (profile.confidence, profile.importance) == (1.0, 0.0)


def test_a_missing_id_is_an_error_without_new_id() -> None:
    with pytest.raises(MirrorFormatError, match="no id"):
        parse("---\nkind: fact\n---\nx\n", classify("acme/c1/facts/x.md"))


# --- the user level --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("user_id", "conversation_id", "directory"),
    [
        ("alice", "default", "acme/@alice/default"),
        ("bob", "default", "acme/@bob/default"),  # same conversation id, another folder
        ("@x", "c1", "acme/@%40x/c1"),  # a user named "@x": the "@" is escaped
        ("global", "global", "acme/@global/global"),  # a user named "global" is a user
        ("", "global", "acme/global"),  # the tenant-wide bucket
        ("", "@x", "acme/%40x"),  # a conversation can never look like a user folder
        ("a/b", "c d", "acme/@a%2Fb/c%20d"),
    ],
)
def test_a_users_conversation_has_its_own_folder_and_classify_reads_it_back(
    user_id: str, conversation_id: str, directory: str
) -> None:
    memory = record(user_id=user_id, conversation_id=conversation_id)
    for path in (live_path("acme", memory), tombstone_path("acme", memory)):
        assert str(path).startswith(directory + "/")
        info = classify(path)
        assert info is not None
        assert (info.tenant, info.user_id, info.conversation_id, info.kind) == (
            "acme",
            user_id,
            conversation_id,
            "fact",
        )
        assert info.deleted == ("/deleted/" in str(path))
        assert info.id_from_name == ID
        assert under_deleted(path) == info.deleted


def test_two_users_summaries_of_one_conversation_do_not_collide() -> None:
    alice = record(kind="summary", user_id="alice", conversation_id="default")
    bob = record(kind="summary", user_id="bob", conversation_id="default")
    assert str(live_path("acme", alice)) == "acme/@alice/default/summaries/summary.md"
    assert str(live_path("acme", bob)) == "acme/@bob/default/summaries/summary.md"


def test_long_user_ids_are_hashed_and_classify_says_it_cannot_read_them() -> None:
    long_user = "u" * 300
    path = live_path("acme", record(user_id=long_user))
    user_dir = path.parts[1]
    assert user_dir.startswith("@") and len(user_dir) <= 121 and "~" in user_dir
    assert user_dir != live_path("acme", record(user_id="u" * 299 + "v")).parts[1]
    info = classify(path)
    assert info is not None and info.user_id is None and info.conversation_id == "c1"
    # The front matter carries the id, so the file still parses to the right user.
    parsed = parse(render(record(user_id=long_user), "acme"), info)
    assert parsed.record.user_id == long_user
    assert misplacement(parsed, info) is None


def test_classify_and_under_deleted_see_the_user_level() -> None:
    assert under_deleted("acme/@alice/c1/deleted")
    assert under_deleted(f"acme/@alice/c1/deleted/facts/x__{ID}.md")
    assert under_deleted("acme/c1/deleted/facts/x.md")
    assert not under_deleted("acme/@alice/deleted/facts/x.md")  # a conversation named deleted
    assert not under_deleted("acme/c1/facts/x.md")
    named_deleted = classify("acme/@alice/deleted/facts/x.md")
    assert named_deleted is not None and named_deleted.conversation_id == "deleted"
    assert not named_deleted.deleted
    unreadable = classify("acme/@/c1/facts/x.md")  # "@" alone is no user id
    assert unreadable is not None and unreadable.user_id is None


def test_memory_files_walks_both_levels(tmp_path: Path) -> None:
    for rel in (
        "acme/global/facts/a.md",
        "acme/@alice/default/facts/b.md",
        "acme/@alice/default/deleted/facts/c.md",
        "acme/@alice/stray.md",  # not in a conversation: not a memory file
        "acme/notes.md",
        "README.md",
        "acme/@alice/default/facts/.d.md.x.tmp",
    ):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x", encoding="utf-8")
    (tmp_path / "globex/c1/facts").mkdir(parents=True)
    (tmp_path / "globex/c1/facts/e.md").write_text("x", encoding="utf-8")
    acme = [
        "acme/@alice/default/deleted/facts/c.md",
        "acme/@alice/default/facts/b.md",
        "acme/global/facts/a.md",
    ]
    assert memory_files(tmp_path) == [*acme, "globex/c1/facts/e.md"]
    assert memory_files(tmp_path, "acme") == acme  # one tenant's, still root-relative
    assert memory_files(tmp_path, "nobody") == []


def test_a_file_dropped_into_a_users_folder_is_that_users() -> None:
    parsed = parse(
        "---\nkind: fact\n---\n\nI am allergic to cats.\n",
        classify("acme/@alice/c1/facts/note.md"),
        new_id=lambda: ID,
    )
    assert (parsed.record.user_id, parsed.record.conversation_id) == ("alice", "c1")
    info = classify("acme/@alice/c1/facts/note.md")
    assert info is not None and misplacement(parsed, info) is None
    # Dropped at the no-user level, it has no user (and belongs there).
    at_top = classify("acme/c1/facts/note.md")
    assert at_top is not None
    plain = parse("---\nkind: fact\n---\n\nx\n", at_top, new_id=lambda: ID)
    assert plain.record.user_id == "" and misplacement(plain, at_top) is None


@pytest.mark.parametrize(
    ("rel", "front", "reason"),
    [
        (
            "acme/@alice/c1/facts/x.md",
            "user_id: bob",
            "user_id 'bob' differs from the directory '@alice'",
        ),
        (
            "acme/@alice/c1/facts/x.md",
            "user_id: ''",
            "user_id '' differs from the directory '@alice'",
        ),
        ("acme/c1/facts/x.md", "user_id: alice", "belong under '@alice'"),
        (
            "acme/@alice/c1/facts/x.md",
            "conversation_id: c2",
            "conversation_id 'c2' differs from the directory 'c1'",
        ),
        ("acme/c1/facts/x.md", "conversation_id: c2", "conversation_id 'c2'"),
        (
            # not a reversible name: no user to infer
            f"acme/@{encode_component('u' * 300)}/c1/facts/x.md",
            "kind: fact",
            "cannot be read back from the name: write the user_id",
        ),
        (
            f"acme/@alice/{encode_component('c' * 300)}/facts/x.md",
            "kind: fact",
            "write the conversation_id in the front matter",
        ),
    ],
)
def test_a_file_naming_another_scope_than_its_folder_is_misplaced(
    rel: str, front: str, reason: str
) -> None:
    info = classify(rel)
    assert info is not None
    parsed = parse(f"---\n{front}\n---\n\nI am allergic to cats.\n", info, new_id=lambda: ID)
    problem = misplacement(parsed, info)
    assert problem is not None and reason in problem, problem
    assert "allergic" not in problem  # never the file's text


EVERYDAY = [
    record(source_turn_ids=[ID], tags=["food"], metadata={"source": "chat", "lang": "en"}),
    record(kind="turn", role="user", turn_index=7),
    record(
        kind="profile",
        profile=ProposedProfileFact(
            category="preference", key="food", value="no pizza", confidence=0.9
        ),
    ),
    record(kind="episode", turn_range=(5, 8), valid_to=datetime(2026, 12, 1, tzinfo=UTC)),
    record(  # a summary keeps the ids of the last 100 facts it folded
        kind="summary", metadata={"revision": "12", "folded_fact_ids": " ".join([ID] * 100)}
    ),
]


@pytest.mark.parametrize("memory", EVERYDAY, ids=lambda m: m.kind)
def test_everyday_memories_render_as_pyyaml_would_without_calling_it(
    memory: MemoryRecord, monkeypatch: pytest.MonkeyPatch
) -> None:
    tombstone = Tombstone(reason="evicted", at=CREATED)
    direct = front_matter.dump
    monkeypatch.setattr(front_matter, "dump", front_matter.dump_with_pyyaml)
    by_pyyaml = [render(memory, "default"), render(memory, "default", tombstone)]

    def refuse(front: object) -> str:
        raise AssertionError(f"fell back to PyYAML for {front}")

    monkeypatch.setattr(front_matter, "dump", direct)
    monkeypatch.setattr(front_matter, "dump_with_pyyaml", refuse)
    assert [render(memory, "default"), render(memory, "default", tombstone)] == by_pyyaml
    assert parse(by_pyyaml[0]).record == memory


def test_an_unusual_header_falls_back_to_pyyaml_and_reads_back() -> None:
    memory = record(conversation_id="trip: 'Rome' #2", metadata={"note": "a\nb"})
    text = render(memory, "default")
    assert "conversation_id: 'trip: ''Rome'' #2'" in text
    assert parse(text).record == memory
