"""The model names two engines both look up: the architectures of kv's catalog and the provider models of the
price table. ``kv-inspect`` and ``prompt-cost`` each take ``--model`` in its own sense, and each names the other
sense in its error when a user passes the other kind; this module, below both, answers "is this name the other
kind?" from the shipped data files, so that neither engine imports the other.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Container, Iterable, Mapping

from ..datafiles import load_data

#: a Vertex AI snapshot id spells the date after an ``@`` (``claude-sonnet-4-5@20250929``)
_VERTEX_DATE = re.compile(r"@(\d{8})$")


def alias_map(entries: Iterable[tuple[str, Iterable[str]]]) -> dict[str, str]:
    """Declared alias -> entry, from ``(entry, its aliases)`` pairs; the first entry to declare an alias keeps it."""
    out: dict[str, str] = {}
    for name, aliases in entries:
        for alias in aliases:
            out.setdefault(alias, name)
    return out


def match_model(name: str, names: Container[str], aliases: Mapping[str, str]) -> str | None:
    """The price-table entry ``name`` is priced as: the exact name, else a declared alias (dated snapshots,
    ``-latest``), else None. Nothing is guessed: a name that only starts like an entry (``gpt-5-pro``,
    ``claude-opus-4-9``) matches nothing. A gateway's provider prefix (``openai/gpt-4.1``) is the same name, and
    a Vertex AI ``@YYYYMMDD`` is the same snapshot as Anthropic's ``-YYYYMMDD``, so both are read as such. The
    one lookup rule of :meth:`cachectl.engines.provider.prices.PriceTable.lookup` and of
    :func:`is_price_model`."""
    for candidate in _spellings(name):
        if candidate in names:
            return candidate
        if candidate in aliases:
            return aliases[candidate]
    return None


def _spellings(name: str) -> list[str]:
    out = [name]
    bare = name.rsplit("/", 1)[-1]
    if bare != name:
        out.append(bare)
    for n in list(out):
        m = _VERTEX_DATE.search(n)
        if m:
            out.append(n[:m.start()] + "-" + m.group(1))
    return out


@functools.cache
def _shipped_prices() -> tuple[frozenset[str], dict[str, str]]:
    models = load_data("prices.json")["models"]
    return frozenset(models), alias_map((name, entry.get("aliases") or ()) for name, entry in models.items())


def is_price_model(name: str) -> bool:
    """Whether the shipped price table prices ``name`` (a provider model, for ``prompt-cost``/``lint``)."""
    names, aliases = _shipped_prices()
    return match_model(name, names, aliases) is not None


@functools.cache
def architecture_names() -> frozenset[str]:
    """The model architectures of kv-inspect's catalog (``cachectl/data/models.json``)."""
    return frozenset(load_data("models.json")["models"])


def is_architecture(name: str) -> bool:
    return name.lower() in architecture_names()
