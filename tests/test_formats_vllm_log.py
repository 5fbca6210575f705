"""vLLM request logs: prompt and token IDs from RequestLogger's lines, both layouts, cut prompts flagged."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachectl.errors import InputError
from cachectl.inputs.formats import log_values, shape_of, vllm_log

from .conftest import values_and_records

ROOT = Path(__file__).resolve().parents[1]
LOG = str(ROOT / "fixtures" / "logs" / "vllm_requests.log")
DEBUG = str(ROOT / "fixtures" / "logs" / "vllm_requests_debug.log")
SP = "SamplingParams(n=1, temperature=0.7, max_tokens=16)"


def test_detected_and_not_on_json_logs():
    assert shape_of(LOG) == "vllm-log" and shape_of(DEBUG) == "vllm-log"
    for other in (ROOT / "fixtures" / "logs").glob("*.jsonl"):
        assert shape_of(str(other)) != "vllm-log", other


def test_one_line_layout():
    values = list(log_values(LOG))
    assert [line for line, _ in values] == [4, 7]  # startup, access, metrics lines skipped
    v = values[0][1]
    assert v["request_id"] == "chatcmpl-6bef81cb4de24787a00de2ff383b76e1"
    assert len(v["prompt_token_ids"]) == 31 and v["prompt_token_ids"][0] == 151644
    assert v["timestamp"] == 0.0 and values[1][1]["timestamp"] == 208.0  # 10:11:12 -> 10:14:40
    assert values[1][1]["lora"] == "manuals" and "lora" not in v


def test_split_debug_layout_joins_the_info_line():
    records = list(vllm_log.read(((i + 1, raw) for i, raw in enumerate(Path(DEBUG).read_bytes().splitlines())
                                  if raw.strip()), DEBUG))
    assert [r.keys["request_id"] for r in records] == ["chatcmpl-a269fdcb7c6ce890", "cmpl-7f0c2e1d9b8a4c3e"]
    assert records[0].prompt is not None and records[0].prompt.startswith("<|im_start|>system\n")
    assert records[1].prompt is None and len(records[1].tokens or []) == 30
    assert records[1].keys["lora"] == "manuals" and records[1].timestamp == 302.0


def _log(tmp_path, lines):
    p = tmp_path / "server.log"
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def test_prompt_literal_with_quotes_and_escapes(tmp_path):
    prompt = "it's a \"quoted\" line\nwith a tab\t and a backslash \\ , params: x"
    path = _log(tmp_path, [f"INFO 12-31 23:59:50 [logger.py:39] Received request r1: prompt: {prompt!r}, "
                           f"params: {SP}, prompt_token_ids: None, lora_request: None.",
                           f"INFO 01-01 00:00:10 [logger.py:39] Received request r2: prompt: 'b', params: {SP}, "
                           "prompt_token_ids: [1, 2], lora_request: None."])
    values = [v for _, v in log_values(path)]
    assert values[0]["prompt"] == prompt
    assert values[1]["timestamp"] == 20.0  # across New Year: the next year


def test_max_log_len_cut_is_flagged(tmp_path):
    lines = [f"INFO 05-14 10:11:{i:02d} [logger.py:39] Received request r{i}: prompt: {f'{i:02d}' * 10!r:.22}, "
             f"params: {SP}, prompt_token_ids: None, lora_request: None." for i in range(3)]
    lines.append(f"INFO 05-14 10:12:00 [logger.py:39] Received request r9: prompt: 'abcd', params: {SP}, "
                 "prompt_token_ids: [1, 2, 3, 4], lora_request: None.")
    records = list(vllm_log.read(((i + 1, s.encode()) for i, s in enumerate(lines)), "server.log"))
    flagged = [r.keys["request_id"] for r in records if any("max-log-len" in m for m in r.missing)]
    assert flagged == ["r0", "r1", "r2", "r9"]


def test_bad_lines(tmp_path):
    cut = _log(tmp_path, [f"INFO 05-14 10:11:12 [logger.py:39] Received request r1: prompt: 'never ends, params: {SP}"])
    with pytest.raises(InputError) as e:
        list(log_values(cut))
    assert e.value.line == 1 and e.value.field == "prompt"
    info_only = _log(tmp_path, [f"(APIServer pid=1) INFO 02-13 11:33:33 [logger.py:49] Received request r1: "
                                f"params: {SP}, lora_request: None."])
    with pytest.raises(InputError, match="only at DEBUG"):
        list(log_values(info_only))
    # a prefix whose digits are no date (an internal error before), a request line that is neither form (left out
    # without a word before, where the log's other lines have prompts)
    ok = f"INFO 05-14 10:11:12 [logger.py:39] Received request r0: prompt: 'a', params: {SP}, lora_request: None."
    for bad, says in ((f"INFO 13-45 99:99:99 [logger.py:39] Received request r1: prompt: 'b', params: {SP}.",
                       "'13-45 99:99:99' is not a month, day and time"),
                      (f"INFO 05-14 10:11:13 [logger.py:39] Received request r1: promp\x00t: 'b', params: {SP}.",
                       "expected `prompt: ` or `params: ` after the request id")):
        with pytest.raises(InputError, match=re.escape(says)) as e:
            list(log_values(_log(tmp_path, [ok, bad])))
        assert e.value.line == 2
    none = _log(tmp_path, ["INFO 05-14 10:11:02 [api_server.py:1090] vLLM API server version 0.9.2"])
    with pytest.raises(InputError, match="--enable-log-requests"):
        list(log_values(none))


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_a_logged_prompt_literal_reads_back_as_its_text(text):
    """vLLM logs the prompt as repr(); reading the literal back (fast paths and literal_eval alike) gives the text."""
    from cachectl.inputs.formats.vllm_log import _literal

    literal = repr(text)
    value, end = _literal(f"prompt: {literal}, params: SamplingParams()", len("prompt: "), {"source": "s", "line": 1})
    assert value == text and end == len("prompt: ") + len(literal)


def test_the_clock_answers_as_datetime_arithmetic():
    """The clock's answers (and its errors) are those of building a datetime for every line, on random runs of
    stamps: the same second, the same day, other days, a day back (New Year), impossible times."""
    import random
    import re
    from datetime import datetime

    from cachectl.inputs.formats import vllm_log

    class Reference:
        def __init__(self) -> None:
            self.first = self.prev = None
            self.year = 2000

        def seconds(self, stamp: bytes) -> float:
            month, day, hh, mm, ss = (int(g) for g in re.findall(rb"\d\d", stamp))
            when = datetime(self.year, month, day, hh, mm, ss)
            if self.prev is not None and (self.prev - when).total_seconds() > 86400:
                self.year += 1
                when = when.replace(year=self.year)
            self.prev = when
            if self.first is None:
                self.first = when
            return (when - self.first).total_seconds()

    rng = random.Random(5)
    for _ in range(300):
        clock, ref = vllm_log._Clock(), Reference()
        month, day, t = rng.choice([(12, 31), (2, 28), (5, 14), (1, 1)]) + (rng.randrange(86400),)
        for _ in range(40):
            step = rng.random()
            if step < 0.3:
                t += rng.randrange(0, 5)
            elif step < 0.5:
                t -= rng.randrange(0, 4000)
            elif step < 0.7:
                month, day = rng.choice([(12, 31), (1, 1), (2, 29), (3, 1), (5, 14), (5, 15), (11, 30)])
            elif step < 0.75:
                t = rng.randrange(86400)
            hh, mm, ss = t // 3600 % 24, t // 60 % 60, t % 60
            if rng.random() < 0.03:
                hh, mm, ss = rng.choice([(24, 0, 0), (23, 60, 0), (23, 59, 61), (99, 99, 99)])
            line = f"INFO {month:02}-{day:02} {hh:02}:{mm:02}:{ss:02} [logger.py:43] x".encode()
            m = vllm_log._PREFIX.search(line)
            assert m is not None
            try:
                want: object = ref.seconds(line[m.start(2):m.end(6)])
            except ValueError as exc:
                want = str(exc)
            try:
                got: object = clock.seconds(line[m.start(2):m.end(6)])
            except ValueError as exc:
                got = str(exc)
            assert got == want, (line, got, want)
            if isinstance(want, str):
                break


_PIECES = ["a", "'", '"', "\\", "n", "t", "r", "x", "é", " ", "\u00a0", ":", ": ", "\\\\", "\\'", '\\"', "\\n", "\\x41",
           "\\n\\n", "n\\", "\n"]


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["'", '"']), st.lists(st.sampled_from(_PIECES), max_size=14))
def test_the_closing_quote_is_the_literal_regex_s(quote, pieces):
    """``_closing`` (str.find and a count of backslashes) ends a literal where the regex ``_STRING`` does, or
    neither does; the body's escapes are undone as Python reads the literal."""
    import ast
    import warnings

    text = quote + "".join(pieces)
    m = vllm_log._STRING[quote].match(text)
    assert vllm_log._closing(text, quote, 1) == (m.end() - 1 if m else -1)
    if m and "\n" not in m.group():
        body = m.group()[1:-1]
        if "\\" in body and vllm_log._OTHER_ESCAPE.search(body) is None:
            assert vllm_log._unescape(body) == ast.literal_eval(m.group())
        with warnings.catch_warnings():  # an unknown escape (``\\:``) is read with a warning, by both alike
            warnings.simplefilter("ignore")
            try:
                want: object = ast.literal_eval(m.group())
            except (ValueError, SyntaxError):
                want = "refused"
            try:  # every road of _literal (nothing escaped, only \n, only the common escapes, literal_eval)
                got: object = vllm_log._literal(m.group() + ", x", 0, {"source": "s", "line": 1})[0]
            except InputError:
                got = "refused"
        assert got == want, m.group()


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(["Received request ", "abc", "-", ":", ": ", " ", "\t", "\u2003", "\u00a0", "x:y",
                                 "prompt: "]), max_size=8))
def test_the_received_request_id_is_the_regex_s(pieces):
    """``_received`` finds the request id (and where its message goes on) exactly as ``_RECEIVED.match``."""
    for text in ("".join(pieces), "Received request " + "".join(pieces)):
        m = vllm_log._RECEIVED.match(text)
        assert vllm_log._received(text) == ((m.group(1), m.end()) if m else None), text


def test_lines_that_are_not_request_lines_are_skipped_before_the_regex(tmp_path):
    """vLLM's ``Added request`` and other lines holding ``request`` are no records; a request line's opener is
    found wherever its prefix ends (up to the 400 bytes the prefix may take)."""
    prefix = "INFO 05-14 10:11:12 [" + "a" * 370 + ".py:43] "
    log = _log(tmp_path, [
        "INFO 05-14 10:11:12 [async_llm.py:270] Added request chatcmpl-1.",
        "INFO 05-14 10:11:12 [x.py:1] Request for work",
        prefix + "Received request r-1: prompt: 'hi', params: SamplingParams(), prompt_token_ids: [1, 2], "
        "lora_request: None.",
    ])
    assert [v["request_id"] for _, v in log_values(log)] == ["r-1"]


#: the LoRA field's regex as first written (``.*?`` a character at a time, found by ``search``)
_LORA_AS_WRITTEN = r"lora_request: (None|LoRARequest\(.*?\))(?:, prompt_adapter_request|\.?$)"


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(["lora_request: ", "None", "LoRARequest(", ")", ", prompt_adapter_request", ".", "\n",
                                 "x", "'", "(", " ", "a)", ").", "lora_name='m'", "lora_request"]), max_size=14))
def test_the_lora_field_is_the_first_regex_s(pieces):
    """``_lora`` (str.find, then the chunked pattern matched there) reads what the first pattern's search read."""
    import re

    text = "".join(pieces)
    m = re.search(_LORA_AS_WRITTEN, text)
    if m is None or m.group(1) == "None":
        expected = None
    else:
        name = vllm_log._LORA_NAME.search(m.group(1))
        expected = name.group(1) if name else m.group(1)
    assert vllm_log._lora(text) == expected, text


def _vllm_line(kind: str, rid: int, prompt: str, ids: int, lora: bool, second: int) -> str:
    """One line of a vLLM log: an INFO request line (v0.4-v0.10), a DEBUG details line and its INFO line
    (v0.11.2+), an INFO line without the prompt, prompt embeddings only, a bad one, or one of the other lines."""
    at = f"INFO 05-14 10:{second // 60:02}:{second % 60:02} [logger.py:43] "
    tokens = str(list(range(ids))) if ids >= 0 else "None"
    lora_request = "LoRARequest(lora_name='m', lora_int_id=1)" if lora else "None"
    return {
        "info": f"{at}Received request r{rid}: prompt: {prompt!r}, params: {SP}, prompt_token_ids: {tokens}, "
                f"lora_request: {lora_request}, prompt_adapter_request: None.",
        "details": f"DEBUG{at[4:]}Request r{rid} details: prompt: {prompt!r}, prompt_token_ids: {tokens}, "
                   "prompt_embeds shape: None.",
        "received": f"{at}Received request r{rid}: params: {SP}, lora_request: {lora_request}.",
        "embeds": f"{at}Received request r{rid}: prompt: None, params: {SP}, prompt_token_ids: None, "
                  "lora_request: None.",
        "bad": f"{at}Received request r{rid}: prompt: {prompt!r}, params: {SP}, prompt_token_ids: [1, 2, "
               "lora_request: None.",
        "other": f"{at}Added request r{rid}.",
    }[kind]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["info", "info", "info", "details", "received", "embeds", "other"]),
                          st.integers(0, 5), st.sampled_from(["", "ab", "x" * 16, "y" * 16, "é\n", "z" * 20]),
                          st.integers(-1, 20), st.booleans(), st.integers(0, 3599)), max_size=100),
       st.one_of(st.none(), st.integers(0, 100)))
def test_values_are_the_records_values(lines, bad_at):
    """vLLM's ``values`` (what log_values reads, no record built) agree with ``read``'s records' values, line for
    line, errors included: both layouts, joined and waiting DEBUG lines, prompts cut (or not) by the cap (more
    than its window of requests), a bad line anywhere."""
    if bad_at is not None:
        lines = [*lines[:bad_at], ("bad", 0, "ab", 2, False, 0), *lines[bad_at:]]
    raw = [(n, _vllm_line(*line).encode() + b"\n") for n, line in enumerate(lines, 1)]
    got, want = values_and_records(vllm_log, raw, "s.log")
    assert got == want


def test_values_are_the_records_values_past_the_cap_window():
    """As above on long random logs (more requests than the cap's window; Hypothesis's lists are mostly short)."""
    import random

    rng = random.Random(7)
    past = 0
    for _ in range(40):
        lines = [(rng.choice(["info", "info", "details", "received", "other"]), rng.randrange(40),
                  rng.choice(["ab", "x" * 16, "y" * 16, "z" * 20]), rng.randrange(-1, 21), rng.random() < 0.3,
                  rng.randrange(3600)) for _ in range(rng.randrange(60, 200))]
        raw = [(n, _vllm_line(*line).encode() + b"\n") for n, line in enumerate(lines, 1)]
        records = list(vllm_log.read(iter(raw), "s.log"))
        assert orjson.dumps(list(vllm_log.values(iter(raw), "s.log"))) == orjson.dumps(
            [(r.line, r.value()) for r in records])
        past += len(records) > vllm_log._CAP_WINDOW
    assert past >= 10


def test_report_on_a_server_log_says_why_no_provider_cache_is_simulated(cli):
    """A vLLM server log holds prompts and token IDs, no API request body: the provider section's note says so
    (it said 'no requests', beside a report of two requests)."""
    import json

    r = cli("report", "fixtures/logs/vllm_requests.log", "-t", "fixtures/tok", "--format", "json")
    assert r.exit_code in (0, 1), r.stderr
    out = json.loads(r.stdout)
    assert out["requests"] == 2 and out["cost"] is None
    assert "provider cache not simulated: none of the 2 lines is an API request body (each is a prompt's text or " \
           "token IDs)" in out["notes"]
    assert not any(n.endswith("no requests") for n in out["notes"])
