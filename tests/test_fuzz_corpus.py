"""Replay the kept fuzz corpus (tests/fuzz_corpus/manifest.json): each case's input through its command line.

Every case must satisfy the fuzz property (tests/fuzz/harness.py), and a case with ``expect`` must get that
answer (inputs that used to be accepted without a word). Cases whose fix belongs to code being rewritten
elsewhere are xfail(strict=True): the fix turns them into a failing XPASS, and then their ``xfail`` goes.
"""

from __future__ import annotations

import pytest

from .fuzz import corpus
from .fuzz.harness import Expect, check, invoke
from .fuzz.known import known

CASES = corpus.load()


def _param(case: dict):
    marks = [pytest.mark.xfail(strict=True, reason=case["xfail"])] if case.get("xfail") else []
    return pytest.param(case, id=case["id"], marks=marks)


def _run(case: dict, tmp_path):
    data = corpus.expand((corpus.CORPUS / case["file"]).read_bytes())
    if "option" in case:
        value = data.decode("utf-8", "surrogatepass")
        args = [a.replace("{v}", value) for a in corpus.command_line(case, "")]
        names = [case["option"], repr(value)] + ([value] if len(value.strip()) >= 4 else [])
        max_line = None
    else:
        path = tmp_path / case["filename"]
        path.write_bytes(data)
        args = corpus.command_line(case, str(path))
        names = [str(path)]
        max_line = data.count(b"\n") + 1
    return invoke(args, app=case["app"]), Expect(names=names, max_line=max_line)


def test_corpus_is_not_empty():
    assert len(CASES) >= 10
    assert len({c["id"] for c in CASES}) == len(CASES)
    for c in CASES:
        assert (corpus.CORPUS / c["file"]).is_file(), c["id"]
        assert (corpus.CORPUS / c["file"]).stat().st_size < 64 * 1024, f"{c['id']}: keep corpus files small"


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_corpus_case(case, tmp_path):
    out, expect = _run(case, tmp_path)
    check(out, expect)
    pinned = case.get("expect") or {}
    if "exit" in pinned:
        assert out.exit_code == pinned["exit"], out.describe()
    for needle in pinned.get("error_has", ()):
        assert needle in out.stderr, f"{needle!r} not in the error\n{out.describe()}"


def test_no_corpus_case_reaches_the_catch_all(tmp_path):
    """The catch-all "internal error" is a last resort: no kept input reaches it (xfail cases aside, which
    are listed in tests/fuzz/known.py with the change that fixes them)."""
    hits = []
    for case in CASES:
        out, _ = _run(case, tmp_path)
        for message in out.internal:
            if not case.get("xfail"):
                hits.append(f"{case['id']}: {message}")
            else:
                assert known(case.get("target") or case["option"], f"internal error reached ({message})",
                             out.stderr), f"{case['id']}: xfail case with an unlisted catch-all hit: {message}"
    assert hits == []


def test_the_catch_all_is_counted():
    """A bug (here: a reader app command that raises a plain exception) is counted, and still one line."""
    out = invoke(["boom"], app="readers")
    assert out.exit_code == 2
    assert out.internal == ["RuntimeError: a bug"]
    assert out.stderr.startswith("cachectl: error: internal error: RuntimeError: a bug")
    assert out.stderr.count("\n") == 1
