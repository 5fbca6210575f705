"""A log's line in each version of it, as the sweep that measures the versions (:func:`.measure.measure_versions`)
takes it: each distinct value of the line parsed once (:func:`line_versions`; the line as it is with the token IDs
its first read packed: :class:`AsPacked`), and a batch's rows of them rendered and tokenized, each distinct prompt
once (:func:`rows_later`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from ...inputs import PromptInput
from ...spool import content_digest
from .edits import _encoded
from .groups import LogLine, line_meta, original_at, reparse_at, with_model


def prompt_key(p: PromptInput) -> int:
    """A 64-bit digest of what the tokenizer sees of a prompt (its content, key order and types included)."""
    got = content_digest(p.kind, p.text, p.messages, p.tools, p.ids, size=8)
    if got is None:  # (a value pickle refuses: its JSON, as far as it goes)
        text = json.dumps([p.kind, p.text, p.messages, p.tools, p.ids], ensure_ascii=False, default=str)
        got = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(got, "little")


class AsPacked:
    """Line ``i`` as it is, with its tokens as the log's first read packed them for the fork analysis: its token IDs
    read back there, not rendered and tokenized again. It is the sweep's line and its tokens at once: its number,
    conversation key, time, cache salt and request (None where no version of the sweep reads it: the line is not
    parsed either); a diverging pair's cause reads its render (:attr:`tokenized`), unpacked when asked for."""

    __slots__ = ("_k", "_store", "ids", "key", "line", "request", "salt", "timestamp")

    def __init__(self, store: Any, k: int, ln: LogLine | tuple[int, Any, float | None]) -> None:
        if isinstance(ln, tuple):
            (self.line, self.key, self.timestamp), self.request = ln, None
        else:
            self.line, self.key, self.timestamp, self.request = ln.line, ln.key, ln.timestamp, ln.request
        self.salt, self.ids = store.salt(k), store.ids(k)
        self._store, self._k = store, k

    @property
    def tokenized(self) -> Any:
        return self._store[self._k].tokenized


def rendered(t: Any) -> Any:
    """A sweep's tokens as a :class:`~cachectl.tokenization.Tokenized` (an :class:`AsPacked` line unpacked)."""
    return t.tokenized if type(t) is AsPacked else t


def line_versions(lines: Sequence[LogLine], versions: Sequence[Sequence[Any] | None], i: int,
                  model: str | None, packed: Any = None, reads: Sequence[bool] = ()) -> list[Any]:
    """Line ``i`` in each version of the log (None: the lines as they are; else the values a fix pass left), each
    distinct value built and parsed once (the versions whose edits of the line are the same share one build).
    ``packed``: the log as it is, packed (:func:`.measure.measure_versions`' ``packed``): line ``i`` as it is takes its tokens
    from there (:class:`AsPacked`), and is not parsed where no version that has it reads its request (``reads``:
    whether each version does)."""
    out: list[Any] = []
    parsed: dict[Any, Any] = {}
    sigs = [None if vals is None else vals.signature(i) for vals in versions]  # type: ignore[attr-defined]
    if packed is not None and not packed.rendered(i):
        packed = None
    for vals, sig in zip(versions, sigs):
        ln = parsed.get(sig)
        if ln is None and sig is None and packed is not None and not any(r for r, g in zip(reads, sigs) if g is None):
            ln = parsed[None] = AsPacked(packed, i, line_meta(lines, i))
        elif ln is None and sig is None:
            ln = lines[i] if vals is None or model is None else with_model(original_at(lines, i), model)
            ln = parsed[None] = AsPacked(packed, i, ln) if packed is not None else ln
        elif ln is None:
            assert vals is not None
            value = vals[i]
            key = _encoded(value)
            ln = parsed.get(key)
            if ln is None:
                ln = reparse_at(lines, i, value)
                ln = parsed[key] = with_model(ln, model) if model is not None else ln
            parsed[sig] = ln
        out.append(ln)
    return out


def rows_later(batch: list[list[LogLine]], tokenizer: Any, add_generation_prompt: bool,
               located: Sequence[int] | None = None, encoder: Any = None) -> Callable[[], list[list[Any]]]:
    """A batch's rows tokenized in two steps: their prompts rendered now; ``done()``, the call returned, gives each
    row's prompts tokenized and compacted to their IDs and rendered text (4 bytes a token, not a full ``Encoding``'s
    hundred). ``encoder``: the executor that encodes the batch meanwhile
    (:meth:`~cachectl.tokenization.TokenizerHandle.tokenize_later`). A prompt the batch holds more than once (the
    same content, key order included: the versions of a line a fix left alone, a request sent twice) is tokenized
    once, told apart by its digest (:func:`prompt_key`).

    Offsets (8 bytes a token more): the prompts of the ``located`` columns (the versions whose causes are counted;
    every column when None) keep their own, so that a diverging pair's cause locates its tokens without encoding the
    text again. The others make theirs again if ever asked: reading an ``Encoding``'s offsets and packing them costs
    about 120 ns a token."""
    keys, todo = distinct(batch)
    want = ({keys[id(row[j])] for row in batch for j in located if type(row[j]) is not AsPacked}
            if located is not None else todo)
    prompts = list(todo.values())
    if hasattr(tokenizer, "tokenize_later"):
        tokens = tokenizer.tokenize_later(prompts, add_generation_prompt=add_generation_prompt, encoder=encoder,
                                          located=[key in want for key in todo])
    else:
        made = tokenizer.tokenize_many(prompts, add_generation_prompt=add_generation_prompt)
        tokens = lambda: made  # noqa: E731

    def done() -> list[list[Any]]:
        got = dict(zip(todo, [t.compact(offsets=key in want) for key, t in zip(todo, tokens())]))
        return [[ln if type(ln) is AsPacked else got[keys[id(ln)]] for ln in row] for row in batch]
    return done


def distinct(batch: list[list[LogLine]]) -> tuple[dict[int, int], dict[int, PromptInput]]:
    """The distinct prompts of a batch's rows by their digest (:func:`prompt_key`), and the digest of each line's
    prompt by the line's id (an :class:`AsPacked` line has its tokens)."""
    keys: dict[int, int] = {}     # id of a parsed line -> its prompt's digest
    todo: dict[int, PromptInput] = {}
    for row in batch:
        for ln in row:
            if id(ln) not in keys and type(ln) is not AsPacked:
                keys[id(ln)] = key = prompt_key(ln.prompt)
                todo.setdefault(key, ln.prompt)
    return keys, todo
