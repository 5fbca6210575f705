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

How it works:

- **Input** (:class:`ForkRequest`, built by :func:`fork_requests`): each request's served tokens (rendered through
  the chat template, with the generation prompt, as ``simulate-prefix``/``fix``/``report`` render them), the
  character each token starts at in the rendered text, the :class:`~cachectl.tokenization.Tokenized` (its
  token -> message/field/char mapping, :class:`~cachectl.tokenization.Location`) and the log fields that may
  predict a per-user value (``user``, ``metadata.user_id``, a tenant field). Without a tokenizer, a provider
  request's canonical positions (tools -> system -> messages) are cut into word pieces: the same tree over
  approximate token counts.
- **Kept packed** (:class:`RequestStore`, :mod:`.packed`): every counterfactual is a pass over the whole log, so
  every request is kept, as one zlib stream of its IDs, starts and text (compressed against the first request's,
  which holds what most requests share) and its prompt pickled the same way: 2 to 3 KB a request on a log of
  400-token chat requests, where the parsed forms took some 16 KB, written to a temporary file (a
  :class:`cachectl.spool.Spool`; in memory, an object of small fields a request). A pass rebuilds each request as it
  reaches it (the tree pass as logged reads only the IDs); a tools counterfactual's re-renders are kept packed the
  same way.
- **Tree** (:class:`PrefixTree`): one streaming pass over the requests' chained block keys
  (:func:`~cachectl.engines.prefix.trace.block_keys`), a radix tree of full blocks whose edges hold their keys
  in an ``array('q')`` (8 bytes a distinct block, plus one small object per edge: about two edges a request).
  A **fork** is a node with two or more children; the token where the branches split is found inside the fork
  block from one representative request per branch. The same pass counts the blocks each request finds in the
  tree before it joins it: the log's no-eviction hits (the tests hold them equal to
  :func:`~cachectl.engines.prefix.replay.simulate`'s ``infinite`` policy).
- **Cause** (:func:`_classify`): the branches' text at the fork, compared by ``diff-tokens``' own proven causes
  (:func:`cachectl.engines.tokendiff.explain`: tools, template causes, volatile values from
  :mod:`cachectl.volatile`, JSON key order), the line holding the divergence in every branch (its distinct
  values; a value that repeats and that a log field predicts is a ``per_user_value``), and whether the branches
  share anything after that line (``different_prompt`` when they do not: different apps, never a fix).
- **Cost**: a fixable fork becomes a counterfactual: its diverging line moved after the part the branches
  share (to the end of the served tokens), or the tools put in one order (re-rendered). A line fork is offered
  a fix (FX001, FX007) only in the request's head (tools, and the system and developer messages before the first
  turn), what ``fix`` rewrites: a turn of the conversation is history in its later requests, kept append-only. The moved log is
  replayed through the existing replays (:func:`~cachectl.engines.prefix.replay.simulate`, policy ``infinite``,
  and vLLM's pool at ``capacity_blocks``, the keys passed as pre-hashed ids), and its tree is built again (the next line of a system prompt that
  opens with three per-request lines is a fork only once the first is moved), until no new fixable fork
  shows. Each fork's ``tokens_lost`` is then what keeping that one fork costs when every other fixable fork
  is fixed (all moved, minus all but this one moved, no eviction; at ``capacity_blocks`` as well when given),
  so two forks in one block each cost the whole (fixing only one recovers nothing). ``fixed_hit_tokens`` is
  the hit count with all of them fixed.
"""

from __future__ import annotations

import bisect
import heapq
import json
import pickle
import re
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from functools import partial
from itertools import chain, groupby, repeat
from typing import Any

from ...errors import InputError, UsageError
from ...inputs import PromptInput, Request, compact, prompt_from_request, prompt_from_value, unwrap
from ...inputs.prompt import check_ids
from ...spool import Spool
from ...tokenization import Span, Tokenized, _lazy_chat_spans
from ...volatile import classify_change
from ..tokendiff import common_prefix_length, explain
from .packed import ObjectCodec, RenderCodec
from .replay import simulate
from .trace import TraceRequest, block_keys

SCHEMA_VERSION = 1

#: log fields (dotted, in the body or its wrapper) that may predict a per-user value, looked at in this order
USER_FIELDS = ("user", "user_id", "metadata.user_id", "metadata.user", "safety_identifier", "metadata.tenant_id",
               "metadata.tenant", "tenant_id", "tenant", "prompt_cache_key")


def fix_codes() -> dict[str, str]:
    """Cause -> the fix code that removes it across requests, from the fix registry (each code's ``across``
    causes; a cause with none has nothing to rewrite)."""
    global _FIX_CODES
    if _FIX_CODES is None:
        from ..repair.fixes import REGISTRY  # (not at import: the fix codes' package imports this module)

        _FIX_CODES = {cause: f.code for f in REGISTRY for cause in f.across}
    return _FIX_CODES


_FIX_CODES: dict[str, str] | None = None


def __getattr__(name: str) -> Any:
    if name == "FIX_CODES":  # the map under its old name
        return fix_codes()
    raise AttributeError(name)


#: causes that are about tools or the template: taken from diff-tokens as they are
_STRUCTURAL = ("tool_order", "tool_schema_key_order", "tools_changed", "doubled_bos", "bos_mismatch",
               "default_system_prompt", "think_stripped", "message_relocated", "last_turn_closed_differently")
_TEXTUAL = ("json_key_order", "unicode_normalization", "whitespace", "token_boundary")
_LINE_CAUSES = ("date_time", "volatile_id", "counter", "per_user_value")

#: text the branches must share, line-aligned, after the diverging line, for a fork to be movable
MIN_SHARED_CHARS = 64
#: lines after the diverging one that may differ too before the shared part (a block of per-request lines)
MAX_SKIPPED_LINES = 8
#: a diverging line longer than this in any branch is not a value to move (it is the text the branches share)
MAX_VALUE_CHARS = 300


# --------------------------------------------------------------------------------------------- inputs


@dataclass(frozen=True, eq=False)
class ForkRequest:
    """One request as the fork analysis reads it: served tokens, where each starts in the rendered text, the
    :class:`Tokenized` that maps a token to its message, field and character, and the log fields that may predict
    a per-user value. ``text``/``starts``/``tokenized`` are None for token-ID requests (no cause, no move)."""

    index: int
    line: int | None
    ids: Sequence[int]
    text: str | None = None
    starts: Sequence[int] | None = None
    tokenized: Tokenized | None = field(default=None, repr=False)
    #: (dotted field, value) for each of the ``user_fields`` present on the line
    fields: tuple[tuple[str, Any], ...] = ()
    salt: Any = None
    #: canonical mode (no tokenizer): the request whose positions were cut into word pieces
    request: Request | None = field(default=None, repr=False)


class _Offsets:
    """The one method of a ``tokenizers.Encoding`` that :class:`Tokenized` reads, over known char offsets."""

    __slots__ = ("ends", "starts")

    def __init__(self, starts: Sequence[int], ends: Sequence[int]):
        self.starts, self.ends = starts, ends

    def token_to_chars(self, i: int) -> tuple[int, int] | None:
        return (self.starts[i], self.ends[i]) if 0 <= i < len(self.starts) else None


_PIECE = re.compile(r"\w+|\s+|[^\w\s]")


def _field_of(req: Request, p: Any) -> str:
    path = p.path + (".content" if p.segment == "messages" and req.api == "chat" and p.kind == "message" else "")
    return req.body_path + path


def canonical_tokens(req: Request, vocab: dict[str, int], tools: Sequence[Any] | None = None
                     ) -> tuple[array, str, array, Tokenized]:
    """A provider request without a tokenizer: its canonical positions (tools -> system -> messages, the exact
    text each counts) joined by newlines and cut into word pieces, each an id of ``vocab`` (shared by a log).
    ``tools`` replaces the tool positions (a counterfactual order). Returns ids, text, starts, and a
    :class:`Tokenized` whose spans name each position's JSON path."""
    positions = list(req.positions)
    if tools is not None:
        rest = [p for p in positions if p.segment != "tools"]
        positions = list(tools) + rest
    text_parts: list[str] = []
    spans: list[Span] = []
    at = 0
    msg = -1
    for p in positions:
        if p.segment == "messages":
            msg += 1
        spans.append(Span(at, at + len(p.text), _field_of(req, p), msg if p.segment == "messages" else None,
                          p.role))
        text_parts.append(p.text + "\n")
        at += len(p.text) + 1
    text = "".join(text_parts)
    ids, starts, ends = array("I"), array("I"), array("I")
    for m in _PIECE.finditer(text):
        ids.append(vocab.setdefault(m.group(0), len(vocab)))
        starts.append(m.start())
        ends.append(m.end())
    try:
        prompt = prompt_from_request(req)
    except InputError:  # a token layout or an image: no chat view, the text is still compared
        prompt = PromptInput(kind="openai", source=req.source, line=req.line, request=req)
    tok = Tokenized(prompt, ids, text=text, encoding=_Offsets(starts, ends), spans=spans)
    return ids, text, starts, tok


def _id_array(ids: Sequence[int]) -> array:
    try:
        return array("I", ids)
    except OverflowError:
        return array("Q", ids)


def _fields(value: Any, names: Sequence[tuple[str, list[str]]]) -> tuple[tuple[str, Any], ...]:
    if not isinstance(value, dict):
        return ()
    body, _, wrapper = unwrap(value)
    out = []
    for name, parts in names:
        for where in (body, wrapper):
            v = where.get(parts[0]) if isinstance(where, dict) else None
            for part in parts[1:]:
                v = v.get(part) if isinstance(v, dict) else None
            if v is not None:
                out.append((name, json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v))
                break
    return tuple(out)


_ID_KEYS = ("tokens", "prompt_token_ids", "input_ids")


def fork_requests(records: Iterable[tuple], *, source: str, tokenizer: Any = None,
                  user_fields: Sequence[str] = USER_FIELDS, add_generation_prompt: bool = True,
                  batch_size: int = 256) -> Iterator[ForkRequest]:
    """:class:`ForkRequest` records from ``(line, value)`` pairs (:func:`cachectl.inputs.iter_jsonl`): request
    bodies and wrappers, chat lists, raw text and token IDs. With ``tokenizer`` they are rendered and tokenized
    in batches as a server renders them (the generation prompt by default); without one, request bodies become
    canonical word pieces (:func:`canonical_tokens`) and token-ID lines are taken as they are. A record may be
    ``(line, value, has_bool_literal)`` (:func:`cachectl.engines.prefix.trace_records`): token-ID lines without
    a ``true``/``false`` are then validated at C speed."""
    vocab: dict[str, int] = {}
    pending: list[tuple[int, int, PromptInput, tuple]] = []
    index = 0

    def flush() -> Iterator[ForkRequest]:
        toks = tokenizer.tokenize_many([p for _, _, p, _ in pending], add_generation_prompt=add_generation_prompt)
        for (idx, line, _, flds), t in zip(pending, toks):
            yield _from_tokenized(idx, line, t, flds)
        pending.clear()

    names = [(n, n.split(".")) for n in user_fields]
    for record in records:
        line, value = record[0], record[1]
        flds = _fields(value, names)
        salt = value.get("cache_salt") if isinstance(value, dict) else None
        key = next((k for k in _ID_KEYS if k in value), None) if isinstance(value, dict) else None
        if key is not None:  # a token-ID trace line, validated at C speed where the raw line holds no bool
            check_ids(value[key], source=source, line=line, field=key, maybe_bool=record[2] if len(record) > 2 else True)
            yield ForkRequest(index=index, line=line, ids=_id_array(value[key]), fields=flds, salt=salt)
            index += 1
            continue
        prompt = prompt_from_value(value, source=source, line=line)
        if prompt.ids is not None:
            yield ForkRequest(index=index, line=line, ids=_id_array(prompt.ids), fields=flds, salt=salt)
        elif tokenizer is not None:
            pending.append((index, line, prompt, flds))
            if len(pending) >= batch_size:
                yield from flush()
        elif prompt.request is not None:
            ids, text, starts, tok = canonical_tokens(prompt.request, vocab)
            yield ForkRequest(index=index, line=line, ids=ids, text=text, starts=starts, tokenized=tok, fields=flds,
                              salt=salt, request=prompt.request)
        else:
            raise InputError("a raw-text or chat-list line needs `tokenizer` to become tokens", source=source,
                             line=line)
        index += 1
    if pending:
        yield from flush()


def _from_tokenized(index: int, line: int | None, t: Tokenized, flds: tuple = ()) -> ForkRequest:
    offsets = t.offsets()  # (encoded again from the text when the tokenizer's memo gave the IDs back)
    starts = array("I", (s for s, _ in offsets)) if offsets is not None else None
    return ForkRequest(index=index, line=line, ids=array("I", t.ids), text=t.text, starts=starts,
                       tokenized=t.compact(), fields=flds)


# ---------------------------------------------------------------------------------------------- store


class _Packed:
    """One request in a :class:`RequestStore`: its render packed (:class:`~.packed.RenderCodec`), its prompt
    pickled and packed (``cold``), the chat spans once an instrumented render found them, and the small fields the
    passes read for every request (its tools' identities, interned; its log fields and cache salt)."""

    __slots__ = ("cold", "fields", "hot", "index", "line", "meta", "salt", "spans", "tools", "where", "whole")

    def __init__(self, index: int, line: int | None, fields: tuple, salt: Any):
        self.index, self.line, self.fields, self.salt = index, line, fields, salt
        #: indices in the store's spool (on disk) of the packed render, the packed prompt and the packed spans
        self.hot: int = -1
        self.cold: int = -1
        self.spans: int = -1
        #: (offsets kind, add_special_tokens, render_opts, tokenizer handle), interned
        self.meta: tuple | None = None
        #: (the tools' identities in order, joined by newlines; the same sorted), interned; None without tools
        self.tools: tuple[str, tuple[str, ...]] | None = None
        #: a request whose parts this store does not know how to pack, kept as it is
        self.whole: ForkRequest | None = None
        #: a re-render's place in a :class:`_RenderTable` and its key there (its spans, found later, are kept there)
        self.where: tuple[_RenderTable, tuple[int, int]] | None = None


_NO_OFFSETS, _TEXT_OFFSETS, _KNOWN_OFFSETS = 0, 1, 2


class RequestStore(Sequence[ForkRequest]):
    """The requests of one fork analysis, packed: each counterfactual replays the whole log, so every request is
    kept, as one zlib stream of its IDs, starts and text (:class:`~.packed.RenderCodec`, against the first request's
    bytes) and its prompt pickled the same way; a few hundred bytes to a couple of KB a request where the parsed
    forms take some 20 KB, on disk (in memory: a small object a request). Indexing rebuilds a
    :class:`ForkRequest` (the last few are kept); :meth:`ids` reads only the IDs. Add requests in log order with
    :meth:`add`."""

    def __init__(self, recent: int = 64):
        self._render = RenderCodec()
        self._objects = ObjectCodec()
        #: the packed bytes, in a temporary file (a pass reads each request's once)
        self._disk = Spool()
        self._recs: list[_Packed] = []
        self._meta: dict[tuple, tuple] = {}
        self._tools: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._recent: OrderedDict[int, ForkRequest] = OrderedDict()
        self._keep = recent
        #: token count and token-ID-only requests (no text), over all requests
        self.tokens = 0
        self.bare = 0

    def __len__(self) -> int:
        return len(self._recs)

    def add(self, r: ForkRequest) -> None:
        rec = _Packed(r.index, r.line, r.fields, r.salt)
        self.tokens += len(r.ids)
        self.bare += r.text is None
        mine = _request_tools(r)
        if mine:
            names = [_tool_identity(t) for t in mine]
            order = "\n".join(names)
            rec.tools = self._tools.get(order) or self._tools.setdefault(order, (order, tuple(sorted(names))))
        try:
            self._pack(rec, r)
        except (ValueError, OverflowError, TypeError, pickle.PicklingError, AttributeError):
            rec.whole = r
        self._recs.append(rec)

    def _pack(self, rec: _Packed, r: ForkRequest) -> None:
        ids = r.ids if isinstance(r.ids, array) else _id_array(r.ids)
        tok = r.tokenized
        ends = None
        if tok is None:
            kind = _NO_OFFSETS
            if r.request is not None:
                raise ValueError("a request without its Tokenized")
        else:
            if tok.text != r.text or (tok.ids is not r.ids and _id_array(tok.ids) != ids):
                raise ValueError("a Tokenized of other text or tokens")
            if isinstance(tok.encoding, _Offsets):
                kind = _KNOWN_OFFSETS
                if r.starts is None or (tok.encoding.starts is not r.starts
                                        and array("q", tok.encoding.starts) != array("q", r.starts)):
                    raise ValueError("offsets other than the starts")
                ends = tok.encoding.ends
            elif tok.encoding is None:
                kind = _TEXT_OFFSETS
            else:
                raise ValueError("a full tokenizers.Encoding")
            lazy = callable(tok._spans)
            if lazy and (tok.render_opts is None or tok.tokenizer is None):
                raise ValueError("spans of an unknown kind")
            handle, opts = tok.tokenizer, tok.render_opts
            key = (kind, tok.add_special_tokens, repr(opts), id(handle), lazy)  # opts by value: one per render
            rec.meta = self._meta.get(key) or self._meta.setdefault(key, (kind, tok.add_special_tokens, opts,
                                                                             handle, lazy))
            # a rendered prompt is kept without its canonical request (none of the analysis's renders, causes or
            # spans reads it); a canonical one keeps it (its positions are its tokens)
            prompt = tok.prompt if r.request is not None or tok.prompt.request is None else replace(tok.prompt, request=None)
            rec.cold = self._disk.put_bytes(self._objects.dumps((prompt, r.request, None if lazy else tok.spans)))
        rec.hot = self._disk.put_bytes(self._render.pack(ids, r.starts, ends, r.text))

    def __getitem__(self, k: int) -> ForkRequest:  # type: ignore[override]
        got = self._recent.get(k)
        if got is not None:
            self._recent.move_to_end(k)
            return got
        rec = self._recs[k]
        got = rec.whole if rec.whole is not None else self._unpack(rec)
        self._recent[k] = got
        if len(self._recent) > self._keep:
            self._recent.popitem(last=False)
        return got

    def _unpack(self, rec: _Packed) -> ForkRequest:
        ids, starts, ends, text = self._render.unpack(self._disk.get_bytes(rec.hot))
        tok = request = None
        if rec.cold >= 0:
            prompt, request, spans = self._objects.loads(self._disk.get_bytes(rec.cold))
            tok = self._tokenized(rec, prompt, ids, starts, ends, text, spans)
        return ForkRequest(index=rec.index, line=rec.line, ids=ids, text=text, starts=starts, tokenized=tok,
                           fields=rec.fields, salt=rec.salt, request=request)

    def _tokenized(self, rec: _Packed, prompt: Any, ids: array, starts: Any, ends: Any, text: str | None,
                   spans: Any) -> Tokenized:
        assert rec.meta is not None
        kind, special, opts, handle, _ = rec.meta
        enc = _Offsets(starts, ends) if kind == _KNOWN_OFFSETS else None
        return Tokenized(prompt, ids, text, enc, spans if spans is not None else partial(self._spans, rec, prompt, text),
                         handle, special, opts)

    def _spans(self, rec: _Packed, prompt: Any, text: str | None) -> tuple[Span, ...]:
        """A chat render's spans (an instrumented render, once per request: kept packed)."""
        if rec.spans >= 0:
            return self._objects.loads(self._disk.get_bytes(rec.spans))
        assert rec.meta is not None and text is not None
        _, _, opts, handle, _ = rec.meta
        got = tuple(_lazy_chat_spans(handle, prompt, text, opts)())
        rec.spans = self._disk.put_bytes(self._objects.dumps(got))
        if rec.where is not None:
            table, key = rec.where
            table.set_spans(key, rec.spans)
        return got

    def ids(self, k: int) -> Sequence[int]:
        """Request ``k``'s token IDs, without the rest."""
        rec = self._recs[k]
        return rec.whole.ids if rec.whole is not None else self._render.ids(self._disk.get_bytes(rec.hot))

    def line(self, k: int) -> int | None:
        return self._recs[k].line

    def salt(self, k: int) -> Any:
        return self._recs[k].salt

    def fields(self, k: int) -> tuple:
        return self._recs[k].fields

    def tool_order(self, k: int) -> str | None:
        """Request ``k``'s tools' identities in order, joined by newlines (None without tools)."""
        t = self._recs[k].tools
        return t[0] if t is not None else None

    def tool_set(self, k: int) -> tuple[str, ...] | None:
        """The same, sorted (the set a tools counterfactual matches)."""
        t = self._recs[k].tools
        return t[1] if t is not None else None

    # a re-render under a tools counterfactual (kept packed the same way) ----------------------------------
    def pack_render(self, ids: array, text: str | None, starts: Any, tok: Tokenized | None) -> _Packed | tuple:
        rec = _Packed(-1, None, (), None)
        try:
            assert tok is not None
            probe = ForkRequest(index=-1, line=None, ids=ids, text=text, starts=starts, tokenized=tok)
            kind = _KNOWN_OFFSETS if isinstance(tok.encoding, _Offsets) else _TEXT_OFFSETS
            lazy = callable(tok._spans)
            if tok.encoding is not None and kind != _KNOWN_OFFSETS or (lazy and tok.render_opts is None):
                raise ValueError("not packable")
            self._pack(rec, probe)
        except (ValueError, OverflowError, TypeError, AssertionError, pickle.PicklingError, AttributeError):
            return (ids, text, starts, tok)
        rec.cold = -1  # the prompt is the request's own, with the counterfactual's tools
        if not lazy:
            rec.spans = self._disk.put_bytes(self._objects.dumps(tuple(tok.spans)))
        return rec

    def unpack_render(self, rec: _Packed | tuple, prompt: Any) -> tuple:
        """(ids, text, starts, tok) of a :meth:`pack_render`; ``prompt``: the Tokenized's prompt."""
        if isinstance(rec, tuple):
            return rec
        ids, starts, ends, text = self._render.unpack(self._disk.get_bytes(rec.hot))
        assert rec.meta is not None
        spans = self._objects.loads(self._disk.get_bytes(rec.spans)) if rec.spans >= 0 and not rec.meta[4] else None
        return ids, text, starts, self._tokenized(rec, prompt, ids, starts, ends, text, spans)


class _RenderTable:
    """The re-renders of a fork analysis (request index, id of a tools counterfactual) -> a
    :meth:`RequestStore.pack_render`, as the memo :func:`_view` reads and writes: per counterfactual, arrays of the
    packed parts' spool indices and a list of their (interned) render options, 24 bytes a request where a dict of
    the packed objects took some 400; a re-render the store could not pack is kept as it is."""

    __slots__ = ("_odd", "_slots")

    def __init__(self) -> None:
        self._slots: dict[int, tuple[array, array, list]] = {}   # id -> (hot, spans, meta), by request index
        self._odd: dict[tuple[int, int], Any] = {}

    def __contains__(self, key: tuple[int, int]) -> bool:
        k, slot = key
        got = self._slots.get(slot)
        return key in self._odd or (got is not None and k < len(got[0]) and got[0][k] >= 0)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        if key in self._odd:
            return self._odd[key]
        k, slot = key
        hot, spans, meta = self._slots[slot]
        if k >= len(hot) or hot[k] < 0:
            raise KeyError(key)
        rec = _Packed(-1, None, (), None)
        rec.hot, rec.spans, rec.meta, rec.where = hot[k], spans[k], meta[k], (self, key)
        return rec

    def __setitem__(self, key: tuple[int, int], rec: Any) -> None:
        if not isinstance(rec, _Packed):
            self._odd[key] = rec
            return
        k, slot = key
        hot, spans, meta = self._slots.setdefault(slot, (array("q"), array("q"), []))
        if k >= len(hot):
            grow = k + 1 - len(hot)
            hot.extend(array("q", [-1]) * grow)
            spans.extend(array("q", [-1]) * grow)
            meta.extend([None] * grow)
        hot[k], spans[k], meta[k] = rec.hot, rec.spans, rec.meta

    def set_spans(self, key: tuple[int, int], index: int) -> None:
        k, slot = key
        if slot in self._slots and k < len(self._slots[slot][1]):
            self._slots[slot][1][k] = index

    def keep(self, slots: set[int]) -> _RenderTable | None:
        """Only the re-renders under these counterfactuals (None if that leaves none)."""
        self._slots = {s: v for s, v in self._slots.items() if s in slots}
        self._odd = {k: v for k, v in self._odd.items() if k[1] in slots}
        return self if self._slots or self._odd else None


# ----------------------------------------------------------------------------------------------- tree


class _Edge:
    """An edge of the radix tree of full blocks: its chained keys, the node it hangs from, the requests that
    enter it, and the first of them (the branch's representative)."""

    __slots__ = ("children", "keys", "n", "parent", "rep", "start")

    def __init__(self, parent: _Edge | None, start: int, keys: array, rep: int, n: int = 1):
        self.parent = parent
        self.start = start            # block depth of its first key
        self.keys = keys
        self.children: dict | None = None
        self.n = n
        self.rep = rep

    @property
    def end(self) -> int:
        return self.start + len(self.keys)


class PrefixTree:
    """A radix tree over the chained block keys of a stream of requests (one insert each, in log order).

    Memory: 8 bytes a distinct block (the edges' key arrays) and one edge object per branch. ``leaves`` keeps,
    per request, the edge where its path ends and ``depths`` its block depth (an edge split later still finds
    it: the walk up from there goes to the edge that holds that depth); 16 bytes a request."""

    def __init__(self) -> None:
        self.root = _Edge(None, 0, array("q"), -1, 0)
        self.leaves: list[_Edge] = []
        self.depths = array("q")

    def insert(self, keys: array, rep: int) -> int:
        """Add one request's keys; returns how many of its blocks an earlier request already had (the blocks a
        prefix cache that never evicts would hit, before vLLM's ``L - 1`` cap)."""
        node = self.root
        node.n += 1
        pos = 0
        n = len(keys)
        while pos < n:
            child = node.children.get(keys[pos]) if node.children is not None else None
            if child is None:
                new = _Edge(node, pos, keys[pos:], rep)
                if node.children is None:
                    node.children = {}
                node.children[keys[pos]] = new
                self._leaf(new, n)
                return pos
            m = len(child.keys)
            seg = keys[pos:pos + m]
            if seg == child.keys:
                child.n += 1
                node, pos = child, pos + m
                continue
            c = common_prefix_length(seg, child.keys)
            if c == len(seg):  # the request ends inside this edge
                child.n += 1
                self._leaf(child, n)
                return n
            upper = _Edge(node, pos, child.keys[:c], child.rep, child.n + 1)
            assert node.children is not None
            node.children[keys[pos]] = upper
            child.keys = child.keys[c:]
            child.start = pos + c
            child.parent = upper
            upper.children = {child.keys[0]: child}
            node, pos = upper, pos + c
            new = _Edge(upper, pos, keys[pos:], rep)
            upper.children[keys[pos]] = new
            self._leaf(new, n)
            return pos
        self._leaf(node, n)
        return n

    def _leaf(self, edge: _Edge, depth: int) -> None:
        self.leaves.append(edge)
        self.depths.append(depth)

    def forks(self) -> list[_Edge]:
        """Nodes with two or more children, most requests first (then the shallowest)."""
        out = []
        stack = [self.root]
        while stack:
            e = stack.pop()
            if e.children:
                if len(e.children) > 1:
                    out.append(e)
                stack.extend(e.children.values())
        out.sort(key=lambda e: (-sum(c.n for c in e.children.values()), e.end))  # type: ignore[union-attr]
        return out

    def branches(self, forks: Sequence[_Edge]) -> dict[int, array]:
        """For each fork (by ``id``): the requests that take one of its children, ascending (8 bytes each)."""
        want = {id(f): f for f in forks}
        out: dict[int, array] = {k: array("q") for k in want}
        for r, (edge, depth) in enumerate(zip(self.leaves, self.depths)):
            e: _Edge | None = edge
            while e is not None and e.parent is not None and e.start >= depth:
                e = e.parent
            while e is not None and e.parent is not None:
                p = e.parent
                if id(p) in want:
                    out[id(p)].append(r)
                e = p
        return out


# ---------------------------------------------------------------------------------------------- views


class _View:
    """A request under a counterfactual: its base render (the request, or re-rendered with other tools) and the
    order of the base's tokens (segments of base token indices; moved spans at the end)."""

    __slots__ = ("base", "ids", "req", "segs", "starts", "text", "tok", "tools")

    def __init__(self, req: ForkRequest, ids: Sequence[int], text: str | None, starts: Sequence[int] | None,
                 tok: Tokenized | None):
        self.req = req
        self.base = ids if isinstance(ids, array) else _id_array(ids)
        self.ids: array = self.base
        self.text, self.starts, self.tok = text, starts, tok
        self.segs: list[tuple[int, int]] | None = None
        #: the tools counterfactual this view is a re-render under (None: the request's own render)
        self.tools: _Tools | None = None

    def orig(self, i: int) -> tuple[int, int]:
        """(base index of view token ``i``, end of its segment in base indices)."""
        at = 0
        for s, e in self.segs or ((0, len(self.ids)),):
            if i < at + e - s:
                return s + i - at, e
            at += e - s
        return len(self.ids), len(self.ids)

    def move(self, a: int, b: int) -> None:
        """Move view tokens [a, b) to the end."""
        segs = self.segs or [(0, len(self.ids))]
        head: list[tuple[int, int]] = []
        mid: list[tuple[int, int]] = []
        at = 0
        for s, e in segs:
            n = e - s
            lo, hi = max(a - at, 0), min(b - at, n)
            if lo >= hi:
                head.append((s, e))
            else:
                if lo > 0:
                    head.append((s, s + lo))
                mid.append((s + lo, s + hi))
                if hi < n:
                    head.append((s + hi, e))
            at += n
        self.segs = head + mid
        base = self.base
        out = array(base.typecode)
        for s, e in self.segs:
            out.extend(base[s:e])
        self.ids = out

    def tokenized(self) -> Tokenized | None:
        """The view as a :class:`Tokenized` (text, offsets and spans spliced as the tokens were), for causes."""
        if self.tok is None or self.text is None or self.starts is None:
            return None
        if self.segs is None:
            return self.tok
        text, starts, tok = self.text, self.starts, self.tok
        n = len(starts)
        pieces: list[str] = []
        new_starts, new_ends = array("I"), array("I")
        char_map: list[tuple[int, int, int]] = []   # (base char start, base char end, view char start)
        at = 0
        for s, e in self.segs:
            cs = starts[s] if s < n else len(text)
            ce = starts[e] if e < n else len(text)
            char_map.append((cs, ce, at))
            for i in range(s, e):
                new_starts.append(starts[i] - cs + at)
                new_ends.append((starts[i + 1] if i + 1 < n else len(text)) - cs + at)
            pieces.append(text[cs:ce])
            at += ce - cs
        spans = []
        for sp in tok.spans:
            for cs, ce, vs in char_map:
                lo, hi = max(cs, sp.start), min(ce, sp.end)
                if lo < hi:
                    spans.append(Span(vs + lo - cs, vs + hi - cs, sp.field, sp.message_index, sp.role,
                                      sp.offset + lo - sp.start))
        spans.sort(key=lambda x: (x.start, x.end))
        return Tokenized(self.tok.prompt, self.ids, text="".join(pieces), encoding=_Offsets(new_starts, new_ends),
                         spans=spans, tokenizer=self.tok.tokenizer, render_opts=None)


@dataclass(frozen=True, eq=False)
class _LineMove:
    """Counterfactual of a line fork: a request whose view starts with ``prefix`` (the ``d`` tokens the branches
    share) has the line holding token ``d`` (view tokens from ``a``, the line's first, through its newline)
    moved to the end."""

    d: int
    a: int
    prefix: array
    code: str
    cause: str
    #: lines at the fork that are not values but the text the branches share (:meth:`_Analyzer._shared_text`):
    #: a request that holds one of them there is not moved
    keep: frozenset = frozenset()

    def span(self, v: _View) -> tuple[int, int, int, int] | None:
        """(view token start, view token end, base char start, base char end) of the line in ``v``."""
        if len(v.ids) <= self.d or v.ids[:self.d] != self.prefix or v.text is None or v.starts is None:
            return None
        od, seg_end = v.orig(self.d)
        starts, text = v.starts, v.text
        n = len(starts)
        c = starts[od]
        limit = starts[seg_end] if seg_end < n else len(text)
        field_end = _field_end(v, c)
        if field_end is not None:
            limit = min(limit, field_end)
        nl = text.find("\n", c, limit)
        end_char = limit if nl < 0 else nl + 1
        ls = starts[v.orig(self.a)[0]]
        if nl >= 0 and _opens_field(v, ls):
            # the field's first line: the blank lines that set it apart go with it (what is left starts as the
            # branches that never had it do)
            while end_char < limit and text[end_char] == "\n":
                end_char += 1
        ob = bisect.bisect_left(starts, end_char, od, seg_end)
        if self.keep and text[ls:end_char].rstrip("\n") in self.keep:
            return None
        return self.a, self.d + (ob - od), ls, end_char

    def apply(self, v: _View) -> bool:
        sp = self.span(v)
        if sp is None or sp[1] <= sp[0]:
            return False
        v.move(sp[0], sp[1])
        return True


def _opens_field(v: _View, c: int) -> bool:
    """Whether base char ``c`` is where a field's text starts (a system prompt's first line)."""
    tok = v.tok
    return tok is not None and any(sp.start == c and sp.offset == 0 for sp in tok.spans)


def _field_end(v: _View, c: int) -> int | None:
    """The end (base char) of the field that holds base char ``c``, when it ends before the next newline."""
    tok = v.tok
    if tok is None or v.text is None:
        return None
    nl = v.text.find("\n", c)
    if nl >= 0:  # the cheap case first: a message's content holds the rest of the line and its newline
        rest = v.text[c:nl + 1]
        if any(isinstance(m.get("content"), str) and rest in m["content"] for m in tok.prompt.messages or ()):
            return None
    for sp in tok.spans:  # the spans (an instrumented render of a chat prompt, once per request)
        if sp.start <= c < sp.end:
            return sp.end if nl < 0 or sp.end <= nl else None
    return None


@dataclass(frozen=True, eq=False)
class _Tools:
    """Counterfactual of a tools fork: requests with the same tools (as a set of values) list them in the
    reference order (``tool_order``), or serialized as the reference does (``tool_schema_key_order``)."""

    identities: tuple[str, ...]       # the sorted identities of the reference's tools
    reference: tuple[Any, ...]        # the reference's tools (dicts; Position values in canonical mode)
    code: str
    cause: str


def _tool_identity(t: Any) -> str:
    if isinstance(t, dict):
        return json.dumps(t, sort_keys=True, ensure_ascii=False)
    try:  # a canonical position: its exact content
        return json.dumps(json.loads(t.content), sort_keys=True, ensure_ascii=False)
    except (ValueError, AttributeError):
        return str(getattr(t, "content", t))


def _request_tools(r: ForkRequest) -> tuple[Any, ...] | None:
    if r.request is not None:
        tools = tuple(p for p in r.request.positions if p.segment == "tools")
        return tools or None
    if r.tokenized is not None and r.tokenized.prompt.tools:
        return tuple(r.tokenized.prompt.tools)
    return None


# ------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Fork:
    """One place where requests that share a prefix split."""

    #: JSON path of the position where the branches diverge (``messages[0].content``, ``system[0]``, ``tools``)
    path: str | None
    #: character offset inside ``path``
    char: int | None
    cause: str
    distinct_values: int
    requests: int
    #: tokens the counterfactual replay recovers under no eviction (see the module docstring)
    tokens_lost: int
    #: the fix code that removes it (``FX001``, ``FX007``, ``FX003``, ...), None when none applies
    fixable: str | None
    #: the log field that predicts a per-user value (``user``, ``metadata.tenant_id``), None when none does
    predicted_by: str | None = None
    #: the same counterfactual replayed at ``capacity_blocks`` (None without a capacity)
    tokens_lost_at_capacity: int | None = None
    #: tokens the branches share before the fork, and how many branches split there
    shared_tokens: int = 0
    branches: int = 0
    #: a few of the diverging values (the line at the fork), as seen in the log
    examples: tuple[str, ...] = ()
    message: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class TreeNode:
    """One branch of the shared-prefix tree, for a picture: an edge of full blocks that ``requests`` requests
    share, from token ``start`` to token ``end``, below node ``parent`` (an index into the same tuple; -1: the
    root). ``alone`` > 0: a bundle of that many branches of one request each (``end``: the longest of them).
    ``fork``: the index in :attr:`ForkReport.forks` of the fork where this branch splits, if it is one."""

    parent: int
    start: int
    end: int
    requests: int
    alone: int = 0
    fork: int | None = None


#: the nodes a tree summary shows, at most
SUMMARY_NODES = 40


def _summary(tree: PrefixTree, bs: int, fork_at: dict[int, int], max_nodes: int = SUMMARY_NODES,
             expanded: list[_Edge] | None = None) -> tuple[TreeNode, ...]:
    """The tree's branches that two or more requests share, most requests first (at most ``max_nodes``), each
    node's single-request branches bundled into one. ``expanded``: the edges whose children it reads are appended
    there."""
    import heapq

    out: list[TreeNode] = []
    heap: list[tuple[int, int, int, _Edge]] = []
    seq = 0

    def children(e: _Edge, at: int) -> None:
        nonlocal seq
        if expanded is not None:
            expanded.append(e)
        kids = list(e.children.values()) if e.children else []
        alone = [c for c in kids if c.n < 2]
        if alone:
            out.append(TreeNode(at, e.end * bs, max(c.end for c in alone) * bs, len(alone), len(alone)))
        for c in kids:
            if c.n >= 2:
                heapq.heappush(heap, (-c.n, seq, at, c))
                seq += 1

    children(tree.root, -1)
    while heap and len(out) < max_nodes:
        _, _, parent, e = heapq.heappop(heap)
        out.append(TreeNode(parent, e.start * bs, e.end * bs, e.n, 0, fork_at.get(id(e))))
        children(e, len(out) - 1)
    return tuple(out)


def _prune_to_summary(tree: PrefixTree) -> None:
    """Cut the tree below the edges :func:`_summary` does not expand: the summary of what is left is the same
    (it reads the children of the edges it expands only, and the length and request count of those children), and
    the rest of the tree (most of it, on a long log) is freed."""
    expanded: list[_Edge] = []
    _summary(tree, 1, {}, expanded=expanded)
    keep = {id(e) for e in expanded}
    for e in expanded:
        for c in (e.children or {}).values():
            if id(c) not in keep:
                c.children = None


@dataclass(frozen=True)
class MoveSpan:
    """What FX001/FX007 move out of one request's shared prefix: a line of a field, as characters of that field
    (``start``/``end`` count in the field's own text, the line's newline included)."""

    code: str
    cause: str
    path: str
    start: int
    end: int
    text: str
    move: Any = field(default=None, repr=False, compare=False)


@dataclass(frozen=True, kw_only=True)
class ForkReport:
    schema_version: int = SCHEMA_VERSION
    requests: int
    query_tokens: int
    block_size: int
    capacity_blocks: int | None
    forks: tuple[Fork, ...]
    #: no-eviction hits as logged, and with every fixable fork fixed
    hit_tokens: int
    fixed_hit_tokens: int
    #: the same at ``capacity_blocks`` (None without one)
    hit_tokens_at_capacity: int | None = None
    fixed_hit_tokens_at_capacity: int | None = None
    #: tree passes and replays run (each a pass over the requests)
    passes: int = 0
    replays: int = 0
    notes: tuple[str, ...] = ()
    #: per request (in log order): the no-eviction hit tokens it gains with every fixable fork fixed (negative
    #: where a move costs it some); they add up to ``fixed_hit_tokens - hit_tokens``
    request_gains: Sequence[int] = field(default=(), repr=False)
    #: the tree's top branches as logged, and with every fixable fork fixed (:func:`_summary`), for a picture
    tree: tuple[TreeNode, ...] = ()
    fixed_tree: tuple[TreeNode, ...] = ()
    _plan: tuple = field(default=(), repr=False, compare=False)
    _tokenizer: Any = field(default=None, repr=False, compare=False)
    #: (id of a fork, its line move)
    _moves: tuple = field(default=(), repr=False, compare=False)
    #: the analysis's re-renders under the plan's tools counterfactuals and the store they are packed in, for
    #: :meth:`spans_to_move` on the analysed requests (None: re-rendered when asked)
    _rendered: Any = field(default=None, repr=False, compare=False)
    _store: Any = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")
             and f.name != "request_gains"}
        d["forks"] = [f.to_dict() for f in self.forks]
        d["tree"] = [asdict(n) for n in self.tree]
        d["fixed_tree"] = [asdict(n) for n in self.fixed_tree]
        d["notes"] = list(self.notes)
        return d

    def spans_to_move(self, request: ForkRequest, *, analysed: bool = False) -> tuple[MoveSpan, ...]:
        """For one request of the analysed log, every line that a fixable line fork moves out of its shared
        prefix, in the order the analysis moved them, located in the request's own fields. ``analysed``: the
        request is the analysis's own (its store's, by index): its re-render under a tools fix is the analysis's."""
        tools = [t for t in self._plan if isinstance(t, _Tools)]
        if analysed and self._rendered is not None:
            v = _view(request, tools, self._tokenizer, self._rendered, self._store)
        else:
            v = _view(request, tools, self._tokenizer)
        out = []
        for t in self._plan:
            if not isinstance(t, _LineMove):
                continue
            sp = t.span(v)
            if sp is None or sp[1] <= sp[0]:
                continue
            moved = _locate_chars(v, sp[2], sp[3], t)
            if moved is not None:
                out.append(moved)
            v.move(sp[0], sp[1])
        return tuple(out)


def _locate_chars(v: _View, start: int, end: int, t: _LineMove) -> MoveSpan | None:
    if v.tok is None or v.text is None:
        return None
    for sp in v.tok.spans:
        if sp.start <= start < sp.end:
            lo = start - sp.start + sp.offset
            hi = min(end, sp.end) - sp.start + sp.offset
            return MoveSpan(t.code, t.cause, sp.field, lo, hi, v.text[start:min(end, sp.end)], t)
    return None


def fork_span(report: ForkReport, fork: Fork, request: ForkRequest) -> MoveSpan | None:
    """The span ``fork`` moves out of ``request`` (None when the request does not pass through that fork or the
    fork is not a line fork)."""
    move = dict(report._moves).get(id(fork))
    if move is None:
        return None
    return next((s for s in report.spans_to_move(request) if s.move is move), None)


# ----------------------------------------------------------------------------------------------- engine


_UNKNOWN: Any = object()


def _view(r: ForkRequest, tools: Sequence[_Tools], tokenizer: Any, memo: Any = None,
          store: RequestStore | None = None, ident: Any = _UNKNOWN) -> _View:
    """``r`` under the tools counterfactuals in ``tools`` (re-rendered when one applies; ``memo`` keeps
    re-renders, packed by ``store`` when given). ``ident``: the sorted identities of ``r``'s tools, when known."""
    if tools and ident is _UNKNOWN:
        mine = _request_tools(r)
        ident = tuple(sorted(_tool_identity(t) for t in mine)) if mine else None
    if tools and ident:
        for t in tools:
            if t.identities == ident:
                if r.request is None and _as_given(r, t.reference):
                    break  # the re-render would be the request's own render: nothing to render
                key = (r.index, id(t))
                if memo is not None and key in memo:
                    got = memo[key]
                    v = _View(r, *(store.unpack_render(got, _rendered_prompt(r, t)) if store is not None else got))
                else:
                    v = _rerendered(r, t.reference, tokenizer)
                    if memo is not None:
                        parts = (v.base, v.text, v.starts, v.tok)
                        memo[key] = store.pack_render(*parts) if store is not None else parts
                v.tools = t
                return v
    return _View(r, r.ids, r.text, r.starts, r.tokenized)


def _as_given(r: ForkRequest, reference: Sequence[Any]) -> bool:
    """Whether a chat request already lists ``reference``'s tools in its order, each serialized to the same bytes
    (key order and value types included): then the template reads the same tools and renders the same text."""
    mine = r.tokenized.prompt.tools if r.tokenized is not None else None
    if not mine or len(mine) != len(reference):
        return False
    return all(a is b or compact(a) == compact(b) for a, b in zip(mine, reference))


def _rendered_prompt(r: ForkRequest, t: _Tools) -> Any:
    """The prompt of ``r``'s re-render under ``t`` (what :func:`_rerendered` rendered)."""
    assert r.tokenized is not None
    return r.tokenized.prompt if r.request is not None else replace(r.tokenized.prompt, tools=tuple(t.reference))


def _rerendered(r: ForkRequest, tools: Sequence[Any], tokenizer: Any) -> _View:
    if r.request is not None:
        ids, text, starts, tok = canonical_tokens(r.request, _VOCAB, tools)
        v = _View(r, ids, text, starts, tok)
    else:
        assert r.tokenized is not None and tokenizer is not None
        p = r.tokenized.prompt
        opts = r.tokenized.render_opts or {"add_generation_prompt": True, "template_vars": {}}
        t = tokenizer.tokenize_many([replace(p, tools=tuple(tools))], add_generation_prompt=opts["add_generation_prompt"],
                                    template_vars=opts["template_vars"])[0]
        fr = _from_tokenized(r.index, r.line, t)
        v = _View(r, fr.ids, fr.text, fr.starts, fr.tokenized)
    return v


#: canonical re-renders share one vocabulary per process (ids only need to agree within a run)
_VOCAB: dict[str, int] = {}


class _PlanKeys:
    """Each request's block keys under one plan (8 bytes a key, in a temporary file), its token count, and a bit
    per counterfactual of the plan that changed its view (8 bytes a request in memory, plus the count's 8)."""

    #: counterfactuals a record tells apart (a bit each); a longer plan is not recorded
    MAX_PLAN = 64

    def __init__(self) -> None:
        self._disk = Spool()
        self.tokens = array("q")
        self.masks = array("Q")

    def add(self, tokens: int, keys: Sequence[int], changed: Iterable[int]) -> None:
        self._disk.put_bytes(array("q", keys).tobytes())
        self.tokens.append(tokens)
        mask = 0
        for j in changed:
            mask |= 1 << j
        self.masks.append(mask)

    def keys(self, k: int) -> array:
        got = array("q")
        got.frombytes(self._disk.get_bytes(k))
        return got


class _Analyzer:
    def __init__(self, requests: RequestStore, *, tokenizer: Any, block_size: int,
                 capacity_blocks: int | None, user_fields: Sequence[str], max_forks: int, max_values: int,
                 progress: Callable[[int], None] | None = None):
        self.reqs = requests
        self.progress = progress
        self._viewed = 0  # requests viewed since the last progress call
        self.tok = tokenizer
        self.bs = block_size
        self.cap = capacity_blocks
        self.user_fields = tuple(user_fields)
        self.max_forks = max_forks
        self.max_values = max_values
        self.passes = 0
        self.replays = 0
        self.notes: list[str] = []
        #: tools counterfactuals re-render a request once (request index, counterfactual) -> view parts (packed)
        self.rendered = _RenderTable()

    # one request under a plan ------------------------------------------------------------------------
    def view(self, k: int, plan: Sequence[Any], changed: list[int] | None = None) -> _View:
        """Request ``k`` under ``plan``; ``changed`` gets the index in ``plan`` of each counterfactual that changed
        it (the tools one it was re-rendered under, each line move that moved something)."""
        if self.progress is not None:
            self._viewed += 1
            if self._viewed >= 256:  # (a replay views every request: its progress, counted a batch at a time)
                self.progress(self._viewed)
                self._viewed = 0
        tools = [t for t in plan if isinstance(t, _Tools)]
        v = _view(self.reqs[k], tools, self.tok, self.rendered, self.reqs, self.reqs.tool_set(k) if tools else None)
        if changed is not None and v.tools is not None:
            changed.append(next(j for j, t in enumerate(plan) if t is v.tools))
        for j, t in enumerate(plan):
            if isinstance(t, _LineMove) and t.apply(v) and changed is not None:
                changed.append(j)
        return v

    def _keys(self, plan: Sequence[Any], record: _PlanKeys | None = None,
              reuse: _PlanKeys | None = None, without: int = -1) -> Iterator[tuple[int, int, Sequence[int]]]:
        """Each request's token count and block keys under ``plan``. ``record`` (a fresh :class:`_PlanKeys`) keeps
        them and which counterfactuals changed each request. ``reuse`` (one recorded under a plan that is
        ``plan`` with the counterfactual at index ``without`` added back, or ``plan`` itself with ``without``
        -1) gives them for the requests that counterfactual did not change: its removal leaves their views as
        they were (the others apply in the same order to the same tokens)."""
        bs = self.bs
        reqs = self.reqs
        bit = 1 << without if without >= 0 else 0
        for k in range(len(reqs)):
            if reuse is not None and not reuse.masks[k] & bit:
                yield k, reuse.tokens[k], reuse.keys(k)
                continue
            changed: list[int] | None = [] if record is not None else None
            ids = self.view(k, plan, changed).ids if plan else reqs.ids(k)
            keys = block_keys(ids, bs, reqs.salt(k))
            if record is not None:
                record.add(len(ids), keys, changed or ())
            yield k, len(ids), keys

    def tree_pass(self, plan: Sequence[Any], per_request: array | None = None) -> tuple[PrefixTree, int]:
        """The tree of the log under ``plan``, and its no-eviction hits (the blocks each request finds in the tree
        before it is added, capped at ``L - 1`` tokens as vLLM's lookup is: ``simulate``'s infinite policy,
        which the tests check it against); each request's hits appended to ``per_request`` when given."""
        self.passes += 1
        tree = PrefixTree()
        hits = 0
        bs = self.bs
        for k, n, keys in self._keys(plan):
            found = tree.insert(array("q", keys), k)
            h = min(found, (n - 1) // bs) * bs
            hits += h
            if per_request is not None:
                per_request.append(h)
        return tree, hits

    def replay(self, plan: Sequence[Any], capacity: bool = False, per_request: array | None = None,
               record: _PlanKeys | None = None, reuse: _PlanKeys | None = None, without: int = -1) -> int:
        """Hits of the log under ``plan`` through :func:`simulate`: no eviction, or vLLM's pool at capacity (each
        request's hits appended to ``per_request`` when given). ``record``, ``reuse``, ``without``: as
        :meth:`_keys` reads them."""
        self.replays += 1
        trace = (TraceRequest(index=k, line=self.reqs.line(k), prompt_tokens=n, hash_ids=keys, hash_block_size=self.bs)
                 for k, n, keys in self._keys(plan, record, reuse, without))
        if capacity:
            rep = simulate(trace, policy="vllm", block_size=self.bs, capacity_blocks=self.cap,
                           per_request=per_request is not None)
        else:
            rep = simulate(trace, policy="infinite", block_size=self.bs, per_request=per_request is not None,
                           compact=True)
        if per_request is not None:
            per_request.extend(int(h.hit_tokens) for h in rep.per_request or ())
        return int(rep.hit_tokens)

    # analysis ------------------------------------------------------------------------------------------
    def run(self, max_passes: int) -> ForkReport:
        plan: list[Any] = []
        drafts: dict[tuple, dict] = {}
        hits0 = fixed = 0
        base = array("q")
        first: PrefixTree | None = None
        for p in range(max_passes):
            tree, hits = self.tree_pass(plan, base if p == 0 else None)
            added = self._forks_of(tree, plan, drafts)
            if p == 0:  # the first tree is summarized at the end: only the part the summary reads is kept
                hits0, first = hits, tree
                _prune_to_summary(first)
            tree.leaves, tree.depths = [], array("q")  # a request's path is only needed in its own pass
            del tree  # (not alive while the next pass builds its own)
            if not added:
                break
            plan.extend(added)
        else:
            self.notes.append(f"stopped after {max_passes} tree passes: forks below the last ones moved were not "
                              "looked at")
        if plan:
            self.notes.append("tokens_lost: what keeping that one fork costs with every other fixable fork fixed, so "
                              "forks in one block each count the whole; fixed_hit_tokens has them all fixed")
        bare = self.reqs.bare
        if bare:
            self.notes.append(f"{bare} request(s) are token IDs only: their forks have no cause and nothing to move")
        # a counterfactual that recovers nothing with the others applied (it moves a line the branches need, or
        # costs a conversation its own reuse) leaves the plan, and the rest is measured again without it
        # each replay without one counterfactual views again only the requests that one changed: the others' keys
        # are read back from the replay under the whole plan
        lost: dict[int, int] = {}
        fixed = hits0
        per_fixed = array("q")
        rec: _PlanKeys | None = None
        while plan:
            per_fixed = array("q")
            rec = _PlanKeys() if len(plan) <= _PlanKeys.MAX_PLAN else None
            fixed = self.replay(plan, per_request=per_fixed, record=rec)
            lost = {id(t): fixed - self.replay([x for x in plan if x is not t], reuse=rec, without=j)
                    for j, t in enumerate(plan)}
            keep = [t for t in plan if lost[id(t)] > 0]
            if len(keep) == len(plan):
                break
            plan = keep
        if not plan:
            fixed = hits0
        gains = array("q", (f - b for f, b in zip(per_fixed, base))) if plan else array("q", bytes(8 * len(base)))
        lost_cap: dict[int, int] = {}
        cap0 = cap_fixed = None
        if self.cap is not None:
            cap0 = self.replay([], capacity=True)
            cap_fixed = self.replay(plan, capacity=True, reuse=rec) if plan else cap0
            for j, t in enumerate(plan):
                assert cap_fixed is not None
                lost_cap[id(t)] = cap_fixed - self.replay([x for x in plan if x is not t], capacity=True, reuse=rec,
                                                          without=j)
        del rec
        forks = []
        moves: list[tuple[int, _LineMove]] = []
        fork_at: dict[int, Fork] = {}    # id of a node of the first tree -> its fork
        for dr in drafts.values():
            t = dr.pop("plan", None)
            keep = dr.pop("keep")
            node = dr.pop("node", None)
            if t is None and not keep:
                continue
            tl = lost.get(id(t), 0)
            if t is not None and tl <= 0:
                continue  # a fix that recovers nothing: the fork costs no tokens
            at_cap = None if self.cap is None else max(lost_cap.get(id(t), 0), 0)
            forks.append(Fork(tokens_lost=max(tl, 0), tokens_lost_at_capacity=at_cap, **dr))
            if node is not None:
                fork_at[node] = forks[-1]
            if isinstance(t, _LineMove):
                moves.append((id(forks[-1]), t))
        forks.sort(key=lambda f: (-f.tokens_lost, -f.requests, f.shared_tokens))
        index = {id(f): k for k, f in enumerate(forks)}
        assert first is not None
        tree0 = _summary(first, self.bs, {n: index[id(f)] for n, f in fork_at.items()})
        tree1 = _summary(self.tree_pass(plan)[0], self.bs, {}) if plan else tree0
        return ForkReport(requests=len(self.reqs), query_tokens=self.reqs.tokens,
                          block_size=self.bs, capacity_blocks=self.cap, forks=tuple(forks), hit_tokens=hits0,
                          fixed_hit_tokens=fixed, hit_tokens_at_capacity=cap0, fixed_hit_tokens_at_capacity=cap_fixed,
                          passes=self.passes, replays=self.replays, notes=tuple(self.notes),
                          request_gains=gains, tree=tree0, fixed_tree=tree1, _plan=tuple(plan),
                          _tokenizer=self.tok, _moves=tuple(moves), _rendered=self._kept_renders(plan),
                          _store=self.reqs)

    def _kept_renders(self, plan: Sequence[Any]) -> _RenderTable | None:
        """The re-renders under the plan's tools counterfactuals (the others' are dropped)."""
        ids = {id(t) for t in plan if isinstance(t, _Tools)}
        return self.rendered.keep(ids) if ids else None

    def _forks_of(self, tree: PrefixTree, plan: list[Any], drafts: dict[tuple, dict]) -> list[Any]:
        """Classify the tree's new forks; the counterfactuals of the new fixable ones. A fork below one that gets a
        counterfactual in this pass waits for the next pass (its prefix changes once that one is moved)."""
        nodes = tree.forks()[:self.max_forks]
        if not nodes:
            return []
        took = tree.branches(nodes)
        sites = [site for node in nodes if (site := self._site(node, took[id(node)], plan)) is not None]
        self._values(sites, plan)
        added: list[Any] = []
        moved: set[int] = set()
        for site in sites:
            if site.key in drafts or _below(site.node, moved):
                continue
            dr, t = self._classify(site)
            if t is not None and any(isinstance(x, _Tools) and isinstance(t, _Tools) and x.identities == t.identities
                                     for x in plan + added):
                t = None
            dr["plan"] = t
            dr["node"] = id(site.node)
            drafts[site.key] = dr
            if t is not None:
                added.append(t)
                moved.add(id(site.node))
        return added

    def _site(self, node: _Edge, took: array, plan: Sequence[Any]) -> _Site | None:
        """A fork's representatives (one request per branch), the token where they split, and the line there."""
        assert node.children is not None
        children = sorted(node.children.values(), key=lambda c: -c.n)[:self.max_values]
        # the first branch against each other one in turn (two views alive, not one a branch): the shortest common
        # prefix, with the first branch that has it
        first = self.view(children[0].rep, plan)
        d, other = -1, first
        for c in children[1:]:
            v = self.view(c.rep, plan)
            cp = common_prefix_length(first.ids, v.ids)
            if d < 0 or cp < d:
                d, other = cp, v
        site = _Site(node, took, d, first.ids[:d], first, other)
        a = first.tokenized()
        if a is None or a.text is None:
            return site
        vstarts = a.encoding.starts if isinstance(a.encoding, _Offsets) else first.starts
        assert vstarts is not None
        c = vstarts[d] if d < len(vstarts) else len(a.text)
        ls = a.text.rfind("\n", 0, c) + 1
        holder = next((sp for sp in a.spans if sp.start <= c < sp.end), None)
        if holder is not None:
            ls = max(ls, holder.start)
        site.mover = _LineMove(d, max(bisect.bisect_right(vstarts, ls) - 1, 0), site.prefix, "", "")
        return site

    def _values(self, sites: Sequence[_Site], plan: Sequence[Any]) -> None:
        """Each request's diverging value at each fork it passes through (one pass over those requests): the line
        at the fork, or the order of its tools."""
        # the requests in log order, each with the sites it passes through (in their order): a site sees its own
        # requests in log order, its values kept in arrays beside them (16 bytes a request and site)
        tagged = heapq.merge(*(zip(site.took, repeat(k)) for k, site in enumerate(sites)))
        for r, group in groupby(tagged, key=lambda x: x[0]):
            mine = [sites[k] for _, k in group]
            v = self.view(r, plan) if any(s.mover is not None for s in mine) else None
            order = self.reqs.tool_order(r)
            for site in mine:
                site.tool_orders.append(site.orders.add(order) if order is not None else -1)
                val = None
                if site.mover is not None and v is not None:
                    sp = site.mover.span(v)
                    val = _value_text(v, sp) if sp is not None else None
                site.values.append(site.distinct.add(val) if val is not None else -1)

    def _classify(self, site: _Site) -> tuple[dict, Any]:
        node, d = site.node, site.d
        assert node.children is not None
        requests = len(site.took)
        distinct = len(site.distinct)
        base: dict[str, Any] = {"shared_tokens": d, "branches": len(node.children), "requests": requests,
                                "distinct_values": distinct, "keep": True}
        a, b = site.a.tokenized(), site.b.tokenized()
        if a is None or b is None:
            return {**base, "path": None, "char": None, "cause": "unexplained", "fixable": None, "keep": False,
                    "message": "token IDs only: no text to compare"}, None
        loc = a.location(d)
        path = loc.field
        if path is not None and re.search(r"(^|\.)tools\[\d+\]$", path):
            path = re.sub(r"\[\d+\]$", "", path)
        base.update(path=path if path is not None else ("<template>" if loc.in_template else None),
                    char=loc.char_offset if loc.char_offset is not None else loc.rendered_char_offset)
        cause = explain(a, b, d, self.tok)
        cid = cause.id if cause is not None else None
        detail = cause.message if cause is not None else ""
        if cid in _STRUCTURAL:
            code = fix_codes().get(cid)
            ref = _request_tools(self.reqs[site.a.req.index]) if code in ("FX002", "FX003") else None
            tools = _Tools(tuple(sorted(_tool_identity(x) for x in ref)), ref, code, cid) if ref and code else None
            if cid in ("tool_order", "tool_schema_key_order", "tools_changed"):
                base["distinct_values"] = len(site.orders)
            return {**base, "cause": cid, "fixable": code, "message": detail}, tools
        base["examples"] = tuple(_short(x) for x in site.distinct.texts[:3])
        mover = site.mover
        if mover is None or not _shares_after(mover, site.a, site.b):
            return {**base, "cause": "different_prompt", "fixable": None,
                    "keep": sum(1 for c in node.children.values() if c.n >= 2) >= 2,
                    "message": "the branches share nothing after the fork (different apps or prompts): legitimate, "
                               "nothing to move"}, None
        kept = self._shared_text(site, mover)
        moving = [t for t in site.distinct.texts if t not in kept]
        if kept:
            # some branches hold the shared text itself at the fork (a line inserted above it in the others): only
            # the inserted lines are values, and only their requests move
            distinct = len(moving)
            requests = sum(1 for at in site.values if at >= 0 and site.distinct.texts[at] not in kept)
            base.update(distinct_values=distinct, requests=requests, examples=tuple(_short(x) for x in moving[:3]))
            pair = classify_change(moving[0], moving[1]) if len(moving) >= 2 else None
            if pair is not None:
                va = pair[0]
                cid = "date_time" if va.is_date_time else "counter" if va.kind == "counter" else "volatile_id"
        if any(len(v) > MAX_VALUE_CHARS for v in moving):
            # the line at the fork is a paragraph in some branch (a line inserted in the others, or text that is
            # not a value): moving it would move what the branches share
            return {**base, "cause": cid or "unexplained", "fixable": None, "keep": False, "message": detail}, None
        predictor = self._predictor(site, kept)
        repeats = distinct < requests
        if predictor is not None:
            final = "per_user_value"
        elif cid in ("date_time", "volatile_id") or (cid == "counter" and not repeats) or cid in _TEXTUAL:
            final = cid
        elif repeats and distinct >= 2:
            final = "per_user_value"
        else:
            final = cid or "unexplained"
        code = fix_codes().get(final)
        if code in ("FX001", "FX007") and not _in_head(a, loc):
            # a line of the conversation's turns: history in the later requests of its conversation, which FX001
            # and FX007 keep append-only (they move lines of the request's head only): no fix to offer
            return {**base, "cause": final, "fixable": None, "predicted_by": predictor,
                    "message": _message(final, distinct, requests, predictor, detail, head=False)}, None
        move = replace(mover, code=code, cause=final, keep=kept) if code in ("FX001", "FX007") else None
        return {**base, "cause": final, "fixable": code, "predicted_by": predictor,
                "message": _message(final, distinct, requests, predictor, detail)}, move

    def _shared_text(self, site: _Site, mover: _LineMove) -> frozenset[str]:
        """The lines at a fork that are the text the branches share, not values: a branch's line that the other
        representative holds a few lines further on (:data:`MAX_SKIPPED_LINES`), where lines were inserted above
        it (a clock line on top of some requests' system prompt). Empty when every value would be one."""
        out: set[str] = set()
        for v in (site.a, site.b):
            sp = mover.span(v)
            if sp is None or v.text is None:
                continue
            own = _value_text(v, sp)
            after = set(v.text[sp[3]:sp[3] + 20000].split("\n")[:MAX_SKIPPED_LINES])
            out.update(t for t in site.distinct.texts if t != own and t.strip() and t in after)
        return frozenset(out) if len(out) < len(site.distinct) else frozenset()

    def _predictor(self, site: _Site, kept: frozenset[str] = frozenset()) -> str | None:
        """The coarsest log field whose value decides the diverging value (every request has it, each of its
        values goes with one diverging value, and it repeats), or None. The requests that hold a line of
        ``kept`` there are left out."""
        best: tuple[int, int, str] | None = None
        for rank, name in enumerate(self.user_fields):
            seen: dict[Any, str] = {}
            ok = True
            for r, at in zip(site.took, site.values):
                v = site.distinct.texts[at] if at >= 0 else None
                if v is not None and v in kept:
                    continue
                fv = dict(self.reqs.fields(r)).get(name)
                if v is None or fv is None or seen.setdefault(fv, v) != v:
                    ok = False
                    break
            if ok and len(seen) < len(site.took) and len(set(seen.values())) > 1:
                cand = (len(seen), rank, name)
                best = cand if best is None or cand < best else best
        return best[2] if best is not None else None


class _Site:
    """A fork under analysis: its node, the requests that go on into one of its children, the token where the
    branches split, two representatives that split there, the line move that would fix it, each request's value."""

    def __init__(self, node: _Edge, took: array, d: int, prefix: array, a: _View, b: _View):
        self.node, self.took, self.d, self.prefix, self.a, self.b = node, took, d, prefix, a, b
        self.key = (d, hash(prefix.tobytes()))
        self.mover: _LineMove | None = None
        #: beside ``took`` (the requests, in log order): each one's line at the fork and its tools in order, as
        #: indices into the distinct ones (-1: none)
        self.values = array("i")
        self.tool_orders = array("i")
        self.distinct = _Distinct()
        self.orders = _Distinct()


class _Distinct:
    """Distinct texts in the order first seen, each numbered."""

    __slots__ = ("_at", "texts")

    def __init__(self) -> None:
        self.texts: list[str] = []
        self._at: dict[str, int] = {}

    def add(self, text: str) -> int:
        k = self._at.get(text)
        if k is None:
            k = self._at[text] = len(self.texts)
            self.texts.append(text)
        return k

    def __len__(self) -> int:
        return len(self.texts)


def _below(node: _Edge, marked: set[int]) -> bool:
    e = node.parent
    while e is not None:
        if id(e) in marked:
            return True
        e = e.parent
    return False


def _short(text: str, n: int = 80) -> str:
    return text if len(text) <= n else text[:n - 3] + "..."


def _value_text(v: _View, sp: tuple[int, int, int, int]) -> str:
    assert v.text is not None
    return v.text[sp[2]:sp[3]].rstrip("\n")


def _shares_after(mover: _LineMove, va: _View, vb: _View) -> bool:
    """Whether the branches share text after the diverging line: from some line on (within
    :data:`MAX_SKIPPED_LINES` lines after it in each branch: a block of per-request lines may come first, of
    another length in each), the next :data:`MIN_SHARED_CHARS` characters are the same."""
    sa, sb = mover.span(va), mover.span(vb)
    if sa is None or sb is None or va.text is None or vb.text is None:
        return False
    ra = va.text[sa[3]:sa[3] + 20000].split("\n")[:MAX_SKIPPED_LINES + 64]
    rb = vb.text[sb[3]:sb[3] + 20000].split("\n")[:MAX_SKIPPED_LINES + 64]
    for i in range(min(MAX_SKIPPED_LINES, len(ra))):
        x = "\n".join(ra[i:])[:MIN_SHARED_CHARS]
        for j in range(min(MAX_SKIPPED_LINES, len(rb))):
            if len(x) == MIN_SHARED_CHARS and "\n".join(rb[j:]).startswith(x):
                return True
    return False


def _in_head(t: Tokenized, loc: Any) -> bool:
    """Whether ``loc`` is in the request's head, what FX001 and FX007 rewrite: not in a message, or in a system or
    developer message before the first turn of the conversation."""
    if loc.message_index is None:
        return True
    msgs = t.prompt.messages or ()
    return all(isinstance(m, dict) and m.get("role") in ("system", "developer") for m in msgs[:loc.message_index + 1])


def _message(cause: str, distinct: int, requests: int, predictor: str | None, detail: str, head: bool = True) -> str:
    if not head and cause in ("per_user_value", "date_time", "volatile_id", "counter"):
        return (f"a value that differs between requests ({distinct} values over {requests} requests) sits in a turn "
                "of the conversation, not in its system prompt or tools: the turns are history in later requests, "
                f"so nothing is moved. {detail}").strip()
    if cause == "per_user_value":
        by = f", predicted by the log field {predictor!r}" if predictor else ""
        return (f"a value that differs between requests but repeats for the same user or tenant ({distinct} values "
                f"over {requests} requests{by}) sits inside a prefix they otherwise share: move it after the shared "
                "part (FX007)")
    if cause in ("date_time", "volatile_id", "counter"):
        return (f"a per-request value ({distinct} values over {requests} requests) sits inside a prefix they "
                f"otherwise share: move it after the shared part (FX001). {detail}").strip()
    return detail


def pack_requests(requests: Iterable[ForkRequest] | Iterable[tuple[int, Any]], *, source: str = "",
                  tokenizer: Any = None, user_fields: Sequence[str] = USER_FIELDS,
                  add_generation_prompt: bool = True) -> RequestStore:
    """A :class:`RequestStore` of ``requests`` (read once, in order): :class:`ForkRequest` records, or ``(line,
    value)`` pairs turned into them with ``tokenizer`` (:func:`fork_requests`)."""
    store = RequestStore()
    it = iter(requests)
    first = next(it, None)
    if first is None:
        return store
    if isinstance(first, ForkRequest):
        store.add(first)
        for r in it:
            store.add(r)  # type: ignore[arg-type]
        return store
    for r in fork_requests(chain((first,), it), source=source, tokenizer=tokenizer,  # type: ignore[arg-type]
                           user_fields=user_fields, add_generation_prompt=add_generation_prompt):
        store.add(r)
    return store


def analyze_forks(requests: Iterable[ForkRequest] | Iterable[tuple[int, Any]], *, tokenizer: Any = None,
                  block_size: int = 16, capacity_blocks: int | None = None, user_fields: Sequence[str] = USER_FIELDS,
                  source: str = "", max_forks: int = 32, max_passes: int = 8, max_values: int = 10_000,
                  add_generation_prompt: bool = True, progress: Callable[[int], None] | None = None) -> ForkReport:
    """The shared-prefix tree of a log, its forks, their causes and costs (see the module docstring).

    ``requests``: :class:`ForkRequest` records, or ``(line, value)`` pairs, turned into them here with
    ``tokenizer`` (:func:`fork_requests`), read once: every counterfactual is a pass over the log, so they are
    kept packed (:class:`RequestStore`; pass one to share it: ``LogForks`` locates the moved lines in it). ``capacity_blocks``
    adds the at-capacity (vLLM LRU) replays. ``max_forks`` bounds the forks classified per pass (most requests
    first), ``max_values`` the branches whose values are compared per fork. ``progress(n)``: called as the
    replays view the requests (each replay counts them again).
    """
    if not 1 <= block_size <= 1 << 20:
        raise UsageError("`block_size` must be between 1 and 1,048,576")
    reqs = requests if isinstance(requests, RequestStore) else pack_requests(
        requests, source=source, tokenizer=tokenizer, user_fields=user_fields, add_generation_prompt=add_generation_prompt)
    if not reqs:
        raise InputError("no requests", source=source)
    analyzer = _Analyzer(reqs, tokenizer=tokenizer, block_size=block_size, capacity_blocks=capacity_blocks,
                         user_fields=user_fields, max_forks=max_forks, max_values=max_values, progress=progress)
    return analyzer.run(max_passes)


__all__ = ["fix_codes", "USER_FIELDS", "Fork", "ForkReport", "ForkRequest", "MoveSpan", "PrefixTree",
           "RequestStore", "TreeNode", "analyze_forks", "canonical_tokens", "fork_requests", "fork_span",
           "pack_requests"]
