"""Lint prompt templates and request bodies for patterns that break prefix and prompt caches.

Static rules read the template source (Jinja AST) or the request body; the dynamic rule renders a
template twice in a sandbox, with the volatile values changed and everything else fixed, and diffs the
two renders in token space (the diff-tokens engine): the tokens before the first difference are the
stable prefix, and stable tokens after a volatile value can never be served from a cache. Templates run
only in jinja2's immutable sandbox; reaching for Python internals is refused.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ..errors import InputError, UsageError

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    severity: str          # error | warning
    summary: str
    fix: str


RULES: dict[str, Rule] = {r.id: r for r in (
    Rule("CC001", "volatile-before-stable-content", "error",
         "A value that changes per request sits before stable content, which can then never be cached.",
         "Move per-request values (dates, ids, names) after the stable content: the end of the prompt."),
    Rule("CC002", "volatile-before-breakpoint", "error",
         "Content that changes per request sits at or before a cache_control breakpoint, so the breakpoint is "
         "never read.",
         "Put cache_control on the last stable block, after which the per-request content starts."),
    Rule("CC003", "template-injects-time", "error",
         "The template writes the current date or time itself (strftime_now, now(), a date_string default).",
         "Pass the date explicitly and pin it per day, or leave it out of the cached prefix."),
    Rule("CC004", "too-many-breakpoints", "error",
         "More than 4 cache_control breakpoints: the API rejects the request.",
         "Keep at most 4 breakpoints (top-level automatic caching uses one)."),
    Rule("CC005", "breakpoint-below-minimum", "warning",
         "A breakpoint closes a prefix shorter than the model's minimum cacheable length: nothing is cached, "
         "silently.",
         "Move the breakpoint later, or drop it."),
    Rule("CC006", "tools-unsorted-json", "warning",
         "Tools are serialized with tojson without sort_keys: their key order follows the caller's dicts, and a "
         "reordered schema misses the cache.",
         "Use tojson(sort_keys=true) for tools, or serialize them deterministically before rendering."),
    Rule("CC007", "template-rewrites-history", "error",
         "The chat template renders earlier turns differently once a new turn is added, so each request's prefix "
         "differs from the previous request's.",
         "Keep history rendering append-only (do not strip reasoning or rewrite earlier messages)."),
    Rule("CC008", "breakpoint-on-volatile-block", "error",
         "cache_control is on a block whose own content changes per request: the entry is written and never read.",
         "Put cache_control on a stable block before it."),
)}

VOLATILE_NAME = re.compile(
    r"(^|_)(now|today|date|datetime|time|timestamp|ts|clock|uuid|guid|nonce|random|rand|request_?id|req_?id|"
    r"trace_?id|span_?id|session_?id|session|user_?id|user_?name|username|customer|email|ip)(_|$)", re.I)
VOLATILE_CALLS = {"now", "strftime_now", "utcnow", "today", "uuid4", "uuid", "random", "time"}
_PLACEHOLDER = re.compile(r"\{\{\s*([A-Za-z_][\w.]*)\s*\}\}|\{([A-Za-z_]\w*)\}|\$\{([A-Za-z_]\w*)\}")


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str
    path: str
    line: int
    column: int
    message: str
    fix: str = ""


@dataclass(frozen=True, kw_only=True)
class LintReport:
    schema_version: int = SCHEMA_VERSION
    files: int
    findings: tuple[Finding, ...]
    rules: tuple[Rule, ...] = field(default_factory=lambda: tuple(RULES.values()))


# --------------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class LintConfig:
    select: frozenset[str] = frozenset(RULES)
    per_file_ignores: tuple[tuple[str, frozenset[str]], ...] = ()
    model: str | None = None
    tail_tokens: int = 64          # stable tokens after a volatile value that make it a finding
    source: str | None = None      # the pyproject.toml read, for errors about its values

    def enabled(self, rule: str, path: str) -> bool:
        if rule not in self.select:
            return False
        return not any(rule in ids and (fnmatch.fnmatch(path, pat) or fnmatch.fnmatch(Path(path).name, pat))
                       for pat, ids in self.per_file_ignores)


def _rule_ids(values: Iterable[str], where: str) -> frozenset[str]:
    out = set()
    for v in values:
        v = str(v).strip().upper()
        if not v:
            continue
        if v not in RULES:
            raise UsageError(f"{where}: unknown rule id {v!r} (known: {', '.join(RULES)})")
        out.add(v)
    return frozenset(out)


def load_config(pyproject: str | None, *, select: Sequence[str] = (), ignore: Sequence[str] = (),
                model: str | None = None) -> LintConfig:
    """``[tool.cachectl.lint]`` from a pyproject.toml (if given or found), then the command-line options."""
    table: dict = {}
    source = pyproject
    if pyproject is None and Path("pyproject.toml").is_file():
        source = "pyproject.toml"
    if source is not None:
        import tomllib

        try:
            with open(source, "rb") as fh:
                data = tomllib.loads(fh.read().decode("utf-8"))
        except FileNotFoundError:
            raise InputError("no such file", source=source) from None
        except OSError as exc:
            raise InputError(f"cannot read: {exc.strerror or exc}", source=source) from None
        except UnicodeDecodeError as exc:
            raise InputError(f"not valid UTF-8 (offset {exc.start})", source=source) from None
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"invalid TOML: {exc}", source=source) from None
        except RecursionError:
            raise InputError("invalid TOML: nested too deeply", source=source) from None
        table = data
        path = []
        for key in ("tool", "cachectl", "lint"):
            path.append(key)
            table = table.get(key, {})
            if not isinstance(table, dict):
                raise InputError(f"expected a table, got {table!r:.60}", source=source, field=".".join(path))
    where = f"{source} [tool.cachectl.lint]" if source else "options"

    def ids(key: str) -> list:
        value = table.get(key, [])
        if isinstance(value, str):
            value = value.split(",")
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InputError(f"expected a list of rule ids, got {value!r:.60}", source=source,
                             field=f"tool.cachectl.lint.{key}")
        return value

    chosen = _rule_ids(ids("select"), where) or frozenset(RULES)
    chosen -= _rule_ids(ids("ignore"), where)
    if select:
        chosen = _rule_ids(select, "--select")
    chosen -= _rule_ids(ignore, "--ignore")
    per_file_table = table.get("per-file-ignores", {})
    if not isinstance(per_file_table, dict):
        raise InputError("expected a table of glob = [rule ids]", source=source,
                         field="tool.cachectl.lint.per-file-ignores")
    per_file = []
    for pat, rule_list in per_file_table.items():
        if isinstance(rule_list, str):
            rule_list = rule_list.split(",")
        if not isinstance(rule_list, list) or not all(isinstance(v, str) for v in rule_list):
            raise InputError(f"expected a list of rule ids, got {rule_list!r:.60}", source=source,
                             field=f"tool.cachectl.lint.per-file-ignores.{pat}")
        per_file.append((pat, _rule_ids(rule_list, f"{where} per-file-ignores")))
    tail = table.get("tail-tokens", 64)
    if isinstance(tail, bool) or not isinstance(tail, int) or not 1 <= tail <= 1_000_000:
        raise InputError(f"expected a positive integer up to 1,000,000, got {tail!r:.60}", source=source,
                         field="tool.cachectl.lint.tail-tokens")
    cfg_model = table.get("model")
    if cfg_model is not None and not isinstance(cfg_model, str):
        raise InputError(f"expected a model name, got {cfg_model!r:.60}", source=source, field="tool.cachectl.lint.model")
    return LintConfig(select=chosen, per_file_ignores=tuple(per_file), model=model or cfg_model, tail_tokens=tail,
                      source=source)


# ------------------------------------------------------------------------------------------- sandbox


def sandbox():
    """jinja2's immutable sandbox, made strict: touching an unsafe attribute raises instead of rendering ''."""
    from jinja2.exceptions import SecurityError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class StrictSandbox(ImmutableSandboxedEnvironment):
        def unsafe_undefined(self, obj: Any, attribute: str) -> Any:
            raise SecurityError(f"access to {attribute!r} of a {type(obj).__name__} is refused by the sandbox")

    env = StrictSandbox(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)

    def tojson(value: Any, indent: int | None = None, sort_keys: bool = False, ensure_ascii: bool = False) -> str:
        return json.dumps(value, indent=indent, sort_keys=sort_keys, ensure_ascii=ensure_ascii)

    env.filters["tojson"] = tojson
    return env


def _template_line(exc: BaseException, name: str) -> int | None:
    lineno = getattr(exc, "lineno", None)
    if lineno:
        return int(lineno)
    tb = exc.__traceback__
    found = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename in (name, "<template>"):
            found = tb.tb_lineno
        tb = tb.tb_next
    return found


def _render(template, values: dict, path: str) -> str:
    from jinja2.exceptions import SecurityError

    try:
        return template.render(**values)
    except SecurityError as exc:
        raise InputError(f"refused: {exc}", source=path, line=_template_line(exc, path)) from None
    except Exception as exc:  # a template that raises while rendering
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"template raised while rendering: {msg}", source=path,
                         line=_template_line(exc, path)) from None


# --------------------------------------------------------------------------------------------- tokens

_FALLBACK = re.compile(r"\w+|[^\w\s]|\s+")


def _tokenizer_fn(tokenizer: Any) -> Callable[[str], list]:
    if tokenizer is None:
        return lambda text: _FALLBACK.findall(text)
    return lambda text: tokenizer.backend.encode(text, add_special_tokens=False).ids


def _common_suffix(a: Sequence, b: Sequence, limit: int) -> int:
    from .tokendiff import common_prefix_length

    n = min(len(a), len(b)) - limit
    if n <= 0:
        return 0
    return common_prefix_length(list(reversed(a[len(a) - n:])), list(reversed(b[len(b) - n:])))


# ------------------------------------------------------------------------------------------ templates


def _col(source_lines: list[str], line: int, needle: str) -> int:
    if 1 <= line <= len(source_lines):
        i = source_lines[line - 1].find(needle)
        return i + 1 if i >= 0 else 1
    return 1


def _ignored_lines(source: str) -> dict[int, frozenset[str]]:
    out: dict[int, frozenset[str]] = {}
    for i, text in enumerate(source.splitlines(), start=1):
        for m in re.finditer(r"cachectl:\s*ignore\[([A-Za-z0-9,\s]+)\]", text):
            ids = frozenset(x.strip().upper() for x in m.group(1).split(",") if x.strip())
            for ln in (i, i + 1):  # the comment's own line and the next one
                out[ln] = out.get(ln, frozenset()) | ids
    return out


def _sample_values(names: Iterable[str], which: int, sidecar: dict) -> dict:
    samples = sidecar.get("samples")
    values: dict = {}
    for name in names:
        if isinstance(samples, list) and len(samples) >= 2 and name in samples[which]:
            values[name] = samples[which][name]
            continue
        lname = name.lower()
        if re.search(r"date|today|day", lname):
            values[name] = ("28 Nov 2026", "29 Nov 2026")[which]
        elif re.search(r"time|now|timestamp|ts|clock", lname):
            values[name] = ("2026-11-28T09:15:00Z", "2026-11-29T10:02:41Z")[which]
        elif re.search(r"id|uuid|guid|nonce|session|trace|span", lname):
            values[name] = ("req_01HZX8K2Q9", "req_07QWP3M5T2")[which]
        else:
            values[name] = ("Alice Example", "Bob Sample")[which]
    return values


def _volatile_names(names: Iterable[str], sidecar: dict) -> set[str]:
    declared = set(sidecar.get("volatile", []) or [])
    stable = set(sidecar.get("stable", []) or [])
    return {n for n in names if (VOLATILE_NAME.search(n) or n in declared) and n not in stable}


def _load_sidecar(path: Path) -> dict:
    for suffix in (".samples.json", ".cachectl.json"):
        side = path.with_name(path.name + suffix)
        if side.is_file():
            from ..inputs import parse_json_document, read_text

            data = parse_json_document(*read_text(str(side)))
            if not isinstance(data, dict):
                raise InputError("expected an object with samples/volatile/stable", source=str(side))
            return data
    return {}


def _is_chat_template(source: str) -> bool:
    return "messages" in source and ("message['role']" in source or "message.role" in source
                                     or "message[\"role\"]" in source or "m.role" in source or "add_generation_prompt" in source)


def lint_template(path: str, source: str, config: LintConfig, tokenizer: Any = None) -> list[Finding]:
    """Static and dynamic checks of one Jinja template (a prompt template or a chat template)."""
    from jinja2 import meta, nodes
    from jinja2.exceptions import TemplateSyntaxError

    env = sandbox()
    try:
        ast = env.parse(source, name=path)
    except TemplateSyntaxError as exc:
        raise InputError(f"invalid Jinja: {exc.message}", source=path, line=exc.lineno) from None
    lines = source.splitlines()
    findings: list[Finding] = []

    def add(rule: str, line: int, column: int, message: str) -> None:
        r = RULES[rule]
        findings.append(Finding(rule, r.severity, path, line, column, message, r.fix))

    chat = _is_chat_template(source)
    # CC003: the template reads the clock itself
    for call in ast.find_all(nodes.Call):
        fn = call.node
        name = fn.name if isinstance(fn, nodes.Name) else fn.attr if isinstance(fn, nodes.Getattr) else None
        if name in VOLATILE_CALLS:
            add("CC003", call.lineno, _col(lines, call.lineno, name),
                f"the template calls {name}() while rendering: every request (every day, at least) renders another "
                "prefix")
    if chat:
        for node in ast.find_all(nodes.Name):
            if node.name == "date_string" and node.ctx == "load":
                add("CC003", node.lineno, _col(lines, node.lineno, "date_string"),
                    "the chat template renders date_string (Llama 3.1 style): pin it, or every day misses")
                break
    # CC006: tools through tojson without sort_keys
    for filt in ast.find_all(nodes.Filter):
        if filt.name == "tojson" and not any(kw.key == "sort_keys" for kw in filt.kwargs):
            names = {n.name for n in filt.find_all(nodes.Name)} | {g.attr for g in filt.find_all(nodes.Getattr)}
            if any("tool" in n.lower() or n in ("function", "parameters") for n in names):
                add("CC006", filt.lineno, _col(lines, filt.lineno, "tojson"),
                    "tools are rendered with tojson without sort_keys: the caller's key order reaches the tokens")
    undeclared = meta.find_undeclared_variables(ast)
    template = env.from_string(source)
    if chat:
        _chat_dynamic(path, template, source, add, tokenizer)
    else:
        sidecar = _load_sidecar(Path(path))
        volatile = _volatile_names(undeclared, sidecar) | (undeclared & VOLATILE_CALLS)
        if volatile:
            _prompt_dynamic(path, template, ast, lines, undeclared, volatile, sidecar, config, tokenizer, add)
        else:  # nothing volatile: one render still proves the template renders, inside the sandbox
            _render(template, {**_sample_values(undeclared, 0, sidecar), **_callables(0)}, path)
    return _filter(findings, source, config)


def _callables(which: int) -> dict:
    stamp = ("2026-11-28T09:15:00Z", "2026-11-29T10:02:41Z")[which]
    return {"now": lambda *a, **k: stamp, "utcnow": lambda *a, **k: stamp, "today": lambda *a, **k: stamp[:10],
            "strftime_now": lambda fmt="%Y-%m-%d": stamp[:10], "uuid4": lambda: ("a1b2", "c3d4")[which],
            "uuid": lambda: ("a1b2", "c3d4")[which], "random": lambda: (0.25, 0.75)[which],
            "time": lambda: (1764321300, 1764410561)[which]}


def _prompt_dynamic(path, template, ast, lines, undeclared, volatile, sidecar, config, tokenizer, add) -> None:
    """Render with volatile values A, then B (the rest fixed), and find stable tokens stranded after them."""
    from jinja2 import nodes

    from .tokendiff import common_prefix_length

    tok = _tokenizer_fn(tokenizer)
    fixed = _sample_values(undeclared - volatile, 0, sidecar)
    base = {**fixed, **_sample_values(volatile, 0, sidecar), **_callables(0)}
    text_a = _render(template, base, path)
    ids_a = tok(text_a)
    body_findings: list[Finding] = []
    unit = "tokens" if tokenizer is not None else "tokens (approximate: no --tokenizer)"
    for name in sorted(volatile):
        changed = dict(base)
        if name in VOLATILE_CALLS:
            changed.update({k: v for k, v in _callables(1).items() if k == name})
        else:
            changed[name] = _sample_values([name], 1, sidecar)[name]
        text_b = _render(template, changed, path)
        if text_b == text_a:
            continue
        body_a, body_b = _as_body(text_a), _as_body(text_b)
        if body_a is not None and body_b is not None:  # the template renders a request body
            blocks_b = {p: c for p, c, _ in _body_blocks(body_b)}
            changed_blocks = {p: name for p, c, _ in _body_blocks(body_a) if blocks_b.get(p) != c}
            line = next((n.lineno for n in ast.find_all(nodes.Name) if n.name == name), 1)
            body_findings.extend(lint_body(path, text_a, body_a, config, None, lambda t: 0, volatile=changed_blocks,
                                           at=(line, _col(lines, line, name))))
            continue
        ids_b = tok(text_b)
        first = common_prefix_length(ids_a, ids_b)
        tail = _common_suffix(ids_a, ids_b, first)
        if tail >= config.tail_tokens:
            line = next((n.lineno for n in ast.find_all(nodes.Name) if n.name == name), 1)
            add("CC001", line, _col(lines, line, name),
                f"'{name}' changes per request and is followed by {tail} stable {unit} (of {len(ids_a)}); "
                f"a cache can serve only the first {first}")
    for f in body_findings:
        if f.rule in ("CC002", "CC008"):
            add(f.rule, f.line, f.column, f.message)


def _as_body(text: str) -> dict | None:
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) and "messages" in doc else None


_SAMPLE_CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris today?"},
    {"role": "assistant", "content": "<think>\nThe user asks about Paris.\n</think>\nIt is sunny in Paris."},
    {"role": "user", "content": "And in Berlin?"},
    {"role": "assistant", "content": "It is raining in Berlin."},
    {"role": "user", "content": "Thanks."},
]


def _chat_dynamic(path, template, source, add, tokenizer=None) -> None:
    """Multi-turn stability: the render of turns[:k] must be a prefix of the render of turns[:k+1].

    With a tokenizer this is diff-tokens' stability check in token space (through transformers'
    apply_chat_template); without one, the same check on the rendered text.
    """
    from .tokendiff import common_prefix_length

    line = source[:source.find("</think>")].count("\n") + 1 if "</think>" in source else 1
    if tokenizer is not None:
        from ..inputs import prompt_from_value
        from .tokendiff import check_stability

        saved = tokenizer.hf.chat_template
        tokenizer.hf.chat_template = source
        try:
            report = check_stability(prompt_from_value(_SAMPLE_CHAT, source=path, line=None), tokenizer)
        finally:
            tokenizer.hf.chat_template = saved
        if not report.stable:
            bad = next(st for st in report.steps if not st.stable)
            add("CC007", line, 1, f"adding message {bad.k} ({bad.role_added}) changes earlier tokens at index "
                f"{bad.diff.first_diff_index}" + (f" ({bad.diff.cause.id})" if bad.diff.cause else ""))
        return

    base = {"bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": False, **_callables(0)}

    def render(msgs: list[dict]) -> str:
        gen = msgs[-1]["role"] != "assistant"
        return _render(template, {**base, "messages": msgs, "add_generation_prompt": gen}, path)

    prev = render(_SAMPLE_CHAT[:2])
    for k in range(2, len(_SAMPLE_CHAT)):
        nxt = render(_SAMPLE_CHAT[:k + 1])
        common = common_prefix_length(prev, nxt)
        if common < len(prev):
            add("CC007", line, 1,
                f"adding message {k} ({_SAMPLE_CHAT[k]['role']}) changes earlier text at character {common}: "
                f"{prev[common:common + 30]!r} became {nxt[common:common + 30]!r}")
            break
        prev = nxt


def _filter(findings: list[Finding], source: str, config: LintConfig) -> list[Finding]:
    ignored = _ignored_lines(source) if source else {}
    out = []
    seen = set()
    for f in findings:
        if not config.enabled(f.rule, f.path) or f.rule in ignored.get(f.line, frozenset()):
            continue
        key = (f.rule, f.line, f.column)
        if key in seen:
            continue
        seen.add(key)
        out.append(f)
    return out


# ------------------------------------------------------------------------------------- request bodies


def _json_positions(text: str) -> Callable[[str], tuple[int, int]]:
    """Best-effort line/column of a key's first occurrence after a given offset (JSON has no AST positions)."""
    def locate(needle: str, start: int = 0) -> tuple[int, int, int]:
        i = text.find(needle, start)
        if i < 0:
            return 1, 1, start
        line = text.count("\n", 0, i) + 1
        col = i - (text.rfind("\n", 0, i) + 1) + 1
        return line, col, i
    return locate


def _has_placeholder(value: Any) -> str | None:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
    m = _PLACEHOLDER.search(text)
    if m:
        return m.group(1) or m.group(2) or m.group(3)
    for v in re.findall(r"\b(?:19|20)\d\d-\d\d-\d\d(?:T\d\d:\d\d)?", text):
        return v
    return None


def _body_blocks(body: dict) -> list[tuple[str, Any, Any]]:
    """``(path, content, cache_control)`` for each lookback position: tools, then system, then messages."""
    blocks: list[tuple[str, Any, Any]] = []
    for i, tool in enumerate(body.get("tools") or []):
        if isinstance(tool, dict):
            blocks.append((f"tools[{i}]", {k: v for k, v in tool.items() if k != "cache_control"},
                           tool.get("cache_control")))
    system = body.get("system")
    if isinstance(system, str):
        blocks.append(("system", system, None))
    elif isinstance(system, list):
        for i, b in enumerate(system):
            if isinstance(b, dict):
                blocks.append((f"system[{i}]", b.get("text", b), b.get("cache_control")))
    for i, m in enumerate(body.get("messages") or []):
        if not isinstance(m, dict):
            continue
        content = m.get("content")
        if isinstance(content, list):
            for j, b in enumerate(content):
                if isinstance(b, dict):
                    blocks.append((f"messages[{i}].content[{j}]", b.get("text", b), b.get("cache_control")))
        else:
            blocks.append((f"messages[{i}]", content, m.get("cache_control")))
    return blocks


def lint_body(path: str, text: str, body: dict, config: LintConfig, min_tokens: int | None,
              count: Callable[[str], int], volatile: dict[str, str] | None = None,
              at: tuple[int, int] | None = None) -> list[Finding]:
    """Breakpoints in an Anthropic/OpenAI request body: limit, minimum length, volatile content before them.

    ``volatile`` maps block paths to what changes in them (from a templated body rendered twice); without
    it, placeholders and literal dates in a block mark it volatile. ``at`` pins every finding to one
    position (the template line that rendered the body).
    """
    locate = _json_positions(text)
    findings: list[Finding] = []

    def add(rule: str, pos: tuple, message: str) -> None:
        r = RULES[rule]
        findings.append(Finding(rule, r.severity, path, pos[0], pos[1], message, r.fix))

    blocks = _body_blocks(body)
    breakpoints = [(k, p) for k, (p, _, cc) in enumerate(blocks) if cc is not None]
    if body.get("cache_control") is not None:
        breakpoints.append((len(blocks) - 1, "cache_control"))
    cursor = 0
    positions = {}
    for p, _, cc in blocks:
        if cc is not None:
            pos = locate('"cache_control"', cursor)
            positions[p] = pos
            cursor = pos[2] + 1
    if len(breakpoints) > 4:
        add("CC004", at or positions.get(breakpoints[4][1], (1, 1)), f"{len(breakpoints)} cache_control breakpoints; at "
            "most 4 are allowed")
    first_volatile = None
    for k, (p, content, _) in enumerate(blocks):
        v = volatile.get(p) if volatile is not None else _has_placeholder(content)
        if v is not None:
            first_volatile = (k, p, v)
            break
    if at is not None:
        positions = {p: at for p in positions}
    tokens_so_far = 0
    for k, (p, content, cc) in enumerate(blocks):
        tokens_so_far += count(content if isinstance(content, str) else json.dumps(content, ensure_ascii=False))
        if cc is None:
            continue
        pos = positions.get(p, (1, 1))
        if first_volatile is not None and first_volatile[0] == k:
            add("CC008", pos, f"{p} carries cache_control and its content changes per request "
                f"({first_volatile[2]!r}): the entry is written on every request and never read")
        elif first_volatile is not None and first_volatile[0] < k:
            add("CC002", pos, f"the breakpoint on {p} comes after {first_volatile[1]}, which changes per request "
                f"({first_volatile[2]!r}): this breakpoint can never be read")
        if min_tokens is not None and tokens_so_far < min_tokens:
            add("CC005", pos, f"the prefix up to {p} is about {tokens_so_far} tokens, below the model's minimum of "
                f"{min_tokens}: nothing is cached")
    return _filter(findings, "", config)


# ---------------------------------------------------------------------------------------------- files

TEMPLATE_SUFFIXES = (".j2", ".jinja", ".jinja2", ".prompt", ".tmpl")


def discover(paths: Sequence[str]) -> list[Path]:
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            for f in sorted(p.rglob("*")):
                if f.is_file() and (f.name.endswith(TEMPLATE_SUFFIXES) or f.name == "tokenizer_config.json"
                                    or (f.suffix in (".json", ".yaml", ".yml")
                                        and not f.name.endswith((".samples.json", ".cachectl.json")))):
                    out.append(f)
        elif p.is_file():
            out.append(p)
        else:
            raise InputError("no such file or directory", source=raw)
    return out


def lint_paths(paths: Sequence[str], config: LintConfig, tokenizer: Any = None,
               min_tokens: int | None = None) -> LintReport:
    count = (lambda text: len(tokenizer.backend.encode(text, add_special_tokens=False).ids)) if tokenizer \
        else (lambda text: max(1, len(text) // 4))
    findings: list[Finding] = []
    files = discover(paths)
    from ..inputs import decode_text, parse_json_document, read_bytes

    for f in files:
        data, source = read_bytes(str(f))
        text = decode_text(data, source)
        if f.name.endswith(TEMPLATE_SUFFIXES):
            findings += lint_template(source, text, config, tokenizer)
            continue
        if f.suffix in (".yaml", ".yml"):
            import yaml

            try:
                doc = yaml.safe_load(text)
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                raise InputError(f"invalid YAML: {getattr(exc, 'problem', exc)}"
                                 + (f" (column {mark.column + 1})" if mark else ""), source=source,
                                 line=mark.line + 1 if mark else None) from None
        else:
            doc = parse_json_document(text, source)
        if isinstance(doc, dict) and isinstance(doc.get("chat_template"), (str, list)):
            tmpl = doc["chat_template"]
            if isinstance(tmpl, list):
                tmpl = next((t.get("template") for t in tmpl if isinstance(t, dict) and t.get("name") == "default"),
                            None) or ""
            base_line = text[:text.find('"chat_template"')].count("\n") + 1
            for x in lint_template(source, tmpl, config, tokenizer):
                findings.append(Finding(x.rule, x.severity, x.path, base_line, x.column,
                                        f"{x.message} (chat_template line {x.line})", x.fix))
        elif isinstance(doc, dict) and "messages" in doc:
            findings += lint_body(source, text, doc, config, min_tokens, count)
        # other JSON/YAML files in a directory are not prompts: skipped
    return LintReport(files=len(files), findings=tuple(findings))
