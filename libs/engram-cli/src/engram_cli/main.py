"""The ``engram`` command."""

from __future__ import annotations

import argparse
import sys

from engram_core.settings import load_settings


def _cmd_up(args: argparse.Namespace) -> int:
    from engram_cli.stack import StackSettings, run_stack

    overrides: dict[str, object] = {}
    if args.data_dir:
        overrides["data_dir"] = args.data_dir
    return run_stack(load_settings(StackSettings, **overrides))


def _cmd_scripted_llm(args: argparse.Namespace) -> int:
    import time

    from engram_cli.scripted_llm import RuleBasedBrain, ScriptedUpstream

    upstream = ScriptedUpstream(replies=[RuleBasedBrain(chat_reply=args.reply)])
    upstream.port = args.port
    upstream.start()
    print(f"engram: scripted LLM at {upstream.base_url} (Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        upstream.stop()
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from engram_cli.bench import run_bench

    return run_bench(args)


def _cmd_rebuild(args: argparse.Namespace) -> int:
    from engram_cli.rebuild import run_rebuild

    return run_rebuild(args)


def _cmd_import(args: argparse.Namespace) -> int:
    from engram_cli.importer import import_command

    return import_command(args)


def _cmd_export(args: argparse.Namespace) -> int:
    from engram_cli.exporter import export_command

    return export_command(args)


def _cmd_search(args: argparse.Namespace) -> int:
    from engram_cli.search_cmd import search_command

    return search_command(args)


def _cmd_reembed(args: argparse.Namespace) -> int:
    from engram_cli.reembed import reembed_command

    return reembed_command(args)


def _cmd_reextract(args: argparse.Namespace) -> int:
    from engram_cli.reextract import reextract_command

    return reextract_command(args)


def _cmd_migrate(args: argparse.Namespace) -> int:
    from engram_cli.migrate import migrate_command

    return migrate_command(args)


def _cmd_status(args: argparse.Namespace) -> int:
    from engram_cli.status import status_command

    return status_command(args)


def _cmd_mcp(args: argparse.Namespace) -> int:
    from engram_cli.mcp_cmd import mcp_command

    return mcp_command(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="engram", description="Engram: persistent memory for OpenAI-compatible LLMs."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    up = commands.add_parser("up", help="start the local stack (nats, retrieval, gateway, workers)")
    up.add_argument("--data-dir", help="state directory (default: $ENGRAM_DATA_DIR or .engram)")
    up.set_defaults(func=_cmd_up)

    scripted = commands.add_parser(
        "scripted-llm",
        help="a deterministic rule-based OpenAI-compatible server (demos, benchmarks)",
    )
    scripted.add_argument("--port", type=int, default=11434, help="port on 127.0.0.1")
    scripted.add_argument("--reply", default="Noted.", help="the reply to every chat")
    scripted.set_defaults(func=_cmd_scripted_llm)

    from engram_cli.bench import add_bench_parser

    add_bench_parser(commands, _cmd_bench)

    from engram_cli.rebuild import add_rebuild_parser

    add_rebuild_parser(commands, _cmd_rebuild)

    from engram_cli.exporter import add_export_parser
    from engram_cli.importer import add_import_parser
    from engram_cli.mcp_cmd import add_mcp_parser
    from engram_cli.migrate import add_migrate_parser
    from engram_cli.reembed import add_reembed_parser
    from engram_cli.reextract import add_reextract_parser
    from engram_cli.search_cmd import add_search_parser
    from engram_cli.status import add_status_parser

    add_import_parser(commands, _cmd_import)
    add_export_parser(commands, _cmd_export)
    add_search_parser(commands, _cmd_search)
    add_reembed_parser(commands, _cmd_reembed)
    add_reextract_parser(commands, _cmd_reextract)
    add_migrate_parser(commands, _cmd_migrate)
    add_status_parser(commands, _cmd_status)
    add_mcp_parser(commands, _cmd_mcp)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
