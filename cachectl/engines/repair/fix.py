"""Rewrite a logged workload so that its cacheable prefix is stable, and measure what that is worth.

Library entry (what ``cachectl fix`` and ``cachectl report`` call)::

    lines = log_lines(iter_jsonl(path), source=path, key="metadata.session")   # or key=None: grouped here
    report = fix_log(lines, FixOptions(unsafe=False), tokenizer=tok, table=PriceTable.load())
    report.fixes      # tuple[Fix, ...]: one per rewrite found (applied or not), each with code, name, safety
    report.before     # Measure: vLLM prefix hit rate, provider cache reads/writes and dollars, pair reuse
    report.after      # Measure of the rewritten log (its parts are None where they could not be measured)
    report.output     # tuple of the rewritten JSON values, one per input line, in the input's own shape
    report.grouping   # Grouping: which conversation each line belongs to, and how that was decided
    report.per_cause  # tuple[CauseGain, ...]: tokens reused per fix code (fixes applied one code at a time)

``fix_log(lines: Sequence[LogLine], options: FixOptions = FixOptions(), *, tokenizer: TokenizerHandle | None =
None, table: PriceTable | None = None, source: str = "") -> FixReport``; ``FixReport.to_dict()`` is the JSON of
``cachectl fix --format json`` (without ``output``). ``group_sessions(lines, *, key=None, window_s=1800.0,
tokenizer=None) -> Grouping`` is the automatic conversation grouping on its own.

Fix codes (stable; ``FixOptions.unsafe`` turns on the unsafe ones, as ruff's ``--unsafe-fixes``):

- ``FX001 volatile_to_end`` (unsafe): a value that changes per request (the shared detector,
  :mod:`cachectl.volatile`, confirmed by two consecutive requests of a conversation differing there) is moved
  out of the cached prefix, with the line that holds it, to the end of the request: appended to the last user
  turn when the request ends with one; otherwise a trailing system message (OpenAI Chat, Responses: the
  provider allows system messages anywhere) or a text block after the tool results (Anthropic, whose
  messages have no system role). The same rewritten turn is carried into the later requests of the
  conversation, where it is history, so the conversation stays append-only.
- ``FX002 tool_schema_sorted_keys`` (safe): a tool definition seen with its keys in another order is
  serialized with sorted keys everywhere it occurs (the same JSON value: a JSON parser reads the same schema).
- ``FX003 tool_order`` (unsafe): the same tools listed in another order are put in the order they were first
  seen in the log (the model sees them in another order, so this is labelled unsafe).
- ``FX004 doubled_bos`` (unsafe; needs a tokenizer): a raw-text prompt that starts with the BOS text, which
  encoding then doubles, loses that text (token-ID prompts lose the duplicate ID); the model then sees one
  BOS, not two.
- ``FX005 reasoning_consistent`` (safe where a tokenizer shows the render unchanged, else unsafe): an
  assistant turn whose reasoning (``<think>`` blocks, ``reasoning_content``, Anthropic thinking blocks) is
  present in some requests of a conversation and absent in others (in the body, or in the chat template's
  render) has it dropped in every request of the conversation. Anthropic thinking blocks of the current
  tool-use loop are kept (the API needs them back).
- ``FX006 cache_breakpoints`` (safe: cache_control is no content): Anthropic requests get a breakpoint on the
  last position the next request of the conversation repeats (so its write can be read), markers whose
  position the next request changes are removed, at most 4 in all, and only where the prefix up to it reaches
  the model's minimum cacheable length (price table).
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ...errors import InputError, UsageError
from ...inputs import LogRecord, PromptInput, Request, compact, get_path, parse_request, prompt_from_value
from ...inputs.request import unwrap

SCHEMA_VERSION = 1

#: code -> (name, safe by default, what it does)
FIXES: dict[str, tuple[str, bool, str]] = {
    "FX001": ("volatile_to_end", False, "move a per-request value out of the cached prefix to the end"),
    "FX002": ("tool_schema_sorted_keys", True, "serialize tool definitions with sorted keys"),
    "FX003": ("tool_order", False, "list the same tools in one order"),
    "FX004": ("doubled_bos", False, "remove a doubled BOS from a raw-text prompt"),
    "FX005": ("reasoning_consistent", False, "drop reasoning from an assistant turn consistently"),
    "FX006": ("cache_breakpoints", True, "place Anthropic breakpoints where the next request reads them"),
}
CODES = tuple(FIXES)
#: the diff-tokens causes each fix addresses
CAUSES = {
    "FX001": ("date_time", "counter", "volatile_id", "system_prompt_changed"),
    "FX002": ("tool_schema_key_order",),
    "FX003": ("tool_order",),
    "FX004": ("doubled_bos", "bos_mismatch"),
    "FX005": ("think_stripped",),
    "FX006": (),
}


# --------------------------------------------------------------------------------------------- records


@dataclass(frozen=True)
class LogLine:
    """One line of a log as read: its JSON value (rewritten in place of itself), the prompt a tokenizer renders,
    the canonical request for request bodies, its conversation key (``None``: grouped automatically)."""

    line: int
    value: Any
    prompt: PromptInput
    request: Request | None
    key: Any = None
    timestamp: float | None = None


@dataclass(frozen=True)
class Grouping:
    """Which conversation each line belongs to."""

    groups: tuple[int, ...]       # group number per line, in log order, numbered from 0 by first appearance
    count: int
    how: str                      # "key FIELD" | "automatic"
    window_s: float | None = None


@dataclass(frozen=True)
class FixOptions:
    unsafe: bool = False
    #: conversation key field (dotted path); None groups the lines automatically
    key: str | None = None
    window_s: float = 1800.0
    #: codes to consider (None: all)
    select: tuple[str, ...] | None = None
    block_size: int = 16
    #: vLLM capacity in blocks; None replays with no eviction (the ceiling)
    capacity_blocks: int | None = None
    #: price table model for lines that name none
    model: str | None = None
    add_generation_prompt: bool = True
    #: measure tokens reused per fix code (one more rewrite and tokenization per code found)
    per_cause: bool = True


@dataclass(frozen=True)
class Fix:
    code: str
    name: str
    safe: bool
    applied: bool
    line: int
    path: str
    message: str
    before: str | None = None
    after: str | None = None


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


@dataclass(frozen=True)
class CauseGain:
    code: str
    name: str
    fixes: int
    reused_tokens: int          # pair-reuse tokens gained by this code, applied after the codes before it
    #: provider cache read tokens and dollars this code gains (same order); None when not simulated
    provider_read_tokens: int | None = None
    provider_saved_usd: float | None = None


@dataclass(frozen=True, kw_only=True)
class FixReport:
    schema_version: int = SCHEMA_VERSION
    source: str
    requests: int
    grouping: Grouping
    fixes: tuple[Fix, ...]
    before: Measure | None
    after: Measure | None
    per_cause: tuple[CauseGain, ...] = ()
    notes: tuple[str, ...] = ()
    output: tuple[Any, ...] = field(default=(), repr=False)

    @property
    def applied(self) -> int:
        return sum(f.applied for f in self.fixes)

    @property
    def unsafe_skipped(self) -> int:
        return sum(1 for f in self.fixes if not f.applied and not f.safe)

    def to_dict(self) -> dict:
        from dataclasses import asdict

        d = asdict(self)
        d.pop("output", None)
        d["applied"] = self.applied
        d["unsafe_skipped"] = self.unsafe_skipped
        return d


# --------------------------------------------------------------------------------------------- reading


def log_lines(records: Iterable[tuple[int, Any]], *, source: str, key: str | None = None) -> list[LogLine]:
    """:class:`LogLine` records from ``(line, value)`` pairs (:func:`cachectl.inputs.iter_jsonl`): request bodies
    and wrappers (through :func:`cachectl.inputs.parse_request`), chat lists, raw-text and token-ID prompts
    (through :func:`cachectl.inputs.prompt_from_value`)."""
    out: list[LogLine] = []
    for lineno, value in records:
        out.append(_log_line(lineno, value, source, key))
    return out


def _log_line(lineno: int, value: Any, source: str, key: str | None) -> LogLine:
    k = None
    if key is not None:
        k = get_path(value, key) if isinstance(value, dict) else None
        if k is None:
            raise InputError("missing conversation key", source=source, line=lineno, field=key)
        if isinstance(k, (dict, list)):
            k = json.dumps(k, sort_keys=True)
    prompt = prompt_from_value(value, source=source, line=lineno)
    req = prompt.request
    if req is None and prompt.kind == "chat":
        req = parse_request({"messages": value}, source=source, line=lineno, provider="openai")
    ts = req.timestamp if req is not None else None
    if ts is None and isinstance(value, dict) and "timestamp" in value:
        from ...inputs import parse_timestamp

        try:
            ts = parse_timestamp(value["timestamp"])
        except ValueError as exc:
            raise InputError(str(exc), source=source, line=lineno, field="timestamp") from None
    return LogLine(line=lineno, value=value, prompt=prompt, request=req, key=k, timestamp=ts)


def _reparse(ln: LogLine, value: Any) -> LogLine:
    """The line after a rewrite, parsed again (a rewrite that no longer parses is a bug: it raises)."""
    return replace(_log_line(ln.line, value, ln.prompt.source, None), key=ln.key)


# -------------------------------------------------------------------------------------------- grouping

_THINK = re.compile(r"<think>.*?</think>\s*", re.S)


def _mask(text: str) -> str:
    from ...volatile import find_volatile

    out, last = [], 0
    for v in find_volatile(text):
        out.append(text[last:v.start])
        out.append("\x00")
        last = v.end
    out.append(text[last:])
    return "".join(out)


def _elements(ln: LogLine, bos: str | None = None) -> tuple[Any, int]:
    """What grouping compares, and where the last turn starts in it: for requests, the positions (tools as one
    set with sorted keys, volatile values masked, reasoning dropped); for raw text, the masked text; for token
    IDs, the IDs (these two must be extended whole)."""
    if ln.request is not None:
        req = ln.request
        tools = sorted(json.dumps(json.loads(p.content), sort_keys=True) for p in req.positions
                       if p.segment == "tools")
        out = [compact(tools)] if tools else []
        last_turn, last_msg = len(out), None
        for p in req.positions:
            if p.segment == "tools":
                continue
            if p.kind in ("thinking", "redacted_thinking"):
                continue
            m = _MSG_INDEX.match(p.path)
            if m is not None and m.group(1) != last_msg:
                last_msg, last_turn = m.group(1), len(out)
            out.append(f"{p.segment}:{p.role}:" + _mask(_THINK.sub("", p.text)))
        return tuple(out), last_turn
    if ln.prompt.ids is not None:
        return tuple(ln.prompt.ids), len(ln.prompt.ids)
    text = ln.prompt.text or ""
    if bos and text.startswith(bos):  # a doubled BOS must not split a conversation
        text = text[len(bos):]
    text = _mask(text)
    return text, len(text)


_MSG_INDEX = re.compile(r"(?:messages|input)\[(\d+)\]")


def _extends(prev: Any, last_turn: int, cur: Any) -> int:
    """How much of ``prev`` ``cur`` repeats as its prefix when ``cur`` continues ``prev``'s conversation: all of
    ``prev``, or (a client that sends the newest turn with extra blocks and the history without them) all
    before ``prev``'s last turn and at least the first position of that turn; -1 when it does not."""
    if type(prev) is not type(cur):
        return -1
    if len(prev) <= len(cur) and cur[:len(prev)] == prev:
        return len(prev)
    if isinstance(prev, tuple) and prev and isinstance(prev[0], str):
        n = 0
        for x, y in zip(prev, cur):
            if x != y:
                break
            n += 1
        if n > last_turn:
            return n
    return -1


def group_sessions(lines: Sequence[LogLine], *, key: str | None = None, window_s: float | None = 1800.0,
                   tokenizer: Any = None) -> Grouping:
    """Conversation of each line: its key when ``key`` is given (the lines carry it), else automatic.

    Automatic: a request joins the open conversation whose last request it extends, i.e. shares its whole
    prefix (compared position by position, with volatile values masked, tool definitions as one set with
    sorted keys, and reasoning left out, so that the very causes ``fix`` repairs do not split a conversation),
    or all of it but the extra blocks of its last turn (a client that drops per-request context from the
    history); the longest such prefix wins, the most recent on a tie. A conversation is open while its last request is at
    most ``window_s`` seconds older (lines without a timestamp ignore the window). With ``tokenizer``, a raw-text
    prompt's leading BOS text is left out of the comparison.
    """
    ids: list[int] = []
    if key is not None:
        seen: dict[Any, int] = {}
        for ln in lines:
            ids.append(seen.setdefault(ln.key, len(seen)))
        return Grouping(tuple(ids), len(seen), f"key {key}")
    last: list[tuple[Any, int, float | None, int]] = []  # per group: elements, last turn, time, line index
    bos = getattr(tokenizer, "bos_token", None)
    for i, ln in enumerate(lines):
        el, turn = _elements(ln, bos)
        best, best_len, best_at = -1, -1, -1
        for g, (pel, pturn, pts, at) in enumerate(last):
            if window_s is not None and pts is not None and ln.timestamp is not None and ln.timestamp - pts > window_s:
                continue
            n = _extends(pel, pturn, el)
            if n <= 0:
                continue
            if n > best_len or (n == best_len and at > best_at):
                best, best_len, best_at = g, n, at
        if best < 0:
            best = len(last)
            last.append((el, turn, ln.timestamp, i))
        else:
            last[best] = (el, turn, ln.timestamp, i)
        ids.append(best)
    return Grouping(tuple(ids), len(last), "automatic", window_s)


# -------------------------------------------------------------------------------------------- json paths

_SEG = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")


def _steps(path: str) -> list[str | int]:
    return [m.group(1) if m.group(1) is not None else int(m.group(2)) for m in _SEG.finditer(path)]


def _get(obj: Any, path: str) -> Any:
    cur = obj
    for s in _steps(path):
        cur = cur[s]
    return cur


def _set(obj: Any, path: str, value: Any) -> None:
    steps = _steps(path)
    cur = obj
    for s in steps[:-1]:
        cur = cur[s]
    cur[steps[-1]] = value


def _body_of(value: Any) -> tuple[Any, str]:
    """The request body inside a line (a wrapper's body, or the line), and its path prefix."""
    if isinstance(value, list):
        return {"messages": value}, "<list>"
    body, body_path, _ = unwrap(value)
    return body, body_path


def _put_body(value: Any, body: Any, body_path: str) -> Any:
    if body_path == "<list>":
        return body["messages"]
    if body_path:
        out = dict(value)
        out[body_path.rstrip(".")] = body
        return out
    return body


# ---------------------------------------------------------------------------------------------- rewriting


class _Rewriter:
    """Applies the enabled fix codes to the whole log (a fresh deep copy), recording each fix."""

    def __init__(self, lines: Sequence[LogLine], grouping: Grouping, codes: Sequence[str], unsafe: bool,
                 tokenizer: Any, table: Any, model: str | None, counter: Any = None):
        self.lines = list(lines)
        self.grouping = grouping
        self.codes = set(codes)
        self.unsafe = unsafe
        self.tok = tokenizer
        self.table = table
        self.model = model
        self.fixes: list[Fix] = []
        self.notes: list[str] = []
        self.values = [copy.deepcopy(ln.value) for ln in lines]
        self.counter = counter

    def allowed(self, safe: bool) -> bool:
        return safe or self.unsafe

    def record(self, code: str, safe: bool, ln: LogLine, path: str, message: str, before: Any = None,
               after: Any = None) -> bool:
        applied = self.allowed(safe)
        self.fixes.append(Fix(code, FIXES[code][0], safe, applied, ln.line, path, message,
                              None if before is None else _short(before), None if after is None else _short(after)))
        return applied

    def members(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(self.grouping.count)]
        for i, g in enumerate(self.grouping.groups):
            out[g].append(i)
        return out

    def current(self, i: int) -> LogLine:
        return _reparse(self.lines[i], self.values[i])

    def run(self) -> list[Any]:
        for code, step in (("FX004", self.doubled_bos), ("FX002", self.tool_keys), ("FX003", self.tool_order),
                           ("FX005", self.reasoning), ("FX001", self.volatile), ("FX006", self.breakpoints)):
            if code in self.codes:
                step()
        return self.values

    # ------------------------------------------------------------------------------ FX004 doubled BOS

    def doubled_bos(self) -> None:
        tok = self.tok
        if tok is None or tok.bos_token_id is None:
            if tok is None and any(ln.request is None for ln in self.lines):
                self.notes.append("doubled BOS (FX004) is checked only with a tokenizer")
            return
        bos_id, bos = tok.bos_token_id, tok.bos_token
        for i, ln in enumerate(self.lines):
            p = ln.prompt
            if p.kind == "text" and p.text is not None and bos and p.text.startswith(bos):
                ids = tok.backend.encode(p.text, add_special_tokens=True).ids
                if len(ids) > 1 and ids[0] == ids[1] == bos_id:
                    path = p.field_paths[0] if p.field_paths else "prompt"
                    if self.record("FX004", False, ln, path, f"the text starts with {bos!r} and encoding adds BOS "
                                   "again: the text's copy removed", p.text[:len(bos) + 20],
                                   p.text[len(bos):len(bos) + 20]):
                        _set(self.values[i], path, p.text[len(bos):])
            elif p.kind == "ids" and p.ids is not None and len(p.ids) > 1 and p.ids[0] == p.ids[1] == bos_id:
                fieldname = next((k for k in ("tokens", "prompt_token_ids", "input_ids", "token_ids", "prompt")
                                  if isinstance(self.values[i], dict) and k in self.values[i]), None)
                if fieldname is None:
                    continue
                if self.record("FX004", False, ln, fieldname, "the token IDs start with BOS twice: one is removed",
                               list(p.ids[:3]), list(p.ids[1:3])):
                    self.values[i][fieldname] = list(p.ids[1:])

    # ------------------------------------------------------------------------------ FX002/FX003 tools

    def _tools(self, i: int) -> tuple[dict, list] | None:
        body, _ = _body_of(self.values[i])
        tools = body.get("tools") if isinstance(body, dict) else None
        if not isinstance(tools, list) or not tools:
            return None
        return body, tools

    def tool_keys(self) -> None:
        forms: dict[str, set[str]] = {}
        for i in range(len(self.lines)):
            got = self._tools(i)
            for t in got[1] if got else ():
                forms.setdefault(json.dumps(t, sort_keys=True), set()).add(json.dumps(t))
        unstable = {k for k, v in forms.items() if len(v) > 1}
        if not unstable:
            return
        for i, ln in enumerate(self.lines):
            got = self._tools(i)
            if got is None:
                continue
            body, tools = got
            for j, t in enumerate(tools):
                canon = json.dumps(t, sort_keys=True)
                if canon in unstable and json.dumps(t) != canon:
                    if self.record("FX002", True, ln, _bp(self.values[i]) + f"tools[{j}]",
                                   f"tool {_tool_name(t)!r} is sent with its keys in another order elsewhere: keys "
                                   "sorted", json.dumps(t)[:60], canon[:60]):
                        tools[j] = json.loads(canon)

    def tool_order(self) -> None:
        first: dict[str, int] = {}
        orders: dict[tuple, set[tuple]] = {}
        for i in range(len(self.lines)):
            got = self._tools(i)
            if got is None:
                continue
            names = tuple(_tool_ident(t) for t in got[1])
            for n in names:
                first.setdefault(n, len(first))
            orders.setdefault(tuple(sorted(names)), set()).add(names)
        unstable = {k for k, v in orders.items() if len(v) > 1}
        for i, ln in enumerate(self.lines):
            got = self._tools(i)
            if got is None:
                continue
            body, tools = got
            idents = [_tool_ident(t) for t in tools]
            if tuple(sorted(idents)) not in unstable:
                continue
            want = sorted(range(len(tools)), key=lambda j: first[idents[j]])
            if want == list(range(len(tools))):
                continue
            if self.record("FX003", False, ln, _bp(self.values[i]) + "tools",
                           "the same tools are listed in another order elsewhere: put in the order first seen", [_tool_name(t) for t in tools], [_tool_name(tools[j]) for j in want]):
                body["tools"] = [tools[j] for j in want]

    # ------------------------------------------------------------------------------ FX005 reasoning

    def reasoning(self) -> None:
        for members in self.members():
            if len(members) < 2:
                continue
            seen: dict[int, set] = {}       # assistant message index -> reasoning texts seen ("" = none)
            rendered: dict[int, set] = {}   # ... -> whether the render holds it
            for i in members:
                msgs = _messages(self.values[i])
                if msgs is None:
                    continue
                for m, msg in enumerate(msgs):
                    if isinstance(msg, dict) and msg.get("role") == "assistant":
                        seen.setdefault(m, set()).add(_reasoning_of(msg))
            if self.tok is not None and self.tok.chat_template is not None:
                for i in members:
                    ln = self.current(i)
                    msgs = _messages(self.values[i])
                    if msgs is None or not ln.prompt.is_chat:
                        continue
                    try:
                        text = self.tok.render_chat(ln.prompt, add_generation_prompt=True)
                    except InputError:
                        continue
                    for m, msg in enumerate(msgs):
                        r = _reasoning_of(msg) if isinstance(msg, dict) and msg.get("role") == "assistant" else ""
                        if r:
                            rendered.setdefault(m, set()).add(r in text)
            bad = {m for m, s in seen.items() if len(s) > 1} | {m for m, s in rendered.items() if len(s) > 1}
            if not bad:
                continue
            for i in members:
                msgs = _messages(self.values[i])
                if msgs is None:
                    continue
                ln = self.lines[i]
                before_render = self._render(i)
                changed = []
                loop_start = _tool_loop_start(msgs) if _is_anthropic(ln) else len(msgs)
                new_msgs = list(msgs)
                for m in sorted(bad):
                    if m >= len(msgs) or m >= loop_start or not isinstance(msgs[m], dict):
                        continue
                    dropped = _drop_reasoning(msgs[m])
                    if dropped is not None:
                        new_msgs[m] = dropped
                        changed.append(m)
                if not changed:
                    continue
                trial = _with_messages(self.values[i], new_msgs)
                after_render = self._render_value(i, trial)
                safe = before_render is not None and before_render == after_render
                how = ("the render is unchanged" if safe else
                       "the model no longer sees it" if before_render is not None else "not proven without a tokenizer")
                for m in changed:
                    path = _bp(self.values[i]) + f"messages[{m}]"
                    if self.record("FX005", safe, ln, path, f"assistant message {m}'s reasoning is sent in some "
                                   f"requests of the conversation and not in others: dropped ({how})",
                                   _reasoning_of(msgs[m])[:40], ""):
                        self.values[i] = trial

    def _render(self, i: int) -> str | None:
        return self._render_value(i, self.values[i])

    def _render_value(self, i: int, value: Any) -> str | None:
        if self.tok is None or self.tok.chat_template is None:
            return None
        ln = _reparse(self.lines[i], value)
        if not ln.prompt.is_chat:
            return None
        try:
            return str(self.tok.render_chat(ln.prompt, add_generation_prompt=True))
        except InputError:
            return None

    # ------------------------------------------------------------------------------ FX001 volatile

    def volatile(self) -> None:
        from ...volatile import classify_change, find_volatile

        # 1. confirm: consecutive requests of a conversation whose prefix positions differ in a volatile value
        confirmed: dict[str, set[str]] = {}                 # position path -> families
        spans: dict[tuple[int, str], list[tuple[int, int]]] = {}  # (line index, slot path) -> char spans
        for members in self.members():
            for a, b in zip(members, members[1:]):
                la, lb = self.current(a), self.current(b)
                if la.request is None or lb.request is None:
                    continue
                pa, pb = _prefix_positions(la.request), _prefix_positions(lb.request)
                for x, y in zip(pa, pb):
                    if x.identity == y.identity:
                        continue
                    if x.path != y.path or x.segment != y.segment:
                        break
                    for slot, ta, tb in _slot_pairs(self.values[a], self.values[b], x.path):
                        if ta == tb:
                            continue
                        pair = classify_change(ta, tb)
                        if pair is None:
                            continue
                        va, vb = pair
                        fam = _family(va)
                        confirmed.setdefault(slot, set()).add(fam)
                        spans.setdefault((a, slot), []).append((va.start, va.end))
                        spans.setdefault((b, slot), []).append((vb.start, vb.end))
                    break  # the first differing position is where the prefix ends
        if not confirmed:
            return
        # 2. every request that holds a value of a confirmed family in a confirmed slot: move its line
        for members in self.members():
            carry: list[tuple[int, str, Any]] = []   # (message index, original message json, rewritten messages)
            for i in members:
                ln = self.lines[i]
                value = self.values[i]
                msgs = _messages(value)
                if msgs is not None and carry:
                    msgs = _apply_carry(msgs, carry)
                    value = _with_messages(value, msgs)
                moved: list[str] = []
                edits: list[tuple[str, str, str]] = []
                req = _reparse(ln, value).request
                if req is None:
                    self.values[i] = value
                    continue
                prefix_paths = {p.path for p in _prefix_positions(req)}
                for slot, fams in confirmed.items():
                    if not any(slot == pp or slot.startswith(pp + ".") or slot.startswith(pp + "[")
                               for pp in prefix_paths):
                        continue
                    try:
                        text = _get(_body_of(value)[0], slot)
                    except (KeyError, IndexError, TypeError):
                        continue
                    if not isinstance(text, str):
                        continue
                    found = [(v.start, v.end) for v in find_volatile(text, weekdays=True) if _family(v) in fams]
                    found += spans.get((i, slot), [])
                    if not found:
                        continue
                    new_text, lines_out = _cut_lines(text, found)
                    if not lines_out:
                        continue
                    edits.append((slot, text, new_text))
                    moved.extend(lines_out)
                if not edits:
                    self.values[i] = value
                    continue
                note = "\n".join(dict.fromkeys(moved))
                where, new_value, carried = _append_note(value, note, ln)
                if where is None:
                    self.notes.append(f"line {ln.line}: a volatile value was found but the request has no place "
                                      "after its prefix to move it to")
                    self.values[i] = value
                    continue
                for slot, _old, new in edits:
                    _set(_body_of(new_value)[0], slot, new)
                for slot, _old, _new in edits:
                    self.record("FX001", False, ln, _bp(value) + slot,
                                f"{', '.join(repr(x) for x in dict.fromkeys(moved))} changes per request inside the "
                                f"cached prefix: moved to {where}", note, where)
                if self.allowed(False):
                    self.values[i] = new_value
                    if carried is not None:
                        carry.append(carried)
                else:
                    self.values[i] = value

    # ------------------------------------------------------------------------------ FX006 breakpoints

    def breakpoints(self) -> None:
        from ..provider.cache import tokenizer_counter

        counter = self.counter or (tokenizer_counter(self.tok) if self.tok is not None else None)
        noted = False
        for members in self.members():
            reqs = [self.current(i) for i in members]
            for k, i in enumerate(members):
                ln = reqs[k]
                req = ln.request
                if req is None or req.provider != "anthropic" or req.auto_ttl is not None:
                    continue
                if len(members) < 2:
                    continue
                if counter is None:
                    if not noted:
                        self.notes.append("Anthropic breakpoints (FX006) need token counts to check the model's "
                                          "minimum: pass a tokenizer")
                        noted = True
                    break
                model = req.model or self.model
                if model is None or self.table is None:
                    continue
                try:
                    price = self.table.lookup(model)
                except Exception:  # an unknown model: no minimum to check against
                    continue
                nxt = reqs[k + 1].request if k + 1 < len(members) else None
                if nxt is not None:
                    stable = _common_positions(req, nxt)
                else:
                    prev = reqs[k - 1].request
                    # the last request of a conversation: its predecessor's pattern (append-only: all of it)
                    stable = len(req.positions) if prev is not None and _common_positions(prev, req) == \
                        len(prev.positions) else 0
                if stable == 0:
                    continue
                cum, total = [], 0
                for p in req.positions:
                    total += counter.count(p.text)
                    cum.append(total)
                t = stable - 1
                if cum[t] < price.min_cacheable_tokens:
                    continue  # below the minimum at the last stable position: nothing earlier is longer
                have = [j for j, p in enumerate(req.positions) if p.ttl is not None]
                unread = [j for j in have if j >= stable]
                keep = [j for j in have if j < stable]
                if t in keep and not unread:
                    continue
                ttl = "5m"
                if unread:
                    ttl = req.positions[unread[-1]].ttl or "5m"
                new = sorted(set(keep) | {t})
                while sum(req.positions[j].markers or 1 for j in new) > price.max_breakpoints and len(new) > 1:
                    new.remove(max(j for j in new if j != t))
                body, _ = _body_of(self.values[i])
                new_body = copy.deepcopy(body)
                for j in have:
                    if j not in new:
                        _drop_marker(new_body, req.positions[j])
                msg_carry = None
                if t not in have:
                    msg_carry = _add_marker(new_body, req.positions[t], ttl, price)
                desc = f"breakpoint on {req.positions[t].path}, the last position the next request repeats"
                if unread:
                    desc += f"; {len(unread)} marker(s) on positions the next request changes removed"
                if self.record("FX006", True, ln, _bp(self.values[i]) + (req.positions[t].last_path or req.positions[t].path),
                               desc + f" ({cum[t]:,} tokens, minimum {price.min_cacheable_tokens:,})",
                               [req.positions[j].path for j in have], [req.positions[j].path for j in new]):
                    self.values[i] = _put_body(self.values[i], new_body, _body_of(self.values[i])[1])
                    if msg_carry is not None:  # a string turned into a block: the same in later requests
                        for later in members[k + 1:]:
                            msgs = _messages(self.values[later])
                            if msgs is not None:
                                self.values[later] = _with_messages(self.values[later], _apply_carry(msgs, [msg_carry]))
                        reqs = [self.current(x) for x in members]


# ------------------------------------------------------------------------------------------------ helpers


def _short(x: Any) -> str:
    s = x if isinstance(x, str) else json.dumps(x, ensure_ascii=False)
    return s if len(s) <= 120 else s[:117] + "..."


def _bp(value: Any) -> str:
    if isinstance(value, list):
        return ""
    return _body_of(value)[1]


def _tool_name(t: Any) -> str:
    if isinstance(t, dict):
        fn = t.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return fn["name"]
        if isinstance(t.get("name"), str):
            return t["name"]
    return "?"


def _tool_ident(t: Any) -> str:
    return json.dumps(t, sort_keys=True)


def _messages(value: Any) -> list | None:
    body, _ = _body_of(value)
    if not isinstance(body, dict):
        return None
    msgs = body.get("messages")
    if isinstance(msgs, list):
        return msgs
    items = body.get("input")
    return items if isinstance(items, list) else None


def _with_messages(value: Any, msgs: list) -> Any:
    body, bp = _body_of(value)
    new_body = dict(body)
    new_body["messages" if "messages" in body else "input"] = msgs
    return _put_body(value, new_body, bp)


def _is_anthropic(ln: LogLine) -> bool:
    return ln.request is not None and ln.request.provider == "anthropic"


def _reasoning_of(msg: dict) -> str:
    parts = []
    rc = msg.get("reasoning_content")
    if isinstance(rc, str) and rc:
        parts.append(rc)
    content = msg.get("content")
    if isinstance(content, str):
        m = _THINK.search(content)
        if m:
            parts.append(m.group(0).strip())
    elif isinstance(content, list):
        for b in content:
            if isinstance(b, dict) and b.get("type") == "thinking":
                parts.append(str(b.get("thinking", "")))
            elif isinstance(b, dict) and b.get("type") == "redacted_thinking":
                parts.append(str(b.get("data", "")))
    return "\n".join(parts)


def _drop_reasoning(msg: dict) -> dict | None:
    out = dict(msg)
    changed = False
    if "reasoning_content" in out:
        del out["reasoning_content"]
        changed = True
    content = out.get("content")
    if isinstance(content, str) and "</think>" in content and "<think>" in content:
        # as the reasoning templates do: what follows the last </think>, leading newlines removed
        out["content"] = content.split("</think>")[-1].lstrip("\n")
        changed = True
    elif isinstance(content, list):
        kept = [b for b in content if not (isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking"))]
        if len(kept) != len(content) and kept:
            out["content"] = kept
            changed = True
    return out if changed else None


def _tool_loop_start(msgs: list) -> int:
    """Index of the first assistant turn of the current tool-use loop (after the last user turn that is not only
    tool results); messages from there on keep their thinking blocks."""
    last_user = -1
    for m, msg in enumerate(msgs):
        if not isinstance(msg, dict) or msg.get("role") != "user":
            continue
        c = msg.get("content")
        only_results = isinstance(c, list) and c and all(isinstance(b, dict) and b.get("type") == "tool_result"
                                                         for b in c)
        if not only_results:
            last_user = m
    return last_user + 1


def _prefix_positions(req: Request) -> list:
    """The positions before the last user turn's start: the cached prefix a volatile value must leave."""
    pos = list(req.positions)
    last_user = max((k for k, p in enumerate(pos) if p.segment == "messages" and p.role == "user"), default=None)
    return pos[:last_user] if last_user is not None else pos


def _slot_pairs(va: Any, vb: Any, path: str) -> list[tuple[str, str, str]]:
    """The strings at or under ``path`` in both bodies: ``(slot path, text a, text b)``."""
    ba, bb = _body_of(va)[0], _body_of(vb)[0]
    try:
        xa, xb = _get(ba, path), _get(bb, path)
    except (KeyError, IndexError, TypeError):
        return []
    out: list[tuple[str, str, str]] = []

    def walk(x: Any, y: Any, p: str) -> None:
        if isinstance(x, str) and isinstance(y, str):
            out.append((p, x, y))
        elif isinstance(x, dict) and isinstance(y, dict):
            for k in x:
                if k in y and k not in ("type", "cache_control", "role"):
                    walk(x[k], y[k], f"{p}.{k}")
        elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            for j, (u, w) in enumerate(zip(x, y)):
                walk(u, w, f"{p}[{j}]")

    walk(xa, xb, path)
    return out


def _family(v: Any) -> str:
    return "date_time" if v.is_date_time else v.kind


def _cut_lines(text: str, spans: list[tuple[int, int]]) -> tuple[str, list[str]]:
    """``text`` without the lines that hold the spans (a long line: only the sentence), and the cut pieces."""
    lines = text.split("\n")
    starts, at = [], 0
    for line in lines:
        starts.append(at)
        at += len(line) + 1
    cut: dict[int, tuple[int, int]] = {}      # line number -> (start, end) within the line
    for s, e in spans:
        n = max(k for k, st in enumerate(starts) if st <= s)
        line = lines[n]
        ls, le = s - starts[n], min(e - starts[n], len(line))
        if len(line) <= 300:
            lo, hi = 0, len(line)
        else:  # the sentence around the value
            lo = max(line.rfind(". ", 0, ls) + 2, 0) if line.rfind(". ", 0, ls) >= 0 else 0
            dot = line.find(". ", le)
            hi = dot + 1 if dot >= 0 else len(line)
        old = cut.get(n)
        cut[n] = (min(lo, old[0]), max(hi, old[1])) if old else (lo, hi)
    pieces: list[str] = []
    out_lines: list[str | None] = list(lines)
    for n in sorted(cut):
        lo, hi = cut[n]
        piece = lines[n][lo:hi].strip()
        if not piece:
            continue
        pieces.append(piece)
        rest = (lines[n][:lo] + lines[n][hi:]).strip() if (lo, hi) != (0, len(lines[n])) else ""
        if rest:
            out_lines[n] = (lines[n][:lo].rstrip() + " " + lines[n][hi:].lstrip()).strip()
        else:
            out_lines[n] = None
            # a blank line on both sides: keep one
            if n > 0 and n + 1 < len(lines) and not lines[n - 1].strip() and not lines[n + 1].strip():
                out_lines[n + 1] = None if out_lines[n + 1] == "" else out_lines[n + 1]
    kept = [x for x in out_lines if x is not None]
    return "\n".join(kept), pieces


def _apply_carry(msgs: list, carry: list[tuple[int, str, Any]]) -> list:
    """Later requests of a conversation: a turn rewritten earlier (where it was the last) is rewritten the same
    way where it is history. Inserts shift later indices, so they are applied from the last one down."""
    out = list(msgs)
    for idx, original, repl in sorted(carry, key=lambda c: -c[0]):
        if idx < len(out) and json.dumps(out[idx], sort_keys=True) == original and idx < len(out) - 1:
            out[idx:idx + 1] = copy.deepcopy(repl)
    return out


def _append_note(value: Any, note: str, ln: LogLine) -> tuple[str | None, Any, tuple[int, str, Any] | None]:
    """The request with ``note`` at its end: ``(where, new value, carry)``."""
    value = copy.deepcopy(value)
    body, bp = _body_of(value)
    req = ln.request
    anthropic = req is not None and req.provider == "anthropic"
    key = "messages" if "messages" in body else "input" if isinstance(body.get("input"), list) else None
    if key is None:
        if isinstance(body.get("input"), str):
            body["input"] = body["input"] + "\n\n" + note
            return "the end of the input", _put_body(value, body, bp), None
        return None, value, None
    msgs = body[key]
    if not msgs:
        return None, value, None
    last = msgs[-1]
    idx = len(msgs) - 1
    original = json.dumps(last, sort_keys=True)
    if isinstance(last, dict) and last.get("role") == "user":
        new = dict(last)
        c = new.get("content")
        only_results = isinstance(c, list) and c and all(isinstance(b, dict) and b.get("type") == "tool_result"
                                                         for b in c)
        if isinstance(c, str):
            new["content"] = c + "\n\n" + note
        elif isinstance(c, list):
            part = {"type": "text", "text": note} if anthropic or key == "messages" else {"type": "input_text",
                                                                                          "text": note}
            new["content"] = [*c, part]
        else:
            return None, value, None
        msgs[-1] = new
        where = ("a text block after the tool results of the last user turn" if only_results
                 else "the end of the last user turn")
        return where, _put_body(value, body, bp), (idx, original, [new])
    if anthropic:
        return None, value, None
    role = "system"
    sysmsg = {"role": role, "content": note}
    msgs.append(sysmsg)
    return "a trailing system message", _put_body(value, body, bp), (idx, original, [copy.deepcopy(last), sysmsg])


def _common_positions(a: Request, b: Request) -> int:
    n = 0
    for x, y in zip(a.positions, b.positions):
        if x.identity != y.identity:
            break
        n += 1
    # the invalidation hierarchy: a scope change invalidates its level and everything after it
    if a.scope_system != b.scope_system:
        n = min(n, sum(1 for p in a.positions if p.segment == "tools"))
    if a.scope_messages != b.scope_messages:
        n = min(n, sum(1 for p in a.positions if p.segment != "messages"))
    return n


def _drop_marker(body: dict, p: Any) -> None:
    if p.cache_path:
        steps = _steps(p.cache_path)
        holder = body
        for s in steps[:-1]:
            holder = holder[s]
        if isinstance(holder, dict):
            holder.pop("cache_control", None)


def _add_marker(body: dict, p: Any, ttl: str, price: Any) -> tuple[int, str, Any] | None:
    """Mark position ``p``; a string message content becomes one text block (carried into later requests)."""
    cc: dict = {"type": "ephemeral"}
    if ttl == "1h":
        cc["ttl"] = "1h"
    path = p.last_path or p.path
    target = _get(body, path)
    if isinstance(target, dict):
        target["cache_control"] = cc
        return None
    if isinstance(target, str) and path.endswith(".content"):
        mpath = path[: -len(".content")]
        msg = _get(body, mpath)
        idx = int(_steps(mpath)[-1])
        original = json.dumps(msg, sort_keys=True)
        plain = {**msg, "content": [{"type": "text", "text": target}]}
        _set(body, path, [{"type": "text", "text": target, "cache_control": cc}])
        return (idx, original, [plain])
    if isinstance(target, str) and path == "system":
        body["system"] = [{"type": "text", "text": target, "cache_control": cc}]
        return None
    return None


# ------------------------------------------------------------------------------------------------ measure


def _prompt_key(p: PromptInput) -> str:
    return json.dumps([p.kind, p.text, p.messages, p.tools, p.ids], ensure_ascii=False, default=str)


def _tokenize(lines: Sequence[LogLine], tokenizer: Any, add_generation_prompt: bool,
              memo: dict | None = None) -> list[Any]:
    """Tokenized prompts; with ``memo``, a prompt tokenized before (the same content, key order included) is
    not tokenized again (the before/after and per-fix measures share most lines)."""
    if memo is None:
        return tokenizer.tokenize_many([ln.prompt for ln in lines], add_generation_prompt=add_generation_prompt)
    keys = [_prompt_key(ln.prompt) for ln in lines]
    todo = {k: ln.prompt for k, ln in zip(keys, lines) if k not in memo}
    if todo:
        for k, t in zip(todo, tokenizer.tokenize_many(list(todo.values()), add_generation_prompt=add_generation_prompt)):
            memo[k] = t
    return [memo[k] for k in keys]


def measure(lines: Sequence[LogLine], grouping: Grouping, *, tokenizer: Any = None, table: Any = None,
            options: FixOptions = FixOptions(), source: str = "", causes: bool = True,
            memo: dict | None = None, counter: Any = None) -> tuple[Measure, list[str]]:
    """A log measured by the existing engines: the vLLM replay (:func:`cachectl.engines.prefix.simulate`), the
    provider cache (:func:`cachectl.engines.provider.cache.simulate_requests`), and the token prefix each request
    shares with the previous one of its conversation (with the diff-tokens cause where they diverge)."""
    from .. import tokendiff
    from ..prefix.replay import simulate
    from ..prefix.trace import TraceRequest
    from ..provider import cache as promptcache

    notes: list[str] = []
    vllm = None
    pair_reused = pair_tokens = None
    cause_count: dict[str, int] = {}
    if tokenizer is not None:
        toks = _tokenize(lines, tokenizer, options.add_generation_prompt, memo)
        trace = [TraceRequest(index=k, line=ln.line, prompt_tokens=len(t.ids), tokens=list(t.ids),
                                     timestamp=ln.timestamp) for k, (ln, t) in enumerate(zip(lines, toks))]
        policy = "vllm" if options.capacity_blocks is not None else "infinite"
        r = simulate(trace, policy=policy, block_size=options.block_size,
                            capacity_blocks=options.capacity_blocks, source=source)
        vllm = VllmMeasure(policy, r.block_size, r.capacity_blocks, r.requests, r.query_tokens, r.hit_tokens,
                           r.hit_rate)
        pair_reused = pair_tokens = 0
        last: dict[int, Any] = {}
        for t, g in zip(toks, grouping.groups):
            prev = last.get(g)
            last[g] = t
            if prev is None:
                continue
            c = tokendiff.common_prefix_length(prev.ids, t.ids)
            pair_reused += c
            pair_tokens += len(t.ids)
            if causes and c < min(len(prev.ids), len(t.ids)):
                d = tokendiff.diff_tokens(prev, t, block_size=options.block_size, tokenizer=tokenizer)
                cid = d.cause.id if d.cause is not None else "unexplained"
                cause_count[cid] = cause_count.get(cid, 0) + 1
    provider = None
    reqs = [ln.request for ln in lines if ln.request is not None]
    skipped = len(lines) - len(reqs)
    if reqs and table is not None and tokenizer is None and any(p.tokens is None for r in reqs for p in r.positions):
        notes.append("the provider cache simulation needs token counts: pass `tokenizer`")
    elif reqs and table is not None:
        if counter is None and tokenizer is not None:
            counter = promptcache.tokenizer_counter(tokenizer)
        try:
            rep = promptcache.simulate_requests(reqs, table=table, source=source, text_counter=counter,
                                                every=None, token_source="tokenizer")
        except (InputError, UsageError) as exc:
            notes.append(f"provider cache not simulated: {exc}")
        else:
            t = rep.totals
            provider = ProviderMeasure(len(reqs), int(t.get("cache_read_input_tokens", 0)),
                                       int(t.get("cache_creation_input_tokens", 0)), int(t.get("input_tokens", 0)),
                                       rep.total_cost_usd, rep.uncached_cost_usd, rep.hit_rate, skipped)
    return Measure(vllm, provider, pair_reused, pair_tokens, cause_count), notes


# ------------------------------------------------------------------------------------------------ entry


def fix_log(lines: Sequence[LogLine], options: FixOptions = FixOptions(), *, tokenizer: Any = None,
            table: Any = None, source: str = "", reuse: FixReport | None = None) -> FixReport:
    """Find and apply the fixes on a log, and measure the log before and after (see the module docstring).

    ``reuse``: an earlier report on the same lines, tokenizer, table and options except ``unsafe`` and
    ``select``: its conversations and its measure of the log before the fixes are taken as they are (``cachectl
    report`` runs the safe and the full fix on one log)."""
    if not lines:
        raise InputError("no requests", source=source)
    codes = tuple(options.select) if options.select else CODES
    unknown = [c for c in codes if c not in FIXES]
    if unknown:
        raise UsageError(f"unknown fix code(s) {', '.join(unknown)}; known: {', '.join(CODES)}")
    if options.model is not None:
        lines = [_with_model(ln, options.model) for ln in lines]
    grouping = (reuse.grouping if reuse is not None
                else group_sessions(lines, key=options.key, window_s=options.window_s, tokenizer=tokenizer))
    counter = None
    if tokenizer is not None:  # one counter (and its cache of position token IDs) for every measure
        from ..provider.cache import tokenizer_counter

        counter = tokenizer_counter(tokenizer)
    rw = _Rewriter(lines, grouping, codes, options.unsafe, tokenizer, table, options.model, counter)
    values = rw.run()
    # (dict equality ignores key order, which FX002 changes: every line is parsed again)
    fixed = [_reparse(ln, v) for ln, v in zip(lines, values)]
    if options.model is not None:
        fixed = [_with_model(ln, options.model) for ln in fixed]
    notes = list(rw.notes)
    memo: dict = {}
    n1: list[str] = []
    if reuse is not None and reuse.before is not None:
        before = reuse.before
    else:
        before, n1 = measure(lines, grouping, tokenizer=tokenizer, table=table, options=options, source=source,
                             memo=memo, counter=counter)
    after, n2 = measure(fixed, grouping, tokenizer=tokenizer, table=table, options=options, source=source, memo=memo,
                         counter=counter)
    notes += list(dict.fromkeys(n1 + n2))
    if tokenizer is None:
        notes.append("no tokenizer: the vLLM hit rate and the tokens reused per cause need --tokenizer")
    per_cause: list[CauseGain] = []
    applied_codes = [c for c in codes if any(f.code == c and f.applied for f in rw.fixes)]
    if options.per_cause and tokenizer is not None and applied_codes:
        prev_reused = before.pair_reused_tokens or 0
        prev_provider = before.provider
        done: list[str] = []
        order = [c for c in ("FX004", "FX002", "FX003", "FX005", "FX001", "FX006") if c in applied_codes]
        for c in order:
            done.append(c)
            if len(done) == len(order):
                m = after
            else:
                step = _Rewriter(lines, grouping, done, options.unsafe, tokenizer, table, options.model,
                                 counter).run()
                step_lines = [_reparse(ln, v) for ln, v in zip(lines, step)]
                m = measure(step_lines, grouping, tokenizer=tokenizer, table=table, options=options, source=source,
                            causes=False, memo=memo, counter=counter)[0]
            reused = m.pair_reused_tokens or 0
            p0, p1 = prev_provider, m.provider
            per_cause.append(CauseGain(c, FIXES[c][0], sum(1 for f in rw.fixes if f.code == c and f.applied),
                                       reused - prev_reused,
                                       None if p0 is None or p1 is None else p1.cache_read_tokens - p0.cache_read_tokens,
                                       None if p0 is None or p1 is None else round(p0.cost_usd - p1.cost_usd, 10)))
            prev_reused, prev_provider = reused, p1
    fixes = tuple(sorted(rw.fixes, key=lambda f: (f.line, CODES.index(f.code))))
    return FixReport(source=source, requests=len(lines), grouping=grouping, fixes=fixes, before=before,
                     after=after, per_cause=tuple(per_cause), notes=tuple(notes), output=tuple(values))


def _with_model(ln: LogLine, model: str) -> LogLine:
    if ln.request is None or ln.request.model is not None:
        return ln
    return replace(ln, request=replace(ln.request, model=model))


def to_records(lines: Sequence[LogLine]) -> list[LogRecord]:
    """The lines as diff-tokens' log records (its key, or the group number)."""
    return [LogRecord(line=ln.line, key=ln.key, prompt=ln.prompt) for ln in lines]
