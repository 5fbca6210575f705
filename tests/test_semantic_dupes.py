"""`semantic-probe dupes` on logs of requests in any shape, and `replay`'s prompts read from request bodies: the
exact-match response cache keyed on the whole request (body and model), the fields that keep it from hitting."""

from __future__ import annotations

import json
import re

import pytest

from cachectl.engines import semantic

from .conftest import FIXTURES

LOGS = FIXTURES / "logs"


def _chat(question: str, **extra) -> dict:
    return {"model": "gpt-4o-mini", "messages": [{"role": "system", "content": "You answer for ACME."},
                                                  {"role": "user", "content": question}], **extra}


def _log(write, name: str, lines: list) -> str:
    return str(write(name, "\n".join(json.dumps(x) for x in lines) + "\n"))


def test_a_request_id_in_metadata_keeps_every_request_distinct_and_is_named(write):
    lines = [{"timestamp": f"2026-12-01T10:00:0{i}Z",
              "body": _chat(q, metadata={"request_id": f"r{i}", "app": "faq"}, stream=i % 2 == 0)}
             for i, q in enumerate(["Refund policy?", "Refund policy?", "Opening hours?", "Refund policy?"])]
    path = _log(write, "m.jsonl", lines)
    r = semantic.exact_dupes(path)
    assert (r.key, r.lines, r.distinct, r.duplicates) == ("request", 4, 4, 0)
    # leaving out metadata makes lines 2 and 4 (the same question, stream false) one request; stream alone, none
    assert r.would_duplicate == ({"field": "metadata", "duplicates": 1, "gained": 1},)
    ignored = semantic.exact_dupes(path, ignore=["metadata.request_id"])
    assert (ignored.duplicates, ignored.ignored) == (1, ("metadata.request_id",))
    assert ignored.top == ({"prompt": "Refund policy?", "count": 2, "line": 2, "prompt_line": 4},)
    # then stream is what keeps line 1 apart from them
    assert ignored.would_duplicate == ({"field": "stream", "duplicates": 2, "gained": 1},)
    both = semantic.exact_dupes(path, ignore=["metadata", "stream"])
    assert both.duplicates == 2 and both.top[0] == {"prompt": "Refund policy?", "count": 3, "line": 1, "prompt_line": 2}
    assert both.would_duplicate == ()


def test_a_field_some_requests_send_and_others_do_not_is_named(write):
    lines = [{"body": _chat("Refund policy?", stream=True)}, {"body": _chat("Refund policy?")},
             {"body": _chat("Refund policy?", stream=False)}]
    r = semantic.exact_dupes(_log(write, "s.jsonl", lines))
    # left out, stream makes the three one request: the one that sent none among them
    assert r.duplicates == 0 and r.would_duplicate == ({"field": "stream", "duplicates": 2, "gained": 2},)


def test_the_key_is_the_body_as_sent_key_order_and_model_included(write):
    a = _chat("Hi")
    reordered = dict(reversed(list(a.items())))
    no_model = {k: v for k, v in a.items() if k != "model"}
    lines = [{"body": a}, {"body": reordered}, {"model": "gpt-4o", "body": no_model},
             {"model": "gpt-4o-mini", "body": no_model}, {"model": "gpt-4o", "body": no_model}]
    r = semantic.exact_dupes(_log(write, "k.jsonl", lines))
    # the reordered body is another byte string; the wrapper's model keys a body that names none, as the model the
    # API was sent: line 4 is line 1's request, line 5 line 3's
    assert (r.distinct, r.duplicates) == (3, 2) and sorted(t["line"] for t in r.top) == [1, 3]
    # whitespace and case normalize the request's JSON text
    lines = [{"body": _chat("Refund  policy?")}, {"body": _chat("refund policy?")}]
    assert semantic.exact_dupes(_log(write, "n.jsonl", lines)).duplicates == 0
    assert semantic.exact_dupes(_log(write, "n.jsonl", lines), normalize="case").duplicates == 1


def test_real_logs_of_other_shapes():
    # LiteLLM's payloads: line 5 sends line 2's request again (its line 4, a hit of LiteLLM's own cache, reached no
    # provider and is not a request of the log)
    raw = [json.loads(x) for x in (LOGS / "litellm_payloads.jsonl").read_text().splitlines()]
    assert raw[1]["messages"] == raw[4]["messages"] and raw[1]["messages"] != raw[2]["messages"]
    r = semantic.exact_dupes(str(LOGS / "litellm_payloads.jsonl"))
    assert (r.key, r.lines, r.duplicates) == ("request", 4, 1) and r.top[0]["line"] == 2
    # a recorded cassette of GPT-5.6's Responses API: the same request sent twice (the cache test's warm-up)
    r = semantic.exact_dupes(str(LOGS / "vcr_openai_gpt56_responses.yaml"))
    assert (r.lines, r.duplicates) == (2, 1)
    assert r.top[0]["prompt"].startswith("Reference catalogue for the prompt cache test corpus.")


def test_a_prompt_log_is_keyed_on_its_prompt_and_a_mixed_one_line_by_line():
    r = semantic.exact_dupes(str(FIXTURES / "semantic" / "log.jsonl"))
    assert (r.key, r.field, r.duplicates) == ("prompt", "prompt", 1)
    r = semantic.exact_dupes(str(FIXTURES / "semantic" / "context.jsonl"))
    # three chats (two of them the same question under another system prompt: no duplicate), two prompt lines
    assert (r.key, r.lines, r.duplicates) == ("mixed", 5, 1) and r.top[0]["line"] == 4


def test_cli_dupes_on_requests(cli, write):
    lines = [{"body": _chat("Refund policy?", user=f"u{i}")} for i in range(3)]
    path = _log(write, "u.jsonl", lines)
    r = cli("semantic-probe", "dupes", path)
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines() == [
        "3 requests, 3 distinct: 0 exact duplicates (0.00%, normalize=none; key: the request body and model)",
        "leaving 'user' out of the key: 2 duplicates (+2; --ignore-field user)"]
    r = cli("semantic-probe", "dupes", path, "--ignore-field", "user", "-f", "json")
    d = json.loads(r.stdout)
    assert (d["duplicates"], d["key"], d["ignored"], d["would_duplicate"]) == (2, "request", ["user"], [])


@pytest.mark.parametrize("name, args, message", [
    ("claude_code_compact.jsonl", (), "claude_code_compact.jsonl:1: a Claude Code transcript has no request bodies"),
    ("vllm_requests.log", (), "vllm_requests.log:4: vLLM server logs with --enable-log-requests: this record has no "
                              "request body"),
    ("token_layout.jsonl", ("--prompt-field", "prompt"), "token_layout.jsonl:1: field 'prompt': no prompt text"),
])
def test_cli_dupes_on_logs_without_requests(cli, name, args, message):
    r = cli("semantic-probe", "dupes", LOGS / name, *args)
    assert r.exit_code == 2 and message in r.stderr and r.stderr.count("\n") == 1


def test_cli_dupes_bad_flags_and_lines(cli, write):
    path = _log(write, "x.jsonl", [{"body": _chat("a")}, {"usage": {"input_tokens": 3}}])
    r = cli("semantic-probe", "dupes", path, "--ignore-field", "metadata..id")
    assert r.exit_code == 2 and "--ignore-field takes a dotted path" in r.stderr
    r = cli("semantic-probe", "dupes", path)
    assert r.exit_code == 2 and "x.jsonl:2: neither a request body nor a 'prompt' text to key on" in r.stderr
    r = cli("semantic-probe", "dupes", path, "--log-format", "litellm")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1


def test_replay_reads_the_last_user_message_of_request_bodies(write):
    # cachectl's wrapper and the Responses API's input: the prompt is the last user message, the context the body's
    lines = [{"body": _chat("Refund policy?", user="u1"), "response": "30 days."},
             {"body": {"model": "gpt-5.6", "instructions": "You answer for ACME.",
                       "input": [{"role": "user", "content": [{"type": "input_text", "text": "Opening hours?"}]}]}},
             {"body": {"model": "gpt-5.6", "input": "Refund policy?"}}]
    got = list(semantic.iter_log_prompts(_log(write, "r.jsonl", lines)))
    assert [(g.line, g.prompt, g.response) for g in got] == [
        (1, "Refund policy?", "30 days."), (2, "Opening hours?", None), (3, "Refund policy?", None)]
    assert got[0].context == {"system": '["You answer for ACME."]', "user": "u1"}  # (system messages: a list)
    assert got[1].context == {"system": "You answer for ACME."}
    # a foreign shape: LiteLLM's payloads, the last user message of each request
    got = list(semantic.iter_log_prompts(str(LOGS / "litellm_payloads.jsonl")))
    assert [g.line for g in got] == [1, 2, 3, 5] and got[1].prompt == got[3].prompt == "And what breaks a hit?"
    bad = _log(write, "b.jsonl", [{"body": {"model": "m", "messages": [{"role": "assistant", "content": "x"}]}}])
    with pytest.raises(Exception, match="field 'body.messages': no prompt field and no user message"):
        list(semantic.iter_log_prompts(bad))


def test_the_documented_support_app_log(cli):
    log = FIXTURES / "semantic" / "requests.jsonl"
    assert cli("semantic-probe", "dupes", log).stdout.splitlines() == [
        "6 requests, 6 distinct: 0 exact duplicates (0.00%, normalize=none; key: the request body and model)",
        "leaving 'metadata' out of the key: 3 duplicates (+3; --ignore-field metadata)"]
    d = json.loads(cli("semantic-probe", "dupes", log, "--ignore-field", "metadata.request_id", "-f", "json").stdout)
    assert (d["duplicates"], [(t["count"], t["line"]) for t in d["top"]]) == (3, [(3, 1), (2, 2)])


# ------------------------------------------------------------------------------ responses of foreign shapes


def _sse_text(path, index: int) -> str:
    """The text deltas of interaction ``index``'s streamed chat response, read here from the cassette itself."""
    import yaml

    body = yaml.safe_load(path.read_text())["interactions"][index]["response"]["body"]["string"]
    out = []
    for line in body.splitlines():
        if line.startswith("data: {"):
            delta = json.loads(line[6:])["choices"][0]["delta"] if json.loads(line[6:])["choices"] else {}
            out.append(delta.get("content") or "")
    return "".join(out)


def test_the_answer_each_shape_logs_is_its_response():
    from cachectl.inputs.formats import log_values

    def answers(name):
        return [v.get("response") for _, v in log_values(str(LOGS / name), responses=True)]

    raw = [json.loads(x) for x in (LOGS / "litellm_payloads.jsonl").read_text().splitlines()]
    assert answers("litellm_payloads.jsonl") == [raw[i]["response"]["choices"][0]["message"]["content"]
                                                 for i in (0, 1, 2, 4)]  # (line 4: LiteLLM's own cache hit)
    assert answers("langfuse_events.jsonl") == ["It keeps whole blocks of the prompt's leading tokens.",
                                                "Any change before the block.", None]  # (no output logged)
    # a streamed chat completion: its deltas; the first call streamed a tool call and no text
    stream = LOGS / "vcr_openai_stream.yaml"
    assert answers("vcr_openai_stream.yaml") == [None, _sse_text(stream, 1)] and _sse_text(stream, 1)
    # Anthropic messages: the text blocks; a turn of tool use alone has none
    assert answers("vcr_anthropic_tool_addition.yaml")[1:] == [None, "A-4417: refund allowed"]
    assert answers("vcr_openai_gpt56_responses.yaml") == ["OK", "OK"]  # (the Responses API's output_text)
    # OpenTelemetry: gen_ai.output.messages where content capture was on
    got = answers("otel_genai.jsonl")
    assert got[0].startswith(" Why did the developer bring OpenTelemetry to the party?") and got[1:] == [None] * 3
    # the whole-log commands' values carry none
    assert all("response" not in v for _, v in log_values(str(LOGS / "litellm_payloads.jsonl")))


def test_replay_counts_a_hit_that_served_another_models_answer_in_a_litellm_log(cli):
    r = cli("semantic-probe", "replay", LOGS / "litellm_payloads.jsonl", "--threads", "1", "-f", "json")
    assert r.exit_code == 1, r.stderr
    d = json.loads(r.stdout)
    # line 3 asks gpt-4o line 1's question (asked of Claude): the cache would serve Claude's answer
    assert (d["requests"], d["with_response"], d["hits"], d["wrong_hits"]) == (4, 4, 2, 1)
    assert d["examples"][0]["line"] == 3 and d["no_text"] == 0


def test_replay_leaves_out_a_turn_of_tool_results(cli):
    r = cli("semantic-probe", "replay", LOGS / "vcr_anthropic_tool_reference.yaml", "--threads", "1")
    assert r.exit_code == 0, r.stderr
    assert r.stdout.splitlines()[:2] == [
        "1 request at 0.9: 0 hits (0.0%); 0 exact duplicates",
        "2 requests left out: an agent's turn of tool results, or a last user message without text (images): no key "
        "for the cache"]


@pytest.mark.parametrize("body, field", [
    ({"model": "m", "messages": []}, "body.messages"),
    ({"model": "m", "messages": "hi"}, "body.messages"),
    ({"model": "m", "messages": [{"role": {}, "content": "x"}]}, "body.messages[0].role"),
    ({"model": "m", "input": 5}, "body.input"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
     "body.messages[0].content[0].text"),
])
def test_a_body_the_api_refuses_is_refused_by_dupes_and_replay_as_everywhere(cli, write, body, field):
    path = _log(write, "bad.jsonl", [{"body": _chat("fine")}, {"body": body}])
    r = cli("semantic-probe", "dupes", path)
    assert r.exit_code == 2 and f"bad.jsonl:2: field '{field}': " in r.stderr and r.stderr.count("\n") == 1
    with pytest.raises(Exception, match=re.escape(f"bad.jsonl:2: field '{field}': ")):
        list(semantic.iter_log_prompts(path))


def test_the_shown_text_names_its_own_line_and_an_ignored_path_no_body_has_is_said(cli, tmp_path):
    """With --normalize, the text shown is the second line's with the key (the first one's is not kept): it was
    labelled 'first at line 1' as if it were line 1's. An --ignore-field path no body has (a typo, a path through a
    list) was reported as applied."""
    log = tmp_path / "p.jsonl"
    log.write_text('{"prompt":"Reset password"}\n{"prompt":"reset PASSWORD"}\n{"prompt":"RESET password"}\n')
    r = cli("semantic-probe", "dupes", log, "--normalize", "case")
    assert "'reset PASSWORD'  (line 2; first at line 1)" in r.stdout, r.stdout
    req = tmp_path / "r.jsonl"
    req.write_text("".join(json.dumps({"body": {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                "metadata": {"request_id": str(i)}}}) + "\n" for i in range(2)))
    r = cli("semantic-probe", "dupes", req, "--ignore-field", "metadata.requestid", "--ignore-field",
            "messages.0.role", "-f", "json")
    doc = json.loads(r.stdout)
    assert doc["duplicates"] == 0 and doc["notes"] == [
        "--ignore-field metadata.requestid: no request body has it (a path goes through objects only), so it left "
        "nothing out",
        "--ignore-field messages.0.role: no request body has it (a path goes through objects only), so it left "
        "nothing out"]
    doc = json.loads(cli("semantic-probe", "dupes", req, "--ignore-field", "metadata.request_id", "-f", "json").stdout)
    assert doc["duplicates"] == 1 and doc["notes"] == []


def test_replay_leaves_out_openai_and_codex_tool_loop_turns(cli, tmp_path):
    """An OpenAI turn of tool results (the question, the assistant's tool_calls, a role 'tool' message) was keyed on
    the question and counted a hit of the turn before: a 50% hit rate on one question asked once; Codex's rollout,
    5 hits of 6 (all tool-loop turns). The Anthropic turn (tool_result blocks in the user message) was left out."""
    question = {"role": "user", "content": "What is the weather in Paris?"}
    call = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\": \"Paris\"}"}}]}
    log = tmp_path / "oa.jsonl"
    log.write_text(json.dumps({"model": "gpt-4.1", "messages": [question]}) + "\n" + json.dumps(
        {"model": "gpt-4.1", "messages": [question, call, {"role": "tool", "tool_call_id": "c1", "content": "18C"}]})
        + "\n")
    r = cli("semantic-probe", "replay", log, "--threads", "1")
    assert r.exit_code == 0 and r.stdout.splitlines()[:2] == [
        "1 request at 0.9: 0 hits (0.0%); 0 exact duplicates",
        "1 request left out: an agent's turn of tool results, or a last user message without text (images): no key "
        "for the cache"], r.stdout
    r = cli("semantic-probe", "replay", LOGS / "codex_rollout.jsonl", "--threads", "1", "-f", "json")
    doc = json.loads(r.stdout)
    assert (doc["requests"], doc["hits"], doc["no_text"]) == (1, 0, 5)


def test_dupes_and_replay_read_a_log_whose_times_have_no_zone(cli):
    """Neither reads time: LiteLLM's own example payload (a zone-less startTime) was refused, with a pointer to a
    --time-zone neither command has."""
    for sub in ("dupes", "replay"):
        r = cli("semantic-probe", sub, LOGS / "litellm_gcs_payload.jsonl", *(("--threads", "1") if sub == "replay" else ()))
        assert r.exit_code == 0 and r.stdout.startswith("1 request"), (sub, r.stdout, r.stderr)


def test_replay_says_when_no_request_has_a_response_and_cuts_long_examples(cli, tmp_path):
    """A --response-field no line has (a typo) dropped the wrong hits and exit 1 unsaid; an example line printed
    each prompt whole (two of 200 kB: 400 kB on one line); a prompt past the tokenizers' bound named no line."""
    pad = "word " * 40_000
    log = tmp_path / "r.jsonl"
    log.write_text(json.dumps({"prompt": "Summarize: " + pad + "in French", "response": "a"}) + "\n"
                   + json.dumps({"prompt": "Summarize: " + pad + "in German", "response": "b"}) + "\n")
    r = cli("semantic-probe", "replay", log, "--threads", "1")
    assert r.exit_code == 1 and max(len(ln) for ln in r.stdout.splitlines()) < 600, r.stdout[:700]
    assert "(+199,820 characters)" in r.stdout   # (11 + 200,000 + 9 characters, 200 shown)
    r = cli("semantic-probe", "replay", log, "--threads", "1", "--response-field", "respons")
    assert r.exit_code == 0 and "note: no request has a text response (--response-field respons" in r.stdout
    assert cli("semantic-probe", "replay", log, "--response-field", " ").exit_code == 2
    huge = tmp_path / "h.jsonl"
    huge.write_text(json.dumps({"prompt": "x " * 1_250_000}) + "\n")
    r = cli("semantic-probe", "replay", huge, "--threads", "1")
    assert r.exit_code == 2 and r.stderr.startswith(f"cachectl: error: {huge}:1: field 'prompt': a prompt of "), r.stderr


def test_the_pairs_table_keeps_a_text_on_its_row(cli, tmp_path):
    pairs = tmp_path / "p.jsonl"
    pairs.write_text(json.dumps({"text_a": "What is 2+2?\n0.9999  HIT  fake row", "text_b": "Bake [bold]bread[/bold]",
                                 "label": 0}) + "\n")
    r = cli("semantic-probe", "pairs", pairs, "--threads", "1")
    rows = [ln for ln in r.stdout.splitlines() if "What is" in ln or "fake row" in ln]
    assert len(rows) == 1 and "What is 2+2?\\n0.9999  HIT  fake row" in rows[0] and "[bold]bread[/bold]" in rows[0]


def test_texts_the_model_does_not_read_whole_are_said(cli, tmp_path):
    """Two texts that differ only past the model's 256-token window, or that are only unknown tokens (emoji), embed
    alike: cosine 1.0, a hit, said nowhere."""
    pad = "The quick brown fox jumps over the lazy dog. " * 100
    pairs = tmp_path / "p.jsonl"
    pairs.write_text(json.dumps({"text_a": "Summarize. " + pad + "Answer in French.",
                                 "text_b": "Summarize. " + pad + "Answer in German.", "label": 0}) + "\n"
                     + json.dumps({"text_a": "\U0001F525\U0001F525", "text_b": "\U0001F4A7", "label": 0}) + "\n")
    r = cli("semantic-probe", "pairs", pairs, "--threads", "1")
    assert r.exit_code == 0 and "2 of 2 pairs hit" in r.stdout
    assert r.stdout.splitlines()[-2:] == [
        "note: 2 distinct text(s) longer than the model's window of 256 tokens: only their first tokens were "
        "embedded, so texts that differ after them have cosine 1.0",
        "note: 2 distinct text(s) of only tokens the model does not know ([UNK], e.g. emoji or scripts outside its "
        "vocabulary): any two of them have cosine 1.0"]
    r = cli("semantic-probe", "pairs", pairs, "--threads", "1", "-f", "json")
    json.loads(r.stdout)  # (the notes beside the JSON, on stderr)
    assert r.stderr.count("cachectl: note: ") == 2
