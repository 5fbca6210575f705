"""The regression corpus of real chat templates (fixtures/chat_templates, see its SOURCES.md).

lint must render each exactly as transformers' apply_chat_template does, refuse none of them, keep its
true positives and drop the known false positives; diff-tokens must name the causes that counterfactual
renders prove on them. Tokenization uses the project's fixture tokenizer with each template attached.
"""

from __future__ import annotations

import json
import shutil
import unicodedata

import pytest

from cachectl.engines import lint
from cachectl.engines.lint import templates as lint_templates
from cachectl.engines.tokendiff import check_stability, diff_tokens
from cachectl.errors import InputError
from cachectl.inputs import prompt_from_value
from cachectl.tokenization import load_tokenizer, render_chat_template

from .conftest import FIXTURES, TOK_DIR

CORPUS = FIXTURES / "chat_templates"
NAMES = sorted(p.stem for p in CORPUS.glob("*.jinja"))

SYS = {"role": "system", "content": "You are a concise assistant for a weather service."}
U1 = {"role": "user", "content": "What is the weather in Paris today?"}
A1 = {"role": "assistant",
      "content": "<think>\nThe user asks about Paris. Look it up.\n</think>\nIt is sunny in Paris."}
U2 = {"role": "user", "content": "And in Berlin?"}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
# a second conversation: reasoning in its own field, non-ASCII text, no think tags
CONV2 = [{"role": "system", "content": "Réponds en français."},
         {"role": "user", "content": "Quel temps fait-il à Zürich ?"},
         {"role": "assistant", "content": "Il neige à Zürich.", "reasoning_content": "Zürich: snow today."},
         {"role": "user", "content": "Et demain ?"}]


def test_corpus_is_real_and_documented():
    sources = (CORPUS / "SOURCES.md").read_text()
    assert len(NAMES) >= 24
    for name in NAMES:
        assert f"| {name}.jinja | llama-cpp-python 0.3.36" in sources
    assert "MIT License" in (CORPUS / "LICENSE.llama.cpp").read_text()


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(str(TOK_DIR))


def _forms(conv):
    no_system = [m for m in conv if m["role"] != "system"]
    return [(conv, None), (no_system, None), (conv, TOOLS), (no_system, TOOLS)]


@pytest.fixture
def frozen_clock(monkeypatch):
    """transformers' strftime_now reads datetime.now(); lint's reads a fixed instant: make them the same."""
    import datetime

    from transformers.utils import chat_template_utils

    class Fixed(datetime.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2026, 11, 28, 9, 15)

    monkeypatch.setattr(chat_template_utils, "datetime", Fixed)


@pytest.mark.parametrize("name", NAMES)
def test_lint_renders_what_transformers_renders(tok, name, frozen_clock):
    source = (CORPUS / f"{name}.jinja").read_text(encoding="utf-8")
    template = lint_templates.sandbox().from_string(source)
    special = tok.hf.special_tokens_map
    # 1. lint's own sample conversation, in the form lint settled on, every prefix of it
    what, msgs, tools, renders = lint_templates.chat_sample(name, template, tok)
    first = lint_templates._first_turn(msgs)
    for j, text in enumerate(renders):
        k = first + j
        expected = tok.hf.apply_chat_template(msgs[:k], tools=tools, chat_template=source, tokenize=False,
                                              add_generation_prompt=msgs[k - 1]["role"] != "assistant")
        assert text == expected, (name, what, k)
    # 2. another conversation: where transformers renders a form, lint renders the same; where it raises, so does lint
    rendered = 0
    for msgs, tools in _forms(CONV2):
        for gen in (True, False):
            try:
                expected = tok.hf.apply_chat_template(msgs, tools=tools, chat_template=source, tokenize=False,
                                                      add_generation_prompt=gen)
            except Exception:
                with pytest.raises(Exception):  # noqa: B017 -- whatever transformers raised, lint must refuse too
                    render_chat_template(template, msgs, tools=tools, add_generation_prompt=gen,
                                         special_tokens=special)
                continue
            assert render_chat_template(template, msgs, tools=tools, add_generation_prompt=gen,
                                        special_tokens=special) == expected
            rendered += 1
    assert rendered, name


@pytest.fixture(scope="module")
def corpus_report():
    return lint.lint_paths([str(CORPUS)], lint.LintConfig())


def _rules(report, name):
    return sorted(f.rule for f in report.findings if f.path.endswith(f"/{name}.jinja"))


def test_lint_refuses_no_template_of_the_corpus(corpus_report):
    assert corpus_report.errors == ()
    assert corpus_report.files == len(NAMES)


def test_templates_that_needed_transformers_machinery(corpus_report):
    # {% generation %}, {% break %}, raise_exception + no system role, tools required (None is not iterable)
    for name, needle in (("LFM2.5-8B-A1B", "generation"), ("Kimi-K3", "break"),
                         ("google-gemma-2-2b-it", "raise_exception"),
                         ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "for tool in tools")):
        assert needle in (CORPUS / f"{name}.jinja").read_text()
    template = lint_templates.sandbox().from_string((CORPUS / "google-gemma-2-2b-it.jinja").read_text())
    what, msgs, _, _ = lint_templates.chat_sample("gemma", template)
    assert all(m["role"] != "system" for m in msgs) and "system" in what
    template = lint_templates.sandbox().from_string((CORPUS / "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja").read_text())
    what, _, tools, _ = lint_templates.chat_sample("hermes", template)
    assert tools and "tools" in what


def test_cc003_clock_reads_and_date_defaults(corpus_report):
    # Llama 3.2 reads the clock (strftime_now); Llama 3.1 and 3.3 default date_string to a constant
    assert "CC003" in _rules(corpus_report, "meta-llama-Llama-3.2-3B-Instruct")
    clock = next(f for f in corpus_report.findings
                 if f.path.endswith("Llama-3.2-3B-Instruct.jinja") and f.rule == "CC003")
    assert "strftime_now" in clock.message and clock.fix and clock.fix_safety == "unsafe"
    for name in ("meta-llama-Llama-3.1-8B-Instruct", "meta-llama-Llama-3.3-70B-Instruct", "Qwen-Qwen3-0.6B"):
        assert "CC003" not in _rules(corpus_report, name)


def test_cc006_only_on_tool_schemas(corpus_report):
    # tool schemas through tojson: flagged
    for name in ("Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct", "ByteDance-Seed-OSS",
                 "mistralai-Mistral-Nemo-Instruct-2407"):
        assert "CC006" in _rules(corpus_report, name), name
    # only tool *calls* (arguments | tojson), never schemas: not flagged
    for name in ("deepseek-ai-DeepSeek-V3.1", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"):
        source = (CORPUS / f"{name}.jinja").read_text()
        assert "arguments'] | tojson" in source or "arguments | tojson" in source
        assert "CC006" not in _rules(corpus_report, name), name
    f = next(f for f in corpus_report.findings if f.rule == "CC006")
    assert f.fix_safety == "safe" and "sort_keys" in f.fix


def test_cc007_think_stripping_stays(corpus_report):
    for name in ("Qwen-Qwen3-0.6B", "Qwen-QwQ-32B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"):
        assert "CC007" in _rules(corpus_report, name), name
    for name in ("Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct"):
        assert "CC007" not in _rules(corpus_report, name), name


def test_a_broken_template_does_not_hide_the_others(cli, tmp_path):
    folder = tmp_path / "templates"
    shutil.copytree(CORPUS, folder)
    (folder / "zz-broken.jinja").write_text("{% for m in messages %}\n{{ m.content }\n{% endfor %}\n")
    r = cli("lint", folder, "-f", "json")
    assert r.exit_code == 2
    doc = json.loads(r.stdout)
    assert doc["files"] == len(NAMES) + 1
    assert [e["path"].rsplit("/", 1)[-1] for e in doc["errors"]] == ["zz-broken.jinja"]
    assert doc["errors"][0]["line"] == 2 and "invalid Jinja" in doc["errors"][0]["message"]
    flagged = {f["path"].rsplit("/", 1)[-1] for f in doc["findings"]}
    assert {"meta-llama-Llama-3.2-3B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja"} <= flagged
    assert "zz-broken.jinja:2: invalid Jinja" in r.stderr and "Traceback" not in r.stderr
    # every output format carries the error (on a smaller folder: the same code path, less time)
    for extra in NAMES[3:]:
        (folder / f"{extra}.jinja").unlink()
    gh = cli("lint", folder, "-f", "github")
    assert gh.exit_code == 2 and any(line.startswith("::error file=") and "zz-broken.jinja,line=2," in line
                                     for line in gh.stdout.splitlines())
    sarif = json.loads(cli("lint", folder, "-f", "sarif").stdout)
    inv = sarif["runs"][0]["invocations"][0]
    assert inv["executionSuccessful"] is False
    assert inv["toolExecutionNotifications"][0]["locations"][0]["physicalLocation"]["region"]["startLine"] == 2
    text = cli("lint", folder)
    assert text.exit_code == 2 and "3 file(s) checked" in text.stdout and "1 error(s)" in text.stdout


def test_a_path_without_lintable_files(cli, tmp_path):
    (tmp_path / "notes.txt").write_text("nothing to lint")
    r = cli("lint", tmp_path, "-f", "json")
    assert r.exit_code == 2
    assert "no lintable file" in json.loads(r.stdout)["errors"][0]["message"]
    r = cli("lint", tmp_path, FIXTURES / "lint" / "bad" / "tools_tojson.j2")
    assert r.exit_code == 2 and "CC006" in r.stdout and "no lintable file" in r.stderr


def test_sarif_with_errors_is_valid(cli, tmp_path):
    import jsonschema

    (tmp_path / "bad.jinja").write_text("{{ ''.__class__.__mro__ }}")
    shutil.copy(CORPUS / "meta-llama-Llama-3.2-3B-Instruct.jinja", tmp_path)
    schema = json.loads((FIXTURES / "sarif" / "sarif-2.1.0-rtm.5.json").read_text())
    doc = json.loads(cli("lint", tmp_path, "-f", "sarif").stdout)
    jsonschema.Draft4Validator(schema).validate(doc)
    assert "refused" in doc["runs"][0]["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"]
    assert doc["runs"][0]["results"][0]["properties"]["fixSafety"] in ("safe", "unsafe")


# ------------------------------------------------------------------------------------- diff-tokens causes


@pytest.fixture(scope="module")
def with_template():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = load_tokenizer(str(TOK_DIR), chat_template_file=str(CORPUS / f"{name}.jinja"))
        return cache[name]

    return get


def _p(msgs, tools=None):
    return prompt_from_value({"messages": msgs, "tools": tools} if tools else msgs, source="<t>", line=None)


def _diff(t, a, b, gen=True, template_vars=None):
    return diff_tokens(t.tokenize(_p(a), add_generation_prompt=gen, template_vars=template_vars),
                       t.tokenize(_p(b), add_generation_prompt=gen, template_vars=template_vars), tokenizer=t)


@pytest.mark.parametrize("name", ["Qwen-Qwen2.5-7B-Instruct", "HuggingFaceTB-SmolLM3-3B", "moonshotai-Kimi-K2"])
def test_default_system_prompt_where_the_template_injects_one(with_template, name):
    d = _diff(with_template(name), [U1], [SYS, U1])
    assert d.cause is not None and d.cause.id == "default_system_prompt"


@pytest.mark.parametrize("name", ["Qwen-Qwen3-0.6B", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B",
                                  "deepseek-ai-DeepSeek-V3.1", "mistralai-Mistral-Nemo-Instruct-2407",
                                  "microsoft-Phi-3.5-mini-instruct", "meta-llama-Llama-3.1-8B-Instruct"])
def test_no_default_system_prompt_where_the_template_injects_none(with_template, name):
    d = _diff(with_template(name), [U1], [SYS, U1])
    assert d.kind == "mismatch"
    assert d.cause is None or d.cause.id != "default_system_prompt", d.cause


@pytest.mark.parametrize("name", ["Qwen-Qwen3-0.6B", "Qwen-QwQ-32B", "GLM-4.6"])
def test_think_stripped_when_the_reasoning_is_gone(with_template, name):
    t = with_template(name)
    d = _diff(t, [SYS, U1, A1], [SYS, U1, A1, U2], gen=False)
    assert d.kind == "mismatch" and d.cause.id == "think_stripped"
    ta = t.tokenize(_p([SYS, U1, A1]))
    tb = t.tokenize(_p([SYS, U1, A1, U2]))
    assert "The user asks about Paris." in ta.text and "The user asks about Paris." not in tb.text


def test_think_stripped_after_a_generation_prompt_that_opens_think(with_template):
    t = with_template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B")
    r = check_stability(_p([SYS, U1, A1, U2]), t)
    bad = next(s for s in r.steps if not s.stable)
    assert bad.k == 2 and bad.diff.cause.id == "think_stripped"


def test_mistral_moves_the_system_prompt_it_is_no_think_stripping(with_template):
    t = with_template("mistralai-Mistral-Nemo-Instruct-2407")
    d = _diff(t, [SYS, U1], [SYS, U1, A1, U2])
    assert d.kind == "mismatch" and d.cause.id == "message_relocated"
    # every message is located through the rendered spans, wherever the template put it
    assert d.a.location.message_index == 0 and d.b.location.message_index == 1
    tb = t.tokenize(_p([SYS, U1, A1, U2]))
    sys_at = tb.text.index(SYS["content"])
    assert sys_at > tb.text.index(U1["content"])  # the system prompt sits in the last user turn
    first_user = tb.text.index(U1["content"])
    tok_index = next(i for i in range(len(tb)) if (tb.char_range(i) or (0, 0))[0] >= first_user)
    assert tb.location(tok_index).message_index == 1 and not tb.location(tok_index).in_template
    sys_tok = next(i for i in range(len(tb)) if (tb.char_range(i) or (0, 0))[0] >= sys_at)
    assert tb.location(sys_tok).message_index == 0


@pytest.mark.parametrize("name", ["Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct",
                                  "mistralai-Mistral-Nemo-Instruct-2407"])
def test_plain_content_edits_are_no_token_boundary(with_template, name):
    t = with_template(name)
    verbose = {"role": "system", "content": "Be verbose."}
    brief = {"role": "system", "content": "Be brief."}
    d = _diff(t, [verbose, U1], [brief, U1])
    assert d.cause is None or d.cause.id != "token_boundary"
    locale_a = {"role": "user", "content": "Locale: en-US\nWhat is the weather?"}
    locale_b = {"role": "user", "content": "Locale: en-GB\nWhat is the weather?"}
    d = _diff(t, [locale_a], [locale_b])
    assert d.cause is None or d.cause.id != "token_boundary"


def test_token_boundary_where_the_text_agrees(with_template):
    t = with_template("Qwen-Qwen2.5-7B-Instruct")
    from .conftest import text_prompt

    d = diff_tokens(t.tokenize(text_prompt("Hello ")), t.tokenize(text_prompt("Hello world")), tokenizer=t)
    assert d.cause.id == "token_boundary"


@pytest.mark.parametrize("name", ["Qwen-Qwen2.5-7B-Instruct", "meta-llama-Llama-3.1-8B-Instruct"])
def test_unicode_normalization(with_template, name):
    text = "Résumé of the café meeting, then the weather in Zürich."
    a = [SYS, {"role": "user", "content": unicodedata.normalize("NFC", text)}]
    b = [SYS, {"role": "user", "content": unicodedata.normalize("NFD", text)}]
    d = _diff(with_template(name), a, b)
    assert d.cause.id == "unicode_normalization" and "NFC" in d.cause.message and "NFD" in d.cause.message


@pytest.mark.parametrize("name", ["Qwen-Qwen2.5-7B-Instruct", "mistralai-Mistral-Nemo-Instruct-2407"])
def test_embedded_json_key_order(with_template, name):
    doc = {"city": "Paris", "units": "metric", "days": [1, 2]}
    a = [SYS, {"role": "user", "content": "Context: " + json.dumps(doc) + "\nSummarise it."}]
    b = [SYS, {"role": "user", "content": "Context: " + json.dumps(dict(reversed(doc.items()))) + "\nSummarise it."}]
    d = _diff(with_template(name), a, b)
    assert d.cause.id == "json_key_order"
    # the same JSON with another value is no key-order problem
    c = [SYS, {"role": "user", "content": "Context: " + json.dumps(dict(doc, city="Lyon")) + "\nSummarise it."}]
    d = _diff(with_template(name), a, c)
    assert d.cause is None or d.cause.id != "json_key_order"


def test_counters_ids_and_dates(with_template):
    t = with_template("Qwen-Qwen2.5-7B-Instruct")
    seq = [{"role": "system", "content": f"You are a helpful assistant. Request number {n} of this session."}
           for n in (41, 42)]
    assert _diff(t, [seq[0], U1], [seq[1], U1]).cause.id == "counter"
    ids = [{"role": "system", "content": f"Trace {u}. You are a helpful assistant."}
           for u in ("3f2b8c1e-9d4a-4b7e-8a2c-1e5f6d7c8b9a", "7a1c2d3e-4f5a-4b6c-8d7e-9f0a1b2c3d4e")]
    d = _diff(t, [ids[0], U1], [ids[1], U1])
    assert d.cause.id == "volatile_id" and "uuid" in d.cause.message
    # Llama 3.1: a date_string passed per request
    llama = with_template("meta-llama-Llama-3.1-8B-Instruct")
    ta = llama.tokenize(_p([U1]), template_vars={"date_string": "28 Nov 2026"})
    tb = llama.tokenize(_p([U1]), template_vars={"date_string": "29 Nov 2026"})
    d = diff_tokens(ta, tb, tokenizer=llama)
    assert d.cause.id == "date_time" and d.a.location.in_template


@pytest.mark.parametrize("name", ["microsoft-Phi-3.5-mini-instruct", "openai-gpt-oss-120b"])
def test_last_turn_closed_otherwise_than_history(with_template, name):
    d = _diff(with_template(name), [SYS, U1, A1], [SYS, U1, A1, U2], gen=False)
    assert d.kind == "mismatch" and d.cause.id == "last_turn_closed_differently"
    # a template that closes every turn alike: a plain prefix, no cause needed
    d = _diff(with_template("Qwen-Qwen2.5-7B-Instruct"), [SYS, U1, A1], [SYS, U1, A1, U2], gen=False)
    assert d.kind == "a_prefix_of_b"


def test_importing_the_cli_and_engines_loads_no_heavy_library():
    import subprocess
    import sys

    code = ("import sys, cachectl.cli, cachectl.engines.lint, cachectl.engines.tokendiff, cachectl.tokenization; "
            "print(sorted(m for m in ('torch', 'transformers', 'jinja2') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_diff_tokens_cli_on_a_real_template(cli, write):
    a = write("a.json", [SYS, U1])
    b = write("b.json", [SYS, U1, A1, U2])
    nemo = CORPUS / "mistralai-Mistral-Nemo-Instruct-2407.jinja"
    r = cli("diff-tokens", a, b, "-t", TOK_DIR, "--chat-template", nemo, "--add-generation-prompt", "--format", "json")
    assert r.exit_code == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["cause"]["id"] == "message_relocated"
    assert doc["a"]["location"]["message_index"] == 0 and doc["b"]["location"]["message_index"] == 1
    text = cli("diff-tokens", a, b, "-t", TOK_DIR, "--chat-template",
               CORPUS / "mistralai-Mistral-Nemo-Instruct-2407.jinja", "--add-generation-prompt")
    assert "message 0 (system)" in text.stdout and "chat-template text" not in text.stdout.split("cause:")[0]


@pytest.mark.parametrize("name", NAMES)
def test_every_message_is_located_in_the_render(with_template, name):
    """Tokens map to messages through the rendered spans, wherever the template put each message."""
    t = with_template(name)
    template = lint_templates.sandbox().from_string((CORPUS / f"{name}.jinja").read_text(encoding="utf-8"))
    _, msgs, tools, _ = lint_templates.chat_sample(name, template, t)
    tk = t.tokenize(_p(msgs, tools), add_generation_prompt=True)
    located = set()
    for s in tk.spans:
        if s.message_index is None:
            continue
        content = msgs[s.message_index]["content"]
        assert tk.text[s.start:s.end] == content[s.offset:s.offset + s.end - s.start]
        located.add(s.message_index)
    # every message whose answer text (after any reasoning) the render holds is located
    for i, m in enumerate(msgs):
        answer = m["content"].split("</think>")[-1].strip()
        if answer in tk.text:
            assert i in located, (name, i)


@pytest.mark.parametrize("name", NAMES)
def test_spans_the_text_proves_are_the_instrumented_renders(with_template, name):
    """Where every content occurs once and in order, the spans read from the text are those the instrumented
    render marks (so that render is skipped); where a content repeats or is cut, the text proves nothing."""
    from cachectl.tokenization import _found_spans, _marked_spans

    t = with_template(name)
    template = lint_templates.sandbox().from_string((CORPUS / f"{name}.jinja").read_text(encoding="utf-8"))
    _, msgs, tools, _ = lint_templates.chat_sample(name, template, t)
    convs = [(msgs, tools), ([SYS, U1, A1, U2], None), (CONV2, TOOLS), (CONV2, None),
             ([SYS, U1, {"role": "assistant", "content": U1["content"]}, U2], None)]
    found_some = 0
    for conv, tl in convs:
        p = _p(conv, tl)
        try:
            tk = t.tokenize(p, add_generation_prompt=True)
        except InputError:  # (a template that refuses a system role, or tools in this shape)
            continue

        def render(messages, p=p):
            return t.render_chat(p, messages=messages, add_generation_prompt=True)

        found, marked = _found_spans(p, tk.text), _marked_spans(p, tk.text, render)
        if found is not None:
            found_some += 1
            assert marked is not None and sorted(found, key=lambda s: s.start) == sorted(marked, key=lambda s: s.start)
        if conv[2]["content"] == conv[1]["content"]:  # one content twice: its place is not proven by the text
            assert found is None
        if conv[2] is A1 and "Look it up." not in tk.text:  # the template cut the reasoning
            assert found is None
    # Mistral's templates move the system prompt into the last user turn: out of order, so always rendered
    assert found_some >= 1 or "Mistral-Nemo" in name, name


def test_content_edges_split_as_the_whitespace_pattern_did():
    """A content's edge whitespace (where the spans' markers go) is what ``^(\\s*)(.*?)(\\s*)$`` reads: every code
    point ``\\s`` matches, at either edge, in the middle, alone."""
    import re
    import sys

    from cachectl.tokenization import _edges

    pattern = re.compile(r"^(\s*)(.*?)(\s*)$", re.S)
    spaces = [chr(c) for c in range(sys.maxunicode + 1) if re.match(r"\s", chr(c))]
    assert len(spaces) > 20 and "\u3000" in spaces and "\x1c" in spaces
    cases = ["", "a", " a", "a ", "\n\na b\n", " \t ", "x\u00a0y", "\u200bz\u200b"]  # (U+200B is not whitespace)
    cases += [f"{s}core {s} text{s}" for s in spaces] + [s * 3 for s in spaces]
    for text in cases:
        m = pattern.match(text)
        assert m is not None
        assert _edges(text) == m.groups(), repr(text)
