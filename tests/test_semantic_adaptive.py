"""The adaptive (vCache-style) policy, the side-by-side report, and context fields as part of the cache key."""

from __future__ import annotations

import json
import math
import random
from statistics import NormalDist

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachectl.engines import semantic
from cachectl.engines.semantic import adaptive
from cachectl.errors import InputError

from .conftest import FIXTURES

EPS = [1e-6 + i * (1 - 2e-6) / 49 for i in range(50)]
KEEP = [1 - e for e in EPS]
Z = [NormalDist().inv_cdf(1 - e) for e in EPS]


@given(st.floats(0, 1), st.floats(0, 1), st.floats(0, 3000), st.floats(-0.5, 1.5))
@settings(max_examples=300, deadline=None)
def test_the_search_for_the_best_bound_equals_the_full_grid(t, sd, gamma, s):
    t_primes = [min(1.0, max(0.0, t + z * sd)) for z in Z]
    brute = max(k * adaptive._sigmoid(gamma * (s - tp)) for tp, k in zip(t_primes, KEEP))
    fast = adaptive.best_lower_bound(gamma, t_primes, [math.log(k) for k in KEEP], s)
    assert fast == pytest.approx(brute, rel=1e-9, abs=1e-300)


def scipy_fit(obs):
    from scipy.optimize import minimize

    def nll(b):
        total = 0.5 * adaptive.RIDGE * b[1] ** 2
        for s, y in obs:
            z = b[0] + b[1] * s
            total += math.log1p(math.exp(-abs(z))) + max(z, 0) - y * z
        return total

    ref = minimize(nll, [0.0, 1.0], method="Nelder-Mead", options={"xatol": 1e-9, "fatol": 1e-12, "maxiter": 20000})
    return ref.x[1], -ref.x[0] / ref.x[1]


@pytest.mark.parametrize("n", [40, 150])  # the plain-float path (<= 64 observations) and the numpy one
def test_the_logistic_fit_matches_scipy_on_the_same_penalized_likelihood(n):
    rng = random.Random(3)
    obs = [(s, int(s + rng.gauss(0, 0.03) > 0.88)) for s in (rng.uniform(0.7, 1.0) for _ in range(n))]
    gamma, t = scipy_fit(obs)
    fit = adaptive.fit_logistic(obs)
    assert fit is not None
    assert fit.gamma == pytest.approx(gamma, rel=1e-3)
    assert fit.t == pytest.approx(t, abs=1e-4)
    assert 0.83 < fit.t < 0.93 and fit.var_t > 0


def test_the_policy_explores_until_it_has_seen_both_outcomes():
    pol = semantic.AdaptivePolicy(0.05, seed=0)
    for _ in range(20):
        assert not pol.decide("k", 0.99)
        pol.observe("k", 0.99, True)          # only right answers: no fit, keeps exploring
    assert pol.fit("k") is None and pol.exploit_probability("k", 0.99) == 0.0
    pol.observe("k", 0.5, False)
    assert pol.fit("k") is not None and pol.exploit_probability("k", 0.99) > 2 * pol.delta


def stream(rng, n):
    for _ in range(n):
        s = rng.uniform(0.75, 1.0)
        yield s, s + rng.gauss(0, 0.02) > 0.9   # right above about 0.9, with noise


@pytest.mark.parametrize("delta", [0.01, 0.05])
def test_the_wrong_answer_rate_stays_under_delta(delta):
    rng = random.Random(7)
    pol = semantic.AdaptivePolicy(delta, seed=1)
    hits = wrong = 0
    n = 4000
    for s, right in stream(rng, n):
        if pol.decide("all", s):
            hits += 1
            wrong += not right
        else:
            pol.observe("all", s, right)
    assert wrong / n <= delta            # the bound vCache guarantees, on the error rate per request
    assert hits > 0.1 * n                # and it does serve


def test_a_larger_delta_serves_more():
    served = []
    for delta in (0.01, 0.05):
        rng = random.Random(7)
        pol = semantic.AdaptivePolicy(delta, seed=1)
        hits = 0
        for s, right in stream(rng, 3000):
            if pol.decide("all", s):
                hits += 1
            else:
                pol.observe("all", s, right)
        served.append(hits)
    assert served[0] < served[1]


@pytest.fixture(scope="module")
def embedder():
    model, _ = semantic.load_model(None, threads=1)
    return semantic.Embedder(model)


def test_sweep_policies_static_rows_equal_the_sweep(embedder):
    pairs = semantic.read_pairs(str(FIXTURES / "semantic" / "gptcache_pairs.tsv"), need_label=True)
    scored = semantic.score_pairs(pairs, embedder, 0.0, "minilm")
    cos, labels = [p.cosine for p in scored.pairs], [int(p.label or 0) for p in scored.pairs]
    rows = semantic.sweep_policies(cos, labels, [0.9], deltas=(0.05,), seed=0)
    static, learned = rows
    assert static.hits == sum(c >= 0.9 for c in cos) and static.wrong_hits == sum(
        c >= 0.9 and y == 0 for c, y in zip(cos, labels))
    assert static.hit_rate_low <= static.hit_rate <= static.hit_rate_high
    assert learned.policy == "adaptive" and learned.delta == 0.05 and learned.requests == len(pairs)
    assert learned.wrong_hit_rate <= 0.05 + 1e-9 or learned.wrong_hit_low <= 0.05


def log_lines(rows):
    return "\n".join(json.dumps(r) for r in rows) + "\n"


def test_replay_side_by_side_and_the_adaptive_needs_responses(embedder, write):
    log = write("a.jsonl", (FIXTURES / "semantic" / "gptcache_mock.jsonl").read_text())
    r = semantic.replay(semantic.iter_log_prompts(str(log)), embedder, 0.9, "minilm", policy="adaptive",
                        deltas=(0.01, 0.05), thresholds=[0.8, 0.9])
    kinds = [(row.policy, row.threshold, row.delta) for row in r.policies]
    assert kinds == [("static", 0.8, None), ("static", 0.9, None), ("adaptive", None, 0.01), ("adaptive", None, 0.05)]
    assert r.policy == "adaptive" and (r.hits, r.wrong_hits) == (r.policies[2].hits, r.policies[2].wrong_hits)
    static = semantic.replay(semantic.iter_log_prompts(str(log)), embedder, 0.9, "minilm")
    assert (r.policies[1].hits, r.policies[1].wrong_hits) == (static.hits, static.wrong_hits)
    bare = write("b.jsonl", log_lines([{"prompt": "a"}, {"prompt": "b"}]))
    with pytest.raises(InputError, match="learns from the responses"):
        semantic.replay(semantic.iter_log_prompts(str(bare)), embedder, 0.9, "minilm", policy="adaptive")


CONTEXT_LOG = [
    {"messages": [{"role": "system", "content": "You answer for ACME Cloud."},
                  {"role": "user", "content": "What is the refund policy?"}], "response": "ACME: 30 days."},
    {"messages": [{"role": "system", "content": "You answer for Globex Bank."},
                  {"role": "user", "content": "What is the refund policy?"}], "response": "Globex: none."},
    {"messages": [{"role": "system", "content": "You answer for ACME Cloud."},
                  {"role": "user", "content": "What's the refund policy?"}], "response": "ACME: 30 days."},
    {"prompt": "How do I reset my password?", "user": "u1", "response": "Settings."},
    {"prompt": "How do I reset my password?", "user": "u2", "response": "Settings."},
]


def test_hits_across_system_prompts_and_users_are_found_and_keying_stops_them(embedder, write):
    log = write("ctx.jsonl", log_lines(CONTEXT_LOG))
    r = semantic.replay(semantic.iter_log_prompts(str(log)), embedder, 0.9, "minilm")
    crossed = {c["field"]: c["hits"] for c in r.cross_context}
    assert crossed == {"system": 1, "user": 1}
    assert r.cross_context_examples[0]["line"] == 2 and r.wrong_hits == 1
    keyed = semantic.replay(semantic.iter_log_prompts(str(log)), embedder, 0.9, "minilm",
                            key_fields=["system", "user"])
    assert keyed.cross_context == () and keyed.wrong_hits == 0 and keyed.hits == r.hits - 2
    assert keyed.key_fields == ("system", "user")


def test_cli_replay_adaptive_json_and_key_fields(cli, write):
    log = write("ctx.jsonl", log_lines(CONTEXT_LOG))
    r = cli("semantic-probe", "replay", log, "--threads", "1", "-f", "json")
    assert r.exit_code == 1, r.stderr   # a hit crossed a system prompt
    d = json.loads(r.stdout)
    assert [c["field"] for c in d["cross_context"]] == ["system", "user"]
    r = cli("semantic-probe", "replay", log, "--threads", "1", "--key-fields", "system,user", "-f", "json")
    assert r.exit_code == 0, r.stdout
    r = cli("semantic-probe", "replay", FIXTURES / "semantic" / "gptcache_mock.jsonl", "--threads", "1",
            "--policy", "adaptive", "--delta", "0.05", "-f", "json")
    d = json.loads(r.stdout)
    assert d["policy"] == "adaptive" and {"static", "adaptive"} == {p["policy"] for p in d["policies"]}
    assert {"hit_rate_low", "hit_rate_high", "wrong_hit_rate", "wrong_hit_low", "wrong_hit_high"} <= set(d["policies"][0])


@pytest.mark.parametrize("args, message", [
    (["--policy", "adaptive", "--delta", "2"], "--delta values must be between 0 and 1"),
    (["--key-fields", "colour"], "unknown key field 'colour'"),
    (["--like", "gptcache", "--threshold", "1.5"], "similarity_threshold is between 0 and 1"),
])
def test_cli_replay_bad_options_are_one_line(cli, args, message):
    r = cli("semantic-probe", "replay", FIXTURES / "semantic" / "log.jsonl", *args)
    assert r.exit_code == 2 and message in r.stderr and r.stderr.count("\n") == 1


def test_cli_sweep_adaptive_table(cli):
    r = cli("semantic-probe", "sweep", FIXTURES / "semantic" / "labeled.tsv", "--threads", "1", "--policy", "adaptive",
            "--thresholds", "0.9", "--delta", "0.05")
    assert r.exit_code == 0, r.stderr
    assert "adaptive δ=0.05" in r.stdout and "static 0.9" in r.stdout
