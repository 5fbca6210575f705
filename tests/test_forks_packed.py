"""The fork analysis keeps every request packed (cachectl.engines.prefix.packed, RequestStore): each packed part
round-trips exactly, a rebuilt request is the request, and the analysis and the moved spans are the same whether
the requests come packed, as a list, or through LogForks' bounded memo."""

from __future__ import annotations

import heapq
import random
from array import array
from dataclasses import replace

import pytest

from cachectl.engines.prefix import analyze_forks, fork_requests
from cachectl.engines.prefix.forks import ForkRequest, RequestStore, pack_requests
from cachectl.engines.prefix.forks.views import _View
from cachectl.engines.prefix.packed import ObjectCodec, RenderCodec
from cachectl.engines.repair import groups
from cachectl.engines.repair.shared_prefix import LogForks, log_forks
from cachectl.inputs import iter_jsonl

from .test_forks import APPS, SHARED, TOOLS

LOG_AGENT = SHARED.parent / "agent_log.jsonl"


@pytest.fixture(scope="module")
def tok():
    from cachectl.tokenization import load_tokenizer

    from .conftest import TOK_DIR

    return load_tokenizer(str(TOK_DIR))


def test_render_codec_round_trips_every_part():
    rng = random.Random(3)
    codec = RenderCodec()
    for k in range(40):
        n = rng.randrange(0, 300)
        code = "Q" if k % 5 == 0 else "I"
        ids = array(code, (rng.randrange(2**40 if code == "Q" else 2**32) for _ in range(n)))
        starts = array("I", (rng.randrange(10**6) for _ in range(n)))   # not monotonic: special tokens at 0
        ends = array("I", (s + rng.randrange(9) for s in starts))
        text = "".join(rng.choice("ab\n é\U0001f600\ud800") for _ in range(rng.randrange(200)))
        for parts in ((starts, ends, text), (starts, None, text), (None, None, None), (starts, None, None)):
            blob = codec.pack(ids, *parts)
            got = codec.unpack(blob)
            assert got[0] == ids and got[0].typecode == code
            assert got[1:] == parts
            assert codec.ids(blob) == ids


@pytest.mark.parametrize("starts", [[0, 3, 7, 7, 12], [0, 40_000, 5, 90_000], [0, 3_000_000_000, 2, 4_294_967_294]])
def test_render_codec_packs_each_width_of_differences(starts):
    """Starts' and ends' differences are packed in 2, 4 or 8 bytes, the narrowest that holds them all (a token's
    few characters, a jump past 32,767, one past 2**31), and come back the same."""
    from cachectl.engines.prefix import packed

    codec = RenderCodec()
    ids = array("I", range(len(starts)))
    st = array("I", starts)
    ends = array("I", (s + 1 for s in starts))
    blob = codec.pack(ids, st, ends, "x" * 10)
    assert codec.unpack(blob) == (ids, st, ends, "x" * 10) and codec.ids(blob) == ids
    steps, code = packed._deltas(st)
    assert code == {3: 1, 40_000: 2, 3_000_000_000: 0}[starts[1]] and len(steps) == packed._width(code) * len(starts)
    assert packed._deltas(ends, st)[1] == 1
    with pytest.raises(OverflowError):
        codec.pack(ids, array("q", [0, 1, 2, 2**32]))


def test_object_codec_round_trips():
    codec = ObjectCodec()
    values = [{"a": [1, 2.5, None]}, ("x" * 1000, {"k": "é"}), (), {"a": [1, 2.5, None]}]
    assert [codec.loads(codec.dumps(v)) for v in values] == values


def _same(a: ForkRequest, b: ForkRequest) -> None:
    assert (a.index, a.line, list(a.ids), a.text, a.fields, a.salt) == (b.index, b.line, list(b.ids), b.text,
                                                                       b.fields, b.salt)
    assert (list(a.starts) if a.starts is not None else None) == (list(b.starts) if b.starts is not None else None)
    assert (a.tokenized is None) == (b.tokenized is None)
    if a.tokenized is not None and b.tokenized is not None:
        ta, tb = a.tokenized, b.tokenized
        assert ta.prompt == tb.prompt and ta.text == tb.text and list(ta.ids) == list(tb.ids)
        assert ta.render_opts == tb.render_opts and ta.add_special_tokens == tb.add_special_tokens
        assert ta.spans == tb.spans
        assert [ta.location(i) for i in range(0, len(ta.ids), 7)] == [tb.location(i) for i in range(0, len(tb.ids), 7)]
    assert a.request == b.request


@pytest.mark.parametrize("path", [SHARED, TOOLS, APPS])
@pytest.mark.parametrize("with_tok", [True, False])
def test_a_packed_request_is_the_request(tok, path, with_tok):
    t = tok if with_tok else None
    reqs = list(fork_requests(iter_jsonl(str(path)), source=str(path), tokenizer=t))
    store = pack_requests(reqs)
    assert len(store) == len(reqs) and store.tokens == sum(len(r.ids) for r in reqs)
    for k in (0, 1, len(reqs) // 2, len(reqs) - 1):
        fresh = RequestStore(recent=1)   # nothing recent: rebuilt from the packed bytes
        for r in reqs[:k + 1]:
            fresh.add(r)
        _same(fresh[k], reqs[k])
        assert fresh.ids(k) == reqs[k].ids


def test_token_id_requests_and_unknown_parts_are_kept(tok):
    reqs = [ForkRequest(index=k, line=k + 1, ids=[1, 2, 3, k]) for k in range(3)]
    first = next(iter(fork_requests(iter_jsonl(str(SHARED)), source=str(SHARED), tokenizer=tok)))
    assert first.tokenized is not None
    full = tok.tokenize_many([first.tokenized.prompt], add_generation_prompt=True)[0]
    # a Tokenized still holding its tokenizers.Encoding is kept as it is
    odd = ForkRequest(index=3, line=4, ids=array("I", full.ids), text=full.text,
                      starts=array("I", (s for s, _ in full.encoding.offsets)), tokenized=full)
    store = pack_requests([*reqs, odd])
    assert [list(store[k].ids) for k in range(3)] == [[1, 2, 3, k] for k in range(3)]
    assert store[3] is odd and store.bare == 3


def test_the_store_columns_keep_each_requests_own_fields(tok, monkeypatch):
    """A request is a row of the store's columns: no line, user fields equal but of other types (1, 1.0, True: one
    tuple shared only between requests of the same), a salt; a chat request's spans, found through one rebuilt
    request, are read back through the next, not found again."""
    from cachectl.engines.prefix.forks import store as fr

    chat = next(iter(fork_requests(iter_jsonl(str(SHARED)), source=str(SHARED), tokenizer=tok)))
    reqs = [replace(chat, index=k, line=None if k == 1 else k + 1, fields=(("user", v),), salt=("t", k) if k else None)
            for k, v in enumerate([1, 1.0, True, 1, "1"])]
    store = RequestStore(recent=1)
    for r in reqs:
        store.add(r)
    for k, r in enumerate(reqs):
        got = store[k]
        assert (got.index, got.line, got.salt, store.line(k), store.salt(k)) == (k, r.line, r.salt, r.line, r.salt)
        assert [(n, type(v), v) for n, v in got.fields] == [(n, type(v), v) for n, v in r.fields]
    assert store.fields(0) is store.fields(3) and store.fields(0) is not store.fields(2)
    found = []
    real = fr._lazy_chat_spans
    monkeypatch.setattr(fr, "_lazy_chat_spans", lambda *a: found.append(1) or real(*a))
    first = store[2].tokenized
    store[0]  # (the store keeps one rebuilt request: request 2 is rebuilt again)
    again = store[2].tokenized
    assert first is not None and again is not None and again is not first
    assert callable(first._spans) and callable(again._spans) and store.spans_at(2) < 0  # (neither found yet)
    spans = first.spans
    assert store.spans_at(2) >= 0 and spans == chat.tokenized.spans and len(found) == 1
    assert again.spans == spans and len(found) == 1  # read back, though rebuilt before they were found


def test_a_rebuilt_request_reads_its_prompt_only_when_asked(tok, monkeypatch):
    """A view of a stored chat request reads its render and its spans: its prompt (pickled beside them) is read
    when something asks for it (spans not found yet, a cause, a re-render), once a rebuilt request, and it is the
    prompt. The fork analysis over the store reads far fewer prompts than it rebuilds requests."""
    reqs = list(fork_requests(iter_jsonl(str(SHARED)), source=str(SHARED), tokenizer=tok))
    read = []
    real = RequestStore._prompt
    monkeypatch.setattr(RequestStore, "_prompt", lambda self, at: read.append(at) or real(self, at))
    fresh = RequestStore(recent=1)
    for r in reqs:
        fresh.add(r)
    got = fresh[3]
    assert got.tokenized is not None and list(got.ids) == list(reqs[3].ids) and got.text == reqs[3].text
    assert read == []
    spans = got.tokenized.spans   # (found here: the instrumented render reads the prompt)
    assert spans == reqs[3].tokenized.spans and len(read) == 1
    fresh[0]
    again = fresh[3]   # (rebuilt: the spans are read back, the prompt is not)
    assert again.tokenized is not got.tokenized and again.tokenized.spans == spans and len(read) == 1
    assert again.tokenized.prompt == reqs[3].tokenized.prompt and len(read) == 2
    assert again.tokenized.prompt is again.tokenized.prompt and len(read) == 2
    _same(again, reqs[3])
    read.clear()
    rebuilt = []
    unpack = RequestStore._unpack
    monkeypatch.setattr(RequestStore, "_unpack", lambda self, rec: rebuilt.append(1) or unpack(self, rec))
    store = RequestStore(recent=1)   # (every view rebuilds its request)
    for r in reqs:
        store.add(r)
    a = analyze_forks(store, tokenizer=tok, capacity_blocks=400)
    assert a.to_dict() == analyze_forks(reqs, tokenizer=tok, capacity_blocks=400).to_dict()
    assert len(rebuilt) > 3 * len(reqs) and len(read) < len(rebuilt) / 2, (len(read), len(rebuilt))


def test_a_request_that_lists_the_tools_as_given_is_told_by_its_tools_digest(tok, monkeypatch):
    """Under a tools counterfactual, a request that already lists the reference's tools, serialized alike, is its
    own render: the store tells it by a digest of its tools taken as it was packed (its prompt is not read for it),
    which says what comparing the prompt's tools does, request by request and counterfactual by counterfactual."""
    from cachectl.engines.prefix.forks import views

    reqs = list(fork_requests(iter_jsonl(str(TOOLS)), source=str(TOOLS), tokenizer=tok))
    checked = []
    real = views._as_given
    monkeypatch.setattr(views, "_as_given", lambda r, ref: checked.append(r.index) or real(r, ref))
    store = pack_requests(reqs)
    a = analyze_forks(store, tokenizer=tok, capacity_blocks=400)
    assert any(f.fixable in ("FX002", "FX003") for f in a.forks)
    assert not checked
    counterfactuals = [t for t in a._plan if isinstance(t, views._Tools)]
    verdicts = [(store.tools_exact(k) == t.exact, real(r, t.reference)) for t in counterfactuals
                for k, r in enumerate(reqs) if store.tool_set(k) == t.identities]
    assert verdicts and all(x == y for x, y in verdicts) and {y for _, y in verdicts} == {True, False}
    b = analyze_forks(reqs, tokenizer=tok, capacity_blocks=400)
    assert a.to_dict() == b.to_dict() and list(a.request_gains) == list(b.request_gains)


def test_the_analysis_is_the_same_packed_or_listed(tok):
    reqs = list(fork_requests(iter_jsonl(str(SHARED)), source=str(SHARED), tokenizer=tok))
    a = analyze_forks(reqs, tokenizer=tok, capacity_blocks=400)
    b = analyze_forks(pack_requests(reqs), tokenizer=tok, capacity_blocks=400)
    assert a.to_dict() == b.to_dict() and list(a.request_gains) == list(b.request_gains)
    assert [a.spans_to_move(r) for r in reqs] == [b.spans_to_move(r) for r in reqs]


@pytest.mark.parametrize("path", [SHARED, LOG_AGENT, SHARED.parent / "fix_log.jsonl"])
def test_spans_through_the_memo_are_the_spans(tok, path):
    """LogForks' spans (each line's once, and read from the analysis's own re-render under a tools fix where
    the plan has one: the agent and fix logs) are the spans of a fresh re-render."""
    forks, _ = log_forks(groups.log_lines(iter_jsonl(str(path)), source=str(path)), tokenizer=tok)
    assert forks is not None and forks.fixable
    assert (forks.report._rendered is not None) == (path != SHARED)
    reqs = list(fork_requests(iter_jsonl(str(path)), source=str(path), tokenizer=tok))
    want = [forks.report.spans_to_move(r) for r in reqs]
    assert any(want) and len(forks.lines) == len(reqs)
    fresh = LogForks(forks.report, forks.requests, forks.lines)
    codes = sorted({f.fixable for f in forks.fixable})
    for _ in range(2):   # asked again, in another order
        for i in list(range(len(reqs))) + [0, 3, 1, 0]:
            for code in codes:
                assert fresh.spans(i, code) == tuple(s for s in want[i] if s.code == code)
    assert fresh.asked() == {i for i, w in enumerate(want) if w}   # lines with nothing to move keep nothing


def test_a_re_render_kept_packed_is_the_re_render(tok):
    """A tools counterfactual's re-render, packed and rebuilt, is the view it was."""
    reqs = list(fork_requests(iter_jsonl(str(TOOLS)), source=str(TOOLS), tokenizer=tok))
    store = pack_requests(reqs)
    r = store[2]
    assert r.tokenized is not None
    t = tok.tokenize_many([replace(r.tokenized.prompt, tools=tuple(reversed(r.tokenized.prompt.tools)))],
                          add_generation_prompt=True)[0].compact()
    starts = array("I", (s for s, _ in tok.tokenize_many([t.prompt], add_generation_prompt=True)[0].encoding.offsets))
    packed = store.pack_render(array("I", t.ids), t.text, starts, t)
    ids, text, got_starts, got = store.unpack_render(packed, t.prompt)
    assert (list(ids), text, list(got_starts)) == (list(t.ids), t.text, list(starts))
    assert got.spans == t.spans and got.prompt == t.prompt
    assert _View(r, ids, text, got_starts, got).tokenized() is got


def _naive_outline(seqs: list[array], bs: int, max_nodes: int) -> list[tuple]:
    """The outline :meth:`PrefixTree.outline` should give, from a plain trie of the sequences (one node per
    prefix, children in the order they first appeared): an edge runs from a node with two or more children (or the
    root) down to the next such node or to its deepest block, and it also ends where the first request to reach
    that far ended (a later request that goes on adds a branch there); it holds the requests that enter its first
    block."""
    count: dict[tuple, int] = {}
    kids: dict[tuple, list[tuple]] = {}
    stop: set[tuple] = set()  # prefixes where the first request to reach them ended
    for s in seqs:
        for i in range(len(s)):
            p = tuple(s[:i + 1])
            if p not in count:
                count[p] = 0
                kids.setdefault(p[:-1], []).append(p)
                if i == len(s) - 1:
                    stop.add(p)
            count[p] += 1

    def edge(p: tuple) -> tuple:  # (first prefix, last prefix) of the edge that starts at ``p``
        q = p
        while len(kids.get(q, ())) == 1 and q not in stop:
            q = kids[q][0]
        return p, q

    out: list[tuple] = []
    heap: list = []
    seq = 0

    def expand(end: tuple, at: int) -> None:
        nonlocal seq
        edges = [edge(c) for c in kids.get(end, ())]
        alone = [e for e in edges if count[e[0]] < 2]
        if alone:
            out.append((at, len(end) * bs, max(len(e[1]) for e in alone) * bs, len(alone), len(alone)))
        for e in edges:
            if count[e[0]] >= 2:
                heapq.heappush(heap, (-count[e[0]], seq, at, e))
                seq += 1

    expand((), -1)
    while heap and len(out) < max_nodes:
        _, _, at, (first, last) = heapq.heappop(heap)
        out.append((at, (len(first) - 1) * bs, len(last) * bs, count[first], 0))
        expand(last, len(out) - 1)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_tree_outline_agrees_with_a_plain_trie_and_marks_the_forks(seed):
    """The fork analysis keeps only its first tree's outline (the branches a summary shows) and marks the forks in
    it at the end: the outline is the one a plain trie of the same requests gives (spans, request counts, the order
    of equal branches), and each fork named is marked on its own node."""
    from cachectl.engines.prefix.forks.tree import PrefixTree, _summary

    rng = random.Random(seed)
    tree = PrefixTree()
    stems = [array("q", [rng.randrange(1 << 40) for _ in range(rng.randint(1, 6))]) for _ in range(30)]
    seqs = []
    for k in range(3000):  # shared heads of several depths, then a tail of their own (keys that are not chained)
        head = array("q")
        for s in rng.sample(stems, rng.randint(1, 3)):
            head.extend(s)
        seqs.append(head + array("q", [rng.randrange(1 << 40) for _ in range(rng.randint(0, 4))]))
        tree.insert(seqs[-1], k)
    outline = tree.outline(16, max_nodes=60)
    assert [(n.parent, n.start, n.end, n.requests, n.alone) for n, _ in outline] == _naive_outline(seqs, 16, 60)
    forks = tree.forks()
    fork_at = {e.key: i for i, e in enumerate(forks)}
    marked = _summary(outline, fork_at)
    assert any(n.fork is not None for n in marked)
    for n, (_, key) in zip(marked, outline):
        assert n.fork == (fork_at.get(key) if key is not None else None)
        if n.fork is not None:
            assert len(forks[n.fork].children) >= 2 and forks[n.fork].end * 16 == n.end


@pytest.mark.parametrize("path", [LOG_AGENT, SHARED.parent / "fix_log.jsonl", TOOLS, SHARED])
def test_a_later_pass_moves_a_request_on_its_ids_from_the_spans_found_before(tok, path, monkeypatch):
    """Once the analysis has found a line move's span in a request in some state (its own render or a tools
    re-render, the plan's moves before it applied), a later pass under the plan moves the request on its stored IDs
    alone (no render rebuilt, no text read): the same tokens, and the same counterfactuals changing it, as a view
    that finds every span again (the agent log's moves keep some lines where they are; the fix log's plan has a
    tools fix and a move; the shared-prefix log's three moves apply one after another)."""
    from cachectl.engines.prefix.forks import USER_FIELDS
    from cachectl.engines.prefix.forks.cost import _Analyzer
    from cachectl.engines.prefix.forks.views import _LineMove

    store = pack_requests(fork_requests(iter_jsonl(str(path)), source=str(path), tokenizer=tok))
    an = _Analyzer(store, tokenizer=tok, block_size=16, capacity_blocks=400, user_fields=USER_FIELDS, max_forks=32,
                   max_values=10_000)
    plan = list(an.run(8)._plan)
    again = [replace(t, found=None) if isinstance(t, _LineMove) else t for t in plan]   # (every span found again)
    rebuilt = []
    unpack = RequestStore._unpack
    monkeypatch.setattr(RequestStore, "_unpack", lambda self, rec: rebuilt.append(1) or unpack(self, rec))
    quick = 0
    for k in range(len(store)):
        changed: list[int] = []
        got = an._ids(k, plan, changed)
        assert rebuilt == []
        want: list[int] = []
        v = an.view(k, again, want)
        rebuilt.clear()
        if got is not None:
            quick += 1
            assert list(got) == list(v.ids) and changed == want, k
    assert quick >= len(store) * 3 // 4, (quick, len(store))


@pytest.mark.parametrize("path", [LOG_AGENT, SHARED.parent / "fix_log.jsonl", SHARED, APPS])
def test_the_analysis_is_the_same_with_every_span_found_again(tok, path, monkeypatch):
    """The spans a move keeps (and hands to the move made from it, less the requests whose line stays: the agent
    log's moves keep some lines where they are) give the analysis that finding every span again gives."""
    from cachectl.engines.prefix.forks import views

    reqs = list(fork_requests(iter_jsonl(str(path)), source=str(path), tokenizer=tok))
    kept = analyze_forks(pack_requests(reqs), tokenizer=tok, capacity_blocks=400)
    with monkeypatch.context() as m:
        m.setattr(views._Spans, "get", lambda self, k, tools: views._UNSEEN)
        again = analyze_forks(pack_requests(reqs), tokenizer=tok, capacity_blocks=400)
    assert kept.to_dict() == again.to_dict() and list(kept.request_gains) == list(again.request_gains)
    assert [kept.spans_to_move(r) for r in reqs] == [again.spans_to_move(r) for r in reqs]


def _reads_within(monkeypatch, cls, name):
    """The views the analysis makes while ``cls.name`` runs, as (request index, the plan's length): a list the
    analysis fills as it goes."""
    from cachectl.engines.prefix.forks import cost

    inside: list[int] = []
    reads: list[tuple[int, int]] = []
    real, view = getattr(cls, name), cost._Analyzer.view

    def within(self, *args, **kw):
        inside.append(1)
        try:
            return real(self, *args, **kw)
        finally:
            inside.pop()

    monkeypatch.setattr(cls, name, within)
    monkeypatch.setattr(cost._Analyzer, "view", lambda self, k, plan, changed=None:
                        (reads.append((k, len(plan))) if inside else None) or view(self, k, plan, changed))
    return reads


def test_a_tools_fork_reads_no_request_for_its_values(tok, monkeypatch):
    """A fork of the tools' order or serialization counts the orders the store keeps, not each request's line at
    the fork, and the forks below it wait for the next pass: the pass that finds it reads no request for values."""
    from cachectl.engines.prefix.forks import causes

    reqs = list(fork_requests(iter_jsonl(str(TOOLS)), source=str(TOOLS), tokenizer=tok))
    reads = _reads_within(monkeypatch, causes._Causes, "_values")
    a = analyze_forks(pack_requests(reqs), tokenizer=tok, capacity_blocks=400)
    assert [(f.cause, f.fixable) for f in a.forks][0] == ("tool_order", "FX003")
    assert reads and {n for _, n in reads} == {1}   # (the next pass reads them, under the new order)
    monkeypatch.undo()
    assert a.to_dict() == analyze_forks(reqs, tokenizer=tok, capacity_blocks=400).to_dict()


def test_a_request_listing_the_counterfactuals_tools_is_not_rebuilt_for_its_tokens(tok, monkeypatch):
    """Under a tools counterfactual, a request that already lists its tools as the counterfactual does keeps its
    own tokens: a pass that needs only token IDs tells it by the store's tools digest, without rebuilding it."""
    from cachectl.engines.prefix.forks import cost, views

    reqs = list(fork_requests(iter_jsonl(str(TOOLS)), source=str(TOOLS), tokenizer=tok))
    store = pack_requests(reqs)
    reads = _reads_within(monkeypatch, cost._Analyzer, "ids")
    a = analyze_forks(store, tokenizer=tok, capacity_blocks=400)
    tools = [t for t in a._plan if isinstance(t, views._Tools)]
    as_given = {k for k in range(len(reqs)) for t in tools if store.tools_exact(k) == t.exact}
    assert tools and as_given and reads
    assert not as_given & {k for k, _ in reads}, sorted(as_given & {k for k, _ in reads})
    monkeypatch.undo()
    assert a.to_dict() == analyze_forks(reqs, tokenizer=tok, capacity_blocks=400).to_dict()


def test_a_line_that_moves_nothing_is_not_rebuilt_for_its_spans(tok, monkeypatch):
    """LogForks gives the lines each fix moves out of a request; where the analysis found, as it replayed the log,
    that no fork moves anything out of it, the request is not rebuilt to say so."""
    forks, _ = log_forks(groups.log_lines(iter_jsonl(str(LOG_AGENT)), source=str(LOG_AGENT)), tokenizer=tok)
    assert forks is not None
    want = [forks.report.spans_to_move(forks.requests[i], analysed=True) for i in range(len(forks.lines))]
    assert any(want) and not all(want)
    rebuilt = []
    get = RequestStore.__getitem__
    monkeypatch.setattr(RequestStore, "__getitem__", lambda self, k: rebuilt.append(k) or get(self, k))
    fresh = LogForks(forks.report, forks.requests, forks.lines)
    for i in range(len(want)):
        assert fresh.spans(i, "FX001") == tuple(s for s in want[i] if s.code == "FX001")
    assert rebuilt and not {k for k in range(len(want)) if not want[k]} & set(rebuilt)
