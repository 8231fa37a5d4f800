"""One model run for many requests: the texts of concurrent Searches and Upserts are
embedded together, and recently embedded texts are not embedded again.

A busy service has many requests waiting at once, and each trip to the model's thread
costs a loop wake-up; the packaged graph (``ENGRAM_EMBED_QUANTIZATION=none``) also
costs less per text in a batch (about 4 ms for one short text alone, 1.8 ms each in a
batch of sixteen; the quantized default runs each text alone, docs/retrieval.md). So a
loop runs the model: when it is idle, a request starts a run at once (no added
latency); while a run is going, requests queue, and the next run takes everything
queued. Searches have a loop of their own beside the writes' (two runs at most at
once): a person waits for a search, nobody waits for an index write, so a search never
queues behind a batch of writes.

Texts seen recently (reconcile searches for a fact's text and then stores the same
text; a retried Upsert) are answered from a small LRU cache of their vectors.

A search's text is embedded on the event loop itself when the embedder says a run is
short in-process work (``runs_inline``: the quantized default, one text a run): under
load the hop to a thread and back cost the search more than the run. Whatever else the
loop serves holds the GIL, and the model's thread needs it again for the tokenizer and
the pooling, a switch interval (5 ms) at a time (docs/retrieval.md, "A search's
embedding runs inline", has the measurement). The model releases the GIL while it
multiplies, so the writes' run in its thread goes on meanwhile; a remote embedder
(network I/O) and the packaged graph (which batches concurrent searches) keep the
search lane.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

from engram_core.lru import LruCache
from engram_retrieval.embedder import Encoded, SentenceEncoder

#: Texts whose vectors are kept (a MiniLM text: 1.5 KB dense + ~1 KB per token).
CACHE_TEXTS = 512
#: Most texts one model run takes (the embedder splits them into its own batches).
MAX_RUN_TEXTS = 64


@dataclass
class _Request:
    texts: list[str]
    done: asyncio.Future[list[Encoded]]


@dataclass
class _Lane:
    """Requests waiting for a model run, and the task that runs them."""

    queue: list[_Request] = field(default_factory=list)
    runner: asyncio.Task[None] | None = None


@dataclass
class EncodeStats:
    runs: int = 0
    texts: int = 0
    cached: int = 0


class EncodeQueue:
    """Batches :meth:`SentenceEncoder.encode` across concurrent callers (thread-safe model, one
    run at a time, off the event loop)."""

    def __init__(
        self,
        embedder: SentenceEncoder,
        *,
        cache_texts: int = CACHE_TEXTS,
        max_run: int = MAX_RUN_TEXTS,
        inline_searches: bool = True,
    ) -> None:
        """``inline_searches``: embed an urgent request on the loop when the embedder
        allows it (``runs_inline``); False keeps every run in a thread."""
        self.embedder = embedder
        self.max_run = max_run
        self.inline_searches = inline_searches and bool(getattr(embedder, "runs_inline", False))
        self.stats = EncodeStats()
        self._cache: LruCache[str, Encoded] = LruCache(cache_texts)
        self._searches = _Lane()
        self._writes = _Lane()

    @property
    def model_id(self) -> str:
        return self.embedder.model_id

    async def encode(self, texts: Sequence[str], *, urgent: bool = False) -> list[Encoded]:
        """Sentence and token vectors of each text, in input order. ``urgent``: a
        search someone waits for; it does not wait for writes."""
        found = [self._cache.get(text) for text in texts]
        missing = list(dict.fromkeys(t for t, e in zip(texts, found, strict=True) if e is None))
        self.stats.cached += len(texts) - len(missing)
        if missing:
            if urgent and self.inline_searches:
                vectors = self._recorded(missing, self.embedder.encode(missing))
            else:
                vectors = await self._queued(missing, urgent)
            encoded = dict(zip(missing, vectors, strict=True))
            found = [e if e is not None else encoded[t] for t, e in zip(texts, found, strict=True)]
        return [e for e in found if e is not None]

    async def encode_one(self, text: str, *, urgent: bool = False) -> Encoded:
        (encoded,) = await self.encode([text], urgent=urgent)
        return encoded

    async def _queued(self, texts: list[str], urgent: bool) -> list[Encoded]:
        lane = self._searches if urgent else self._writes
        request = _Request(texts, asyncio.get_running_loop().create_future())
        lane.queue.append(request)
        if lane.runner is None or lane.runner.done():
            lane.runner = asyncio.create_task(self._run_queued(lane))
        return await request.done

    def _next_run(self, lane: _Lane) -> list[_Request]:
        taken: list[_Request] = []
        size = 0
        while lane.queue and (not taken or size + len(lane.queue[0].texts) <= self.max_run):
            request = lane.queue.pop(0)
            taken.append(request)
            size += len(request.texts)
        return taken

    async def _run_queued(self, lane: _Lane) -> None:
        while lane.queue:
            requests = [r for r in self._next_run(lane) if not r.done.done()]  # cancelled
            texts = list(dict.fromkeys(t for r in requests for t in r.texts))
            if not texts:
                continue
            try:
                run = await asyncio.to_thread(self.embedder.encode, texts)
            except Exception as exc:
                for request in requests:
                    if not request.done.done():
                        request.done.set_exception(exc)
                continue
            by_text = dict(zip(texts, self._recorded(texts, run), strict=True))
            for request in requests:
                if not request.done.done():
                    request.done.set_result([by_text[t] for t in request.texts])

    def _recorded(self, texts: list[str], encoded: list[Encoded]) -> list[Encoded]:
        """A model run's vectors, counted and cached (on the loop)."""
        self.stats.runs += 1
        self.stats.texts += len(texts)
        for text, vectors in zip(texts, encoded, strict=True):
            self._cache.put(text, vectors)
        return encoded
