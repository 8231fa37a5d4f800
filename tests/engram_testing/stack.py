"""The whole stack as ``engram up`` runs it, on free ports, for end-to-end tests."""

from __future__ import annotations

from pathlib import Path

from engram_cli.nats_server import free_port, free_port_block
from engram_cli.stack import WORKERS, StackSettings


def stack_settings(data_dir: Path) -> StackSettings:
    return StackSettings(
        data_dir=data_dir,
        nats_url=f"nats://127.0.0.1:{free_port()}",
        gateway_port=free_port(),
        retrieval_listen=f"127.0.0.1:{free_port()}",
        health_port_base=free_port_block(len(WORKERS)),
    )
