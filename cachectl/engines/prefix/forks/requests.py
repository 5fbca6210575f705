"""The requests of a fork analysis: each request's served tokens (rendered through the chat template, with the
generation prompt, as ``simulate-prefix``/``fix``/``report`` render them), the character each token starts at in the
rendered text, the :class:`~cachectl.tokenization.Tokenized` (its token -> message/field/char mapping,
:class:`~cachectl.tokenization.Location`) and the log fields that may predict a per-user value (``user``,
``metadata.user_id``, a tenant field): :class:`ForkRequest`, built by :func:`fork_requests`. Without a tokenizer, a
provider request's canonical positions (tools -> system -> messages) are cut into word pieces
(:func:`canonical_tokens`): the same tree over approximate token counts.

Kept packed for the analysis's passes by :mod:`.store`.
"""

from __future__ import annotations

import hashlib
import json
import re
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ....errors import InputError
from ....inputs import PromptInput, Request, cache_salt_of, prompt_from_request, prompt_from_value, unwrap
from ....inputs.prompt import check_ids
from ....inputs.request import compact, dumps_alike
from ....tokenization import KeptOffsets, Span, Tokenized
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
#: prompts rendered and tokenized at a time
BATCH = 256


def fork_requests(records: Iterable[tuple], *, source: str, tokenizer: Any = None,
                  user_fields: Sequence[str] = USER_FIELDS, add_generation_prompt: bool = True,
                  batch_size: int | None = None) -> Iterator[ForkRequest]:
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
    prompt of the batch tokenized last, to another reader of the same lines. ``encoder`` (a
    :class:`concurrent.futures.Executor` of one thread): a full batch is rendered here and encoded there while the
    next lines are read, its requests given when the next batch is full
    (:meth:`~cachectl.tokenization.TokenizerHandle.tokenize_later`)."""

    def __init__(self, *, source: str, tokenizer: Any = None, user_fields: Sequence[str] = USER_FIELDS,
                 add_generation_prompt: bool = True, batch_size: int | None = None, encoder: Any = None):
        self.source, self.tokenizer = source, tokenizer
        self.add_generation_prompt = add_generation_prompt
        self.batch_size = batch_size or BATCH
        self._names = [(n, n.split(".")) for n in user_fields]
        self._vocab: dict[str, int] = {}
        self._pending: list[tuple[int, int, PromptInput, tuple, Any]] = []
        self._index = 0
        #: the batch tokenized last: id of its prompt object -> (the prompt, its token IDs)
        self._last: dict[int, tuple[PromptInput, Sequence[int]]] = {}
        self._encoder = encoder if tokenizer is not None else None
        #: the full batch being encoded (``encoder``): its records, and the call that gives its prompts tokenized
        self._begun: tuple[list[tuple], Callable[[], list[Tokenized]]] | None = None

    @property
    def waiting(self) -> int:
        """Records added whose requests have not been given yet (a batch not full, a batch being encoded)."""
        return len(self._pending) + (len(self._begun[0]) if self._begun is not None else 0)

    def known(self, prompt: PromptInput, add_generation_prompt: bool) -> Sequence[int] | None:
        """The token IDs of ``prompt`` (this very object), rendered with ``add_generation_prompt``, where the batches
        whose requests were given last held it; else None."""
        got = self._last.get(id(prompt))
        return got[1] if got is not None and got[0] is prompt and add_generation_prompt == self.add_generation_prompt \
            else None

    def flush(self, last: bool = True) -> Iterator[ForkRequest]:
        """The requests of the prompts added so far (``last``: all of them; else those of the batches tokenized)."""
        pending, self._pending = self._pending, []
        if self._encoder is not None:
            # (the full batch is rendered and its encoding started before the one begun before it is waited for)
            begun, self._begun = self._begun, None
            if pending and not last:
                self._begun = pending, self.tokenizer.tokenize_later(
                    [p for _, _, p, _, _ in pending], add_generation_prompt=self.add_generation_prompt,
                    encoder=self._encoder)
            batches = [(begun[0], begun[1]())] if begun is not None else []
            if pending and last:
                batches.append((pending, self._tokenized(pending)))
        else:
            batches = [(pending, self._tokenized(pending))] if pending else []
        if batches:
            self._last = {}
        for batch, toks in batches:
            self._last.update((id(p), (p, t.ids)) for (_, _, p, _, _), t in zip(batch, toks))
            for (idx, line, _, flds, salt), t in zip(batch, toks):
                yield _from_tokenized(idx, line, t, flds, salt)

    def _tokenized(self, pending: list[tuple]) -> list[Tokenized]:
        return self.tokenizer.tokenize_many([p for _, _, p, _, _ in pending],
                                            add_generation_prompt=self.add_generation_prompt)

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
                yield from self.flush(last=False)
        elif prompt.request is not None:
            self._index += 1
            ids, text, starts, tok = canonical_tokens(prompt.request, self._vocab)
            yield ForkRequest(index=index, line=line, ids=ids, text=text, starts=starts, tokenized=tok, fields=flds,
                              salt=salt, request=prompt.request)
        else:
            raise InputError("a raw-text or chat-list line needs `tokenizer` to become tokens", source=source,
                             line=line)


def _from_tokenized(index: int, line: int | None, t: Tokenized, flds: tuple = (), salt: Any = None) -> ForkRequest:
    t = t.compact(offsets=True)  # (the offsets, read once or kept already: the starts, and the ends kept with them)
    if isinstance(t.encoding, KeptOffsets):  # (the starts are a column)
        starts: array | None = t.encoding.starts  # type: ignore[assignment]
    else:  # (encoded again: a render prefilled with its IDs alone)
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


def exact_tools(tools: Sequence[Any]) -> bytes:
    """A digest of a chat prompt's tools as the template reads them: each one's exact serialization (key order and
    value types included), in order (two lists with one digest render alike)."""
    text = "\n".join(compact(t) for t in tools)  # (compact JSON holds no newline)
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()


def _request_tools(r: ForkRequest) -> tuple[Any, ...] | None:
    if r.request is not None:
        tools = tuple(p for p in r.request.positions if p.segment == "tools")
        return tools or None
    if r.tokenized is not None and r.tokenized.prompt.tools:
        return tuple(r.tokenized.prompt.tools)
    return None
