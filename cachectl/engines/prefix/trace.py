"""The requests of a prefix-cache trace: one record per request, its chained block keys, and the reader of
a JSONL trace (token IDs, Mooncake ``hash_ids``, or prompts and chat messages through a tokenizer).

Block keys use Python's built-in tuple hash by default (only equality matters, and a 64-bit chained hash
makes a collision vanishingly unlikely on real traces); ``hash_fn="sha256"`` uses SHA-256 over a pickle of
``(parent, tokens, extra)`` as vLLM does by default.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, count
from typing import TYPE_CHECKING, Any

from ...errors import InputError, UsageError

if TYPE_CHECKING:
    pass

#: bounds of the numbers a trace line carries (beyond them a value is corrupt, and would overflow a float)
MAX_OUTPUT_TOKENS = 10 ** 9
MAX_TIMESTAMP = 1e15
#: the parent of a first block under --hash sha256: sha256(b"cachectl-none-hash")
_NONE_SHA = bytes.fromhex("ce0b9c7844bb831fb74122604f087fc11c1af22461e9de893d240facf8aed996")



# ------------------------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: token IDs, or pre-hashed block ids (Mooncake)."""

    index: int
    line: int | None
    prompt_tokens: int
    tokens: Sequence[int] | None = None
    hash_ids: Sequence[Any] | None = None
    hash_block_size: int = 512
    salt: Any = None
    tenant: Any = None
    timestamp: float | None = None
    output_tokens: int = 0
    segments: Sequence[int] | None = None
    #: a salt field was asked for (--salt-field) and this request has none: it is cached unsalted
    unsalted: bool = False
    #: a tenant field was asked for (--tenant-field) and this request has none
    no_tenant: bool = False
    session: Any = None
    #: the prompt tokens the server reports it served from its prefix cache (vLLM's
    #: ``usage.prompt_tokens_details.cached_tokens``, SGLang's ``meta_info.cached_tokens``); None: not logged
    served_cached_tokens: int | None = None
    #: the prompt length the server counted beside it (None when the line does not say)
    served_prompt_tokens: int | None = None
    #: the name the request asked the server for (a body's or line's ``model``: a LoRA adapter's name keys
    #: every block in vLLM); read only where served counts are, for their comparison
    served_model: Any = None


def block_keys(tokens: Sequence[int], block_size: int, salt: Any = None, hash_fn: str = "builtin") -> list:
    """Chained keys of the full blocks of ``tokens`` (a partial tail block has none).

    builtin: block i's key is the XOR of position-salted tuple hashes of blocks 0..i (the salt folded into
    the first), so it depends on the whole prefix like vLLM's parent-chained hash, and every step runs in
    C (``zip`` cuts the blocks, ``accumulate`` chains them). sha256: vLLM's own, over a pickle of
    ``(parent, tokens, extra)``.
    """
    if hash_fn != "sha256":
        terms = map(hash, zip(count(), zip(*[iter(tokens)] * block_size)))
        if salt is not None and len(tokens) >= block_size:
            first = next(terms) ^ hash(("salt", salt))
            return list(accumulate(chain((first,), terms), operator.xor))
        return list(accumulate(terms, operator.xor))
    import hashlib
    import pickle

    keys = []
    parent = _NONE_SHA
    for i in range(len(tokens) // block_size):
        extra = ("salt", salt) if (i == 0 and salt is not None) else None
        parent = hashlib.sha256(pickle.dumps((parent, tuple(tokens[i * block_size:(i + 1) * block_size]), extra),
                                             protocol=5)).digest()
        keys.append(parent)
    return keys


def request_keys(req: TraceRequest, block_size: int, hash_fn: str = "builtin") -> list:
    if req.hash_ids is not None:
        full = req.prompt_tokens // req.hash_block_size
        ids = list(req.hash_ids[:full])
        if req.salt is not None and ids:  # a salt changes the first key and so, chained, every key
            return [hash((("salt", req.salt), ids[0]))] + [hash((("salt", req.salt), i)) for i in ids[1:]]
        return ids
    return block_keys(request_tokens(req), block_size, req.salt, hash_fn)


def request_tokens(req: TraceRequest) -> Sequence[int]:
    """The token IDs of a request that is not pre-hashed (every request but Mooncake ``hash_ids`` has them)."""
    if req.tokens is None:
        raise UsageError(f"line {req.line}: the request carries hash_ids, not token IDs")
    return req.tokens



# --------------------------------------------------------------------------------------------- reading


def trace_records(path: str, log_format: str | None = None) -> Iterator[tuple[int, Any, bool]]:
    """``(line, value, has_bool_literal)`` for each line of a JSONL trace, parsed with orjson; a log of another
    shape (``log_format``, or found from its first lines) as its records read it.

    The flag (a ``true``/``false`` that may be on the line) lets token lists be checked at C speed: a bool
    would otherwise pass as 0 or 1.
    """
    from ...inputs import display_name, parse_jsonl_line
    from ...inputs.formats import open_log, record_values

    _, module, lines = open_log(path, log_format)
    if module is not None:
        for lineno, value in record_values(module, lines, display_name(path)):
            yield lineno, value, True
        return
    for lineno, raw, source in lines:
        yield lineno, parse_jsonl_line(raw, source, lineno), _may_hold_bool(raw)


def _may_hold_bool(raw: bytes) -> bool:
    """Whether ``true`` or ``false`` may be on the line: both end in ``e``, a letter a token list never holds,
    so only the few ``e`` of the line (in its keys) are looked at, each found with one ``memchr``. Never a
    false "no"; past 16 of them, one scan for the two words."""
    find = raw.find
    i = find(b"e")
    seen = 0
    while i >= 0:
        if raw[i - 3:i] == b"tru" or raw[i - 4:i] == b"fals":
            return True
        seen += 1
        if seen == 16:
            return b"true" in raw or b"false" in raw
        i = find(b"e", i + 1)
    return False


_check_ids: Any = None


def _token_list(value: Any, name: str, where: dict, maybe_bool: bool = True) -> list:
    """Token IDs through the one validator of token-ID lists (:func:`cachectl.inputs.prompt.check_ids`)."""
    global _check_ids
    if _check_ids is None:  # imported on first use (this module stays light), then kept: one call per request
        from ...inputs.prompt import check_ids

        _check_ids = check_ids
    _check_ids(value, field=name, maybe_bool=maybe_bool, **where)
    return value


def _int_list(value: Any, name: str, where: dict) -> list:
    if not isinstance(value, list):
        raise InputError("expected a list", field=name, **where)
    for i, x in enumerate(value):
        if type(x) is not int or x < 0:
            raise InputError(f"{x!r:.60} is not a non-negative integer", field=f"{name}[{i}]", **where)
    return value


#: deepest JSON object or list taken as a salt, tenant or session (its repr recurses once per level)
MAX_KEY_DEPTH = 64


def _nested_key(value: Any, name: str, where: dict) -> str:
    """A salt, tenant or session that is a JSON object or list, as one hashable string (its repr). Nested
    deeper than :data:`MAX_KEY_DEPTH` levels it is refused: repr would meet Python's recursion limit at a depth
    that depends on the caller's stack."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if depth > MAX_KEY_DEPTH:
            raise InputError(f"nested deeper than {MAX_KEY_DEPTH} levels", field=name, **where)
        for child in (v.values() if isinstance(v, dict) else v):
            if isinstance(child, (dict, list)):
                stack.append((child, depth + 1))
    return repr(value)


def hashable_salt(salt: Any, *, source: str, line: int | None) -> Any:
    """A cache salt as block keys take it: a JSON object or list as one string (as the trace reader makes it),
    anything else as it is."""
    if isinstance(salt, (dict, list)):
        return _nested_key(salt, "cache_salt", {"source": source, "line": line})
    return salt


def _get(value: dict, dotted: str) -> Any:
    cur: Any = value
    for part in dotted.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(part)
    return cur


_served_cache: Any = None


def _served(value: dict, meta: dict, where: dict) -> None:
    """The served cached tokens beside a request (through :func:`cachectl.inputs.usage.served_cache`) into
    ``meta``, with the model the request named."""
    global _served_cache
    if _served_cache is None:
        from ...inputs.usage import served_cache

        _served_cache = served_cache
    found = _served_cache(value, **where)
    if found is None:
        return
    meta["served_cached_tokens"] = found.cached_tokens
    meta["served_prompt_tokens"] = found.prompt_tokens
    body = value.get("body")
    model = value.get("model")
    if model is None and isinstance(body, dict):
        model = body.get("model")
    meta["served_model"] = _nested_key(model, "model", where) if isinstance(model, (dict, list)) else model


def iter_trace(records: Iterable[tuple], *, source: str, tokenizer: Any = None,
               salt_field: str | None = None, tenant_field: str | None = None, hash_block_size: int = 512,
               as_kind: str | None = None, batch_size: int = 128, no_salt: bool = False,
               add_generation_prompt: bool = True, session_fields: Sequence[str] = (),
               timestamps: Callable[[Any], float | None] | None = None) -> Iterator[TraceRequest]:
    """Requests from a JSONL trace: token IDs, Mooncake hash_ids, or text/chat through a tokenizer.

    ``records`` yields ``(line, value)`` or, from :func:`trace_records`, ``(line, value, has_bool_literal)``.
    ``session_fields``: the first of these (dotted) fields present on a line is the request's ``session``
    (for session-affinity routing); None when none is. ``timestamps``: the reader of the run's timestamps (a
    :class:`~cachectl.inputs.TimestampReader`: ISO 8601, epoch seconds, milliseconds or microseconds).
    """
    reader = TraceReader(source=source, tokenizer=tokenizer, salt_field=salt_field, tenant_field=tenant_field,
                         hash_block_size=hash_block_size, as_kind=as_kind, batch_size=batch_size, no_salt=no_salt,
                         add_generation_prompt=add_generation_prompt, session_fields=session_fields,
                         timestamps=timestamps)
    for record in records:
        yield from reader.feed(record)
    yield from reader.end()


class TraceReader:
    """:func:`iter_trace` a record at a time, for a caller that reads the log itself and hands the records here:
    :meth:`feed` gives the requests a record completes (text and chat ones wait for a batch of ``batch_size``, to
    be tokenized together), :meth:`end` the rest."""

    def __init__(self, *, source: str, tokenizer: Any = None, salt_field: str | None = None,
                 tenant_field: str | None = None, hash_block_size: int = 512, as_kind: str | None = None,
                 batch_size: int = 128, no_salt: bool = False, add_generation_prompt: bool = True,
                 session_fields: Sequence[str] = (), timestamps: Callable[[Any], float | None] | None = None):
        from ...inputs import cache_salt_of
        from ...inputs.timestamps import TimestampError, parse_timestamp

        self._salt_of, self._timestamp_error = cache_salt_of, TimestampError  # (read once, not a record at a time)
        self.source, self.tokenizer, self.as_kind, self.batch_size = source, tokenizer, as_kind, batch_size
        self.salt_field, self.tenant_field, self.no_salt = salt_field, tenant_field, no_salt
        self.hash_block_size, self.session_fields = hash_block_size, session_fields
        self.add_generation_prompt = add_generation_prompt
        self.read_time = timestamps or parse_timestamp
        self.pending: list[tuple[int, Any, Any, dict, Any]] = []
        self.index = 0

    def _flush(self) -> Iterator[TraceRequest]:
        if not self.pending:
            return
        from ...inputs import prompt_from_value

        prompts = [p if p is not None else prompt_from_value(v, source=self.source, line=ln, as_kind=self.as_kind,
                                                                  timestamps=self.read_time)
                   for ln, v, _, _, p in self.pending]
        # chat requests as vLLM's chat endpoint renders them by default (with the assistant header)
        toks = self.tokenizer.tokenize_many(prompts, add_generation_prompt=self.add_generation_prompt)
        for (ln, _, salt, meta, _), tok in zip(self.pending, toks):
            yield TraceRequest(index=self.index, line=ln, prompt_tokens=len(tok.ids), tokens=list(tok.ids),
                               salt=salt, **meta)
            self.index += 1
        self.pending.clear()

    def end(self) -> Iterator[TraceRequest]:
        """The requests still waiting for their batch."""
        yield from self._flush()

    def feed(self, record: tuple, prompt: Any = None) -> Iterator[TraceRequest]:
        """The requests ``record`` (as :func:`iter_trace` reads one) completes. ``prompt``: the record's prompt as
        :func:`~cachectl.inputs.prompt_from_value` reads it (with ``as_kind``), where the caller has it (it is
        not read again)."""
        line, value = record[0], record[1]
        maybe_bool = record[2] if len(record) > 2 else True
        where = {"source": self.source, "line": line}
        if not isinstance(value, dict):
            raise InputError("expected a JSON object per line", **where)
        salt = _get(value, self.salt_field) if self.salt_field else self._salt_of(value)
        # a request without a salt is an ordinary one (vLLM's cache_salt is optional): cached unsalted, counted
        unsalted = bool(self.salt_field) and salt is None
        tenant = _get(value, self.tenant_field) if self.tenant_field else salt
        no_tenant = bool(self.tenant_field) and tenant is None
        if self.no_salt:
            salt = None
        if isinstance(salt, (dict, list)):
            salt = _nested_key(salt, self.salt_field or "salt", where)
        if isinstance(tenant, (dict, list)):
            tenant = _nested_key(tenant, self.tenant_field or "salt", where)
        try:
            ts = self.read_time(value.get("timestamp"))
        except self._timestamp_error as exc:
            raise InputError(str(exc), field="timestamp", **where) from None
        if ts is not None and not -MAX_TIMESTAMP < ts < MAX_TIMESTAMP:
            raise InputError(f"timestamp {ts:g} s is out of range", field="timestamp", **where)
        out_key = "output_tokens" if "output_tokens" in value else "output_length"
        out = value.get(out_key) or 0
        if isinstance(out, bool) or not isinstance(out, int) or not 0 <= out <= MAX_OUTPUT_TOKENS:
            raise InputError(f"expected a non-negative integer up to {MAX_OUTPUT_TOKENS:,}, got {out!r:.60}",
                             field=out_key, **where)
        meta: dict[str, Any] = {"tenant": tenant, "timestamp": ts, "output_tokens": out,
                "unsalted": unsalted, "no_tenant": no_tenant}
        if "usage" in value or "meta_info" in value or "response" in value:
            _served(value, meta, where)
        if self.session_fields:
            session = next((v for v in map(lambda f: _get(value, f), self.session_fields) if v is not None), None)
            meta["session"] = (_nested_key(session, "session", where) if isinstance(session, (dict, list))
                               else session)
        if "hash_ids" in value and self.as_kind is None:
            if self.pending:
                yield from self._flush()
            ids = _int_list(value["hash_ids"], "hash_ids", where)
            length = value.get("input_length")
            if isinstance(length, bool) or not isinstance(length, int) or length < 1:
                raise InputError(f"expected a positive integer, got {length!r:.60}", field="input_length", **where)
            if -(-length // self.hash_block_size) != len(ids):
                raise InputError(f"{len(ids)} hash_ids do not cover input_length {length} in blocks of "
                                 f"{self.hash_block_size} (--hash-block-size)", field="hash_ids", **where)
            if len(set(ids)) != len(ids):
                first: dict = {}
                for i, h in enumerate(ids):
                    if h in first:
                        raise InputError(f"hash id {h} repeats hash_ids[{first[h]}]: a Mooncake hash id names a "
                                         "block with its whole prefix, so one request cannot hold it twice",
                                         field=f"hash_ids[{i}]", **where)
                    first[h] = i
            yield TraceRequest(index=self.index, line=line, prompt_tokens=length, hash_ids=ids,
                               hash_block_size=self.hash_block_size, salt=salt, **meta)
            self.index += 1
            return
        key = ("tokens" if "tokens" in value else "prompt_token_ids" if "prompt_token_ids" in value
               else "input_ids" if "input_ids" in value else None)
        if key is not None and self.as_kind in (None, "ids"):
            if self.pending:
                yield from self._flush()
            tokens = _token_list(value[key], key, where, maybe_bool)
            segments = value.get("segments")
            if segments is not None:
                segments = _int_list(segments, "segments", where)
                if sum(segments) != len(tokens):
                    raise InputError(f"segments sum to {sum(segments)}, not the {len(tokens)} tokens",
                                     field="segments", **where)
            yield TraceRequest(index=self.index, line=line, prompt_tokens=len(tokens), tokens=tokens, salt=salt,
                               segments=segments, **meta)
            self.index += 1
            return
        if any(k in value for k in ("prompt", "messages", "text", "body")):
            if self.tokenizer is None:
                raise InputError("a text or chat request needs --tokenizer to become token IDs", **where)
            self.pending.append((line, value, salt, meta, prompt))
            if len(self.pending) >= self.batch_size:
                yield from self._flush()
            return
        from ...inputs.request import USAGE_ONLY, is_usage_only

        if is_usage_only(value):
            raise InputError(USAGE_ONLY, **where)
        raise InputError("no tokens: expected 'tokens' (token IDs), 'hash_ids' with 'input_length' (Mooncake), "
                         "or 'prompt'/'messages' with --tokenizer", **where)
