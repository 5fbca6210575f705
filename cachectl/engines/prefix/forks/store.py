"""The requests of a fork analysis kept packed (:class:`RequestStore`, :func:`pack_requests`): every counterfactual is a
pass over the whole log, so every request is kept, as one compressed stream of its IDs, starts and text (against the
first request's, which holds what most requests share; :mod:`..packed`) and its prompt pickled the same way: 2 to 3 KB a
request on a log of 400-token chat requests, where the parsed forms took some 16 KB, written to a temporary file (a
:class:`cachectl.spool.Spool`; in memory, a row of small columns a request). A pass rebuilds each request as it reaches
it (the tree pass as logged reads only the IDs; a chat request's prompt is read when first asked for: :class:`Later`); a
tools counterfactual's re-renders are kept packed the same way (:class:`_RenderTable`).
"""

from __future__ import annotations

import pickle
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from functools import partial
from itertools import chain
from typing import Any

from ....inputs import PromptInput
from ....spool import Spool
from ....tokenization import KeptOffsets, Span, Tokenized, _lazy_chat_spans
from ..packed import ObjectCodec, RenderCodec
from .requests import USER_FIELDS, ForkRequest, _id_array, _request_tools, _tool_identity, exact_tools, fork_requests


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
        #: (the tools' identities in order, joined by newlines; the same sorted; a chat prompt's
        #: :func:`~.requests.exact_tools`), interned; None without tools
        self.tools: tuple[str, tuple[str, ...], bytes | None] | None = None
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
    """The requests of one fork analysis, packed: each counterfactual replays the whole log, so every request is kept,
    as one compressed stream of its IDs, starts and text (:class:`~..packed.RenderCodec`, against the first request's
    bytes) and its prompt pickled the same way; a few hundred bytes to a couple of KB a request where the parsed forms
    take some 20 KB, on disk. In memory a request is a row of columns: five ints in arrays (its index, line and three
    places in the spool), four references in lists (its render options, tools, log fields and salt, the first three
    interned), about 72 bytes where an object a request took about 250 with its ints. Indexing rebuilds a
    :class:`ForkRequest` (the last few are kept); :meth:`ids` reads only the IDs. Add requests in log order with
    :meth:`add`."""

    def __init__(self, recent: int = 64):
        self._render = RenderCodec()  # (zstd's level 1: the fastest of its usual levels)
        self._objects = ObjectCodec()
        #: the packed bytes, in a temporary file (a pass reads each request's once)
        self._disk = Spool()
        # the columns: a request's index, line (_NO_LINE: none), places in the spool of its packed render, prompt
        # and spans (-1: none), render options, tools, log fields and cache salt; a request the store cannot pack,
        # kept whole
        self._index, self._line = array("q"), array("q")
        self._hot, self._cold, self._spans_at = array("q"), array("q"), array("q")
        self._meta_of: list[tuple | None] = []
        self._tools_of: list[tuple[str, tuple[str, ...], bytes | None] | None] = []
        self._fields: list[tuple] = []
        self._salt: list[Any] = []
        self._whole: dict[int, ForkRequest] = {}
        self._interned: dict[Any, Any] = {}
        self._meta: dict[tuple, tuple] = {}
        self._tools: dict[str | bytes, tuple[str, tuple[str, ...], bytes | None]] = {}  # by digest, or order
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
            # (a chat prompt's tools as the template reads them, which also tells whether a re-render under other
            # tools is its own: a list seen before is found by it, its identities not serialized again)
            exact = exact_tools(mine) if r.request is None else None
            rec.tools = self._tools.get(exact) if exact is not None else None
            if rec.tools is None:
                names = [_tool_identity(t) for t in mine]
                order = "\n".join(names)
                key = exact if exact is not None else order
                rec.tools = self._tools.get(key) or self._tools.setdefault(key, (order, tuple(sorted(names)), exact))
        try:
            self._pack(rec, r)
        except (ValueError, OverflowError, TypeError, pickle.PicklingError, AttributeError):
            self._whole[len(self._index)] = r
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

    def rendered(self, k: int) -> bool:
        """Whether request ``k`` has its render (a :class:`Tokenized`), not its token IDs alone."""
        whole = self._whole.get(k) if self._whole else None
        return whole.tokenized is not None if whole is not None else self._cold[k] >= 0

    def tool_order(self, k: int) -> str | None:
        """Request ``k``'s tools' identities in order, joined by newlines (None without tools)."""
        t = self._tools_of[k]
        return t[0] if t is not None else None

    def tool_set(self, k: int) -> tuple[str, ...] | None:
        """The same, sorted (the set a tools counterfactual matches)."""
        t = self._tools_of[k]
        return t[1] if t is not None else None

    def tools_exact(self, k: int) -> bytes | None:
        """A chat request's :func:`~.requests.exact_tools` (None: no tools, or a canonical request)."""
        t = self._tools_of[k]
        return t[2] if t is not None else None

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

    def render_ids(self, rec: _Packed | tuple) -> Sequence[int]:
        """The token IDs of a :meth:`pack_render`, without the rest."""
        return rec[0] if isinstance(rec, tuple) else self._render.ids(self._disk.get_bytes(rec.hot))

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

    def given(self, k: int, tools: Any, exact: bytes | None) -> Any:
        """:meth:`get`'s for request ``k`` under the tools counterfactual ``tools``, or :data:`AS_GIVEN` (kept from now
        on) where none is kept yet and the request's tools digest ``exact`` (:meth:`RequestStore.tools_exact`) is the
        counterfactual's: a chat request that lists the tools as it does renders as it is, known without reading it."""
        got = self.get((k, id(tools)))
        if got is None and exact is not None and exact == tools.exact:
            self[k, id(tools)] = got = AS_GIVEN
        return got

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
