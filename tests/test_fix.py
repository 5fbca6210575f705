"""``cachectl fix``: the rewrites remove what diff-tokens finds, safe fixes leave the model's content alone, the
rewritten log still parses and keeps every field, and the before/after numbers are the engines' own.

The fixture (fixtures/prompts/fix_log.jsonl, built by fixtures/make_fix_log.py) has one conversation per cause;
token IDs come from the project's tokenizer (fixtures/tok). The vLLM numbers are checked against the naive
reference replay of tests/reference_prefix.py, not against the engine.
"""

from __future__ import annotations

import json
import sys

import pytest

from cachectl.engines import tokendiff
from cachectl.engines.provider.prices import PriceTable
from cachectl.engines.repair import fix, fixes, groups
from cachectl.inputs import LogRecord, iter_jsonl, parse_request, prompt_from_value

from .conftest import PROMPTS, ROOT, TOK_DIR
from .reference_prefix import NaiveVllm

LOG = PROMPTS / "fix_log.jsonl"


@pytest.fixture(scope="module")
def table():
    return PriceTable.load()


def lines_of(path=LOG, key="session"):
    return groups.log_lines(iter_jsonl(str(path)), source=str(path), key=key)


def reparsed(lines, values):
    return [groups.log_lines([(ln.line, v)], source="fixed", key="session")[0] for ln, v in zip(lines, values)]


def pairs(lines, tok):
    recs = [LogRecord(line=ln.line, key=ln.key, prompt=ln.prompt) for ln in lines]
    return [p for p in tokendiff.diff_log(recs, tok, add_generation_prompt=True)
            if isinstance(p, tokendiff.PairResult)]


@pytest.mark.parametrize("unsafe", [False, True])
def test_fix_removes_every_diff_tokens_finding_it_labels_fixed(tok, table, unsafe):
    lines = lines_of()
    report = fix.fix_log(lines, fix.FixOptions(unsafe=unsafe, key="session"), tokenizer=tok, table=table)
    before = {(p.line_a, p.line_b): p.diff for p in pairs(lines, tok)}
    after = {(p.line_a, p.line_b): p.diff for p in pairs(reparsed(lines, report.output), tok)}
    causes_before = {d.cause.id for d in before.values() if d.cause is not None}
    # every cause in the fixture is one that a fix addresses
    assert causes_before == {"date_time", "tool_schema_key_order", "tool_order", "doubled_bos", "think_stripped"}
    for pair, d in before.items():
        a = after[pair]
        # the pair is labelled fixed for a code when that code rewrote one of its lines and left nothing undone there
        on_pair = [f for f in report.fixes if f.line in pair]
        codes = {f.code for f in on_pair if all(g.applied for g in on_pair if g.code == f.code)}
        fixed_causes = {c for code in codes for c in fixes.CAUSES[code]}
        if d.cause is not None and d.cause.id in fixed_causes:
            assert a.common_prefix_tokens >= d.common_prefix_tokens, pair
            assert a.cause is None or a.cause.id not in fixed_causes, (pair, a.cause)
            assert a.kind in ("a_prefix_of_b", "identical"), (pair, a.kind)
    if unsafe:
        assert all(f.applied for f in report.fixes)
        assert all(d.kind == "a_prefix_of_b" for d in after.values())
    else:
        # only the safe ones: the causes only unsafe fixes address are still there
        assert {f.code for f in report.fixes if not f.applied} == {"FX001", "FX003", "FX004", "FX005"}
        left = {d.cause.id for d in after.values() if d.cause is not None}
        assert left == {"date_time", "tool_order", "doubled_bos", "think_stripped"}


def test_every_fix_code_is_found_on_the_fixture_with_its_label(tok, table):
    report = fix.fix_log(lines_of(), fix.FixOptions(key="session"), tokenizer=tok, table=table)
    found = {(f.code, f.safe) for f in report.fixes}
    # FX007 (a per-user value across requests) needs many users sharing a prefix: tests/test_cross_request.py
    assert {c for c, _ in found} == set(fixes.CODES) - {"FX007"}
    assert ("FX002", True) in found and ("FX006", True) in found
    assert ("FX001", False) in found and ("FX003", False) in found and ("FX004", False) in found
    # reasoning: safe where the template already drops it, unsafe where the model saw it (the tool loop)
    assert ("FX005", True) in found and ("FX005", False) in found


def test_rewritten_requests_still_parse_and_keep_their_shape_and_fields(tok, table, tmp_path):
    log = tmp_path / "log.jsonl"
    rows = [json.loads(x) for x in LOG.read_text(encoding="utf-8").splitlines()]
    for r in rows:  # fields cachectl does not know must survive
        r["x_trace"] = {"span": [1, 2, 3]}
        if "body" in r:
            r["body"]["temperature"] = 0.2
            r["body"]["metadata"] = {"user": "u-1"}
    log.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    lines = lines_of(log)
    report = fix.fix_log(lines, fix.FixOptions(unsafe=True, key="session"), tokenizer=tok, table=table)
    assert report.applied > 0
    for ln, value in zip(lines, report.output):
        assert list(value) == list(ln.value)                       # same top-level fields, same order
        assert value["x_trace"] == {"span": [1, 2, 3]}
        p = prompt_from_value(value, source="fixed", line=ln.line)
        if "body" in value:
            assert list(value["body"]) == list(ln.value["body"])
            assert value["body"]["metadata"] == {"user": "u-1"} and value["body"]["temperature"] == 0.2
            req = parse_request(value, source="fixed", line=ln.line)
            assert req.provider == ln.request.provider and req.model == ln.request.model
            assert p.request is not None
        else:
            assert p.kind == ln.prompt.kind


def _view(ln):
    """What the provider caches, modulo key order: each position's segment, role and parsed content, with a
    one-block list read as its block (a string message becomes one text block when it gets a breakpoint)."""
    out = []
    for p in ln.request.positions:
        v = json.loads(p.content)
        if isinstance(v, list) and len(v) == 1:
            v = v[0]
        out.append((p.segment, p.role, v))
    return out


def _render(tok, ln):
    """The chat template's render with each tool's keys sorted (so that key order alone is not a change)."""
    from dataclasses import replace

    p = ln.prompt
    tools = tuple(json.loads(json.dumps(t, sort_keys=True)) for t in p.tools) if p.tools else p.tools
    return tok.render_chat(replace(p, tools=tools), add_generation_prompt=True)


def test_safe_fixes_do_not_change_what_the_model_sees_and_unsafe_ones_do(tok, table):
    lines = lines_of()
    report = fix.fix_log(lines, fix.FixOptions(unsafe=True, key="session"), tokenizer=tok, table=table)
    after = reparsed(lines, report.output)
    by_line: dict[int, set] = {}
    for f in report.fixes:
        by_line.setdefault(f.line, set()).add((f.code, f.safe))
    checked_safe = checked_unsafe = 0
    for ln, new in zip(lines, after):
        labels = by_line.get(ln.line)
        if not labels:
            assert new.value == ln.value
            continue
        same_render = (_render(tok, ln) == _render(tok, new)) if ln.prompt.is_chat else \
            (ln.prompt.text == new.prompt.text)
        if all(safe for _, safe in labels):
            checked_safe += 1
            assert same_render, (ln.line, labels)
            if not any(code == "FX005" for code, _ in labels):  # reasoning drops are proven on the render only
                assert _view(ln) == _view(new), (ln.line, labels)
        else:
            checked_unsafe += 1
            assert not same_render, (ln.line, labels)
    assert checked_safe >= 5 and checked_unsafe >= 4


def test_before_after_hit_rate_and_dollars_are_measured(tok, table, cli, tmp_path):
    out = tmp_path / "fixed.jsonl"
    r = cli("fix", LOG, "--tokenizer", TOK_DIR, "--unsafe-fixes", "--capacity-blocks", "4096", "--out", out,
            "--format", "json")
    assert r.exit_code == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["schema_version"] == 1 and doc["grouping"]["count"] == 6 and doc["grouping"]["how"] == "automatic"

    def naive_hits(path):
        values = [v for _, v in iter_jsonl(str(path))]
        prompts = [prompt_from_value(v, source="x", line=i) for i, v in enumerate(values)]
        ref = NaiveVllm(4096, 16)
        toks = tok.tokenize_many(prompts, add_generation_prompt=True)
        return sum(ref.run(list(t.ids)) for t in toks), sum(len(t.ids) for t in toks)

    for side, path in (("before", LOG), ("after", out)):
        hits, total = naive_hits(path)
        v = doc[side]["vllm"]
        assert (v["policy"], v["capacity_blocks"], v["hit_tokens"], v["query_tokens"]) == ("vllm", 4096, hits, total)
    assert doc["after"]["vllm"]["hit_rate"] > doc["before"]["vllm"]["hit_rate"] + 0.1
    pb, pa = doc["before"]["provider"], doc["after"]["provider"]
    assert pa["cost_usd"] < pb["cost_usd"] and pa["cache_read_tokens"] > pb["cache_read_tokens"]
    assert pb["requests"] == 15 and pb["skipped"] == 3      # the raw-text lines have no provider body
    gains = {c["code"]: c for c in doc["per_cause"]}
    assert gains["FX001"]["reused_tokens"] > 0 and gains["FX004"]["reused_tokens"] > 0
    assert sum(c["reused_tokens"] for c in doc["per_cause"]) == \
        doc["after"]["pair_reused_tokens"] - doc["before"]["pair_reused_tokens"]

    text = cli("fix", LOG, "--tokenizer", TOK_DIR, "--unsafe-fixes", "--capacity-blocks", "4096")
    assert text.exit_code == 1
    for label in ("vLLM prefix hit rate", "provider cost", "tokens reused per fix", "FX001 volatile_to_end"):
        assert label in text.stdout


def test_out_copies_unchanged_lines_byte_for_byte_and_diff_writes_nothing(cli, tmp_path):
    out = tmp_path / "fixed.jsonl"
    r = cli("fix", LOG, "--tokenizer", TOK_DIR, "--out", out)
    assert r.exit_code == 1, r.stderr
    src = LOG.read_bytes().splitlines()
    got = out.read_bytes().splitlines()
    assert len(src) == len(got)
    changed = [i for i, (a, b) in enumerate(zip(src, got)) if a != b]
    assert changed and len(changed) < len(src)
    assert b'"session": "bos"' in src[3] and src[3] == got[3]       # a line without a safe fix: untouched

    d = tmp_path / "d.jsonl"
    r = cli("fix", LOG, "--tokenizer", TOK_DIR, "--diff", "--select", "FX001", "--unsafe-fixes")
    assert r.exit_code == 1
    assert "-Current time: 2026-11-30T10:00:00Z" in r.stdout and not d.exists()
    bad = cli("fix", LOG, "--diff", "--out", d)
    assert bad.exit_code == 2 and "--diff" in bad.stderr and not d.exists()
    js = cli("fix", LOG, "--tokenizer", TOK_DIR, "--diff", "--select", "FX001", "--unsafe-fixes", "--format", "json")
    assert js.exit_code == 1 and json.loads(js.stdout)["changed_lines"]   # (stdout stays one JSON document)
    assert "cachectl: note: --diff shows with the text output; the JSON lists the lines rewritten (changed_lines)" in js.stderr


def test_a_clean_log_needs_no_fix(cli, tmp_path, tok):
    fixed = tmp_path / "fixed.jsonl"
    assert cli("fix", LOG, "--tokenizer", TOK_DIR, "--unsafe-fixes", "--out", fixed).exit_code == 1
    again = cli("fix", fixed, "--tokenizer", TOK_DIR, "--unsafe-fixes")
    assert again.exit_code == 0, again.stdout
    assert "nothing to fix" in again.stdout


def test_bad_input_is_one_line_exit_2(cli, tmp_path):
    log = tmp_path / "bad.jsonl"
    log.write_text('{"body": {"messages": [{"role": "user", "content": "hi"}]}}\n{"body": {"messages": 3}}\n')
    r = cli("fix", log)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "bad.jsonl" in r.stderr and ":2" in r.stderr
    r = cli("fix", LOG, "--key", "nope")
    assert r.exit_code == 2 and "missing conversation key" in r.stderr
    r = cli("fix", LOG, "--select", "FX999")
    assert r.exit_code == 2 and "FX999" in r.stderr


def test_a_malformed_usage_ends_fix_and_report_with_exit_2_and_a_log_without_times_runs_on(cli, tmp_path):
    """A value a line holds that cannot be read (a usage count that is not a number) is bad input wherever it is first
    read: `fix` and `report` both exit 2 with one line naming the file, line and field (one process or two), and
    `fix -o` writes nothing. A log that only lacks something (timestamps) is not priced, with a note, and runs on."""
    rows = [json.loads(line) for line in LOG.read_text().splitlines()]
    assert "body" in rows[2]
    bad, out = tmp_path / "bad.jsonl", tmp_path / "out.jsonl"
    bad.write_text("".join(json.dumps(dict(r, usage={"prompt_tokens": "many"}) if i == 2 else r) + "\n"
                           for i, r in enumerate(rows)))
    for args in (("fix", bad, "-o", out), ("report", bad)):
        for jobs in ("1", "2"):
            r = cli(*args, "--tokenizer", TOK_DIR, "--jobs", jobs)
            assert r.exit_code == 2, (args, jobs, r.stdout)
            assert r.stderr.count("\n") == 1 and "bad.jsonl:3: field 'usage.prompt_tokens': expected an integer" in r.stderr
    assert not out.exists()

    timeless = tmp_path / "timeless.jsonl"
    timeless.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "timestamp"}) + "\n" for r in rows))
    r = cli("fix", timeless, "--tokenizer", TOK_DIR, "--jobs", "1", "--format", "json")
    assert r.exit_code == 1
    assert any(n.startswith("provider cache not simulated: ") and "no timestamp" in n for n in json.loads(r.stdout)["notes"])


def test_grouping_without_a_key_finds_the_conversations(tok):
    keyed = lines_of()
    auto = lines_of(key=None)
    g = groups.group_sessions(auto, tokenizer=tok)
    k = groups.group_sessions(keyed, key="session")
    assert g.count == k.count == 6 and g.groups == k.groups
    # the conversations are 30 s apart: a 10 s window closes each one after every request
    short = groups.group_sessions(auto, tokenizer=tok, window_s=10)
    assert short.count == len(auto)


def test_chat_lists_get_the_value_at_the_end_of_the_last_user_turn(tok, table):
    system = "You are a cache assistant.\nToday is 2026-11-30 10:00 UTC.\nAnswer briefly."
    later = system.replace("10:00", "10:05")
    rows = [[{"role": "system", "content": system}, {"role": "user", "content": "one"}],
            [{"role": "system", "content": later}, {"role": "user", "content": "one"},
             {"role": "assistant", "content": "ok"}, {"role": "user", "content": "two"}]]
    lines = groups.log_lines(enumerate(rows, start=1), source="chat.jsonl")
    report = fix.fix_log(lines, fix.FixOptions(unsafe=True), tokenizer=tok, table=table)
    assert [f.code for f in report.fixes] == ["FX001", "FX001"]
    first, second = report.output
    assert first[0]["content"] == second[0]["content"] == "You are a cache assistant.\nAnswer briefly."
    assert first[-1]["content"] == "one\n\nToday is 2026-11-30 10:00 UTC."
    assert second[1] == first[1]                      # the history carries the turn as it was sent
    assert second[-1]["content"] == "two\n\nToday is 2026-11-30 10:05 UTC."


def test_a_tool_loop_gets_a_trailing_system_message_on_openai(tok, table):
    def body(t, extra):
        return {"model": "gpt-4.1", "messages": [{"role": "system", "content": f"Clock: {t}\nBe brief."},
                                                 {"role": "user", "content": "find it"}, *extra]}

    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}
    res = {"role": "tool", "tool_call_id": "call_1", "content": "found"}
    rows = [{"timestamp": 0, "body": body("09:00:00", [])},
            {"timestamp": 5, "body": body("09:00:05", [call, res])}]
    lines = groups.log_lines(enumerate(rows, start=1), source="loop.jsonl")
    report = fix.fix_log(lines, fix.FixOptions(unsafe=True), tokenizer=tok, table=table)
    msgs = report.output[1]["body"]["messages"]
    assert msgs[-1] == {"role": "system", "content": "Clock: 09:00:05"}
    assert msgs[1]["content"] == "find it\n\nClock: 09:00:00"   # the first request's turn, carried
    assert "FX001" in {f.code for f in report.fixes}
    assert any("trailing system message" in f.message for f in report.fixes)


def test_an_anthropic_breakpoint_the_next_request_cannot_read_moves_to_the_last_stable_position(tok, table):
    from .test_request_model import long_text

    system = [{"type": "text", "text": long_text(3, 6000)}]
    cc = {"type": "ephemeral"}

    def body(messages):
        return {"model": "claude-sonnet-4-5", "max_tokens": 100, "system": system, "messages": messages}

    # the client adds a per-request context block to the newest turn only, and marks that block
    r1 = body([{"role": "user", "content": [{"type": "text", "text": "first question"},
                                            {"type": "text", "text": "context one", "cache_control": cc}]}])
    r2 = body([{"role": "user", "content": [{"type": "text", "text": "first question"}]},
               {"role": "assistant", "content": "an answer"},
               {"role": "user", "content": [{"type": "text", "text": "second question"},
                                            {"type": "text", "text": "context two", "cache_control": cc}]}])
    rows = [{"timestamp": 0, "body": r1}, {"timestamp": 30, "body": r2}]
    lines = groups.log_lines(enumerate(rows, start=1), source="cc.jsonl")
    report = fix.fix_log(lines, fix.FixOptions(), tokenizer=tok, table=table)
    first = [f for f in report.fixes if f.line == 1]
    assert [(f.code, f.safe, f.applied) for f in first] == [("FX006", True, True)]
    blocks = report.output[0]["body"]["messages"][0]["content"]
    assert "cache_control" in blocks[0] and "cache_control" not in blocks[1]
    # the write now lands where the second request reads it
    before = report.before.provider
    after = report.after.provider
    assert before.cache_read_tokens == 0 and after.cache_read_tokens > 1024
    assert after.cost_usd < before.cost_usd


def test_fix_and_report_never_overwrite_their_input(cli, tmp_path):
    log = tmp_path / "log.jsonl"
    log.write_bytes(LOG.read_bytes())
    link = tmp_path / "link.jsonl"
    link.symlink_to(log)
    for args in (["fix", str(log), "--out", str(log)], ["fix", str(log), "--out", str(link)],
                 ["report", str(log), "-t", TOK_DIR, "--html", str(log)]):
        r = cli(*args)
        assert r.exit_code == 2 and "refusing to overwrite an input" in r.stderr, (args, r.stderr)
    r = cli("fix", str(log), "--out", "-")
    assert r.exit_code == 2 and "--out -" in r.stderr
    assert log.read_bytes() == LOG.read_bytes()


def test_fix_and_report_share_window_chat_template_and_model_checks(cli):
    # --window takes a duration in both commands (a bare number is seconds)
    a = cli("report", str(LOG), "-t", TOK_DIR, "--window", "30m", "-f", "json")
    b = cli("report", str(LOG), "-t", TOK_DIR, "--window", "1800", "-f", "json")
    assert a.exit_code in (0, 1) and a.stdout == b.stdout
    r = cli("fix", str(LOG), "--window", "soon")
    assert r.exit_code == 2 and "--window" in r.stderr
    # an unknown price model is refused before any work, pointing at the command that lists prices
    for args in (["fix", str(LOG), "--model", "nosuch-model"], ["report", str(LOG), "-t", TOK_DIR, "-m", "nosuch"]):
        r = cli(*args)
        assert r.exit_code == 2 and "prompt-cost --list-models" in r.stderr, r.stderr
    r = cli("fix", str(LOG), "--chat-template", str(ROOT / "fixtures" / "chat_templates" / "Apertus-8B-Instruct.jinja"))
    assert r.exit_code == 2 and "--chat-template needs --tokenizer" in r.stderr


def test_out_keeps_an_untouched_line_s_bytes_and_its_crlf_from_a_file_stdin_or_gzip(cli, tmp_path):
    """--out reads the log again as it writes it: a line no fix touches is its own bytes (CRLF kept, compact or
    spaced JSON as it was), a rewritten line is the value serialized in the line's separators style, ending as the
    line did; stdin (copied once) and gzip give the same bytes."""
    import gzip

    src = LOG.read_bytes().splitlines()
    log = tmp_path / "crlf.jsonl"
    log.write_bytes(b"".join(line + b"\r\n" for line in src[:-1]) + src[-1])   # the last line ends nowhere
    out = tmp_path / "fixed.jsonl"
    r = cli("fix", log, "--tokenizer", TOK_DIR, "--out", out, "--format", "json")
    assert r.exit_code == 1, r.stderr
    changed = json.loads(r.stdout)["changed_lines"]
    got = out.read_bytes().splitlines(keepends=True)
    assert len(got) == len(src) and 4 not in changed and changed
    assert got[3] == src[3] + b"\r\n" and b'"session": "bos"' in got[3]         # untouched: byte for byte
    assert got[-1] == src[-1] or (len(src) in changed and not got[-1].endswith(b"\n"))  # (no line end: none)
    assert changed[0] < len(src)
    first = got[changed[0] - 1]
    assert first.endswith(b"}\r\n") and b'": ' in first   # rewritten, spaced, its own line end kept
    assert first != src[changed[0] - 1] + b"\r\n"
    packed = tmp_path / "crlf.jsonl.gz"
    packed.write_bytes(gzip.compress(log.read_bytes()))
    for args, stdin in (([log], None), (["-"], log.read_bytes().decode()), ([packed], None)):
        again = tmp_path / "again.jsonl"
        assert cli("fix", *args, "--tokenizer", TOK_DIR, "--out", again, input=stdin).exit_code == 1
        assert again.read_bytes() == out.read_bytes(), args


def test_out_keeps_blank_lines_the_bom_and_a_last_line_without_its_end(cli, tmp_path):
    """Blank lines were left out of the log written, line 1's BOM was dropped and a last line without a line end
    was given one: every line no fix touches is now its own bytes, blank ones too, and a rewritten line keeps the
    BOM and the end (or none) its line had."""
    src = LOG.read_bytes().splitlines()
    log = tmp_path / "blanks.jsonl"
    body = [b"\xef\xbb\xbf" + src[0] + b"\n", b"\n", b"  \t\n"] + [x + b"\n" for x in src[1:-1]] + [b"\n", src[-1]]
    log.write_bytes(b"".join(body))
    out = tmp_path / "fixed.jsonl"
    r = cli("fix", log, "--tokenizer", TOK_DIR, "--unsafe-fixes", "--out", out, "--format", "json")
    assert r.exit_code == 1, r.stderr
    changed = json.loads(r.stdout)["changed_lines"]  # (the input's own line numbers, blank lines counted)
    got = out.read_bytes().splitlines(keepends=True)
    assert len(got) == len(body) and got[1:3] == body[1:3] and got[-2] == b"\n"
    assert 1 in changed and len(body) in changed  # (both ends of the log are rewritten here)
    assert got[0].startswith(b"\xef\xbb\xbf{") and got[0].endswith(b"}\n") and got[0] != body[0]
    assert got[-1].endswith(b"}") and got[-1] != body[-1]
    for n, (a, b) in enumerate(zip(body, got), start=1):
        assert (a == b) != (n in changed), n
    # nothing to rewrite: the same bytes, whatever the file holds
    plain = tmp_path / "plain.jsonl"
    plain.write_bytes(b'\xef\xbb\xbf{"prompt": "hello world"}\r\n\n\n   \n{"prompt": "unrelated text"}')
    r = cli("fix", plain, "--tokenizer", TOK_DIR, "--out", out)
    assert r.exit_code == 0, r.stderr
    assert out.read_bytes() == plain.read_bytes()


def test_the_prefix_paths_fx001_keeps_a_line_are_shared_by_lines_alike(tok, table, monkeypatch):
    """FX001 and FX007 keep each line's cached-prefix and head paths while they run: lines with the same paths share
    one pair of frozensets (a set a line was 12.6 MB on 20,000 requests), and the fixes are the same as with a pair
    a line."""
    from cachectl.engines.repair.fixes import fx001_volatile_to_end as fx001

    kept: list = []
    real_head = fx001._head

    def head(heads, i, req):
        got = real_head(heads, i, req)
        if isinstance(heads, fx001.Heads):
            kept.append(got)
        return got

    lines = lines_of()
    opts = fix.FixOptions(key="session", unsafe=True)
    with monkeypatch.context() as m:
        m.setattr(fx001, "_head", head)
        shared = fix.fix_log(lines, opts, tokenizer=tok, table=table, source=str(LOG))
    sets = [k for k in kept if k is not None]
    assert len(sets) > len({id(k) for k in sets}) == len(set(sets))  # (one object per distinct set of paths)
    with monkeypatch.context() as m:  # a frozenset a line, as before
        m.setattr(fx001.Heads, "same", lambda self, paths: paths)
        own = fix.fix_log(lines, opts, tokenizer=tok, table=table, source=str(LOG))
    assert shared.to_dict() == own.to_dict() and list(shared.output) == list(own.output)


@pytest.mark.parametrize("path", [PROMPTS / "shared_prefix_log.jsonl", PROMPTS / "agent_log.jsonl", LOG])
def test_fx001_reads_each_line_as_rewritten_at_most_once(tok, table, monkeypatch, path):
    """FX001's three steps (the volatile values two turns show, the lines the fork analysis moves, the moves) parse
    a line as the codes before it left it once at most: the lines the analysis moves take their head's paths from
    the first step's read."""
    from collections import Counter

    from cachectl.engines.repair.fixes import fx001_volatile_to_end as fx001
    from cachectl.engines.repair.fixes.rewriter import Rewriter

    reads: Counter = Counter()
    real_current = Rewriter.current

    def current(self, i):
        f = sys._getframe(1)
        while f is not None and (f.f_code.co_name, f.f_code.co_filename) != ("apply", fx001.__file__):
            f = f.f_back
        if f is not None:  # (FX001's reads; FX007, which runs after it, reads the lines it moves as they are then)
            reads[i] += 1
        return real_current(self, i)

    lines = lines_of(path, key=None)
    opts = fix.FixOptions(unsafe=True)
    monkeypatch.setattr(Rewriter, "current", current)
    got = fix.fix_log(lines, opts, tokenizer=tok, table=table, source=str(path))
    assert any(f.code == "FX001" for f in got.fixes) and reads and max(reads.values()) == 1


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_fx001_after_a_request_that_ends_with_an_assistant_turn(tok, table, tmp_path, provider):
    """A request that ends with an assistant turn after another one (no user turn, no prefill to put the value
    before): OpenAI's gets a trailing system message; Anthropic's, whose messages have no system role, has no place
    after its prefix, and says so (the provider as the line was read: the rewrite keeps it)."""
    log = tmp_path / f"{provider}.jsonl"
    with log.open("w") as f:
        for day in (14, 15):
            turns = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a"},
                     {"role": "assistant", "content": "b"}]
            system = f"You are a bot.\nToday is 2025-03-{day}."
            body = ({"model": "gpt-4o", "messages": [{"role": "system", "content": system}, *turns]}
                    if provider == "openai" else {"model": "claude-sonnet-4-5", "max_tokens": 9, "system": system,
                                                  "messages": turns})
            f.write(json.dumps({"session": "s", "body": body}) + "\n")
    report = fix.fix_log(lines_of(log), fix.FixOptions(key="session", unsafe=True), tokenizer=tok, table=table)
    held = fix.fix_log(list(lines_of(log)), fix.FixOptions(key="session", unsafe=True), tokenizer=tok, table=table)
    assert held.to_dict() == report.to_dict() and list(held.output) == list(report.output)  # (lines in memory)
    moved = [f for f in report.fixes if f.code == "FX001"]
    if provider == "openai":
        assert [f.line for f in moved] == [1, 2] and all("a trailing system message" in f.message for f in moved)
        assert [report.output[k]["body"]["messages"][-1] for k in (0, 1)] == [
            {"role": "system", "content": f"Today is 2025-03-{day}."} for day in (14, 15)]
    else:
        assert not moved and [report.output[k] for k in (0, 1)] == [json.loads(x) for x in log.read_text().splitlines()]
        assert [n for n in report.notes if "no place after its prefix" in n] == [
            f"line {k}: a volatile value was found but the request has no place after its prefix to move it to"
            for k in (1, 2)]


def test_fx002_sorts_only_the_tools_seen_with_their_keys_in_another_order(tok, table, tmp_path):
    """A tool sent with its keys in two orders is sorted everywhere; one whose values differ (an int and a float
    of one value, equal in Python) is another tool, left as it is."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "default": 1}}}
    flipped = {"function": {"parameters": {"default": 1, "type": "object"}, "name": "f"}, "type": "function"}
    floaty = {"type": "function", "function": {"name": "g", "parameters": {"default": 1.0, "type": "object"}}}
    inty = {"type": "function", "function": {"name": "g", "parameters": {"default": 1, "type": "object"}}}
    null = {"type": "function", "function": {"name": "h", "parameters": {"default": None}}}
    log = tmp_path / "tools.jsonl"
    with log.open("w") as f:
        for k, tools in enumerate([[tool, floaty, null], [flipped, inty, null], [tool, floaty, null]]):
            body = {"model": "gpt-4o", "messages": [{"role": "user", "content": f"q{k}"}], "tools": tools}
            f.write(json.dumps({"session": "s", "body": body}) + "\n")
    report = fix.fix_log(lines_of(log), fix.FixOptions(key="session"), tokenizer=tok, table=table)
    fx002 = [(f.line, f.path) for f in report.fixes if f.code == "FX002"]
    assert fx002 == [(1, "body.tools[0]"), (2, "body.tools[0]"), (3, "body.tools[0]")]


def test_a_line_with_an_image_is_left_out_of_report_and_fix_and_said(cli, tmp_path):
    """A request with an image part has no token IDs without the model's processor. ``report`` and ``fix`` leave
    its line out, and say so first among their notes. Every figure is then the figure of the log without that
    line; ``fix -o`` writes the line back byte for byte. A log of nothing else still ends with the line's error
    (exit 2), and ``diff-tokens --log`` still stops on it."""
    src = LOG.read_bytes().splitlines(keepends=True)
    image = json.loads(src[2])
    image["body"]["messages"][-1]["content"] = [{"type": "text", "text": "what is this?"},
                                                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]
    raw = (json.dumps(image) + "\n").encode()
    with_image, without = tmp_path / "with.jsonl", tmp_path / "without.jsonl"
    with_image.write_bytes(b"".join(src[:3] + [raw] + src[3:]))
    without.write_bytes(b"".join(src))
    args = ("-t", TOK_DIR, "--format", "json")

    def figures(path):
        r = cli("report", path, *args)
        assert r.exit_code == 1, r.stderr
        out = json.loads(r.stdout)
        return out, (out["requests"], out["reused_tokens"], out["total_tokens_lost"], out["cost"]["total_usd"],
                     out["curve"]["ceiling_hit_rate"], [c["tokens_lost"] for c in out["causes"]])

    got, want = figures(with_image), figures(without)
    assert got[1] == want[1]
    note = ("1 line left out: a request holds a content part (image, audio, document or file) that has no token IDs "
            "without the model's processor (the first: line 4, body.messages[1].content[1]); every figure is of the "
            "other requests")
    assert got[0]["notes"][0] == note and note not in want[0]["notes"]
    out = tmp_path / "fixed.jsonl"
    r = cli("fix", with_image, *args, "--unsafe-fixes", "-o", out)
    assert r.exit_code == 1 and json.loads(r.stdout)["notes"][0] == note, r.stderr
    written = out.read_bytes().splitlines(keepends=True)
    assert len(written) == len(src) + 1 and written[3] == raw and written[0] != src[0]  # (line 1 is rewritten)
    text = cli("fix", with_image, "-t", TOK_DIR, "--unsafe-fixes", "-o", tmp_path / "again.jsonl")
    assert (f"({len(json.loads(r.stdout)['changed_lines'])} of {len(src)} requests rewritten; 1 line left out, copied "
            "as it was)") in text.stdout, text.stdout
    only = tmp_path / "only.jsonl"
    only.write_bytes(raw)
    for command in (("report", only, *args), ("fix", only, *args), ("diff-tokens", "--log", with_image, "-t", TOK_DIR)):
        r = cli(*command)
        assert r.exit_code == 2 and "cannot be rendered to token IDs without the model's processor" in r.stderr


def test_a_token_id_past_32_bits_is_one_located_line_for_report_and_fix(cli, tmp_path):
    """4294967296 was an internal OverflowError in report (token IDs are kept as 32-bit arrays) and passed in fix."""
    log = tmp_path / "ids.jsonl"
    log.write_text(json.dumps({"prompt": "hello world"}) + "\n" + json.dumps({"prompt_token_ids": [1, 2**32]}) + "\n")
    for args in (["report", log, "-t", TOK_DIR], ["fix", log, "-t", TOK_DIR, "-o", tmp_path / "out.jsonl"]):
        r = cli(*args)
        assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.stderr
        assert "ids.jsonl:2: field 'prompt_token_ids[1]': token ID 4294967296 is past 4,294,967,295" in r.stderr
    assert not (tmp_path / "out.jsonl").exists()
    log.write_text(json.dumps({"prompt_token_ids": [1, 2**32 - 1]}) + "\n")
    assert cli("report", log, "-t", TOK_DIR).exit_code == 0


def test_a_newline_in_a_file_name_is_shown_escaped(cli, tmp_path):
    log = tmp_path / "a\nb.jsonl"
    log.write_bytes(LOG.read_bytes())
    out = tmp_path / "o\nut.jsonl"
    r = cli("fix", log, "-t", TOK_DIR, "-o", out)
    assert r.exit_code == 1 and out.exists()
    assert "a\\nb.jsonl: " in r.stdout and f"wrote {tmp_path}/o\\nut.jsonl (" in r.stdout
    r = cli("report", log, "-t", TOK_DIR)
    assert r.exit_code in (0, 1) and r.stdout.splitlines()[0].startswith(f"{tmp_path}/a\\nb.jsonl: ")


@pytest.mark.parametrize("args", [["fix", LOG, "-o", ""], ["report", LOG, "-t", TOK_DIR, "--html", ""]])
def test_an_empty_output_name_is_refused(cli, args):
    r = cli(*args)  # (it said "cannot write : is a directory")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "takes a file name, and was given an empty one" in r.stderr
