"""Violations already known, whose fix belongs to code another change is rewriting.

Each is kept in the corpus as an xfail(strict=True) case (tests/test_fuzz_corpus.py), so the fix shows as an
XPASS that fails the run: then delete the case's ``xfail`` and its entry here. The generated fuzz tests
tolerate only these, matched by target and message; anything else fails them.
"""

from __future__ import annotations

import fnmatch
import re

INPUTS = "inputs rewrite (cachectl/inputs.py)"
PROMPTCACHE = "promptcache rewrite (cachectl/engines/promptcache.py)"
KV_CLI = "issue 12 (cachectl/cli/kv_inspect.py)"
TEMPLATES = "issue 11 (template lint in cachectl/engines/lint.py)"
LINT_BODIES = "lint body reading (lead: lint_paths and the body rules in cachectl/engines/lint.py)"

#: (target glob, regex on the violation, owner and reason)
KNOWN: list[tuple[str, str, str]] = [
    ("*", r"internal error reached \(RecursionError: maximum recursion depth exceeded while decoding a JSON",
     f"{INPUTS}: parse_json_document uses json.loads, which recurses once per nesting level"),
    ("diff-tokens.*", r"internal error reached \((TypeError|AttributeError)",
     f"{INPUTS}: prompt_from_value and _detect_chat_flavour walk fields without checking their types"),
    ("simulate-prefix.text", r"internal error reached \((TypeError|AttributeError)",
     f"{INPUTS}: prompt_from_value and _detect_chat_flavour walk fields without checking their types"),
    ("prompt-cost.*", r"does not name the input .*cachectl: error: unknown model",
     f"{PROMPTCACHE}: a line's model is not checked to be a string, and the unknown-model error has no file:line"),
    ("prompt-cost.requests", r"internal error reached",
     f"{PROMPTCACHE}: request_from_value and the body readers index fields without checking their types"),
    ("prompt-cost.usage", r"internal error reached",
     f"{PROMPTCACHE}: usage_from_record indexes fields without checking their types"),
    ("lint.template", r"internal error reached \((RecursionError|MemoryError|OverflowError)",
     f"{TEMPLATES}: the Jinja sandbox renders unbounded recursion, repetition and nesting"),
    ("lint.yaml", r"internal error reached \(RecursionError",
     f"{LINT_BODIES}: yaml.safe_load recurses once per nesting level"),
    ("lint.body", r"internal error reached \((TypeError|AttributeError|KeyError|IndexError|ValueError)",
     f"{LINT_BODIES}: lint_body walks fields without checking their types"),
    ("lint.yaml", r"internal error reached \((TypeError|AttributeError|KeyError|IndexError|ValueError)",
     f"{LINT_BODIES}: lint_body walks fields without checking their types"),
    ("lint.tokenizer-config", r"internal error reached \((RecursionError|AttributeError|TypeError)",
     f"{LINT_BODIES} / {TEMPLATES}: a chat_template entry that is not a string, or nested too deeply"),
    ("lint.tokenizer-config", r"the error names line \d+ of an input of",
     f"{TEMPLATES}: a Jinja error inside chat_template is reported at the template's line, not the file's"),
    ("diff-tokens.chat-template", r"does not name the input",
     "issue 11 (cachectl/tokenization.py): a --chat-template that does not parse is blamed on the prompt file"),
    ("diff-tokens.chat-template", r"internal error reached \((RecursionError|MemoryError)",
     "issue 11 (cachectl/tokenization.py): the chat template sandbox does not bound recursion or repetition"),
    ("--context", r"internal error reached \(OverflowError: cannot convert float infinity",
     f"{KV_CLI}: _contexts turns 1e309 or inf into int(inf)"),
]


def known(target: str, violation: str, stderr: str = "") -> str | None:
    """The reason a violation (with the command's stderr) is known, or None when it is new."""
    for glob, pattern, reason in KNOWN:
        if fnmatch.fnmatch(target, glob) and re.search(pattern, f"{violation} {stderr}", re.S):
            return reason
    return None
