"""Progress bars and tables of the ``engram`` command: rich on a terminal, one plain
line per tenth of the work elsewhere (logs, pipes, CI), tables that never wrap."""

from __future__ import annotations

import io

from engram_cli.console import ProgressBar, ProgressCallback, print_table, render_table


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_one_line_per_tenth_and_no_carriage_returns() -> None:
    out = io.StringIO()
    with ProgressBar("rebuild", 240, stream=out) as bar:
        for _ in range(240):
            bar.advance()
    lines = out.getvalue().splitlines()
    assert lines == [f"rebuild {24 * i}/240 ({10 * i}%)" for i in range(1, 11)]
    assert "\r" not in out.getvalue()


def test_small_totals_and_big_steps_print_each_tenth_once() -> None:
    out = io.StringIO()
    with ProgressBar("import", 6, stream=out) as bar:
        bar.update(3)
        bar.update(3)
        bar.update(6)
    assert out.getvalue().splitlines() == ["import 3/6 (50%)", "import 6/6 (100%)"]


def test_work_that_stops_early_says_where_it_ended() -> None:
    out = io.StringIO()
    with ProgressBar("import", 1000, stream=out) as bar:
        bar.update(437)
    assert out.getvalue().splitlines()[-1] == "import 437/1000 (43%)"


def test_the_total_may_grow() -> None:
    out = io.StringIO()
    callback = ProgressCallback("export", stream=out)
    callback(50, 100)
    callback(150, 150)
    assert out.getvalue().splitlines() == ["export 50/100 (50%)", "export 150/150 (100%)"]


def test_nothing_to_do_draws_nothing() -> None:
    out = io.StringIO()
    with ProgressCallback("import", stream=out) as callback:
        callback(0, 0)
    assert out.getvalue() == ""


def test_on_a_terminal_a_rich_bar_redrawn_in_place() -> None:
    out = Terminal()
    with ProgressBar("rebuild", 6, stream=out) as bar:
        for _ in range(6):
            bar.advance()
    text = out.getvalue()
    assert "rebuild" in text and "6/6" in text and "100%" in text
    assert "━" in text  # rich's bar
    assert "\x1b[" in text  # drawn with terminal control codes, not a line per step


def test_plain_tables_align_numbers_right_and_never_wrap() -> None:
    long = "x" * 300
    table = render_table(["engine", "p50 ms", "note"], [["edge", 1.5, ""], ["qdrant", 12.25, long]])
    lines = table.splitlines()
    header, rule, edge, qdrant = lines
    assert header.split() == ["engine", "p50", "ms", "note"]
    assert set(rule.strip()) == {"─"}
    assert edge.index("1.5") + len("1.5") == qdrant.index("12.25") + len("12.25")  # right
    assert qdrant.rstrip().endswith(long)  # one line, not wrapped
    assert "\x1b[" not in table


def test_print_table_draws_boxes_on_a_terminal_and_plain_text_elsewhere() -> None:
    columns, rows = ["stage", "done"], [["turn indexed", 5]]
    terminal, log = Terminal(), io.StringIO()
    print_table(columns, rows, title="write path", out=terminal)
    print_table(columns, rows, title="write path", out=log)
    assert "╭" in terminal.getvalue() and "turn indexed" in terminal.getvalue()
    assert log.getvalue() == render_table(columns, rows, title="write path") + "\n"
