"""The memory kinds as rows: one :class:`KindPolicy` per kind, the one place that says
how each kind is searched, ranked, rendered, evicted, summarized, corrected and mirrored.

Pure data (no I/O, no protobuf), so the ranking maths may read it too. Every reader
asks the table instead of naming kinds: the search pipeline (kinds searched when a
query names none; what is never a candidate), the ranking (small-store order, facts
first), the lifecycle (who corrects whom), the file mirror (folders), the gateway's
recall (the label the model reads) and memory API (the kind it creates), the evict and
summarize workers (what counts, in which order; what feeds the summary and episodes).

Adding a kind is one protobuf enum value (and the regenerated code), one row here and
the worker that produces it (``producer``); docs/architecture.md lists the steps, and
tests/unit/test_kinds.py checks that every reader follows the table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from engram_core.memory import MemoryKindName

__all__ = [
    "KINDS",
    "Eviction",
    "KindPolicy",
    "find_kind",
    "kind_names",
    "kind_policy",
]


@dataclass(frozen=True)
class Eviction:
    """Where a kind's memories stand in the evict worker's order (lower rank goes
    first; oldest first within a rank)."""

    rank: int
    #: superseded versions go at this rank instead (None: with the current ones)
    superseded_rank: int | None = None
    #: the newest memory of the kind is never evicted (it anchors its producer's state)
    keep_newest: bool = False

    @property
    def first_rank(self) -> int:
        """The lowest rank any of the kind's memories is evicted at."""
        return min(self.rank, self.rank_of(superseded=True))

    def rank_of(self, superseded: bool) -> int:
        if superseded and self.superseded_rank is not None:
            return self.superseded_rank
        return self.rank


@dataclass(frozen=True)
class KindPolicy:
    """What the code does differently for one memory kind."""

    name: MemoryKindName
    #: what one memory of the kind is (the MCP tools' description of the kinds)
    description: str
    #: the module that writes it (the memory API and the mirror may write any kind)
    producer: str
    #: has a vector of its text, so a search may name it; False: stored with a
    #: placeholder vector, never a search candidate (the response attaches it)
    embedded: bool
    #: searched when a query names no kinds
    searched_by_default: bool
    #: order in a small store, where every memory is returned (higher first)
    small_store_rank: int
    #: a current one nearly as relevant as the best hit is listed before every other hit
    listed_first: bool
    #: a chat message: it has a role (a mirror folder per role; "<role> said" in recall),
    #: a turn position (adjacent messages are scored and rendered together), and it is
    #: marked corrected when a memory extracted from it is superseded or rewritten
    chat_message: bool
    #: superseding, deleting or rewriting one marks its source turns as corrected
    corrects_source_turns: bool
    #: counted towards a conversation's ``max_entries``; None: exempt from eviction
    eviction: Eviction | None
    #: the mirror's folder of the kind, under a conversation's directory
    mirror_dir: str
    #: one current memory per user's conversation: the mirror's file is ``summary.md``
    one_per_conversation: bool
    #: the label of a recalled memory in the injected message; ``{role}``,
    #: ``{conversation}`` (quoted) and ``{turn_range}`` (`` (turns a-b)`` or empty) are
    #: filled in
    prompt_label: str
    #: the kind ``POST /v1/memories`` creates (exactly one row)
    created_by_memory_api: bool
    #: a created one is folded into the conversation's rolling summary, and a
    #: superseded or deleted one taken out of it
    folded_into_summary: bool
    #: created ones are compressed, a window at a time, into episodes
    compressed_into_episodes: bool


KINDS: tuple[KindPolicy, ...] = (
    KindPolicy(
        name="turn",
        description="a chat message",
        producer="engram_workers.ingest",
        embedded=True,
        searched_by_default=True,
        small_store_rank=1,
        listed_first=False,
        chat_message=True,
        corrects_source_turns=False,
        eviction=Eviction(rank=1),
        mirror_dir="turns",
        one_per_conversation=False,
        prompt_label="{role} said",
        created_by_memory_api=False,
        folded_into_summary=False,
        compressed_into_episodes=True,
    ),
    KindPolicy(
        name="fact",
        description="an atomic statement learned from the user",
        producer="engram_workers.reconcile.core",
        embedded=True,
        searched_by_default=True,
        small_store_rank=3,
        listed_first=True,
        chat_message=False,
        corrects_source_turns=True,
        eviction=Eviction(rank=4, superseded_rank=2),
        mirror_dir="facts",
        one_per_conversation=False,
        prompt_label="fact",
        created_by_memory_api=True,
        folded_into_summary=True,
        compressed_into_episodes=False,
    ),
    KindPolicy(
        name="profile",
        description="a structured entry about the user",
        producer="engram_workers.reconcile.core",
        embedded=True,
        searched_by_default=False,
        small_store_rank=3,
        listed_first=True,
        chat_message=False,
        corrects_source_turns=True,
        eviction=None,
        mirror_dir="profile",
        one_per_conversation=False,
        prompt_label="profile",
        created_by_memory_api=False,
        folded_into_summary=False,
        compressed_into_episodes=False,
    ),
    KindPolicy(
        name="summary",
        description="a conversation's rolling summary",
        producer="engram_workers.summarize.core",
        embedded=False,
        searched_by_default=False,
        small_store_rank=1,
        listed_first=False,
        chat_message=False,
        corrects_source_turns=False,
        eviction=None,
        mirror_dir="summaries",
        one_per_conversation=True,
        prompt_label="summary of conversation {conversation}",
        created_by_memory_api=False,
        folded_into_summary=False,
        compressed_into_episodes=False,
    ),
    KindPolicy(
        name="episode",
        description="a summary of a stretch of turns",
        producer="engram_workers.summarize.core",
        embedded=True,
        searched_by_default=True,
        small_store_rank=2,
        listed_first=False,
        chat_message=False,
        corrects_source_turns=False,
        eviction=Eviction(rank=3, keep_newest=True),
        mirror_dir="episodes",
        one_per_conversation=False,
        prompt_label="episode{turn_range}",
        created_by_memory_api=False,
        folded_into_summary=False,
        compressed_into_episodes=False,
    ),
)

_BY_NAME: Mapping[str, KindPolicy] = MappingProxyType({k.name: k for k in KINDS})


def find_kind(name: str) -> KindPolicy | None:
    """The row of ``name``, or None for a name that is no kind."""
    return _BY_NAME.get(name)


def kind_policy(name: str) -> KindPolicy:
    """The row of ``name``; a name that is no kind is a ``KeyError``."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"unknown memory kind {name!r}") from None


def kind_names(where: Callable[[KindPolicy], bool]) -> tuple[MemoryKindName, ...]:
    """The kinds whose row satisfies ``where``, in table order."""
    return tuple(k.name for k in KINDS if where(k))
