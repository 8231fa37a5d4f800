"""The whole stack as ``engram up`` runs it, on free ports, for end-to-end tests."""

from __future__ import annotations

from pathlib import Path

from engram_cli.cli_common import WORKERS
from engram_cli.stack.nats_server import free_port, free_port_block
from engram_cli.stack.scripted_llm import Reply, RuleBasedBrain, ScriptedUpstream
from engram_cli.stack.up import Stack, StackSettings


def stack_settings(data_dir: Path) -> StackSettings:
    return StackSettings(
        data_dir=data_dir,
        nats_url=f"nats://127.0.0.1:{free_port()}",
        gateway_port=free_port(),
        retrieval_listen=f"127.0.0.1:{free_port()}",
        health_port_base=free_port_block(len(WORKERS)),
    )


def start_stack(
    data_dir: Path,
    replies: list[Reply] | None = None,
    *,
    process_per_worker: bool = False,
    light: bool = False,
    **env: str,
) -> tuple[Stack, ScriptedUpstream]:
    """The whole stack against a scripted upstream (the rule-based brain unless
    ``replies`` says otherwise), started; the caller stops both. The workers share one
    process, as ``engram up`` runs them, unless ``process_per_worker`` (a test that kills
    one worker alone), or with retrieval too when ``light``."""
    upstream = ScriptedUpstream(replies=replies or [RuleBasedBrain(chat_reply="Noted.")]).start()
    stack = Stack(
        stack_settings(data_dir),
        echo=lambda _: None,
        relay_logs=False,
        process_per_worker=process_per_worker,
        light=light,
        extra_env={
            "ENGRAM_LLM_BASE_URL": upstream.base_url,
            "ENGRAM_LOG_FORMAT": "json",
            "ENGRAM_MIRROR_COMMIT_INTERVAL_S": "0.5",
            # a killed worker's unacknowledged message comes back after this long
            "ENGRAM_ACK_WAIT_S": "5",
            **env,
        },
    )
    try:
        stack.start()
    except BaseException:
        stack.stop()
        upstream.stop()
        raise
    return stack, upstream
