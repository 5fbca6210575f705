"""A log measured before and after its fixes, by the existing engines: the vLLM prefix-cache replay, the provider
prompt-cache simulation, and the tokens each request shares with the previous request of its conversation.

``measure(lines, grouping, *, tokenizer=None, table=None, block_size=16, capacity_blocks=None, ...) -> (Measure,
notes)``; ``fix_log`` measures the log before and after (and once per fix code, for the tokens reused per cause).
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import InputError, UsageError
from ...inputs import PromptInput
from ...spool import DigestTable, content_digest
from .groups import Grouping, LogLine
from .store import CACHE, Spool


@dataclass(frozen=True)
class VllmMeasure:
    policy: str
    block_size: int
    capacity_blocks: int | None
    requests: int
    query_tokens: int
    hit_tokens: float
    hit_rate: float | None


@dataclass(frozen=True)
class ProviderMeasure:
    requests: int
    cache_read_tokens: int
    cache_write_tokens: int
    input_tokens: int
    cost_usd: float
    uncached_cost_usd: float
    hit_rate: float | None
    skipped: int = 0


@dataclass(frozen=True)
class Measure:
    """One log measured by the existing engines."""

    vllm: VllmMeasure | None
    provider: ProviderMeasure | None
    #: tokens each request shares as a prefix with the previous request of its conversation, summed
    pair_reused_tokens: int | None
    pair_tokens: int | None
    #: diff-tokens causes of the pairs that diverge, counted
    causes: dict = field(default_factory=dict)
    #: the no-eviction replay (the ceiling) beside ``vllm`` when that one runs at a capacity; None otherwise
    vllm_no_eviction: VllmMeasure | None = None



def _prompt_key(p: PromptInput) -> int:
    """A 64-bit digest of what the tokenizer sees of a prompt (its content, key order and types included)."""
    got = content_digest(p.kind, p.text, p.messages, p.tools, p.ids, size=8)
    if got is None:  # (a value pickle refuses: its JSON, as far as it goes)
        text = json.dumps([p.kind, p.text, p.messages, p.tools, p.ids], ensure_ascii=False, default=str)
        got = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(got, "little")


#: lines tokenized at a time (the tokenizer runs a batch in parallel)
BATCH = 256


class TokenMemo:
    """Prompt digest -> its compact tokenization, for a log tokenized more than once (the before/after and per-fix
    measures share most lines): the last :data:`~.store.CACHE` in memory, every one as its IDs and rendered text
    in a spool on disk (a :class:`~cachectl.spool.DigestTable` entry in memory, 16 to 24 bytes), made again from
    them when asked for."""

    def __init__(self) -> None:
        self._hot: OrderedDict[int, Any] = OrderedDict()
        self._disk = DigestTable()
        self._spool: Spool | None = None

    def get(self, key: int, prompt: PromptInput, tokenizer: Any, add_generation_prompt: bool) -> Any:
        got = self._hot.get(key)
        if got is not None:
            self._hot.move_to_end(key)
            return got
        k = self._disk.get(key)
        if k is None:
            return None
        assert self._spool is not None
        ids, text = self._spool.get(k)
        got = tokenizer.tokenized_again(prompt, ids, text, add_generation_prompt=add_generation_prompt)
        self._keep(key, got)
        return got

    def put(self, key: int, t: Any) -> None:
        if self._spool is None:
            self._spool = Spool()
        self._disk[key] = self._spool.put((t.ids.tobytes() if isinstance(t.ids, array) else array("I", t.ids).tobytes(),
                                           t.text))
        self._keep(key, t)

    def _keep(self, key: int, t: Any) -> None:
        self._hot[key] = t
        if len(self._hot) > CACHE:
            self._hot.popitem(last=False)


def _tokenized(lines: Sequence[LogLine], tokenizer: Any, add_generation_prompt: bool,
               memo: TokenMemo | None = None) -> Iterator[Any]:
    """Tokenized prompts, one batch of lines at a time, each compacted to its IDs and rendered text (about 4 bytes
    per token, not a full ``Encoding``'s hundred; offsets come back on first use). With ``memo``
    (:class:`TokenMemo`), a prompt tokenized before (the same content, key order included) is not tokenized
    again."""
    for start in range(0, len(lines), BATCH):
        batch = lines[start:start + BATCH]
        if memo is None:
            for t in tokenizer.tokenize_many([ln.prompt for ln in batch], add_generation_prompt=add_generation_prompt):
                yield t.compact()
            continue
        keys = [_prompt_key(ln.prompt) for ln in batch]
        found = {k: memo.get(k, ln.prompt, tokenizer, add_generation_prompt) for k, ln in zip(keys, batch)}
        todo = {k: ln.prompt for k, ln in zip(keys, batch) if found[k] is None}
        if todo:
            for k, t in zip(todo, tokenizer.tokenize_many(list(todo.values()),
                                                          add_generation_prompt=add_generation_prompt)):
                found[k] = t.compact()
                memo.put(k, found[k])
        for k in keys:
            yield found[k]


def measure(lines: Sequence[LogLine], grouping: Grouping, *, tokenizer: Any = None, table: Any = None,
            block_size: int = 16, capacity_blocks: int | None = None, add_generation_prompt: bool = True,
            source: str = "", causes: bool = True, memo: TokenMemo | None = None,
            counter: Any = None, progress: Callable[[int], None] | None = None,
            provider: ProviderMeasure | None = None) -> tuple[Measure, list[str]]:
    """A log measured by the existing engines: the vLLM replay (:func:`cachectl.engines.prefix.simulate`; with
    ``capacity_blocks`` None, no eviction), the provider cache
    (:func:`cachectl.engines.provider.cache.simulate_requests`), and the token prefix each request shares with the
    previous one of its conversation (with the diff-tokens cause where they diverge). ``progress(n)`` is called
    as lines are tokenized. ``provider``: the provider cache already simulated over these very requests
    (:func:`provider_measure`), not simulated again."""
    from .. import tokendiff
    from ..prefix.replay import simulate
    from ..prefix.trace import TraceRequest
    from ..provider import cache as promptcache

    notes: list[str] = []
    vllm = ceiling = None
    pair_reused = pair_tokens = None
    cause_count: dict[str, int] = {}
    if tokenizer is not None:
        # one pass: each request replayed and compared as it is tokenized; a conversation's last request is
        # kept only until its conversation has no line left
        ends = grouping.last_indices()
        pair = {"reused": 0, "tokens": 0}
        last: dict[int, Any] = {}

        def trace() -> Iterator[TraceRequest]:
            for k, (ln, t, g) in enumerate(zip(lines, _tokenized(lines, tokenizer, add_generation_prompt, memo),
                                               grouping.groups)):
                yield TraceRequest(index=k, line=ln.line, prompt_tokens=len(t.ids), tokens=t.ids,
                                   timestamp=ln.timestamp)
                prev = last.pop(g, None)
                if ends[g] != k:
                    last[g] = t
                if progress is not None:
                    progress(1)
                if prev is None:
                    continue
                c = tokendiff.common_prefix_length(prev.ids, t.ids)
                pair["reused"] += c
                pair["tokens"] += len(t.ids)
                if causes and c < min(len(prev.ids), len(t.ids)):  # (diff-tokens' cause, without its windows)
                    cause = tokendiff.explain(prev, t, c, tokenizer)
                    cid = cause.id if cause is not None else "unexplained"
                    cause_count[cid] = cause_count.get(cid, 0) + 1

        policy = "vllm" if capacity_blocks is not None else "infinite"
        r = simulate(trace(), policy=policy, block_size=block_size, capacity_blocks=capacity_blocks, source=source,
                     compact=True)
        vllm = VllmMeasure(policy, r.block_size, r.capacity_blocks, r.requests, r.query_tokens, r.hit_tokens,
                           r.hit_rate)
        if capacity_blocks is not None:  # the ceiling too: what the log's shared prefix is worth without eviction
            again = (TraceRequest(index=k, line=ln.line, prompt_tokens=len(t.ids), tokens=t.ids, timestamp=ln.timestamp)
                     for k, (ln, t) in enumerate(zip(lines, _tokenized(lines, tokenizer, add_generation_prompt, memo))))
            inf = simulate(again, policy="infinite", block_size=block_size, source=source, compact=True)
            ceiling = VllmMeasure("infinite", inf.block_size, None, inf.requests, inf.query_tokens, inf.hit_tokens,
                                  inf.hit_rate)
        pair_reused, pair_tokens = pair["reused"], pair["tokens"]
    counted = [0]  # the requests simulated (the lines without a request body are not)

    def reqs() -> Iterator[Any]:
        for ln in lines:
            if ln.request is not None:
                counted[0] += 1
                yield ln.request

    any_req = provider is None and next(reqs(), None) is not None
    if any_req and table is not None and tokenizer is None and any(p.tokens is None for r in reqs()
                                                                   for p in r.positions):
        notes.append("the provider cache simulation needs token counts: pass `tokenizer`")
    elif any_req and table is not None:
        if counter is None and tokenizer is not None:
            counter = promptcache.tokenizer_counter(tokenizer)
        try:
            counted[0] = 0
            rep = promptcache.simulate_requests(reqs(), table=table, source=source, text_counter=counter,
                                                every=None, token_source="tokenizer", keep_requests=False)
        except (InputError, UsageError) as exc:
            notes.append(f"provider cache not simulated: {exc}")
        else:
            provider = provider_measure(rep, counted[0], len(lines) - counted[0])
    return Measure(vllm, provider, pair_reused, pair_tokens, cause_count, ceiling), notes


def provider_measure(rep: Any, requests: int, skipped: int = 0) -> ProviderMeasure:
    """A provider simulation's report (:func:`cachectl.engines.provider.cache.simulate_requests`) of ``requests``
    requests as a measure (``skipped``: the lines without a request body)."""
    t = rep.totals
    return ProviderMeasure(requests, int(t.get("cache_read_input_tokens", 0)), int(t.get("cache_creation_input_tokens", 0)),
                           int(t.get("input_tokens", 0)), rep.total_cost_usd, rep.uncached_cost_usd, rep.hit_rate,
                           skipped)
