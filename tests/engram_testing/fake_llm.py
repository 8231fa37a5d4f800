"""A fake :class:`~engram_workers.llm.Ask` for the workers' planning cores: scripted
answers per task, every question recorded. No HTTP, no NATS, no retrieval."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from engram_workers.llm import Answered, FellBack, LlmTask

#: What a task answers: an output object (validated against the task's schema), a
#: fallback, or a function of the payload that returns either.
Scripted = dict[str, Any] | FellBack | Callable[[Any], "dict[str, Any] | FellBack"]


@dataclass(frozen=True)
class Question:
    task: str
    payload: BaseModel
    params: dict[str, object]


@dataclass
class FakeAsk:
    answers: dict[str, Scripted] = field(default_factory=dict)
    model: str = "fake-model"
    asked: list[Question] = field(default_factory=list)

    async def __call__(
        self, task: LlmTask[Any, Any], payload: Any, **params: object
    ) -> Answered[Any] | FellBack:
        self.asked.append(Question(task.name, payload, params))
        scripted = self.answers[task.name]
        if callable(scripted):
            scripted = scripted(payload)
        if isinstance(scripted, FellBack):
            return scripted
        return Answered(task.output.model_validate(scripted), self.model)

    def tasks(self) -> list[str]:
        return [q.task for q in self.asked]
