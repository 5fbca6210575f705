"""What the report's lost tokens cost: each request's within-conversation loss as the pairs are compared
(:class:`PairLosses`), and the dollars a lost token costs (:class:`LostTokenPrice`): its model's input price less
its cache-read price, one price for every token (``--model``'s, or the one the log's models share) or, for a log
that mixes models of different prices, each request's own model's (the later request of each pair: the one that
paid for the prompt it did not read from the cache)."""

from __future__ import annotations

from array import array
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...errors import CachectlError

#: the model a request (by line number) names, None where it names none
ModelOf = Callable[[int], "str | None"]


@dataclass(frozen=True)
class PairLosses:
    """The within-conversation loss of requests (by line), with the cause of each and its conversation's row:
    four arrays, 24 bytes a request, where a dict takes about a hundred."""

    lines: array = field(default_factory=lambda: array("q"))
    lost: array = field(default_factory=lambda: array("q"))
    causes: array = field(default_factory=lambda: array("i"))  # index into cause_names
    rows: array = field(default_factory=lambda: array("i"))    # the conversation's row (report's ``_Conversations``)
    cause_names: dict = field(default_factory=dict)          # cause -> its index

    def add(self, line: int, lost: int, cause: str | None = None, row: int = -1) -> None:
        c = self.cause_names.setdefault(cause, len(self.cause_names))
        self.lines.append(line)
        self.lost.append(lost)
        self.causes.append(c)
        self.rows.append(row)

    def of(self, lines: Container[int]) -> dict[int, int]:
        return {ln: n for ln, n in zip(self.lines, self.lost) if ln in lines}

    def by_model(self, model_of: ModelOf, rows: Container[int] = ()) -> tuple[dict, dict, dict[str | None, int]]:
        """The losses by the model of the request that lost them (``model_of`` asked once a loss), in one walk: by
        cause, by conversation row (of those in ``rows``), and in all."""
        names = {i: c for c, i in self.cause_names.items()}
        by_cause: dict[str | None, dict[str | None, int]] = {}
        by_row: dict[int, dict[str | None, int]] = {}
        total: dict[str | None, int] = {}
        for c, line, n, k in zip(self.causes, self.lines, self.lost, self.rows):
            m = model_of(line)
            for by in (by_cause.setdefault(names[c], {}), total, *((by_row.setdefault(k, {}),) if k in rows else ())):
                by[m] = by.get(m, 0) + n
        return by_cause, by_row, total


@dataclass(frozen=True)
class LostTokenPrice:
    """The dollars a prompt token a provider cache did not read costs: ``rate`` for every token (``model``'s
    price), or, where ``rate`` is None, ``rates`` by the model each request names."""

    model: str | None
    rate: float | None
    rates: Mapping[str, float] = field(default_factory=dict)

    @property
    def models(self) -> tuple[str, ...]:
        """The models whose prices are used."""
        return (self.model,) if self.model is not None else tuple(self.rates)

    def dollars(self, tokens: int, by_model: Mapping[str | None, int] | None = None) -> float | None:
        """The price of ``tokens`` lost tokens, ``by_model`` the same tokens by the model of the request that lost
        them (needed only without one rate). The tokens of each rate are summed before they are priced: one rate's
        figure is exactly ``tokens * rate``. None where a request names no model priced."""
        if self.rate is not None:
            return tokens * self.rate
        if by_model is None:
            return None
        at: dict[float, int] = {}
        for m, n in by_model.items():
            if n:
                r = self.rates.get(m) if m is not None else None
                if r is None:
                    return None
                at[r] = at.get(r, 0) + n
        return sum(r * n for r, n in sorted(at.items()))

    def note(self, tokenizer_name: str) -> str:
        at = (f"{self.model}'s input price less its cache-read price" if self.model is not None else
              "each request's model's input price less its cache-read price ("
              + ", ".join(f"{m} ${r * 1e6:,.4g}" for m, r in self.rates.items()) + " a million tokens)")
        return (f"dollars lost: tokens not reused, at {at}, counted with {tokenizer_name}: an estimate of what a "
                "provider cache could have read")


def lost_token_prices(table: Any, models: Iterable[str], model: str | None = None, *, per_request: bool = False
                      ) -> tuple[LostTokenPrice | None, str | None]:
    """What a prompt token a provider cache did not read costs (None without a price) and a note where no price is
    given. ``model`` (``--model``) prices every token; else the models the log's requests name: one price where they
    share one, each request's own model's with ``per_request`` (else no dollar figure, and a note saying so, not the
    first model's price for every token)."""
    names = [model] if model else list(dict.fromkeys(models))
    if table is None or not names:
        return None, None
    rates: dict[str, float] = {}   # by the model's name as the log gives it
    priced: dict[str, str] = {}    # the table's name of each
    for name in names:
        try:
            price = table.lookup(name)
        except CachectlError:
            return None, (f"no dollar figure for lost tokens: no price for {name!r} (add it with `prices`, or pass "
                          "`model` to price them at one model's)")
        if price.cache_read is None:
            return None, f"no dollar figure for lost tokens: {price.model} has no cache-read price"
        rates[name], priced[name] = (price.input - price.cache_read) / 1e6, price.model
    if len(set(rates.values())) == 1:
        first = next(iter(rates))
        return LostTokenPrice(priced[first], rates[first]), None
    if per_request:
        return LostTokenPrice(None, None, rates), None
    return None, no_figure("lost tokens", "the log's models are priced differently "
                           f"({', '.join(dict.fromkeys(priced.values()))})")


def no_figure(what: str, why: str) -> str:
    """The note where ``what`` gets no dollar figure, because ``why`` (a log's models priced differently)."""
    return f"no dollar figure for {what}: {why}; pass `model` to price them at one model's"


def by_model(losses: Iterable[tuple[int, int]], model_of: ModelOf) -> dict[str | None, int]:
    """``(line, tokens)`` pairs summed by the model the request on ``line`` names."""
    out: dict[str | None, int] = {}
    for line, n in losses:
        m = model_of(line)
        out[m] = out.get(m, 0) + n
    return out


def merged(splits: Iterable[dict]) -> dict:
    """Tokens by model, summed over ``splits``."""
    out: dict = {}
    for by in splits:
        for m, n in by.items():
            out[m] = out.get(m, 0) + n
    return out


__all__ = ["LostTokenPrice", "ModelOf", "PairLosses", "by_model", "lost_token_prices", "merged", "no_figure"]
