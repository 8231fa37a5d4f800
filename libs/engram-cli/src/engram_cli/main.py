"""The ``engram`` command."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable


def _cmd_up(args: argparse.Namespace) -> int:
    from engram_cli.cli_common import cli_settings
    from engram_cli.stack.up import run_stack

    return run_stack(
        cli_settings(args), process_per_worker=args.process_per_worker, light=args.light
    )


def _up_description() -> str:
    from engram_cli.cli_common import environment_defaults

    settings = environment_defaults()
    if settings is None:
        return "Start the local stack (the environment's ENGRAM_* settings are invalid)."
    ports = settings.worker_health_ports().values()
    return (
        "Start the local stack; each piece goes where this environment says, and the client "
        "commands (status, search, import, ...) look for it there. Here: gateway "
        f"{settings.local_gateway_url} (ENGRAM_GATEWAY_HOST/PORT), retrieval "
        f"{settings.retrieval_listen} (ENGRAM_RETRIEVAL_LISTEN), NATS {settings.nats_url} "
        f"(ENGRAM_NATS_URL), worker health ports {min(ports)}-{max(ports)} "
        "(ENGRAM_HEALTH_PORT_BASE)."
    )


def _cmd_scripted_llm(args: argparse.Namespace) -> int:
    import time

    from engram_cli.stack.reply_styles import REPLY_STYLES, styled
    from engram_cli.stack.scripted_llm import RuleBasedBrain, ScriptedUpstream

    if args.keep < 1:
        print("engram scripted-llm: --keep must be at least 1", file=sys.stderr)
        return 2
    if args.reply_style not in REPLY_STYLES:
        names = ", ".join(REPLY_STYLES)
        print(f"engram scripted-llm: --reply-style must be one of {names}", file=sys.stderr)
        return 2
    brain = styled(RuleBasedBrain(chat_reply=args.reply), args.reply_style)
    upstream = ScriptedUpstream(replies=[brain], keep=args.keep)
    upstream.port = args.port
    upstream.start()
    print(f"engram: scripted LLM at {upstream.base_url} (Ctrl-C stops)", flush=True)
    print(f"engram: what it received: GET http://127.0.0.1:{upstream.port}/requests", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        upstream.stop()
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from engram_cli.bench.command import run_bench

    return run_bench(args)


def _cmd_rebuild(args: argparse.Namespace) -> int:
    from engram_cli.memory.rebuild import run_rebuild

    return run_rebuild(args)


def _cmd_import(args: argparse.Namespace) -> int:
    from engram_cli.memory.importer import import_command

    return import_command(args)


def _cmd_export(args: argparse.Namespace) -> int:
    from engram_cli.memory.exporter import export_command

    return export_command(args)


def _cmd_search(args: argparse.Namespace) -> int:
    from engram_cli.memory.search import search_command

    return search_command(args)


def _cmd_reembed(args: argparse.Namespace) -> int:
    from engram_cli.memory.reembed import reembed_command

    return reembed_command(args)


def _cmd_dlq(args: argparse.Namespace) -> int:
    from engram_cli.memory.dlq import dlq_command

    return dlq_command(args)


def _cmd_reextract(args: argparse.Namespace) -> int:
    from engram_cli.memory.reextract import reextract_command

    return reextract_command(args)


def _cmd_migrate(args: argparse.Namespace) -> int:
    from engram_cli.memory.migrate import migrate_command

    return migrate_command(args)


def _cmd_status(args: argparse.Namespace) -> int:
    from engram_cli.stack.status import status_command

    return status_command(args)


def _cmd_serve_embeddings(args: argparse.Namespace) -> int:
    from engram_cli.stack.embeddings_server import serve_embeddings_command

    return serve_embeddings_command(args)


def _cmd_mcp(args: argparse.Namespace) -> int:
    from engram_cli.mcp_cmd import mcp_command

    return mcp_command(args)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or ``up``, ``scripted-llm`` and the command ``only``."""
    parser = argparse.ArgumentParser(
        prog="engram", description="Engram: persistent memory for OpenAI-compatible LLMs."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    from engram_cli.cli_common import add_data_dir_flag

    up = commands.add_parser(
        "up",
        help="start the local stack (nats, retrieval, gateway, workers)",
        description=_up_description(),
    )
    add_data_dir_flag(up)
    layout = up.add_mutually_exclusive_group()
    layout.add_argument(
        "--process-per-worker",
        action="store_true",
        help="run each worker in its own process (engram-<name>), as the chart deploys them; "
        "by default the workers share one process (engram-workers)",
    )
    layout.add_argument(
        "--light",
        action="store_true",
        help="run retrieval and the workers in one process, the workers calling retrieval "
        "without gRPC: the smallest footprint for one machine",
    )
    up.set_defaults(func=_cmd_up)

    scripted = commands.add_parser(
        "scripted-llm",
        help="a deterministic rule-based OpenAI-compatible server (demos, benchmarks)",
        description="Answers chats with a fixed reply and Engram's worker tasks by simple "
        "rules. GET /requests lists what it received (what Engram sent upstream), newest "
        "last; ?limit=N for the last N; DELETE /requests forgets them.",
    )
    scripted.add_argument("--port", type=int, default=11434, help="port on 127.0.0.1")
    scripted.add_argument("--reply", default="Noted.", help="the reply to every chat")
    scripted.add_argument(
        "--keep",
        type=int,
        default=1000,
        help="requests remembered for GET /requests (the most recent; default 1000)",
    )
    scripted.add_argument(
        "--reply-style",
        default="plain",
        metavar="STYLE",
        help="answer the workers' tasks as a local model family writes them: plain "
        "(default), think_with_draft, reasoning_field, fence_json, json5, refusal, ... "
        "(docs/workers.md, 'Local models')",
    )
    scripted.set_defaults(func=_cmd_scripted_llm)

    for name, (module, add_parser, handler) in _COMMANDS.items():
        if only in (None, name):
            getattr(importlib.import_module(module), add_parser)(commands, handler)
    return parser


#: command -> (module, the function that adds its parser, its handler). A command's module
#: is imported only when that command runs (or for the full help): each pulls in its own
#: stack (gRPC, NATS, the benchmarks' numpy), and a command must start in well under 1 s.
_COMMANDS: dict[str, tuple[str, str, Callable[[argparse.Namespace], int]]] = {
    "bench": ("engram_cli.bench.command", "add_bench_parser", _cmd_bench),
    "rebuild": ("engram_cli.memory.rebuild", "add_rebuild_parser", _cmd_rebuild),
    "import": ("engram_cli.memory.importer", "add_import_parser", _cmd_import),
    "export": ("engram_cli.memory.exporter", "add_export_parser", _cmd_export),
    "search": ("engram_cli.memory.search", "add_search_parser", _cmd_search),
    "reembed": ("engram_cli.memory.reembed", "add_reembed_parser", _cmd_reembed),
    "reextract": ("engram_cli.memory.reextract", "add_reextract_parser", _cmd_reextract),
    "migrate": ("engram_cli.memory.migrate", "add_migrate_parser", _cmd_migrate),
    "status": ("engram_cli.stack.status", "add_status_parser", _cmd_status),
    "mcp": ("engram_cli.mcp_cmd", "add_mcp_parser", _cmd_mcp),
    "dlq": ("engram_cli.memory.dlq", "add_dlq_parser", _cmd_dlq),
    "serve-embeddings": (
        "engram_cli.stack.embeddings_server",
        "add_serve_embeddings_parser",
        _cmd_serve_embeddings,
    ),
}


#: Commands the parser always has: they need no other command's parser.
_BUILT_IN = ("up", "scripted-llm")


def _command_in(argv: list[str]) -> str | None:
    """The command ``argv`` runs, when it is one of :data:`_COMMANDS`; "" for a built-in
    one (no other command's module is imported: ``engram up`` supervises the stack for
    hours, and the benchmarks' modules held 80 MB of it); else None (the whole parser)."""
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    if first in _BUILT_IN:
        return ""
    return first if first in _COMMANDS else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(_command_in(argv)).parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
