"""The model names two engines both look up: the architectures of kv's catalog and the provider models of the
price table. ``kv-inspect`` and ``prompt-cost`` each take ``--model`` in its own sense, and each names the other
sense in its error when a user passes the other kind; this module, below both, answers "is this name the other
kind?" from the shipped data files, so that neither engine imports the other.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from importlib import resources


def _data(name: str) -> dict:
    return json.loads(resources.files("cachectl.data").joinpath(name).read_text(encoding="utf-8"))


def match_model(name: str, names: Iterable[str], aliases: Mapping[str, str]) -> str | None:
    """The price-table entry ``name`` is priced as: the exact name, a declared alias, else the longest entry
    that prefixes it as ``entry-...`` (a dated snapshot); None when nothing matches. The one lookup rule of
    :meth:`cachectl.engines.provider.prices.PriceTable.lookup` and of :func:`is_price_model`."""
    names = list(names)
    if name in names:
        return name
    if name in aliases:
        return aliases[name]
    bare = name.split("/")[-1].split("@")[0]
    candidates = [m for m in names if bare == m or bare.startswith(m + "-")]
    return max(candidates, key=len) if candidates else None


@functools.cache
def _shipped_prices() -> tuple[tuple[str, ...], dict[str, str]]:
    models = _data("prices.json")["models"]
    aliases: dict[str, str] = {}
    for name, entry in models.items():
        for alias in entry.get("aliases") or ():
            aliases.setdefault(alias, name)
    return tuple(models), aliases


def is_price_model(name: str) -> bool:
    """Whether the shipped price table prices ``name`` (a provider model, for ``prompt-cost``/``lint``)."""
    names, aliases = _shipped_prices()
    return match_model(name, names, aliases) is not None


@functools.cache
def architecture_names() -> frozenset[str]:
    """The model architectures of kv-inspect's catalog (``cachectl/data/models.json``)."""
    return frozenset(_data("models.json")["models"])


def is_architecture(name: str) -> bool:
    return name.lower() in architecture_names()
