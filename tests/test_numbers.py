"""Numbers as a person reads them: thousands separators, one plural helper ("1 conversation"), one index base per
table, no double negatives, no line where there is nothing to say, no internal names in messages."""

from __future__ import annotations

import json

from .conftest import TOK_DIR


def test_the_one_plural_helper():
    from cachectl.errors import plural

    assert plural(1, "conversation") == "1 conversation"
    assert plural(0, "conversation") == "0 conversations"
    assert plural(3492, "token") == "3,492 tokens"
    assert plural(2, "fix") == "2 fixes" and plural(1, "fix") == "1 fix"
    assert plural(2, "capacity", "capacities") == "2 capacities"


def test_diff_tokens_counts_carry_thousands_separators(cli, write):
    a = list(range(1, 3493))
    b = a[:1200] + [9] + a[1201:]
    r = cli("diff-tokens", write("a.json", a), write("b.json", b))
    assert r.exit_code == 1, r.stderr
    assert "(ids, 3,492 tokens)" in r.stdout and "3492" not in r.stdout
    assert "mismatch at token 1,200: common prefix 1,200 tokens = 75 full blocks of 16 reusable" in r.stdout
    assert " 1,200 " in r.stdout  # the window table's index column, as the text counts


def test_diff_tokens_log_says_one_conversation(cli, write):
    log = write("l.jsonl", "".join(json.dumps({"tokens": t}) + "\n" for t in ([1, 2, 3], [1, 2, 3, 4])))
    r = cli("diff-tokens", "--log", log)
    assert "2 requests, 1 conversation, 1 pair" in r.stdout


def test_prompt_cost_numbers_calls_from_1_without_a_line_column(cli):
    r = cli("prompt-cost", "-m", "claude-sonnet-4-5", "--prefix-tokens", "2000", "--calls", "3", "--every", "10m")
    assert r.exit_code == 0, r.stderr
    rows = r.stdout.splitlines()
    assert rows[0].split()[:2] == ["#", "model"]  # no empty line column beside it
    assert [x.split()[0] for x in rows[1:4]] == ["1", "2", "3"]
    # the misses name the call as the table does, and the what-if's parts in words, not blocks[0]
    assert "miss at #2: the entry at the shared prefix expired" in r.stdout and "blocks[" not in r.stdout


def test_prompt_cost_log_rows_are_named_by_their_line_alone(cli):
    from .conftest import FIXTURES

    r = cli("prompt-cost", FIXTURES / "prompts" / "openai_requests.jsonl", "-t", TOK_DIR)
    header = r.stdout.splitlines()[0].split()
    assert header[0] == "line" and "#" not in header  # no 0-based index beside the 1-based line


def test_no_break_even_where_the_write_costs_no_premium(cli):
    # OpenAI's automatic caching writes at the input price: nothing to pay back, so no "after 0 reads"
    free = cli("prompt-cost", "-m", "gpt-4.1", "--prefix-tokens", "2000", "--calls", "3", "--every", "1m")
    assert free.exit_code == 0, free.stderr
    assert "break-even" not in free.stdout
    paid = cli("prompt-cost", "-m", "claude-sonnet-4-5", "--prefix-tokens", "2000", "--calls", "3", "--every", "1m")
    assert "break-even: the prefix pays for its write after 1 read\n" in paid.stdout
