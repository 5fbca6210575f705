"""The server's prefix cache: what hit rate a vLLM (or SGLang, LMCache) server gets on a trace, at one capacity,
over a capacity curve or across a fleet of replicas, and what those hits are worth.

- :mod:`.trace`: a trace's requests (:class:`TraceRequest`), their chained block keys, the JSONL trace reader
- :mod:`.pools`: the cache policies: vLLM's block pool (and its sequential form), radix, chunk, infinite
- :mod:`.lru`: the sequential vLLM pool as a key-level LRU (the fast path of one replay)
- :mod:`.replay`: :func:`simulate`, one replay of a trace through one pool
- :mod:`.curve`: :func:`capacity_curve`, the hit rate at every capacity from one read, and the Belady bound
- :mod:`.read`: a large trace read and keyed by forked workers, in file order
- :mod:`.fleet`: :func:`simulate_fleet`, routers over replicas and the CPU offload tier; trace partitions
- :mod:`.value`: :func:`hits_worth`, the prefill time and money the hits save, and what that is worth end to end
- :mod:`.served`: :func:`compare_served`, predicted hits beside the cached tokens a server reports it served,
  and the likely reason of each disagreement
- :mod:`.forks`: :func:`analyze_forks`, the shared-prefix tree of a whole log: where requests split, why, and what
  each fork costs by counterfactual replay (:func:`fork_requests` builds its input, :meth:`ForkReport.spans_to_move`
  what FX001/FX007 move)
"""

from .curve import CurvePoint, CurveReport, capacity_curve
from .fleet import FleetReport, simulate_fleet, simulate_partitions
from .forks import Fork, ForkReport, ForkRequest, MoveSpan, analyze_forks, fork_requests, fork_span
from .replay import POLICIES, PrefixReport, RequestHit, TenantStats, simulate
from .served import ServedReport, compare_served
from .trace import TraceRequest, iter_trace, trace_records
from .value import HitsWorth, ServingTime, hits_worth

__all__ = ["POLICIES", "CurvePoint", "CurveReport", "FleetReport", "Fork", "ForkReport", "ForkRequest", "HitsWorth",
           "MoveSpan", "PrefixReport", "RequestHit", "ServedReport", "ServingTime", "TenantStats", "TraceRequest",
           "analyze_forks", "capacity_curve", "compare_served", "fork_requests", "fork_span", "hits_worth", "iter_trace", "simulate", "simulate_fleet",
           "simulate_partitions", "trace_records"]
