"""A learned, per-prompt threshold with a user-set error bound, after vCache (Schroeder et al., "vCache: Verified
Semantic Prompt Caching", ICLR 2026), written from the paper's description of the policy.

For each cached entry the policy keeps the (similarity, correct) observations of the requests that found the entry
as their nearest neighbour and were answered afresh ("explored"): correct means the fresh response was the one the
entry would have served. It models the chance that serving the entry is right as a sigmoid of the similarity,
``P(correct | s) = sigmoid(gamma * (s - t))``, fits ``t`` and ``gamma`` by maximum likelihood, and takes the
uncertainty of ``t`` from the fit (delta method). A request at similarity ``s`` is served from the cache
("exploited") with probability ``max_eps delta / (1 - (1 - eps) * sigmoid(gamma * (s - t'_eps)))`` (capped at 1),
where ``t'_eps`` is the upper ``1 - eps`` quantile of the estimate of ``t``; otherwise it is answered afresh, and the
answer becomes a new observation. The paper shows that this keeps the rate of wrong answers under ``delta``.

Where this differs from the paper's public code (vcache-project/vCache, ``VerifiedDecisionPolicy``):
- the logistic fit is a few Newton steps of our own with a weak ridge penalty on ``gamma``, so it stays finite
  when the observations separate perfectly; the public code fits with scikit-learn without a penalty and, on
  separated observations, takes the variance of ``t`` from a table it measured;
- a fit is made when an entry's observations change, not on every lookup (the same numbers, less work);
- similarities are not rounded to three decimals;
- labels come from the log (the response actually produced, or a pair's label) at once, not from a judge in a
  background thread, so a replay is deterministic for a given seed.
Both explore until an entry has at least ``MIN_OBSERVATIONS`` observations of both outcomes.
"""

from __future__ import annotations

import math
import random
from collections.abc import Hashable
from dataclasses import dataclass
from statistics import NormalDist

#: observations an entry needs (with both outcomes among them) before the policy may serve it
MIN_OBSERVATIONS = 6
#: the confidence levels searched: eps from 1e-6 to 1 - 1e-6, 50 steps (the paper's grid)
GRID = 50
#: ridge penalty on gamma (the slope), which keeps the fit finite on perfectly separated observations
RIDGE = 1e-2


@dataclass(frozen=True)
class Fit:
    """A fitted entry: the threshold ``t``, the slope ``gamma``, and the variance of ``t``."""

    t: float
    gamma: float
    var_t: float


def _sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def fit_logistic(obs: list[tuple[float, int]], ridge: float = RIDGE, steps: int = 30) -> Fit | None:
    """Maximum-likelihood ``logit P(correct) = b0 + b1 * s`` by Newton's method, with ``ridge/2 * b1**2`` as a
    penalty; ``t = -b0 / b1``, ``gamma = b1``, and ``var(t)`` by the delta method from the inverse of the
    (penalized) information matrix. None when the slope is not positive (more similar is not more right)."""
    import numpy as np

    s = np.fromiter((o[0] for o in obs), dtype=np.float64, count=len(obs))
    y = np.fromiter((o[1] for o in obs), dtype=np.float64, count=len(obs))
    b0 = b1 = 0.0
    h00 = h01 = h11 = 0.0
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-np.clip(b0 + b1 * s, -500, 500)))
        w = p * (1.0 - p)
        r = y - p
        g0, g1 = float(r.sum()), float(r @ s) - ridge * b1
        h00, h01, h11 = float(w.sum()) + 1e-9 * len(obs), float(w @ s), float(w @ (s * s)) + ridge
        det = h00 * h11 - h01 * h01
        if not det > 0:
            return None
        d0 = (h11 * g0 - h01 * g1) / det
        d1 = (h00 * g1 - h01 * g0) / det
        b0 += d0
        b1 += d1
        if abs(d0) < 1e-8 and abs(d1) < 1e-8:
            break
    det = h00 * h11 - h01 * h01
    if not b1 > 1e-6 or not math.isfinite(b0) or not det > 0:
        return None
    c00, c01, c11 = h11 / det, -h01 / det, h00 / det   # the inverse of the information matrix
    d_b0, d_b1 = -1.0 / b1, b0 / (b1 * b1)              # d t / d (b0, b1), with t = -b0 / b1
    var_t = max(0.0, d_b0 * d_b0 * c00 + 2 * d_b0 * d_b1 * c01 + d_b1 * d_b1 * c11)
    return Fit(t=min(1.0, max(0.0, -b0 / b1)), gamma=b1, var_t=var_t)


class AdaptivePolicy:
    """Decides, per request, whether a cached entry may answer, and learns from the answers it sees.

    ``key`` names the entry whose observations count: a cached prompt (the paper's local policy) or one shared
    key for the whole cache (its global variant)."""

    def __init__(self, delta: float, seed: int = 0, min_observations: int = MIN_OBSERVATIONS):
        if not 0 < delta < 1:
            raise ValueError("delta must be between 0 and 1")
        self.delta = delta
        self.rng = random.Random(seed)
        self.min_observations = min_observations
        eps = [1e-6 + i * (1 - 2e-6) / (GRID - 1) for i in range(GRID)]
        self._keep = [1.0 - e for e in eps]                       # 1 - eps
        self._z = [NormalDist().inv_cdf(1.0 - e) for e in eps]   # the 1 - eps quantile of a standard normal
        self.observations: dict[Hashable, list[tuple[float, int]]] = {}
        self._fits: dict[Hashable, Fit | None] = {}
        self._bounds: dict[Hashable, tuple[float, list[tuple[float, float]]] | None] = {}
        self.explored = 0
        self.exploited = 0

    def exploit_probability(self, key: Hashable, s: float) -> float:
        """The chance that the policy serves entry ``key`` to a request at similarity ``s``."""
        bounds = self._bounds_of(key)
        if bounds is None:
            return 0.0
        gamma = bounds[0]
        best = max(keep * _sigmoid(gamma * (s - t_prime)) for t_prime, keep in bounds[1])
        return 1.0 if best >= 1.0 else min(1.0, self.delta / (1.0 - best))

    def decide(self, key: Hashable, s: float) -> bool:
        """True: serve the cached entry (exploit); False: answer afresh and observe (explore)."""
        u = self.rng.random()
        hit = u < self.exploit_probability(key, s)
        if hit:
            self.exploited += 1
        else:
            self.explored += 1
        return hit

    def observe(self, key: Hashable, s: float, correct: bool) -> None:
        self.observations.setdefault(key, []).append((s, int(correct)))
        self._fits.pop(key, None)
        self._bounds.pop(key, None)

    def fit(self, key: Hashable) -> Fit | None:
        if key not in self._fits:
            obs = self.observations.get(key, ())
            ones = sum(y for _, y in obs)
            ok = len(obs) >= self.min_observations and 0 < ones < len(obs)
            self._fits[key] = fit_logistic(list(obs)) if ok else None
        return self._fits[key]

    def _bounds_of(self, key: Hashable) -> tuple[float, list[tuple[float, float]]] | None:
        """gamma, and per eps ``(t'_eps, 1 - eps)``: computed once per fit."""
        if key in self._bounds:
            return self._bounds[key]
        f = self.fit(key)
        if f is None:
            return None
        sd = math.sqrt(f.var_t)
        bounds = (f.gamma, [(min(1.0, max(0.0, f.t + z * sd)), keep) for z, keep in zip(self._z, self._keep)])
        self._bounds[key] = bounds
        return bounds
