"""Template rules: lint a Jinja prompt or chat template for patterns that break prefix and prompt caches.

Static rules read the template source (Jinja AST) or the request body; the dynamic rule renders a
template twice in a sandbox, with the volatile values changed and everything else fixed, and diffs the
two renders in token space (the diff-tokens engine): the tokens before the first difference are the
stable prefix, and stable tokens after a volatile value can never be served from a cache. Templates run
only in jinja2's immutable sandbox; reaching for Python internals is refused.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from ...errors import InputError
from .body import lint_body
from .rules import RULES, VOLATILE_CALLS, VOLATILE_NAME, Finding, LintConfig, filter_findings, template_lines

if TYPE_CHECKING:
    from ...inputs import Request


# ------------------------------------------------------------------------------------------- sandbox


def sandbox():
    """The environment templates are parsed and rendered in: transformers' own chat-template environment
    (its sandbox, loopcontrols, ``{% generation %}``, ``tojson``, ``raise_exception``, ``strftime_now``),
    in an overlay that refuses sandbox escapes instead of rendering them as undefined."""
    from ...tokenization import template_environment

    return template_environment()


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


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _render(template, values: dict, path: str, render: Callable[..., str] | None = None) -> str:
    """Render, turning whatever the template raises into one located InputError."""
    from jinja2.exceptions import SecurityError

    try:
        return render(template, **values) if render is not None else template.render(**values)
    except SecurityError as exc:
        raise InputError(f"refused: {exc}", source=path, line=_template_line(exc, path)) from None
    except Exception as exc:  # a template that raises while rendering
        raise InputError(f"template raised while rendering: {_first_line(exc)}", source=path,
                         line=_template_line(exc, path)) from None


# --------------------------------------------------------------------------------------------- tokens

_FALLBACK = re.compile(r"\w+|[^\w\s]|\s+")


def _tokenizer_fn(tokenizer: Any) -> Callable[[str], list]:
    if tokenizer is None:
        return lambda text: _FALLBACK.findall(text)
    return lambda text: tokenizer.backend.encode(text, add_special_tokens=False).ids


def _common_suffix(a: Sequence, b: Sequence, limit: int) -> int:
    from ..tokendiff import common_prefix_length

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
            from ...inputs import parse_json_document, read_text

            data = parse_json_document(*read_text(str(side)))
            if not isinstance(data, dict):
                raise InputError("expected an object with samples/volatile/stable", source=str(side))
            _check_sidecar(data, str(side))
            return data
    return {}


def _check_sidecar(data: dict, source: str) -> None:
    """A sidecar's fields: ``samples`` two objects of a variable's values (the two renders lint compares),
    ``volatile`` and ``stable`` lists of variable names."""
    samples = data.get("samples")
    if samples is not None and not (isinstance(samples, list) and len(samples) == 2
                                    and all(isinstance(x, dict) for x in samples)):
        raise InputError("expected two objects of the variables' values (the two renders lint compares)",
                         source=source, field="samples")
    for key in ("volatile", "stable"):
        names = data.get(key)
        if names is not None and not (isinstance(names, list) and all(isinstance(n, str) for n in names)):
            raise InputError("expected a list of variable names", source=source, field=key)


def _is_chat_template(source: str) -> bool:
    return "messages" in source and ("message['role']" in source or "message.role" in source
                                     or "message[\"role\"]" in source or "m.role" in source or "add_generation_prompt" in source)


def parse_template(env: Any, source: str, path: str, *, compiled: bool = False) -> Any:
    """The template's AST (and, with ``compiled``, the compiled template as well: ``(ast, template)``); invalid
    Jinja or nesting too deep to parse is one located InputError."""
    from jinja2.exceptions import TemplateSyntaxError

    try:
        ast = env.parse(source, name=path)
        return (ast, env.from_string(source)) if compiled else ast
    except TemplateSyntaxError as exc:
        raise InputError(f"invalid Jinja: {exc.message}", source=path, line=exc.lineno) from None
    except RecursionError:
        raise InputError("Jinja template nested too deeply to parse", source=path) from None


def lint_template(path: str, source: str, config: LintConfig, tokenizer: Any = None) -> list[Finding]:
    """Static and dynamic checks of one Jinja template (a prompt template or a chat template).

    Raises InputError (located) when the template cannot be checked: invalid Jinja, a sandbox escape, or a
    chat template that rejects every form of the sample conversation lint tries.
    """
    from jinja2 import meta

    env = sandbox()
    ast, template = parse_template(env, source, path, compiled=True)
    lines = template_lines(source)
    findings: list[Finding] = []

    def add(rule: str, line: int, column: int, message: str) -> None:
        r = RULES[rule]
        findings.append(Finding(rule, r.severity, path, line, column, message, r.fix, r.fix_safety))

    chat = _is_chat_template(source)
    undeclared = meta.find_undeclared_variables(ast)
    clock_reads: list[str] = []
    if chat:
        _chat_dynamic(path, template, source, add, tokenizer, clock_reads)
    _clock_findings(ast, lines, chat, undeclared, clock_reads, add)
    _tool_schema_findings(ast, lines, add)
    if not chat:
        sidecar = _load_sidecar(Path(path))
        volatile = _volatile_names(undeclared, sidecar) | (undeclared & VOLATILE_CALLS)
        if volatile:
            _prompt_dynamic(path, template, ast, lines, undeclared, volatile, sidecar, config, tokenizer, add)
        else:  # nothing volatile: one render still proves the template renders, inside the sandbox
            _render(template, {**_sample_values(undeclared, 0, sidecar), **_callables(0)}, path)
    return filter_findings(findings, source, config)


# CC003 ------------------------------------------------------------------------------------------------

#: functions that read the clock: transformers' strftime_now, and the names templates use for it elsewhere
CLOCK_CALLS = frozenset({"strftime_now", "now", "utcnow", "today", "time", "localtime", "gmtime"})
_DATE_NAME = re.compile(r"(^|_)(date|today|now|datetime|time|timestamp|day)(_|$)|^date", re.I)


def _is_constant(expr) -> bool:
    from jinja2 import nodes

    dynamic = (nodes.Name, nodes.Call)
    return not isinstance(expr, dynamic) and next(expr.find_all(dynamic), None) is None


def _constant_default(ast, name: str) -> bool:
    """The template gives ``name`` a constant value itself (``{% set date_string = "26 Jul 2024" %}`` when it is
    undefined, or ``date_string | default("...")``)."""
    from jinja2 import nodes

    for a in ast.find_all(nodes.Assign):
        if isinstance(a.target, nodes.Name) and a.target.name == name and _is_constant(a.node):
            return True
    for f in ast.find_all(nodes.Filter):
        if (f.name in ("default", "d") and isinstance(f.node, nodes.Name) and f.node.name == name and f.args
                and _is_constant(f.args[0])):
            return True
    return False


def _clock_findings(ast, lines: list[str], chat: bool, undeclared: set, clock_reads: list, add) -> None:
    from jinja2 import nodes

    for call in ast.find_all(nodes.Call):
        fn = call.node
        name = fn.name if isinstance(fn, nodes.Name) else fn.attr if isinstance(fn, nodes.Getattr) else None
        if name in CLOCK_CALLS:
            seen = (" (read while rendering lint's sample conversation)" if name == "strftime_now" and clock_reads
                    else "")
            add("CC003", call.lineno, _col(lines, call.lineno, name),
                f"the template reads the clock with {name}(){seen}: every request (every day, at least) renders "
                "another prefix")
    if not chat:
        return  # prompt templates: a date variable is a volatile value, and CC001 renders it
    for node in ast.find_all(nodes.Name):
        n = node.name
        if node.ctx == "load" and n in undeclared and _DATE_NAME.search(n) and not _constant_default(ast, n):
            add("CC003", node.lineno, _col(lines, node.lineno, n),
                f"the chat template renders '{n}' and has no constant default for it: a caller that passes today's "
                "date changes the prefix every day")
            undeclared = undeclared - {n}  # one finding per variable


# CC006 ------------------------------------------------------------------------------------------------

_TOOLS_NAME = re.compile(r"(custom_|available_|builtin_)?(tools|functions)", re.I)


def _tool_schema_findings(ast, lines: list[str], add) -> None:
    """``tojson`` without ``sort_keys`` applied to tool *schemas*: the ``tools`` variable, what a loop over it
    binds, and names set from those. A tool call's arguments are the model's own output, not a schema."""
    from jinja2 import nodes

    def derived(expr, scope: dict) -> bool:
        if isinstance(expr, nodes.Name):
            return scope.get(expr.name, bool(_TOOLS_NAME.fullmatch(expr.name)))
        if isinstance(expr, (nodes.Getattr, nodes.Getitem)):
            return derived(expr.node, scope)
        if isinstance(expr, nodes.Filter):
            return expr.node is not None and derived(expr.node, scope)
        if isinstance(expr, nodes.CondExpr):
            return derived(expr.expr1, scope) or (expr.expr2 is not None and derived(expr.expr2, scope))
        if isinstance(expr, nodes.Call) and isinstance(expr.node, nodes.Getattr):  # tool.items(), tools.values()
            return derived(expr.node.node, scope)
        if isinstance(expr, (nodes.List, nodes.Tuple)):
            return any(derived(x, scope) for x in expr.items)
        if isinstance(expr, nodes.Concat):
            return any(derived(x, scope) for x in expr.nodes)
        return False

    def bind(target, value: bool, scope: dict) -> None:
        if isinstance(target, nodes.Name):
            scope[target.name] = value
        elif isinstance(target, nodes.Tuple):
            for t in target.items:
                bind(t, value, scope)

    def visit(node, scope: dict) -> None:
        if isinstance(node, nodes.For):
            visit(node.iter, scope)
            inner = dict(scope)
            bind(node.target, derived(node.iter, scope), inner)
            for child in node.body + node.else_:
                visit(child, inner)
            if node.test is not None:
                visit(node.test, inner)
            return
        if isinstance(node, nodes.Assign):
            visit(node.node, scope)
            # once tool schemas, always (a `set tools = none` default does not make later loops safe)
            if derived(node.node, scope):
                bind(node.target, True, scope)
            return
        if isinstance(node, nodes.Macro):
            inner = dict(scope)
            for i, arg in enumerate(node.args):  # a parameter named like tools, or passed tools somewhere
                bind(arg, bool(_TOOLS_NAME.fullmatch(arg.name)) or (node.name, i) in passed, inner)
            for child in node.body:
                visit(child, inner)
            return
        if (isinstance(node, nodes.Filter) and node.name == "tojson" and node.node is not None
                and derived(node.node, scope)):
            sort = next((kw.value for kw in node.kwargs if kw.key == "sort_keys"), None)
            if not (isinstance(sort, nodes.Const) and sort.value):
                add("CC006", node.lineno, _col(lines, node.lineno, "tojson"),
                    "tool schemas are rendered with tojson without sort_keys: the caller's key order reaches the "
                    "tokens")
        for child in node.iter_child_nodes():
            visit(child, scope)

    # macro parameters that some call passes tool schemas to
    passed = {(call.node.name, i) for call in ast.find_all(nodes.Call) if isinstance(call.node, nodes.Name)
              for i, arg in enumerate(call.args) if derived(arg, {})}
    visit(ast, {})


def _callables(which: int) -> dict:
    stamp = ("2026-11-28T09:15:00Z", "2026-11-29T10:02:41Z")[which]
    return {"now": lambda *a, **k: stamp, "utcnow": lambda *a, **k: stamp, "today": lambda *a, **k: stamp[:10],
            "strftime_now": lambda fmt="%Y-%m-%d": stamp[:10], "uuid4": lambda: ("a1b2", "c3d4")[which],
            "uuid": lambda: ("a1b2", "c3d4")[which], "random": lambda: (0.25, 0.75)[which],
            "time": lambda: (1764321300, 1764410561)[which]}


def _prompt_dynamic(path, template, ast, lines, undeclared, volatile, sidecar, config, tokenizer, add) -> None:
    """Render with volatile values A, then B (the rest fixed), and find stable tokens stranded after them."""
    from jinja2 import nodes

    from ..tokendiff import common_prefix_length

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
        req_a, req_b = _as_body(text_a, path), _as_body(text_b, path)
        if req_a is not None and req_b is not None:  # the template renders a request body
            contents_b = {p.path: p.content for p in req_b.positions}
            changed_blocks = {p.path: name for p in req_a.positions if contents_b.get(p.path) != p.content}
            line = next((n.lineno for n in ast.find_all(nodes.Name) if n.name == name), 1)
            body_findings.extend(lint_body(path, req_a, config, None, lambda t: 0, volatile=changed_blocks,
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


def _as_body(text: str, path: str) -> Request | None:
    """The canonical request a templated body renders to, or None when the render is not a request body."""
    from ...inputs import Locator, is_request_body, parse_json_document, parse_request, unwrap

    try:
        doc = parse_json_document(text, path)  # the shared parser: nesting bounded like every other input
    except InputError:
        return None
    if not isinstance(doc, dict) or not is_request_body(unwrap(doc)[0]):
        return None
    from ...inputs.timestamps import no_time

    return parse_request(doc, source=path, locator=Locator(text), timestamps=no_time)


_SAMPLE_CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the weather in Paris today?"},
    {"role": "assistant", "content": "<think>\nThe user asks about Paris.\n</think>\nIt is sunny in Paris."},
    {"role": "user", "content": "And in Berlin?"},
    {"role": "assistant", "content": "It is raining in Berlin."},
    {"role": "user", "content": "Thanks."},
]
_SAMPLE_TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city."}},
                   "required": ["city"]}}}]
_SAMPLE_SPECIAL_TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}


def _as_blocks(msgs: Sequence[dict]) -> list[dict]:
    return [{**m, "content": [{"type": "text", "text": m["content"]}]} for m in msgs]


def _sample_variants() -> list[tuple[str, list[dict], list[dict] | None]]:
    """lint's sample conversation, then the forms a template's own constraints may demand: every form with
    string ``content`` first (a template written for strings, ``{% set content = bos_token + content %}``,
    renders a list of blocks as its repr or fails on it), then the same with content blocks, for templates
    that read only ``content[0].text``."""
    folded = [{"role": "user", "content": _SAMPLE_CHAT[0]["content"] + "\n\n" + _SAMPLE_CHAT[1]["content"]}]
    folded += _SAMPLE_CHAT[2:]
    no_system = _SAMPLE_CHAT[1:]
    plain = [
        ("the sample conversation", _SAMPLE_CHAT, None),
        ("without a system message", no_system, None),
        ("with the system message folded into the first user turn (strict alternation)", folded, None),
        ("with tools", _SAMPLE_CHAT, _SAMPLE_TOOLS),
        ("with tools, without a system message", no_system, _SAMPLE_TOOLS),
    ]
    return plain + [(f"{what}, with content blocks" if what != "the sample conversation" else
                     "the sample conversation with content blocks", _as_blocks(msgs), tools)
                    for what, msgs, tools in plain[:3]]


def _first_turn(msgs: Sequence[dict]) -> int:
    return next(i + 1 for i, m in enumerate(msgs) if m["role"] not in ("system", "developer"))


def chat_sample(path: str, template: Any, tokenizer: Any = None, clock_reads: list | None = None
                ) -> tuple[str, list[dict], list[dict] | None, list[str]]:
    """The first form of the sample conversation the chat template renders, every prefix of it.

    Returns ``(what, messages, tools, renders)`` where ``renders[j]`` is the render of
    ``messages[:first + j]`` (``first`` = up to the first user turn), with the generation prompt when the
    prefix ends in a user turn, as a server renders a request. The values passed are those transformers'
    ``apply_chat_template`` passes (tools and documents None when absent, the tokenizer's special tokens),
    plus a ``strftime_now`` that records each clock read in ``clock_reads``. A template that rejects every
    form raises one InputError naming the first form's error and its line.
    """
    from ...tokenization import render_chat_template

    special = dict(getattr(tokenizer.hf, "special_tokens_map", {}) or {}) if tokenizer is not None \
        else _SAMPLE_SPECIAL_TOKENS
    reads = clock_reads if clock_reads is not None else []

    def strftime_now(fmt: str = "%Y-%m-%d") -> str:
        import datetime

        reads.append(fmt)
        return datetime.datetime(2026, 11, 28, 9, 15).strftime(fmt)

    first_error: InputError | None = None
    for what, msgs, tools in _sample_variants():
        renders = []
        try:
            for k in range(_first_turn(msgs), len(msgs) + 1):
                gen = msgs[k - 1]["role"] != "assistant"
                renders.append(_render(template, {"messages": msgs[:k], "tools": tools, "add_generation_prompt": gen,
                                                  "special_tokens": special,
                                                  "overrides": {"strftime_now": strftime_now}},
                                       path, render=render_chat_template))
        except InputError as exc:
            if exc.message.startswith("refused:"):
                raise  # a sandbox escape is refused, whatever the conversation
            first_error = first_error or exc
            continue
        return what, msgs, tools, renders
    assert first_error is not None
    raise InputError(f"{first_error.message} (the chat template rejects each of the {len(_sample_variants())} forms "
                     "of lint's sample conversation: with and without a system message, strict alternation, with "
                     "and without tools, string content and content blocks)", source=path, line=first_error.line)


def _chat_dynamic(path, template, source, add, tokenizer=None, clock_reads: list | None = None) -> None:
    """Multi-turn stability: the render of turns[:k] must be a prefix of the render of turns[:k+1].

    With a tokenizer this is diff-tokens' stability check in token space (through transformers'
    apply_chat_template, with the same form of the sample conversation); without one, the same check on
    the rendered text.
    """
    from ..tokendiff import common_prefix_length

    line = source[:source.find("</think>")].count("\n") + 1 if "</think>" in source else 1
    _, msgs, tools, renders = chat_sample(path, template, tokenizer, clock_reads)
    first = _first_turn(msgs)
    if tokenizer is not None:
        from ...inputs import prompt_from_value
        from ..tokendiff import check_stability

        saved = tokenizer.hf.chat_template
        tokenizer.hf.chat_template = source
        try:
            value = {"messages": msgs, "tools": tools} if tools else msgs
            report = check_stability(prompt_from_value(value, source=path, line=None), tokenizer)
        finally:
            tokenizer.hf.chat_template = saved
        if not report.stable:
            bad = next(st for st in report.steps if not st.stable)
            add("CC007", line, 1, f"adding message {bad.k} ({bad.role_added}) changes earlier tokens at index "
                f"{bad.diff.first_diff_index}" + (f" ({bad.diff.cause.id})" if bad.diff.cause else ""))
        return
    for j in range(1, len(renders)):
        prev, nxt = renders[j - 1], renders[j]
        common = common_prefix_length(prev, nxt)
        if common < len(prev):
            k = first + j - 1
            add("CC007", line, 1,
                f"adding message {k} ({msgs[k]['role']}) changes earlier text at character {common}: "
                f"{prev[common:common + 30]!r} became {nxt[common:common + 30]!r}")
            break
