"""Summarize worker: the rolling summary of each conversation, and its episodes.

Consumes ``engram.memory.changed.v1`` (durable consumer ``summarize``):

- a **fact** ``created`` → fold the new fact (and any other current fact the summary
  does not include yet) into the conversation's rolling summary: one ``summary`` point
  per conversation, with a deterministic id, which Search attaches to its response;
- a **turn** ``created`` → when at least ``episode_turns + 1`` turns are not yet
  covered by an episode, compress the oldest ``episode_turns`` of them into one
  ``episode`` (turn range, source turn ids; embedded, so it is searchable).

Changes this worker caused itself (kinds ``summary`` and ``episode``) are ignored.
Both jobs hold a per-conversation lock (:class:`~engram_workers.locks.KeyLocks`), so two
replicas never fold into the same summary at once (no lost update) nor build the same
window twice. A model that answers junk, refuses the request, or stays unavailable until
the last delivery gets the documented rule-based fallback: nothing is lost.

Idempotency: the summary's metadata lists the fact ids it already includes, so a
redelivered fact is not folded twice; an episode's id derives from the turns it covers,
and a window once covered is never built again. A redelivery re-publishes the
``memory.changed`` of what the first delivery wrote (same event ids, de-duplicated by
JetStream), so a crash between the write and the publish loses no event.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
from pydantic import Field

from engram_core.events import MemoryChanged, MemoryChangeOp, deterministic_event_id
from engram_core.logging import get_logger
from engram_core.memory_record import record_from_pb
from engram_core.proto import pb
from engram_workers import tasks
from engram_workers.llm import (
    LlmClient,
    LlmOutputError,
    LlmRequestError,
    LlmSettingsMixin,
    LlmUnavailable,
)
from engram_workers.locks import KeyLocks, LockSettingsMixin, LockTimeout
from engram_workers.runtime import (
    Delivery,
    RetryableError,
    Worker,
    WorkerSettings,
    WorkerSpec,
    rpc_failure,
    run_worker,
)

log = get_logger(__name__)

T = TypeVar("T")

#: Fixed forever: changing it would give every summary and episode a new id.
SUMMARY_NAMESPACE = uuid.UUID("0b5c0a8e-6d1f-5f7a-9b2e-73756d6d6172")
EPISODE_NAMESPACE = uuid.UUID("0b5c0a8e-6d1f-5f7a-9b2e-657069736f64")

#: How many of the most recently folded fact ids the summary remembers. A redelivery
#: comes within minutes (max_deliver retries with backoff), far fewer folds than this.
FOLDED_IDS_KEPT = 100
#: Other not-yet-folded current facts folded along with the one that triggered.
FOLD_BATCH = 20
#: Windows built for one turn event; a backlog (a late start) drains over later turns.
MAX_WINDOWS_PER_EVENT = 5
#: Newest episodes read to find the numbering anchor (and re-announce on redelivery).
ANCHOR_PAGE = MAX_WINDOWS_PER_EVENT
LIST_PAGE = 100

SUMMARIZER_LLM = "llm"
SUMMARIZER_RULES = "rule-based"


class SummarizeSettings(WorkerSettings, LlmSettingsMixin, LockSettingsMixin):
    health_port: int = Field(
        default=8203, ge=0, le=65535, description="Port of /healthz and /readyz; 0 disables."
    )
    summarize_model: str = Field(
        default="",
        description="Model for summaries and episodes (default: ENGRAM_LLM_MODEL, then the "
        "chat model recorded on the source turns).",
    )
    episode_turns: int = Field(
        default=20, ge=2, le=500, description="Turns per episode (the window size N)."
    )
    summary_max_chars: int = Field(
        default=2000, ge=200, le=20000, description="Upper bound of the rolling summary."
    )
    episode_max_chars: int = Field(
        default=1500, ge=200, le=20000, description="Upper bound of one episode's text."
    )


@dataclass
class SummarizeResources:
    llm: LlmClient
    locks: KeyLocks


@asynccontextmanager
async def open_resources(worker: Worker[Any]) -> AsyncIterator[SummarizeResources]:
    settings: SummarizeSettings = worker.settings  # type: ignore[assignment]
    llm = LlmClient(settings)
    try:
        async with KeyLocks.from_settings(settings, settings.nats_url) as locks:
            yield SummarizeResources(llm=llm, locks=locks)
    finally:
        await llm.close()


# --- ids ---------------------------------------------------------------------------------


def summary_memory_id(tenant: str, conversation_id: str) -> str:
    """The one summary point of a conversation."""
    return str(uuid.uuid5(SUMMARY_NAMESPACE, "\x1f".join((tenant, conversation_id))))


def episode_memory_id(tenant: str, conversation_id: str, turn_ids: Sequence[str]) -> str:
    """An episode is named by the turns it covers: the same window, the same point."""
    return str(
        uuid.uuid5(
            EPISODE_NAMESPACE, "\x1f".join((tenant, conversation_id, ",".join(sorted(turn_ids))))
        )
    )


# --- prompts -----------------------------------------------------------------------------

SUMMARY_INSTRUCTIONS = """\
You maintain the rolling summary of one conversation between a user and an assistant.
The input has `previous_summary` (may be empty) and `new_facts`: statements just learned.
Write the updated summary:
- keep durable information: who the user is, preferences, constraints, plans, decisions,
  ongoing tasks, names, dates and numbers;
- drop chit-chat, greetings and pleasantries;
- when a new fact contradicts or updates something in the previous summary, keep only the
  new information and drop the superseded one;
- never invent anything; write in the third person ("The user ...");
- stay compact: at most {max_chars} characters.
Answer with one JSON object: {{"summary": "<the updated summary>"}}."""

EPISODE_INSTRUCTIONS = """\
Summarise one window of a conversation between a user and an assistant: turns
{first_turn} to {last_turn}, each with its number `n`, `role` and `text`.
Write one compact paragraph that keeps what matters later: what the user said about
themselves, asked, decided or planned; what the assistant answered or recommended; names,
dates and numbers. Skip greetings and chit-chat. Never invent anything.
At most {max_chars} characters.
Answer with one JSON object: {{"summary": "<the episode summary>"}}."""


# --- the handler -------------------------------------------------------------------------


async def summarize(event: MemoryChanged, delivery: Delivery) -> None:
    kind, op = event.memory.kind, event.op
    # Summaries and episodes are our own writes coming back; profile entries are
    # recalled on their own and do not feed the summary.
    if kind == "fact" and op == "created":
        await fold_facts(event, delivery)
    elif kind == "fact" and op in ("superseded", "deleted"):
        await drop_superseded(event, delivery)
    elif kind == "turn" and op == "created":
        await update_episodes(event, delivery)


@asynccontextmanager
async def _conversation_lock(
    delivery: Delivery, job: str, event: MemoryChanged
) -> AsyncIterator[None]:
    resources: SummarizeResources = delivery.resources
    try:
        async with resources.locks.hold("summarize", job, event.tenant, event.conversation_id):
            yield
    except LockTimeout as exc:
        raise RetryableError(f"{job} lock: {exc}") from exc


async def _rpc(call: str, awaitable: Awaitable[T]) -> T:
    try:
        return await awaitable
    except grpc.aio.AioRpcError as exc:
        raise rpc_failure(f"retrieval {call}", exc) from exc


async def _ask_model(
    delivery: Delivery, *, task: str, instructions: str, payload: dict[str, Any], models: list[str]
) -> tuple[str | None, str]:
    """(summary, model) from the LLM, or (None, reason) when the rule-based fallback applies.

    Transient unavailability is retried through the bus (nak with backoff) and only
    falls back on the last delivery; junk output and refused requests fall back at once.
    """
    settings: SummarizeSettings = delivery.worker.settings  # type: ignore[assignment]
    llm = delivery.resources.llm
    try:
        model = llm.model_for(settings.summarize_model, settings.llm_model, *models)
        answer = await llm.structured(
            task=task,
            model=model,
            instructions=instructions,
            payload=payload,
            schema=tasks.SummaryOutput,
        )
    except LlmUnavailable as exc:
        if not delivery.last_chance:
            raise RetryableError(str(exc)) from exc
        return None, f"model unavailable until the retry horizon: {exc}"
    except (LlmOutputError, LlmRequestError) as exc:
        return None, str(exc)
    text = answer.summary.strip()
    if not text:
        return None, f"{task}: the model returned an empty summary"
    return text, model


def bounded(text: str, max_chars: int) -> str:
    """``text`` cut to ``max_chars``, at a sentence end when there is one."""
    text = " ".join(text.split())
    if len(text) <= max_chars:
        return text
    head = text[: max_chars - 1]
    cut = max(head.rfind(". "), head.rfind("! "), head.rfind("? "))
    return head[: cut + 1] if cut > max_chars // 2 else head.rstrip() + "…"


async def _publish_change(
    delivery: Delivery, event: MemoryChanged, memory: pb.Memory, op: MemoryChangeOp, cause: str
) -> None:
    # The content is part of the id: a summary deleted and started again reuses its
    # revision numbers, and must not be taken for a duplicate of the old one.
    digest = hashlib.sha256(memory.text.encode()).hexdigest()[:16]
    revision = memory.metadata.get("revision", "")
    await delivery.worker.publish(
        MemoryChanged(
            event_id=deterministic_event_id(
                "summarize", event.tenant, memory.id, op, revision, digest
            ),
            tenant=event.tenant,
            user_id=memory.user_id,
            conversation_id=event.conversation_id,
            op=op,
            memory=record_from_pb(memory),
            cause=cause,
        )
    )


def _op(status: int) -> MemoryChangeOp:
    return "created" if status == pb.UPSERT_STATUS_CREATED else "updated"


# --- rolling summary ---------------------------------------------------------------------


def folded_ids(summary: pb.Memory | None) -> list[str]:
    if summary is None:
        return []
    return summary.metadata.get("folded_fact_ids", "").split()


async def fold_facts(event: MemoryChanged, delivery: Delivery) -> None:
    settings: SummarizeSettings = delivery.worker.settings  # type: ignore[assignment]
    retrieval = delivery.retrieval
    tenant, conversation = event.tenant, event.conversation_id
    fact_id = event.memory.id
    summary_id = summary_memory_id(tenant, conversation)
    async with _conversation_lock(delivery, "summary", event):
        got = await _rpc(
            "Get", retrieval.get(pb.GetRequest(tenant=tenant, ids=[summary_id, fact_id]))
        )
        by_id = {m.id: m for m in got.memories}
        previous = by_id.get(summary_id)
        folded = folded_ids(previous)
        if fact_id in folded:
            log.info("summary.already_folded", fact_id=fact_id)
            if delivery.attempt > 1 and previous is not None:
                # The first delivery may have written the summary and died before
                # publishing; the same event id makes this a no-op otherwise.
                op: MemoryChangeOp = (
                    "created" if previous.metadata.get("revision") == "1" else "updated"
                )
                await _publish_change(delivery, event, previous, op, "summarize:summary")
            return
        facts = await _facts_to_fold(delivery, event, by_id.get(fact_id), set(folded))
        if not facts:
            log.info("summary.nothing_to_fold", fact_id=fact_id, reason="fact gone or superseded")
            return

        previous_text = previous.text if previous is not None else ""
        new_facts = [f.text for f in facts]
        text, how = await _ask_model(
            delivery,
            task=tasks.SUMMARIZE,
            instructions=SUMMARY_INSTRUCTIONS.format(max_chars=settings.summary_max_chars),
            payload=tasks.SummarizeInput(
                previous_summary=previous_text, new_facts=new_facts
            ).model_dump(),
            models=await _chat_models(delivery, event, facts),
        )
        metadata: dict[str, str] = {}
        if text is None:
            log.warning("summary.fallback", reason=how, facts=len(facts))
            text = rule_based_summary(previous_text, new_facts, settings.summary_max_chars)
            metadata["summarizer"] = SUMMARIZER_RULES
            metadata["fallback_reason"] = how[:300]
        else:
            text = bounded(text, settings.summary_max_chars)
            metadata["summarizer"] = SUMMARIZER_LLM
            metadata["model"] = how

        total = int(previous.metadata.get("facts_folded", "0")) if previous else 0
        metadata |= {
            "facts_folded": str(total + len(facts)),
            "folded_fact_ids": " ".join([*folded, *(f.id for f in facts)][-FOLDED_IDS_KEPT:]),
        }
        await _write_summary(delivery, event, previous, text, metadata)


async def _write_summary(
    delivery: Delivery,
    event: MemoryChanged,
    previous: pb.Memory | None,
    text: str,
    metadata: dict[str, str],
) -> None:
    """Upsert the next revision of the conversation's summary and announce it."""
    revision = int(previous.metadata.get("revision", "0")) + 1 if previous is not None else 1
    summary = pb.Memory(
        id=summary_memory_id(event.tenant, event.conversation_id),
        tenant=event.tenant,
        user_id=previous.user_id if previous is not None else event.user_id,
        conversation_id=event.conversation_id,
        kind=pb.MEMORY_KIND_SUMMARY,
        text=text,
        metadata={**metadata, "revision": str(revision)},
    )
    if previous is not None and previous.HasField("created_at"):
        summary.created_at.CopyFrom(previous.created_at)
    reply = await _rpc(
        "Upsert",
        delivery.retrieval.upsert(pb.UpsertRequest(tenant=event.tenant, memories=[summary])),
    )
    status = reply.results[0].status if reply.results else pb.UPSERT_STATUS_UPDATED
    await _publish_change(delivery, event, summary, _op(status), "summarize:summary")
    log.info(
        "summary.updated",
        memory_id=summary.id,
        revision=revision,
        summarizer=summary.metadata.get("summarizer", ""),
        cause=event.op,
    )


def _norm(sentence: str) -> str:
    return " ".join(sentence.lower().split()).rstrip(".!?")


async def drop_superseded(event: MemoryChanged, delivery: Delivery) -> None:
    """Take a superseded (or user-deleted) fact's sentences out of the summary where it
    holds them word for word (the rule-based fallback appends facts verbatim); a
    model-written summary is corrected by the next fold, which sees the new fact. A
    summary left with nothing is deleted (and announced as deleted)."""
    gone = {_norm(s) for s in _sentences(event.memory.text)}
    summary_id = summary_memory_id(event.tenant, event.conversation_id)
    async with _conversation_lock(delivery, "summary", event):
        got = await _rpc(
            "Get", delivery.retrieval.get(pb.GetRequest(tenant=event.tenant, ids=[summary_id]))
        )
        if not got.memories:
            return
        previous = got.memories[0]
        sentences = _sentences(previous.text)
        kept = [s for s in sentences if _norm(s) not in gone]
        if len(kept) == len(sentences):
            return
        if not kept:
            await _rpc(
                "Delete",
                delivery.retrieval.delete(pb.DeleteRequest(tenant=event.tenant, ids=[summary_id])),
            )
            await _publish_change(delivery, event, previous, "deleted", "summarize:summary")
            log.info("summary.deleted", memory_id=summary_id, reason="every sentence superseded")
            return
        metadata = {k: v for k, v in previous.metadata.items() if k != "revision"}
        await _write_summary(delivery, event, previous, " ".join(kept), metadata)


async def _chat_models(
    delivery: Delivery, event: MemoryChanged, facts: Sequence[pb.Memory]
) -> list[str]:
    """The chat models of the turns the facts came from: the model to use when none is
    configured (ingest records it on each turn, as reconcile does not on facts)."""
    settings: SummarizeSettings = delivery.worker.settings  # type: ignore[assignment]
    recorded = [f.metadata["model"] for f in facts if f.metadata.get("model")]
    if recorded or settings.summarize_model or settings.llm_model:
        return recorded
    turn_ids = list(dict.fromkeys(t for f in facts for t in f.source_turn_ids))[:FOLD_BATCH]
    if not turn_ids:
        return []
    got = await _rpc(
        "Get", delivery.retrieval.get(pb.GetRequest(tenant=event.tenant, ids=turn_ids))
    )
    newest_first = sorted(got.memories, key=_age_key, reverse=True)
    return [t.metadata["model"] for t in newest_first if t.metadata.get("model")]


async def _facts_to_fold(
    delivery: Delivery, event: MemoryChanged, fact: pb.Memory | None, folded: set[str]
) -> list[pb.Memory]:
    """The triggering fact (if still current) and other current facts not folded yet,
    oldest first. A fact superseded before we got to it is left out: folding it after
    its successor would bring stale information back."""
    pending: dict[str, pb.Memory] = {}
    if fact is not None and not fact.superseded_by:
        pending[fact.id] = fact
    page = await _rpc(
        "List",
        delivery.retrieval.list(
            pb.ListRequest(
                tenant=event.tenant,
                filter=pb.MemoryFilter(
                    conversation_id=event.conversation_id, kinds=[pb.MEMORY_KIND_FACT]
                ),
                page_size=FOLD_BATCH,
            )
        ),
    )
    for other in page.memories:
        if other.id not in folded and other.id not in pending:
            pending[other.id] = other
    return sorted(pending.values(), key=_age_key)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(" ".join(text.split())) if s.strip()]


def rule_based_summary(previous: str, new_facts: Sequence[str], max_chars: int) -> str:
    """The previous summary with the new facts appended as sentences. Over the bound,
    the oldest sentences go first (the facts themselves stay in the index); the next
    successful model fold rewrites the whole summary."""
    sentences = _sentences(previous)
    for fact in new_facts:
        sentence = " ".join(fact.split())
        if sentence and sentence[-1] not in ".!?":
            sentence += "."
        if sentence and sentence not in sentences:
            sentences.append(sentence)
    while len(sentences) > 1 and len(" ".join(sentences)) > max_chars:
        sentences.pop(0)
    return bounded(" ".join(sentences), max_chars)


# --- episodes ----------------------------------------------------------------------------


def _ts_key(memory: pb.Memory) -> tuple[int, int]:
    return (memory.created_at.seconds, memory.created_at.nanos)


def _age_key(memory: pb.Memory) -> tuple[int, int, int, str]:
    """Conversation order: created_at, then the turn index when set, then id."""
    return (*_ts_key(memory), memory.turn_index, memory.id)


@dataclass(frozen=True)
class Anchor:
    """Where numbering continues: the newest episode (None before the first one)."""

    last_turn: int = 0
    boundary: tuple[int, int] | None = None  # created_at of its newest covered turn
    covered: frozenset[str] = frozenset()


def anchor_of(episodes: Sequence[pb.Memory]) -> Anchor:
    """Numbering continues after the episode with the highest ``last_turn``: the count
    of turns covered by earlier episodes, which eviction of those turns cannot change."""
    ranged = [e for e in episodes if e.HasField("turn_range")]
    if not ranged:
        return Anchor()
    newest = max(ranged, key=lambda e: (e.turn_range.last_turn, *_ts_key(e)))
    return Anchor(
        last_turn=int(newest.turn_range.last_turn),
        boundary=_ts_key(newest),
        covered=frozenset(newest.source_turn_ids),
    )


async def update_episodes(event: MemoryChanged, delivery: Delivery) -> None:
    settings: SummarizeSettings = delivery.worker.settings  # type: ignore[assignment]
    retrieval = delivery.retrieval
    tenant, conversation = event.tenant, event.conversation_id
    n = settings.episode_turns
    async with _conversation_lock(delivery, "episodes", event):
        recent = await _rpc(
            "List",
            retrieval.list(
                pb.ListRequest(
                    tenant=tenant,
                    filter=pb.MemoryFilter(
                        conversation_id=conversation,
                        kinds=[pb.MEMORY_KIND_EPISODE],
                        include_superseded=True,
                    ),
                    page_size=ANCHOR_PAGE,
                )
            ),
        )
        if delivery.attempt > 1:
            for episode in recent.memories:
                if episode.metadata.get("trigger_event_id") == event.event_id:
                    await _publish_change(delivery, event, episode, "created", "summarize:episode")
        anchor = anchor_of(recent.memories)
        turns = await _uncovered_turns(delivery, event, anchor)
        # A window closes once a later turn exists: a turn indexed a moment late (the
        # turns of one exchange are handled concurrently) still lands in its window.
        built = 0
        while len(turns) > n and built < MAX_WINDOWS_PER_EVENT:
            window, turns = turns[:n], turns[n:]
            first = anchor.last_turn + built * n + 1
            await _write_episode(delivery, event, window, first)
            built += 1


async def _uncovered_turns(
    delivery: Delivery, event: MemoryChanged, anchor: Anchor
) -> list[pb.Memory]:
    """Turns after the anchor's newest covered turn and not covered by it, oldest first.

    List is newest first, so this reads only the uncovered tail of the conversation.
    A turn that arrives older than an episode already built stays out of episodes
    (it is still a searchable turn)."""
    found: list[pb.Memory] = []
    token = ""
    while True:
        page = await _rpc(
            "List",
            delivery.retrieval.list(
                pb.ListRequest(
                    tenant=event.tenant,
                    filter=pb.MemoryFilter(
                        conversation_id=event.conversation_id,
                        kinds=[pb.MEMORY_KIND_TURN],
                        include_superseded=True,
                    ),
                    page_size=LIST_PAGE,
                    page_token=token,
                )
            ),
        )
        for turn in page.memories:
            if anchor.boundary is not None and _ts_key(turn) < anchor.boundary:
                return sorted(found, key=_age_key)
            if turn.id not in anchor.covered:
                found.append(turn)
        token = page.next_page_token
        if not token:
            return sorted(found, key=_age_key)


async def _write_episode(
    delivery: Delivery, event: MemoryChanged, window: list[pb.Memory], first: int
) -> None:
    settings: SummarizeSettings = delivery.worker.settings  # type: ignore[assignment]
    last = first + len(window) - 1
    numbered = [
        tasks.EpisodeTurn(n=first + i, role=turn.role or "user", text=turn.text)
        for i, turn in enumerate(window)
    ]
    text, how = await _ask_model(
        delivery,
        task=tasks.EPISODE,
        instructions=EPISODE_INSTRUCTIONS.format(
            first_turn=first, last_turn=last, max_chars=settings.episode_max_chars
        ),
        payload=tasks.EpisodeInput(first_turn=first, last_turn=last, turns=numbered).model_dump(),
        models=[t.metadata.get("model", "") for t in reversed(window)],
    )
    metadata = {"turns": str(len(window)), "trigger_event_id": event.event_id}
    if text is None:
        log.warning("episode.fallback", reason=how, first_turn=first, last_turn=last)
        text = rule_based_episode(numbered, settings.episode_max_chars)
        metadata |= {"summarizer": SUMMARIZER_RULES, "fallback_reason": how[:300]}
    else:
        text = bounded(text, settings.episode_max_chars)
        metadata |= {"summarizer": SUMMARIZER_LLM, "model": how}
    turn_ids = [t.id for t in window]
    newest = window[-1]
    episode = pb.Memory(
        id=episode_memory_id(event.tenant, event.conversation_id, turn_ids),
        tenant=event.tenant,
        user_id=newest.user_id or event.user_id,
        conversation_id=event.conversation_id,
        kind=pb.MEMORY_KIND_EPISODE,
        text=text,
        source_turn_ids=turn_ids,
        turn_range=pb.TurnRange(first_turn=first, last_turn=last),
        metadata=metadata,
    )
    # The episode is as old as its newest turn: numbering and eviction order rely on it.
    episode.created_at.CopyFrom(newest.created_at)
    await _rpc(
        "Upsert",
        delivery.retrieval.upsert(pb.UpsertRequest(tenant=event.tenant, memories=[episode])),
    )
    await _publish_change(delivery, event, episode, "created", "summarize:episode")
    log.info(
        "episode.created",
        memory_id=episode.id,
        first_turn=first,
        last_turn=last,
        summarizer=metadata["summarizer"],
    )


# --- the rule-based episode --------------------------------------------------------------

_CHIT_CHAT = re.compile(
    r"^(hi|hello|hey|thanks|thank you|ok|okay|sure|bye|goodbye|good (morning|night|evening)|"
    r"how are you|nice|cool|great|lol|yes|no|noted)\b[\s\w]{0,12}[!.?]*$",
    re.IGNORECASE,
)
_FIRST_PERSON = re.compile(r"\b(i|i'm|i've|i'd|my|me|we|our)\b", re.IGNORECASE)
_DURABLE = re.compile(
    r"\b(name|live|lives|moved|work|works|job|like|love|hate|prefer|allergic|plan|"
    r"planning|need|want|always|never|remember|birthday|born|married|wife|husband|"
    r"son|daughter|kids?|visit|visited|bought|started|decided)\b",
    re.IGNORECASE,
)
_PROPER_NOUN = re.compile(r"(?<!^)(?<![.!?]\s)\b[A-Z][a-z]+")


def _salience(sentence: str) -> float:
    words = sentence.split()
    score = min(len(words), 20) / 20
    if _FIRST_PERSON.search(sentence):
        score += 2
    if _DURABLE.search(sentence):
        score += 1
    if any(ch.isdigit() for ch in sentence):
        score += 1
    if _PROPER_NOUN.search(sentence):
        score += 1
    return score


def rule_based_episode(turns: Sequence[tasks.EpisodeTurn], max_chars: int) -> str:
    """An extractive summary: the user's most salient sentences and the question/answer
    pairs, in conversation order, under a header that says how it was made."""
    header = f"Turns {turns[0].n}-{turns[-1].n} (rule-based summary, extracted without the model):"
    # (position in the window, score, text)
    items: list[tuple[tuple[int, int], float, str]] = []
    for i, turn in enumerate(turns):
        if turn.role != "user":
            continue
        sentences = [s for s in _sentences(turn.text) if not _CHIT_CHAT.match(s)]
        questions = [s for s in sentences if s.endswith("?")]
        answer = turns[i + 1] if i + 1 < len(turns) and turns[i + 1].role == "assistant" else None
        if questions and answer is not None:
            reply = " ".join(_sentences(answer.text)[:2])
            if reply:
                items.append(((i, 0), 3.5, f"Q: {questions[-1]} A: {reply}"))
        for j, sentence in enumerate(s for s in sentences if not s.endswith("?")):
            if len(sentence.split()) >= 3:
                items.append(((i, j + 1), _salience(sentence), f"User: {sentence}"))
    budget = max_chars - len(header) - 1
    chosen: list[tuple[tuple[int, int], float, str]] = []
    used = 0
    for item in sorted(items, key=lambda it: (-it[1], it[0])):
        cost = len(item[2]) + 1
        if used + cost <= budget:
            chosen.append(item)
            used += cost
    if not chosen:
        return bounded(f"{header} (no salient statements)", max_chars)
    body = " ".join(text for _, _, text in sorted(chosen))
    return bounded(f"{header} {body}", max_chars)


SUMMARIZE = WorkerSpec(
    name="summarize", event=MemoryChanged, handle=summarize, resources=open_resources
)


def main() -> None:
    run_worker(SUMMARIZE, SummarizeSettings)


if __name__ == "__main__":
    main()
