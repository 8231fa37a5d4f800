"""Reconcile's planning core with a fake model: no NATS, no retrieval, no HTTP.

The worker tests (test_reconcile.py) drive the same rules through the real stack; these
pin each rule on its own."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from engram_core.events import FactProposed
from engram_core.ids import fact_memory_id
from engram_core.memory import MemoryRecord, ProposedProfileFact
from engram_core.near_duplicates import normalise_text
from engram_testing.fake_llm import FakeAsk
from engram_workers import prompts
from engram_workers.llm import FellBack
from engram_workers.reconcile import core

SAID_AT = datetime(2026, 3, 1, 12, tzinfo=UTC)


def proposal(*facts: str, turn: str = "turn-2", profile: list[ProposedProfileFact] | None = None):
    return FactProposed(
        tenant="acme",
        user_id="alice",
        conversation_id="c1",
        source_turn_id=turn,
        turn_created_at=SAID_AT,
        facts=list(facts),
        profile=profile or [],
    )


def fact(text: str, memory_id: str | None = None, **fields: object) -> MemoryRecord:
    values: dict[str, object] = {
        "id": memory_id or core.base_fact_id(proposal(), text),
        "kind": "fact",
        "text": text,
        "user_id": "alice",
        "conversation_id": "c1",
        "source_turn_ids": ["turn-1"],
        "created_at": datetime(2026, 1, 1, tzinfo=UTC),
    }
    return MemoryRecord.model_validate(values | fields)


def decisions(*items: dict[str, object]) -> prompts.ReconcileOutput:
    return prompts.ReconcileOutput.model_validate({"decisions": list(items)})


# --- the model's decisions, checked -------------------------------------------------------


def test_decisions_on_unknown_facts_or_targets_are_rejected_and_the_fact_is_added() -> None:
    shown = {1: fact("User loves pizza", "pizza")}
    resolved, rejected = core.resolve_decisions(
        ["User hates pizza"],
        shown,
        decisions(
            {"fact": 3, "event": "ADD"},
            {"fact": 0, "event": "DELETE", "target": 7},
        ),
    )
    assert [(r.reason, r.fact, r.target) for r in rejected] == [
        ("unknown fact", 3, None),
        ("unknown target", 0, 7),
    ]
    assert resolved == [core.FactDecision("ADD", "User hates pizza")]


def test_update_takes_the_models_text_and_maps_short_ids_to_memory_ids() -> None:
    shown = {1: fact("User's wife is Jane", "jane"), 2: fact("User is married", "married")}
    resolved, rejected = core.resolve_decisions(
        ["User's wife is named Anne"],
        shown,
        decisions(
            {"fact": 0, "event": "UPDATE", "target": 1, "text": " User's  wife is Anne "},
            {"fact": 0, "event": "UPDATE", "target": 1},
            {"fact": 0, "event": "DELETE", "target": 2},
        ),
    )
    assert rejected == []
    assert resolved == [core.FactDecision("UPDATE", "User's wife is Anne", ("jane", "married"))]


def test_none_alone_keeps_what_is_stored() -> None:
    shown = {1: fact("User likes green tea", "tea")}
    resolved, _ = core.resolve_decisions(
        ["User likes green tea."], shown, decisions({"fact": 0, "event": "NONE", "target": 1})
    )
    assert resolved == [core.FactDecision("NONE", "User likes green tea.")]


async def test_nothing_similar_is_all_add_without_asking() -> None:
    ask = FakeAsk()
    decided = await core.decide(["User has a dog"], {}, ask)
    assert decided.decisions == [core.FactDecision("ADD", "User has a dog")]
    assert ask.asked == []


async def test_the_model_sees_short_ids_and_the_new_facts() -> None:
    shown = {1: fact("User loves pizza", "pizza")}
    ask = FakeAsk({"reconcile": {"decisions": [{"fact": 0, "event": "DELETE", "target": 1}]}})
    decided = await core.decide(["User hates pizza"], shown, ask)
    assert decided.decisions == [core.FactDecision("DELETE", "User hates pizza", ("pizza",))]
    [question] = ask.asked
    assert question.payload == prompts.ReconcileInput(
        existing=[prompts.ExistingMemory(id=1, text="User loves pizza")],
        new_facts=["User hates pizza"],
    )


async def test_a_model_that_fails_adds_every_fact() -> None:
    shown = {1: fact("User loves pizza", "pizza")}
    ask = FakeAsk({"reconcile": FellBack("unusable", "the model's answer was unusable")})
    decided = await core.decide(["User hates pizza", "User has a cat"], shown, ask)
    assert [d.action for d in decided.decisions] == ["FALLBACK", "FALLBACK"]
    assert decided.fallback == "the model's answer was unusable"


def test_the_neighbourhood_is_numbered_most_similar_first() -> None:
    records = {i: fact(t, i) for i, t in (("a", "A"), ("b", "B"), ("c", "C"))}
    shown = core.numbered_neighbourhood([{"a": 0.5, "b": 0.9}, {"a": 0.95, "c": 0.1}], records)
    assert [(n, m.id) for n, m in shown.items()] == [(1, "a"), (2, "b"), (3, "c")]


# --- facts ------------------------------------------------------------------------------


def context(
    p: FactProposed,
    *,
    similar: dict[str, dict[str, float]] | None = None,
    neighbours: Sequence[MemoryRecord] = (),
    stored: Sequence[MemoryRecord] = (),
) -> core.FactContext:
    return core.FactContext(
        proposal=p,
        similar={normalise_text(k): v for k, v in (similar or {}).items()},
        neighbours={m.id: m for m in neighbours},
        stored={m.id: m for m in stored},
        near_duplicate_cosine=0.9,
    )


def test_a_contradiction_supersedes_the_old_fact_and_keeps_it_as_history() -> None:
    p = proposal("User hates pizza")
    old = fact("User loves pizza", "pizza")
    plan = core.Plan()
    decision = core.FactDecision("DELETE", "User hates pizza", ("pizza",))
    core.plan_facts(plan, [decision], context(p, stored=[old]))
    [created, superseded] = plan.changes
    assert created.op == "created" and created.record.text == "User hates pizza"
    assert created.record.id == core.base_fact_id(p, "User hates pizza")
    assert created.record.source_turn_ids == ["turn-2"]
    assert created.record.metadata["supersedes"] == "pizza"
    assert superseded.op == "superseded" and superseded.record.id == "pizza"
    assert superseded.record.superseded_by == created.record.id
    assert superseded.record.valid_to == SAID_AT
    assert [(c.outdated.id, c.by) for c in plan.corrections] == [("pizza", created.record.id)]


def test_a_near_duplicate_is_not_stored_again_unless_a_name_or_number_differs() -> None:
    p = proposal("The user likes green tea", "User loves painting number 2")
    tea = fact("User likes green tea", "tea")
    painting = fact("User loves painting number 1", "painting")
    ctx = context(
        p,
        similar={
            "The user likes green tea": {"tea": 0.98},
            "User loves painting number 2": {"painting": 0.97},
        },
        neighbours=[tea, painting],
    )
    plan = core.Plan()
    core.plan_facts(
        plan,
        [core.FactDecision("ADD", f) for f in p.facts],
        ctx,
    )
    assert [c.record.text for c in plan.changes] == ["User loves painting number 2"]


def test_a_statement_true_again_after_being_replaced_gets_a_new_version() -> None:
    p = proposal("User loves pizza", turn="turn-9")
    first = fact("User loves pizza", superseded_by="hates-pizza")
    plan = core.Plan()
    core.plan_facts(
        plan, [core.FactDecision("ADD", "User loves pizza")], context(p, stored=[first])
    )
    [created] = plan.changes
    assert created.record.id != first.id
    assert created.record.id == fact_memory_id("acme", "alice", "c1", "User loves pizza", "turn-9")


def test_an_update_naming_the_same_statement_changes_nothing() -> None:
    p = proposal("User loves pizza.")
    stored = fact("User loves pizza")
    plan = core.Plan()
    decision = core.FactDecision("UPDATE", "user loves pizza", (stored.id,))
    core.plan_facts(
        plan,
        [decision],
        context(
            p, similar={"user loves pizza": {stored.id: 1.0}}, neighbours=[stored], stored=[stored]
        ),
    )
    assert plan.changes == []


# --- profile ------------------------------------------------------------------------------


def profile_entry(value: str, confidence: float, key: str = "home_city") -> ProposedProfileFact:
    return ProposedProfileFact(
        category="identity", key=key, value=value, confidence=confidence, importance=0.5
    )


def held(value: str, confidence: float) -> MemoryRecord:
    entry = profile_entry(value, confidence)
    return MemoryRecord(
        id=f"held-{value}",
        kind="profile",
        text=f"identity/home_city: {value}",
        user_id="alice",
        profile=entry,
    )


def test_a_less_confident_value_never_replaces_a_surer_one() -> None:
    p = proposal(profile=[profile_entry("Porto", 0.5)])
    plan = core.Plan()
    kept = core.plan_profile(plan, p, [held("Lisbon", 0.9)], {})
    assert plan.changes == []
    assert kept == ["identity/home_city: the active value has a higher confidence"]


def test_a_new_value_supersedes_the_old_and_the_same_value_said_surer_is_raised() -> None:
    p = proposal(profile=[profile_entry("Porto", 0.9)])
    plan = core.Plan()
    core.plan_profile(plan, p, [held("Lisbon", 0.8)], {})
    assert [(c.op, c.record.text) for c in plan.changes] == [
        ("created", "identity/home_city: Porto"),
        ("superseded", "identity/home_city: Lisbon"),
    ]
    again = core.Plan()
    core.plan_profile(
        again, proposal(profile=[profile_entry("lisbon", 0.95)]), [held("Lisbon", 0.8)], {}
    )
    [raised] = again.changes
    assert raised.op == "updated" and raised.record.profile is not None
    assert raised.record.profile.confidence == 0.95


# --- replay -------------------------------------------------------------------------------


def test_a_replayed_proposal_announces_what_the_first_delivery_stored() -> None:
    p = proposal("User hates pizza")
    new = fact(
        "User hates pizza",
        source_turn_ids=["turn-2"],
        metadata={"decision": "DELETE", "supersedes": "pizza"},
    )
    old = fact("User loves pizza", "pizza", superseded_by=new.id)
    applied = core.applied_by(p, [new, fact("User has a cat")])
    assert applied == [new]
    plan = core.replay_plan(applied, {"pizza": old})
    assert [(c.op, c.record.id, c.cause) for c in plan.changes] == [
        ("created", new.id, "reconcile:DELETE"),
        ("superseded", "pizza", "reconcile:DELETE"),
    ]


def test_a_learned_fact_names_the_chat_model_of_its_turn() -> None:
    """What summarize asks when no task model is set, without reading the turn again."""
    said = proposal("User lives in Porto.").model_copy(update={"model": "llama3.1"})
    record = core.learned_record(said, "m1", "ADD", [], kind="fact", text="User lives in Porto.")
    assert record.metadata["model"] == "llama3.1"
    unnamed = core.learned_record(proposal("x"), "m2", "ADD", [], kind="fact", text="x")
    assert "model" not in unnamed.metadata
