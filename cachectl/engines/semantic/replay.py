"""A prompt log replayed in order through a simulated semantic cache: look up, and store on a miss."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ...errors import InputError, UsageError
from .adaptive import AdaptivePolicy
from .embed import Embedder
from .like import Like
from .like import like as like_of
from .pairs import SCHEMA_VERSION, PolicyRow, policy_row

# Stored vectors beyond which replay switches to the HNSW index. Measured on 2 CPU cores with 384-d vectors:
# exact search (one matrix-vector product) costs about 5 ms a query at 100k stored vectors and grows
# linearly; an HNSW insert plus search costs about 1-2 ms whatever the size. Below 50k exact search is as
# fast and exact; the index's recall against exact search is sampled and reported.
ANN_THRESHOLD = 50_000


class VectorStore:
    """Stored prompt vectors: exact search by matrix product; an HNSW index (usearch) past ``ann_after``."""

    def __init__(self, dim: int, ann_after: int = ANN_THRESHOLD):
        import numpy as np

        self.np = np
        self.dim = dim
        self.ann_after = ann_after
        self.vectors = np.zeros((1024, dim), dtype=np.float32)
        self.size = 0
        self.index: Any = None  # usearch Index, built past ann_after
        self.queries = 0
        self.checked = 0      # ANN answers compared with exact search (every 50th query)
        self.agreed = 0
        self.removed: set[int] = set()  # evicted keys: never found again

    def remove(self, key: int) -> None:
        """Evict a stored vector (its key is not reused)."""
        self.removed.add(key)
        self.vectors[key] = 0.0
        if self.index is not None:
            self.index.remove(key)

    def add(self, v) -> int:
        np = self.np
        if self.size == len(self.vectors):
            self.vectors = np.vstack([self.vectors, np.zeros_like(self.vectors)])
        self.vectors[self.size] = v
        key = self.size
        self.size += 1
        if self.index is not None:
            self.index.add(key, v)
        elif self.size > self.ann_after:
            self._build_index()
        return key

    def _build_index(self) -> None:
        try:
            from usearch.index import Index
        except ImportError:
            self.ann_after = 1 << 62  # stay exact: the index is optional
            return
        self.index = Index(ndim=self.dim, metric="cos", dtype="f32", expansion_search=128)
        self.index.add(self.np.arange(self.size), self.vectors[:self.size])

    def nearest(self, v) -> tuple[int, float]:
        if self.size == len(self.removed):
            return -1, -2.0
        if self.index is not None:
            m = self.index.search(v, 1)
            key = int(m.keys[0])
            self.queries += 1
            if self.queries % 50 == 1:  # sample the recall against exact search
                self.checked += 1
                exact = self.vectors[:self.size] @ v
                if self.removed:
                    exact[list(self.removed)] = -3.0
                self.agreed += int(exact.argmax()) == key
            return key, float(self.vectors[key] @ v)
        sims = self.vectors[:self.size] @ v
        if self.removed:
            sims[list(self.removed)] = -3.0
        i = int(sims.argmax())
        return i, float(sims[i])


#: the parts of a request besides its last user message that can change the right answer
CONTEXT_FIELDS = ("system", "tools", "user", "history")


class LogRecord(NamedTuple):
    """One request of a log: its line, the prompt the cache is keyed on, the response actually produced (None
    when the log has none) and its context (system prompt, tools, end user, earlier turns: canonical text)."""

    line: int
    prompt: str
    response: str | None
    context: Mapping[str, str] | None = None


@dataclass(frozen=True, kw_only=True)
class ReplayReport:
    schema_version: int = SCHEMA_VERSION
    model: str
    #: the static threshold, in the unit of the cache replayed (``threshold_unit``)
    threshold: float
    requests: int
    hits: int
    hit_rate: float | None
    with_response: int
    wrong_hits: int                    # hits whose stored response differs from the one actually produced
    exact_duplicates: int
    approximate_index: bool
    #: share of sampled lookups where the approximate index found the exact nearest neighbour
    ann_recall_sample: float | None = None
    examples: tuple[dict, ...] = field(default_factory=tuple)
    #: whose conventions the replay follows: cachectl, gptcache or redisvl
    like: str = "cachectl"
    threshold_unit: str = "cosine"
    #: the static threshold as a cosine of unit vectors
    threshold_cosine: float | None = None
    #: the policy of the top-level numbers: static (the threshold) or adaptive (the first delta)
    policy: str = "static"
    #: the context fields that are part of the cache key (a hit never crosses them)
    key_fields: tuple[str, ...] = ()
    #: entries evicted (the library's max_size)
    evicted: int = 0
    #: every policy replayed over the same log, side by side, with 95% Clopper-Pearson intervals
    policies: tuple[PolicyRow, ...] = ()
    #: per context field, the hits served from an entry stored under another value of it (another system
    #: prompt, tools, end user or earlier turns): [{field, hits}]
    cross_context: tuple[dict, ...] = ()
    cross_context_examples: tuple[dict, ...] = ()
    #: requests left out: their last user message holds no text (only tool results, images), or tool results follow
    #: it (an agent's turn)
    no_text: int = 0


class NoText(NamedTuple):
    """A request of a log whose last user message holds no text (an agent's turn of tool results, an image): no
    key for the cache; :func:`replay` leaves it out, and counts it (``no_text``)."""

    line: int


class _Cache:
    """One simulated semantic cache: a store per key partition, a global LRU when the library evicts, and either a
    static rule (the library's threshold) or the adaptive policy."""

    def __init__(self, rule: Like, policy: AdaptivePolicy | None, scope: str, key_fields: Sequence[str],
                 ann_after: int):
        self.rule = rule
        self.policy = policy
        self.scope = scope
        self.key_fields = tuple(key_fields)
        self.ann_after = 1 << 62 if rule.exact else ann_after
        self.stores: dict[tuple, VectorStore] = {}
        self.entries: list[tuple[tuple, int, LogRecord]] = []      # (partition, key in its store, record)
        self.by_key: dict[tuple[tuple, int], int] = {}
        self.lru: OrderedDict[int, None] = OrderedDict()
        self.clean = max(1, int((rule.max_size or 0) * rule.clean_fraction)) if rule.max_size else 0
        self.hits = self.wrong = self.judged = self.evicted = 0
        self.l2 = rule.name == "gptcache"
        self.per_prompt = scope == "prompt"

    def _store(self, part: tuple, dim: int) -> VectorStore:
        store = self.stores.get(part)
        if store is None:
            store = self.stores[part] = VectorStore(dim, self.ann_after)
        return store

    def _add(self, part: tuple, v, rec: LogRecord) -> None:
        rule = self.rule
        if rule.max_size is not None and len(self.lru) >= rule.max_size:
            for _ in range(min(self.clean, len(self.lru))):  # GPTCache evicts clean_size entries at once
                gid, _ = self.lru.popitem(last=False)
                p, k, _ = self.entries[gid]
                self.stores[p].remove(k)
                self.evicted += 1
        store = self._store(part, len(v))
        k = store.add(v)
        gid = len(self.entries)
        self.entries.append((part, k, rec))
        self.by_key[(part, k)] = gid
        self.lru[gid] = None

    def request(self, rec: LogRecord, v) -> int | None:
        """Look the request up; the matched entry's id on a hit, else None (and the request is stored)."""
        part = tuple((rec.context or {}).get(f, "") for f in self.key_fields)
        store = self.stores.get(part)
        k, sim = store.nearest(v) if store is not None else (-1, -2.0)
        if rec.response is not None:
            self.judged += 1
        if k < 0:
            self._add(part, v, rec)
            return None
        gid = self.by_key[(part, k)]
        stored = self.entries[gid][2].response
        if self.policy is None:
            d2 = float(((store.vectors[k] - v) ** 2).sum()) if self.l2 else 0.0  # type: ignore[union-attr]
            hit = self.rule.hit(sim, d2)
        else:
            key: Hashable = gid if self.per_prompt else 0
            hit = self.policy.decide(key, sim)
            if not hit:
                if rec.response is not None and stored is not None:
                    correct = stored == rec.response
                    self.policy.observe(key, sim, correct)
                    if correct:
                        return None   # vCache stores a fresh answer only when the cached one was wrong
                self._add(part, v, rec)
                return None
        if not hit:
            self._add(part, v, rec)
            return None
        self.hits += 1
        self.lru.move_to_end(gid)
        if rec.response is not None and stored is not None and stored != rec.response:
            self.wrong += 1
        return gid


def replay(records: Iterable[tuple], embedder: Embedder, threshold: float | None, model: str,
           ann_after: int = ANN_THRESHOLD, batch: int = 256, *, like: str = "cachectl",
           policy: str = "static", deltas: Sequence[float] = (0.01,), thresholds: Sequence[float] | None = None,
           scope: str = "prompt", key_fields: Sequence[str] = (), max_size: int | None = None, seed: int = 0,
           confidence: float = 0.95,
           on_request: Callable[[LogRecord, LogRecord | None], None] | None = None) -> ReplayReport:
    """Run prompts in order through a simulated semantic cache: look up, and store on a miss.

    ``records`` are :class:`LogRecord` (or ``(line, prompt, response)`` tuples). ``like`` picks the conventions
    (distance, normalization, search, eviction) of the cache replayed and ``threshold`` is in its unit (its default
    when None). ``policy`` "adaptive" replays, beside the static threshold(s), the learned policy at each of
    ``deltas`` (observations per cached prompt, or shared, by ``scope``); it learns from the responses the log
    carries. ``key_fields`` makes context fields part of the cache key. ``on_request(record, matched)`` is called
    for every request of the top-level run, with the record whose answer it was served (None on a miss)."""
    if policy not in ("static", "adaptive"):
        raise UsageError(f"policy must be static or adaptive, got {policy!r}")
    if scope not in ("prompt", "global"):
        raise UsageError(f"scope must be prompt or global, got {scope!r}")
    unknown = [f for f in key_fields if f not in CONTEXT_FIELDS]
    if unknown:
        raise UsageError(f"unknown key field {unknown[0]!r}: expected some of {', '.join(CONTEXT_FIELDS)}")
    main_rule = like_of(like, threshold, max_size)
    t_main = main_rule.default_threshold if threshold is None else threshold
    static_ts = [t_main] if thresholds is None else list(dict.fromkeys(thresholds))
    runs: list[tuple[str, float | None, float | None, _Cache]] = []
    for t in static_ts:
        runs.append(("static", t, None, _Cache(like_of(like, t, max_size), None, scope, key_fields, ann_after)))
    if policy == "adaptive":
        if not deltas:
            raise UsageError("the adaptive policy needs a delta")
        for i, d in enumerate(deltas):
            if not 0 < d < 1:
                raise UsageError(f"delta must be between 0 and 1, got {d}")
            runs.append(("adaptive", None, d, _Cache(main_rule, AdaptivePolicy(d, seed + i), scope, key_fields,
                                                       ann_after)))
    if not runs:
        raise UsageError("nothing to replay: no threshold and no policy")
    main = next(r for r in runs if r[0] == policy)[3] if policy == "adaptive" else \
        next((r[3] for r in runs if r[1] == t_main), runs[0][3])
    n = with_resp = dupes = 0
    examples: list[dict[str, Any]] = []
    crossed: dict[str, int] = {}
    cross_examples: list[dict[str, Any]] = []
    fields_seen: set[str] = set()
    seen: set[str] = set()
    pending: list[LogRecord] = []

    def flush() -> None:
        nonlocal n, with_resp, dupes
        embedder.add(r.prompt for r in pending)
        for rec in pending:
            n += 1
            if rec.prompt in seen:
                dupes += 1
            seen.add(rec.prompt)
            if rec.response is not None:
                with_resp += 1
            ctx = rec.context or {}
            fields_seen.update(ctx)
            v = embedder.vec(rec.prompt)
            for _, _, _, cache in runs:
                before = cache.wrong
                gid = cache.request(rec, v)
                if cache is not main:
                    continue
                matched = cache.entries[gid][2] if gid is not None else None
                if on_request is not None:
                    on_request(rec, matched)
                if matched is None:
                    continue
                if cache.wrong > before and len(examples) < 10:
                    examples.append({"line": rec.line, "prompt": rec.prompt, "matched": matched.prompt,
                                     "matched_line": matched.line,
                                     "cosine": round(float(embedder.vec(matched.prompt) @ v), 6)})
                mctx = matched.context or {}
                for f in CONTEXT_FIELDS:
                    if (f in ctx or f in mctx) and ctx.get(f, "") != mctx.get(f, ""):
                        crossed[f] = crossed.get(f, 0) + 1
                        if len(cross_examples) < 10:
                            cross_examples.append({"line": rec.line, "matched_line": matched.line, "field": f,
                                                   "prompt": rec.prompt, "matched": matched.prompt})
        pending.clear()

    no_text = 0
    for raw in records:
        if type(raw) is NoText:
            no_text += 1
            continue
        pending.append(raw if isinstance(raw, LogRecord) else LogRecord(*raw))
        if len(pending) >= batch:
            flush()
    flush()
    if n == 0:
        raise InputError("no prompts in the log" + (f" ({no_text} request(s) whose last user message holds no "
                                                     "text)" if no_text else ""))
    if policy == "adaptive" and not with_resp:
        raise InputError("the adaptive policy learns from the responses the log carries, and this log has none "
                         "(name the field with response_field)")
    rows = tuple(policy_row(kind, t, d, n, c.hits, with_resp, c.wrong, confidence,
                            cosine=(like_of(like, t).threshold_as_cosine(t) if t is not None else None))
                 for kind, t, d, c in runs)
    store_ann = [s for _, _, _, c in runs for s in c.stores.values()]
    checked = sum(s.checked for s in store_ann)
    return ReplayReport(model=model, threshold=t_main, requests=n, hits=main.hits, hit_rate=main.hits / n,
                        with_response=with_resp, wrong_hits=main.wrong, exact_duplicates=dupes,
                        approximate_index=any(s.index is not None for s in store_ann),
                        ann_recall_sample=(sum(s.agreed for s in store_ann) / checked) if checked else None,
                        examples=tuple(examples), like=main_rule.name, threshold_unit=main_rule.threshold_name,
                        threshold_cosine=main_rule.threshold_as_cosine(t_main), policy=policy,
                        key_fields=tuple(key_fields), evicted=main.evicted, policies=rows,
                        cross_context=tuple({"field": f, "hits": crossed[f]} for f in CONTEXT_FIELDS if f in crossed),
                        cross_context_examples=tuple(cross_examples), no_text=no_text)


def _canonical(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)


def _context(value: dict, messages: list | None, last_user: int | None) -> dict[str, str]:
    """The context fields of a request that carries them: system prompt, tools, end user, earlier turns."""
    ctx: dict[str, str] = {}
    system = value.get("system") if value.get("system") is not None else value.get("instructions")
    if messages:
        sys_msgs = [m.get("content") for m in messages if isinstance(m, dict) and m.get("role") in ("system", "developer")]
        if sys_msgs:
            system = sys_msgs if system is None else [system, *sys_msgs]
    if system is not None:
        ctx["system"] = _canonical(system)
    if value.get("tools") is not None:
        ctx["tools"] = _canonical(value["tools"])
    meta: dict = value["metadata"] if isinstance(value.get("metadata"), dict) else {}
    user = value.get("user") or value.get("safety_identifier") or meta.get("user_id") or meta.get("user")
    if user is not None:
        ctx["user"] = _canonical(user)
    if messages and last_user is not None:
        earlier = [m for m in messages[:last_user] if isinstance(m, dict) and m.get("role") not in ("system", "developer")]
        if earlier:
            ctx["history"] = _canonical(earlier)
    return ctx


def _text(content: Any) -> Any:
    """A message's text: its string, or its text parts (OpenAI's and Anthropic's ``{"type": "text"}``, the
    Responses API's ``input_text``) joined by a line break, as the request parser joins them; else as it is."""
    if isinstance(content, list):
        texts = [p["text"] for p in content if isinstance(p, dict) and p.get("type") in ("text", "input_text")
                 and isinstance(p.get("text"), str)]
        return "\n".join(texts) if texts else None
    return content


def request_of(value: dict) -> tuple[dict | None, str]:
    """The request body a log line carries and the path it sits at in the line: the line itself where it is a bare
    body, else the one its wrapper holds (``body``, as every log shape is read, or ``request``: the request
    parser's own rule); (None, "") where it has none."""
    from ...inputs.request import is_request_body, unwrap

    body, at, _ = unwrap(value)
    return (body, at) if is_request_body(body) and isinstance(body, dict) else (None, "")


def check_body(value: dict, source: str, line: int) -> None:
    """A request body the API refuses is refused here as everywhere (through the request parser), its time left
    out: neither ``dupes`` nor ``replay`` reads it (a zone-less timestamp, as LiteLLM's own example payload has,
    was refused with a pointer to a --time-zone these commands do not have)."""
    from ...inputs.request import parse_request

    parse_request({k: v for k, v in value.items() if k != "timestamp"}, source=source, line=line)


def last_user(request: dict) -> tuple[Any, str, list | None, int | None]:
    """The last user message of a request body: its text (a string, or its text parts joined by a line break;
    else the content as it is), its path in the body, the turns (``messages``, or the Responses API's ``input``
    items) and its index there; (None, "messages", turns, None) without one."""
    turns = request.get("messages") if "messages" in request else request.get("input")
    name = "messages" if "messages" in request else "input"
    if isinstance(turns, str):  # (the Responses API's input as one string: one user message)
        return turns, name, None, None
    if not isinstance(turns, list):
        return None, name, None, None
    users = [i for i, m in enumerate(turns) if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        return None, name, turns, None
    at = f"{name}[{users[-1]}].content"
    if any(_tool_result(m) for m in turns[users[-1] + 1:]):
        # an agent's turn: tool results after the question (OpenAI's role "tool", the Responses API's and Codex's
        # *_output items), as Anthropic's tool_result blocks in the last user message are: no text of its own
        # (each was keyed on the question, and counted a hit of the turn before)
        return None, at, turns, users[-1]
    return _text(turns[users[-1]].get("content")), at, turns, users[-1]


def _tool_result(turn: Any) -> bool:
    return isinstance(turn, dict) and (turn.get("role") in ("tool", "function")
                                       or str(turn.get("type") or "").endswith("_call_output"))


def iter_log_prompts(path: str, field_name: str = "prompt", response_field: str = "response",
                     log_format: str | None = None) -> Iterator[LogRecord | NoText]:
    """:class:`LogRecord` per request of a log (:class:`NoText` for one whose last user message holds no text): a
    prompt field, or the last user message of its request body (a
    bare body on the line, or the body of cachectl's wrapper, as every log shape is read:
    :func:`cachectl.inputs.formats.log_values`; ``log_format`` forces the shape); the response field (a foreign
    shape's answer is its wrapper's ``response``, where the log keeps it); and the
    context (``system``/``instructions`` or system messages, ``tools``, ``user`` or ``metadata.user_id``, the
    turns before the last user message)."""
    from ...inputs import get_path
    from ...inputs.files import display_name
    from ...inputs.formats import log_values
    from ...tokenization import check_text_size

    source = display_name(path)
    for line, value in log_values(path, log_format, responses=True):
        if not isinstance(value, dict):
            raise InputError("expected a JSON object", source=source, line=line)
        prompt = get_path(value, field_name)
        field = field_name
        request, at = (value, "") if prompt is not None else request_of(value)
        turns, user_at = None, None
        if prompt is None and request is not None:
            check_body(value, source, line)
            prompt, where, turns, user_at = last_user(request)
            field = at + where
            if prompt is None and user_at is None:
                raise InputError(f"no {field_name} field and no user message", source=source, line=line,
                                 field=field.split("[")[0])
            # (None: its last user message is parts without text, such as tool results: no key, left out)
            if prompt is not None and not isinstance(prompt, str):
                raise InputError("no prompt text", source=source, line=line, field=field)
        elif not isinstance(prompt, str):
            raise InputError("no prompt text", source=source, line=line, field=field)
        if prompt is None:
            yield NoText(line)
            continue
        try:  # (past the tokenizers' bound: said where, not only what)
            check_text_size(prompt)
        except InputError as exc:
            raise InputError(exc.message, source=source, line=line, field=field) from None
        response = get_path(value, response_field)
        yield LogRecord(line, prompt, response if isinstance(response, str) else None,
                        _context(request if request is not None else value, turns, user_at))
