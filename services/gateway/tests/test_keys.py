"""API key configuration: the entry format, fail-fast settings, the hash helper, and
the promise that neither keys nor memory text reach the logs."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import pytest

from engram_core.settings import ConfigError, load_settings
from engram_gateway.keys import Caller, KeyTable, entry_for, key_hash
from engram_gateway.settings import GatewaySettings
from engram_testing.worker_stack import running_retrieval


def test_entries_parse_and_resolve() -> None:
    text = f"""
        # team keys
        {entry_for("k1", "acme")}
        {entry_for("k2", "acme")}, {entry_for("k3", "beta.eu-1")}
    """
    table = KeyTable.parse(
        text.replace("sha256:" + key_hash("k3"), "sha256:" + key_hash("k3").upper())
    )
    assert table.tenant_for("k1") == table.tenant_for("k2") == "acme"
    assert table.tenant_for("k3") == "beta.eu-1"
    assert table.tenant_for("k4") is None
    assert table.tenant_for("") is None
    assert "sha256" not in repr(table) and key_hash("k1") not in str(table)


def test_an_admin_entry_names_its_tenant_and_the_role() -> None:
    table = KeyTable.parse(
        f"{entry_for('k1', 'acme')}\n{entry_for('ops', 'acme', admin=True)}\n"
        f"sha256:{key_hash('k2')}=beta : admin"
    )
    assert entry_for("ops", "acme", admin=True).endswith("=acme:admin")
    assert table.caller_for("k1") == Caller("acme", admin=False)
    assert table.caller_for("ops") == Caller("acme", admin=True)
    assert table.caller_for("k2") == Caller("beta", admin=True)
    assert table.tenant_for("ops") == "acme"
    assert table.caller_for("nobody") is None
    assert "2 admin" in repr(table)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f"sha256:{key_hash('k2')}=acme:root", "unknown role 'root'"),
        (f"sha256:{key_hash('k2')}=acme:", "unknown role ''"),
        (f"sha256:{key_hash('k2')}=:admin", "empty tenant"),
        (
            f"{entry_for('k2', 'acme')},{entry_for('k2', 'acme', admin=True)}",
            "with and without :admin",
        ),
        ("", "no key entries"),
        ("# only a comment", "no key entries"),
        ("k1=acme", "entry 1 is not"),
        (f"sha256:{'ab' * 31}=acme", "entry 1 is not"),
        (f"{entry_for('k1', 'a')},sha256:{key_hash('k2')}=", "entry 2 has an empty tenant"),
        (f"sha256:{key_hash('k2')}=   ", "empty tenant"),
        (entry_for("k1", "../etc"), "tenant '../etc' must be"),
        (f"{entry_for('k1', 'a')}\n{entry_for('k1', 'b')}", "two tenants"),
    ],
)
def test_malformed_entries_say_which_and_never_echo_keys(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"no key entries|entry|tenant") as raised:
        KeyTable.parse(text)
    assert message in str(raised.value)
    assert key_hash("k2") not in str(raised.value)


def test_settings_fail_fast_naming_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("ENGRAM_API_KEYS", "ENGRAM_API_KEYS_FILE"):
        monkeypatch.delenv(name, raising=False)
    assert load_settings(GatewaySettings).key_table is None  # single tenant

    monkeypatch.setenv("ENGRAM_API_KEYS", "not-an-entry")
    with pytest.raises(ConfigError, match=r"ENGRAM_API_KEYS: .*entry 1 is not"):
        load_settings(GatewaySettings)
    monkeypatch.setenv("ENGRAM_API_KEYS", f"sha256:{key_hash('k')}=")
    with pytest.raises(ConfigError, match=r"ENGRAM_API_KEYS: .*empty tenant"):
        load_settings(GatewaySettings)
    monkeypatch.setenv("ENGRAM_API_KEYS", entry_for("k1", "acme"))

    key_file = tmp_path / "keys"
    monkeypatch.setenv("ENGRAM_API_KEYS_FILE", str(key_file))
    with pytest.raises(ConfigError, match=r"ENGRAM_API_KEYS_FILE: .*cannot read"):
        load_settings(GatewaySettings)
    key_file.write_text('{"json": "is not the format"}\n')
    with pytest.raises(ConfigError, match=r"ENGRAM_API_KEYS_FILE: .*entry 1 is not"):
        load_settings(GatewaySettings)
    key_file.write_text(f"{entry_for('k1', 'other')}\n")
    with pytest.raises(ConfigError, match=r"ENGRAM_API_KEYS_FILE: .*different tenants"):
        load_settings(GatewaySettings)
    key_file.write_text(f"{entry_for('k1', 'acme', admin=True)}\n")
    with pytest.raises(ConfigError, match=r"ENGRAM_API_KEYS_FILE: .*with and without :admin"):
        load_settings(GatewaySettings)
    key_file.write_text(f"# mounted secret\n{entry_for('k2', 'beta')}\n\n")
    table = load_settings(GatewaySettings).key_table
    assert table is not None
    assert (table.tenant_for("k1"), table.tenant_for("k2")) == ("acme", "beta")


def test_hash_command() -> None:
    def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "engram_gateway.keys", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )

    digest = hashlib.sha256(b"s3cret").hexdigest()
    assert run("hash", "s3cret").stdout.strip() == f"sha256:{digest}"
    assert run("hash", "--tenant", "acme", stdin="s3cret\n").stdout.strip() == (
        f"sha256:{digest}=acme"
    )
    made = run("new", "acme").stdout.splitlines()
    key = made[0].split()[-1]
    assert made[1].split()[-1] == entry_for(key, "acme")
    assert KeyTable.parse(made[1].split()[-1]).tenant_for(key) == "acme"
    assert run("hash", "--tenant", "bad/tenant", "k").returncode != 0
    assert run("hash", "--tenant", "acme", "--admin", "s3cret").stdout.strip() == (
        f"sha256:{digest}=acme:admin"
    )
    assert run("hash", "--admin", "s3cret").returncode != 0  # an admin key needs a tenant
    admin = run("new", "ops", "--admin").stdout.splitlines()
    assert KeyTable.parse(admin[1].split()[-1]).caller_for(admin[0].split()[-1]) == Caller(
        "ops", admin=True
    )


async def test_no_key_or_memory_text_in_logs(
    tmp_path: Path, nats_url: str, scripted_upstream: Any
) -> None:
    key, text = "sk-engram-VERY-SECRET-KEY", "My passport number is X99-SECRET-TEXT"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ENGRAM_", "OTEL_"))}
    async with running_retrieval(tmp_path / "retrieval") as retrieval:
        env.update(
            ENGRAM_LOG_FORMAT="json",
            ENGRAM_LOG_LEVEL="debug",
            ENGRAM_NATS_URL=nats_url,
            ENGRAM_GATEWAY_PORT="0",
            ENGRAM_RETRIEVAL_ADDRESS=retrieval.address,
            ENGRAM_LLM_BASE_URL=scripted_upstream.base_url,
            ENGRAM_API_KEYS=entry_for(key, "acme"),
        )
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "engram_gateway", env=env, stderr=asyncio.subprocess.PIPE
        )
        assert process.stderr is not None
        lines: list[str] = []
        try:
            url = None
            while line := await asyncio.wait_for(process.stderr.readline(), timeout=30):
                lines.append(line.decode())
                if json.loads(line).get("event") == "gateway.listening":
                    url = json.loads(line)["url"]
                    break
            assert url, lines
            auth = {"Authorization": f"Bearer {key}", "X-Upstream-Authorization": f"Bearer {key}"}
            async with httpx2.AsyncClient(base_url=url, headers=auth, timeout=30) as client:
                created = await client.post("/v1/memories", json={"text": text})
                assert created.status_code == 201, created.text
                memory_id = created.json()["id"]
                patched = await client.patch(f"/v1/memories/{memory_id}", json={"text": text + "!"})
                assert patched.status_code == 200
                found = await client.post(
                    "/v1/memories/search", json={"query": text, "memory_score_threshold": 0}
                )
                assert found.json()["hits"]
                assert (
                    await client.post("/v1/memories/add", json={"text": text})
                ).status_code == 202
                chat = await client.post(
                    "/v1/chat/completions",
                    json={"model": "m", "messages": [{"role": "user", "content": text}]},
                )
                assert chat.status_code == 200
                assert (
                    await client.post("/v1/memories", json={"text": text, "x": 1})
                ).status_code == 400
                assert (await client.delete(f"/v1/memories/{memory_id}")).status_code == 200
                wrong = await client.get(
                    "/v1/memories", headers={"Authorization": f"Bearer {key}x"}
                )
                assert wrong.status_code == 401
        finally:
            process.send_signal(signal.SIGTERM)
            rest = await asyncio.wait_for(process.stderr.read(), timeout=30)
            await process.wait()
    logs = "".join(lines) + rest.decode()
    assert '"memory.created"' in logs and '"chat.request"' in logs  # the requests were logged
    assert '"auth.keys_configured"' in logs
    for secret in (key, "VERY-SECRET", "SECRET-TEXT", "passport", key_hash(key)):
        assert secret not in logs
