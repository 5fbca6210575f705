"""``report --ray`` and ``fix --ray``: the log's chat prompts rendered and tokenized as Ray tasks (Ray's own API on
a local Ray instance), the replays in the driver, and the same result as one process."""

from __future__ import annotations

import importlib.util
import json

import pytest

from .conftest import PROMPTS, TOK_DIR


@pytest.fixture(scope="module")
def local_ray():
    """One local two-CPU Ray for the module's runs (``--ray local`` joins the instance already started)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def _json(r) -> dict:
    assert r.exit_code in (0, 1), r.stderr
    return json.loads(r.stdout)


@pytest.mark.ray
def test_report_on_ray_is_the_report_of_one_process(cli, local_ray):
    log = PROMPTS / "agent_log.jsonl"
    one = _json(cli("report", log, "--key", "session", "-t", TOK_DIR, "--format", "json", "--jobs", "1"))
    on_ray = _json(cli("report", log, "--key", "session", "-t", TOK_DIR, "--format", "json", "--jobs", "1",
                       "--ray", "local"))
    assert on_ray == one and one["requests"] > 10


@pytest.mark.ray
def test_fix_on_ray_writes_the_same_log(cli, local_ray, tmp_path):
    log = PROMPTS / "shared_prefix_log.jsonl"
    args = ["-t", TOK_DIR, "--unsafe-fixes", "--format", "json", "--jobs", "1"]
    one = _json(cli("fix", log, *args, "-o", tmp_path / "one.jsonl"))
    on_ray = _json(cli("fix", log, *args, "-o", tmp_path / "ray.jsonl", "--ray", "local"))
    for d in (one, on_ray):
        d.pop("out", None)
    assert on_ray == one and one["applied"] > 0
    assert (tmp_path / "ray.jsonl").read_bytes() == (tmp_path / "one.jsonl").read_bytes()


@pytest.mark.ray
def test_the_driver_renders_no_prompt_the_cluster_rendered(local_ray, monkeypatch):
    """After the prefill every chat prompt of the log is read from the cluster's renders: tokenizing the log again
    renders and encodes nothing, with or without the generation prompt, and gives what a tokenizer alone gives."""
    from cachectl import tokenization
    from cachectl.engines.repair.groups import log_lines
    from cachectl.engines.repair.prefill import prefill
    from cachectl.inputs import iter_jsonl
    from cachectl.tokenization import load_tokenizer

    log = PROMPTS / "agent_log.jsonl"
    lines = list(log_lines(iter_jsonl(str(log)), source=str(log)))
    tok = load_tokenizer(str(TOK_DIR))
    done = prefill(lines, tok, generation_prompts=(True, False), ray_address="local")
    distinct = {json.dumps([ln.prompt.messages, ln.prompt.tools], sort_keys=False) for ln in lines}
    assert done.rendered == done.prompts == 2 * len(distinct) and done.tasks >= 1
    alone = load_tokenizer(str(TOK_DIR))
    made = []
    monkeypatch.setattr(tokenization, "render_chat_template",
                        lambda *a, _r=tokenization.render_chat_template, **k: made.append(1) or _r(*a, **k))
    real = tok.backend

    class Counted:
        def encode_batch(self, texts, **kw):
            made.extend(texts)
            return real.encode_batch(texts, **kw)

        def __getattr__(self, name):
            return getattr(real, name)

    monkeypatch.setattr(tok, "backend", Counted())
    for gen in (True, False):
        fresh = tok.tokenize_many([ln.prompt for ln in lines], add_generation_prompt=gen)
        assert made == []
        want = alone.tokenize_many([ln.prompt for ln in lines], add_generation_prompt=gen)
        assert [list(t.ids) for t in fresh] == [list(t.ids) for t in want]
        assert [t.text for t in fresh] == [t.text for t in want]
        made.clear()
    assert prefill(lines, tok, generation_prompts=(True,), ray_address="local").prompts == 0  # all kept already


def test_ray_without_the_extra_or_a_tokenizer_is_one_line(cli, tmp_path):
    log = PROMPTS / "agent_log.jsonl"
    r = cli("fix", log, "--ray", "local")
    assert r.exit_code == 2 and "--ray renders and tokenizes the log's prompts: it needs --tokenizer" in r.stderr
    if importlib.util.find_spec("ray") is None:
        r = cli("report", log, "-t", TOK_DIR, "--ray", "local")
        assert r.exit_code == 2 and r.stderr.strip().endswith("--ray needs ray: pip install 'llm-cachectl[ray]'")
        assert r.stderr.count("\n") == 1, r.stderr


@pytest.mark.ray
def test_a_tokenizer_without_a_chat_template_is_the_same_one_line_on_ray(cli, local_ray):
    log = PROMPTS / "agent_log.jsonl"
    one = cli("report", log, "-t", TOK_DIR / "tokenizer.json", "--jobs", "1")
    on_ray = cli("report", log, "-t", TOK_DIR / "tokenizer.json", "--jobs", "1", "--ray", "local")
    assert one.exit_code == on_ray.exit_code == 2 and "has no chat template" in one.stderr
    assert on_ray.stderr == one.stderr
