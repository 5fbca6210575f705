"""Lint reports as data for machines: SARIF 2.1.0 and GitHub Actions workflow commands.

Built here, in the library, so that other tools can emit them; the CLI only prints the result.
"""

from __future__ import annotations

import os

from .rules import RULES, FileError, Finding, LintReport


def to_sarif(report: LintReport, version: str) -> dict:
    """SARIF 2.1.0 (validated against the OASIS schema in the tests); files that could not be checked are
    tool execution notifications of an unsuccessful invocation."""
    ids = list(RULES)
    rules = [{"id": r.id, "name": r.name, "shortDescription": {"text": r.summary}, "fullDescription": {"text": r.summary},
              "help": {"text": r.fix}, "defaultConfiguration": {"level": r.severity}} for r in RULES.values()]
    results = [{"ruleId": f.rule, "ruleIndex": ids.index(f.rule), "level": f.severity,
                "message": {"text": f.message},
                "locations": [_sarif_location(f.path, f.line, f.column)],
                "properties": {"fix": f.fix, "fixSafety": f.safety}}
               for f in report.findings]
    # files that could not be checked: tool execution notifications of an unsuccessful invocation
    notes = [{"level": "error", "message": {"text": e.message}, "locations": [_sarif_location(e.path, e.line, None)],
              "descriptor": {"id": "file-error"}} for e in report.errors]
    invocation = {"executionSuccessful": not report.errors, "toolExecutionNotifications": notes}
    return {"$schema": "https://json.schemastore.org/sarif-2.1.0.json", "version": "2.1.0",
            "runs": [{"tool": {"driver": {"name": "cachectl", "version": version, "rules": rules}},
                      "invocations": [invocation], "results": results}]}


def _sarif_location(path: str, line: int | None, column: int | None) -> dict:
    region: dict = {"startLine": max(1, line or 1)}
    if column:
        region["startColumn"] = max(1, column)
    return {"physicalLocation": {"artifactLocation": {"uri": file_uri(path)}, "region": region}}


def file_uri(path: str) -> str:
    """A file's path as SARIF's ``artifactLocation.uri`` takes it: a URI reference (RFC 3986), percent-encoded. The
    raw path was no URI for a name with a space or a newline, and named another file for one with ``%``, ``#``,
    ``?`` or a ``:`` before its first ``/`` (read as a scheme). Windows' separators become ``/``."""
    from urllib.parse import quote

    if os.sep == "\\":
        path = path.replace("\\", "/")
    return quote(path, safe="/")


def _escape(text: str, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text


def to_github(f: Finding) -> str:
    """One GitHub Actions workflow command (an annotation) per finding."""
    kind = "error" if f.severity == "error" else "warning"
    return (f"::{kind} file={_escape(f.path, True)},line={f.line},col={f.column},title={f.rule}::"
            f"{_escape(f.message + ' (fix, ' + f.safety + ': ' + f.fix + ')')}")


def github_error(e: FileError) -> str:
    line = f",line={e.line}" if e.line else ""
    return f"::error file={_escape(e.path, True)}{line},title=cachectl could not check this file::{_escape(e.message)}"
