"""Read any file in the LoCoMo format into samples of dated turns and scored questions.

The format: a JSON list of samples, each with ``sample_id``, ``conversation`` (holding
``speaker_a``, ``speaker_b``, ``session_<n>`` turn lists of ``{speaker, dia_id, text,
[img_url, blip_caption]}`` and ``session_<n>_date_time`` strings such as
``"1:56 pm on 8 May, 2023"``) and ``qa`` (``{question, answer | adversarial_answer,
evidence: [dia_id…], category}``). Other keys are ignored.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engram_cli.bench.locomo.metrics import normalize_dia_id, parse_evidence

CATEGORIES = {
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}
DEFAULT_CATEGORIES = (1, 2, 3, 4)

_SESSION = re.compile(r"session_(\d+)")
_DATE_TIME = re.compile(
    r"\s*(\d{1,2}):(\d{2})\s*([ap])\.?m\.?\s+on\s+(\d{1,2})\s+([A-Za-z]+)\.?,?\s+(\d{4})\s*",
    re.IGNORECASE,
)
_MONTHS = {
    name: number
    for number, names in enumerate(
        (
            ("january", "jan"),
            ("february", "feb"),
            ("march", "mar"),
            ("april", "apr"),
            ("may",),
            ("june", "jun"),
            ("july", "jul"),
            ("august", "aug"),
            ("september", "sep", "sept"),
            ("october", "oct"),
            ("november", "nov"),
            ("december", "dec"),
        ),
        start=1,
    )
    for name in names
}


class LocomoFormatError(ValueError):
    """The file is not in the LoCoMo format; the message says where."""


@dataclass(frozen=True)
class Turn:
    dia_id: str  # canonical D<session>:<turn>
    speaker: str
    text: str
    session: int
    created_at: datetime  # the session's date and time (UTC: the data has no zone)
    caption: str = ""  # the image caption, when the turn shared an image

    @property
    def memory_text(self) -> str:
        """What is stored: the speaker kept with the words, the image caption appended."""
        text = f"{self.speaker}: {self.text}".rstrip()
        return f"{text} [shared an image: {self.caption}]" if self.caption else text


@dataclass(frozen=True)
class Question:
    index: int  # position in the sample's qa list
    question: str
    category: int
    evidence: tuple[str, ...]  # canonical ids of turns that exist in the sample
    recovered: int = 0  # evidence ids repaired while parsing
    unusable: int = 0  # evidence that is malformed or names no turn of the sample
    answer: str = ""  # the gold answer (``answer``, else ``adversarial_answer``)

    @property
    def category_name(self) -> str:
        return CATEGORIES.get(self.category, f"category-{self.category}")


@dataclass(frozen=True)
class Sample:
    sample_id: str
    speakers: tuple[str, str]
    turns: tuple[Turn, ...]
    questions: tuple[Question, ...]

    @property
    def last_session_at(self) -> datetime:
        return max(t.created_at for t in self.turns)


def parse_session_datetime(value: str) -> datetime:
    """``"1:56 pm on 8 May, 2023"`` → 2023-05-08 13:56 UTC."""
    match = _DATE_TIME.fullmatch(value)
    if match is None:
        raise ValueError(f"not a LoCoMo session date: {value!r}")
    hour, minute, half, day, month_name, year = match.groups()
    month = _MONTHS.get(month_name.lower())
    if month is None or not 1 <= int(hour) <= 12:
        raise ValueError(f"not a LoCoMo session date: {value!r}")
    hour24 = int(hour) % 12 + (12 if half.lower() == "p" else 0)
    return datetime(int(year), month, int(day), hour24, int(minute), tzinfo=UTC)


def _require(mapping: Any, key: str, where: str) -> Any:
    if not isinstance(mapping, dict) or key not in mapping:
        raise LocomoFormatError(f"{where}: missing {key!r}")
    return mapping[key]


def _turns(conversation: dict[str, Any], where: str) -> tuple[Turn, ...]:
    sessions = sorted(
        (int(m.group(1)), key) for key in conversation if (m := _SESSION.fullmatch(key)) is not None
    )
    turns: list[Turn] = []
    seen: set[str] = set()
    for number, key in sessions:
        raw_turns = conversation[key]
        if not isinstance(raw_turns, list):
            raise LocomoFormatError(f"{where}.{key}: expected a list of turns")
        if not raw_turns:
            continue
        date_key = f"{key}_date_time"
        try:
            created_at = parse_session_datetime(str(_require(conversation, date_key, where)))
        except ValueError as exc:
            raise LocomoFormatError(f"{where}.{date_key}: {exc}") from exc
        for i, raw in enumerate(raw_turns):
            at = f"{where}.{key}[{i}]"
            raw_id = str(_require(raw, "dia_id", at))
            dia_id = normalize_dia_id(raw_id) or raw_id
            if dia_id in seen:
                raise LocomoFormatError(f"{at}: dia_id {raw_id!r} appears twice")
            seen.add(dia_id)
            turns.append(
                Turn(
                    dia_id=dia_id,
                    speaker=str(_require(raw, "speaker", at)),
                    text=str(_require(raw, "text", at)),
                    session=number,
                    created_at=created_at,
                    caption=str(raw.get("blip_caption") or "").strip(),
                )
            )
    return tuple(turns)


def _questions(qa: Any, turn_ids: set[str], where: str) -> tuple[Question, ...]:
    if not isinstance(qa, list):
        raise LocomoFormatError(f"{where}.qa: expected a list")
    questions: list[Question] = []
    for i, raw in enumerate(qa):
        at = f"{where}.qa[{i}]"
        try:
            category = int(_require(raw, "category", at))
        except (TypeError, ValueError) as exc:
            raise LocomoFormatError(f"{at}.category: expected an integer") from exc
        evidence = raw.get("evidence") or []
        if isinstance(evidence, str):
            evidence = [evidence]
        if not isinstance(evidence, list):
            raise LocomoFormatError(f"{at}.evidence: expected a list of dia_ids")
        parsed = parse_evidence(evidence)
        known = tuple(t for t in parsed.ids if t in turn_ids)
        questions.append(
            Question(
                index=i,
                question=str(_require(raw, "question", at)),
                category=category,
                evidence=known,
                recovered=parsed.recovered,
                unusable=parsed.unusable + len(parsed.ids) - len(known),
                answer=str(raw.get("answer", raw.get("adversarial_answer", "")) or ""),
            )
        )
    return tuple(questions)


def parse_samples(raw: Any) -> list[Sample]:
    """Samples from the decoded JSON document."""
    if not isinstance(raw, list):
        raise LocomoFormatError("expected a JSON list of samples")
    samples: list[Sample] = []
    for n, item in enumerate(raw):
        where = f"sample[{n}]"
        conversation = _require(item, "conversation", where)
        sample_id = str(item.get("sample_id") or f"sample-{n}")
        where = f"{where} ({sample_id})"
        turns = _turns(conversation, f"{where}.conversation")
        if not turns:
            raise LocomoFormatError(f"{where}: the conversation has no turns")
        samples.append(
            Sample(
                sample_id=sample_id,
                speakers=(
                    str(_require(conversation, "speaker_a", where)),
                    str(_require(conversation, "speaker_b", where)),
                ),
                turns=turns,
                questions=_questions(item.get("qa", []), {t.dia_id for t in turns}, where),
            )
        )
    ids = [s.sample_id for s in samples]
    if len(set(ids)) != len(ids):
        raise LocomoFormatError("sample_id values must be unique")
    return samples


def load_samples(path: Path, sample_ids: Sequence[str] = ()) -> list[Sample]:
    """Read ``path``; keep only ``sample_ids`` (in file order) when any are given."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise LocomoFormatError(f"{path}: not JSON ({exc})") from exc
    samples = parse_samples(raw)
    if not sample_ids:
        return samples
    missing = sorted(set(sample_ids) - {s.sample_id for s in samples})
    if missing:
        raise LocomoFormatError(f"{path}: no sample {', '.join(missing)}")
    return [s for s in samples if s.sample_id in set(sample_ids)]
