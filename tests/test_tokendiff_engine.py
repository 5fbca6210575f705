"""The core of the token diff, against a brute-force reference."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cachectl.engines.tokendiff import (A_PREFIX_OF_B, B_PREFIX_OF_A, IDENTICAL, MISMATCH, classify,
                                        common_prefix_length, diff_tokens, visible)
from cachectl.inputs import PromptInput
from cachectl.tokenization import Tokenized


def naive_first_diff(a, b):
    i = 0
    while i < len(a) and i < len(b) and a[i] == b[i]:
        i += 1
    return i


def ids_prompt(ids):
    return Tokenized(PromptInput(kind="ids", source="<ids>", ids=tuple(ids)), list(ids))


# Lists that share a prefix most of the time, so that the interesting cases are common.
shared = st.lists(st.integers(0, 5), max_size=60)
pairs = st.tuples(shared, shared, shared).map(lambda t: (t[0] + t[1], t[0] + t[2]))


@given(pairs)
@settings(max_examples=500)
def test_common_prefix_matches_brute_force(pair):
    a, b = pair
    assert common_prefix_length(a, b) == naive_first_diff(a, b)


@given(st.text(max_size=40), st.text(max_size=40), st.text(max_size=40))
def test_common_prefix_on_strings(p, x, y):
    a, b = p + x, p + y
    assert common_prefix_length(a, b) == naive_first_diff(a, b)


def test_common_prefix_mixed_sequence_types():
    assert common_prefix_length((1, 2, 3), [1, 2, 4]) == 2


@given(pairs, st.integers(1, 20))
@settings(max_examples=300)
def test_diff_tokens_fields_match_reference(pair, block_size):
    a, b = pair
    if not a or not b:
        return
    d = diff_tokens(ids_prompt(a), ids_prompt(b), block_size=block_size, context=3)
    common = naive_first_diff(a, b)
    assert d.common_prefix_tokens == common
    assert d.reusable_blocks == common // block_size
    assert (d.tokens_a, d.tokens_b) == (len(a), len(b))
    if a == b:
        assert d.kind == IDENTICAL and d.first_diff_index is None
    elif common == len(a):
        assert d.kind == A_PREFIX_OF_B and d.first_diff_index == len(a)
    elif common == len(b):
        assert d.kind == B_PREFIX_OF_A and d.first_diff_index == len(b)
    else:
        assert d.kind == MISMATCH and d.first_diff_index == common
        assert a[common] != b[common]
    if d.first_diff_index is not None:
        i = d.first_diff_index
        # the window is centred on the divergence and holds the real IDs
        assert d.a.window_ids == tuple(a[max(0, i - 3):i + 4])
        assert d.b.window_ids == tuple(b[max(0, i - 3):i + 4])
        assert d.a.window_start == max(0, i - 3)


def test_classify():
    assert classify(3, 3, 3) == (IDENTICAL, None)
    assert classify(3, 5, 3) == (A_PREFIX_OF_B, 3)
    assert classify(5, 3, 3) == (B_PREFIX_OF_A, 3)
    assert classify(5, 5, 2) == (MISMATCH, 2)


def test_reusable_blocks_example():
    a = list(range(40))
    b = list(range(37)) + [999, 1000]
    d = diff_tokens(ids_prompt(a), ids_prompt(b), block_size=16)
    assert d.first_diff_index == 37 and d.reusable_blocks == 2
    assert d.a.location.token_index == 37


def test_visible_whitespace():
    assert visible(" a\n\tb\r") == "␣a↵⇥b␍"


def test_compact_tokenized_keeps_ids_and_locations(tok):
    from cachectl.inputs import read_prompt

    from .conftest import PROMPTS

    full = tok.tokenize(read_prompt(str(PROMPTS / "openai_tools_a.json")))
    small = full.compact()
    assert list(small.ids) == full.ids and small.encoding is None
    for i in (0, 5, 40, len(full) - 1):
        assert small.location(i) == full.location(i)
        assert small.token_text(i) == full.token_text(i)


def test_diff_log_forgets_least_recent_conversation_beyond_max_open():
    from cachectl.engines.tokendiff import LogSummary, diff_log
    from cachectl.inputs import LogRecord

    def rec(line, key, ids):
        return LogRecord(line=line, key=key, prompt=PromptInput(kind="ids", source="log", line=line, ids=tuple(ids)))

    records = [rec(1, "a", [1, 2]), rec(2, "b", [3, 4]), rec(3, "c", [5, 6]), rec(4, "a", [1, 2, 3]),
               rec(5, "c", [5, 6, 7])]
    out = list(diff_log(records, None, max_open=2))
    pairs, summary = out[:-1], out[-1]
    assert isinstance(summary, LogSummary)
    # "a" was forgotten when "c" arrived, so line 4 starts over; "c" is still remembered
    assert [(p.line_a, p.line_b) for p in pairs] == [(3, 5)]
    assert summary.evicted_conversations == 2 and summary.pairs == 1


def test_pair_json_object_matches_to_dict():
    import orjson

    from cachectl.engines.tokendiff import PairResult

    d = diff_tokens(ids_prompt([1, 2, 3, 4]), ids_prompt([1, 2, 9]))
    p = PairResult(line_a=1, line_b=2, key="k", diff=d)
    assert orjson.loads(orjson.dumps(p.to_json_obj())) == orjson.loads(orjson.dumps(p.to_dict()))
