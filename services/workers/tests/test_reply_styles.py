"""The reply styles of local models, for each task the workers ask (issue 36).

Every style of :mod:`engram_cli.stack.reply_styles` dresses the rule-based brain's answer the
way a family of small or reasoning models writes it; the real client
(:class:`~engram_workers.llm.LlmClient` over HTTP, against the scripted upstream) asks
under the one policy (:class:`~engram_workers.llm.AskLlm`), and each task's core says
what was learned. A style that cannot be used ends in the task's documented fallback,
counted by ``engram.llm.fallbacks`` — never in a silent loss.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource

from engram_cli.stack.reply_styles import REPLY_STYLES, UNUSABLE_STYLES, styled
from engram_cli.stack.scripted_llm import Completion, RuleBasedBrain
from engram_core.memory import MemoryRecord
from engram_core.metrics import setup_metrics
from engram_testing.metrics import metric
from engram_testing.upstream import ScriptedUpstream
from engram_workers.extraction import Extraction, clean_output, extract
from engram_workers.llm import AskLlm, FellBack, LlmClient, LlmSettingsMixin
from engram_workers.prompts import ExtractOutput, ReconcileOutput, SummaryOutput
from engram_workers.reconcile import core as reconcile_core
from engram_workers.replies import ModelReply, UnusableReply, parse_reply, split_reasoning
from engram_workers.summarize import core as summarize_core

SAID = "My kayak is called Zephyr and I paddle it every Sunday."
USABLE = sorted(set(REPLY_STYLES) - UNUSABLE_STYLES)


@pytest.fixture(scope="module")
def upstream() -> Iterator[ScriptedUpstream]:
    running = ScriptedUpstream().start()
    try:
        yield running
    finally:
        running.stop()


async def asked_in_style(
    upstream: ScriptedUpstream, style: str, model: str, ask_task: Callable[[AskLlm], Awaitable[Any]]
) -> Any:
    upstream.replies = [styled(RuleBasedBrain(), style)]
    client = LlmClient(
        LlmSettingsMixin(llm_base_url=upstream.base_url, llm_timeout_s=5.0, llm_model=model)
    )
    try:
        return await ask_task(AskLlm(client))
    finally:
        await client.close()


# --- extraction -------------------------------------------------------------------------


async def extract_kayak(ask: AskLlm) -> Extraction | FellBack:
    return await extract(ask, message=SAID, date=datetime(2026, 3, 1, tzinfo=UTC), context=[])


@pytest.mark.parametrize("style", USABLE)
async def test_extraction_learns_the_fact_in_every_usable_style(
    upstream: ScriptedUpstream, style: str
) -> None:
    setup_metrics(Resource.create({"service.name": "engram-test"}))
    model = f"styles-extract-{style}"
    extracted = await asked_in_style(upstream, style, model, extract_kayak)
    assert isinstance(extracted, Extraction), extracted
    assert "User's kayak is called Zephyr" in extracted.facts
    assert metric("engram_llm_tasks_total", gen_ai_request_model=model) == 1
    assert metric("engram_llm_fallbacks_total", gen_ai_request_model=model) == 0


# --- reconcile --------------------------------------------------------------------------

ZEPHYR = MemoryRecord(id="zephyr-1", kind="fact", text="User's kayak is called Zephyr")


async def reconcile_rename(ask: AskLlm) -> reconcile_core.Decided:
    return await reconcile_core.decide(["User's kayak is called Zephyrus"], {1: ZEPHYR}, ask)


@pytest.mark.parametrize("style", USABLE)
async def test_reconcile_applies_the_decision_in_every_usable_style(
    upstream: ScriptedUpstream, style: str
) -> None:
    decided = await asked_in_style(upstream, style, f"styles-reconcile-{style}", reconcile_rename)
    assert not decided.fallback
    assert [(d.action, d.text, d.targets) for d in decided.decisions] == [
        ("UPDATE", "User's kayak is called Zephyrus", ("zephyr-1",))
    ]


# --- summary ----------------------------------------------------------------------------


async def summarize_kayak(ask: AskLlm) -> summarize_core.Written:
    return await summarize_core.write_summary(
        "The user likes rivers.", ["User's kayak is called Zephyr"], ask, 2000
    )


@pytest.mark.parametrize("style", USABLE)
async def test_the_summary_is_the_models_in_every_usable_style(
    upstream: ScriptedUpstream, style: str
) -> None:
    model = f"styles-summary-{style}"
    written = await asked_in_style(upstream, style, model, summarize_kayak)
    assert written.how == {"summarizer": "llm", "model": model}
    assert written.text == "The user likes rivers. User's kayak is called Zephyr."


# --- what cannot be used: the fallback, counted -------------------------------------------


@pytest.mark.parametrize("style", sorted(UNUSABLE_STYLES))
async def test_an_unusable_reply_ends_in_each_tasks_fallback_and_is_counted(
    upstream: ScriptedUpstream, style: str
) -> None:
    setup_metrics(Resource.create({"service.name": "engram-test"}))
    models = {task: f"styles-{task}-{style}" for task in ("extract", "reconcile", "summary")}

    extracted = await asked_in_style(upstream, style, models["extract"], extract_kayak)
    assert isinstance(extracted, FellBack) and extracted.kind == "unusable"
    assert models["extract"] in extracted.reason  # the reason names the model

    decided = await asked_in_style(upstream, style, models["reconcile"], reconcile_rename)
    assert decided.fallback  # every new fact is added: nothing lost
    assert [(d.action, d.text) for d in decided.decisions] == [
        ("FALLBACK", "User's kayak is called Zephyrus")
    ]

    written = await asked_in_style(upstream, style, models["summary"], summarize_kayak)
    assert written.fell_back and "unusable" in written.how["fallback_reason"]
    assert "User's kayak is called Zephyr" in written.text  # the rule-based summary

    for task, model in (
        ("extract_facts", models["extract"]),
        ("reconcile", models["reconcile"]),
        ("summarize", models["summary"]),
    ):
        labels = {"engram_llm_task": task, "gen_ai_request_model": model}
        assert metric("engram_llm_fallbacks_total", engram_llm_fallback="unusable", **labels) == 1
        assert metric("engram_llm_tasks_total", engram_llm_outcome="unusable", **labels) == 1
        # asked, then asked again with the reason
        assert [r["model"] for r in upstream.chat_requests()].count(model) == 2


# --- the parse layer on its own -----------------------------------------------------------


def test_the_issues_reply_yields_the_answer_not_the_draft_in_the_reasoning() -> None:
    reply = (
        '<think>\nThe user said something. Maybe the answer is {"facts": []}? No, wait, '
        "let me check again what they said before answering.\n</think>\n\n"
        '{"facts": ["User\'s kayak is called Zephyr"]}'
    )
    parsed = parse_reply(ModelReply(reply), ExtractOutput)
    assert parsed.facts == ["User's kayak is called Zephyr"]


@pytest.mark.parametrize(
    ("text", "facts"),
    [
        # the last complete value is the answer; an earlier one was a draft
        ('First {"facts": ["draft"]}, then {"facts": ["final"]}.', ["final"]),
        # a fenced value comes before one in the prose
        ('Like {"facts": ["prose"]}:\n```json\n{"facts": ["fenced"]}\n```', ["fenced"]),
        # a nested value when the outer one is not the answer
        ('{"result": {"facts": ["nested"]}}', ["nested"]),
        # an object naming none of the fields is not the answer (a profile entry, {})
        ('{"facts": ["kept"]} and {}', ["kept"]),
        ("{'facts': ['single quoted',], /* note */ 'profile': [],}", ["single quoted"]),
        ('{"facts": ["python"], "done": True, "note": None}', ["python"]),
        ("Okay.\n</think>\n['bare list']", ["bare list"]),
    ],
)
def test_the_candidates_and_their_order(text: str, facts: list[str]) -> None:
    assert parse_reply(ModelReply(text), ExtractOutput).facts == facts


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (ModelReply(""), "the reply is empty"),
        (ModelReply("[No facts]"), "no JSON value found"),  # prose in brackets stays prose
        (ModelReply('{"facts": ["User li'), "no JSON value found"),
        (ModelReply('{"facts": ["cut', truncated=True), "cut at the token limit"),
        (ModelReply('{"facts": "not a list"}'), "facts: Input should be a valid list"),
        (ModelReply('{"answer": 1}'), "naming none of the fields"),
    ],
)
def test_what_is_never_accepted_says_why(reply: ModelReply, why: str) -> None:
    with pytest.raises(UnusableReply, match=why):
        parse_reply(reply, ExtractOutput)


def test_the_reasoning_is_only_a_last_resort() -> None:
    draft_in_reasoning = '<think>{"facts": []}</think>'
    # an answer outside the reasoning that does not validate is not replaced by the draft
    with pytest.raises(UnusableReply):
        parse_reply(ModelReply(draft_in_reasoning + '{"facts": "x"}'), ExtractOutput)
    # nor is an answer cut at the token limit
    with pytest.raises(UnusableReply, match="token limit"):
        parse_reply(ModelReply(draft_in_reasoning, truncated=True), ExtractOutput)
    # nothing outside it: the reasoning's last value, the field's included
    assert parse_reply(ModelReply(draft_in_reasoning), ExtractOutput).facts == []
    field_only = ModelReply("", reasoning='Maybe {"summary": ""}. So: {"summary": "S"}')
    assert parse_reply(field_only, SummaryOutput).summary == "S"


def test_reasoning_blocks_of_every_shape_are_set_apart() -> None:
    assert split_reasoning("<think>a</think>\n{}") == ("{}", "a")
    assert split_reasoning("<Thinking>a</Thinking><reasoning>b</reasoning>{}") == ("{}", "a\nb")
    assert split_reasoning("a\n</think>\n{}") == ("{}", "a")  # opened by the template
    assert split_reasoning("{} <think>still going") == ("{}", "still going")  # never closed
    harmony = (
        "<|channel|>analysis<|message|>a<|end|>"
        "<|start|>assistant<|channel|>final<|message|>{}<|return|>"
    )
    visible, thought = split_reasoning(harmony)
    assert visible == "{}" and "a" in thought


def test_a_list_is_tried_as_each_list_field_of_the_schema() -> None:
    decisions = '[{"fact": 0, "event": "ADD"}]'
    assert parse_reply(ModelReply(decisions), ReconcileOutput).decisions[0].event == "ADD"
    with pytest.raises(UnusableReply, match="a list"):
        parse_reply(ModelReply('["a summary"]'), SummaryOutput)


def test_every_style_has_a_case_and_the_scripted_upstream_sends_reasoning_fields() -> None:
    assert {"think_with_draft", "think", "fence_json", "fence_bare", "prose_around", "list"} <= set(
        REPLY_STYLES
    )
    assert {"json5", "python_literals", "truncated", "empty", "refusal"} <= set(REPLY_STYLES)
    completion = Completion("{}", reasoning="hmm", reasoning_field="reasoning")
    assert completion.message() == {"role": "assistant", "content": "{}", "reasoning": "hmm"}


def test_what_small_models_overdo_in_an_extraction_costs_only_that_part() -> None:
    reply = json.dumps(
        {
            "facts": ["User has a kayak", "User named it Zephyr", "User paddles", "User rows"],
            "profile": [
                {"category": "hobby", "key": "sport", "value": "kayak", "confidence": 0.9},
                {"category": "identity", "key": "kayak", "value": "Zephyr", "confidence": 95},
                {
                    "category": "preference",
                    "key": "day",
                    "value": "Sunday",
                    "confidence": 0.8,
                    "reason": "said so",
                },
            ],
        }
    )
    parsed = parse_reply(ModelReply(reply), ExtractOutput)
    facts, profile = clean_output(parsed)
    assert facts == ["User has a kayak", "User named it Zephyr", "User paddles"]  # 3 kept
    # an unknown category or a confidence out of range drops that entry; an extra field
    # is ignored: the facts beside them still count
    assert [(p.category, p.key, p.value) for p in profile] == [("preference", "day", "Sunday")]
    schema = ExtractOutput.model_json_schema()
    assert schema["properties"]["facts"]["maxItems"] == 3  # still asked for at most 3


def test_a_pathological_reply_costs_a_bounded_time() -> None:
    started = time.perf_counter()
    with pytest.raises(UnusableReply):
        parse_reply(ModelReply("{[" * 8000 + "I could not"), ExtractOutput)
    assert time.perf_counter() - started < 2.0  # about 0.25 s here


def test_a_style_dresses_the_workers_tasks_and_leaves_chats_alone() -> None:
    dressed = styled(RuleBasedBrain("Noted."), "think_with_draft")
    chat = {"messages": [{"role": "user", "content": "My kayak is called Zephyr."}]}
    task = {
        "messages": [
            {"role": "system", "content": "engram-task: summarize\n..."},
            {"role": "user", "content": json.dumps({"previous_summary": "", "new_facts": ["F"]})},
        ]
    }
    assert dressed(chat) == "Noted."
    answer = dressed(task)
    assert isinstance(answer, str) and answer.startswith("<think>")
    assert answer.endswith('{"summary": "F."}')
