"""The gRPC edge is one layer: only :mod:`engram_core.codec` imports the generated
protobuf code, and only the modules that speak gRPC (the client and its search stream,
the port, the retrieval server and servicer) import the codec. Everything else works on
the domain types of :mod:`engram_core.memory`, so a change to the wire format touches
these modules only.
AST-based, like test_import_graph: lazy imports inside functions count.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [*ROOT.glob("libs/*/src"), *ROOT.glob("services/*/src")]
GENERATED = "engram_core.grpc_gen"
#: The module that hands out the generated code (``pb``, ``pb_grpc``).
EDGE = ("engram_core.codec",)

#: The one module that imports the generated code.
CODEC = "engram_core.codec"
#: The modules that speak gRPC, and why.
SPEAKS_GRPC = {
    "engram_core.retrieval_client": "the channel and the stubs",
    "engram_core.search_stream": "the interactive client's searches on one open stream",
    "engram_core.memory_port": "the client side: domain calls as gRPC requests",
    "engram_retrieval.server": "registers the servicer",
    "engram_retrieval.service": "the servicer: decodes requests, encodes answers",
}


def source_modules() -> dict[str, Path]:
    found = {}
    for source in SOURCES:
        for path in source.rglob("*.py"):
            parts = list(path.relative_to(source).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join(parts)
            if not name.startswith(GENERATED):
                found[name] = path
    return found


def imported(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports, as absolute dotted names (``from a import b`` gives
    both ``a`` and ``a.b``, since ``b`` may be a module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def touches(targets: set[str], prefixes: tuple[str, ...]) -> bool:
    return any(t == p or t.startswith(p + ".") for t in targets for p in prefixes)


def test_only_the_codec_imports_the_generated_code() -> None:
    modules = source_modules()
    assert len(modules) > 100  # the whole code base was read
    importers = sorted(
        name for name, path in modules.items() if touches(imported(name, path), (GENERATED,))
    )
    assert importers == [CODEC]


def test_only_the_modules_that_speak_grpc_import_the_codec() -> None:
    modules = source_modules()
    strays = sorted(
        name
        for name, path in modules.items()
        if name != CODEC and name not in SPEAKS_GRPC
        if touches(imported(name, path), EDGE)
    )
    assert strays == []


def test_the_scan_sees_lazy_and_relative_imports(tmp_path: Path) -> None:
    module = tmp_path / "edits.py"
    module.write_text(
        "def f():\n    from engram_core.codec import pb\n\nfrom .grpc_gen.engram import x\n"
    )
    found = imported("engram_core.edits", module)
    assert touches(found, EDGE) and touches(found, (GENERATED,))
