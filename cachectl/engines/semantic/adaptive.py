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
- an entry is fitted anew after each of its first 10 observations, then whenever they have grown by a tenth,
  not on every lookup; and the probability of serving is remembered per fit and similarity (rounded to three
  decimals, as the public code rounds it);
- labels come from the log (the response actually produced, or a pair's label) at once, not from a judge in a
  background thread, so a replay is deterministic for a given seed.
Both explore until an entry has at least ``MIN_OBSERVATIONS`` observations of both outcomes.
"""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

#: observations an entry needs (with both outcomes among them) before the policy may serve it
MIN_OBSERVATIONS = 6
#: the confidence levels searched: eps from 1e-6 to 1 - 1e-6, 50 steps (the paper's grid)
GRID = 50
#: ridge penalty on gamma (the slope), which keeps the fit finite on perfectly separated observations
RIDGE = 1e-2
#: an entry is fitted anew after each of its first REFIT_EACH observations, then whenever they have grown by
#: REFIT_GROWTH since its last fit
REFIT_EACH = 10
REFIT_GROWTH = 1.1


@dataclass(frozen=True)
class Fit:
    """A fitted entry: the threshold ``t``, the slope ``gamma``, and the variance of ``t``."""

    t: float
    gamma: float
    var_t: float
    b0: float = 0.0   # the intercept, where the next fit of the entry starts


def _sigmoid(z: float) -> float:
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def _log_sigmoid(z: float) -> float:
    return -math.log1p(math.exp(-z)) if z > -30.0 else z - math.log1p(math.exp(z))


def best_lower_bound(gamma: float, t_primes: Sequence[float], log_keep: Sequence[float], s: float) -> float:
    """``max_i exp(log_keep[i]) * sigmoid(gamma * (s - t_primes[i]))`` over the grid, in about 2 log2(50)
    evaluations.

    With ``x = Phi^-1(eps)`` the terms are ``Q(x) * sigmoid(a + b x)`` (``b = gamma * sd(t) >= 0``): both factors
    are log-concave in ``x``, so the terms rise then fall, and a binary search on their differences finds the
    largest. ``t'`` clipped at 1 (the first terms) gives a falling run whose largest is its first term; clipped
    at 0 keeps log-concavity."""
    n = len(t_primes)
    lo, hi = 0, n                       # t_primes falls with i: find the first t' below 1
    if n and t_primes[0] < 1.0:
        hi = 0                          # none clipped at 1 (the usual case): no search
    while lo < hi:
        mid = (lo + hi) // 2
        if t_primes[mid] >= 1.0:
            lo = mid + 1
        else:
            hi = mid
    best = -math.inf
    if lo > 0:
        best = log_keep[0] + _log_sigmoid(gamma * (s - t_primes[0]))
    if lo < n:
        a, b = lo, n - 1
        exp, log1p = math.exp, math.log1p
        while a < b:
            m = (a + b) // 2
            z0, z1 = gamma * (s - t_primes[m]), gamma * (s - t_primes[m + 1])
            h0 = log_keep[m] + (-log1p(exp(-z0)) if z0 > -30.0 else z0)
            h1 = log_keep[m + 1] + (-log1p(exp(-z1)) if z1 > -30.0 else z1)
            if h0 < h1:
                a = m + 1
            else:
                b = m
        best = max(best, log_keep[a] + _log_sigmoid(gamma * (s - t_primes[a])))
    return math.exp(best)


def _newton_step(b0: float, b1: float, g0: float, g1: float, h00: float, h01: float,
                 h11: float) -> tuple[float, float, bool] | None:
    """One Newton step of :func:`fit_logistic` from its gradient and (penalized) information matrix: the new
    coefficients and whether the step was small enough to stop; None when the matrix is not positive definite."""
    det = h00 * h11 - h01 * h01
    if not det > 0:
        return None
    d0 = (h11 * g0 - h01 * g1) / det
    d1 = (h00 * g1 - h01 * g0) / det
    b0 += d0
    b1 += d1
    return b0, b1, abs(d1) < 1e-6 * (1.0 + abs(b1)) and abs(d0) < 1e-6 * (1.0 + abs(b0))


def fit_logistic(obs: Sequence[tuple[float, int]] | tuple[Any, Any], ridge: float = RIDGE, steps: int = 25,
                 start: tuple[float, float] = (0.0, 0.0)) -> Fit | None:
    """Maximum-likelihood ``logit P(correct) = b0 + b1 * s`` by Newton's method, with ``ridge/2 * b1**2`` as a
    penalty; ``t = -b0 / b1``, ``gamma = b1``, and ``var(t)`` by the delta method from the inverse of the
    (penalized) information matrix. None when the slope is not positive (more similar is not more right)."""
    if isinstance(obs, tuple) and len(obs) == 2 and isinstance(obs[0], array):
        s_seq, y_seq = obs
    else:
        s_seq, y_seq = [o[0] for o in obs], [float(o[1]) for o in obs]
    n = len(s_seq)
    b0, b1 = start
    h00 = h01 = h11 = 0.0
    if n <= 64:   # small: plain floats beat numpy's per-call overhead
        pairs = list(zip(s_seq, y_seq))
        exp = math.exp
        for _ in range(steps):
            g0 = g1 = h00 = h01 = h11 = 0.0
            for s, y in pairs:
                z = b0 + b1 * s
                p = 1.0 / (1.0 + exp(-z)) if z > -500 else 0.0
                w = p * (1.0 - p)
                r = y - p
                g0 += r
                g1 += r * s
                h00 += w
                ws = w * s
                h01 += ws
                h11 += ws * s   # w * s * s, in the same order
            g1 -= ridge * b1
            h00 += 1e-9 * n
            h11 += ridge
            step = _newton_step(b0, b1, g0, g1, h00, h01, h11)
            if step is None:
                return None
            b0, b1, done = step
            if done:
                break
    else:
        import numpy as np

        sa = np.frombuffer(s_seq) if isinstance(s_seq, array) else np.asarray(s_seq, dtype=np.float64)
        ya = np.frombuffer(y_seq) if isinstance(y_seq, array) else np.asarray(y_seq, dtype=np.float64)
        sa2 = sa * sa
        # np.clip(x, -500, 500) and x.sum(), without their Python-level wrappers (the same ufuncs underneath)
        np_exp, maximum, minimum, total = np.exp, np.maximum, np.minimum, np.add.reduce
        for _ in range(steps):
            pa = 1.0 / (1.0 + np_exp(-minimum(maximum(b0 + b1 * sa, -500.0), 500.0)))
            wa = pa * (1.0 - pa)
            ra = ya - pa
            g0, g1 = float(total(ra)), float(ra @ sa) - ridge * b1
            h00, h01, h11 = float(total(wa)) + 1e-9 * n, float(wa @ sa), float(wa @ sa2) + ridge
            step = _newton_step(b0, b1, g0, g1, h00, h01, h11)
            if step is None:
                return None
            b0, b1, done = step
            if done:
                break
    det = h00 * h11 - h01 * h01
    if not b1 > 1e-6 or not math.isfinite(b0) or not det > 0:
        return None
    c00, c01, c11 = h11 / det, -h01 / det, h00 / det   # the inverse of the information matrix
    d_b0, d_b1 = -1.0 / b1, b0 / (b1 * b1)              # d t / d (b0, b1), with t = -b0 / b1
    var_t = max(0.0, d_b0 * d_b0 * c00 + 2 * d_b0 * d_b1 * c01 + d_b1 * d_b1 * c11)
    return Fit(t=min(1.0, max(0.0, -b0 / b1)), gamma=b1, var_t=var_t, b0=b0)


class _Entry:
    """What the policy knows of one cached entry: its observations, its fit, and what follows from the fit."""

    __slots__ = ("s", "y", "ones", "fit", "last", "refit_at", "memo", "gamma", "t", "sd", "t_low", "t_primes",
                 "stale")

    def __init__(self) -> None:
        self.s = array("d")          # similarities, rounded to three decimals
        self.y = array("d")          # 1.0 right, 0.0 wrong
        self.ones = 0
        self.fit: Fit | None = None
        self.last: Fit | None = None   # the latest fit, where the next one starts
        self.refit_at = 0
        #: the probabilities of serving worked out so far for the current fit (per similarity); None: no fit
        self.memo: dict[int, float] | None = None
        self.gamma = self.t = self.sd = 0.0   # the fit's slope, threshold and the standard deviation of t
        self.t_low = 0.0                      # the lowest t'_eps (the largest eps), for decide's quick reject
        #: t'_eps per eps, worked out when the first probability search of the fit needs them
        self.t_primes: list[float] | None = None
        self.stale = True


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
        self._log_keep = [math.log(k) for k in self._keep]
        self._z = [NormalDist().inv_cdf(1.0 - e) for e in eps]   # the 1 - eps quantile of a standard normal
        self._entries: dict[Hashable, _Entry] = {}
        self.explored = 0
        self.exploited = 0

    def _refresh(self, e: _Entry) -> None:
        """Fit the entry anew (when it has enough observations of both outcomes) and derive its bounds."""
        e.stale = False
        n = len(e.s)
        f = None
        if n >= self.min_observations and 0 < e.ones < n:
            last = e.last
            f = fit_logistic((e.s, e.y), start=(last.b0, last.gamma) if last else (0.0, 0.0))
        e.fit = f
        if f is None:
            e.memo = None
            return
        e.last = f
        e.refit_at = n + 1 if n < REFIT_EACH else math.ceil(n * REFIT_GROWTH)
        sd = math.sqrt(f.var_t)
        e.gamma, e.t, e.sd = f.gamma, f.t, sd
        e.t_low = min(1.0, max(0.0, f.t + self._z[-1] * sd))   # the last of t_primes, without the others
        e.t_primes = None
        e.memo = {}

    def _t_primes(self, t: float, sd: float) -> list[float]:
        """``[min(1.0, max(0.0, t + z * sd)) for z in self._z]``, clipping only where it applies: the z fall, so
        the values do (sd >= 0), and two binary searches find the runs clipped at 1 and at 0."""
        zs = self._z
        n = len(zs)
        lo, hi = 0, n
        while lo < hi:   # the first value below 1
            mid = (lo + hi) // 2
            if t + zs[mid] * sd >= 1.0:
                lo = mid + 1
            else:
                hi = mid
        a, hi = lo, n
        while lo < hi:   # the first value at or below 0
            mid = (lo + hi) // 2
            if t + zs[mid] * sd > 0.0:
                lo = mid + 1
            else:
                hi = mid
        return [1.0] * a + [t + z * sd for z in zs[a:lo]] + [0.0] * (n - lo)

    def _search(self, e: _Entry, milli: int) -> float:
        """The probability of serving entry ``e`` (fitted) at similarity ``milli / 1000``: searched, remembered."""
        t_primes = e.t_primes
        if t_primes is None:
            t_primes = e.t_primes = self._t_primes(e.t, e.sd)
        best = best_lower_bound(e.gamma, t_primes, self._log_keep, milli / 1000)
        p = 1.0 if best >= 1.0 else min(1.0, self.delta / (1.0 - best))
        e.memo[milli] = p  # type: ignore[index]
        return p

    def _probability(self, e: _Entry, milli: int) -> float:
        p = e.memo.get(milli)  # type: ignore[union-attr]
        return self._search(e, milli) if p is None else p

    def fit(self, key: Hashable) -> Fit | None:
        e = self._entries.get(key)
        if e is None:
            return None
        if e.stale:
            self._refresh(e)
        return e.fit

    def exploit_probability(self, key: Hashable, s: float) -> float:
        """The chance that the policy serves entry ``key`` to a request at similarity ``s`` (rounded to three
        decimals, as the public code does; remembered per fit)."""
        e = self._entries.get(key)
        if e is None:
            return 0.0
        if e.stale:
            self._refresh(e)
        return 0.0 if e.memo is None else self._probability(e, round(s * 1000))

    def decide(self, key: Hashable, s: float) -> bool:
        """True: serve the cached entry (exploit); False: answer afresh and observe (explore)."""
        u = self.rng.random()
        e = self._entries.get(key)
        hit = False
        if e is not None:
            if e.stale:
                self._refresh(e)
            memo = e.memo
            if memo is None:
                pass
            elif u < self.delta:   # a fitted entry is served with probability delta at least
                hit = True
            else:
                # served when u < delta / (1 - best), i.e. best > 1 - delta / u; best is at most the sigmoid at
                # the lowest t', which often settles it without the search (the sigmoid written out: _sigmoid)
                milli = round(s * 1000)
                z = e.gamma * (milli / 1000 - e.t_low)
                if z >= 0:
                    top = 1.0 / (1.0 + math.exp(-z))
                else:
                    ez = math.exp(z)
                    top = ez / (1.0 + ez)
                if not top <= 1.0 - self.delta / u:
                    p = memo.get(milli)
                    hit = u < (self._search(e, milli) if p is None else p)
        if hit:
            self.exploited += 1
        else:
            self.explored += 1
        return hit

    def observe(self, key: Hashable, s: float, correct: bool) -> None:
        e = self._entries.get(key)
        if e is None:
            e = self._entries[key] = _Entry()
        es = e.s
        es.append(round(s * 1000) / 1000)
        if correct:
            e.y.append(1.0)
            e.ones += 1
        else:
            e.y.append(0.0)
        if e.fit is None or len(es) >= e.refit_at:
            e.stale = True   # else the fit stands until the observations have grown enough

    def observations(self, key: Hashable) -> list[tuple[float, int]]:
        """The (similarity, correct) observations of entry ``key``, oldest first."""
        e = self._entries.get(key)
        return [] if e is None else [(s, int(y)) for s, y in zip(e.s, e.y)]
