"""What the ``engram`` command draws: progress bars and tables, with rich.

Every command's progress goes through :class:`ProgressBar` and every table through
:func:`render_table` / :func:`print_table`, so they look and behave alike:

- on a terminal, a rich progress bar (label, bar, done/total, percent, elapsed, time
  left) redrawn in place on stderr, and tables with rich's box drawing and colour;
- anywhere else (a log file, a pipe, CI), one plain line per tenth of the work
  (``rebuild 120/240 (50%)``), never a run-together line of carriage returns, and
  tables as plain aligned text without colour or wrapping.

Results still go to stdout and progress to stderr, so ``engram export > file`` and
``--json`` output stay clean.
"""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TextIO

from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

#: Plain mode prints a line each time the work crosses another 1/STEPS of the total.
STEPS = 10
#: Plain tables are never wrapped: a log line may be long, a broken row is unreadable.
PLAIN_WIDTH = 400


def is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class ProgressBar:
    """Progress of one piece of work of ``total`` steps.

    ``update(done)`` sets the count, ``advance(n)`` adds to it; reaching the total ends
    the bar (also ``close()``, or leaving the ``with`` block). The total may grow
    (``update(done, total)``) when the work turns out bigger than announced.
    """

    def __init__(self, label: str, total: int, *, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = max(0, total)
        self.done = 0
        self.stream = stream if stream is not None else sys.stderr
        self.closed = False
        self._printed_step = -1
        self._printed_done = -1
        self._rich: Progress | None = None
        if is_terminal(self.stream):
            self._rich = Progress(
                TextColumn("{task.description:<24}"),
                BarColumn(),
                MofNCompleteColumn(),
                TaskProgressColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(file=self.stream),
            )
            self._task = self._rich.add_task(label, total=self.total or None)
            self._rich.start()
        if self.total == 0:
            self.close()

    def update(self, done: int, total: int | None = None) -> None:
        if self.closed:
            return
        if total is not None:
            self.total = max(0, total)
        self.done = min(max(0, done), self.total) if self.total else max(0, done)
        if self._rich is not None:
            self._rich.update(self._task, completed=self.done, total=self.total or None)
        else:
            self._plain_line()
        if self.total and self.done >= self.total:
            self.close()

    def advance(self, count: int = 1) -> None:
        self.update(self.done + count)

    def counting_from(self, start: int) -> Callable[[int], None]:
        """A progress callback for a step that reports its own count after ``start``."""
        return lambda done: self.update(start + done)

    def _plain_line(self, *, force: bool = False) -> None:
        step = self.done * STEPS // self.total if self.total else STEPS
        if step <= self._printed_step and not force:
            return
        if step == 0 and not force:
            return  # nothing done yet: the first line comes with the first tenth
        self._printed_step, self._printed_done = step, self.done
        percent = f" ({100 * self.done // self.total}%)" if self.total else ""
        self.stream.write(f"{self.label} {self.done}/{self.total}{percent}\n")
        self.stream.flush()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._rich is not None:
            self._rich.stop()
        elif self._printed_done != self.done or self.total == 0:
            self._plain_line(force=True)  # where it ended, complete or not

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ProgressCallback:
    """An ``on_progress(done, total)`` callback for work that learns its total as it
    goes: the bar opens on the first call, follows every call, and closes on the last
    step, on ``close()`` or when the ``with`` block ends."""

    def __init__(self, label: str, *, stream: TextIO | None = None) -> None:
        self.label = label
        self.stream = stream
        self.bar: ProgressBar | None = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None and not total:
            return  # nothing to do, nothing to draw
        if self.bar is None:
            self.bar = ProgressBar(self.label, total, stream=self.stream)
        self.bar.update(done, total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def __enter__(self) -> ProgressCallback:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _table(
    columns: Sequence[str], rows: Sequence[Sequence[object]], title: str | None, plain: bool
) -> Table:
    table = Table(
        title=title,
        box=box.SIMPLE_HEAD if plain else box.ROUNDED,
        title_justify="left",
        header_style="" if plain else "bold",
        show_edge=not plain,
    )
    for index, name in enumerate(columns):
        cells = [row[index] for row in rows if index < len(row) and row[index] not in ("", None)]
        numeric = bool(cells) and all(_is_number(c) or c == "-" for c in cells)
        table.add_column(name, justify="right" if numeric else "left", no_wrap=plain)
    for row in rows:
        table.add_row(*("" if cell is None else str(cell) for cell in row))
    return table


def render_table(
    columns: Sequence[str], rows: Sequence[Sequence[object]], *, title: str | None = None
) -> str:
    """The table as plain text (aligned columns, no colour), e.g. for a log or a test."""
    buffer = io.StringIO()
    console = Console(file=buffer, width=PLAIN_WIDTH, color_system=None, force_terminal=False)
    console.print(_table(columns, rows, title, plain=True))
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()).strip("\n")


def print_table(
    columns: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    title: str | None = None,
    out: TextIO | None = None,
) -> None:
    """Print a table: rich's on a terminal, :func:`render_table`'s text elsewhere."""
    out = out if out is not None else sys.stdout
    if is_terminal(out):
        Console(file=out).print(_table(columns, rows, title, plain=False))
    else:
        print(render_table(columns, rows, title=title), file=out)
