"""Lint files: find the templates and request bodies under the paths given, read each (plain, gzip or
zstd), and run the template rules (:mod:`.templates`) or the body rules (:mod:`.body`) on it; a file that
cannot be read or parsed is a :class:`FileError`, and the run goes on."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ...errors import CachectlError, InputError
from .body import lint_body
from .rules import LINT_FIXES, LOG_FIXES, FileError, Finding, LintConfig, LintReport
from .templates import lint_template

if TYPE_CHECKING:
    pass


# ---------------------------------------------------------------------------------------------- files

TEMPLATE_SUFFIXES = (".j2", ".jinja", ".jinja2", ".prompt", ".tmpl")
#: compressed files are read through (cachectl.inputs); their kind is in the name before these
COMPRESSED_SUFFIXES = (".gz", ".zst")


def kind_name(f: Path) -> Path:
    """The name that says what a file holds: ``t.j2.gz`` is a template, ``b.json.zst`` a JSON body."""
    return f.with_name(f.name[:-len(f.suffix)]) if f.suffix in COMPRESSED_SUFFIXES else f


def _candidates(raw: str) -> list[Path]:
    p = Path(raw)
    if p.is_dir():
        return [f for f in sorted(p.rglob("*"))
                if f.is_file() and (f.name.endswith(TEMPLATE_SUFFIXES) or f.name == "tokenizer_config.json"
                                    or (f.suffix in (".json", ".yaml", ".yml")
                                        and not f.name.endswith((".samples.json", ".cachectl.json"))))]
    if p.is_file() or raw == "-":
        return [p]
    raise InputError("no such file or directory", source=raw)


def lint_paths(paths: Sequence[str], config: LintConfig, tokenizer: Any = None,
               min_tokens: int | None = None, progress: Callable[[int], None] | None = None) -> LintReport:
    """Lint every file under ``paths``. A file that cannot be checked becomes a :class:`FileError` and the
    others are still checked; a path that holds no lintable file is an error too. ``progress(1)``: called as
    each file is done."""
    count = (lambda text: len(tokenizer.backend.encode(text, add_special_tokens=False).ids)) if tokenizer \
        else (lambda text: max(1, len(text) // 4))
    from ...sandbox import budget

    with budget(config.budget()):
        return _lint_paths(paths, config, tokenizer, min_tokens, count, progress)


def _lint_paths(paths: Sequence[str], config: LintConfig, tokenizer: Any, min_tokens: int | None,
                count: Callable[[str], int], progress: Callable[[int], None] | None = None) -> LintReport:
    from ...sandbox import site

    findings: list[Finding] = []
    errors: list[FileError] = []
    checked = 0
    seen: set[str] = set()
    for raw in paths:
        try:
            files = _candidates(raw)
        except CachectlError as exc:
            errors.append(replace(_file_error(exc, raw), kind="path"))
            continue
        linted, again = 0, False
        for f in files:
            if progress is not None:
                progress(1)
            if raw != "-":  # (a file named twice, or in a directory named too: linted once)
                if (real := os.path.realpath(f)) in seen:
                    again = True
                    continue
                seen.add(real)
            try:
                with site(str(f)):
                    found = _lint_file(f, config, tokenizer, min_tokens, count, named=Path(raw).is_file())
            except CachectlError as exc:
                errors.append(_file_error(exc, str(f)))
                linted += 1
                continue
            if found is not None:
                findings += found
                linted += 1
        if not linted and not again:
            errors.append(FileError(raw, None, kind="path", message=(
                "no lintable file here (Jinja templates " + ", ".join(TEMPLATE_SUFFIXES)
                + ", tokenizer_config.json with a chat_template, request bodies in JSON or YAML)")))
        checked += linted
    return LintReport(files=checked, findings=tuple(findings), errors=tuple(errors))


def _file_error(exc: CachectlError, path: str) -> FileError:
    if isinstance(exc, InputError):
        field = f"field '{exc.field}': " if exc.field else ""
        return FileError(exc.source or path, exc.line, field + exc.message)
    return FileError(path, None, str(exc))


def _applied_by(found: list[Finding], rules: frozenset[str], command: str) -> list[Finding]:
    """The findings, those of ``rules`` with a safe fix marked as applied by ``command``."""
    return [replace(x, applied_by=command) if x.rule in rules and x.safety == "safe" else x for x in found]


def _lint_file(f: Path, config: LintConfig, tokenizer: Any, min_tokens: int | None,
               count: Callable[[str], int], named: bool = False) -> list[Finding] | None:
    """Findings of one file; None when the file is no prompt (other JSON/YAML in a directory)."""
    from ...inputs import decode_text, parse_json_document, read_bytes
    from ...inputs.files import too_many_digits, yaml_expanded_past

    data, source = read_bytes(str(f))
    text = decode_text(data, source)
    kind = kind_name(f)
    if kind.name.endswith(TEMPLATE_SUFFIXES):
        return _applied_by(lint_template(source, text, config, tokenizer), LINT_FIXES, "cachectl lint --fix")
    if kind.suffix in (".yaml", ".yml"):
        import yaml

        loader = None
        try:  # safe_load's own steps, the composed node kept: the positions, which the values keep none of
            loader = yaml.SafeLoader(text)  # (which reads the text: a control character is refused here)
            node = loader.get_single_node()
            doc = loader.construct_document(node) if node is not None else None
        except yaml.YAMLError as exc:
            # (the line and column from the mark's character index: YAML breaks lines at U+0085, U+2028 and U+2029
            # too, and its own count would name a line past the file's)
            mark = getattr(exc, "problem_mark", None)
            at = mark.index if mark else 0
            column = at - text.rfind("\n", 0, at)
            raise InputError("invalid YAML: " + " ".join(str(getattr(exc, "problem", None) or exc).split())
                             + (f" (column {column})" if mark else ""), source=source,
                             line=text.count("\n", 0, at) + 1 if mark else None) from None
        except RecursionError:
            raise InputError("YAML nested too deeply", source=source) from None
        except ValueError as exc:  # an integer of more digits than Python converts
            raise too_many_digits(text, source, exc, "invalid YAML") from None
        finally:
            if loader is not None:
                loader.dispose()
        if yaml_expanded_past(doc, text):
            raise InputError("YAML whose aliases (*name) expand it past twice its size: not read", source=source)
        from ...inputs.jsonpos import YamlLocator, yaml_duplicate_key

        if (dup := yaml_duplicate_key(node)) is not None:
            raise InputError(f"duplicate key {dup[0]!r:.80}", source=source, line=text.count("\n", 0, dup[1]) + 1)
        locator: Any = YamlLocator(text, node)
    else:
        doc = parse_json_document(text, source)
        locator = None
    if isinstance(doc, dict) and isinstance(doc.get("chat_template"), (str, list)):
        tmpl = doc["chat_template"]
        templates = [("chat_template", tmpl)] if isinstance(tmpl, str) else []
        for i, t in enumerate(tmpl if isinstance(tmpl, list) else ()):  # transformers' named templates: each one
            if not (isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("template"), str)):
                raise InputError("expected a named template, {\"name\": ..., \"template\": ...}", source=source,
                                 field=f"chat_template[{i}]")
            templates.append(("chat_template" if t["name"] == "default" else f"chat_template {t['name']!r}",
                              t["template"]))
        if not templates:
            raise InputError("an empty list of chat templates", source=source, field="chat_template")
        base_line = text[:text.find('"chat_template"')].count("\n") + 1
        findings = []
        for label, body in templates:
            try:
                found = lint_template(source, body, config, tokenizer)
            except InputError as exc:
                where = f" ({label} line {exc.line})" if exc.line else f" ({label})" if label != "chat_template" else ""
                raise InputError(exc.message + where, source=source, line=base_line, field="chat_template") from None
            findings += [Finding(x.rule, x.severity, x.path, base_line, x.column, f"{x.message} ({label} line {x.line})",
                                 x.fix, x.fix_safety) for x in found]
        return _applied_by(findings, LINT_FIXES, "cachectl lint --fix")
    from ...inputs import Locator, is_request_body, parse_request, unwrap
    from ...inputs.timestamps import no_time

    if isinstance(doc, dict) and is_request_body(unwrap(doc)[0]):
        # (the lint reads no times: a wrapper's time, zoneless or odd, is not the body's to answer for)
        req = parse_request(doc, source=source, locator=locator or Locator(text), timestamps=no_time)
        return _applied_by(lint_body(source, req, config, min_tokens, count), LOG_FIXES, "cachectl fix")
    if named:
        raise InputError("not a request body (no 'messages', 'input' or 'blocks', also not inside 'body') "
                         "and not a tokenizer_config.json with a chat_template", source=source)
    return None  # other JSON/YAML files in a directory are not prompts: skipped
