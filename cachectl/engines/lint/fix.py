"""Safe fixes for lint's template findings (``cachectl lint --fix`` / ``--diff``).

One rule has a mechanical fix in a template: CC006 (tool schemas serialized with ``tojson`` without
``sort_keys``) becomes ``tojson(sort_keys=true)``, transformers' own ``tojson`` keyword. It is safe in the
rule table's sense: the model reads the same tool schemas, in one canonical key order, and a render without
tools is unchanged (the filter is never reached). The other template rules have no mechanical fix that keeps
the prompt text (CC001, CC003 and CC007 move or pin content: a person decides), and the body rules
(CC002, CC004, CC005, CC008, CC009) concern request bodies, which ``cachectl fix`` rewrites.

Each edit is checked, not assumed: a candidate ``tojson`` on a flagged line is rewritten alone, the template
is parsed again, and the edit is kept only when it removes a CC006 finding on that line (so a ``tojson``
inside a string literal or a comment, or one on a tool call's arguments, is never touched). The fixed
template must compile in transformers' chat-template environment.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ...errors import CachectlError, InputError
from ...inputs.files import BOM
from .rules import _LINE_BREAK, Finding, LintConfig, filter_findings, template_lines
from .run import TEMPLATE_SUFFIXES, _candidates, kind_name
from .templates import _tool_schema_findings, parse_template, sandbox

#: rules whose findings have a mechanical template fix
FIXABLE = frozenset({"CC006"})

_TOJSON = re.compile(r"\|\s*tojson\b")
_SORT_FALSE = re.compile(r"\bsort_keys\s*=\s*(false|False|none|None|0)\b")


@dataclass(frozen=True)
class Edit:
    rule: str
    line: int
    column: int
    before: str    # the source line before the edit
    after: str     # and after


@dataclass(frozen=True)
class FileFix:
    """The safe fixes of one file: its text before and after, and the edits (empty: nothing to fix)."""

    path: str
    original: str
    fixed: str
    edits: tuple[Edit, ...]
    bom: bool = False  # the file starts with a UTF-8 BOM (kept when written)

    @property
    def changed(self) -> bool:
        return self.fixed != self.original

    def diff(self) -> str:
        """A unified diff of the file, its path on both sides (as ruff --diff prints it; ``patch -p0`` applies it):
        lines as diff and patch read them (ended by ``\\n`` alone), and a last line with no line end marked
        ``\\ No newline at end of file`` (without it the next line of the diff was glued to it: a corrupt patch)."""
        out = []
        for line in difflib.unified_diff(_patch_lines(self.original), _patch_lines(self.fixed),
                                         fromfile=self.path, tofile=self.path):
            out.append(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n")
        return "".join(out)

    def to_dict(self) -> dict:
        return {"path": self.path, "fixes": [{"rule": e.rule, "line": e.line, "column": e.column}
                                             for e in self.edits], "diff": self.diff()}


@dataclass(frozen=True)
class FixResult:
    files: tuple[FileFix, ...]     # files with at least one edit
    errors: tuple[str, ...] = ()   # paths missing, files that could not be read or parsed (left as they were)
    #: files lint reads but a fix must not rewrite (compressed: written back they would be plain text)
    skipped: tuple[str, ...] = ()
    #: files of a directory reached through a symlink that leaves it: linted, never rewritten (notes, not errors)
    outside: tuple[str, ...] = ()
    #: request bodies (JSON or YAML files that are not a tokenizer_config.json): lint does not edit them, their safe
    #: fixes are ``cachectl fix``'s, over a request log
    bodies: tuple[str, ...] = ()

    @property
    def fixed(self) -> int:
        return sum(len(f.edits) for f in self.files)


def _closing_paren(text: str, start: int) -> int | None:
    """Index of the ``)`` that closes the ``(`` at ``start``, skipping string literals."""
    depth = 0
    quote = None
    i = start
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def _with_sort_keys(source: str, match: re.Match) -> str | None:
    """``source`` with the ``tojson`` filter at ``match`` given ``sort_keys=true`` (None: not rewritable)."""
    end = match.end()
    j = end
    while j < len(source) and source[j] in " \t":
        j += 1
    if j >= len(source) or source[j] != "(":
        return source[:end] + "(sort_keys=true)" + source[end:]
    close = _closing_paren(source, j)
    if close is None:
        return None
    args = source[j + 1:close]
    if _SORT_FALSE.search(args):
        args = _SORT_FALSE.sub("sort_keys=true", args, count=1)
    elif "sort_keys" in args:
        return None  # sort_keys given some other way (a variable): a person decides
    elif args.strip():
        args = args.rstrip() + ", sort_keys=true"
    else:
        args = "sort_keys=true"
    return source[:j + 1] + args + source[close:]


def _cc006_lines(env, source: str, path: str, config: LintConfig) -> list[Finding]:
    ast = parse_template(env, source, path)
    lines = template_lines(source)
    found: list[Finding] = []

    def add(rule: str, line: int, column: int, message: str) -> None:
        found.append(Finding(rule, "warning", path, line, column, message))

    _tool_schema_findings(ast, lines, add)
    return filter_findings(found, source, config)


def _count_on(findings: list[Finding], line: int) -> int:
    return sum(f.line == line for f in findings)


def fix_template(path: str, source: str, config: LintConfig) -> tuple[str, list[Edit]]:
    """The template with every fixable finding fixed, and the edits made.

    Raises InputError when the template does not parse (nothing is fixed then).
    """
    if "CC006" not in FIXABLE or not config.enabled("CC006", path):
        return source, []
    env = sandbox()
    findings = _cc006_lines(env, source, path, config)
    edits: list[Edit] = []
    text = source
    for line in sorted({f.line for f in findings}):
        progress = True
        while progress and _count_on(findings, line):
            progress = False
            starts = _line_starts(text)
            lo, hi = starts[line - 1], starts[line] if line < len(starts) else len(text)
            for m in _TOJSON.finditer(text, lo, hi):
                candidate = _with_sort_keys(text, m)
                if candidate is None or len(_line_starts(candidate)) != len(starts):
                    continue
                try:
                    after = _cc006_lines(env, candidate, path, config)
                except InputError:
                    continue
                if _count_on(after, line) < _count_on(findings, line):
                    old, new = template_lines(text)[line - 1], template_lines(candidate)[line - 1]
                    edits.append(Edit("CC006", line, m.start() - lo + 1 + (m.group(0).find("tojson")), old, new))
                    text, findings, progress = candidate, after, True
                    break
    if edits:
        from jinja2.exceptions import TemplateSyntaxError

        try:
            env.from_string(text)
        except TemplateSyntaxError as exc:  # pragma: no cover - every kept edit parsed already
            raise InputError(f"the fixed template does not compile: {exc.message}", source=path,
                             line=exc.lineno) from None
    return text, edits


def _line_starts(text: str) -> list[int]:
    """Where each line starts, lines as Jinja numbers them (:func:`template_lines`: ``\\r\\n``, ``\\r`` or ``\\n``;
    counting ``\\n`` alone was an IndexError on a template whose lines end with ``\\r``)."""
    return [0, *(m.end() for m in _LINE_BREAK.finditer(text))]


def _patch_lines(text: str) -> list[str]:
    """``text``'s lines as ``diff`` and ``patch`` read them: each ended by ``\\n`` (kept), the last one maybe not."""
    return re.findall(r"[^\n]*\n|[^\n]+\Z", text)


def _fix_tokenizer_config(path: str, text: str, config: LintConfig) -> tuple[str, list[Edit]]:
    """A tokenizer_config.json's string ``chat_template``, fixed where its JSON string literal stands (the rest of
    the file is left byte for byte)."""
    from ...inputs import parse_json_document

    doc = parse_json_document(text, path)
    if not isinstance(doc, dict) or not isinstance(doc.get("chat_template"), str):
        return text, []
    template = doc["chat_template"]
    fixed, edits = fix_template(path, template, config)
    if not edits:
        return text, []
    m = re.search(r'"chat_template"\s*:\s*"', text)
    if m is None:  # pragma: no cover - the key was parsed from this text
        return text, []
    start = m.end() - 1
    value, end = json.decoder.scanstring(text, start + 1)  # type: ignore[attr-defined]
    if value != template:  # a duplicate key or an escaped key name: leave the file alone
        raise InputError("could not locate the chat_template string to fix it in place", source=path,
                         field="chat_template")
    return text[:start + 1] + _edited_literal(text[start + 1:end - 1], template, fixed) + text[end - 1:], edits


def _edited_literal(raw: str, old: str, new: str) -> str:
    """The JSON string literal body ``raw`` (which decodes to ``old``) edited to decode to ``new``, its escapes kept
    where the text did not change: the inserted text is encoded as the literal is (ASCII-only where it is), and
    ``\\u003c``, ``\\/`` or ``\\u00e9`` elsewhere stay as written (the whole template was encoded again, a diff
    of every escape in it)."""
    at = [0]  # the raw offset where each decoded character starts, and the end
    i = 0
    while i < len(raw):
        if raw[i] != "\\":
            i += 1
        elif raw[i + 1] != "u":
            i += 2
        elif 0xD800 <= int(raw[i + 2:i + 6], 16) < 0xDC00 and raw[i + 6:i + 8] == "\\u":
            i += 12  # (a surrogate pair: one character)
        else:
            i += 6
        at.append(i)
    ascii_only = raw.isascii()
    out, done = [], 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        out.append(raw[done:at[i1]])
        out.append(json.dumps(new[j1:j2], ensure_ascii=ascii_only)[1:-1])
        done = at[i2]
    out.append(raw[done:])
    return "".join(out)


def fix_paths(paths: Sequence[str], config: LintConfig) -> FixResult:
    """The safe fixes of every template under ``paths`` (Jinja files and tokenizer_config.json chat templates).

    Nothing is written: the caller writes :attr:`FileFix.fixed` (``--fix``) or shows :meth:`FileFix.diff`
    (``--diff``). A file that cannot be read or parsed is listed in ``errors`` and left alone; lint reports
    it the same way.
    """
    from ...inputs import decode_text, read_bytes
    from ...inputs.files import compression
    from ...sandbox import budget, site

    out: list[FileFix] = []
    errors: list[str] = []
    skipped: list[str] = []
    outside: list[str] = []
    bodies: list[str] = []
    seen: set[str] = set()
    for raw in paths:
        if raw == "-":
            continue  # stdin cannot be fixed in place
        try:
            files = _candidates(raw)
        except CachectlError as exc:
            errors.append(str(exc))
            continue
        tree = os.path.realpath(raw) if os.path.isdir(raw) else None
        for f in files:
            if (real := os.path.realpath(f)) in seen:  # (named twice, or in a directory named too: fixed once)
                continue
            seen.add(real)
            kind = kind_name(f)
            if not (kind.name.endswith(TEMPLATE_SUFFIXES) or kind.name == "tokenizer_config.json"):
                bodies.append(str(f))
                continue
            if tree is not None and os.path.commonpath([tree, os.path.realpath(f)]) != tree:
                # a symlink out of the directory given: what it points to is not the user's to rewrite here
                outside.append(f"{f}: a symlink to {os.path.realpath(f)}, outside {raw}: not fixed (name the file "
                               "itself to fix it)")
                continue
            packed = compression(str(f))
            if packed:  # written back, it would lose its compression
                skipped.append(f"{f}: {packed}-compressed: fixes are written to plain files; decompress it, fix "
                               "it, and compress it again")
                continue
            try:
                data, source = read_bytes(str(f))
                text = decode_text(data, source)
                with budget(config.budget()), site(str(f)):  # each render of the fix's checks, under the budget
                    if kind.name.endswith(TEMPLATE_SUFFIXES):
                        fixed, edits = fix_template(str(f), text, config)
                    else:
                        fixed, edits = _fix_tokenizer_config(str(f), text, config)
            except CachectlError as exc:
                errors.append(str(exc))
                continue
            if edits:
                out.append(FileFix(str(f), text, fixed, tuple(edits), bom=data.startswith(BOM)))
    return FixResult(files=tuple(out), errors=tuple(errors), skipped=tuple(skipped), outside=tuple(outside),
                     bodies=tuple(bodies))


def write_fixes(result: FixResult) -> tuple[tuple[FileFix, ...], tuple[str, ...]]:
    """Write each fixed file in place (its bytes as read: UTF-8, the same line endings), each whole or not at
    all: a temporary file beside it, renamed over it (a full disk or an interrupt leaves the file as it was).
    Returns the files written, and one message for each file left as it was: one this process may not write
    (read-only: replacing it would write what its mode forbids), one with other hard links (a file renamed over it
    would leave them the old text), one the write failed. The others are written all the same (a failed file
    stopped the run, and the files written before it were then said nowhere)."""
    from ...errors import OutputError
    from ...outputs import write_bytes

    written: list[FileFix] = []
    failed: list[str] = []
    for f in result.files:
        why = _not_rewritable(f.path)
        if why is not None:
            failed.append(f"{f.path}: {why} (not fixed: the file is as it was)")
            continue
        try:
            write_bytes(f.path, (BOM if f.bom else b"") + f.fixed.encode("utf-8"))
        except OutputError as exc:
            failed.append(str(exc))
            continue
        written.append(f)
    return tuple(written), tuple(failed)


def _not_rewritable(path: str) -> str | None:
    """Why ``path`` must not be replaced by a fixed copy, or None."""
    try:
        st = os.stat(path)
    except OSError:
        return None  # (the write says what is wrong)
    if not os.access(path, os.W_OK):
        return "is read-only"
    if st.st_nlink > 1:
        return f"has {st.st_nlink} hard links, which a fixed copy renamed over it would leave with the old text"
    return None
