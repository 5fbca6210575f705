"""What the fuzzer feeds: for every command and reader, seeds, a strategy for the input file and the command
line that reads it."""

from __future__ import annotations

import importlib.util
import json
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from hypothesis import strategies as st

from . import strategies as S

ROOT = Path(__file__).resolve().parents[2]
FIX = ROOT / "fixtures"
TOK = str(FIX / "tok")
PROMPTS = FIX / "prompts"
DATA = Path(__file__).resolve().parent / "data"


def _json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def _jsonl(path: Path, limit: int = 20) -> list:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()[:limit] if line.strip()]


@dataclass(frozen=True)
class Target:
    """One way of reading one kind of input: ``strategy(size)`` draws the file's bytes; ``args(path)`` is the
    command line (the fuzzed file is ``path``)."""

    name: str
    filename: str
    strategy: Callable[[dict], st.SearchStrategy]
    args: Callable[[str], Sequence[str]]
    app: str = "cachectl"
    json_output: bool = True
    #: an error must name one of these ("{path}" is the fuzzed file)
    names: Sequence[str] = ("{path}",)


def size(long: bool) -> dict:
    """Sizes of the adversarial pieces: the issue's 100,000 levels always; a 1 MiB line in CI, 4 MiB outside
    (16 MiB ones take the fixture tokenizer 30 s and 3 GB: see the issue notes)."""
    return {"deep": S.DEEP, "huge_line": (4 << 20) if long else S.HUGE_LINE, "long": long}


# -------------------------------------------------------------------------------------------- seeds

IDS_SEEDS = [[1, 2, 3, 4], {"tokens": [5, 6, 7]}, {"prompt_token_ids": [1, 2]}, {"input_ids": [9]},
             {"prompt": [1, 2, 3]}, {"body": {"prompt": [4, 5]}}]


@lru_cache(None)
def chat_seeds() -> list:
    return [_json(PROMPTS / n) for n in ("chat_no_system.json", "chat_with_system.json", "openai_tools_a.json",
                                         "anthropic_body.json", "think_conversation.json",
                                         "stable_conversation.json")] + [
        {"model": "gpt-4o", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
        {"messages": [{"role": "assistant", "content": None,
                       "tool_calls": [{"id": "c1", "type": "function",
                                       "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}]},
        {"system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
         "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"},
                                                   {"type": "thinking", "thinking": "hmm"}]}]},
        {"prompt": "plain completion"}, {"text": "a text record"}]


@lru_cache(None)
def log_seeds() -> list:
    return _jsonl(PROMPTS / "demo_log.jsonl") + [{"session": "s9", "body": c} for c in chat_seeds()[:4]]


@lru_cache(None)
def fix_seeds() -> list:
    return _jsonl(PROMPTS / "fix_log.jsonl") + log_seeds()[:6] + [c for c in chat_seeds() if isinstance(c, list)]


def trace_seeds() -> list:
    return [{"tokens": list(range(1, 40)), "salt": "acme", "timestamp": 1.5, "output_tokens": 3},
            {"tokens": list(range(1, 30)) + [7, 7], "cache_salt": "globex", "output_tokens": 0},
            {"prompt_token_ids": list(range(10, 50)), "segments": [20, 20]},
            {"input_ids": [3] * 17, "timestamp": 2}]


def mooncake_seeds() -> list:
    return [{"timestamp": 1000, "input_length": 40, "output_length": 5, "hash_ids": [1, 2, 3]},
            {"timestamp": 1720000000000, "input_length": 16, "output_length": 1, "hash_ids": [1]},
            {"timestamp": 2000, "input_length": 33, "output_length": 0, "hash_ids": [1, 2, 9], "salt": "t1"}]


def text_trace_seeds() -> list:
    return [{"prompt": "hello world, a shared prefix for the cache", "salt": "a"},
            {"messages": [{"role": "user", "content": "hi there"}], "tenant": "b"},
            {"body": {"messages": [{"role": "user", "content": "wrapped"}]}, "timestamp": 3}]


@lru_cache(None)
def request_seeds() -> list:
    body = _json(PROMPTS / "anthropic_body.json")
    return _jsonl(PROMPTS / "anthropic_requests.jsonl") + [
        {"timestamp": 1, "body": body, "model": "claude-sonnet-4-5"},
        {"timestamp": "2026-11-29T10:00:00Z", "model": "gpt-4o", "messages": [{"role": "user", "content": "x"}]},
        {"timestamp": 30, "model": "claude-sonnet-4-5", "blocks": [{"id": "a", "tokens": 2000,
                                                                    "cache_control": {"type": "ephemeral"}}]}]


@lru_cache(None)
def usage_seeds() -> list:
    return _jsonl(PROMPTS / "responses.jsonl") + [
        {"model": "gpt-4o", "usage": {"prompt_tokens": 2000, "completion_tokens": 10,
                                      "prompt_tokens_details": {"cached_tokens": 1024}}},
        {"timestamp": 1, "body": {"model": "claude-sonnet-4-5",
                                  "usage": {"input_tokens": 5, "output_tokens": 1}}}]


@lru_cache(None)
def price_seeds() -> list:
    shipped = _json(ROOT / "cachectl" / "data" / "prices.json")
    first = dict(list(shipped["models"].items())[:2])
    return [{"schema_version": 1, "models": first},
            {"my-model": {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6,
                          "cache_read_input_token_cost": 1e-7, "cache_creation_input_token_cost": 1.25e-6,
                          "litellm_provider": "anthropic"}}]


@lru_cache(None)
def config_seeds() -> list:
    catalog = _json(ROOT / "cachectl" / "data" / "models.json")["models"]
    return [_json(FIX / "tiny-llama" / "config.json")] + [m["config"] for m in catalog.values()] + [
        {"text_config": _json(FIX / "tiny-llama" / "config.json"), "model_type": "vlm"},
        {"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 64, "layer_types":
            ["full_attention", "sliding_attention", "linear_attention", "full_attention"], "sliding_window": 32}]


@lru_cache(None)
def template_seeds() -> list[str]:
    return sorted(p.read_text(encoding="utf-8") for p in (FIX / "lint").rglob("*") if p.suffix in (".j2", ".jinja"))


TEMPLATE_FRAGMENTS = ["{{ ", " }}", "{% ", " %}", "{# ", " #}", "{{ now() }}", "{{ strftime_now('%Y') }}",
                      "{% for x in range(10**9) %}{{ x }}{% endfor %}", "{{ user_name }}",
                      "{{ tools | tojson }}", "{% if %}", "{{ ''.__class__ }}", "{{ " + "(" * 5000 + "1" + ")" * 5000
                      + " }}", "{% raw %}", "{{ x.y.z }}", "\x00", "{{ messages[0]['content'] }}",
                      "{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", "{{ raise_exception('no') }}",
                      "{# cachectl: ignore[CC999] #}", "{# cachectl: ignore[ #}"]


@lru_cache(None)
def chat_template_seeds() -> list[str]:
    tok = _json(FIX / "tok" / "tokenizer_config.json").get("chat_template")
    found = [p.read_text(encoding="utf-8") for p in sorted((FIX / "lint").rglob("*chat_template*.jinja"))]
    return ([tok] if isinstance(tok, str) else []) + found


def tokenizer_config_seeds() -> list:
    return [{"chat_template": t, "bos_token": "<s>"} for t in chat_template_seeds()] + [
        {"chat_template": [{"name": "default", "template": chat_template_seeds()[0]}]}]


#: known to take minutes and gigabytes (issue 11: the sandbox does not bound string repetition): long runs only
TEMPLATE_BOMBS = ["{{ '%s' * 10**9 }}", "{{ 'ab' * 10**8 }}{{ user_id }}"]


@lru_cache(None)
def body_seeds() -> list:
    return [_json(p) for p in sorted((FIX / "lint").rglob("*.json"))] + [[{"role": "user", "content": "x"}]]


def lint_config_seeds() -> list:
    return [{"select": ["CC001", "CC003"], "ignore": ["CC006"], "model": "claude-sonnet-4-5", "tail-tokens": 32,
             "per-file-ignores": {"*.j2": ["CC001"]}},
            {"select": [], "per-file-ignores": {}}]


PAIRS_SEEDS = ["text_a\ttext_b\tlabel\nHow do I reset my password?\tHow can I reset my password?\t1\n"
               "Is it 5 km?\tIs it 5 miles?\t0\n",
               "text_a,text_b,label\n\"a, quoted\",b,1\nc,d,0\n",
               "{\"text_a\": \"a\", \"text_b\": \"b\", \"label\": 1}\n{\"text_a\": \"c\", \"text_b\": \"d\", \"label\": \"0\"}\n"]
PAIRS_FRAGMENTS = ["\t", ",", "\"", "\n", "\r\n", "\x00", "\ud800", "label", "\t\t\t", "2", "-1", "{", "}", "\"\"",
                   "\n\n\n", "text_a"]


@lru_cache(None)
def semantic_log_seeds() -> list:
    return _jsonl(FIX / "semantic" / "log.jsonl") + [
        {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}], "response": "r"}]


@lru_cache(None)
def gguf_seeds() -> list[bytes]:
    with tempfile.TemporaryDirectory(prefix="cachectl-gguf-") as tmp:  # (the bytes are the seeds: nothing kept)
        return [S.gguf_seed(str(Path(tmp) / "a.gguf")), S.gguf_seed(str(Path(tmp) / "b.gguf"), per_layer_kv=True)]


# ------------------------------------------------------------------------------------------ targets

def _j(seeds: Callable[[], list]) -> Callable[[dict], st.SearchStrategy]:
    return lambda z: S.json_document(seeds(), z["deep"], z["huge_line"])


def _jl(seeds: Callable[[], list]) -> Callable[[dict], st.SearchStrategy]:
    return lambda z: S.jsonl_document(seeds(), z["deep"], z["huge_line"])


TARGETS: list[Target] = [
    Target("diff-tokens.ids", "a.json", _j(lambda: IDS_SEEDS),
           lambda p: ["diff-tokens", p, str(DATA / "ids_b.json"), "--format", "json"]),
    Target("diff-tokens.chat", "a.json", _j(chat_seeds),
           lambda p: ["diff-tokens", p, str(PROMPTS / "chat_with_system.json"), "-t", TOK, "--format", "json"]),
    Target("diff-tokens.text", "a.txt",
           lambda z: S.text_document([(PROMPTS / "system_time_a.txt").read_text()], ["\x00", "{", "\ud800", "<s>"],
                                     z["deep"], z["huge_line"]),
           lambda p: ["diff-tokens", p, str(PROMPTS / "system_time_b.txt"), "-t", TOK, "--format", "json"]),
    Target("diff-tokens.log", "log.jsonl", _jl(log_seeds),
           lambda p: ["diff-tokens", "--log", p, "--key", "session", "-t", TOK, "--format", "json"]),
    Target("fix.log", "log.jsonl", _jl(fix_seeds),
           lambda p: ["fix", p, "-t", TOK, "--unsafe-fixes", "--model", "claude-sonnet-4-5", "--format", "json"]),
    Target("report.log", "log.jsonl", _jl(fix_seeds),
           lambda p: ["report", p, "-t", TOK, "--html", p + ".html", "--format", "json"]),
    Target("diff-tokens.stability", "conv.json", _j(chat_seeds),
           lambda p: ["diff-tokens", "--stability", p, "-t", TOK, "--format", "json"]),
    Target("simulate-prefix.tokens", "trace.jsonl", _jl(trace_seeds),
           lambda p: ["simulate-prefix", p, "--capacity-blocks", "8", "--block-size", "4", "--format", "json"]),
    Target("simulate-prefix.radix", "trace.jsonl", _jl(trace_seeds),
           lambda p: ["simulate-prefix", p, "--policy", "radix", "--capacity-blocks", "8", "--block-size", "4",
                      "--concurrency", "3", "--format", "json"]),
    Target("simulate-prefix.chunk", "trace.jsonl", _jl(trace_seeds),
           lambda p: ["simulate-prefix", p, "--policy", "chunk", "--chunk-size", "8", "--block-size", "4",
                      "--format", "json"]),
    Target("simulate-prefix.mooncake", "mooncake.jsonl", _jl(mooncake_seeds),
           lambda p: ["simulate-prefix", p, "--capacity-blocks", "16", "--block-size", "16", "--hash-block-size",
                      "16", "--concurrency", "2", "--format", "json"]),
    Target("simulate-prefix.text", "trace.jsonl", _jl(text_trace_seeds),
           lambda p: ["simulate-prefix", p, "--policy", "infinite", "--block-size", "4", "-t", TOK,
                      "--tenant-field", "tenant", "--format", "json"]),
    Target("simulate-prefix.model", "config.json", _j(config_seeds),
           lambda p: ["simulate-prefix", str(DATA / "trace_small.jsonl"), "--capacity-gib", "0.001",
                      "--model", p, "--format", "json"],
           names=("{path}", str(DATA / "trace_small.jsonl"))),  # a capacity too small for the trace names it
    *([] if importlib.util.find_spec("pyarrow") is None else [
        Target("simulate-prefix.parquet", "trace.parquet", lambda z: S.parquet_document(trace_seeds()),
               lambda p: ["simulate-prefix", p, "--capacity-blocks", "8", "--block-size", "4", "--concurrency", "2",
                          "--format", "json"]),
        Target("simulate-prefix.parquet-mooncake", "trace.parquet", lambda z: S.parquet_document(mooncake_seeds()),
               lambda p: ["simulate-prefix", p, "--capacity-blocks", "16", "--block-size", "16", "--hash-block-size",
                          "16", "--replicas", "2", "--router", "all", "--cpu-offload-blocks", "4", "--format", "json"]),
    ]),
    Target("prompt-cost.requests", "requests.jsonl", _jl(request_seeds),
           lambda p: ["prompt-cost", p, "-t", TOK, "--format", "json"]),
    Target("prompt-cost.usage", "responses.jsonl", _jl(usage_seeds),
           lambda p: ["prompt-cost", "--usage", p, "--format", "json"]),
    Target("prompt-cost.prices", "prices.json", _j(price_seeds),
           lambda p: ["prompt-cost", "--prices", p, "--list-models", "--format", "json"]),
    Target("kv-inspect.config", "config.json", _j(config_seeds),
           lambda p: ["kv-inspect", p, "--gpu", "H100", "--format", "json"]),
    Target("kv-inspect.gguf", "model.gguf", lambda z: S.gguf_document(gguf_seeds()),
           lambda p: ["kv-inspect", p, "--format", "json"]),
    Target("lint.template", "prompt.j2",
           lambda z: S.text_document(template_seeds(), TEMPLATE_FRAGMENTS + (TEMPLATE_BOMBS if z["long"] else []),
                                     z["deep"], z["huge_line"]),
           lambda p: ["lint", p, "--format", "json"]),
    Target("lint.template-diff", "prompt.j2",
           lambda z: S.text_document(template_seeds(), TEMPLATE_FRAGMENTS, z["deep"], z["huge_line"]),
           lambda p: ["lint", p, "--diff"], json_output=False),
    Target("lint.body", "body.json", _j(body_seeds), lambda p: ["lint", p, "--format", "json"]),
    Target("lint.yaml", "body.yaml", lambda z: S.yaml_document(body_seeds()), lambda p: ["lint", p, "--format", "json"]),
    Target("lint.tokenizer-config", "tokenizer_config.json", _j(tokenizer_config_seeds),
           lambda p: ["lint", p, "--format", "json"]),
    Target("diff-tokens.chat-template", "template.jinja",
           lambda z: S.text_document(chat_template_seeds(), TEMPLATE_FRAGMENTS, z["deep"], z["huge_line"]),
           lambda p: ["diff-tokens", str(PROMPTS / "chat_no_system.json"), str(PROMPTS / "chat_with_system.json"),
                      "-t", TOK, "--chat-template", p, "--format", "json"]),
    Target("lint.config", "pyproject.toml", lambda z: S.toml_document(lint_config_seeds(), z["huge_line"]),
           lambda p: ["lint", str(FIX / "lint" / "good" / "support_prompt.j2"), "--config", p, "--format", "json"]),
    Target("semantic-probe.dupes", "log.jsonl", _jl(semantic_log_seeds),
           lambda p: ["semantic-probe", "dupes", p, "--format", "json"]),
    Target("semantic-probe.pairs", "pairs.tsv",
           lambda z: S.text_document(PAIRS_SEEDS, PAIRS_FRAGMENTS, z["deep"], z["huge_line"]),
           lambda p: ["pairs", p, "--label"], app="readers"),
    Target("semantic-probe.replay", "log.jsonl", _jl(semantic_log_seeds),
           lambda p: ["log-prompts", p], app="readers"),
]


#: the real logs of ``fixtures/logs/`` (each log shape of :mod:`cachectl.inputs.formats`), each read by ``report`` as
#: a file of the same name (a reader may know its shape by the name's ending): JSON lines mutated line by line,
#: a JSON document or a YAML cassette as a whole, a server's text log with fragments spliced in
LOGS = FIX / "logs"
LOG_FRAGMENTS = ["\n", "'", "\"", "prompt: ", "params: ", "Received request ", "\\n", "\x00", "\ud800",
                 "prompt_token_ids: [", "]", ", lora_request: None", "{", "INFO 05-14 10:11:12 [logger.py:43] "]


def _log_strategy(path: Path) -> Callable[[dict], st.SearchStrategy]:
    if path.suffix == ".jsonl":
        return _jl(lambda: _jsonl(path, limit=40))
    if path.suffix == ".json":
        return _j(lambda: [_json(path)])
    if path.suffix == ".yaml":
        import yaml

        return lambda z: S.yaml_document([yaml.safe_load(path.read_text(encoding="utf-8"))])
    return lambda z: S.text_document([path.read_text(encoding="utf-8")], LOG_FRAGMENTS, z["deep"], z["huge_line"])


_LOG_FILES = [p for p in sorted(LOGS.iterdir()) if p.is_file() and p.suffix in (".jsonl", ".json", ".yaml", ".log")]
#: the commands that read every shape: ``report`` (requests, usage, the whole-log path), ``prompt-cost --usage``
#: (the billed counters), ``simulate-prefix`` (the prompts as tokens), ``diff-tokens --log`` (consecutive requests)
TARGETS += [Target(f"{name}.{p.stem}", p.name, _log_strategy(p), args)
            for p in _LOG_FILES for name, args in (
                ("report", lambda f: ["report", f, "-t", TOK, "--format", "json", "--jobs", "1"]),
                ("prompt-cost", lambda f: ["prompt-cost", "--usage", f, "--format", "json"]),
                ("simulate-prefix", lambda f: ["simulate-prefix", f, "-t", TOK, "--policy", "infinite",
                                               "--format", "json"]),
                ("diff-tokens", lambda f: ["diff-tokens", "--log", f, "-t", TOK, "--format", "json"]))]

#: options whose free-form value cachectl parses itself: (name, command line with {v} for the value)
OPTION_TARGETS: list[tuple[str, Sequence[str]]] = [
    ("--context", ["kv-inspect", "llama-3.1-8b", "--context", "{v}", "--format", "json"]),
    ("--gpu-memory", ["kv-inspect", "llama-3.1-8b", "--gpu-memory", "{v}", "--format", "json"]),
    ("--sweep-capacity", ["simulate-prefix", str(DATA / "trace_small.jsonl"), "--capacity-blocks", "8",
                          "--sweep-capacity", "{v}", "--format", "json"]),
    ("--template-var", ["diff-tokens", str(PROMPTS / "chat_no_system.json"), str(PROMPTS / "chat_with_system.json"),
                        "-t", TOK, "--template-var", "{v}", "--format", "json"]),
    ("--every", ["prompt-cost", "--model", "claude-sonnet-4-5", "--prefix-tokens", "2000", "--calls", "3", "--every",
                 "{v}", "--format", "json"]),
    ("--select", ["lint", str(FIX / "lint" / "good" / "support_prompt.j2"), "--select", "{v}", "--format", "json"]),
]


def target(name: str) -> Target:
    return next(t for t in TARGETS if t.name == name)


def run_target(t: Target, data: bytes, workdir: Path, timeout: float | None = None):
    """Write ``data`` as the target's input under ``workdir``, run the command; ``(outcome, expect)``."""
    from .harness import DEFAULT_TIMEOUT_S, Expect, invoke

    path = workdir / t.filename
    path.write_bytes(data)
    out = invoke(t.args(str(path)), app=t.app, timeout=timeout or DEFAULT_TIMEOUT_S)
    expect = Expect(names=[n.format(path=str(path)) for n in t.names], json_output=t.json_output,
                    max_line=_text_lines(data))
    return out, expect


def _text_lines(data: bytes) -> int:
    """Lines of the input as the readers see it: gzip is undone first (the readers accept .gz)."""
    if data[:2] == b"\x1f\x8b":
        import zlib

        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            data = d.decompress(data)
        except zlib.error:
            data = b""  # corrupt from the start: the error names no line past the first

    return data.count(b"\n") + 1


def run_option(name: str, argv: Sequence[str], value: str, timeout: float | None = None):
    from .harness import DEFAULT_TIMEOUT_S, Expect, invoke

    out = invoke([a.replace("{v}", value) for a in argv], timeout=timeout or DEFAULT_TIMEOUT_S)
    # the error names the option, quotes the value, or names an input file the value made fail
    files = [a for a in argv if a.startswith(str(ROOT))]
    return out, Expect(names=[name, repr(value), *files, *([value] if len(value.strip()) >= 4 else [])])
