"""One sweep measures several versions of a log (cachectl/engines/repair/measure.py, ``measure_versions``): each
version's figures are the ones it gets measured alone, the engines fed from the sweep's threads raise their errors
in the caller (no sweep left waiting), and a line a version did not change is read, parsed and tokenized once."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cachectl.engines.prefix.pools import CapacityError
from cachectl.engines.provider.prices import PriceTable
from cachectl.engines.repair import fix, groups, measure
from cachectl.engines.repair import rows as sweep_rows
from cachectl.inputs import iter_jsonl

from .conftest import PROMPTS, TOK_DIR

LOG = PROMPTS / "fix_log.jsonl"


@pytest.fixture(scope="module")
def table():
    return PriceTable.load()


def _setup(tok, table, **kw):
    lines = groups.log_lines(iter_jsonl(str(LOG)), source=str(LOG), key="session")
    options = fix.FixOptions(key="session", unsafe=True, **kw)
    lines, grouping, counter, measured = fix.started(lines, options, tokenizer=tok, table=table, source=str(LOG))
    rw = fix.rewritten(lines, grouping, None, options, tokenizer=tok, table=table, counter=counter)
    return lines, grouping, measured, rw


def test_each_version_of_one_sweep_is_measured_as_alone(tok, table):
    lines, _, measured, rw = _setup(tok, table)
    assert len(rw.steps) >= 2  # the fixture has several codes to apply: several versions
    versions = [None, *(v for _, _, v in rw.steps)]
    together = measured(lines, versions, causes=[True] * len(versions))
    alone = [measured(lines, [v], causes=[True])[0] for v in versions]
    assert together == alone
    before, *_, after = (m for m, _ in together)
    assert after.vllm.hit_rate > before.vllm.hit_rate  # (the versions differ: the fixes gained)
    assert after.provider.cost_usd < before.provider.cost_usd


def test_an_engine_error_in_the_sweep_is_raised_not_waited_for(tok, table):
    lines, grouping, _, rw = _setup(tok, table)
    with pytest.raises(CapacityError):
        measure.measure_versions(lines, [None, rw.values], grouping, tokenizer=tok, table=table, capacity_blocks=2,
                                 source=str(LOG))


def test_only_the_versions_whose_causes_are_counted_keep_their_offsets(tok, table):
    """A sweep keeps the token offsets (to locate a diverging pair's cause) of the prompts of the versions whose causes
    it counts; the other versions' prompts keep their IDs and text, their offsets made again if asked for. The
    measures are those of each version measured alone."""
    from cachectl.tokenization import KeptOffsets, load_tokenizer

    lines, _, measured, rw = _setup(tok, table)
    versions = [None, *(v for _, _, v in rw.steps)]
    mixed = [True] + [False] * (len(versions) - 2) + [True]
    together = measured(lines, versions, causes=mixed)
    assert together == [measured(lines, [v], causes=[c])[0] for v, c in zip(versions, mixed)]
    assert together[0][0].causes and not together[1][0].causes
    # (a tokenizer of its own: the located column's prompts keep their offsets, the others do not)
    fresh = load_tokenizer(str(TOK_DIR))
    batch = [sweep_rows.line_versions(lines, [None, rw.values], i, None) for i in range(len(lines))]
    rows = sweep_rows.rows_later(batch, fresh, True, located=[0])()
    apart = [(a, b) for a, b in rows if a is not b]
    assert apart  # (the fixes changed lines: their two versions are two prompts)
    for a, b in apart:
        assert isinstance(a.encoding, KeptOffsets) and b.encoding is None
        want = fresh.backend.encode(b.text, add_special_tokens=b.add_special_tokens).offsets
        assert list(b.offsets()) == want and b.char_range(len(b.ids) - 1) == want[-1]


def test_a_line_no_version_changed_is_parsed_and_tokenized_once(tok, table, monkeypatch):
    lines, grouping, measured, rw = _setup(tok, table)
    reparsed, prompts = [], []
    real_reparse, real_tokenize = sweep_rows.reparse_at, tok.tokenize_many

    def counting_reparse(ls, i, value):
        reparsed.append(i)
        return real_reparse(ls, i, value)

    def counting_tokenize(batch, **kw):
        prompts.extend(batch)
        return real_tokenize(batch, **kw)

    monkeypatch.setattr(sweep_rows, "reparse_at", counting_reparse)
    monkeypatch.setattr(tok, "tokenize_many", counting_tokenize)
    versions = [None, None, rw.values, rw.values]  # two copies of each version: nothing is done twice
    got = measured(lines, versions, causes=[True, False, True, False])
    changed = [i for i in range(len(lines)) if rw.values.changed(i)]
    assert 0 < len(changed) < len(lines)
    assert sorted(reparsed) == changed  # each rewritten line parsed again once, the others not at all
    assert len(prompts) <= len(lines) + len(changed)
    assert got[0][0] == replace(got[1][0], causes=got[0][0].causes) and got[2][0].vllm == got[3][0].vllm
    assert got[1][0].causes == {} and got[3][0].causes == {}  # (causes asked of the first of each pair only)


def test_a_version_the_same_as_another_is_measured_once(tok, table, monkeypatch):
    """Two rewrites that leave every line alike (two runs of the same codes here; in ``report``, the safe fixes
    and the full run after its safe codes) are one version to the sweep: simulated once, each given the measure it
    gets alone (its causes only where it asks for them)."""
    lines, grouping, measured, rw = _setup(tok, table)
    again = fix.rewritten(lines, grouping, None, fix.FixOptions(key="session", unsafe=True), tokenizer=tok,
                          table=table)
    simulated = []
    real = measure._provider_run

    def counting(*args):
        simulated.append(args)
        return real(*args)

    monkeypatch.setattr(measure, "_provider_run", counting)
    got = measured(lines, [None, rw.values, again.values], causes=[True, False, True])
    assert len(simulated) == 2  # the lines as they are, and the one rewrite
    monkeypatch.setattr(measure, "_provider_run", real)
    alone = measured(lines, [again.values], causes=[True])[0]
    assert got[2] == alone and got[1] == (replace(alone[0], causes={}), alone[1])
    assert got[0][0] != got[2][0]  # (the rewrite changed the log)


def test_grouping_by_key_and_recording_a_fix_parse_no_line(tok, table, monkeypatch):
    """Past the lines a store keeps parsed, each read of a line parses it again: grouping by --key reads only the
    keys the store keeps, and a fix code records a rewrite by the line's number."""
    from cachectl.engines.repair import store

    monkeypatch.setattr(store, "CACHE", 2)
    lines = groups.log_lines(iter_jsonl(str(LOG)), source=str(LOG), key="session")
    built = []
    build = lines._build_line
    lines._build_line = lambda *a: built.append(a[1]) or build(*a)
    g = groups.group_sessions(lines, key="session")
    assert built == [] and g.count == len({lines.meta(i)[1] for i in range(len(lines))}) > 1
    rw = fix.rewritten(lines, g, None, fix.FixOptions(key="session", select=("FX002",)), tokenizer=tok)
    assert rw.fixes and built == []  # FX002 rewrote lines without parsing one
    assert {f.line for f in rw.fixes} <= {lines.line_number(i) for i in range(len(lines))}


@pytest.mark.parametrize(("merge", "k"), [(8, 4), (None, 4), (None, 70)])
def test_the_shared_no_eviction_replay_counts_what_simulate_counts_per_version(merge, k, monkeypatch):
    """InfiniteVersions replays several versions at once (one map, a mask a block): each version's totals are
    simulate's (policy infinite) over that version's requests alone, whichever requests the versions share; with
    the map's entries merged into its arrays every few requests (``merge``), and as they first go in; past 63
    versions (``k``) the masks outgrow 64 bits and the map is a dict."""
    import random

    from cachectl.engines.prefix.replay import InfiniteVersions, simulate
    from cachectl.engines.prefix.trace import TraceRequest
    from cachectl.spool import KeyIndex

    if merge is not None:
        monkeypatch.setattr(KeyIndex, "MERGE", merge)
    rng = random.Random(7)
    heads = [[rng.randrange(50) for _ in range(rng.randrange(1, 80))] for _ in range(6)]
    for bs in (1, 4, 16):
        both = InfiniteVersions(k, bs)
        alone: list[list[TraceRequest]] = [[] for _ in range(k)]
        for i in range(300):
            base = rng.choice(heads) + [rng.randrange(50) for _ in range(rng.choice((0, 1, bs - 1, bs, 3 * bs)))]
            sent = []
            for _ in range(k):  # most versions send the request as it is, some another one (a fix rewrote it)
                sent.append(base if rng.random() < 0.6 else rng.choice(heads) + base[:rng.randrange(len(base) + 1)])
            groups: dict[int, int] = {}
            for j, ids in enumerate(sent):
                groups[id(ids)] = groups.get(id(ids), 0) | 1 << j
                alone[j].append(TraceRequest(index=i, line=i + 1, prompt_tokens=len(ids), tokens=ids))
            for key, mask in groups.items():
                both.add(next(ids for ids in sent if id(ids) == key), mask)
        for j in range(k):
            r = simulate(alone[j], policy="infinite", block_size=bs)
            assert both.totals(j) == (r.requests, r.query_tokens, r.hit_tokens), (bs, j)
            assert r.hit_tokens > 0


def test_the_sweep_replays_a_version_as_simulate_does(tok, table):
    """The before version's vLLM figures from the sweep equal simulate over the log's rendered requests."""
    from cachectl.engines.prefix.replay import simulate
    from cachectl.engines.prefix.trace import TraceRequest

    lines, _, measured, _ = _setup(tok, table)
    (before, _), = measured(lines, [None], causes=[False])
    toks = tok.tokenize_many([ln.prompt for ln in lines], add_generation_prompt=True)
    r = simulate([TraceRequest(index=i, line=ln.line, prompt_tokens=len(t.ids), tokens=t.ids)
                  for i, (ln, t) in enumerate(zip(lines, toks))], policy="infinite", block_size=16)
    assert (before.vllm.requests, before.vllm.query_tokens, before.vllm.hit_tokens, before.vllm.hit_rate) == \
        (r.requests, r.query_tokens, r.hit_tokens, r.hit_rate)
    assert before.vllm.policy == "infinite" and before.vllm_no_eviction is None


def test_one_token_counter_serves_the_sweeps_threads(tok):
    """The provider simulations of a sweep share one TextTokens: its memo, evicting as it goes, was changed by
    several threads at once (KeyError: 'dictionary is empty' from two evictions of one last entry)."""
    import sys
    import threading

    from cachectl.engines.provider.cache import TextTokens

    counter = TextTokens(tok, memo_bytes=8 * 400)  # room for a few texts: every call evicts
    texts = [f"text {i} " * 3 for i in range(40)]
    want = {t: list(tok.backend.encode(t, add_special_tokens=False).ids) for t in texts}
    errors: list[str] = []

    def work(step: int) -> None:
        try:
            for r in range(3000):
                t = texts[(r * step) % len(texts)]
                assert list(counter.ids(t)) == want[t]
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(repr(exc))

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch as often as they can
    try:
        threads = [threading.Thread(target=work, args=(s,)) for s in (1, 3, 7, 11)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        sys.setswitchinterval(old)
    assert errors == []


@pytest.mark.parametrize("name", ["fix_log", "agent_log", "shuffled_tools_log", "shared_prefix_log", "three_apps_log",
                                  "demo_log", "openai_requests"])
def test_a_rewrite_taken_up_where_another_parts_from_it_is_the_rewrite_made_whole(tok, table, name):
    """report's safe rewrite after its full one, fix's full preview after its own: taken up after the codes that did
    the same in both (rewrite's ``then`` and ``start``), the fixes, notes and values are those of the rewrite made
    from the first code."""
    from cachectl.engines.repair.shared_prefix import log_forks

    log = PROMPTS / f"{name}.jsonl"
    lines = groups.log_lines(iter_jsonl(str(log)), source=str(log))
    base = fix.FixOptions()
    lines, grouping, counter, _ = fix.started(lines, base, tokenizer=tok, table=table, source=str(log))
    forks, _ = log_forks(lines, tokenizer=tok, source=str(log))
    full, safe = replace(base, unsafe=True), replace(base, per_cause=False, list_unsafe=False)
    preview = replace(base, unsafe=True, per_cause=False)
    taken = 0
    for first, then in ((full, safe), (base, preview))[::-1]:
        kw = dict(tokenizer=tok, table=table, counter=counter)
        a = fix.rewritten(lines, grouping, forks, first, then=then, **kw)
        whole = fix.rewritten(lines, grouping, forks, then, **kw)
        again = fix.rewritten(lines, grouping, forks, then, start=a.start, **kw)
        assert again.fixes == whole.fixes and again.notes == whole.notes
        assert (again.applied, again.unsafe_skipped) == (whole.applied, whole.unsafe_skipped)
        assert [again.values[i] for i in range(len(lines))] == [whole.values[i] for i in range(len(lines))]
        assert [again.values.signature(i) for i in range(len(lines))] == \
            [whole.values.signature(i) for i in range(len(lines))]
        alone = fix.rewritten(lines, grouping, forks, first, **kw)  # (the first rewrite is as without ``then``)
        assert (a.fixes, a.notes, [a.values[i] for i in range(len(lines))], [c for c, _, _ in a.steps]) == \
            (alone.fixes, alone.notes, [alone.values[i] for i in range(len(lines))], [c for c, _, _ in alone.steps])
        taken += a.start is not None
    # (agent_log's FX002 rewrites are the two runs' alike, up to its FX003: taken up after them; fix_log's full run
    # starts with an unsafe FX004 fix: taken up nowhere)
    assert taken == {"fix_log": 0}.get(name, 2)
    if name == "agent_log":
        assert {f.code for f in a.start.fixes} == {"FX002"}


class _Plain:
    """The session's tokenizer without ``tokenize_later``: a run that cannot encode beside (one batch at a time)."""

    def __init__(self, tok):
        self._tok = tok

    def __getattr__(self, name):
        if name == "tokenize_later":
            raise AttributeError(name)
        return getattr(self._tok, name)


def test_one_process_encodes_beside_and_measures_and_packs_the_same(tok, table, tmp_path, monkeypatch):
    """In one process, the first read and the sweep hand each batch's encoding to a thread and render the next batch
    meanwhile (the tokenizer encoding on that one thread on a machine of two cores): on a log of several batches the
    report is the one a run that encodes each batch in turn gives, the thread is used, and the tokenizer's setting is
    as it was after the run."""
    import os

    from cachectl.tokenization import TokenizerHandle

    rows = LOG.read_text(encoding="utf-8").splitlines(keepends=True)
    log = tmp_path / "long.jsonl"
    log.write_text("".join(rows * (3 * measure.BATCH // len(rows) + 1)), encoding="utf-8")  # (four batches)
    beside: list[int] = []
    monkeypatch.setattr(TokenizerHandle, "tokenize_later",
                        lambda self, prompts, _later=TokenizerHandle.tokenize_later, **k:
                        beside.append(k.get("encoder") is not None) or _later(self, prompts, **k))
    before = os.environ.get("TOKENIZERS_PARALLELISM")

    def run(t):
        options = fix.FixOptions(key="session", unsafe=True)
        first = fix.FirstRead(options, tokenizer=t, source=str(log))
        lines = groups.log_lines(iter_jsonl(str(log)), source=str(log), key="session", each=first.add)
        assert len(lines) > 3 * measure.BATCH
        return fix.fix_log(lines, options, tokenizer=t, table=table, source=str(log), first_read=first).to_dict()

    together = run(tok)
    assert sum(beside) >= 6 and os.environ.get("TOKENIZERS_PARALLELISM") == before
    beside.clear()
    plain = run(_Plain(tok))
    assert {k for k in together if together[k] != plain[k]} == set() and not any(beside)
    assert plain == together
    assert together["applied"] and together["per_cause"]


@pytest.mark.parametrize("given", [False, True])
def test_the_log_as_it_is_takes_its_tokens_from_the_fork_analysis_packing(tok, table, given):
    """With the fork analysis' packed requests (``packed``: the log as its first read rendered and tokenized it), the
    lines as they are take their token IDs from there, not rendered and tokenized again (nor parsed, where no
    version that has the line simulates its provider cache: ``given``, the log's own provider measure passed in);
    every measure, cause and pair is the one the sweep makes without them."""
    from cachectl.engines.repair.shared_prefix import log_forks

    lines, grouping, measured, rw = _setup(tok, table)
    versions = [None, *(v for _, _, v in rw.steps)]
    forks, notes = log_forks(lines, tokenizer=tok, source=str(LOG))
    assert forks is not None and not notes
    store = forks.requests
    read: list[int] = []
    ids = store.ids
    store.ids = lambda k: read.append(k) or ids(k)  # type: ignore[method-assign]

    def run(packed):
        seen: list[tuple] = []

        def pairs(i, ln, prev, t, common, cause):
            seen.append((i, ln.line, ln.key, None if prev is None else list(prev.ids), list(t.ids), common, cause))
        provider = measured(lines, [None], causes=[False])[0][0].provider if given else None
        got = measured(lines, versions, causes=[True] * len(versions), pairs=pairs, packed=packed,
                       providers=[provider] + [None] * (len(versions) - 1))
        return got, seen

    plain, plain_pairs = run(None)
    assert not read
    taken, taken_pairs = run(store)
    assert sorted(set(read)) == list(range(len(lines)))  # (every line as it is: its IDs read back)
    assert taken == plain and taken_pairs == plain_pairs
    assert any(c is not None and c != "unexplained" for *_, c in taken_pairs)  # (a diverging pair's cause located)
