"""Where two prompts stop matching in token space, and why.

The core is :func:`common_prefix_length`; :func:`diff_tokens` builds the full report for two tokenized
prompts (windows, locations, a cause hint), :func:`diff_log` streams a JSONL log pairing each request with
the previous one of its conversation, and :func:`check_stability` checks that a chat template renders each
conversation prefix as a token prefix of the next turn.
"""

from __future__ import annotations

import json
import queue
import re
import threading
from collections import Counter
from itertools import islice
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Container, Iterable, Iterator, Sequence

from ..errors import CachectlError, InputError, UsageError
from ..inputs import LogRecord, PromptInput
from ..tokenization import Location, Span, TokenizerHandle, Tokenized

SCHEMA_VERSION = 1
IDENTICAL, A_PREFIX_OF_B, B_PREFIX_OF_A, MISMATCH = "identical", "a_prefix_of_b", "b_prefix_of_a", "mismatch"


# ------------------------------------------------------------------------------------------- core


def common_prefix_length(a: Sequence, b: Sequence) -> int:
    """Length of the longest common prefix of two sequences (token IDs, or strings).

    Slice comparisons run in C; the search halves the unresolved range each step and compares only
    that range, so the total work is linear in the prefix length.
    """
    if type(a) is not type(b):  # a list against an array or a tuple: compare as lists
        a, b = list(a), list(b)
    if len(a) > len(b):
        a, b = b, a
    n = len(a)
    if a == b[:n]:  # the common case in a conversation: one extends the other
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo]; a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def classify(len_a: int, len_b: int, common: int) -> tuple[str, int | None]:
    """``(kind, first_diff_index)`` from the lengths and the common prefix length."""
    if common == len_a == len_b:
        return IDENTICAL, None
    if common == len_a:
        return A_PREFIX_OF_B, common
    if common == len_b:
        return B_PREFIX_OF_A, common
    return MISMATCH, common


# ---------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Cause:
    id: str
    message: str


@dataclass(frozen=True)
class Side:
    source: str
    input_kind: str
    tokens: int
    window_start: int
    window_ids: tuple[int, ...]
    window_tokens: tuple[str, ...]
    location: Location | None
    line: int | None = None


@dataclass(frozen=True, kw_only=True)
class TokenDiff:
    schema_version: int = SCHEMA_VERSION
    kind: str
    first_diff_index: int | None
    common_prefix_tokens: int
    tokens_a: int
    tokens_b: int
    block_size: int
    reusable_blocks: int
    a: Side
    b: Side
    cause: Cause | None

    @property
    def differs(self) -> bool:
        return self.kind != IDENTICAL

    def to_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------------------- visible


_VISIBLE = str.maketrans({" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍", "\u00a0": "⍽"})


def visible(text: str) -> str:
    """Make whitespace visible: space ␣, newline ↵, tab ⇥, carriage return ␍, no-break space ⍽."""
    return text.translate(_VISIBLE)


def _side(t: Tokenized, index: int | None, context: int, other: Tokenized, common: int) -> Side:
    if index is None:
        return Side(source=t.prompt.source, line=t.prompt.line, input_kind=t.prompt.kind, tokens=len(t),
                    window_start=0, window_ids=(), window_tokens=(), location=None)
    start = max(0, index - context)
    stop = min(len(t), index + context + 1)
    # Inside the common prefix both sides hold the same tokens: read their text from whichever side still
    # has its offsets, so that a compacted prompt is re-encoded only when it really diverges.
    shared = other if t.encoding is None and other.encoding is not None else t
    texts = tuple(visible((shared if i < common else t).token_text(i)) for i in range(start, stop))
    return Side(source=t.prompt.source, line=t.prompt.line, input_kind=t.prompt.kind, tokens=len(t),
                window_start=start, window_ids=tuple(t.ids[start:stop]), window_tokens=texts,
                location=t.location(index))


def diff_tokens(a: Tokenized, b: Tokenized, *, block_size: int = 16, context: int = 6,
                tokenizer: TokenizerHandle | None = None) -> TokenDiff:
    """Compare two tokenized prompts: where reuse stops, what surrounds it, and a likely cause."""
    if block_size < 1:
        raise UsageError("--block-size must be at least 1")
    if context < 0:
        raise UsageError("--context must not be negative")
    common = common_prefix_length(a.ids, b.ids)
    kind, index = classify(len(a), len(b), common)
    cause = explain(a, b, index, tokenizer) if kind == MISMATCH and index is not None else None
    return TokenDiff(kind=kind, first_diff_index=index, common_prefix_tokens=common, tokens_a=len(a),
                     tokens_b=len(b), block_size=block_size, reusable_blocks=common // block_size,
                     a=_side(a, index, context, b, common), b=_side(b, index, context, a, common),
                     cause=cause)


# ----------------------------------------------------------------------------------------- causes
#
# Each check names a cause only when the two prompts (and, for chat prompts, counterfactual renders of
# them through the same template) prove it: a default system prompt is one the template writes when the
# system message is left out; a stripped reasoning span is one A's render holds and B's does not; a token
# boundary is text that agrees through the divergence while the tokens do not.


def _char_span(t: Tokenized, index: int) -> tuple[int, int] | None:
    if index < len(t):
        return t.char_range(index)
    if t.text is not None:  # past the end: the end of the text
        return len(t.text), len(t.text)
    return None


def _has_system(p: PromptInput) -> bool:
    if not p.messages:
        return False
    return p.messages[0].get("role") in ("system", "developer")


def explain(a: Tokenized, b: Tokenized, index: int, tokenizer: TokenizerHandle | None = None) -> Cause | None:
    """The known pitfall that explains a divergence at ``index``, or None when none is shown."""
    for check in (_bos, _tools, _default_system, _think, _relocated, _last_turn, _volatile, _unicode, _json_key_order,
                  _whitespace, _token_boundary, _history, _system_changed):
        cause = check(a, b, index, tokenizer)
        if cause is not None:
            return cause
    return None


def _bos(a, b, index, tokenizer) -> Cause | None:
    if index > 1:
        return None
    bos = tokenizer.bos_token_id if tokenizer is not None else None
    for x, y, nx in ((a, b, "A"), (b, a, "B")):
        if len(x) < 2 or not len(y):
            continue
        cand = bos if bos is not None else x.ids[0]
        doubled_x = x.ids[0] == x.ids[1] == cand
        doubled_y = len(y) > 1 and y.ids[0] == y.ids[1] == cand
        if doubled_x and not doubled_y and y.ids[0] == cand and index == 1:
            what = f"BOS ({tokenizer.id_text(cand)!s})" if bos is not None else f"token {cand} (likely BOS)"
            return Cause("doubled_bos", f"{nx} starts with two copies of {what}: the prompt text already "
                         "contains BOS and encoding added another. Encode rendered chat text with "
                         "add_special_tokens=False, or tokenize through the chat template.")
    if bos is not None and index == 0 and len(a) and len(b) and (a.ids[0] == bos) != (b.ids[0] == bos):
        nx = "A" if a.ids[0] == bos else "B"
        ny = "B" if nx == "A" else "A"
        return Cause("bos_mismatch", f"{nx} starts with BOS and {ny} does not: one was encoded with special "
                     "tokens and the other without.")
    return None


def _dumps(obj: Any, sort: bool) -> str:
    return json.dumps(obj, sort_keys=sort, ensure_ascii=False)


def _in_content(t: Tokenized, index: int) -> bool:
    loc = t.location(index) if index < len(t) else None
    return bool(loc and loc.message_index is not None)


def _tools(a, b, index, tokenizer) -> Cause | None:
    ta, tb = a.prompt.tools, b.prompt.tools
    if not ta and not tb:
        return None
    if _in_content(a, index) and _in_content(b, index):
        return None
    ta, tb = list(ta or ()), list(tb or ())
    if ta == tb:
        if _dumps(ta, False) != _dumps(tb, False):
            return Cause("tool_schema_key_order", "the tool schemas are equal but their keys are serialized "
                         "in another order, and chat templates render tools with tojson, which keeps key "
                         "order: serialize tools deterministically (sorted keys, fixed order) before sending.")
        return None
    if sorted(_dumps(t, True) for t in ta) == sorted(_dumps(t, True) for t in tb):
        return Cause("tool_order", "the same tools are listed in another order: keep the tool list in a fixed "
                     "order (tools render before the messages, so everything after them misses).")
    changed = [i for i in range(max(len(ta), len(tb)))
               if i >= len(ta) or i >= len(tb) or ta[i] != tb[i]]
    return Cause("tools_changed", f"the tool definitions differ (tools[{changed[0]}]); a changed tool list "
                 "invalidates the cache for everything after it.")


def _rerender(t: Tokenized, messages: Sequence[dict], tokenizer: TokenizerHandle | None) -> str | None:
    """``t``'s chat prompt with other messages, rendered as ``t`` was (same template, tools and options)."""
    tok = tokenizer or t.tokenizer
    if tok is None or t.render_opts is None or not messages:
        return None
    try:
        return tok.render_chat(t.prompt, messages=messages,
                               add_generation_prompt=t.render_opts["add_generation_prompt"],
                               template_vars=t.render_opts["template_vars"])
    except CachectlError:
        return None


def _span_of(t: Tokenized, message_index: int) -> Span | None:
    return next((s for s in t.spans if s.message_index == message_index), None)


def _default_system(a, b, index, tokenizer) -> Cause | None:
    """Proven by rendering the side that has a system message without it: the template then writes text of
    its own exactly where that system message was, and the other side's render starts with the same text."""
    if not (a.prompt.is_chat and b.prompt.is_chat) or a.text is None or b.text is None:
        return None
    sa, sb = _has_system(a.prompt), _has_system(b.prompt)
    if sa == sb:
        return None
    x, y, nx, ny = (b, a, "B", "A") if sa else (a, b, "A", "B")
    span = _span_of(y, 0)
    without = _rerender(y, y.prompt.messages[1:], tokenizer)
    if span is None or without is None:
        return None
    left, right = y.text[:span.start], y.text[span.end:]
    if not (without.startswith(left) and without.endswith(right) and len(without) >= len(left) + len(right)):
        return None
    injected = without[len(left):len(without) - len(right)]
    c = common_prefix_length(a.text, b.text)
    if not injected.strip() or not x.text.startswith(left + injected):
        return None
    if not len(left) <= c <= len(left) + len(injected):  # the prompts part elsewhere
        return None
    shown = injected.strip()[:60] + ("..." if len(injected.strip()) > 60 else "")
    return Cause("default_system_prompt", f"{nx} has no system message, so the chat template inserted its default "
                 f"system prompt ({shown!r}) where {ny} has its own: send the same system message every time.")


def _relocated(a, b, index, tokenizer) -> Cause | None:
    """A message both prompts hold unchanged, rendered at another place in one of them (Mistral's templates put
    the system prompt into the last user turn, which moves with every new turn)."""
    if not (a.prompt.is_chat and b.prompt.is_chat) or index >= len(a) or index >= len(b):
        return None
    for x, y, nx, ny in ((a, b, "A", "B"), (b, a, "B", "A")):
        rng = x.char_range(index)
        if rng is None:
            continue
        here = next((s for s in x.spans if s.message_index is not None and s.start <= rng[0] < s.end), None)
        if here is None:
            continue
        m = here.message_index
        if m >= len(y.prompt.messages) or y.prompt.messages[m] != x.prompt.messages[m]:
            continue
        whole = str(x.prompt.messages[m].get("content") or "").strip()
        there = [s for s in y.spans if s.message_index == m and y.text[s.start:s.end].strip() == whole]
        if x.text[here.start:here.end].strip() != whole or not there or any(s.start == here.start for s in there):
            continue  # only whole renders of the message count: a template that cuts a part off is no move
        role = x.prompt.messages[m].get("role")
        return Cause("message_relocated", f"message {m} ({role}) is the same in both prompts, but the chat template "
                     f"renders it at char {here.start} in {nx} and at char {there[0].start} in {ny}: it moves as "
                     "turns are added (Mistral's templates put the system prompt into the last user turn), so the "
                     "history re-renders every turn. Put such text where it stays (the first user turn), or use a "
                     "template that keeps it in place.")
    return None


def _last_turn(a, b, index, tokenizer) -> Cause | None:
    """One prompt ends with an assistant turn that the other holds unchanged and follows with more turns, and the
    renders part right after that turn's content: the template closes a final turn otherwise than a turn in
    the history (gpt-oss: <|return|> then <|end|>; templates that append EOS after the last turn)."""
    if not (a.prompt.is_chat and b.prompt.is_chat) or a.text is None or b.text is None:
        return None
    c = common_prefix_length(a.text, b.text)
    for x, y, nx, ny in ((a, b, "A", "B"), (b, a, "B", "A")):
        n = len(x.prompt.messages)
        last = x.prompt.messages[-1] if n else None
        if last is None or last.get("role") != "assistant" or n >= len(y.prompt.messages) \
                or y.prompt.messages[n - 1] != last:
            continue
        ends = [s.end for s in x.spans if s.message_index == n - 1]
        if not ends or c < max(ends) or any(max(ends) <= s.start < c for s in x.spans):
            continue
        tail_x, tail_y = x.text[c:c + 24], y.text[c:c + 24]
        return Cause("last_turn_closed_differently", f"{nx} ends with an assistant turn (message {n - 1}) and {ny} "
                     f"holds the same turn with more after it, but the chat template closes the final turn "
                     f"({tail_x!r}) otherwise than a turn in the history ({tail_y!r}): a render that ends with an "
                     "assistant turn is no prefix of the next request. What a server caches ends with the "
                     "generation prompt: compare those renders, or expect this miss at every turn.")
    return None


_THINK = re.compile(r"<think>(.*?)</think>", re.S)


def _reasoning(msg: dict) -> str | None:
    rc = msg.get("reasoning_content")
    if isinstance(rc, str) and rc.strip():
        return rc.strip()
    content = msg.get("content")
    if isinstance(content, str):
        m = _THINK.search(content)
        if m and m.group(1).strip():
            return m.group(1).strip()
    return None


def _think(a, b, index, tokenizer) -> Cause | None:
    """A reasoning span of an assistant turn that A's render holds and B's does not (or the reverse)."""
    if not (a.prompt.is_chat and b.prompt.is_chat) or a.text is None or b.text is None:
        return None
    c = common_prefix_length(a.text, b.text)
    for x, y, nx, ny in ((a, b, "A", "B"), (b, a, "B", "A")):
        for m, msg in enumerate(x.prompt.messages):
            if msg.get("role") != "assistant" or m >= len(y.prompt.messages):
                continue
            other = y.prompt.messages[m]
            r = _reasoning(msg)
            if other.get("role") != "assistant" or r is None:
                continue
            pos = x.text.find(r)
            if pos < 0 or r in y.text or c > pos + len(r):
                continue
            how = ("the chat template dropped it (Qwen3's and DeepSeek-R1's templates strip reasoning from "
                   "assistant turns before the last user turn)" if _reasoning(other) == r
                   else f"the history sent in {ny} no longer carries it")
            return Cause("think_stripped", f"the reasoning of message {m} (assistant) is in {nx}'s render and gone "
                         f"from {ny}'s: {how}, so the history re-renders differently. Keep reasoning out of the "
                         "history, or in it, consistently.")
        # x ends with a generation prompt that opens a reasoning block; y holds the answer, with reasoning, and
        # renders it without one (DeepSeek-R1's template: the prompt ends in <think>, history has none)
        m = len(x.prompt.messages)
        if x.render_opts and x.render_opts.get("add_generation_prompt") and m < len(y.prompt.messages):
            other = y.prompt.messages[m]
            r = _reasoning(other)
            if (other.get("role") == "assistant" and r is not None and r not in y.text
                    and "<think>" in x.text[c:] and "<think>" not in y.text[c:]):
                return Cause("think_stripped", f"{nx} ends with a generation prompt that opens a <think> block, and "
                             f"{ny} renders that answer (message {m}) without its reasoning: the chat template drops "
                             "reasoning from assistant turns in the history (DeepSeek-R1's does), so the tokens "
                             "generated after the prompt never match the next request. Expect this miss, or keep "
                             "reasoning out of the generation.")
    return None


def _volatile(a, b, index, tokenizer) -> Cause | None:
    """A per-request value (date, time, id, counter) on both sides where the texts diverge."""
    from ..volatile import classify_change

    if a.text is None or b.text is None:
        return None
    c = common_prefix_length(a.text, b.text)
    if c == len(a.text) or c == len(b.text):
        return None
    pair = classify_change(a.text, b.text, c)
    if pair is None:
        return None
    va, vb = pair
    where = a.location(index).describe() if index < len(a) else "the end of A"
    if va.is_date_time and vb.is_date_time:
        return Cause("date_time", f"a date or time differs ({va.text!r} vs {vb.text!r}, at {where}): move volatile "
                     "values after the cached prefix (the end of the prompt), or pin them per day.")
    if va.kind == "counter":
        return Cause("counter", f"a number that changes per request differs ({va.text!r} vs {vb.text!r}, at {where}):"
                     " a counter (turn, attempt, sequence number) in the prefix makes every request new; move it "
                     "to the end of the prompt or drop it.")
    return Cause("volatile_id", f"an id that changes per request differs ({va.text!r} vs {vb.text!r}, {va.kind}): "
                 "keep request, trace and user ids out of the cached prefix.")


def _unicode(a, b, index, tokenizer) -> Cause | None:
    """The texts differ here but agree once both are NFC-normalized: the same characters, composed differently."""
    import unicodedata

    if a.text is None or b.text is None:
        return None
    c = common_prefix_length(a.text, b.text)
    s = max(0, c - 8)  # a base character before a combining mark
    wa, wb = a.text[s:s + 400], b.text[s:s + 400]
    if wa == wb:
        return None
    na, nb = unicodedata.normalize("NFC", wa), unicodedata.normalize("NFC", wb)
    agree = common_prefix_length(na, nb)
    need = min(len(na) - 2, len(nb) - 2, (c - s) + 16)
    if agree <= c - s or agree < need:
        return None

    def form(w: str) -> str:
        return next((f for f in ("NFC", "NFD") if unicodedata.is_normalized(f, w)), "mixed")

    return Cause("unicode_normalization", f"the texts are the same characters in another Unicode normalization "
                 f"(A {form(wa)}, B {form(wb)}, at {visible(na[c - s:c - s + 12])!r}): normalize text (NFC) before "
                 "it reaches the prompt.")


def _json_key_order(a, b, index, tokenizer) -> Cause | None:
    """JSON inside a message that parses to the same value on both sides, with its keys in another order."""
    if a.text is None or b.text is None:
        return None
    c = common_prefix_length(a.text, b.text)
    decoder = json.JSONDecoder()
    lo = max(0, c - 4000)
    starts = [i for i in range(c - 1, lo - 1, -1) if a.text[i] in "{["][:64]
    for start in starts:  # innermost first
        try:
            va, ea = decoder.raw_decode(a.text, start)
            vb, eb = decoder.raw_decode(b.text, start)
        except ValueError:
            continue
        if ea <= c and eb <= c:
            continue  # ends before the divergence
        if va != vb:
            return None  # the innermost JSON around the divergence holds other values: not a key order
        if _dumps(va, False) != _dumps(vb, False):
            where = a.location(index).describe() if index < len(a) else "the end of A"
            return Cause("json_key_order", f"JSON embedded in the prompt ({where}) holds the same values with its "
                         "keys in another order: serialize it deterministically (sorted keys) before putting it in "
                         "a message.")
        return None
    return None


def _text_divergence(a: Tokenized, b: Tokenized, index: int) -> tuple[int, int, int, int] | None:
    """``(token_start, end_a, end_b, char_divergence)`` when both divergent tokens start at the same character
    after identical text, else None."""
    if a.text is None or b.text is None:
        return None
    ra, rb = _char_span(a, index), _char_span(b, index)
    if ra is None or rb is None or ra[0] != rb[0] or a.text[:ra[0]] != b.text[:rb[0]]:
        return None
    cp = ra[0] + common_prefix_length(a.text[ra[0]:ra[0] + 4096], b.text[rb[0]:rb[0] + 4096])
    return ra[0], ra[1], rb[1], cp


_WS = re.compile(r"\s+")


def _whitespace(a, b, index, tokenizer) -> Cause | None:
    div = _text_divergence(a, b, index)
    if div is None:
        return None
    cp = div[3]
    xa, xb = a.text[cp:cp + 200], b.text[cp:cp + 200]
    if not (xa[:1].isspace() or xb[:1].isspace()):
        return None
    na, nb = _WS.sub("", xa), _WS.sub("", xb)
    k = min(len(na), len(nb), 40)
    if na[:k] == nb[:k] and (k > 0 or (not na and not nb)):
        wa = visible(xa[:len(xa) - len(xa.lstrip())][:12])
        wb = visible(xb[:len(xb) - len(xb.lstrip())][:12])
        return Cause("whitespace", f"the prompts differ only in whitespace here (A {wa!r} vs B {wb!r}): "
                     "normalize whitespace (trailing newlines, indentation, double spaces) before sending.")
    return None


def _token_boundary(a, b, index, tokenizer) -> Cause | None:
    """The texts agree through both divergent tokens (as far as both texts go), and the tokens do not."""
    div = _text_divergence(a, b, index)
    if div is None:
        return None
    start, end_a, end_b, cp = div
    through = min(max(end_a, end_b), len(a.text), len(b.text))
    if cp > start and cp >= through:
        same = visible(a.text[start:cp][:20])
        return Cause("token_boundary", f"the text still matches for {cp - start} more characters ({same!r}) but "
                     "the tokenizer split it differently, e.g. a trailing newline or space that merged with "
                     "what follows: end the stable part where tokens do not merge across it.")
    return None


def _history(a, b, index, tokenizer) -> Cause | None:
    if not (a.prompt.is_chat and b.prompt.is_chat) or index >= len(a) or index >= len(b):
        return None
    la, lb = a.location(index), b.location(index)
    if la.message_index is None or la.message_index != lb.message_index:
        return None
    m = la.message_index
    if m < len(a.prompt.messages) - 1 and m < len(b.prompt.messages) - 1 and la.role != "system":
        return Cause("history_edited", f"message {m} ({la.role}) differs although newer messages follow it in "
                     "both prompts: the history was edited, summarised or truncated. Append-only history keeps "
                     "the prefix cache.")
    return None


def _system_changed(a, b, index, tokenizer) -> Cause | None:
    if index >= len(a) or index >= len(b):
        return None
    la, lb = a.location(index), b.location(index)
    if la.role in ("system", "developer") and lb.role == la.role:
        return Cause("system_prompt_changed", "the system prompt differs between the two requests: everything "
                     "after it misses. Keep per-request values out of the system prompt.")
    return None



# ---------------------------------------------------------------------------------------- batch log


_DIFF_FIELDS = tuple(f.name for f in fields(TokenDiff))


@dataclass(frozen=True)
class PairResult:
    line_a: int
    line_b: int
    key: Any
    diff: TokenDiff

    def to_dict(self) -> dict:
        return {"record": "pair", "schema_version": SCHEMA_VERSION, "line_a": self.line_a,
                "line_b": self.line_b, "key": self.key, **self.diff.to_dict()}

    def to_json_obj(self) -> dict:
        """Like :meth:`to_dict` but shallow: nested dataclasses stay objects (orjson writes them)."""
        d = self.diff
        return {"record": "pair", "schema_version": SCHEMA_VERSION, "line_a": self.line_a, "line_b": self.line_b,
                "key": self.key, **{f: getattr(d, f) for f in _DIFF_FIELDS}}


@dataclass(frozen=True, kw_only=True)
class LogSummary:
    schema_version: int = SCHEMA_VERSION
    requests: int
    conversations: int
    pairs: int
    kinds: dict
    #: tokens an append-only successor would reuse from its predecessor: min of the two lengths
    reusable_tokens: int
    #: tokens actually shared as a prefix with the predecessor
    reused_tokens: int
    #: of those, tokens in full blocks (what a block-granular prefix cache can reuse)
    reused_block_tokens: int
    block_size: int
    reuse_ratio: float | None
    divergence_histogram: tuple[dict, ...]
    top_causes: tuple[dict, ...]
    #: conversations forgotten to respect max_open (their next request started a new conversation)
    evicted_conversations: int = 0

    def to_dict(self) -> dict:
        return {"record": "summary", **asdict(self)}

    def to_json_obj(self) -> dict:
        return self.to_dict()


_BUCKETS = (0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0)


def _bucket_label(lo: float, hi: float) -> str:
    return f"{int(lo * 100)}-{int(hi * 100)}%"


class _SummaryBuilder:
    def __init__(self, block_size: int):
        self.block_size = block_size
        self.requests = 0
        self.keys: set = set()
        self.pairs = 0
        self.kinds: Counter = Counter()
        self.causes: Counter = Counter()
        self.reusable = self.reused = self.reused_blocks = 0
        self.hist = [0] * (len(_BUCKETS) - 1)
        self.evicted = 0

    def add(self, d: TokenDiff) -> None:
        self.pairs += 1
        self.kinds[d.kind] += 1
        self.reusable += min(d.tokens_a, d.tokens_b)
        self.reused += d.common_prefix_tokens
        self.reused_blocks += d.reusable_blocks * d.block_size
        if d.cause is not None:
            self.causes[d.cause.id] += 1
        if d.kind == MISMATCH and d.first_diff_index is not None:
            frac = d.first_diff_index / max(1, min(d.tokens_a, d.tokens_b))
            for i in range(len(self.hist)):
                if frac < _BUCKETS[i + 1] or i == len(self.hist) - 1:
                    self.hist[i] += 1
                    break

    def build(self) -> LogSummary:
        hist = tuple({"bucket": _bucket_label(_BUCKETS[i], _BUCKETS[i + 1]), "pairs": n}
                     for i, n in enumerate(self.hist))
        return LogSummary(requests=self.requests, conversations=len(self.keys), pairs=self.pairs,
                          kinds={k: self.kinds.get(k, 0) for k in (IDENTICAL, A_PREFIX_OF_B, B_PREFIX_OF_A, MISMATCH)},
                          reusable_tokens=self.reusable, reused_tokens=self.reused,
                          reused_block_tokens=self.reused_blocks, block_size=self.block_size,
                          reuse_ratio=(self.reused / self.reusable) if self.reusable else None,
                          divergence_histogram=hist,
                          top_causes=tuple({"cause": c, "pairs": n} for c, n in self.causes.most_common(10)),
                          evicted_conversations=self.evicted)


def _chunks(it: Iterable, size: int) -> Iterator[list]:
    chunk: list = []
    for x in it:
        chunk.append(x)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def prefetch(items: Iterator, depth: int = 2) -> Iterator:
    """Produce ``items`` in a background thread, up to ``depth`` ahead of the consumer, in order.

    An exception in the producer is raised in the consumer; closing the consumer stops the producer.
    """
    q: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()
    end = object()

    def put(entry) -> bool:
        while not stop.is_set():
            try:
                q.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def work() -> None:
        try:
            for item in items:
                if not put((True, item)):
                    return
            put((True, end))
        except BaseException as exc:  # handed to the consumer, raised there
            put((False, exc))

    thread = threading.Thread(target=work, name="cachectl-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            ok, item = q.get()
            if not ok:
                raise item
            if item is end:
                return
            yield item
    finally:
        stop.set()


def diff_log(records: Iterable[LogRecord], tokenizer: TokenizerHandle | None, *, block_size: int = 16,
             context: int = 6, add_generation_prompt: bool = False, add_special_tokens: bool = True,
             template_vars: dict | None = None, batch_size: int = 128,
             max_open: int = 10_000, keep_full: int = 64,
             end_indices: Container[int] | None = None,
             ends: Container[int] | None = None) -> Iterator[PairResult | LogSummary]:
    """Stream pairs (each request vs the previous one of its conversation), then one summary.

    Requests are tokenized in batches of ``batch_size`` (the tokenizer runs a batch in parallel). Only
    the last request of each conversation is kept, compacted to its IDs and text, and at most
    ``max_open`` conversations are remembered (least recently seen forgotten first), so memory follows
    the working set, not the log size. ``end_indices``: the places in ``records`` (counted from 0) of the requests
    that end their conversation, when the caller knows them: a conversation is forgotten at its last request, not
    kept until ``max_open`` pushes it out. (Places, not line numbers: a line may hold requests of several
    conversations, or several requests of one.) ``ends``, as before ``end_indices``: line numbers, each forgetting
    every conversation a request on that line belongs to (so a second request of one conversation on the line is
    not paired with the first).
    """
    if block_size < 1:
        raise UsageError("--block-size must be at least 1")
    if max_open < 1:
        raise UsageError("--max-open must be at least 1")
    summary = _SummaryBuilder(block_size)
    last: OrderedDict = OrderedDict()

    def tokenized_chunks() -> Iterator[tuple[list[LogRecord], list[Tokenized]]]:
        for chunk in _chunks(records, batch_size):
            prompts = [r.prompt for r in chunk]
            if tokenizer is None:
                needs = next((p for p in prompts if p.ids is None), None)
                if needs is not None:
                    raise UsageError(f"{needs.where}: a {needs.kind} prompt needs --tokenizer to become token IDs")
                yield chunk, [Tokenized(p, list(p.ids)) for p in prompts]
            else:
                # (every pair's sides locate their window's tokens: each prompt encoded with its offsets)
                yield chunk, tokenizer.tokenize_many(prompts, add_generation_prompt=add_generation_prompt,
                                                     add_special_tokens=add_special_tokens,
                                                     template_vars=template_vars, offsets=True)

    # Reading and tokenizing the next batches runs in a thread while this one compares: the Rust
    # tokenizer releases the GIL, so the comparison costs little on top of the tokenization.
    for chunk, toks in prefetch(tokenized_chunks(), depth=2):
        for rec, tok in zip(chunk, toks):
            place = summary.requests
            summary.requests += 1
            summary.keys.add(rec.key)
            prev = last.pop(rec.key, None)
            if (end_indices is None or place not in end_indices) and (ends is None or rec.line not in ends):
                last[rec.key] = tok
            # The most recently seen conversations keep their full encoding (offsets at hand for the
            # next diff); older ones are compacted to IDs and text, and re-encoded only if they diverge.
            if len(last) > keep_full:
                old_key = next(islice(reversed(last), keep_full, None))
                last[old_key] = last[old_key].compact() if last[old_key].encoding is not None else last[old_key]
            if len(last) > max_open:
                last.popitem(last=False)
                summary.evicted += 1
            if prev is None:
                continue
            d = diff_tokens(prev, tok, block_size=block_size, context=context, tokenizer=tokenizer)
            summary.add(d)
            yield PairResult(line_a=prev.prompt.line or 0, line_b=rec.line, key=rec.key, diff=d)
    yield summary.build()


# ---------------------------------------------------------------------------------------- stability


@dataclass(frozen=True)
class StabilityStep:
    k: int                   # turns[:k] rendered, compared with turns[:k+1]
    role_added: str
    tokens_prev: int
    tokens_next: int
    stable: bool
    diff: TokenDiff


@dataclass(frozen=True, kw_only=True)
class StabilityReport:
    schema_version: int = SCHEMA_VERSION
    source: str
    turns: int
    stable: bool
    first_unstable_k: int | None
    steps: tuple[StabilityStep, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict:
        return asdict(self)


def _prefix_prompt(p: PromptInput, k: int) -> PromptInput:
    return replace(p, messages=(p.messages or ())[:k], field_paths=p.field_paths[:k])


#: the longest conversation --stability checks: a render and a token diff a turn, each as long as the conversation
#: so far (1,000 messages of some 40 bytes took 24 s on a 2-core VM; 2,000 ran past a minute)
MAX_STABILITY_MESSAGES = 1000


def check_stability(prompt: PromptInput, tokenizer: TokenizerHandle, *, block_size: int = 16,
                    context: int = 6, template_vars: dict | None = None) -> StabilityReport:
    """For each k, is the render of turns[:k] a token prefix of the render of turns[:k+1]?

    A prefix ending in a user or tool message is rendered with the generation prompt (as a server
    would for the request), one ending in an assistant message without it. A template that rewrites
    history (strips reasoning, injects per-turn text) fails at the first k where it does so.
    """
    if not prompt.is_chat or prompt.messages is None:
        raise UsageError(f"{prompt.source}: --stability needs a conversation (a chat message list or a "
                         "request body), not a raw prompt")
    msgs = prompt.messages
    if len(msgs) > MAX_STABILITY_MESSAGES:
        raise InputError(f"{len(msgs):,} messages: --stability renders the conversation once a turn, so its time grows "
                         f"with the square of its length; at most {MAX_STABILITY_MESSAGES:,} (check a part of it)",
                         source=prompt.source, line=prompt.line)
    first = next((i + 1 for i, m in enumerate(msgs) if m.get("role") not in ("system", "developer")), None)
    if first is None or first >= len(msgs):
        raise UsageError(f"{prompt.source}: --stability needs at least two turns after the system message")

    def render(k: int) -> Tokenized:
        p = _prefix_prompt(prompt, k)
        gen = msgs[k - 1].get("role") != "assistant"
        return tokenizer.tokenize(p, add_generation_prompt=gen, template_vars=template_vars)

    steps = []
    prev = render(first)
    for k in range(first, len(msgs)):
        nxt = render(k + 1)
        d = diff_tokens(prev, nxt, block_size=block_size, context=context, tokenizer=tokenizer)
        stable = d.kind in (IDENTICAL, A_PREFIX_OF_B)
        steps.append(StabilityStep(k=k, role_added=str(msgs[k].get("role")), tokens_prev=len(prev),
                                   tokens_next=len(nxt), stable=stable, diff=d))
        prev = nxt
    first_bad = next((s.k for s in steps if not s.stable), None)
    return StabilityReport(source=prompt.source, turns=len(msgs), stable=first_bad is None,
                           first_unstable_k=first_bad, steps=tuple(steps))
