"""The provider's prompt cache: what Anthropic's and OpenAI's prompt caching costs and saves on a request log, a
bill's usage counters reconciled with the rules, and the dated price table the dollars come from.

- :mod:`.cache`: :func:`simulate_requests` (a log replayed through the provider's cache rules),
  :func:`audit_usage` (logged usage counters priced and checked), :func:`what_if`
- :mod:`.prices`: :class:`PriceTable`, prices and cache rules per model, with sources and dates
"""

from .cache import CostReport, MissReason, Reconciliation, RequestCost, audit_usage, simulate_requests, what_if
from .prices import ModelPrice, PriceTable, UnknownModelError, Usage

__all__ = ["CostReport", "MissReason", "ModelPrice", "PriceTable", "Reconciliation", "RequestCost",
           "UnknownModelError", "Usage", "audit_usage", "simulate_requests", "what_if"]
