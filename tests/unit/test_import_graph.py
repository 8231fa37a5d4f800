"""No import circles among Engram's own modules (lazy imports inside functions count):
a circle means two modules that cannot be read, changed or tested one without the other.
And the CLI does not import the gateway: ``engram mcp`` serves the MCP tools of
engram_client, which the gateway imports too, so the stdio server needs no gateway code.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [*ROOT.glob("libs/*/src"), *ROOT.glob("services/*/src")]
FIRST_PARTY = (
    "engram_core",
    "engram_cli",
    "engram_client",
    "engram_gateway",
    "engram_retrieval",
    "engram_workers",
)
#: The benchmarks that score recall as the gateway delivers it call the gateway's own
#: recall in-process (measuring a copy would measure nothing): the CLI's only exceptions.
GATEWAY_RECALL_BENCHES = {
    "engram_cli.bench.locomo.delivered",
    "engram_cli.bench.paraphrase.evaluate",
}


def modules() -> dict[str, Path]:
    found = {}
    for source in SOURCES:
        for path in source.rglob("*.py"):
            if "grpc_gen" in path.parts:
                continue
            parts = list(path.relative_to(source).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                targets.add(sub if sub in known else base)
    return {t for t in targets if t in known and t != name and t.startswith(FIRST_PARTY)}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*stack[stack.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_import_graph_has_no_circles() -> None:
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert len(graph) > 100  # the whole code base was read
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph.get(todo.pop(), ()):
            if target not in seen:
                seen.add(target)
                todo.append(target)
    return seen


def test_the_cli_never_imports_the_gateway() -> None:
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    cli = [name for name in graph if name.startswith("engram_cli")]
    assert "engram_cli.mcp_cmd" in cli
    importers = sorted(
        f"{name} -> {target}"
        for name in cli
        if name not in GATEWAY_RECALL_BENCHES
        for target in graph[name]
        if target.startswith("engram_gateway")
    )
    assert importers == []
    assert not {m for m in reachable(graph, "engram_cli.mcp_cmd") if m.startswith("engram_gateway")}


def test_the_detector_finds_a_circle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
