"""The lint rules, the shapes of a finding and a report, and the configuration read from
``[tool.cachectl.lint]`` in ``pyproject.toml`` (rule selection, per-file ignores, model, tail tokens)."""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from ...errors import InputError, UsageError

if TYPE_CHECKING:
    pass



SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    severity: str          # error | warning
    summary: str
    fix: str
    #: "safe": the fix leaves what the model reads unchanged (it moves a breakpoint, fixes serialization);
    #: "unsafe": the fix changes the prompt text the model sees (reordered content, a pinned date)
    fix_safety: str = "unsafe"


RULES: dict[str, Rule] = {r.id: r for r in (
    Rule("CC001", "volatile-before-stable-content", "error",
         "A value that changes per request sits before stable content, which can then never be cached.",
         "Move per-request values (dates, ids, names) after the stable content: the end of the prompt.",
         fix_safety="unsafe"),
    Rule("CC002", "volatile-before-breakpoint", "error",
         "Content that changes per request sits at or before a cache_control breakpoint, so the breakpoint is "
         "never read.",
         "Put cache_control on the last stable block, after which the per-request content starts.",
         fix_safety="safe"),
    Rule("CC003", "template-injects-time", "error",
         "The template reads the clock while rendering (strftime_now, now()), or renders a date variable that has "
         "no constant default, so the caller must pass a date in every request.",
         "Pass the date explicitly and pin it (per day at most), or give the variable a constant default, or "
         "leave it out of the cached prefix.",
         fix_safety="unsafe"),
    Rule("CC004", "too-many-breakpoints", "error",
         "More than 4 cache_control breakpoints: the API rejects the request.",
         "Keep at most 4 breakpoints (top-level automatic caching uses one).",
         fix_safety="safe"),
    Rule("CC005", "breakpoint-below-minimum", "warning",
         "A breakpoint closes a prefix shorter than the model's minimum cacheable length: nothing is cached, "
         "silently.",
         "Move the breakpoint later, or drop it.",
         fix_safety="safe"),
    Rule("CC006", "tools-unsorted-json", "warning",
         "Tool schemas are serialized with tojson without sort_keys: their key order follows the caller's dicts, "
         "and a reordered schema misses the cache (tool calls in the history are the model's own output and are "
         "not flagged).",
         "Use tojson(sort_keys=true) for tools, or serialize them deterministically before rendering.",
         fix_safety="safe"),
    Rule("CC007", "template-rewrites-history", "error",
         "The chat template renders earlier turns differently once a new turn is added, so each request's prefix "
         "differs from the previous request's.",
         "Keep history rendering append-only (do not strip reasoning or rewrite earlier messages).",
         fix_safety="unsafe"),
    Rule("CC008", "breakpoint-on-volatile-block", "error",
         "cache_control is on a block whose own content changes per request: the entry is written and never read.",
         "Put cache_control on a stable block before it.",
         fix_safety="safe"),
    Rule("CC009", "no-cache-marker", "warning",
         "A long Anthropic prompt has no cache_control at all: nothing is cached, every request pays full price.",
         "Add cache_control to the last stable block, or a top-level cache_control for automatic caching.",
         fix_safety="safe"),
    Rule("CC010", "volatile-in-openai-prefix", "error",
         "A value that changes per request sits inside the first 1,024 tokens of an OpenAI request (tools, "
         "schema, system): automatic caching starts at 1,024 shared tokens, so nothing is cached.",
         "Move per-request values to the end of the request, after the stable instructions.",
         fix_safety="unsafe"),
    Rule("CC011", "openai-breakpoint-after-volatile", "error",
         "On GPT-5.6 and later, a prompt_cache_breakpoint (or the implicit breakpoint on the last message) comes "
         "after a value that changes per request: the prefix it closes is written every time and never read.",
         "Put the explicit breakpoint on the last stable block, before the per-request value, or move the value "
         "after it.",
         fix_safety="safe"),
    Rule("CC012", "openai-too-many-breakpoints", "warning",
         "More than four breakpoints on GPT-5.6 and later: a request writes at most four (the implicit one and the "
         "latest three explicit ones; four explicit ones in explicit mode), so the earliest are never written.",
         "Keep at most three explicit breakpoints (four with prompt_cache_options.mode = \"explicit\").",
         fix_safety="safe"),
    Rule("CC013", "openai-ttl-and-retention", "error",
         "Both prompt_cache_options.ttl and prompt_cache_retention are set: the API rejects the request (the TTL "
         "supersedes the retention on GPT-5.6 and later).",
         "Drop prompt_cache_retention on GPT-5.6 and later models.",
         fix_safety="safe"),
    Rule("CC014", "openai-explicit-mode-no-breakpoint", "error",
         "prompt_cache_options.mode is \"explicit\" and no content block carries a prompt_cache_breakpoint: "
         "nothing is cached.",
         "Mark the end of the stable prefix with prompt_cache_breakpoint, or use the implicit mode.",
         fix_safety="safe"),
    Rule("CC015", "openai-stable-prefix-no-breakpoint", "warning",
         "On GPT-5.6 and later, a long stable prefix is followed by a final message that changes per request and "
         "no explicit breakpoint marks the prefix: the implicit breakpoint sits after the changing message, so "
         "no request reads the prefix (and each one writes it again at 1.25x).",
         "Add \"prompt_cache_breakpoint\": {\"mode\": \"explicit\"} to the last block of the stable prefix.",
         fix_safety="safe"),
)}

#: rules whose fix ``cachectl lint --fix`` applies to a template (see :mod:`.fix`)
LINT_FIXES = frozenset({"CC006"})
#: body rules whose fix ``cachectl fix`` applies over a request log (FX006 places, removes and caps breakpoints)
LOG_FIXES = frozenset({"CC002", "CC004", "CC005", "CC008", "CC009", "CC011", "CC012", "CC015"})

VOLATILE_NAME = re.compile(
    r"(^|_)(now|today|date|datetime|time|timestamp|ts|clock|uuid|guid|nonce|random|rand|request_?id|req_?id|"
    r"trace_?id|span_?id|session_?id|session|user_?id|user_?name|username|customer|email|ip)(_|$)", re.I)
VOLATILE_CALLS = {"now", "strftime_now", "utcnow", "today", "uuid4", "uuid", "random", "time"}


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str
    path: str
    line: int
    column: int
    message: str
    fix: str = ""
    #: "safe" or "unsafe" (see Rule.fix_safety); empty: the rule's own
    fix_safety: str = ""
    #: the command that applies the fix: "cachectl lint --fix" (a template's mechanical fix), "cachectl fix" (a
    #: request body's breakpoints, rewritten over a request log); empty: a person applies it
    applied_by: str = ""

    @property
    def safety(self) -> str:
        return self.fix_safety or (RULES[self.rule].fix_safety if self.rule in RULES else "unsafe")

    def to_dict(self) -> dict:
        return {"rule": self.rule, "severity": self.severity, "path": self.path, "line": self.line,
                "column": self.column, "message": self.message, "fix": self.fix, "fix_safety": self.safety, "fix_applied_by": self.applied_by or None}

    @property
    def fix_label(self) -> str:
        """How the fix is applied, as the text output says it: ``safe fix: cachectl lint --fix``, ``safe fix:
        cachectl fix applies it to a request log`` (lint does not edit request bodies), ``safe fix, by hand``,
        ``unsafe fix``."""
        if self.safety != "safe":
            return f"{self.safety} fix"
        if self.applied_by == "cachectl fix":
            return "safe fix: cachectl fix applies it to a request log"
        return f"safe fix: {self.applied_by}" if self.applied_by else "safe fix, by hand"


@dataclass(frozen=True)
class FileError:
    """A file that could not be checked (unreadable, invalid, refused by the sandbox, unrenderable)."""

    path: str
    line: int | None
    message: str
    #: "file": a file that could not be checked; "path": a PATH argument that is missing or holds no lintable file
    kind: str = "file"

    def describe(self) -> str:
        message = " ".join(self.message.split())  # one line, whatever the message quotes
        return f"{self.path}:{self.line}: {message}" if self.line else f"{self.path}: {message}"

    def to_dict(self) -> dict:
        return {"path": self.path, "line": self.line, "message": self.message, "kind": self.kind}


@dataclass(frozen=True, kw_only=True)
class LintReport:
    schema_version: int = SCHEMA_VERSION
    files: int
    findings: tuple[Finding, ...]
    errors: tuple[FileError, ...] = ()
    rules: tuple[Rule, ...] = field(default_factory=lambda: tuple(RULES.values()))

    @property
    def checked(self) -> int:
        """Files checked to the end (``files`` counts those that could not be checked too)."""
        return self.files - sum(e.kind == "file" for e in self.errors)

    @property
    def exit_code(self) -> int:
        """The worst outcome: 2 when a file could not be checked, 1 with findings, else 0."""
        return 2 if self.errors else 1 if self.findings else 0

    def to_dict(self) -> dict:
        return {"schema_version": self.schema_version, "files": self.files,
                "findings": [f.to_dict() for f in self.findings], "errors": [e.to_dict() for e in self.errors]}


# --------------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class LintConfig:
    select: frozenset[str] = frozenset(RULES)
    per_file_ignores: tuple[tuple[str, frozenset[str]], ...] = ()
    model: str | None = None
    tail_tokens: int = 64          # stable tokens after a volatile value that make it a finding
    source: str | None = None      # the pyproject.toml read, for errors about its values
    render_timeout: float = 5.0    # seconds of wall-clock time one render of a template may take
    render_memory: int = 256       # MB of memory one render of a template may take

    def budget(self) -> Any:
        """The :class:`cachectl.sandbox.RenderBudget` templates render under."""
        from ...sandbox import RenderBudget

        return RenderBudget(self.render_timeout, self.render_memory * 2 ** 20)

    def enabled(self, rule: str, path: str) -> bool:
        """Whether ``rule`` applies to ``path``. A per-file-ignores glob matches the path as given, its name, or
        (as ruff's do) the path relative to the directory of the pyproject.toml it came from: the same file is
        matched however it is named on the command line (``sub``, ``$PWD/sub``, from inside ``sub``)."""
        if rule not in self.select:
            return False
        ignores = [pat for pat, ids in self.per_file_ignores if rule in ids]
        if not ignores:
            return True
        names = [path, Path(path).name]
        if self.source is not None:
            with contextlib.suppress(ValueError, OSError):
                names.append(os.path.relpath(os.path.abspath(path), os.path.dirname(os.path.abspath(self.source))))
        return not any(fnmatch.fnmatch(name, pat) for pat in ignores for name in names)


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


#: the keys of ``[tool.cachectl.lint]``
CONFIG_KEYS = ("select", "ignore", "per-file-ignores", "model", "tail-tokens", "render-timeout", "render-memory")


def load_config(pyproject: str | None, *, select: Sequence[str] = (), ignore: Sequence[str] = (),
                model: str | None = None, render_timeout: float | None = None,
                render_memory: int | None = None) -> LintConfig:
    """``[tool.cachectl.lint]`` from a pyproject.toml (if given or found), then the command-line options."""
    table: dict = {}
    source = pyproject
    if pyproject is None and Path("pyproject.toml").is_file():
        source = "pyproject.toml"
    if source is not None:
        import tomllib

        from ...inputs.files import read_text

        text, _ = read_text(source)  # (bounded: a stream has no size to check first; errors located)
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"invalid TOML: {exc}", source=source) from None
        except ValueError as exc:  # an integer of more digits than Python converts
            from ...inputs.files import too_many_digits

            raise too_many_digits(text, source, exc, "invalid TOML") from None
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
    for key in table:  # (a misspelled key was dropped unsaid: `ignores`, `render_timeout`)
        if key not in CONFIG_KEYS:
            close = difflib.get_close_matches(str(key).replace("_", "-"), CONFIG_KEYS, n=1)
            raise InputError(f"unknown key {str(key)!r:.60}" + (f": did you mean {close[0]!r}?" if close else "")
                             + f" (known: {', '.join(CONFIG_KEYS)})", source=source, field=f"tool.cachectl.lint.{key}")

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
        if not chosen:  # (`--select ,,` turned every rule off: "clean", with nothing checked)
            raise UsageError(f"--select names no rule (known: {', '.join(RULES)})")
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
    def number(key: str, given: Any, default: float, lo: float, hi: float, whole: bool) -> Any:
        value = table.get(key, default) if given is None else given
        kinds = (int,) if whole else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or not lo <= value <= hi:
            what = f"expected a whole number from {lo:g} to {hi:,g}" if whole else f"expected seconds, above 0 and at most {hi:g}"
            if given is not None:
                raise UsageError(f"--{key}: {what}, got {value!r:.60}")
            raise InputError(f"{what}, got {value!r:.60}", source=source, field=f"tool.cachectl.lint.{key}")
        return value

    timeout = float(number("render-timeout", render_timeout, 5.0, 1e-3, 3600, whole=False))
    memory = int(number("render-memory", render_memory, 256, 16, 1_000_000, whole=True))
    return LintConfig(select=chosen, per_file_ignores=tuple(per_file), model=model or cfg_model, tail_tokens=tail,
                      source=source, render_timeout=timeout, render_memory=memory)


# ------------------------------------------------------------------------------------------- filter


def template_lines(source: str) -> list[str]:
    """The source's lines as Jinja numbers them: broken at ``\r\n``, ``\r`` and ``\n`` only (``str.splitlines``
    also breaks at U+0085, U+2028, U+2029 and a few control characters, which a template holds inside a line)."""
    return _LINE_BREAK.split(source)


_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def ignored_lines(source: str) -> dict[int, frozenset[str]]:
    out: dict[int, frozenset[str]] = {}
    for i, text in enumerate(template_lines(source), start=1):
        for m in re.finditer(r"cachectl:\s*ignore\[([A-Za-z0-9,\s]+)\]", text):
            ids = frozenset(x.strip().upper() for x in m.group(1).split(",") if x.strip())
            for ln in (i, i + 1):  # the comment's own line and the next one
                out[ln] = out.get(ln, frozenset()) | ids
    return out


def filter_findings(findings: list[Finding], source: str, config: LintConfig) -> list[Finding]:
    ignored = ignored_lines(source) if source else {}
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
