"""Chat renders made before a run (TokenizerHandle.prefill: ``report --ray`` and ``fix --ray`` put the cluster's
renders there): a render read back is the render the template makes, for every prompt that differs in a way the
template can see (key order, types, tools, options); its tokens locate as a fresh encoding's do. And the sweep's
batches: each distinct prompt rendered and tokenized once."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from cachectl import tokenization
from cachectl.inputs import PromptInput
from cachectl.tokenization import load_tokenizer

from .conftest import TOK_DIR

TEMPLATES = Path(__file__).resolve().parent.parent / "fixtures" / "chat_templates"
TOOL = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}


def _prompts(parts: bool = True) -> list[PromptInput]:
    base = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hi"}]
    variants = [
        base,
        [{"content": "You are terse.", "role": "system"}, {"role": "user", "content": "hi"}],  # key order
        [base[0], {"role": "user", "content": "hi "}],
        [base[0], {"role": "user", "content": "1"}],
        [{"role": "user", "content": "hi"}],
    ]
    if parts:  # content as a list of parts (templates that read only strings refuse it)
        variants.append([base[0], {"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    out = [PromptInput(source="memo", kind="chat", messages=tuple(v)) for v in variants]
    out.append(PromptInput(source="memo", kind="chat", messages=tuple(base), tools=(TOOL,)))
    out.append(PromptInput(source="memo", kind="chat", messages=tuple(base), tools=({"function": TOOL["function"], "type": "function"},)))
    return out


def _prefilled(tok, fresh, cases):
    """``tok`` with the renders ``fresh`` makes of ``cases`` ((prompt, add_generation_prompt, template_vars)) kept
    under their keys, as the cluster's prefill puts them."""
    from cachectl.engines.repair.prefill import kept_renders

    kept = kept_renders(tok)
    assert kept_renders(tok) is kept
    for p, agp, tv in cases:
        tools = list(p.tools) if p.tools else None
        key = tok.prefill_key(list(p.messages), tools, agp, tv)
        text = fresh.render_chat(p, add_generation_prompt=agp, template_vars=tv)
        kept.put(key, text, fresh.backend.encode(text, add_special_tokens=False).ids)
    return kept


@pytest.mark.parametrize("template", [None, "Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja"])
def test_a_prefilled_render_is_the_render(monkeypatch, template):
    """Every variant the template can see has a key of its own: read back, each render is the one the template
    makes of that very prompt, and none is rendered again; an instrumented render (other messages) is rendered."""
    path = None if template is None else TEMPLATES / template
    if path is not None and not path.exists():
        pytest.skip(f"no {template}")
    fresh = load_tokenizer(str(TOK_DIR), chat_template_file=None if path is None else str(path))
    tok = load_tokenizer(str(TOK_DIR), chat_template_file=None if path is None else str(path))
    cases = [(p, agp, tv) for p in _prompts(template is None) for agp in (False, True) for tv in (None, {"x": 1})]
    want = [fresh.render_chat(p, add_generation_prompt=agp, template_vars=tv) for p, agp, tv in cases]
    assert len(set(want)) > len(_prompts(template is None))
    marked = [{"role": "user", "content": "\U000f0000hi\U000f0001"}]
    want_marked = fresh.render_chat(_prompts()[0], messages=marked)
    _prefilled(tok, fresh, cases)
    rendered = []
    monkeypatch.setattr(tokenization, "render_chat_template",
                        lambda *a, _r=tokenization.render_chat_template, **k: rendered.append(1) or _r(*a, **k))
    got = [tok.render_chat(p, add_generation_prompt=agp, template_vars=tv) for p, agp, tv in cases]
    assert got == want and rendered == []
    assert tok.render_chat(_prompts()[0], messages=marked) == want_marked and rendered == [1]
    assert tok.prefill_key([{"role": "user", "content": object()}], None, True) is not None
    assert tok.prefill_key([{"role": "user", "content": lambda: 0}], None, True) is None  # (pickle refuses it)


@pytest.mark.parametrize("template", [None, "Qwen-Qwen3-0.6B.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja"])
def test_prefilled_prompts_tokenize_and_locate_as_fresh_ones(template):
    """A prefilled prompt's IDs and spans are the ones a tokenizer without them finds, with nothing encoded for its
    IDs; its offsets are found again from its text on first use (one batch with ``offsets=True``), and every token's
    character range and location are a fresh encoding's, multi-byte characters included."""
    path = None if template is None else TEMPLATES / template
    if path is not None and not path.exists():
        pytest.skip(f"no {template}")
    ct = None if path is None else str(path)
    fresh = load_tokenizer(str(TOK_DIR), chat_template_file=ct)
    tok = load_tokenizer(str(TOK_DIR), chat_template_file=ct)
    text = "Grüße aus Köln 🙂 — 東京 \u200b tab\there\n  two spaces"
    prompts = [replace(p, field_paths=tuple(f"messages[{i}].content" for i in range(len(p.messages))))
               for p in _prompts(template is None)]
    prompts += [PromptInput(source="memo", kind="chat", messages=(
        {"role": "system", "content": f"You are terse. {text}"}, {"role": "user", "content": f"{text} {i}"}))
        for i in range(3)]
    try:
        want = {agp: fresh.tokenize_many(prompts, add_generation_prompt=agp) for agp in (False, True)}
    except Exception:  # a template that refuses one of these prompts
        pytest.skip(f"{template} refuses a prompt")
    _prefilled(tok, fresh, [(p, agp, None) for p in prompts for agp in (False, True)])
    encoded = []
    real = tok.backend

    class Counted:
        def encode_batch(self, texts, **kw):
            encoded.append(len(texts))
            return real.encode_batch(texts, **kw)

        def __getattr__(self, name):
            return getattr(real, name)

    tok.backend = Counted()  # type: ignore[assignment]
    for agp in (False, True):
        got = tok.tokenize_many(prompts, add_generation_prompt=agp)
        assert encoded == [] and all(t.encoding is None for t in got)
        w = want[agp]
        assert [(list(t.ids), t.text, t.spans) for t in got] == [(list(t.ids), t.text, t.spans) for t in w]
        for a, f in zip(got, w):
            assert [a.location(i) for i in range(len(a))] == [f.location(i) for i in range(len(f))]
            assert a.offsets() == f.offsets()
        located = tok.tokenize_many(prompts, add_generation_prompt=agp, offsets=True)
        assert encoded == [len(prompts)] and all(t.encoding is not None for t in located)
        assert [list(t.ids) for t in located] == [list(t.ids) for t in w]
        encoded.clear()
    assert any(len(set(f.offsets()[i:i + 2])) == 1 for f in want[True] for i in range(len(f) - 1))


@pytest.mark.parametrize("template", [None, "Qwen-Qwen3-0.6B.jinja"])
def test_offsets_kept_by_compact_locate_every_token_as_the_encoding_does(template):
    """``compact(offsets=True)`` (the sweep's prompts, which no memo keeps): a fresh encoding's offsets are kept, so a
    cause's location encodes nothing again, and every token's characters and location are the encoding's."""
    tok = load_tokenizer(str(TOK_DIR), chat_template_file=str(TEMPLATES / template) if template else None)
    prompts = _prompts(template is None)
    full = tok.tokenize_many(prompts, add_generation_prompt=True)
    assert all(type(t.encoding).__name__ == "Encoding" for t in full)
    calls = []
    real = tok.backend.encode
    tok.backend.encode = lambda *a, **k: calls.append(a) or real(*a, **k)  # type: ignore[method-assign]
    for f in full:
        c = f.compact(offsets=True)
        assert type(c.encoding).__name__ == "KeptOffsets"
        assert [c.char_range(i) for i in range(len(c))] == [f.char_range(i) for i in range(len(f))]
        assert [c.location(i) for i in range(len(c))] == [f.location(i) for i in range(len(f))]
        assert c.offsets() == f.offsets()
        assert f.compact().encoding is None  # (without: found again from the text)
    assert calls == []


def test_the_sweep_digests_each_prompt_once_and_tokenizes_each_distinct_one_once(monkeypatch):
    """The sweep's batch (:func:`~cachectl.engines.repair.rows.rows_later`) finds a prompt's duplicates by one digest
    of its content a parsed line: one render a distinct prompt, and the tokens of each row are the prompts' own."""
    from types import SimpleNamespace

    from cachectl import spool
    from cachectl.engines.repair import rows as sweep_rows

    tok = load_tokenizer(str(TOK_DIR))
    fresh = load_tokenizer(str(TOK_DIR))
    prompts = _prompts()
    twin = replace(prompts[0], line=99)  # (the same content, another object: one render)
    rows = [[SimpleNamespace(prompt=p) for p in (a, b)] for a, b in zip(prompts, prompts[1:] + [twin])]
    digests, rendered = [], []
    monkeypatch.setattr(tokenization, "content_digest",
                        lambda *a, **k: digests.append(1) or spool.content_digest(*a, **k))
    monkeypatch.setattr(sweep_rows, "content_digest", lambda *a, **k: digests.append(1) or spool.content_digest(*a, **k))
    monkeypatch.setattr(tokenization, "render_chat_template",
                        lambda *a, _r=tokenization.render_chat_template, **k: rendered.append(1) or _r(*a, **k))
    got = list(sweep_rows.rows_later(rows, tok, True)())
    assert len(digests) == 2 * len(rows) and len(rendered) == len(prompts)
    alone = fresh.tokenize_many(prompts + [twin], add_generation_prompt=True)
    want = {id(p): t for p, t in zip(prompts + [twin], alone)}
    for row, toks in zip(rows, got):
        assert [list(t.ids) for t in toks] == [list(want[id(ln.prompt)].ids) for ln in row]
    assert got[-1][1] is got[0][0]   # (the twin's tokens are its original's)


def test_a_task_leaves_a_text_past_the_tokenize_bound_to_the_driver():
    """A ``--ray`` task renders and encodes each prompt; one whose render is past the tokenize bound comes back
    as None, like one that does not render, so that the driver meets it again and names its line (the bound's
    own refusal, raised in the task, names none)."""
    from cachectl.engines.repair.prefill import render_chunk
    from cachectl.tokenization import max_tokenize_chars

    long = "x " * (max_tokenize_chars() // 2 + 10)
    got = render_chunk((str(TOK_DIR), None), [([{"role": "user", "content": "hi"}], None, True),
                                              ([{"role": "user", "content": long}], None, True)])
    tok = load_tokenizer(str(TOK_DIR))
    hi = tok.render_chat(PromptInput(kind="openai", source="", line=None, messages=({"role": "user", "content": "hi"},)),
                         add_generation_prompt=True)
    assert got[0] is not None and got[0][0] == hi
    assert got[1] is None
