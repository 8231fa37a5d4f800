"""``engram search "…"``: what a chat would recall, with scores, through the gateway's
``POST /v1/memories/search`` with the Python client (default) or retrieval's ``Search``
(``--via grpc``)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any, TextIO

from pydantic import ValidationError

from engram_cli.cli_common import (
    CliSettings,
    CommandError,
    add_gateway_flags,
    add_retrieval_flag,
    cli_settings,
)


def add_search_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
    handler: Callable[[argparse.Namespace], int],
) -> None:
    parser = commands.add_parser(
        "search",
        help="search memory the way a chat recalls it; prints hits with scores",
        description="Retrieval only, no LLM. Prints the hits with their scores, or JSON.",
    )
    parser.add_argument("query")
    parser.add_argument("--user", default="", help="the user scope")
    parser.add_argument("--conversation", default="default", help="the conversation scope")
    parser.add_argument("--top-k", type=int, help="hits to return (1-100)")
    parser.add_argument("--threshold", type=float, help="minimum relevance (0-1)")
    parser.add_argument("--via", choices=("http", "grpc"), default="http")
    parser.add_argument("--tenant", default="default", help="grpc only (http: the key decides)")
    parser.add_argument("--json", action="store_true", help="print the whole response as JSON")
    add_gateway_flags(parser)
    add_retrieval_flag(parser)
    parser.set_defaults(func=handler)


async def search_http(settings: CliSettings, args: argparse.Namespace) -> dict[str, Any]:
    from engram_client import AsyncEngramClient, EngramError

    key = settings.api_key.get_secret_value() if settings.api_key else None
    async with AsyncEngramClient(settings.gateway_url, key) as engram:
        try:
            found = await engram.search(
                args.query,
                user=args.user,
                conversation=args.conversation,
                top_k=args.top_k,
                score_threshold=args.threshold,
            )
        except EngramError as exc:
            status = f"{exc.status} {exc.code or exc.type}: " if exc.status else ""
            raise CommandError(f"{status}{exc.message}") from None
        except ValidationError as exc:  # refused by the API's own model, before any call
            raise CommandError(str(exc)) from None
    return found.model_dump(mode="json")


async def search_grpc(settings: CliSettings, args: argparse.Namespace) -> dict[str, Any]:
    # gRPC and the generated stubs cost most of a second to import: only --via grpc pays.
    from engram_core.memory import SearchQuery
    from engram_core.memory_port import MemoryPort, RetrievalError
    from engram_core.retrieval_client import RetrievalClient

    query = SearchQuery(
        tenant=args.tenant,
        text=args.query,
        user_id=args.user,
        conversation_id=args.conversation,
        top_k=args.top_k,
        score_threshold=args.threshold,
    )
    client = RetrievalClient(settings.retrieval_address, timeout_s=30)
    try:
        result = await MemoryPort(client).search(query)
    except RetrievalError as exc:
        raise CommandError(str(exc)) from None
    finally:
        await client.close()
    # The same shape as the HTTP answer, so --json and the table read either.
    hits = []
    for hit in result.hits:
        memory = hit.memory
        scores = {k: round(v, 6) for k, v in asdict(hit.scores).items() if v is not None}
        hits.append(
            {
                "id": memory.id,
                "kind": memory.kind,
                "text": memory.text,
                "role": memory.role,
                "user_id": memory.user_id,
                "conversation_id": memory.conversation_id,
                "created_at": memory.created_at.isoformat() if memory.created_at else None,
                "score": round(hit.scores.total, 6),
                "scope": hit.scope,
                "scores": scores,
            }
        )
    return {
        "outcome": result.outcome,
        "hits": hits,
        "summary": result.summary.text if result.summary is not None else None,
        "profile": [m.text for m in result.profile],
    }


def print_hits(result: dict[str, Any], out: TextIO) -> None:
    hits = result.get("hits") or []
    print(f"outcome: {result.get('outcome')}  hits: {len(hits)}", file=out)
    for n, hit in enumerate(hits, start=1):
        scores = hit.get("scores") or {}
        day = (hit.get("created_at") or "")[:10] or "undated"
        label = f"{hit['kind']}/{hit['role']}" if hit.get("role") else hit["kind"]
        text = " ".join(str(hit.get("text", "")).split())
        print(
            f"{n:>2}. {hit['score']:.3f} (rel {scores.get('relevance', 0):.3f}) "
            f"[{day}] {label} <{hit.get('scope')}:{hit.get('conversation_id')}> {text}",
            file=out,
        )


def search_command(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out if out is not None else sys.stdout
    settings = cli_settings(args)
    try:
        run = search_http if args.via == "http" else search_grpc
        result = asyncio.run(run(settings, args))
    except CommandError as exc:
        print(f"engram search: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False), file=out)
    else:
        print_hits(result, out)
    return 0
