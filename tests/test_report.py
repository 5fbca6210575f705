"""``cachectl report``: the engine's numbers against the engines it joins, the HTML page's safety (escaped,
self-contained), and the page opened in a real headless Chromium (no console errors, no network, a
screenshot)."""

from __future__ import annotations

import json
import re
from dataclasses import asdict

import pytest

from cachectl.engines.prefix.replay import simulate
from cachectl.engines.prefix.trace import iter_trace
from cachectl.engines.provider import cache as promptcache
from cachectl.engines.provider.prices import PriceTable
from cachectl.engines.repair import report
from cachectl.engines.tokendiff import LogSummary, diff_log
from cachectl.inputs import iter_log, read_requests

from .browser import CHROMEDRIVER, CHROMIUM, visit
from .conftest import PROMPTS, TOK_DIR

LOG = PROMPTS / "agent_log.jsonl"


def _trace_records(path):
    """simulate-prefix's trace records, a bare chat list as ``{"messages": [...]}`` (what report's curve reads)."""
    from cachectl.engines.prefix.trace import trace_records

    for line, value, *rest in trace_records(path):
        yield (line, {"messages": value} if isinstance(value, list) else value, *rest)


def _build(tok, path=LOG, key="session", **kw):
    src = str(path)
    return report.build_report(source=src, log=iter_log(src, key), tokenizer=tok, tokenizer_name="fixtures/tok",
                               requests=read_requests(src), table=PriceTable.load(),
                               trace=iter_trace(_trace_records(src), source=src, tokenizer=tok),
                               text_counter=promptcache.tokenizer_counter(tok), **kw)


@pytest.fixture(scope="module")
def built(tok):
    return _build(tok)


def test_totals_are_diff_tokens_log_totals(built, tok):
    summary = [x for x in diff_log(iter_log(str(LOG), "session"), tok) if isinstance(x, LogSummary)][0]
    assert (built.requests, built.conversations, built.pairs) == (summary.requests, summary.conversations,
                                                                   summary.pairs) == (27, 6, 21)
    assert built.tokens_lost == summary.reusable_tokens - summary.reused_tokens > 0
    # every lost token belongs to one mismatching pair, hence to one cause
    assert sum(c.tokens_lost for c in built.causes) == built.tokens_lost
    assert {c.cause: c.pairs for c in built.causes} == {x["cause"]: x["pairs"] for x in summary.top_causes}
    # the fixture's four ways of breaking a prefix, each found; the clean conversations lose nothing
    assert {c.cause for c in built.causes} == {"date_time", "volatile_id", "tool_schema_key_order", "tool_order"}
    assert [w.key for w in built.worst][0] == "s2-clock"
    assert not {"s1-clean", "s6-clean"} & {w.key for w in built.worst}


def test_dollars_are_lost_tokens_at_input_less_cache_read_prices(built):
    price = PriceTable.load().lookup("gpt-4.1")
    rate = (price.input - price.cache_read) / 1e6
    assert built.price_model == "gpt-4.1"
    for c in built.causes:
        assert c.usd_lost == pytest.approx(c.tokens_lost * rate)
    assert built.usd_lost == pytest.approx(built.tokens_lost * rate)


def test_cost_and_curve_are_the_engines_own(built, tok):
    r = promptcache.simulate_requests(read_requests(str(LOG)), table=PriceTable.load(), source=str(LOG),
                                      text_counter=promptcache.tokenizer_counter(tok))
    assert built.cost is not None
    assert (built.cost.total_usd, built.cost.uncached_usd, built.cost.hit_rate) == (r.total_cost_usd,
                                                                                   r.uncached_cost_usd, r.hit_rate)
    assert sum(m.requests for m in built.cost.misses) == sum(q.miss is not None for q in r.requests)
    ceiling = simulate(iter_trace(_trace_records(str(LOG)), source=str(LOG), tokenizer=tok), policy="infinite")
    assert built.curve is not None and built.curve.ceiling_hit_rate == pytest.approx(ceiling.hit_rate)
    # a vLLM pool at capacity c: the curve's points are replays (checked at the smallest one)
    cap_tokens, rate = built.curve.points[0]
    at = simulate(iter_trace(_trace_records(str(LOG)), source=str(LOG), tokenizer=tok), policy="vllm",
                  capacity_blocks=cap_tokens // 16)
    assert rate == pytest.approx(at.hit_rate)
    rates = [p[1] for p in built.curve.points]
    assert rates[-1] == pytest.approx(built.curve.ceiling_hit_rate) and rates[0] < rates[-1]


def test_worst_pair_shows_the_tokens_around_the_divergence(built):
    w = built.worst[0].worst
    assert w is not None and w.cause == "date_time"
    first = w.first_diff_index
    assert w.start_a <= first < w.start_a + len(w.window_a)
    # the tokens before the first difference are the same on both sides; the first differing ones are not
    shared = first - w.start_a
    assert w.window_a[:shared] == w.window_b[:shared] and w.window_a[shared] != w.window_b[shared]


def test_before_after_is_fix_engines_own_and_adds_up(tok):
    from dataclasses import replace

    from cachectl.engines.repair import fix, groups
    from cachectl.inputs import iter_jsonl

    lines = groups.log_lines(iter_jsonl(str(LOG)), source=str(LOG), key="session")
    opts = fix.FixOptions(key="session")
    safe = fix.fix_log(lines, opts, tokenizer=tok, table=PriceTable.load(), source=str(LOG))
    full = fix.fix_log(lines, replace(opts, unsafe=True), tokenizer=tok, table=PriceTable.load(), source=str(LOG))
    ba = report.before_after(safe, full)
    before, after_safe, after_all = ba.columns
    assert before.vllm_hit_rate == safe.before.vllm.hit_rate and after_all.vllm_hit_rate == full.after.vllm.hit_rate
    assert before.provider_cost_usd == safe.before.provider.cost_usd
    assert after_safe.provider_cost_usd == safe.after.provider.cost_usd
    # the fixture's causes are all fixable: none is left after all fixes; only the safe one (FX002) without them
    assert sum(before.causes.values()) == 14 and after_all.causes == {}
    assert set(after_safe.causes) == {"date_time", "volatile_id", "tool_order"}
    assert after_all.vllm_hit_rate > after_safe.vllm_hit_rate > before.vllm_hit_rate
    assert after_all.provider_cost_usd < after_safe.provider_cost_usd < before.provider_cost_usd
    # per-code gains, applied one after another, add up to the all-fixes column
    assert before.pair_reused_tokens + sum(g.reused_tokens for g in ba.gains) == after_all.pair_reused_tokens
    assert {g.code: g.safe for g in ba.gains} == {"FX001": False, "FX002": True, "FX003": False}
    # the diff-tokens view of the same log agrees with fix's measure on the vLLM ceiling
    built = _build(tok)
    assert built.curve.ceiling_hit_rate == pytest.approx(before.vllm_hit_rate)


def test_without_a_key_conversations_are_found_automatically(cli):
    by_key = json.loads(cli("report", str(LOG), "--key", "session", "-t", str(TOK_DIR), "-f", "json").stdout)
    auto = json.loads(cli("report", str(LOG), "-t", str(TOK_DIR), "-f", "json").stdout)
    assert auto["fixes"]["grouping"] == "automatic" and auto["conversations"] == by_key["conversations"] == 6
    assert auto["causes"] == by_key["causes"] and auto["fixes"]["columns"] == by_key["fixes"]["columns"]
    assert "6 conversations (found automatically)" in cli("report", str(LOG), "-t", str(TOK_DIR)).stdout


def _hostile_log(tmp_path):
    evil = '<script>alert("x")</script><img src=x onerror=alert(1)>'
    rows = []
    for i in range(3):
        rows.append({"timestamp": 1000 + 10 * i, "session": evil, "body": {"model": "gpt-4.1", "messages": [
            {"role": "system", "content": f"Now: 2026-11-30T10:0{i}:00Z {evil} " + "Stable instructions. " * 60},
            {"role": "user", "content": f"</div>{evil} question {i}"}]}})
    p = tmp_path / "evil.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return p


def test_html_escapes_everything_from_the_log_and_needs_nothing_from_outside(cli, tmp_path):
    log = _hostile_log(tmp_path)
    page = tmp_path / "r.html"
    r = cli("report", str(log), "--key", "session", "-t", str(TOK_DIR), "--html", str(page))
    assert r.exit_code == 1, r.stderr  # prefix tokens were lost
    html = page.read_text(encoding="utf-8")
    assert "<script" not in html.lower() and "<img" not in html.lower()
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html  # the key, shown as text
    # self-contained: no script, stylesheet, image or font fetched; the one URL is SVG's namespace name
    assert re.findall(r"https?://[^\s\"']+", html) == ["http://www.w3.org/2000/svg"] * html.count("<svg")
    assert not re.search(r"<link\b|<[a-z]+[^>]*\s(src|href)=|url\(|@import", html)


def test_cli_text_json_and_errors(cli, tmp_path):
    r = cli("report", str(LOG), "--key", "session", "-t", str(TOK_DIR))
    assert r.exit_code == 1 and "date_time" in r.stdout and "vLLM prefix cache" in r.stdout
    data = json.loads(cli("report", str(LOG), "--key", "session", "-t", str(TOK_DIR), "-f", "json").stdout)
    assert data["schema_version"] == 1 and data["tokens_lost"] == sum(c["tokens_lost"] for c in data["causes"])
    r = cli("report", str(LOG), "--key", "nope", "-t", str(TOK_DIR))
    assert r.exit_code == 2 and "agent_log.jsonl:1: field 'nope': missing conversation key" in r.stderr
    r = cli("report", "-", "-t", str(TOK_DIR))  # stdin is read (copied once), here empty
    assert r.exit_code == 2 and "<stdin>: file is empty" in r.stderr
    assert "needs --tokenizer" in cli("report", str(LOG)).stderr
    bare = tmp_path / "bare.jsonl"  # chat lists: no model, no timestamps; the provider cache cannot be priced
    bare.write_text("".join(json.dumps(json.loads(row)["body"]["messages"]) + "\n"
                            for row in LOG.read_text(encoding="utf-8").splitlines()[:6]), encoding="utf-8")
    data = json.loads(cli("report", str(bare), "-t", str(TOK_DIR), "-f", "json").stdout)
    assert data["cost"] is None and data["usd_lost"] is None and data["requests"] == 6
    assert any(n.startswith("provider cache not simulated: ") for n in data["notes"])
    clean = tmp_path / "clean.jsonl"
    clean.write_text("".join(row for row in LOG.read_text(encoding="utf-8").splitlines(keepends=True)
                             if '"s1-clean"' in row), encoding="utf-8")
    r = cli("report", str(clean), "--key", "session", "-t", str(TOK_DIR), "--html", str(tmp_path / "c.html"))
    assert r.exit_code == 0, r.stderr
    assert "every pair was append-only" in (tmp_path / "c.html").read_text(encoding="utf-8")


@pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                    reason="chromium and chromedriver are not installed (.ci/run installs them)")
def test_page_in_headless_chromium(cli, tmp_path):
    page = tmp_path / "report.html"
    r = cli("report", str(LOG), "--key", "session", "-t", str(TOK_DIR), "--html", str(page))
    assert r.exit_code == 1, r.stderr
    shot = tmp_path / "report.png"
    v = visit(page, shot)
    assert [e for e in v.console if e.get("level") in ("SEVERE", "WARNING")] == []
    assert v.requests == [page.resolve().as_uri()]  # the page itself, nothing else
    assert v.title == f"cachectl report: {LOG}"
    for heading in ("Tokens lost, per cause", "Shared prefix across requests", "Worst conversations",
                    "Provider prompt cache", "vLLM prefix cache: hit rate against capacity",
                    "Before and after cachectl fix"):
        assert heading in v.text
    # the shared prefix drawn (inline SVG, as logged and with the forks fixed), its forks listed
    html = page.read_text(encoding="utf-8")
    assert 'aria-label="the shared-prefix tree as logged"' in html
    assert 'aria-label="the shared-prefix tree with the forks fixed"' in html
    assert "FX001 date_time" in html and "where the branches split" in v.text.lower()
    from PIL import Image

    with Image.open(shot) as im:
        assert im.size[0] == 1200 and im.size[1] > 2000
        colors = im.convert("RGB").getcolors(maxcolors=1 << 20)
        assert colors is not None and len(colors) > 50  # a rendered page, not a blank one
    # a page that does log an error is caught (the check can fail)
    bad = tmp_path / "bad.html"
    bad.write_text("<!doctype html><title>x</title><script>undefinedFunction()</script>", encoding="utf-8")
    assert [e for e in visit(bad).console if e.get("level") == "SEVERE"]


def test_report_shows_the_billed_usage_beside_the_prediction(cli):
    """A log whose lines carry the provider's usage (any shape that has it): report reconciles as prompt-cost does,
    the same requests, agreements and billed dollars."""
    log = PROMPTS / "anthropic_billed.jsonl"
    r = cli("report", log, "-t", TOK_DIR, "-f", "json")
    assert r.exit_code in (0, 1), r.stderr
    cost = json.loads(r.stdout)["cost"]
    p = cli("prompt-cost", log, "-t", TOK_DIR, "-f", "json")
    want = json.loads(p.stdout)
    assert cost["reconciled"] == want["reconciled"] == 5
    assert cost["agreed"] == want["agreed"] and cost["billed_usd"] == pytest.approx(want["billed_cost_usd"])
    text = cli("report", log, "-t", TOK_DIR)
    assert f"against the logged usage: ${want['billed_cost_usd']:.4f} billed for 5 requests" in text.stdout
    assert f"the prediction agrees on {want['agreed']}" in text.stdout


@pytest.mark.parametrize("name", ["fix_log", "agent_log"])
def test_the_safe_fixes_column_is_what_fix_applies_without_unsafe_fixes(cli, name):
    """report's run of the safe fixes leaves the unsafe codes out (they apply nothing there) but not FX005, which
    is unsafe by default and applies the rewrites it proves safe (the render unchanged): its column is fix's own
    run without --unsafe-fixes, fix for fix and dollar for dollar."""
    log = str(PROMPTS / f"{name}.jsonl")
    rep = json.loads(cli("report", log, "-t", str(TOK_DIR), "-f", "json").stdout)
    fixed = json.loads(cli("fix", log, "-t", str(TOK_DIR), "-f", "json").stdout)
    safe = rep["fixes"]["columns"][1]
    assert safe["label"] == "safe fixes" and safe["fixes_applied"] == fixed["applied"]
    assert safe["provider_cost_usd"] == fixed["after"]["provider"]["cost_usd"]
    assert safe["vllm_hit_rate"] == fixed["after"]["vllm"]["hit_rate"]
    assert safe["causes"] == fixed["after"]["causes"]
    if name == "fix_log":  # the fixture FX005 proves one rewrite safe on (the claude conversation's thinking block
        # is no cause: claude-sonnet-4-5 keeps only the last turn's thinking, sent or not: test_thinking_retention)
        assert sum(1 for f in fixed["fixes"] if f["code"] == "FX005" and f["applied"]) == 1


def _one_read_cases(tmp_path):
    """(name, log, --model): request bodies; lines naming no model, priced by --model (read again for it); bare chat
    lists (the provider refuses them, the curve reads them); a model named by the line beside --model; no
    timestamps past the first line (the provider stops there, the curve reads on)."""
    rows = [json.loads(r) for r in LOG.read_text(encoding="utf-8").splitlines()]
    nameless = tmp_path / "nameless.jsonl"
    nameless.write_text("".join(json.dumps({**r, "body": {k: v for k, v in r["body"].items() if k != "model"}}) + "\n"
                                for r in rows), encoding="utf-8")
    bare = tmp_path / "bare.jsonl"
    bare.write_text("".join(json.dumps(r["body"]["messages"]) + "\n" for r in rows[:8]), encoding="utf-8")
    return [("bodies", LOG, None), ("nameless", nameless, "gpt-4.1"), ("bare", bare, "gpt-4.1"),
            ("named", PROMPTS / "openai_requests.jsonl", "claude-sonnet-4-5"),
            ("no-timestamps", PROMPTS / "demo_log.jsonl", "gpt-4.1")]


@pytest.mark.parametrize("jobs", ["1", "2"])
@pytest.mark.parametrize("case", range(5))
def test_provider_and_curve_read_from_the_lines_are_those_of_the_file(cli, tok, tmp_path, monkeypatch, case, jobs):
    """report reads the log once: its provider section and capacity curve, fed from that read, are the ones
    prompt-cost's reading of the file (``read_requests``; a bare chat list read as the Chat request fix prices) and
    simulate-prefix's (``iter_trace``) give. In one
    process they are fed each line of the first read, as it is read or, for the lines whose batch of the fork
    records was not packed yet, when that read ends (with a child, the child reads the lines for them)."""
    from cachectl.cli.common import timestamp_reader
    from cachectl.engines.repair import fix, groups, sections
    from cachectl.engines.repair.sections import cost_section, curve_section
    from cachectl.inputs import display_name, formats

    name, path, model = _one_read_cases(tmp_path)[case]
    src = str(path)
    opened = []
    reading, fed = [False], []

    def log_lines(*a, _read=groups.log_lines, **k):
        reading[0] = True
        try:
            return _read(*a, **k)
        finally:
            reading[0] = False

    def finish(self, _finish=fix.FirstRead.finish):  # (the first read's end: the lines it holds are fed)
        reading[0] = True
        try:
            return _finish(self)
        finally:
            reading[0] = False

    with monkeypatch.context() as m:
        m.setattr(formats, "open_log", lambda *a, _open=formats.open_log, **k: opened.append(a) or _open(*a, **k))
        m.setattr(groups, "log_lines", log_lines)
        m.setattr(fix.FirstRead, "finish", finish)
        m.setattr(sections.OneRead, "__call__",
                  lambda self, ln, *a, _call=sections.OneRead.__call__: fed.append((ln.line, reading[0]))
                  or _call(self, ln, *a))
        args = ["report", src, "-t", str(TOK_DIR), "-f", "json", "--jobs", jobs] + (["--model", model] if model else [])
        r = cli(*args)
    assert r.exit_code in (0, 1), r.stderr
    assert opened == [(src,), (src, "native")]  # its shape found from its first lines, then the log read once
    if jobs == "1":
        lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
        assert len(fed) == len(lines) and len(set(fed)) == len(fed) and all(first for _, first in fed)
    data = json.loads(r.stdout)
    reqs = read_requests(src, default_model=model, timestamps=timestamp_reader(None))
    if name == "bare":  # (prompt-cost refuses a bare chat list; report prices it as fix does, a Chat request)
        from cachectl.inputs import parse_request

        reqs = (parse_request({"messages": json.loads(x)}, source=display_name(src), line=n, provider="openai",
                              default_model=model)
                for n, x in enumerate(path.read_text(encoding="utf-8").splitlines(), 1))
    costed = cost_section(reqs, PriceTable.load(), display_name(src), promptcache.tokenizer_counter(tok), str(TOK_DIR))
    curve = curve_section(iter_trace(_trace_records(src), source=display_name(src), tokenizer=tok), 16, 16,
                          display_name(src))
    assert data["curve"] == json.loads(json.dumps(asdict(curve))), name
    if costed.section is None:
        assert data["cost"] is None and costed.notes[0] in data["notes"], name
    else:
        assert data["cost"] == json.loads(json.dumps(asdict(costed.section))), name
    assert (name in ("bare", "no-timestamps")) == (costed.section is None)  # each case reads what it says


def test_the_provider_section_stops_reading_at_its_first_error(tok):
    """The provider section's simulation stops at a request it cannot simulate (a note, the report stands) and reads
    no request after it, as a simulation reading the requests itself stops there: here the next one is an error of
    the reader's that would end the run."""
    from cachectl.engines.repair.sections import cost_section
    from cachectl.inputs import parse_request

    good = {"model": "gpt-4.1", "timestamp": 1000.0, "messages": [{"role": "user", "content": "hello"}],
            "usage": {"prompt_tokens": 8, "completion_tokens": 2}}
    nameless = {**good, "model": None, "timestamp": 1001.0}
    read = []

    def requests():
        for n, body in enumerate([good, nameless], 1):
            read.append(n)
            yield parse_request(body, source="log.jsonl", line=n)
        read.append(3)
        raise RuntimeError("read past the first error")

    counter = promptcache.tokenizer_counter(tok)
    costed = cost_section(requests(), PriceTable.load(), "log.jsonl", counter, str(TOK_DIR))
    assert costed.section is None and read == [1, 2]
    assert costed.notes[0].startswith("provider cache not simulated") and "no model" in costed.notes[0]
    one = cost_section(iter([parse_request(good, source="log.jsonl", line=1)]), PriceTable.load(), "log.jsonl",
                       counter, str(TOK_DIR))
    assert one.section is not None and one.requests == 1


def test_the_provider_section_fed_in_batches_is_the_one_fed_a_request_at_a_time(tok):
    """The report's provider section simulates the requests it is fed in batches, their position texts encoded
    together first: the section is the one a request at a time gives, and an error inside a batch (a request it
    cannot simulate, then a line the reader could not read) stops it at the same request with the same note."""
    from cachectl.engines.repair.sections import CostFeed
    from cachectl.errors import InputError
    from cachectl.inputs import parse_request

    def body(n: int, model: str | None = "gpt-4.1") -> dict:
        system = f"You are agent {n % 7}. Current time: 2026-11-30T10:{n % 60:02d}:00Z. " + "Be brief. " * (n % 5)
        return {"model": model, "timestamp": 1000.0 + n,
                "messages": [{"role": "system", "content": system},
                             {"role": "user", "content": f"question {n} " + "why? " * (n % 40)}],
                "usage": {"prompt_tokens": 40 + n % 50, "completion_tokens": 2}}

    class Spied:  # (the tokenizer, its batches counted)
        def __init__(self) -> None:
            self.batches: list[int] = []

        @property
        def backend(self) -> Spied:
            return self

        def encode_batch(self, texts, *a, **kw):
            self.batches.append(len(texts))
            return tok.backend.encode_batch(texts, *a, **kw)

        def __getattr__(self, name: str):
            return getattr(tok.backend, name)

    def fed(batch: int, items: list) -> tuple:
        counter = promptcache.tokenizer_counter(tok)
        counter._tok = spied = Spied()
        feed = CostFeed(PriceTable.load(), "log.jsonl", counter, str(TOK_DIR), batch=batch)
        for item in items:
            feed.add(item)
        got = feed.result()
        return got.section, got.requests, got.notes, feed.read, spied.batches

    reqs = [parse_request(body(n), source="log.jsonl", line=n) for n in range(1, 301)]
    one, batched = fed(1, reqs), fed(128, reqs)
    assert batched[:4] == one[:4] and one[0] is not None and one[1] == 300
    assert one[4] == [] and len(batched[4]) == 3 and sum(batched[4]) > 300  # (three batches; each text once)

    nameless = parse_request(body(200, model=None), source="log.jsonl", line=200)
    broken = InputError("not JSON", source="log.jsonl", line=250)
    items = reqs[:199] + [nameless] + reqs[200:249] + [broken] + reqs[250:]
    one, batched = fed(1, items), fed(128, items)
    assert batched[:4] == one[:4] and one[0] is None and one[3] == 200
    assert "no model" in one[2][0]
    items = reqs[:249] + [broken] + reqs[250:]
    one, batched = fed(1, items), fed(128, items)
    assert batched[:4] == one[:4] and one[0] is None and one[3] == 249 and "not JSON" in one[2][0]


def test_the_curve_takes_the_token_ids_the_fork_records_tokenized(tok, tmp_path, monkeypatch):
    """Fed each line once the fork records packed its batch (as report's one read does: ``FirstRead.then``; in one
    process a batch is encoded on a thread while the next lines are read, so the lines come a batch late), the
    curve's reader tokenizes nothing of its own: it takes each prompt's token IDs from the batches the records
    tokenized, and its curve is the one it makes tokenizing them itself. A prompt the records did not tokenize
    (another object) is tokenized as before."""
    from cachectl.engines.repair import fix, groups, sections
    from cachectl.inputs import iter_jsonl

    rows = LOG.read_text(encoding="utf-8").splitlines(keepends=True)
    log = tmp_path / "long.jsonl"
    log.write_text("".join(rows * (600 // len(rows) + 1)), encoding="utf-8")   # (three batches of 256 and a part)
    asked: list[int] = []

    class Counting:
        def __init__(self, t):
            self.t = t

        def tokenize_many(self, prompts, **k):
            asked.append(len(prompts))
            return self.t.tokenize_many(prompts, **k)

    monkeypatch.setattr(sections._Known, "__init__",
                        lambda self, t, known, _init=sections._Known.__init__: _init(self, Counting(t), known))
    seen: list[int] = []   # prompts the curve's reader asked for through the records
    monkeypatch.setattr(sections._Known, "tokenize_many", lambda self, prompts, _many=sections._Known.tokenize_many,
                        **k: seen.append(len(prompts)) or _many(self, prompts, **k))

    def curve(first_read):
        first = fix.FirstRead(fix.FixOptions(key="session"), tokenizer=tok, source=str(log))
        fed = sections.sections_reader(source=str(log), tokenizer=tok, tokenizer_name=str(TOK_DIR), table=None,
                                     default_model=None, timestamps=None, block_size=16,
                                     first_read=first if first_read else None)
        first.then(fed)
        lines = groups.log_lines(iter_jsonl(str(log)), source=str(log), key="session", each=first.add)
        assert first.forks is not None and first.forks.waiting > 0
        first.finish()   # (the last batches packed and their lines fed, before the sections are asked for)
        assert len(lines) > 600 and first.forks.waiting == 0
        return fed.curve()

    alone = curve(False)
    assert sum(asked) == sum(seen) > 600   # (alone, it tokenizes every prompt itself)
    asked.clear()
    seen.clear()
    assert curve(True) == alone and asked == [] and sum(seen) > 600
    fr = fix.FirstRead(fix.FixOptions(key="session"), tokenizer=tok, source=str(log))
    ln = next(iter(groups.log_lines(iter_jsonl(str(LOG)), source=str(LOG), key="session")))
    fr.add(ln)
    fr.finish()   # (the last batch packed, the encoding thread let go)
    assert fr.forks.known(ln.prompt, True) is not None and fr.forks.known(ln.prompt, False) is None
    again = groups.log_lines(iter_jsonl(str(LOG)), source=str(LOG), key="session")[0]
    assert again.prompt == ln.prompt and fr.forks.known(again.prompt, True) is None   # (another object)
    mixed = sections._Known(tok, fr.forks.known).tokenize_many([again.prompt, ln.prompt], add_generation_prompt=True)
    assert asked[-1] == 1 and [list(t.ids) for t in mixed] == [list(fr.forks.known(ln.prompt, True))] * 2


def test_the_provider_texts_are_encoded_on_the_thread_as_the_lines_are_read(tok, tmp_path, monkeypatch):
    """In one process, report's first read hands the provider section's position texts to its encoding thread as
    each line is read (``OneRead.ahead``), a batch of the fork records before the line is fed to the section: the
    section is the one it makes encoding the texts itself, each text is still encoded once, and most are encoded on
    that thread, not in the read's."""
    import copy
    import threading

    from cachectl.engines.repair import fix, groups, sections
    from cachectl.inputs import iter_jsonl

    rows = [json.loads(r) for r in LOG.read_text(encoding="utf-8").splitlines()]
    log = tmp_path / "long.jsonl"
    with log.open("w", encoding="utf-8") as f:
        for n in range(600):   # (three batches of 256 and a part; each request's last text its own)
            row = copy.deepcopy(rows[n % len(rows)])
            row["body"]["messages"][-1]["content"] += f" (request {n})"
            row["timestamp"] = f"2026-11-30T{10 + n // 180:02d}:{n // 3 % 60:02d}:{n % 3 * 20:02d}Z"   # (in order)
            f.write(json.dumps(row) + "\n")
    on_thread: list[bool] = []   # a text encoded (and kept by the counter): on the encoding thread?
    keep = promptcache.TextTokens._keep
    monkeypatch.setattr(promptcache.TextTokens, "_keep", lambda self, key, got: on_thread.append(
        threading.current_thread().name.startswith("cachectl-encode")) or keep(self, key, got))

    def section(ahead: bool):
        first = fix.FirstRead(fix.FixOptions(key="session"), tokenizer=tok, source=str(log))
        assert first.encoder is not None
        fed = sections.sections_reader(source=str(log), tokenizer=tok, tokenizer_name=str(TOK_DIR),
                                       table=PriceTable.load(), default_model=None, timestamps=None, block_size=16,
                                       first_read=first)
        first.then(fed, ahead=fed.ahead if ahead else None)
        groups.log_lines(iter_jsonl(str(log)), source=str(log), key="session", each=first.add)
        first.finish()
        got = fed.costed()
        assert got is not None and got.section is not None
        return got.section, got.notes, got.requests

    alone = section(False)
    assert on_thread and not any(on_thread) and len(on_thread) > 600
    texts = len(on_thread)
    on_thread.clear()
    assert section(True) == alone
    assert len(on_thread) == texts and sum(on_thread) > 3 * texts // 4


def test_a_line_the_curve_refuses_is_the_error_it_was(cli, tok, tmp_path):
    """A line the first read takes and the curve's reader refuses (``output_length`` is only the trace's) ends the
    report with the trace reader's own line, as when the curve read the file itself (in one process or two)."""
    from cachectl.errors import InputError

    rows = LOG.read_text(encoding="utf-8").splitlines(keepends=True)
    odd = json.loads(rows[4])
    odd.pop("output_tokens", None)
    odd["output_length"] = "x"
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(rows[:4]) + json.dumps(odd) + "\n" + "".join(rows[5:]), encoding="utf-8")
    with pytest.raises(InputError) as want:
        list(iter_trace(_trace_records(str(bad)), source=str(bad), tokenizer=tok))
    assert "line 5" in str(want.value) or ":5:" in str(want.value)
    for jobs in ("1", "2"):
        r = cli("report", str(bad), "-t", str(TOK_DIR), "--jobs", jobs)
        assert r.exit_code == 2 and r.stderr.strip().endswith(str(want.value)), r.stderr


@pytest.mark.parametrize("path,key", [(LOG, "session"), (LOG, None),
                                      (PROMPTS / "demo_log.jsonl", None), (PROMPTS / "fix_log.jsonl", None)],
                         ids=["key", "auto", "text", "fix"])
def test_log_report_pairs_are_diff_tokens_pairs(tok, monkeypatch, path, key):
    """``report`` compares its pairs in the fix engine's sweep (the log as it is), and runs no token diff of its own:
    its pair figures, causes and worst conversations (with their windows) are those of diff-tokens' log mode over
    the same conversations."""
    from cachectl.engines import tokendiff
    from cachectl.engines.repair import fix, groups, shared_prefix
    from cachectl.inputs import iter_jsonl

    src = str(path)
    opts = fix.FixOptions(key=key)
    lines = groups.log_lines(iter_jsonl(src), source=src, key=key)
    grouping = groups.group_sessions(lines, key=key, window_s=opts.window_s, tokenizer=tok)
    want = report.build_report(source=src, log=shared_prefix.auto_records(lines, grouping), tokenizer=tok,
                               tokenizer_name=str(TOK_DIR), table=PriceTable.load(),
                               requests=(ln.request for ln in lines if ln.request is not None),  # (with a body)
                               end_indices=set(grouping.last_indices()),
                               text_counter=promptcache.tokenizer_counter(tok), add_generation_prompt=True)
    with monkeypatch.context() as m:
        m.setattr(tokendiff, "diff_log", None)  # (called, it would fail)
        got = report.log_report(lines, opts, tokenizer=tok, tokenizer_name=str(TOK_DIR), table=PriceTable.load(),
                                source=src)
    assert want.pairs > 0 and want.tokens_lost > 0
    fields = ("requests", "conversations", "pairs", "reusable_tokens", "reused_tokens", "tokens_lost", "reuse_ratio",
              "usd_lost", "causes", "worst")
    assert {f: getattr(got, f) for f in fields} == {f: getattr(want, f) for f in fields}
    assert all(w.worst is not None and w.worst.window_a for w in got.worst)


@pytest.mark.parametrize("path,key", [(LOG, None), (LOG, "session"), (PROMPTS / "agent_log.jsonl", None),
                                      (PROMPTS / "demo_log.jsonl", None)], ids=["auto", "key", "agent", "text"])
def test_grouping_and_fork_requests_come_from_the_first_read(tok, monkeypatch, path, key):
    """``report`` and ``fix`` find the conversations and pack the fork analysis's requests as the lines are first
    read (:class:`FirstRead`): no later pass reads the lines for them, and the reports are those of the passes
    that did (the lines read again)."""
    from cachectl.engines.repair import fix, groups, shared_prefix
    from cachectl.inputs import iter_jsonl

    src = str(path)
    opts = fix.FixOptions(key=key)
    seen = {"sessions": 0, "forks": 0}
    with monkeypatch.context() as m:
        m.setattr(groups.Sessions, "add", lambda self, ln, _add=groups.Sessions.add: (
            seen.__setitem__("sessions", seen["sessions"] + 1), _add(self, ln))[1])
        m.setattr(shared_prefix.ForkLines, "add", lambda self, ln, _add=shared_prefix.ForkLines.add: (
            seen.__setitem__("forks", seen["forks"] + 1), _add(self, ln))[1])
        first = fix.FirstRead(opts, tokenizer=tok, source=src)
        lines = groups.log_lines(iter_jsonl(src), source=src, key=key, each=first.add)
        n = len(lines)
        assert seen == {"sessions": 0 if key else n, "forks": n}
        with_first = report.log_report(lines, opts, tokenizer=tok, tokenizer_name=str(TOK_DIR),
                                       table=PriceTable.load(), source=src, first_read=first)
        assert seen == {"sessions": 0 if key else n, "forks": n}  # (nothing read the lines again for them)
        fix_opts = fix.FixOptions(key=key, unsafe=True)
        fix_first = fix.FirstRead(fix_opts, tokenizer=tok, source=src)
        fix_lines = groups.log_lines(iter_jsonl(src), source=src, key=key, each=fix_first.add)
        fixed = fix.fix_log(fix_lines, fix_opts, tokenizer=tok, table=PriceTable.load(), source=src,
                            first_read=fix_first)
        assert seen == {"sessions": 0 if key else 2 * n, "forks": 2 * n}
        with pytest.raises(ValueError, match="saw 0 lines"):  # (a first read of other lines is refused)
            fix.fix_log(fix_lines, fix_opts, tokenizer=tok, source=src, first_read=fix.FirstRead(fix_opts))
    again = groups.log_lines(iter_jsonl(src), source=src, key=key)
    without = report.log_report(again, opts, tokenizer=tok, tokenizer_name=str(TOK_DIR), table=PriceTable.load(),
                                source=src)
    assert json.dumps(with_first.to_dict(), sort_keys=True) == json.dumps(without.to_dict(), sort_keys=True)
    assert with_first.forks == without.forks and without.fixes.grouping == with_first.fixes.grouping
    fixed_again = fix.fix_log(again, fix.FixOptions(key=key, unsafe=True), tokenizer=tok, table=PriceTable.load(),
                              source=src)
    assert fixed.to_dict() == fixed_again.to_dict() and list(fixed.output) == list(fixed_again.output)


@pytest.mark.parametrize("path,model", [(PROMPTS / "fix_log.jsonl", None), (PROMPTS / "fix_log.jsonl", "claude-sonnet-4-5"),
                                        (LOG, None), (PROMPTS / "demo_log.jsonl", "gpt-4o")],
                         ids=["fix_log", "model", "agent", "text"])
def test_fix_measures_the_log_as_it_is_with_the_provider_cache_fed_in_the_first_read(tok, monkeypatch, path, model):
    """In one process ``fix`` simulates the provider cache over the lines as they are first read (the report's
    provider section, without its curve: ``provider_read``), and the sweep takes that measure for the log as it is:
    it simulates only the fixes' versions, and the report is the one the sweep makes simulating all of them (where
    the first read's simulation could not run, with a note, the sweep simulates the lines again and says why)."""
    from cachectl.engines.repair import fix, groups, measure, sections
    from cachectl.inputs import iter_jsonl

    src, table = str(path), PriceTable.load()
    opts = fix.FixOptions(key="session", unsafe=True, model=model)
    runs: list[int] = []
    monkeypatch.setattr(measure, "_provider_run", lambda *a, _run=measure._provider_run: (runs.append(1), _run(*a))[1])

    def run(fed: bool):
        first = fix.FirstRead(opts, tokenizer=tok, source=src)
        provider = sections.provider_read(first, opts, tok, str(TOK_DIR), table=table, source=src) if fed else None
        lines = groups.log_lines(iter_jsonl(src), source=src, key="session", each=first.add)
        runs.clear()
        got = fix.fix_log(lines, opts, tokenizer=tok, table=table, source=src, first_read=first,
                          provider_read=provider, preview_unsafe=True)
        return got, len(runs), provider

    plain, plain_runs, _ = run(False)
    fed, fed_runs, provider = run(True)
    assert json.dumps(fed.to_dict(), sort_keys=True) == json.dumps(plain.to_dict(), sort_keys=True)
    assert list(fed.output) == list(plain.output)
    simulated = provider.measure_before(len(fed.output)) is not None
    assert fed_runs == plain_runs - (1 if simulated else 0)   # (the log as it is: not simulated again)
    assert simulated == (plain.before.provider is not None and not any("not simulated" in n for n in plain.notes))
    with pytest.raises(RuntimeError, match="makes none"):
        provider.curve()
    # (no requests packed as the lines are read, --ray's case: no simulation there either; the sweep makes it)
    assert sections.provider_read(fix.FirstRead(opts, tokenizer=tok, forks=False), opts, tok, str(TOK_DIR), table=table) is None


def test_a_bad_line_lets_the_sections_fed_in_the_first_read_go(cli, tmp_path):
    """In one process the provider and curve sections are fed as the lines are first read, each in a thread of its
    own: a line the first read refuses ends the run with its one line, and those threads end too."""
    import threading
    import time

    rows = LOG.read_text(encoding="utf-8").splitlines(keepends=True)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("".join(rows[:3]) + "{not json\n" + "".join(rows[3:]), encoding="utf-8")
    before = threading.active_count()
    r = cli("report", str(bad), "-t", str(TOK_DIR), "--jobs", "1")
    assert r.exit_code == 2 and ":4" in r.stderr and "Traceback" not in r.stderr, r.stderr
    deadline = time.monotonic() + 10
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() <= before, threading.enumerate()


def test_top_below_one_is_refused_before_the_log_is_analysed(tok, monkeypatch):
    """``top`` (the worst conversations shown) of 0 is an error, said before the fork analysis runs, by the engine as
    by ``diff_log``'s report."""
    from cachectl.engines.repair import fix, groups
    from cachectl.errors import CachectlError
    from cachectl.inputs import iter_jsonl

    src = str(LOG)
    lines = groups.log_lines(iter_jsonl(src), source=src)
    with monkeypatch.context() as m:
        m.setattr(fix, "started", None)  # (called, it would fail otherwise)
        with pytest.raises(CachectlError, match="at least 1"):
            report.log_report(lines, fix.FixOptions(), tokenizer=tok, tokenizer_name=str(TOK_DIR), top=0)
    with pytest.raises(CachectlError, match="at least 1"):
        _build(tok, top=0)


def test_two_requests_on_one_line_are_paired_as_the_before_column_pairs_them(cli):
    """An OpenTelemetry log holds two calls of one conversation on one line. ``report``'s pairs are the sweep's, by
    each request's place in the log (not by line number, which the two share): its headline pairs them as its own
    before column does."""
    r = cli("report", str(PROMPTS.parent / "logs" / "otel_genai.jsonl"), "-t", str(TOK_DIR), "--format", "json")
    assert r.exit_code in (0, 1), r.stderr
    data = json.loads(r.stdout)
    before = data["fixes"]["columns"][0]
    assert data["requests"] == 4 and data["pairs"] == 1
    assert data["reused_tokens"] == before["pair_reused_tokens"] > 0


def test_diff_tokens_pairs_two_requests_on_one_line_as_report_does(cli):
    """``diff-tokens --log`` without ``--key`` forgets a conversation at its last request, by the request's place in
    the log: two calls of one conversation on one line are paired, as ``report`` pairs them (by line number, the
    conversation was forgotten at the first of them and nothing was paired)."""
    log = str(PROMPTS.parent / "logs" / "otel_genai.jsonl")
    r = cli("diff-tokens", "--log", log, "-t", str(TOK_DIR), "--add-generation-prompt", "--format", "json")
    assert r.exit_code in (0, 1), r.stderr
    summary = next(o for o in map(json.loads, r.stdout.splitlines()) if o.get("record") == "summary")
    rep = json.loads(cli("report", log, "-t", str(TOK_DIR), "--format", "json").stdout)
    assert summary["pairs"] == rep["pairs"] == 1
    assert summary["reused_tokens"] == rep["reused_tokens"] > 0


@pytest.mark.parametrize("log,key", [(LOG, "session"), (PROMPTS / "fix_log.jsonl", None),
                                     (PROMPTS / "shared_prefix_log.jsonl", None)])
def test_a_report_in_two_processes_is_the_report_in_one(cli, monkeypatch, tmp_path, log, key):
    """With two processes, the child measures the log as it is (with its pairs) beside the fork analysis, feeding
    the provider and curve sections each line as it goes, while this process measures the fixes' versions: the
    report is the one process's, byte for byte. The child's curve tokenizes no prompt of its own: it takes the
    tokens its sweep encoded."""
    from cachectl import workers
    from cachectl.engines.repair import fix, sections

    if workers.available_jobs() < 2:
        pytest.skip("one core, or no os.fork: every part runs in this process")
    here: list[bool] = []   # (what this process's sweeps measured: the log as it is too, or only the fixes)
    monkeypatch.setattr(fix, "measured_pass", lambda *a, _m=fix.measured_pass, **k: here.append(k.get("before", False))
                        or _m(*a, **k))
    asked = tmp_path / "asked"   # (the prompts the curve's reader tokenized itself, a line per call: in the child too)

    class Counting:
        def __init__(self, t):
            self.t = t

        def tokenize_many(self, prompts, **k):
            with asked.open("a") as fh:
                fh.write(f"{len(prompts)}\n")
            return self.t.tokenize_many(prompts, **k)

    monkeypatch.setattr(sections._Known, "__init__",
                        lambda self, t, known, _init=sections._Known.__init__: _init(self, Counting(t), known))
    args = ["report", str(log), "-t", str(TOK_DIR), "--format", "json"] + (["--key", key] if key else [])

    def tokenized_by_the_curve() -> int:
        got = sum(map(int, asked.read_text().split())) if asked.exists() else 0
        asked.unlink(missing_ok=True)
        return got

    one = cli(*args, "--jobs", "1")
    assert here == [True]
    in_one = tokenized_by_the_curve()   # (a raw-text line's prompt, which the reader reads itself, in both)
    here.clear()
    two = cli(*args, "--jobs", "2")
    assert here == [False]
    assert one.exit_code == two.exit_code and one.exit_code in (0, 1), one.stderr + two.stderr
    assert one.stdout == two.stdout and json.loads(one.stdout)["fixes"]["columns"][-1]["fixes_applied"] > 0
    assert tokenized_by_the_curve() == in_one == (3 if log.name == "fix_log.jsonl" else 0)


@pytest.mark.parametrize("case", [1, 2, 4])
def test_two_processes_measure_the_log_as_it_is_where_the_provider_section_could_not(cli, tmp_path, case):
    """The child's sweep takes the provider section's simulation as the log's measure before the fixes once the
    section is done; where it did not run over every line (bare chat lists, which it refuses; no timestamps after
    the first line), the sweep's requests are simulated then, and the report is still the one process's: lines
    that name no model (priced by --model), bare chat lists, a log without timestamps."""
    from cachectl import workers

    if workers.available_jobs() < 2:
        pytest.skip("one core, or no os.fork: every part runs in this process")
    name, path, model = _one_read_cases(tmp_path)[case]
    args = ["report", str(path), "-t", str(TOK_DIR), "--format", "json", "--model", model]
    one, two = cli(*args, "--jobs", "1"), cli(*args, "--jobs", "2")
    assert one.exit_code == two.exit_code and one.exit_code in (0, 1), one.stderr + two.stderr
    assert one.stdout == two.stdout, name
    data = json.loads(one.stdout)
    before = data["fixes"]["columns"][0]
    # (each case is what it says: the provider section stops at a bare chat list and at a line without a timestamp)
    assert (before["provider_cost_usd"] is None) == (data["cost"] is None) == (name != "nameless"), name
    assert any("provider cache not simulated" in n for n in data["fixes"]["notes"]) == (name != "nameless")


def test_the_provider_section_prices_the_requests_fix_prices(cli):
    """On a log whose raw-text lines carry no request body, report's provider section leaves those lines out, as
    fix's measures do, and says so under the section: its total is fix's before column, the text shows the note, and
    the text lists every fork the headline counts as having a fix (FX005's loses no token, behind larger forks)."""
    path = str(PROMPTS / "fix_log.jsonl")
    raw = sum(1 for x in (PROMPTS / "fix_log.jsonl").read_text(encoding="utf-8").splitlines()
              if "body" not in json.loads(x) and "messages" not in json.loads(x))
    assert raw == 3
    rep = cli("report", path, "-t", str(TOK_DIR), "--format", "json")
    fx = cli("fix", path, "-t", str(TOK_DIR), "--format", "json")
    assert rep.exit_code == 1 and fx.exit_code == 1, rep.stderr + fx.stderr
    cost, before = json.loads(rep.stdout)["cost"], json.loads(fx.stdout)["before"]["provider"]
    assert cost is not None and cost["total_usd"] == pytest.approx(before["cost_usd"]) and before["skipped"] == raw
    note = f"{raw} line(s) without a request body (a prompt's text or token IDs) not priced"
    assert note in cost["notes"]
    text = cli("report", path, "-t", str(TOK_DIR)).stdout
    assert f"\n  {note}\n" in text and "no provider cache was simulated" not in text
    forks = json.loads(rep.stdout)["forks"]
    fixable = [f for f in forks if f["fixable"]]
    headline = re.search(r"(\d+) forks? with a fix", text)
    assert headline and int(headline.group(1)) == len(fixable) == 3
    assert fixable[-1]["fixable"] == "FX005" and forks.index(fixable[-1]) >= 5   # (past the top five)
    rows = [ln for ln in text.splitlines() if re.search(r"\bFX00\d\s*$", ln)]
    assert len(rows) == len(fixable) and rows[-1].rstrip().endswith("FX005")


def test_a_fork_in_tools_the_template_wrote_its_own_way_is_at_tools(cli, tmp_path):
    """Langfuse's own events: two apps' requests split where the fixture template renders their tool lists in its own
    words (no tool's JSON is in the text). The fork is at `tools`, where a user would look, with no character offset
    (none inside `tools` is known), in JSON, text and HTML; a fork in text the template wrote for no field stays at
    `<template>` with its offset in the rendered text (fix_log's different apps)."""
    from .conftest import ROOT

    log = ROOT / "fixtures" / "logs" / "langfuse_events.jsonl"
    r = cli("report", str(log), "-t", str(TOK_DIR), "--jobs", "1", "--format", "json")
    forks = json.loads(r.stdout)["forks"]
    # two values at the split: the Anthropic requests' tool list, and none (the OpenAI request has no tools)
    assert [(f["path"], f["char"], f["cause"], f["distinct_values"]) for f in forks] == [
        ("tools", None, "tools_changed", 2)]
    page = tmp_path / "r.html"
    r = cli("report", str(log), "-t", str(TOK_DIR), "--jobs", "1", "--html", str(page))
    assert re.search(r"^tools +tools_changed ", r.stdout, re.M), r.stdout
    html = page.read_text(encoding="utf-8")
    assert "<td><code>tools</code>" in html and "split at tools: tools_changed (2 values)" in html and "char None" not in html

    r = cli("report", str(PROMPTS / "fix_log.jsonl"), "-t", str(TOK_DIR), "--jobs", "1", "--format", "json")
    template = [f for f in json.loads(r.stdout)["forks"] if f["path"] == "<template>"]
    assert template and all(f["cause"] == "different_prompt" and isinstance(f["char"], int) for f in template)


def test_lost_tokens_are_priced_at_the_log_s_one_price_or_each_request_s_own(cli, tmp_path):
    """Dollars lost come from the models the log's lines name, not from the provider simulation: a log without
    timestamps (no provider section) still prices them. A log that mixes models of different prices has each
    request's lost tokens priced at its own model's price (each conversation's figure is its tokens at its model's
    price, not the first model's for every token); --model prices them all at one. `fix` prices what fixing the
    forks saves the same way (:func:`_fix_gain_is_priced_at_each_request_s_model`)."""
    rows = [json.loads(line) for line in LOG.read_text().splitlines()]
    table = PriceTable.load()
    gpt, sonnet = table.lookup("gpt-4.1"), table.lookup("claude-sonnet-4-5")
    rate = (gpt.input - gpt.cache_read) / 1e6
    sonnet_rate = (sonnet.input - sonnet.cache_read) / 1e6
    assert rate != sonnet_rate

    timeless = tmp_path / "timeless.jsonl"
    timeless.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "timestamp"}) + "\n" for r in rows))
    d = json.loads(cli("report", str(timeless), "-t", str(TOK_DIR), "--key", "session", "--jobs", "1",
                       "--format", "json").stdout)
    assert d["cost"] is None and d["price_model"] == "gpt-4.1" and d["price_models"] == ["gpt-4.1"]
    assert d["usd_lost"] == pytest.approx(d["tokens_lost"] * rate) and d["usd_lost"] > 0

    def on_sonnet(r):
        return r["session"].startswith(("s2", "s4"))

    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps(dict(r, body=dict(r["body"], model="claude-sonnet-4-5"))
                                        if on_sonnet(r) else r) + "\n" for r in rows))
    sessions = {r["session"]: on_sonnet(r) for r in rows}
    assert set(sessions.values()) == {True, False}
    d = json.loads(cli("report", str(mixed), "-t", str(TOK_DIR), "--key", "session", "--jobs", "1", "--top", "50",
                       "--format", "json").stdout)
    assert d["cost"]["models"] == ["gpt-4.1", "claude-sonnet-4-5"]
    assert d["price_model"] is None and d["price_models"] == ["gpt-4.1", "claude-sonnet-4-5"]
    worst = d["worst"]
    assert sum(w["tokens_lost"] for w in worst) == d["tokens_lost"] > 0
    assert {sessions[w["key"]] for w in worst} == {True, False}  # (losses on both models' requests)
    for w in worst:
        assert w["usd_lost"] == pytest.approx(w["tokens_lost"] * (sonnet_rate if sessions[w["key"]] else rate))
    assert d["usd_lost"] == pytest.approx(sum(w["usd_lost"] for w in worst))
    assert sum(c["usd_lost"] for c in d["causes"]) == pytest.approx(d["usd_lost"])
    sp = d["shared_prefix"]
    assert sp["tokens_lost"] > 0 and rate * sp["tokens_lost"] <= sp["usd_lost"] <= sonnet_rate * sp["tokens_lost"]
    assert d["total_usd_lost"] == pytest.approx(d["usd_lost"] + sp["usd_lost"])
    assert any(n.startswith("dollars lost: tokens not reused, at each request's model's input price less its "
                            "cache-read price (gpt-4.1 $1.5, claude-sonnet-4-5 $2.7 a million tokens)")
               for n in d["notes"])
    text = cli("report", str(mixed), "-t", str(TOK_DIR), "--key", "session", "--jobs", "1").stdout
    assert f"${d['total_usd_lost']:.4f} at each request's model's prices (gpt-4.1, claude-sonnet-4-5)" in text
    _fix_gain_is_priced_at_each_request_s_model(cli, tmp_path, mixed, {"gpt-4.1": rate, "claude-sonnet-4-5": sonnet_rate})

    d = json.loads(cli("report", str(mixed), "-t", str(TOK_DIR), "--key", "session", "--jobs", "1", "-m", "gpt-4.1",
                       "--format", "json").stdout)
    assert d["price_model"] == "gpt-4.1" and d["usd_lost"] == pytest.approx(d["tokens_lost"] * rate)

    # a mixed log whose losing requests include some that name no model: no figure, not a partial one
    unnamed = tmp_path / "unnamed.jsonl"
    unnamed.write_text("".join(json.dumps(dict(r, body={k: v for k, v in r["body"].items() if k != "model"})
                                          if r["session"].startswith("s3") else
                                          dict(r, body=dict(r["body"], model="claude-sonnet-4-5"))
                                          if on_sonnet(r) else r) + "\n" for r in rows))
    d = json.loads(cli("report", str(unnamed), "-t", str(TOK_DIR), "--key", "session", "--jobs", "1",
                       "--format", "json").stdout)
    assert d["usd_lost"] is None and d["total_usd_lost"] is None and d["price_models"] == [] and d["tokens_lost"]
    assert all(c["usd_lost"] is None for c in d["causes"])
    assert any(n.startswith("no dollar figure for lost tokens: the log's models are priced differently and some "
                            "requests name no model") for n in d["notes"])
    # `fix`: the gain falls on requests that name a model (a figure), or also on some that name none (none, a note)
    f = json.loads(cli("fix", str(unnamed), "-t", str(TOK_DIR), "--key", "session", "--jobs", "1",
                       "--format", "json").stdout)
    assert dict(f["after"]["vllm"]["hit_tokens_by_model"])[None] == dict(f["before"]["vllm"]["hit_tokens_by_model"])[None]
    assert f["cross_request"]["usd_saved"] > 0
    gain_unnamed = tmp_path / "gain_unnamed.jsonl"
    gain_unnamed.write_text("".join(json.dumps(dict(r, body={k: v for k, v in r["body"].items() if k != "model"})
                                               if on_sonnet(r) else
                                               dict(r, body=dict(r["body"], model="claude-sonnet-4-5"))
                                               if r["session"].startswith("s3") else r) + "\n" for r in rows))
    f = json.loads(cli("fix", str(gain_unnamed), "-t", str(TOK_DIR), "--key", "session", "--jobs", "1",
                       "--format", "json").stdout)
    by = [dict(f[m]["vllm"]["hit_tokens_by_model"]) for m in ("before", "after")]
    assert by[1][None] > by[0][None]
    assert f["cross_request"]["usd_saved"] is None and f["cross_request"]["price_models"] == []
    assert any(n.startswith("no dollar figure for the gain across requests: the log's models are priced differently "
                            "and some requests name no model") for n in f["notes"])


def _fix_gain_is_priced_at_each_request_s_model(cli, tmp_path, mixed, rates):
    """`fix` on a log whose models are priced differently: the vLLM hits before and after are split by the model of
    the request that read them, and the gain across requests is priced at each one's model's rate. The split is
    checked against `simulate-prefix replay --per-request` on the log and on the fixed log (each request's hit
    tokens, summed here by its line's model), with no eviction and at a capacity that evicts."""
    models = [json.loads(line)["body"].get("model") for line in mixed.read_text().splitlines()]
    for extra, policy in (([], ["--policy", "infinite"]), (["--capacity-blocks", "400"],
                                                            ["--policy", "vllm", "--capacity-blocks", "400"])):
        fixed = tmp_path / "fixed.jsonl"
        r = cli("fix", str(mixed), "-t", str(TOK_DIR), "--key", "session", "--jobs", "1", *extra, "-o", str(fixed),
                "--format", "json")
        f = json.loads(r.stdout)
        c = f["cross_request"]
        at = "at_capacity" if extra else None
        split = {}
        for name, log in (("before", mixed), ("after", fixed)):
            sim = json.loads(cli("simulate-prefix", "replay", str(log), "-t", str(TOK_DIR), *policy, "--per-request",
                                 "--format", "json").stdout)
            by: dict = {}
            for row in sim["per_request"]:
                by[models[row["index"]]] = by.get(models[row["index"]], 0) + row["hit_tokens"]
            split[name] = by
            assert dict(f[name]["vllm"]["hit_tokens_by_model"]) == by, (name, extra)
            assert c[f"hit_tokens_{name}_at_capacity" if at else f"hit_tokens_{name}"] == sim["hit_tokens"]
        gained = {m: split["after"][m] - split["before"][m] for m in rates}
        assert any(gained.values()), extra
        assert c["price_model"] is None and c["price_models"] == ["gpt-4.1", "claude-sonnet-4-5"]
        assert c["usd_saved"] == pytest.approx(sum(n * rates[m] for m, n in gained.items()))
        assert not any("no dollar figure" in n for n in f["notes"])
    text = cli("fix", str(mixed), "-t", str(TOK_DIR), "--key", "session", "--jobs", "1").stdout
    assert "saved at each request's model's prices (gpt-4.1, claude-sonnet-4-5)" in text
    one = json.loads(cli("fix", str(mixed), "-t", str(TOK_DIR), "--key", "session", "--jobs", "1", "-m", "gpt-4.1",
                         "--format", "json").stdout)
    assert one["before"]["vllm"]["hit_tokens_by_model"] is None and one["cross_request"]["price_model"] == "gpt-4.1"


def test_report_takes_prices_and_its_notes_name_only_flags_it_has(cli, tmp_path):
    """The note on a model the price table lacks points to `--prices FILE` and to `prompt-cost --list-models`:
    `report` takes `--prices` (as `fix` and `prompt-cost` do), and the log is then priced with it."""
    rows = [json.loads(line) for line in LOG.read_text().splitlines()]
    log = tmp_path / "local.jsonl"
    log.write_text("".join(json.dumps(dict(r, body=dict(r["body"], model="my-local-llama"))) + "\n" for r in rows))
    r = cli("report", str(log), "-t", str(TOK_DIR), "--key", "session", "--jobs", "1")
    note = next(line for line in r.stdout.splitlines() if "unknown model 'my-local-llama'" in line)
    assert "cachectl prompt-cost --list-models" in note and "--prices FILE" in note
    prices = tmp_path / "prices.json"
    prices.write_text(json.dumps({"models": {"my-local-llama": {"provider": "openai", "input": 0.5, "output": 1.0,
                                                                "cache_read": 0.05}}}))
    d = json.loads(cli("report", str(log), "-t", str(TOK_DIR), "--key", "session", "--jobs", "1", "--prices",
                       str(prices), "--format", "json").stdout)
    assert d["cost"]["models"] == ["my-local-llama"] and d["price_model"] == "my-local-llama"
    assert d["usd_lost"] == pytest.approx(d["tokens_lost"] * 0.45 / 1e6)


def test_the_page_shows_the_provider_section_as_the_text_does_and_billed_output_is_priced(cli, tmp_path):
    """A recorded Anthropic cassette (its responses bill their output tokens): the HTML page shows the provider
    section's reconciliation against the billed usage and its notes, as the text does; the output tokens the
    responses bill are priced (no note asks to add output_tokens), and no advice names a flag `report` lacks."""
    from .conftest import ROOT

    page = tmp_path / "r.html"
    r = cli("report", str(ROOT / "fixtures" / "logs" / "vcr_anthropic_cache.yaml"), "-t", str(TOK_DIR), "--jobs", "1",
            "--every", "1m", "--html", str(page))
    html = page.read_text(encoding="utf-8")
    billed = re.search(r"against the logged usage: (\$[0-9.]+) billed for 2 requests", r.stdout)
    assert billed and f"Against the logged usage: {billed.group(1)} billed for 2 requests" in html
    assert "reconciliation says why (the `disagree at line N` lines of prompt-cost, the `reconciliation` of its JSON)" in r.stdout
    assert "reconciliation says why (the `disagree at line N` lines of prompt-cost, the `reconciliation` of its JSON)" in html
    assert "output_tokens" not in r.stdout and "output_tokens" not in html


def test_a_bare_list_of_token_ids_is_a_prompt_to_report_as_to_fix(cli, tmp_path):
    """A line that is a JSON list of integers is a token-ID prompt (as `fix`, `simulate-prefix` and the first read
    take it), not a chat list: `report`'s capacity curve reads it as such (it exited 2 on it, 'expected a message
    object', where `fix` ran)."""
    log = tmp_path / "ids.jsonl"
    log.write_text(json.dumps({"timestamp": "2026-11-30T10:00:00Z", "body": {
        "model": "gpt-4.1", "messages": [{"role": "user", "content": "hi there"}]}}) + "\n" + json.dumps(
        list(range(1, 40))) + "\n")
    r = cli("report", str(log), "-t", str(TOK_DIR), "--jobs", "1", "--format", "json")
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["curve"]["requests"] == 2
    assert cli("fix", str(log), "-t", str(TOK_DIR), "--jobs", "1").exit_code == 0


def test_the_page_shows_one_prefix_reuse_the_headlines_in_its_before_column(cli, tmp_path):
    """The page's headline card and its before/after table gave two prefix-reuse figures for one log (69.4% of
    the reusable tokens, and 61.0% of the later requests' tokens, under a label that read as the same thing). The
    table's row is now the headline's measure, taken again on each version."""
    page = tmp_path / "r.html"
    r = cli("report", str(PROMPTS / "fix_log.jsonl"), "-t", str(TOK_DIR), "--format", "json", "--html", str(page))
    assert r.exit_code in (0, 1), r.stderr
    data = json.loads(r.stdout)
    before = data["fixes"]["columns"][0]
    assert (before["pair_reused_tokens"], before["pair_reusable_tokens"]) == (data["reused_tokens"],
                                                                             data["reusable_tokens"])
    import html as html_mod
    import re

    text = re.sub(r"\s+", " ", html_mod.unescape(re.sub(r"<[^>]+>", " ", page.read_text(encoding="utf-8"))))
    row = re.search(r"prefix reuse \(reusable tokens reused within conversations\) ([\d.]+)%", text)
    assert row is not None and row.group(1) + "%" == f"{data['reuse_ratio']:.1%}"
    assert f"{data['reuse_ratio']:.1%} of reusable prefix tokens reused" in text
    assert "tokens shared with the previous request of the conversation" not in text
