"""The conventions of the semantic caches users run, so that a replay predicts their hits.

- ``cachectl``: cosine similarity of normalized embeddings, a hit at or above the threshold, exact search (an HNSW
  index past 50,000 stored prompts), no eviction.
- ``gptcache`` (GPTCache 0.1.x as set up by its README and ``init_similar_cache``: an embedding function, the
  ``sqlite,faiss`` data manager, ``SearchDistanceEvaluation``): vectors normalized by the data manager before they
  are stored and searched; faiss ``IndexFlatL2`` (exact) returns the squared L2 distance of the nearest stored vector
  (``top_k`` 1); the score is ``4 - min(max(d, 0), 4)``; a hit when ``score >= 4 * similarity_threshold`` (default
  0.8, about cosine 0.6 on unit vectors); the in-memory LRU eviction keeps ``max_size`` entries (default 1000) and,
  when full, evicts the ``clean_size`` least recently used at once (default 20% of max_size), where a hit counts
  as a use.
- ``redisvl`` (``SemanticCache`` in ``redisvl/extensions/cache/llm/semantic.py`` and ``schema.py``, read
  2026-12-03): a Redis vector index with ``distance_metric`` cosine and ``algorithm`` flat (exact), whose
  distance is ``1 - cosine`` (Redis normalizes); ``check`` runs a ``VectorRangeQuery`` with
  ``distance_threshold`` (default 0.1, cosine 0.9; 0 to 2 allowed) and ``num_results`` 1, so a hit is the
  nearest entry within the threshold; ``filterable_fields`` with a ``filter_expression`` scope a lookup as
  ``--key-fields`` does; no eviction but an optional TTL (refreshed on each hit), which a replay without
  timestamps cannot model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Like:
    name: str
    #: the threshold's unit, as the library names it
    threshold_name: str
    default_threshold: float
    #: the distance or score the threshold applies to
    measure: str
    #: whether the library keeps at most max_size entries (LRU) and how many it evicts at once when full
    max_size: int | None
    clean_fraction: float = 0.0
    #: exact search whatever the size (faiss IndexFlatL2, a Redis FLAT index)
    exact: bool = True

    def hit(self, cosine: float, squared_l2: float) -> bool:
        """Whether the library would serve the nearest entry, given its cosine and squared L2 distance."""
        raise NotImplementedError

    def threshold_as_cosine(self, threshold: float) -> float:
        """The cosine that the threshold amounts to on unit vectors (for the report)."""
        raise NotImplementedError

    def check(self, threshold: float) -> None:
        pass


@dataclass(frozen=True)
class _Cachectl(Like):
    def hit(self, cosine: float, squared_l2: float) -> bool:  # noqa: ARG002
        return cosine >= self._threshold

    def threshold_as_cosine(self, threshold: float) -> float:
        return threshold

    _threshold: float = 0.9


@dataclass(frozen=True)
class GPTCacheLike(Like):
    """GPTCache's ``SearchDistanceEvaluation`` (max_distance 4.0, positive False) on faiss's squared L2."""

    similarity_threshold: float = 0.8
    max_distance: float = 4.0

    def rank_threshold(self) -> float:
        # adapter.adapt: (max_rank - min_rank) * similarity_threshold * cache_factor, clamped to the range
        return min(self.max_distance, max(0.0, self.max_distance * self.similarity_threshold * 1.0))

    def hit(self, cosine: float, squared_l2: float) -> bool:  # noqa: ARG002
        d = min(max(squared_l2, 0.0), self.max_distance)
        return self.rank_threshold() <= self.max_distance - d

    def threshold_as_cosine(self, threshold: float) -> float:
        # 4 - (2 - 2c) >= 4t  <=>  c >= 2t - 1
        return 2 * threshold - 1


@dataclass(frozen=True)
class RedisVLLike(Like):
    """redisvl ``SemanticCache``: Redis COSINE distance ``1 - cosine`` at most ``distance_threshold``."""

    distance_threshold: float = 0.1

    def hit(self, cosine: float, squared_l2: float) -> bool:  # noqa: ARG002
        return 1.0 - cosine <= self.distance_threshold

    def threshold_as_cosine(self, threshold: float) -> float:
        return 1.0 - threshold


LIKES = ("cachectl", "gptcache", "redisvl")


def like(name: str, threshold: float | None = None, max_size: int | None = None) -> Like:
    """The conventions of ``name`` with its threshold (in the library's own unit; its default when None)."""
    from ...errors import UsageError

    if name == "gptcache":
        t = 0.8 if threshold is None else threshold
        if not 0 <= t <= 1:
            raise UsageError(f"GPTCache's similarity_threshold is between 0 and 1, got {t}")
        return GPTCacheLike(name="gptcache", threshold_name="similarity_threshold", default_threshold=0.8,
                            measure="4 - squared L2 distance of normalized vectors (faiss IndexFlatL2)",
                            max_size=1000 if max_size is None else max_size, clean_fraction=0.2,
                            similarity_threshold=t)
    if name == "redisvl":
        t = 0.1 if threshold is None else threshold
        if not 0 <= t <= 2:
            raise UsageError(f"redisvl's distance_threshold is a cosine distance between 0 and 2, got {t}")
        return RedisVLLike(name="redisvl", threshold_name="distance_threshold", default_threshold=0.1,
                           measure="Redis COSINE distance, 1 - cosine (FLAT index)", max_size=max_size,
                           distance_threshold=t)
    if name == "cachectl":
        t = 0.9 if threshold is None else threshold
        if not -1 <= t <= 1:
            raise UsageError(f"a cosine threshold must be between -1 and 1, got {t}")
        return _Cachectl(name="cachectl", threshold_name="cosine", default_threshold=0.9,
                         measure="cosine similarity of normalized embeddings", max_size=max_size, exact=False,
                         _threshold=t)
    raise UsageError(f"unknown cache {name!r}: expected one of {', '.join(LIKES)}")
