"""Violations already known, whose fix belongs to code another change is rewriting.

Each is kept in the corpus as an xfail(strict=True) case (tests/test_fuzz_corpus.py), so the fix shows as an
XPASS that fails the run: then delete the case's ``xfail`` and its entry here. The generated fuzz tests
tolerate only these, matched by target and message; anything else fails them.
"""

from __future__ import annotations

import fnmatch
import re

INPUTS = "inputs rewrite (cachectl/inputs.py)"
PROMPTCACHE = "promptcache rewrite (cachectl/engines/provider/cache.py)"
KV_CLI = "issue 12 (cachectl/cli/kv_inspect.py)"
TEMPLATES = "issue 11 (template lint in cachectl/engines/lint/)"
LINT_BODIES = "lint body reading (lead: lint_paths and the body rules in cachectl/engines/lint/)"

#: (target glob, regex on the violation, owner and reason)
KNOWN: list[tuple[str, str, str]] = [
    # The inputs rewrite (one canonical request, bounded JSON), the promptcache and lint-body rewrites on it,
    # and the template/tokenization fixes closed every other entry; the corpus cases stay as regressions.
    ("diff-tokens.chat-template", r"internal error reached \((RecursionError|MemoryError)",
     "issue 11 (cachectl/tokenization.py): the chat template sandbox does not bound recursion or repetition"),
]


def known(target: str, violation: str, stderr: str = "") -> str | None:
    """The reason a violation (with the command's stderr) is known, or None when it is new."""
    for glob, pattern, reason in KNOWN:
        if fnmatch.fnmatch(target, glob) and re.search(pattern, f"{violation} {stderr}", re.S):
            return reason
    return None
