"""The requests of a fork analysis: each request's served tokens (rendered through the chat template, with the
generation prompt, as ``simulate-prefix``/``fix``/``report`` render them), the character each token starts at in the
rendered text, the :class:`~cachectl.tokenization.Tokenized` (its token -> message/field/char mapping,
:class:`~cachectl.tokenization.Location`) and the log fields that may predict a per-user value (``user``,
``metadata.user_id``, a tenant field): :class:`ForkRequest`, built by :func:`fork_requests`. Without a tokenizer, a
provider request's canonical positions (tools -> system -> messages) are cut into word pieces
(:func:`canonical_tokens`): the same tree over approximate token counts.

Kept packed (:class:`RequestStore`, :func:`pack_requests`): every counterfactual is a pass over the whole log, so
every request is kept, as one zlib stream of its IDs, starts and text (compressed against the first request's,
which holds what most requests share; :mod:`..packed`) and its prompt pickled the same way: 2 to 3 KB a request on
a log of 400-token chat requests, where the parsed forms took some 16 KB, written to a temporary file (a
:class:`cachectl.spool.Spool`; in memory, an object of small fields a request). A pass rebuilds each request as it
reaches it (the tree pass as logged reads only the IDs); a tools counterfactual's re-renders are kept packed the
same way (:class:`_RenderTable`).
"""

from __future__ import annotations

import json
import pickle
import re
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from itertools import chain
from typing import Any

from ....errors import InputError
from ....inputs import PromptInput, Request, cache_salt_of, prompt_from_request, prompt_from_value, unwrap
from ....inputs.prompt import check_ids
from ....inputs.request import dumps_alike
from ....spool import Spool
from ....tokenization import KeptOffsets, Span, Tokenized, _lazy_chat_spans
from ..packed import ObjectCodec, RenderCodec
from ..trace import hashable_salt

#: log fields (dotted, in the body or its wrapper) that may predict a per-user value, looked at in this order
USER_FIELDS = ("user", "user_id", "metadata.user_id", "metadata.user", "safety_identifier", "metadata.tenant_id",
               "metadata.tenant", "tenant_id", "tenant", "prompt_cache_key")


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
        positions = list(tools) + [p for p in positions if p.segment != "tools"]
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
    tok = Tokenized(prompt, ids, text=text, encoding=KeptOffsets(starts, ends), spans=spans)
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
    a ``true``/``false`` are then validated at C speed; or ``(line, value, has_bool_literal, prompt)``, with the
    prompt already read from the value (a log's lines as ``fix`` and ``report`` hold them). (A record at a time,
    pushed: :class:`ForkRecords`.)"""
    made = ForkRecords(source=source, tokenizer=tokenizer, user_fields=user_fields,
                       add_generation_prompt=add_generation_prompt, batch_size=batch_size)
    for record in records:
        yield from made.add(record)
    yield from made.flush()


class ForkRecords:
    """:func:`fork_requests` a record at a time: ``add(record)`` gives the requests it completes (a batch is
    tokenized once it holds ``batch_size`` prompts), ``flush()`` the rest. :meth:`known` gives the token IDs of a
    prompt of the batch tokenized last, to another reader of the same lines."""

    def __init__(self, *, source: str, tokenizer: Any = None, user_fields: Sequence[str] = USER_FIELDS,
                 add_generation_prompt: bool = True, batch_size: int = 256):
        self.source, self.tokenizer = source, tokenizer
        self.add_generation_prompt, self.batch_size = add_generation_prompt, batch_size
        self._names = [(n, n.split(".")) for n in user_fields]
        self._vocab: dict[str, int] = {}
        self._pending: list[tuple[int, int, PromptInput, tuple, Any]] = []
        self._index = 0
        #: the batch tokenized last: id of its prompt object -> (the prompt, its token IDs)
        self._last: dict[int, tuple[PromptInput, Sequence[int]]] = {}

    def known(self, prompt: PromptInput, add_generation_prompt: bool) -> Sequence[int] | None:
        """The token IDs of ``prompt`` (this very object), rendered with ``add_generation_prompt``, where the batch
        tokenized last held it; else None."""
        got = self._last.get(id(prompt))
        return got[1] if got is not None and got[0] is prompt and add_generation_prompt == self.add_generation_prompt \
            else None

    def flush(self) -> Iterator[ForkRequest]:
        pending = self._pending
        if not pending:
            return
        # (the render memo is not written: the store it is packed into keeps each render, and the memo reads it
        # there: :meth:`RequestStore.add`)
        toks = self.tokenizer.tokenize_many([p for _, _, p, _, _ in pending],
                                            add_generation_prompt=self.add_generation_prompt, keep=False)
        self._last = {id(p): (p, t.ids) for (_, _, p, _, _), t in zip(pending, toks)}
        for (idx, line, _, flds, salt), t in zip(pending, toks):
            yield _from_tokenized(idx, line, t, flds, salt)
        pending.clear()

    def add(self, record: tuple) -> Iterator[ForkRequest]:
        source, tokenizer = self.source, self.tokenizer
        line, value = record[0], record[1]
        flds = _fields(value, self._names)
        salt = hashable_salt(cache_salt_of(value), source=source, line=line)
        key = next((k for k in _ID_KEYS if k in value), None) if isinstance(value, dict) else None
        index = self._index
        if key is not None:  # a token-ID trace line, validated at C speed where the raw line holds no bool
            check_ids(value[key], source=source, line=line, field=key, maybe_bool=record[2] if len(record) > 2 else True)
            self._index += 1
            yield ForkRequest(index=index, line=line, ids=_id_array(value[key]), fields=flds, salt=salt)
            return
        prompt = record[3] if len(record) > 3 else prompt_from_value(value, source=source, line=line)
        if prompt.ids is not None:
            self._index += 1
            yield ForkRequest(index=index, line=line, ids=_id_array(prompt.ids), fields=flds, salt=salt)
        elif tokenizer is not None:
            self._index += 1
            self._pending.append((index, line, prompt, flds, salt))
            if len(self._pending) >= self.batch_size:
                yield from self.flush()
        elif prompt.request is not None:
            self._index += 1
            ids, text, starts, tok = canonical_tokens(prompt.request, self._vocab)
            yield ForkRequest(index=index, line=line, ids=ids, text=text, starts=starts, tokenized=tok, fields=flds,
                              salt=salt, request=prompt.request)
        else:
            raise InputError("a raw-text or chat-list line needs `tokenizer` to become tokens", source=source,
                             line=line)


def _from_tokenized(index: int, line: int | None, t: Tokenized, flds: tuple = (), salt: Any = None) -> ForkRequest:
    enc = t.encoding
    if enc is not None and not isinstance(enc, KeptOffsets):
        t = t.compact(offsets=True)  # (a fresh encoding's offsets, read once: the starts, and the ends kept with them)
    else:
        t = t.compact()
        t.encoding = enc  # (offsets kept already, the render memo's: the store keeps the ends too)
    if isinstance(t.encoding, KeptOffsets):  # (the starts are a column)
        starts: array | None = t.encoding.starts  # type: ignore[assignment]
    else:  # (read back from the tokenizer's memo, or encoded again where it kept none)
        offsets = t.offsets()
        starts = array("I", (s for s, _ in offsets)) if offsets is not None else None
    return ForkRequest(index=index, line=line, ids=t.ids, text=t.text, starts=starts, tokenized=t, fields=flds,
                       salt=salt)


def _tool_identity(t: Any) -> str:
    if isinstance(t, dict):
        return dumps_alike(t, sort_keys=True, ensure_ascii=False)
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


class _Packed:
    """One request of a :class:`RequestStore` as it is packed and read back (the store keeps each field in a column
    of its own): its render packed (:class:`~..packed.RenderCodec`), its prompt pickled and packed (``cold``), the
    chat spans once an instrumented render found them, and the small fields the passes read for every request (its
    tools' identities, interned; its log fields and cache salt). Also a re-render of a :class:`_RenderTable`."""

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
        #: where the spans found later are kept: (the :class:`RequestStore` or :class:`_RenderTable`, its key there)
        self.where: tuple[Any, Any] | None = None


_TEXT_OFFSETS, _KNOWN_OFFSETS = 1, 2
#: a request without a line number, in the store's column of lines
_NO_LINE = -(2 ** 63)


class Later:
    """A prompt made (read from a store, unpickled) when first called for, then kept: ``Later(fn)()``."""

    __slots__ = ("_fn", "_got")

    def __init__(self, fn: Callable[[], PromptInput]) -> None:
        self._fn: Callable[[], PromptInput] | None = fn
        self._got: Any = None

    def __call__(self) -> PromptInput:
        if self._fn is not None:
            self._got, self._fn = self._fn(), None
        return self._got


#: a :class:`_RenderTable` entry: the request already lists the counterfactual's tools as it does (no re-render)
AS_GIVEN: Any = object()
_GIVEN = -2  # (how a table's column of spool places holds it)


_PROMPT_SLOT: Any = Tokenized.__dict__["prompt"]  # (the member of Tokenized's slots that holds the prompt)


class _Deferred(Tokenized):
    """A stored request's :class:`Tokenized` whose prompt is read (unpickled) the first time it is asked for."""

    __slots__ = ("_load",)

    def __init__(self, load: Callable[[], PromptInput], *args: Any) -> None:
        super().__init__(None, *args)  # type: ignore[arg-type]  # (read by the property below)
        self._load: Callable[[], PromptInput] | None = load

    @property
    def prompt(self) -> PromptInput:
        load = self._load
        if load is not None:
            self._load = None
            _PROMPT_SLOT.__set__(self, load())
        return _PROMPT_SLOT.__get__(self, Tokenized)

    @prompt.setter
    def prompt(self, value: PromptInput) -> None:
        self._load = None
        _PROMPT_SLOT.__set__(self, value)


class RequestStore(Sequence[ForkRequest]):
    """The requests of one fork analysis, packed: each counterfactual replays the whole log, so every request is
    kept, as one zlib stream of its IDs, starts and text (:class:`~..packed.RenderCodec`, against the first request's
    bytes) and its prompt pickled the same way; a few hundred bytes to a couple of KB a request where the parsed
    forms take some 20 KB, on disk. In memory a request is a row of columns: five ints in arrays (its index, line and
    three places in the spool), four references in lists (its render options, tools, log fields and salt, the first
    three interned), about 72 bytes where an object a request took about 250 with its ints. Indexing rebuilds a
    :class:`ForkRequest` (the last few are kept); :meth:`ids` reads only the IDs. Add requests in log order with
    :meth:`add`."""

    def __init__(self, recent: int = 64):
        # zlib's fastest level: on 2,000 requests 0.27 s of compressing against 0.47 at level 6, and 18% more bytes,
        # on disk
        self._render = RenderCodec(1)
        self._objects = ObjectCodec(1)
        #: the packed bytes, in a temporary file (a pass reads each request's once)
        self._disk = Spool()
        # the columns: a request's index, line (_NO_LINE: none), places in the spool of its packed render, prompt
        # and spans (-1: none), render options, tools, log fields and cache salt; a request the store cannot pack,
        # kept whole
        self._index, self._line = array("q"), array("q")
        self._hot, self._cold, self._spans_at = array("q"), array("q"), array("q")
        self._meta_of: list[tuple | None] = []
        self._tools_of: list[tuple[str, tuple[str, ...]] | None] = []
        self._fields: list[tuple] = []
        self._salt: list[Any] = []
        self._whole: dict[int, ForkRequest] = {}
        self._interned: dict[Any, Any] = {}
        self._meta: dict[tuple, tuple] = {}
        self._tools: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._recent: OrderedDict[int, ForkRequest] = OrderedDict()
        self._keep = recent
        #: token count and token-ID-only requests (no text), over all requests
        self.tokens = 0
        self.bare = 0

    def __len__(self) -> int:
        return len(self._index)

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
            self._whole[len(self._index)] = r
        else:
            tok = r.tokenized
            memo = getattr(tok.tokenizer, "render_memo", None) if tok is not None else None
            if memo is not None and tok is not None and tok.memo_key is not None and rec.hot >= 0:
                # (the render memo reads this render here: it need not keep a copy of its own)
                memo.link(tok.memo_key, self._render_at, rec.hot)
        self._index.append(rec.index)
        self._line.append(_NO_LINE if rec.line is None else rec.line)
        self._hot.append(rec.hot)
        self._cold.append(rec.cold)
        self._spans_at.append(rec.spans)
        self._meta_of.append(rec.meta)
        self._tools_of.append(rec.tools)
        try:  # (the same user fields on many requests: one tuple; 1, 1.0 and True kept apart by their types)
            fields = self._interned.setdefault((rec.fields, tuple(type(v) for _, v in rec.fields)), rec.fields)
        except TypeError:  # a value that is not hashable
            fields = rec.fields
        self._fields.append(fields)
        self._salt.append(rec.salt)

    def _row(self, k: int) -> _Packed:
        """Request ``k`` as a :class:`_Packed` (its spans, once found, kept in the store's column)."""
        line = self._line[k]
        rec = _Packed(self._index[k], None if line == _NO_LINE else line, self._fields[k], self._salt[k])
        rec.hot, rec.cold, rec.spans, rec.meta = self._hot[k], self._cold[k], self._spans_at[k], self._meta_of[k]
        rec.where = (self, k)
        return rec

    def spans_at(self, k: int) -> int:
        return self._spans_at[k]

    def set_spans(self, k: int, index: int) -> None:
        self._spans_at[k] = index

    def _pack(self, rec: _Packed, r: ForkRequest) -> None:
        ids = r.ids if isinstance(r.ids, array) else _id_array(r.ids)
        tok = r.tokenized
        ends = None
        if tok is None:
            if r.request is not None:
                raise ValueError("a request without its Tokenized")
        else:
            if tok.text != r.text or (tok.ids is not r.ids and _id_array(tok.ids) != ids):
                raise ValueError("a Tokenized of other text or tokens")
            if isinstance(tok.encoding, KeptOffsets):
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
            if lazy and (tok.render_opts is None or tok.tokenizer is None or r.request is not None):
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
        got = self._whole.get(k) if self._whole else None
        if got is None:
            got = self._unpack(self._row(k))
        self._recent[k] = got
        if len(self._recent) > self._keep:
            self._recent.popitem(last=False)
        return got

    def _unpack(self, rec: _Packed) -> ForkRequest:
        ids, starts, ends, text = self._render.unpack(self._disk.get_bytes(rec.hot))
        tok = request = None
        if rec.cold >= 0 and rec.meta is not None and rec.meta[4]:
            # a chat render: its prompt is unpickled when something reads it (a cause, a re-render, spans not found
            # yet), not for every view (the passes read the render and the spans)
            tok = self._tokenized(rec, Later(partial(self._prompt, rec.cold)), ids, starts, ends, text, None)
        elif rec.cold >= 0:
            prompt, request, spans = self._objects.loads(self._disk.get_bytes(rec.cold))
            tok = self._tokenized(rec, prompt, ids, starts, ends, text, spans)
        return ForkRequest(index=rec.index, line=rec.line, ids=ids, text=text, starts=starts, tokenized=tok,
                           fields=rec.fields, salt=rec.salt, request=request)

    def _render_at(self, hot: int) -> tuple:
        """(ids, starts, ends, text) of the render packed at ``hot`` in the spool."""
        return self._render.unpack(self._disk.get_bytes(hot))

    def _prompt(self, cold: int) -> PromptInput:
        return self._objects.loads(self._disk.get_bytes(cold))[0]

    def _tokenized(self, rec: _Packed, prompt: Any, ids: array, starts: Any, ends: Any, text: str | None,
                   spans: Any) -> Tokenized:
        """The request's :class:`Tokenized`; ``prompt``: the prompt, or a :class:`Later` that reads it when it is first
        asked for."""
        assert rec.meta is not None
        kind, special, opts, handle, _ = rec.meta
        enc = KeptOffsets(starts, ends) if kind == _KNOWN_OFFSETS else None
        if isinstance(prompt, Later):
            found = spans if spans is not None else partial(self._spans, rec, prompt, text)
            return _Deferred(prompt, ids, text, enc, found, handle, special, opts)
        return Tokenized(prompt, ids, text, enc,
                         spans if spans is not None else partial(self._spans, rec, lambda: prompt, text),
                         handle, special, opts)

    def _spans(self, rec: _Packed, prompt: Callable[[], Any], text: str | None) -> tuple[Span, ...]:
        """A chat render's spans (an instrumented render, once per request: kept packed); ``prompt()`` gives the
        prompt, read only when they are found here."""
        if rec.where is not None:  # (found since ``rec`` was read, through another view of the request)
            rec.spans = rec.where[0].spans_at(rec.where[1])
        if rec.spans >= 0:
            return self._objects.loads(self._disk.get_bytes(rec.spans))
        assert rec.meta is not None and text is not None
        _, _, opts, handle, _ = rec.meta
        got = tuple(_lazy_chat_spans(handle, prompt(), text, opts)())
        rec.spans = self._disk.put_bytes(self._objects.dumps(got))
        if rec.where is not None:
            table, key = rec.where
            table.set_spans(key, rec.spans)
        return got

    def ids(self, k: int) -> Sequence[int]:
        """Request ``k``'s token IDs, without the rest."""
        whole = self._whole.get(k) if self._whole else None
        return whole.ids if whole is not None else self._render.ids(self._disk.get_bytes(self._hot[k]))

    def line(self, k: int) -> int | None:
        line = self._line[k]
        return None if line == _NO_LINE else line

    def salt(self, k: int) -> Any:
        return self._salt[k]

    def fields(self, k: int) -> tuple:
        return self._fields[k]

    def tool_order(self, k: int) -> str | None:
        """Request ``k``'s tools' identities in order, joined by newlines (None without tools)."""
        t = self._tools_of[k]
        return t[0] if t is not None else None

    def tool_set(self, k: int) -> tuple[str, ...] | None:
        """The same, sorted (the set a tools counterfactual matches)."""
        t = self._tools_of[k]
        return t[1] if t is not None else None

    # a re-render under a tools counterfactual (kept packed the same way) ----------------------------------
    def pack_render(self, ids: array, text: str | None, starts: Any, tok: Tokenized | None) -> _Packed | tuple:
        rec = _Packed(-1, None, (), None)
        try:
            assert tok is not None
            lazy = callable(tok._spans)
            self._pack(rec, ForkRequest(index=-1, line=None, ids=ids, text=text, starts=starts, tokenized=tok))
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
    :meth:`RequestStore.pack_render`, as the memo :func:`~.views._view` reads and writes: per counterfactual, arrays of the
    packed parts' spool indices and a list of their (interned) render options, 24 bytes a request where a dict of
    the packed objects took some 400; a re-render the store could not pack is kept as it is. ``store``: the
    :class:`RequestStore` that packs them."""

    __slots__ = ("_odd", "_slots", "store")

    def __init__(self, store: RequestStore) -> None:
        self.store = store
        self._slots: dict[int, tuple[array, array, list]] = {}   # id -> (hot, spans, meta), by request index
        self._odd: dict[tuple[int, int], Any] = {}

    def get(self, key: tuple[int, int]) -> Any:
        """The re-render at ``key`` (None: not rendered yet; :data:`AS_GIVEN`: none needed)."""
        if key in self._odd:
            return self._odd[key]
        k, slot = key
        got = self._slots.get(slot)
        if got is None or k >= len(got[0]) or got[0][k] < 0:
            return AS_GIVEN if got is not None and k < len(got[0]) and got[0][k] == _GIVEN else None
        rec = _Packed(-1, None, (), None)
        rec.hot, rec.spans, rec.meta, rec.where = got[0][k], got[1][k], got[2][k], (self, key)
        return rec

    def __setitem__(self, key: tuple[int, int], rec: Any) -> None:
        if not isinstance(rec, _Packed) and rec is not AS_GIVEN:
            self._odd[key] = rec
            return
        k, slot = key
        hot, spans, meta = self._slots.setdefault(slot, (array("q"), array("q"), []))
        if k >= len(hot):
            grow = k + 1 - len(hot)
            hot.extend(array("q", [-1]) * grow)
            spans.extend(array("q", [-1]) * grow)
            meta.extend([None] * grow)
        if rec is AS_GIVEN:
            hot[k] = _GIVEN
        else:
            hot[k], spans[k], meta[k] = rec.hot, rec.spans, rec.meta

    def spans_at(self, key: tuple[int, int]) -> int:
        k, slot = key
        got = self._slots.get(slot)
        return got[1][k] if got is not None and k < len(got[1]) else -1

    def set_spans(self, key: tuple[int, int], index: int) -> None:
        k, slot = key
        if slot in self._slots and k < len(self._slots[slot][1]):
            self._slots[slot][1][k] = index

    def keep(self, slots: set[int]) -> _RenderTable | None:
        """Only the re-renders under these counterfactuals (None if that leaves none)."""
        self._slots = {s: v for s, v in self._slots.items() if s in slots}
        self._odd = {k: v for k, v in self._odd.items() if k[1] in slots}
        return self if self._slots or self._odd else None


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
