"""The log kept on disk (cachectl/engines/repair/store.py): values come back equal; the fix codes' rewrites kept as
edits (cachectl/engines/repair/edits.py): a rewrite is kept when it is set (never through an object held), as the
smallest paths that differ; and fix and report give the same output with a line cache of two objects as with the
default."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from cachectl.engines.repair import store
from cachectl.engines.repair.edits import Edits
from cachectl.engines.repair.groups import log_lines
from cachectl.inputs import iter_jsonl

ROOT = Path(__file__).resolve().parent.parent
LOGS = [ROOT / "fixtures" / "prompts" / "fix_log.jsonl", ROOT / "fixtures" / "prompts" / "agent_log.jsonl"]


def test_spool_round_trips_values_pickle_keeps_exactly():
    sp = store.Spool()
    values = [{"b": 1, "a": [1.5, math.inf, None, "\ud800 lone surrogate", 2**80]}, "x" * 10_000, [], {}]
    ks = [sp.put(v) for v in values]
    assert ks == [0, 1, 2, 3] and len(sp) == 4
    back = [sp.get(k) for k in ks]
    assert back[1:] == values[1:]
    assert list(back[0]) == ["b", "a"] and back[0]["a"][1] == math.inf and back[0]["a"][4] == 2**80
    assert back[0]["a"][3] == "\ud800 lone surrogate"


@pytest.mark.parametrize(("value", "as_json"), [
    ({"b": 1, "a": [1.5, -0.0, 1.0, 1, True, None, "\u00e9", {"z": {}, "y": []}]}, True),
    ("x" * 10_000, True), ([], True),
    # JSON cannot hold these exactly: pickled
    ({"a": [math.nan]}, False), ({"a": math.inf}, False), ({"a": 2**80}, False), ({"a": "\ud800 lone"}, False),
    ({"a": (1, 2)}, False), ({1: "a key that is no string"}, False),
], ids=["json", "long-string", "empty", "nan", "inf", "big-int", "surrogate", "tuple", "int-key"])
def test_line_store_values_read_back_exactly(value, as_json):
    data = store._packed(value)
    assert (data[:1] != b"\x80") == as_json
    back = store._unpacked(data)
    assert repr(back) == repr(value) and back is not value  # (types too: 1.0 a float, True a bool, NaN a NaN)


_LINES = [{"a": 1, "b": [1.5, None, "\u00e9"]}, {"a": None}, {"a": math.nan}, {"n": 2**70}, {"a": "\ud800 lone"}]
_REWRITES = [
    {"a": 1, "b": [1.5, None, "\u00e9"]}, {"b": [1.5, None, "\u00e9"], "a": 1}, {"a": 1.0, "b": [1.5, None, "\u00e9"]},
    {"a": True, "b": [1.5, None, "\u00e9"]}, {"a": None}, {"a": math.nan}, {"a": math.inf}, {"a": -math.inf},
    {"n": 2**70}, {"n": 2**70 + 1}, {"a": "\ud800 lone"}, {"a": "\ud801 lone"}, {"a": (None,)}, {"a": [None]}, {},
]


@pytest.mark.parametrize("i", range(len(_LINES)))
def test_a_rewrite_differs_from_its_line_where_its_json_text_does(i):
    """``fix`` writes a rewritten line, and names it changed, where its JSON text differs from the line's own
    (compact's): the store compares orjson's bytes of the two where it can, and the texts where orjson writes a NaN
    or an infinity as null or refuses a value, so every pair here is decided as their texts decide it."""
    from cachectl.inputs.request import compact

    lines = store.LineStore(lambda value, line, key, ts: value)
    for n, value in enumerate(_LINES):
        lines.append(type("Line", (), {"value": value, "line": n + 1, "timestamp": None, "key": None,
                                       "request": None, "prompt": type("P", (), {"kind": "chat"})()})())
    for new in _REWRITES:
        assert lines.differs(i, new) == (compact(new) != compact(_LINES[i])), (new, _LINES[i])


def _edits(originals):
    return Edits(len(originals), lambda i: json.loads(json.dumps(originals[i])))


def test_edits_read_fresh_copies_and_keep_each_rewrite_at_once():
    """No object is held: a change made to a value read changes nothing until it is set back, and a rewrite is
    kept the moment it is set (nothing is written back later, so nothing can be lost)."""
    originals = [{"i": i, "msgs": [{"content": f"m{i}"}]} for i in range(6)]
    vs = _edits(originals)
    v = vs[0]
    v["msgs"][0]["content"] = "changed in place"
    assert vs[0] == originals[0] and not vs.changed(0)     # not set back: nothing changed
    vs[0] = v
    v["msgs"][0]["content"] = "after it was set"           # the caller's object is not kept
    vs[3] = {"replaced": True}
    assert vs[0]["msgs"][0]["content"] == "changed in place" and vs.changed(0)
    assert vs.edits(0) == [(("msgs", 0, "content"), "changed in place")]   # the smallest path that differs
    assert vs[3] == {"replaced": True} and vs[3] is not vs[3]
    assert [vs[i] for i in (1, 2, 4, 5)] == [originals[i] for i in (1, 2, 4, 5)]
    assert vs[1:3] == originals[1:3] and list(vs)[5] == originals[5] and vs[-1] == originals[5]
    assert originals[0]["msgs"][0]["content"] == "m0"  # the base is never changed
    with pytest.raises(IndexError):
        vs[6]


def test_edits_keep_only_what_changed_one_copy_of_each_new_value():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"b": 1, "a": 2}}},
             {"name": "g", "description": "d"}]
    originals = [{"i": i, "body": {"messages": [f"m{i}"], "tools": tools}} for i in range(50)]
    vs = _edits(originals)
    for i in range(50):
        vs[i] = vs[i]          # set back unchanged: no edit
    assert not any(vs.changed(i) for i in range(50)) and not any(vs._edits)
    for i in range(50):        # FX002: every request's tools sorted into one list
        v = vs[i]
        v["body"]["tools"] = [json.loads(json.dumps(t, sort_keys=True)) for t in v["body"]["tools"]]
        vs[i] = v
        vs[i] = v              # the same rewrite again: no edit
    assert all(len(vs._edits[i]) == 3 for i in range(50))            # one edit a line: (version, path, bytes)
    assert len({id(vs._edits[i][2]) for i in range(50)}) == 1        # one bytes object for the 50 lists
    assert len({id(vs._edits[i][1]) for i in range(50)}) == 1        # and one path
    assert len({id(vs._edits[i]) for i in range(50)}) == 2           # and one line's edits for the 49 after the first
    for i in range(0, 50, 2):   # a second rewrite on some lines: their edits apply in order, shared or not
        v = vs[i]
        v["body"]["messages"] = ["same"] if i % 4 else [f"own {i}"]
        vs[i] = v
    assert all(vs[i]["body"]["messages"] == (["same"] if i % 4 else [f"own {i}"]) for i in range(0, 50, 2))
    assert all(vs[i]["body"]["messages"] == [f"m{i}"] and vs.changed(i) for i in range(1, 50, 2))
    assert len({id(vs._edits[i]) for i in range(2, 50, 4)}) == 2     # the lines rewritten alike share theirs
    assert len({id(vs._edits[i]) for i in range(0, 50, 4)}) == 13    # the others keep their own
    assert vs.edits(7) == [(("body", "tools"), [json.loads(json.dumps(t, sort_keys=True)) for t in tools])]
    assert list(vs[7]["body"]["tools"][0]) == ["function", "type"] and vs[7]["body"]["messages"] == ["m7"]


def test_edits_keep_new_values_at_their_size():
    # orjson hands back a bytes object of at least 4 KB, however short its text: kept as it is, 1,000 edited
    # lines of 200-character values would hold 4 MB; copied to their size, about 0.4 MB (tracemalloc counts what
    # was allocated, not time)
    import tracemalloc

    originals = [{"m": [{"c": f"{i:04d}" + "x" * 200}]} for i in range(1000)]
    tracemalloc.start()
    try:
        vs = _edits(originals)
        before = tracemalloc.get_traced_memory()[0]
        for i in range(1000):
            v = vs[i]
            v["m"][0]["c"] += " moved"
            vs[i] = v
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert vs.edits(5) == [(("m", 0, "c"), "0005" + "x" * 200 + " moved")]
    assert held < 1000 * 1024, f"{held / 1000:.0f} bytes an edited line"


@pytest.mark.parametrize(("old", "new", "edits"), [
    ({"a": 1, "b": 2}, {"a": 1, "b": 2, "c": 3}, [(("c",), 3)]),                  # a key added at the end
    ({"a": 1, "b": 2, "c": 3}, {"a": 1, "c": 4}, [(("b",), None), (("c",), 4)]),  # a key dropped, one changed
    ({"a": 1, "b": 2}, {"b": 2, "a": 1}, [((), {"b": 2, "a": 1})]),               # keys reordered: the dict
    ({"x": [1, [2, 3], 4]}, {"x": [1, [2, 5], 4]}, [(("x", 1, 1), 5)]),          # one item of a list
    ({"x": [3, 1, 2]}, {"x": [1, 2, 3]}, [(("x",), [1, 2, 3])]),                  # a list sorted: the list
    ({"m": [{"r": "s", "c": "t0 S"}, {"r": "u", "c": "U"}]},                      # FX001: two messages edited:
     {"m": [{"r": "s", "c": "S"}, {"r": "u", "c": "U t0"}]},                      # their contents
     [(("m", 0, "c"), "S"), (("m", 1, "c"), "U t0")]),
    ({"x": [{"b": 1, "a": 2}, {"d": 3, "c": 4}]}, {"x": [{"a": 2, "b": 1}, {"c": 4, "d": 3}]},  # each item replaced
     [(("x",), [{"a": 2, "b": 1}, {"c": 4, "d": 3}])]),                           # whole: the list
    ({"x": [1]}, {"x": [1, 2]}, [(("x",), [1, 2])]),                              # a list grown: the list
    ({"x": 1}, {"x": 1.0}, [(("x",), 1.0)]),                                      # 1 and 1.0 are not one value
    ({"x": 1}, ["x"], [((), ["x"])]),                                             # another type: the value
    ({"x": "a"}, {"x": "\ud800 lone surrogate", 1: "t"}, [(("x",), "\ud800 lone surrogate"), ((1,), "t")]),  # pickled
])
def test_edits_are_the_smallest_paths_that_differ(old, new, edits):
    vs = Edits(1, lambda i: json.loads(json.dumps(old)))
    vs[0] = new
    assert vs.edits(0) == edits and vs[0] == new and list(vs[0]) == list(new)


def test_edits_snapshot_keeps_the_values_as_they_were():
    """What fix's tokens-reused-per-cause measures: the values as one fix code left them, whatever later codes
    rewrite."""
    originals = [{"i": i, "msgs": [{"content": f"m{i}"}]} for i in range(6)]
    vs = _edits(originals)
    v = vs[1]
    v["msgs"][0]["content"] = "first code"
    vs[1] = v
    vs[2] = {"replaced": 1}
    snap = vs.snapshot()
    v["msgs"][0]["content"] = "second code"
    vs[1] = v
    vs[2] = {"replaced": 2}
    v4 = vs[4]
    v4["i"] = -4
    vs[4] = v4
    got = [snap[i] for i in range(6)]
    assert got[1]["msgs"][0]["content"] == "first code" and got[2] == {"replaced": 1}
    assert [got[i] for i in (0, 3, 4, 5)] == [originals[i] for i in (0, 3, 4, 5)]
    assert snap[-1] == originals[5] and snap[0:2] == got[0:2] and len(snap) == 6
    assert [snap.changed(i) for i in range(6)] == [False, True, True, False, False, False]
    snap[4]["i"] = 99                                # a snapshot's values are fresh copies
    assert snap[4] == originals[4]
    assert vs[1]["msgs"][0]["content"] == "second code" and vs[2] == {"replaced": 2} and vs[4]["i"] == -4
    v["msgs"][0]["content"] = "second code, again"  # a line rewritten twice by one code
    vs[1] = v
    later = vs.snapshot()
    vs[1] = {"third": 3}
    vs[5] = {"third": 5}
    assert later[1]["msgs"][0]["content"] == "second code, again" and later[2] == {"replaced": 2}
    assert later[5] == originals[5] and not later.changed(5) and later.changed(4)
    assert snap[1]["msgs"][0]["content"] == "first code" and not snap.changed(5)
    assert vs[1] == {"third": 3} and vs[5] == {"third": 5}


def test_edits_signatures_are_equal_where_two_rewrites_left_a_line_alike():
    """What lets a sweep measure once a version the same as another (the safe fixes, and the full run after its
    safe codes): a line's signature is its edits without the versions that stamp them, of a snapshot too."""
    originals = [{"i": i, "tools": [{"b": 1, "a": 2}]} for i in range(4)]
    one, two = _edits(originals), _edits(originals)
    for vs in (one, two):
        v = vs[1]
        v["tools"][0] = {"a": 2, "b": 1}
        vs[1] = v
    first = two.snapshot()  # (two's later rewrites are of a later version: signatures leave versions out)
    v = two[2]
    v["i"] = -2
    two[2] = v
    assert [one.signature(i) for i in range(4)][::2] == [None, None]
    assert one.signature(1) == two.signature(1) == first.signature(1) is not None
    assert one.signature(2) is None and first.signature(2) is None and two.signature(2) is not None
    assert [first[i] for i in range(4)] == [one[i] for i in range(4)]
    v = one[1]
    v["tools"][0]["a"] = 3
    one[1] = v
    assert one.signature(1) != two.signature(1) and one[1] != two[1]


def test_an_edits_branch_holds_the_rewrites_before_its_snapshot_and_is_rewritten_apart():
    """Where another rewrite takes up one (fix's full rewrite after its safe codes): the branch reads the values as
    the snapshot left them, its own rewrites leave the edits it came from as they are, and they leave it alike."""
    originals = [{"i": i, "tools": [{"b": 1, "a": 2}]} for i in range(5)]
    vs = _edits(originals)
    v = vs[1]
    v["tools"][0] = {"a": 2, "b": 1}
    vs[1] = v
    v = vs[2]
    v["i"] = -2
    vs[2] = v
    at = vs.snapshot()
    v = vs[2]
    v["i"] = -20           # after the snapshot: not the branch's
    vs[2] = v
    vs[3] = {"later": 3}
    assert vs.writes == 4
    vs[4] = vs[4]          # (the same value: no rewrite)
    assert vs.writes == 4
    branch = vs.branch(at)
    assert [branch[i] for i in range(5)] == [at[i] for i in range(5)]
    assert [branch.changed(i) for i in range(5)] == [False, True, True, False, False]
    assert [branch.signature(i) for i in range(5)] == [at.signature(i) for i in range(5)]
    b = branch[2]
    b["i"] = 7
    branch[2] = b
    branch[0] = {"own": 0}
    assert branch.writes == 2 and branch[2]["i"] == 7 and branch[0] == {"own": 0}
    assert vs[2]["i"] == -20 and vs[0] == originals[0] and vs[3] == {"later": 3}
    assert at[2]["i"] == -2 and at[0] == originals[0]
    again = branch.snapshot()
    branch[1] = {"last": 1}
    assert again[1]["tools"][0] == {"a": 2, "b": 1} and again[2]["i"] == 7 and branch[1] == {"last": 1}


def test_line_store_gives_back_the_lines_as_read(monkeypatch):
    monkeypatch.setattr(store, "CACHE", 2)
    path = str(LOGS[0])
    lines = log_lines(iter_jsonl(path), source=path, key="session")
    plain = [json.loads(raw) for raw in Path(path).read_text().splitlines() if raw.strip()]
    assert len(lines) == len(plain)
    for i, ln in enumerate(lines):
        assert ln.value == plain[i]
        n, key, ts = lines.meta(i)
        assert (n, key, ts) == (ln.line, ln.key, ln.timestamp) and key == plain[i]["session"]
        assert lines.index_of(ln.line) == i
    again = lines[len(lines) - 1]   # parsed again from disk (the cache holds two)
    assert again.request is not None and again.request.positions == lines[len(lines) - 1].request.positions
    with pytest.raises(KeyError):
        lines.index_of(10**9)


def _run(cli, args):
    r = cli(*args)
    assert r.exit_code in (0, 1), r.output
    return r.output


@pytest.mark.parametrize("log", LOGS, ids=lambda p: p.name)
def test_fix_and_report_are_the_same_with_a_cache_of_two(cli, tmp_path, monkeypatch, log):
    key = ["--key", "session"] if "fix_log" in log.name else []
    outs = []
    for size in (store.CACHE, 2):
        monkeypatch.setattr(store, "CACHE", size)
        out = tmp_path / f"out{size}.jsonl"
        fixed = _run(cli, ["fix", str(log), "-t", str(ROOT / "fixtures" / "tok"), "--unsafe-fixes", "-o", str(out),
                           "--format", "json", *key])
        rep = _run(cli, ["report", str(log), "-t", str(ROOT / "fixtures" / "tok"), "--format", "json", *key])
        outs.append((json.loads(fixed), out.read_bytes(), json.loads(rep)))
    (f1, o1, r1), (f2, o2, r2) = outs
    f1.pop("out"), f2.pop("out")
    assert o1 == o2 and f1 == f2 and r1 == r2
    assert f1["applied"] > 0  # the fixture has fixes to lose


def test_diff_log_forgets_a_conversation_where_it_ends_and_pairs_the_same(tok):
    from cachectl.engines.repair.groups import group_sessions
    from cachectl.engines.repair.shared_prefix import auto_records
    from cachectl.engines.tokendiff import diff_log

    path = str(LOGS[1])
    lines = log_lines(iter_jsonl(path), source=path)
    grouping = group_sessions(lines, tokenizer=tok)
    ends = set(grouping.last_indices())
    plain = [x.to_dict() for x in diff_log(auto_records(lines, grouping), tok)]
    ended = [x.to_dict() for x in diff_log(auto_records(lines, grouping), tok, end_indices=ends)]
    assert plain == ended and len(plain) > grouping.count  # pairs, then the summary
    # (line numbers, as `ends` named them before `end_indices`: the same on a log of one request a line)
    by_line = [x.to_dict() for x in diff_log(auto_records(lines, grouping), tok,
                                             ends={lines.line_number(i) for i in ends})]
    assert by_line == plain
    # a request named as an end is forgotten: the next request of its key is not paired with it
    first = [i for i, g in enumerate(grouping.groups) if g == grouping.groups[0]]
    first_key_lines = [lines.line_number(i) for i in first]
    cut = [x for x in diff_log(auto_records(lines, grouping), tok, end_indices={first[0]})
           if hasattr(x, "line_a")]
    assert cut == [x for x in diff_log(auto_records(lines, grouping), tok, ends={first_key_lines[0]})
                   if hasattr(x, "line_a")]
    assert not any(p.line_a == first_key_lines[0] for p in cut)
    assert any(p.line_a == first_key_lines[0] for p in diff_log(auto_records(lines, grouping), tok)
               if hasattr(p, "line_a"))
