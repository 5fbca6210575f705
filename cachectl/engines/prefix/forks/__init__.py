"""The shared-prefix tree of a whole log: where requests that share a prefix split (forks), why, and what each
fork costs, measured by counterfactual replay.

A prefix cache is shared by all the traffic a server (or a provider) sees, so its costliest misses are often
not inside one conversation: a clock line, a request id or the user's e-mail near the top of a system prompt
that thousands of otherwise identical requests share, or tools listed in another order per request.

Library entry::

    reqs = pack_requests(iter_jsonl(path), source=path, tokenizer=tok)   # served tokens + text + fields, packed
    report = analyze_forks(reqs, tokenizer=tok, block_size=16, capacity_blocks=None)
    report.forks          # tuple[Fork, ...], sorted by tokens_lost (descending)
    report.to_dict()      # {forks: [{path, char, cause, distinct_values, requests, tokens_lost, fixable, ...}], ...}
    report.spans_to_move(reqs[3])   # the (path, char range, text) FX001/FX007 move out of that request's prefix

How it works, a module each: :mod:`.requests` (each request's served tokens, text and log fields), :mod:`.store`
(the requests kept packed),
:mod:`.tree` (the radix tree of full blocks: its forks, and the log's no-eviction hits), :mod:`.causes` (the cause
of each fork, and the fix code offered for it), :mod:`.views` (a request under a counterfactual fix), :mod:`.cost`
(what each fork costs, by counterfactual replay) and :mod:`.report` (the results).
"""

from __future__ import annotations

from typing import Any

from .causes import fix_codes
from .cost import analyze_forks
from .report import Fork, ForkReport, MoveSpan, fork_span
from .requests import USER_FIELDS, ForkRequest, canonical_tokens, fork_requests
from .store import RequestStore, pack_requests
from .tree import PrefixTree, TreeNode


def __getattr__(name: str) -> Any:
    if name == "FIX_CODES":  # the map under its old name
        return fix_codes()
    raise AttributeError(name)


__all__ = ["fix_codes", "USER_FIELDS", "Fork", "ForkReport", "ForkRequest", "MoveSpan", "PrefixTree",
           "RequestStore", "TreeNode", "analyze_forks", "canonical_tokens", "fork_requests", "fork_span",
           "pack_requests"]
