"""The kept corpus: ``tests/fuzz_corpus/manifest.json`` names each case's input file and command line.

A case: ``{"id", "file", "filename", "args", "app", "note", "xfail", "expect"}``. ``args`` is the command
line with ``{path}`` for the input (written as ``filename`` in a fresh directory) and ``{root}`` for the
repository; ``xfail`` is null, or the reason the case still fails (the fix belongs to code another change is
rewriting); ``expect`` optionally pins the answer: ``{"exit": 2, "error_has": ["field 'hash_ids[0]'"]}``
(for inputs that were accepted without a word). Option cases have ``"option": NAME`` and the value in
``file`` (UTF-8), substituted for ``{v}``.

In a case file ``@@DEEP@@`` stands for 100,000 nested ``[`` and their ``]``, and ``@@HUGE@@`` for a 1 MiB line,
so that the repository keeps them small.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .targets import OPTION_TARGETS, ROOT, TARGETS

CORPUS = ROOT / "tests" / "fuzz_corpus"
MANIFEST = CORPUS / "manifest.json"


def load() -> list[dict]:
    return json.loads(MANIFEST.read_text(encoding="utf-8"))["cases"] if MANIFEST.is_file() else []


def save(cases: list[dict]) -> None:
    CORPUS.mkdir(parents=True, exist_ok=True)
    MANIFEST.write_text(json.dumps({"about": "inputs the fuzzer found (minimized) and the issue's cases; "
                                             "replayed by tests/test_fuzz_corpus.py",
                                    "cases": cases}, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def _template(args) -> list[str]:
    return [str(a).replace(str(ROOT), "{root}") for a in args]


MACROS = {b"@@DEEP@@": b"[" * 100_000 + b"]" * 100_000, b"@@HUGE@@": b"x" * (1 << 20)}


def expand(data: bytes) -> bytes:
    for mark, text in MACROS.items():
        data = data.replace(mark, text)
    return data


def add_case(target_name: str, data: bytes, note: str, case_id: str | None = None,
             xfail: str | None = None, expect: dict | None = None) -> dict:
    """Add one input of a target (or an option) to the corpus, unless the same bytes are there already."""
    digest = hashlib.sha256(data).hexdigest()[:10]
    cases = load()
    case_id = case_id or f"{target_name}-{digest}"
    if any(c["id"] == case_id for c in cases):
        return next(c for c in cases if c["id"] == case_id)
    options = dict(OPTION_TARGETS)
    if target_name in options:
        case = {"id": case_id, "option": target_name, "file": f"cases/{case_id}.txt",
                "args": _template(options[target_name]), "app": "cachectl"}
    else:
        t = next(t for t in TARGETS if t.name == target_name)
        suffix = "".join(Path(t.filename).suffixes)
        case = {"id": case_id, "target": target_name, "file": f"cases/{case_id}{suffix}", "filename": t.filename,
                "args": _template(t.args("{path}")), "app": t.app}
    case.update(note=note, xfail=xfail, expect=expect)
    for mark, text in MACROS.items():
        data = data.replace(text, mark)
    (CORPUS / "cases").mkdir(parents=True, exist_ok=True)
    (CORPUS / case["file"]).write_bytes(data)
    cases.append(case)
    save(cases)
    return case


def command_line(case: dict, path: str) -> list[str]:
    return [a.replace("{root}", str(ROOT)).replace("{path}", path) for a in case["args"]]
