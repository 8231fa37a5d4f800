"""README.md's and docs/api.md's examples, run as written, in the order written, against
the whole stack (every worker, the rule-based scripted upstream).

Which blocks run: a fenced ``python`` or ``bash`` block right after an HTML comment
``<!-- run -->`` (invisible on GitHub). The comment may say what the block's output
must show and must not show: ``<!-- run expect="User hates pizza" reject="loves" -->``
(several of each allowed; whitespace is collapsed before comparing). Unmarked blocks are
templates (``<hex>``), commands that change the stack itself (``make run``, ``export
ENGRAM_API_KEYS=…``) or deployment, and are only read. Doc writers: mark a new example
that talks to the gateway, keep it runnable after the ones above it, and say what it
promises.

How they run, as a reader at one terminal would run them:
- the stack listens on free ports; ``http://127.0.0.1:8100`` and
  ``http://127.0.0.1:11434`` in the text are pointed at its gateway and scripted upstream;
- python blocks share one namespace per document (``K`` and ``ADMIN_KEY`` predefined
  for docs/api.md, whose stack has API keys; README's is single-tenant);
- bash blocks run under ``bash -e -o pipefail``, with ``$K``/``$ADMIN_KEY`` and the
  venv on ``PATH``; a variable a block assigns (``ID=$(…)``) is kept for later blocks;
- between blocks the test waits until the workers have caught up (a reader takes
  seconds to type the next one), so what a block promises is what the write path
  has learned by then.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import httpx2
import pytest
from openai import OpenAI

from engram_cli.stack.scripted_llm import RuleBasedBrain, ScriptedUpstream
from engram_cli.stack.up import Stack
from engram_gateway.keys import entry_for
from engram_testing.stack import start_stack

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTED_GATEWAY = "http://127.0.0.1:8100"
DOCUMENTED_UPSTREAM = "http://127.0.0.1:11434"
TENANT_KEY, ADMIN_KEY = "docs-example-key", "docs-example-admin-key"

_MARKER = re.compile(
    r"<!--\s*run\b(?P<args>[^>]*?)-->\s*\n```(?P<lang>python|bash)\n(?P<code>.*?)\n```", re.S
)
_ARG = re.compile(r'(expect|reject)="([^"]*)"')
_ASSIGNED = re.compile(r"^\s*(?:export\s+)?([A-Za-z_]\w*)=", re.M)


@dataclass
class Example:
    document: str
    line: int
    lang: str
    code: str
    expect: list[str] = field(default_factory=list)
    reject: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.document}:{self.line} ({self.lang})"


def runnable_examples(document: str) -> list[Example]:
    """The blocks of ``document`` marked ``<!-- run … -->``, in order."""
    text = (ROOT / document).read_text()
    examples = []
    for match in _MARKER.finditer(text):
        args = _ARG.findall(match["args"])
        examples.append(
            Example(
                document,
                text.count("\n", 0, match.start("code")) + 1,
                match["lang"],
                match["code"],
                [value for kind, value in args if kind == "expect"],
                [value for kind, value in args if kind == "reject"],
            )
        )
    return examples


class Reader:
    """Runs one document's examples in order: one python namespace, one shell's variables."""

    def __init__(self, stack: Stack, upstream: ScriptedUpstream, workdir: Path, keys: bool):
        settings = stack.settings
        self.gateway = f"http://{settings.gateway_host}:{settings.gateway_port}"
        self.upstream = upstream.base_url.removesuffix("/v1")
        self.admin = {"Authorization": f"Bearer {ADMIN_KEY}"} if keys else {}
        self.namespace: dict[str, object] = {"K": TENANT_KEY, "ADMIN_KEY": ADMIN_KEY}
        self.shell_state = workdir / "shell-state.sh"
        self.shell_state.write_text("")
        self.env = {
            **os.environ,
            "K": TENANT_KEY,
            "ADMIN_KEY": ADMIN_KEY,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        }
        self.workdir = workdir

    def localised(self, code: str) -> str:
        return code.replace(DOCUMENTED_GATEWAY, self.gateway).replace(
            DOCUMENTED_UPSTREAM, self.upstream
        )

    def run(self, example: Example) -> str:
        code = self.localised(example.code)
        output = self.run_python(code) if example.lang == "python" else self.run_bash(code)
        said = " ".join(output.split())
        for wanted in example.expect:
            assert " ".join(wanted.split()) in said, f"{example} should show {wanted!r}:\n{output}"
        for unwanted in example.reject:
            assert " ".join(unwanted.split()) not in said, (
                f"{example} shows {unwanted!r}:\n{output}"
            )
        return output

    def run_python(self, code: str) -> str:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, "<doc example>", "exec"), self.namespace)
        return printed.getvalue()

    def run_bash(self, code: str) -> str:
        keep = sorted(set(_ASSIGNED.findall(code)))
        script = f"source {shlex.quote(str(self.shell_state))}\n{code}\n" + "".join(
            f"declare -p {name} >> {shlex.quote(str(self.shell_state))}\n" for name in keep
        )
        done = subprocess.run(
            ["bash", "-e", "-o", "pipefail", "-c", script],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def close_clients(self) -> None:
        """The HTTP clients the examples opened (a reader's process would just end)."""
        for value in self.namespace.values():
            if isinstance(value, httpx.Client | OpenAI):
                value.close()

    def wait_until_learned(self, timeout_s: float = 30) -> None:
        """Until every worker's queue is empty twice in a row (the turn a chat publishes
        after answering may not be queued yet at the first look)."""
        time.sleep(0.5)
        deadline, quiet = time.monotonic() + timeout_s, 0
        while quiet < 2:
            assert time.monotonic() < deadline, "the workers did not catch up"
            consumers = httpx2.get(
                f"{self.gateway}/v1/admin/consumers", headers=self.admin, timeout=10
            ).json()["data"]
            busy = any(c["pending"] or c["ack_pending"] for c in consumers)
            quiet = 0 if busy else quiet + 1
            time.sleep(0.3)


def run_document(document: str, tmp_path: Path, **env: str) -> None:
    examples = runnable_examples(document)
    assert examples, f"{document} marks no example with <!-- run -->"
    brain = RuleBasedBrain(chat_reply="Noted.")
    stack, upstream = start_stack(
        tmp_path / "data", replies=[brain], process_per_worker=False, light=False, **env
    )
    reader = Reader(stack, upstream, tmp_path, keys="ENGRAM_API_KEYS" in env)
    try:
        for example in examples:
            reader.run(example)
            reader.wait_until_learned()
    finally:
        reader.close_clients()
        stack.stop()
        upstream.stop()


def test_readme_examples_run_as_written_and_show_what_they_promise(tmp_path: Path) -> None:
    run_document("README.md", tmp_path)


def test_api_doc_examples_run_as_written_and_show_what_they_promise(tmp_path: Path) -> None:
    keys = f"{entry_for(TENANT_KEY, 'acme')},{entry_for(ADMIN_KEY, 'ops')}:admin"
    # texts added through the API name no chat model: the workers need their own
    run_document("docs/api.md", tmp_path, ENGRAM_API_KEYS=keys, ENGRAM_LLM_MODEL="scripted-model")


def test_the_marker_reads_expectations_and_skips_unmarked_blocks(tmp_path: Path) -> None:
    text = (
        "```bash\nmake run\n```\n"
        '<!-- run expect="a b" reject="c" -->\n```bash\necho a  b\n```\n'
        "<!-- run -->\n```python\nprint(1)\n```\n"
    )
    (tmp_path / "doc.md").write_text(text)
    examples = runnable_examples(str(tmp_path / "doc.md"))
    assert [(e.lang, e.code, e.expect, e.reject, e.line) for e in examples] == [
        ("bash", "echo a  b", ["a b"], ["c"], 6),
        ("python", "print(1)", [], [], 10),
    ]
