"""Provider prices and cache rules, as dated data.

The shipped table is ``cachectl/data/prices.json`` (USD per million tokens, a ``source`` and ``as_of`` on
every entry). A user file given with ``--prices`` overrides or extends it, in the same format or in
LiteLLM's ``model_prices_and_context_window.json`` format (USD per token, ``cache_creation_input_token_cost``
for 5-minute writes, ``cache_creation_input_token_cost_above_1hr`` for 1-hour writes). A LiteLLM entry for a
model the shipped table knows replaces its prices and keeps its cache rules (LiteLLM's file has no cache rules).

Cache rules (``cache_mode``): ``explicit`` (Anthropic: ``cache_control`` breakpoints, 5m/1h writes, the
20-position lookback), ``automatic`` (OpenAI before GPT-5.6: the token prefix in 128-token steps, no write fee),
``breakpoints`` (OpenAI GPT-5.6 and later: an implicit breakpoint on the newest eligible message plus explicit
``prompt_cache_breakpoint`` markers, exact matching at breakpoints, writes at ``cache_write``), ``none`` (no
prompt caching: the model has no cached-input price).

Prices as of a date: an entry's ``effective_from`` is the first day (UTC) its rates were billed, and each
``history`` entry with a ``from`` date is an earlier price set (``from``, ``to`` exclusive, the rates, a ``source``):
a call with a date is priced at the set in force on that day (:func:`priced_at`); a call without one (no
timestamp, or seconds counted from the start of a log) at today's rates. A rate a set leaves out is the same
multiple of the set's input (output, for a band's output) as the current entry's. ``history`` entries without a
``from`` are records that priced nothing (a change that was announced and cancelled, a rule an earlier revision of
the docs stated).
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any, Mapping

from ...datafiles import load_data
from ...errors import CachectlError, InputError
from ..names import alias_map, is_architecture, match_model

PER_MTOK = 1_000_000

_DEFAULTS = {
    "anthropic": {"cache_mode": "explicit", "ttls": {"5m": 300, "1h": 3600}, "max_breakpoints": 4,
                  "lookback_blocks": 20, "usage_style": "anthropic", "min_cacheable_tokens": 1024},
    "openai": {"cache_mode": "automatic", "ttls": {"auto": 300}, "max_breakpoints": 0, "lookback_blocks": 0,
               "usage_style": "openai", "min_cacheable_tokens": 1024, "cache_granularity": 128},
}


class UnknownModelError(CachectlError):
    pass


CACHE_MODES = ("explicit", "automatic", "breakpoints", "none")
#: what ``ModelPrice.prior_thinking`` may be
PRIOR_THINKING = ("all", "last_turn")

#: what each cache rule is called in ``--list-models``
RULE_NAMES = {
    ("anthropic", "explicit"): "anthropic breakpoints",
    ("openai", "automatic"): "openai automatic (pre-5.6)",
    ("openai", "breakpoints"): "openai 5.6+ breakpoints",
    ("deepseek", "automatic"): "deepseek automatic",
    ("gemini", "automatic"): "gemini implicit",
}


@dataclass(frozen=True)
class Band:
    """Prices that apply when the prompt has more than ``above_tokens`` input tokens."""

    above_tokens: int
    input: float
    output: float
    cache_write_5m: float | None = None
    cache_write_1h: float | None = None
    cache_read: float | None = None
    cache_write: float | None = None


@dataclass(frozen=True)
class PriceSet:
    """The rates a model was billed at from ``effective_from`` (a UTC day) to the day before ``effective_to``."""

    effective_from: str             # YYYY-MM-DD, the first day billed at these rates
    effective_to: str               # YYYY-MM-DD, the first day billed at the next rates
    input: float
    output: float
    cache_read: float | None = None
    cache_write_5m: float | None = None
    cache_write_1h: float | None = None
    cache_write: float | None = None
    bands: tuple[Band, ...] = ()
    source: str | None = None
    note: str | None = None


@dataclass(frozen=True)
class ModelPrice:
    model: str
    provider: str
    input: float                    # USD per million tokens
    output: float
    cache_read: float | None
    cache_write_5m: float | None
    cache_write_1h: float | None
    min_cacheable_tokens: int
    cache_mode: str                 # explicit | automatic | breakpoints | none (see the module docstring)
    ttls: Mapping[str, int]         # name -> seconds (the first one is the default)
    #: explicit: cache_control markers a request may carry; breakpoints: cache writes a request may make
    max_breakpoints: int
    #: explicit: positions a breakpoint looks back over; breakpoints: the latest breakpoints a read considers
    lookback_blocks: int
    usage_style: str                # "anthropic" (additive counters) or "openai" (inclusive)
    source: str
    as_of: str
    cache_granularity: int = 1
    aliases: tuple[str, ...] = ()
    bands: tuple[Band, ...] = ()
    notes: str | None = None
    history: tuple[dict, ...] = field(default=(), compare=False)
    #: the write rate of a cache with one write price (OpenAI GPT-5.6+: 1.25x input); Anthropic's are the 5m/1h ones
    cache_write: float | None = None
    #: breakpoints: whether a read renews an entry's lifetime (the provider documents a minimum lifetime per write)
    read_refreshes_ttl: bool = True
    #: the factor every token of a call made through the provider's Batch API is priced at (0.5: half the
    #: standard rates, cache reads and writes included); None when the table has no batch rate for the model
    batch_discount: float | None = None
    #: the first day (UTC, YYYY-MM-DD) the current rates were billed; None: not recorded (no earlier rates known)
    effective_from: str | None = None
    #: where the ``aliases`` (dated snapshot ids, ``-latest``) were read: the provider page that lists them
    aliases_source: str | None = None
    #: the earlier rates, oldest first, each over its window of days (the entry's dated ``history``)
    price_sets: tuple[PriceSet, ...] = field(default=(), compare=False)
    #: Anthropic: the earlier assistant turns' thinking blocks the model keeps in its context, and so in the cached
    #: prefix: "all", or "last_turn" (Opus 4.1 and earlier, Sonnet 4.5 and earlier, Haiku through 4.5: a user
    #: block that is not a tool result strips every thinking block before it, and the cache from there on)
    prior_thinking: str = "all"

    @property
    def rule(self) -> str:
        """The caching rule this model gets, as ``--list-models`` names it."""
        if self.cache_mode == "none":
            return "no prompt caching"
        return RULE_NAMES.get((self.provider, self.cache_mode), f"{self.provider} {self.cache_mode}")

    def rates(self, prompt_tokens: int) -> "ModelPrice | Band":
        """The price entry in force for a prompt of this many input tokens (bands by length)."""
        chosen: ModelPrice | Band = self
        for band in sorted(self.bands, key=lambda b: b.above_tokens):
            if prompt_tokens > band.above_tokens:
                chosen = band
        return chosen

    def ttl_seconds(self, name: str) -> int:
        if name not in self.ttls:
            raise InputError(f"{self.model}: unknown cache TTL {name!r} (known: {', '.join(self.ttls)})")
        return self.ttls[name]


def _price(entry: dict, key: str, model: str, source: str) -> float:
    """A required price: a missing one is an error (through :func:`_num`)."""
    value = _num(entry, key, model, source)
    assert value is not None  # _num raises for a missing required value
    return value


#: the highest price a table may give, USD a million tokens (the dearest models ask some hundreds): past it a price
#: file is wrong (1e300 printed a dollar total of 300 digits)
MAX_PRICE = 1_000_000


def _num(entry: dict, key: str, model: str, source: str, *, optional: bool = False) -> float | None:
    value = entry.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_PRICE:
        raise InputError(f"expected a price from 0 to {MAX_PRICE:,} USD a million tokens, got {value!r:.60}",
                         source=source,
                         field=f"models.{model}.{key}")
    return float(value)


def _whole(entry: dict, key: str, model: str, source: str, lowest: int = 0) -> int:
    value = entry.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not lowest <= value <= 10 ** 12:
        raise InputError(f"expected an integer of at least {lowest}, got {value!r:.60}", source=source,
                         field=f"models.{model}.{key}")
    return value


def _choice(entry: dict, key: str, model: str, source: str, choices: tuple[str, ...]) -> str:
    value = entry.get(key)
    if value not in choices:
        raise InputError(f"expected one of {', '.join(choices)}, got {value!r:.60}", source=source,
                         field=f"models.{model}.{key}")
    return value


def _day(value: Any, model: str, source: str, where: str) -> str:
    if isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value):
        try:
            return date.fromisoformat(value).isoformat()
        except ValueError:
            pass
    raise InputError(f"expected a date (YYYY-MM-DD), got {value!r:.60}", source=source, field=f"models.{model}.{where}")


def _bands(raw_bands: Any, model: str, source: str, where: str) -> tuple[Band, ...]:
    if not isinstance(raw_bands, (list, tuple)):
        raise InputError("expected a list of bands", source=source, field=f"models.{model}.{where}")
    bands = []
    for i, b in enumerate(raw_bands):
        if not isinstance(b, dict) or isinstance(b.get("above_tokens"), bool) \
                or not isinstance(b.get("above_tokens"), int) or b["above_tokens"] < 0:
            raise InputError("a band needs an integer above_tokens", source=source, field=f"models.{model}.{where}[{i}]")
        bands.append(Band(above_tokens=b["above_tokens"], input=_price(b, "input", model, source),
                          output=_price(b, "output", model, source),
                          cache_write_5m=_num(b, "cache_write_5m", model, source, optional=True),
                          cache_write_1h=_num(b, "cache_write_1h", model, source, optional=True),
                          cache_read=_num(b, "cache_read", model, source, optional=True),
                          cache_write=_num(b, "cache_write", model, source, optional=True)))
    return tuple(bands)


_CACHE_RATES = ("cache_read", "cache_write_5m", "cache_write_1h", "cache_write")


def _scaled(rate: float | None, factor: float) -> float | None:
    return None if rate is None else round(rate * factor, 10)


def _price_sets(history: tuple[dict, ...], current: dict, model: str, source: str,
                effective_from: str | None) -> tuple[PriceSet, ...]:
    """The dated entries of ``history`` as price sets, oldest first, their windows checked: each ends where the
    next begins at the latest (``to`` defaults to the next set's ``from``, then to ``effective_from``)."""
    dated = [(i, h) for i, h in enumerate(history) if "from" in h]
    dated.sort(key=lambda ih: _day(ih[1]["from"], model, source, f"history[{ih[0]}].from"))
    sets: list[PriceSet] = []
    for n, (i, h) in enumerate(dated):
        where = f"history[{i}]"
        start = _day(h["from"], model, source, f"{where}.from")
        following = dated[n + 1][1]["from"] if n + 1 < len(dated) else effective_from
        if h.get("to") is None and following is None:
            raise InputError("a dated price set needs 'to' (the first day of the next rates), or the entry an "
                             "effective_from", source=source, field=f"models.{model}.{where}")
        end = _day(h["to"] if h.get("to") is not None else following, model, source, f"{where}.to")
        if end <= start:
            raise InputError(f"'to' ({end}) must be after 'from' ({start})", source=source,
                             field=f"models.{model}.{where}")
        if following is not None and end > following:
            raise InputError(f"this price set runs to {end}, past {following}, when the next rates begin",
                             source=source, field=f"models.{model}.{where}")
        inp, out = _price(h, "input", model, source), _price(h, "output", model, source)
        f_in = inp / current["input"] if current["input"] else 1.0
        f_out = out / current["output"] if current["output"] else 1.0
        rates = {k: _num(h, k, model, source, optional=True) if k in h else _scaled(current[k], f_in)
                 for k in _CACHE_RATES}
        if "bands" in h:
            bands = _bands(h["bands"] or (), model, source, f"{where}.bands")
        else:
            bands = tuple(Band(above_tokens=b.above_tokens, input=round(b.input * f_in, 10),
                               output=round(b.output * f_out, 10),
                               **{k: _scaled(getattr(b, k), f_in) for k in _CACHE_RATES})
                          for b in current["bands"])
        note, src = h.get("note"), h.get("source")
        if (note is not None and not isinstance(note, str)) or (src is not None and not isinstance(src, str)):
            raise InputError("expected a string for 'note' and 'source'", source=source, field=f"models.{model}.{where}")
        sets.append(PriceSet(effective_from=start, effective_to=end, input=inp, output=out, bands=bands,
                             source=src, note=note, **rates))
    return tuple(sets)


def _from_native(model: str, entry: Any, source: str) -> ModelPrice:
    if not isinstance(entry, dict):
        raise InputError("expected an object", source=source, field=f"models.{model}")
    provider = entry.get("provider", "anthropic" if model.startswith("claude") else "openai")
    if not isinstance(provider, str):
        raise InputError(f"expected a provider name, got {provider!r:.60}", source=source,
                         field=f"models.{model}.provider")
    if provider not in _DEFAULTS and not {"cache_mode", "usage_style"} <= entry.keys():
        # (a typo, "antropic", took OpenAI's caching rules for a Claude model, unsaid)
        raise InputError(f"unknown provider {provider!r:.60} (known: {', '.join(_DEFAULTS)}; another one needs its "
                         "cache_mode and usage_style given)", source=source, field=f"models.{model}.provider")
    base = {**_DEFAULTS.get(provider, _DEFAULTS["openai"]), **entry}
    bands = _bands(base.get("bands") or (), model, source, "bands")
    ttls = base.get("ttls") or {}
    if not isinstance(ttls, dict) or not all(isinstance(v, int) and not isinstance(v, bool) and 0 < v <= 10 ** 9
                                             for v in ttls.values()):
        raise InputError("expected an object of TTL name -> seconds", source=source, field=f"models.{model}.ttls")
    aliases = base.get("aliases") or ()
    if not isinstance(aliases, (list, tuple)) or not all(isinstance(a, str) for a in aliases):
        raise InputError("expected a list of names", source=source, field=f"models.{model}.aliases")
    history = base.get("history") or ()
    if not isinstance(history, (list, tuple)) or not all(isinstance(h, dict) for h in history):
        raise InputError("expected a list of objects", source=source, field=f"models.{model}.history")
    notes = base.get("notes")
    if notes is not None and not isinstance(notes, str):
        raise InputError("expected a string", source=source, field=f"models.{model}.notes")
    effective_from = base.get("effective_from")
    if effective_from is not None:
        effective_from = _day(effective_from, model, source, "effective_from")
    if base.get("cache_mode") == "explicit":  # (a rate left null was priced as input: a write with no premium)
        for key in ("cache_read", "cache_write_5m", *(("cache_write_1h",) if "1h" in ttls else ())):
            if base.get(key) is None:
                raise InputError("an explicit-cache model needs this rate: its reads and writes are priced apart "
                                 "from input", source=source, field=f"models.{model}.{key}")
    current = {"input": _price(base, "input", model, source), "output": _price(base, "output", model, source),
               "bands": bands, **{k: _num(base, k, model, source, optional=True) for k in _CACHE_RATES}}
    sets = _price_sets(tuple(history), current, model, source, effective_from)
    return ModelPrice(
        model=model, provider=provider,
        input=_price(base, "input", model, source), output=_price(base, "output", model, source),
        cache_read=_num(base, "cache_read", model, source, optional=True),
        cache_write_5m=_num(base, "cache_write_5m", model, source, optional=True),
        cache_write_1h=_num(base, "cache_write_1h", model, source, optional=True),
        min_cacheable_tokens=_whole(base, "min_cacheable_tokens", model, source),
        cache_mode=_choice(base, "cache_mode", model, source, CACHE_MODES),
        ttls=dict(ttls), max_breakpoints=_whole(base, "max_breakpoints", model, source),
        lookback_blocks=_whole(base, "lookback_blocks", model, source),
        usage_style=_choice(base, "usage_style", model, source, ("anthropic", "openai")),
        source=str(base.get("source", source)), as_of=str(base.get("as_of", "unknown")),
        cache_granularity=_whole({"cache_granularity": 1, **base}, "cache_granularity", model, source, lowest=1),
        aliases=tuple(aliases), bands=bands, notes=notes, history=tuple(history),
        cache_write=_num(base, "cache_write", model, source, optional=True),
        read_refreshes_ttl=bool(base.get("read_refreshes_ttl", True)),
        batch_discount=_num(base, "batch_discount", model, source, optional=True),
        effective_from=effective_from, price_sets=sets,
        prior_thinking=_choice({"prior_thinking": "all", **base}, "prior_thinking", model, source, PRIOR_THINKING),
        aliases_source=None if base.get("aliases_source") is None else str(base["aliases_source"]))


def _rules_of(price: ModelPrice) -> dict:
    """The cache rules of a known entry, in the native format (what a LiteLLM entry for it keeps)."""
    return {"provider": price.provider, "cache_mode": price.cache_mode, "ttls": dict(price.ttls),
            "max_breakpoints": price.max_breakpoints, "lookback_blocks": price.lookback_blocks,
            "usage_style": price.usage_style, "min_cacheable_tokens": price.min_cacheable_tokens,
            "cache_granularity": price.cache_granularity, "read_refreshes_ttl": price.read_refreshes_ttl,
            "aliases": list(price.aliases), "aliases_source": price.aliases_source,
            "prior_thinking": price.prior_thinking}


def _from_litellm(model: str, entry: dict, source: str, known: ModelPrice | None = None) -> ModelPrice | None:
    """One entry of LiteLLM's price file (USD per token) as a ModelPrice; None for non-chat entries. ``known``:
    the shipped entry of the same name, whose cache rules the prices are put under."""
    if "input_cost_per_token" not in entry:
        return None
    provider = str(entry.get("litellm_provider", "anthropic" if "claude" in model else "openai"))
    provider = "anthropic" if provider.startswith(("anthropic", "bedrock", "vertex_ai-anthropic")) or "claude" in model \
        else "openai"

    def per_mtok(key: str) -> float | None:
        v = entry.get(key)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
            raise InputError(f"expected a non-negative number, got {v!r:.60}", source=source, field=f"{model}.{key}")
        return round(float(v) * PER_MTOK, 10)

    rules = _rules_of(known) if known is not None else {**_DEFAULTS[provider], "provider": provider}
    one_write = rules.get("cache_mode") == "breakpoints"  # one write price: LiteLLM's creation cost is it
    write = per_mtok("cache_creation_input_token_cost")
    native = {**rules, "input": per_mtok("input_cost_per_token"),
              "output": per_mtok("output_cost_per_token") or 0.0,
              "cache_read": per_mtok("cache_read_input_token_cost"),
              "cache_write_5m": None if one_write else write, "cache_write": write if one_write else None,
              "cache_write_1h": per_mtok("cache_creation_input_token_cost_above_1hr"),
              "source": f"{source} (LiteLLM format)", "as_of": "unknown"}
    above = [(k, m) for k in entry if (m := re.fullmatch(r"input_cost_per_token_above_(\d+)k_tokens", k))]
    bands = []
    for key, match in above:
        n = int(match.group(1)) * 1000
        suffix = f"_above_{n // 1000}k_tokens"
        bands.append({"above_tokens": n, "input": per_mtok(key),
                      "output": per_mtok("output_cost_per_token" + suffix) or native["output"],
                      "cache_read": per_mtok("cache_read_input_token_cost" + suffix),
                      "cache_write_5m": None if one_write else per_mtok("cache_creation_input_token_cost" + suffix),
                      "cache_write": per_mtok("cache_creation_input_token_cost" + suffix) if one_write else None})
    native["bands"] = bands
    return _from_native(model, native, source)


@dataclass
class PriceTable:
    models: dict[str, ModelPrice]
    not_shipped: str | None = None
    #: models the table knows of and does not price (no verified cache rates), with the reason: a lookup says it
    withheld: dict[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, user_prices: "tuple[Any, str] | None" = None) -> "PriceTable":
        """The shipped table, overridden or extended by ``user_prices``: ``(document, source)``, a parsed price
        file in cachectl's format or LiteLLM's (read it with :func:`cachectl.inputs.read_json_file`)."""
        raw = load_data("prices.json")
        table = cls({name: _from_native(name, e, "cachectl/data/prices.json") for name, e in raw["models"].items()},
                    raw.get("not_shipped"), dict(raw.get("withheld") or {}))
        if user_prices is not None:
            table.merge_document(*user_prices)
        return table

    def merge_document(self, doc: Any, source: str) -> None:
        """Add or override models from a parsed price document (cachectl's format or LiteLLM's)."""
        if not isinstance(doc, dict):
            raise InputError("expected a JSON object of models", source=source)
        if isinstance(doc.get("models"), dict):
            version = doc.get("schema_version", 1)
            if version != 1:
                raise InputError(f"schema_version {version!r:.20} is not one this cachectl reads (1)", source=source,
                                 field="schema_version")
            for name, entry in doc["models"].items():
                self.models[name] = _from_native(name, entry, source)
            return
        added = 0
        for name, entry in doc.items():
            if name == "sample_spec" or not isinstance(entry, dict):
                continue
            price = _from_litellm(name, entry, source, self.models.get(name))
            if price is not None:
                self.models[name] = price
                added += 1
        if not added:
            raise InputError("no models found: expected {\"models\": {...}} or LiteLLM's format "
                             "(entries with input_cost_per_token)", source=source)

    def aliases(self) -> dict[str, str]:
        """Declared alias -> entry (dated snapshots, ``-latest``)."""
        return alias_map((model, price.aliases) for model, price in self.models.items())

    def lookup(self, name: str) -> ModelPrice:
        """The entry of ``name`` or of the alias it is (:func:`cachectl.engines.names.match_model`): nothing is
        guessed from a prefix, an unknown name is an error with the close names."""
        if name in self.models:  # the common case, without building the alias map (match_model's first rule)
            return self.models[name]
        found = match_model(name, self.models, self.aliases())
        if found is not None:
            return self.models[found]
        shown = name if len(name) <= 80 else f"{name[:60]}... ({len(name):,} characters)"
        why = self.withheld.get(name)
        if why is not None:
            raise UnknownModelError(f"{name!r} is not priced by cachectl: {why}; pass its rates with `prices` "
                                    "(cachectl's format or LiteLLM's), or price it as another model with `model_as`")
        close = [] if len(name) > 200 else \
            difflib.get_close_matches(name.rsplit("/", 1)[-1], list(self.models), n=4, cutoff=0.5)
        hint = f"; close names: {', '.join(close)}" if close else ""
        if is_architecture(name):
            hint += (f"; {shown!r} is a model architecture of kv-inspect's catalog, while this option names a "
                     "provider model to price")
        raise UnknownModelError(f"unknown model {shown!r}{hint}: a model is priced only by its own entry or an "
                                "alias the table declares (see the price table with `list_models`, or add the "
                                "model with `prices`)")


# ----------------------------------------------------------------------------------------------- cost


@dataclass(frozen=True)
class Usage:
    """The four counters in Anthropic's additive convention, with the 5m/1h split of writes."""

    input_tokens: int                 # not read from and not written to the cache
    cache_creation_input_tokens: int
    cache_read_input_tokens: int
    output_tokens: int
    cache_write_5m_tokens: int = 0
    cache_write_1h_tokens: int = 0

    @property
    def prompt_tokens(self) -> int:
        return self.input_tokens + self.cache_creation_input_tokens + self.cache_read_input_tokens


#: a timestamp below this (2000-01-01T00:00Z) counts seconds from the start of a log, not a date
DATED_SINCE = 946_684_800.0


def call_day(when: float | None) -> str | None:
    """The UTC day (YYYY-MM-DD) of a call's timestamp; None for none, or for seconds counted from a log's start."""
    if when is None or when < DATED_SINCE:
        return None
    try:
        return datetime.fromtimestamp(when, UTC).date().isoformat()
    except (OverflowError, OSError, ValueError):  # past year 9999 (a what-if's --every of centuries): no known day
        return "9999-12-31"


def priced_at(price: ModelPrice, when: float | None) -> tuple[ModelPrice, str | None]:
    """``price`` with the rates in force on the UTC day of ``when``, and a note saying which when they are not
    today's. A call with no date (``when`` None, or seconds from the start of a log) gets today's rates, and so
    does a day on or after the current rates' ``effective_from``; a day before the first known price set gets that
    set (the earliest rates known), said in the note."""
    day = call_day(when)
    if day is None or not price.price_sets:
        return price, None
    chosen = next((s for s in price.price_sets if s.effective_from <= day < s.effective_to), None)
    first = price.price_sets[0]
    before = chosen is None and day < first.effective_from
    if before:
        chosen = first
    if chosen is None:
        return price, None
    dated = replace(price, input=chosen.input, output=chosen.output, cache_read=chosen.cache_read,
                    cache_write_5m=chosen.cache_write_5m, cache_write_1h=chosen.cache_write_1h,
                    cache_write=chosen.cache_write, bands=chosen.bands)
    last = (date.fromisoformat(chosen.effective_to) - timedelta(days=1)).isoformat()
    why = f": {chosen.note}" if chosen.note else ""
    if before:
        return dated, (f"{price.model}: calls dated before {first.effective_from}, the first day of the earliest "
                       f"rates the table knows, priced at those (${chosen.input:g} input, ${chosen.output:g} output "
                       f"per MTok{why})")
    return dated, (f"{price.model}: calls dated {chosen.effective_from} to {last} priced at the rates in force then "
                   f"(${chosen.input:g} input, ${chosen.output:g} output per MTok{why}), not today's")


def undated_note(price: ModelPrice) -> str:
    """What a report says of a call without a date to a model whose price changed."""
    since = price.effective_from or price.price_sets[-1].effective_to
    return (f"{price.model}: calls without a date (no timestamp, seconds from the start of the log, or an ISO time "
            f"without a zone) priced at today's rates, in force since {since}; earlier calls were billed at other "
            "rates (prompt-cost --list-models shows its history): give each line an ISO 8601 or epoch timestamp "
            "(--time-zone names the zone of times logged without one)")


def batch_factor(price: ModelPrice, batch: bool) -> float:
    """The factor a call's cost is multiplied by: the model's batch discount for a call made through the
    provider's Batch API (the discount stacks with the cache multipliers: each cache rate is halved too), else 1."""
    return price.batch_discount if batch and price.batch_discount is not None else 1.0


def cost_usd(price: ModelPrice, usage: Usage, *, batch: bool = False) -> float:
    """What the usage costs; writes are priced at their own TTL's rate; ``batch``: the call came through the
    provider's Batch API (priced at its batch rates where the table has them)."""
    r = price.rates(usage.prompt_tokens)
    read_rate = r.cache_read if r.cache_read is not None else r.input
    w5 = r.cache_write_5m if r.cache_write_5m is not None else r.cache_write if r.cache_write is not None else r.input
    w1 = r.cache_write_1h if r.cache_write_1h is not None else None
    if usage.cache_write_1h_tokens and w1 is None:
        raise InputError(f"{price.model}: no 1-hour cache write price known; add cache_write_1h with `prices`")
    total = (usage.input_tokens * r.input + usage.cache_write_5m_tokens * w5
             + usage.cache_write_1h_tokens * (w1 or 0.0) + usage.cache_read_input_tokens * read_rate
             + usage.output_tokens * r.output)
    return total * batch_factor(price, batch) / PER_MTOK


def uncached_cost_usd(price: ModelPrice, usage: Usage, *, batch: bool = False) -> float:
    """The same request with no caching at all: every prompt token at the base input price (the batch rate for a
    Batch API call)."""
    r = price.rates(usage.prompt_tokens)
    return (usage.prompt_tokens * r.input + usage.output_tokens * r.output) * batch_factor(price, batch) / PER_MTOK
