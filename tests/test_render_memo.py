"""The chat-render memo (TokenizerHandle.remember_renders, used by fix and report): a render given back is the
render the template makes, for every prompt that differs in a way the template can see (key order, types, tools,
options, the template itself), across the spool on disk; a digest whose second half differs is not a hit."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cachectl.inputs import PromptInput
from cachectl.tokenization import RenderMemo, load_tokenizer

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


@pytest.mark.parametrize("template", [None, "Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja"])
def test_a_remembered_render_is_the_render(monkeypatch, template):
    path = None if template is None else TEMPLATES / template
    if path is not None and not path.exists():
        pytest.skip(f"no {template}")
    fresh = load_tokenizer(str(TOK_DIR), chat_template_file=None if path is None else str(path))
    memo_tok = load_tokenizer(str(TOK_DIR), chat_template_file=None if path is None else str(path))
    monkeypatch.setattr(RenderMemo, "HOT", 1)   # every hit but the last one read back from the spool
    memo = memo_tok.remember_renders()
    assert memo_tok.remember_renders() is memo
    cases = [(p, agp, tv) for p in _prompts(template is None) for agp in (False, True) for tv in (None, {"x": 1})]
    want = [fresh.render_chat(p, add_generation_prompt=agp, template_vars=tv) for p, agp, tv in cases]
    for _ in range(3):
        got = [memo_tok.render_chat(p, add_generation_prompt=agp, template_vars=tv) for p, agp, tv in cases]
        assert got == want
    distinct = len(set(want))
    assert memo.misses == len(cases) and memo.hits == 2 * len(cases) and distinct > len(_prompts(template is None))
    marked = [{"role": "user", "content": "\U000f0000hi\U000f0001"}]   # an instrumented render: its own entry
    assert memo_tok.render_chat(_prompts()[0], messages=marked) == fresh.render_chat(_prompts()[0], messages=marked)


def test_a_digest_whose_second_half_differs_is_not_a_hit(monkeypatch):
    monkeypatch.setattr(RenderMemo, "HOT", 1)
    memo = RenderMemo()
    a = memo.key("template", [{"role": "user", "content": "a"}])
    b = memo.key("template", [{"role": "user", "content": "b"}])
    assert a is not None and b is not None and a != b
    memo.put(a, "text of a")
    memo.put(b, "text of b")
    clash = a[:8] + bytes(8)    # the same table slot as a, another render
    assert memo.get(clash) is None and memo.get(a) == "text of a" and memo.get(b) == "text of b"
    assert memo.key(object()) is not None and memo.key(lambda: 0) is None   # what pickle refuses is not kept


@pytest.mark.parametrize("template", [None, "Qwen-Qwen3-0.6B.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja"])
def test_remembered_spans_are_the_spans(template):
    """A prompt's token IDs and spans (one instrumented render each) are kept beside the renders: a prompt tokenized
    again gives the IDs and spans a tokenizer without the memo finds, and renders and encodes nothing more."""
    path = None if template is None else TEMPLATES / template
    if path is not None and not path.exists():
        pytest.skip(f"no {template}")
    ct = None if path is None else str(path)
    fresh = load_tokenizer(str(TOK_DIR), chat_template_file=ct)
    memo_tok = load_tokenizer(str(TOK_DIR), chat_template_file=ct)
    memo_tok.remember_renders()
    prompts = [replace(p, field_paths=tuple(f"messages[{i}].content" for i in range(len(p.messages))))
               for p in _prompts(template is None)]
    calls = {"render": 0, "encode": 0}
    real_render, real_backend = memo_tok.render_chat, memo_tok.backend

    def rendered(*a, **kw):  # (the instrumented renders: the plain ones go through the memo)
        calls["render"] += 1
        return real_render(*a, **kw)

    class Counted:
        def encode_batch(self, texts, **kw):
            calls["encode"] += len(texts)
            return real_backend.encode_batch(texts, **kw)

        def __getattr__(self, name):
            return getattr(real_backend, name)

    memo_tok.render_chat = rendered  # type: ignore[method-assign]
    memo_tok.backend = Counted()  # type: ignore[assignment]
    for agp in (False, True):
        try:
            want = [(list(t.ids), t.spans) for t in fresh.tokenize_many(prompts, add_generation_prompt=agp)]
        except Exception:  # a template that refuses one of these prompts
            pytest.skip(f"{template} refuses a prompt")
        first = [(list(t.ids), t.spans) for t in memo_tok.tokenize_many(prompts, add_generation_prompt=agp)]
        assert first == want
        before = dict(calls)
        again = memo_tok.tokenize_many(prompts, add_generation_prompt=agp)
        assert [(list(t.ids), t.spans) for t in again] == want
        assert calls == before  # nothing rendered, nothing encoded
        fresh_t = fresh.tokenize_many(prompts, add_generation_prompt=agp)
        assert [[t.location(i) for i in range(len(t))] for t in again] == \
            [[t.location(i) for i in range(len(t))] for t in fresh_t]  # offsets found again from the text
    assert any(len(s) > 1 for _, s in want)


def test_remembered_offsets_locate_every_token_as_the_encoding_does():
    """A render asked for again gives back its token IDs and their offsets (kept beside them, not encoded again):
    every token's character range and location are the ones a fresh encoding gives, multi-byte characters (whose
    bytes are tokens of one character) and a compacted prompt (which reads its offsets back) included."""
    from array import array

    fresh = load_tokenizer(str(TOK_DIR))
    memo_tok = load_tokenizer(str(TOK_DIR))
    memo_tok.remember_renders()
    text = "Grüße aus Köln 🙂 — 東京 \u200b tab\there\n  two spaces"
    prompts = [PromptInput(source="memo", kind="chat", messages=(
        {"role": "system", "content": f"You are terse. {text}"}, {"role": "user", "content": f"{text} {i}"}))
        for i in range(3)] + _prompts(parts=False)
    first = memo_tok.tokenize_many(prompts, add_generation_prompt=True)   # encoded: IDs and offsets kept
    again = memo_tok.tokenize_many(prompts, add_generation_prompt=True)   # read back
    want = fresh.tokenize_many(prompts, add_generation_prompt=True)
    for a, f, w in zip(again, first, want):
        # (the first encode's offsets are read from its Encoding once, for the memo and for the Tokenized alike)
        assert type(a.encoding).__name__ == type(f.encoding).__name__ == "KeptOffsets"
        assert type(w.encoding).__name__ == "Encoding"
        assert list(a.ids) == list(f.ids) == list(w.ids) and a.text == f.text == w.text
        c = a.compact()
        assert c.encoding is None
        for i in range(len(w.ids)):
            assert a.char_range(i) == f.char_range(i) == w.char_range(i) == c.char_range(i), i
            assert a.location(i) == f.location(i) == w.location(i), i
        assert a.offsets() == f.offsets() == [tuple(o) for o in w.offsets()]
    # bytes of one character are tokens of one character range (overlapping offsets)
    assert any(len(set(w.offsets()[i:i + 2])) == 1 for w in want for i in range(len(w.ids) - 1))
    assert isinstance(again[0].encoding.starts, array)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**20), st.integers(0, 2**32 - 1)),
                max_size=60))
def test_kept_offsets_come_back_as_given(rows):
    """The offsets put_ids packs (steps between starts, which may go back, and lengths) come back as given, made
    on first use; past the int32 range the IDs alone are kept."""
    offsets = [(s, s + n) for s, n, _ in rows]
    ids = [i for _, _, i in rows]
    memo = RenderMemo()
    memo.put_ids(b"k" * 16, ids, offsets)
    got_ids, kept = memo.get_kept(b"k" * 16)
    assert list(got_ids) == ids
    if not rows:
        assert kept is None
        return
    assert kept.offsets == offsets
    assert kept.token_to_chars(len(ids) - 1) == offsets[-1] and kept.token_to_chars(len(ids)) is None
    memo.put_ids(b"j" * 16, [1], [(2**31, 2**31 + 1)])
    assert memo.get_kept(b"j" * 16)[1] is None


def test_a_batch_not_kept_reads_the_memo_and_adds_nothing_to_it():
    """``tokenize_many(keep=False)`` (the fix engine's sweep, whose rewritten prompts no later pass asks for): the
    renders the memo holds are read from it, the others are rendered and encoded as ever but not kept; the tokens
    are the same either way."""
    fresh = load_tokenizer(str(TOK_DIR))
    tok = load_tokenizer(str(TOK_DIR))
    memo = tok.remember_renders()
    prompts = _prompts()
    kept, new = prompts[:3], prompts[3:]
    tok.tokenize_many(kept)
    hits, misses = memo.hits, memo.misses
    got = tok.tokenize_many(prompts, keep=False)
    assert [t.ids for t in got] == [t.ids for t in fresh.tokenize_many(prompts)]
    assert [t.text for t in got] == [t.text for t in fresh.tokenize_many(prompts)]
    assert memo.hits == hits + len(kept) and memo.misses == misses  # (a miss is counted where a render is kept)
    def key(p):
        tools = list(p.tools) if p.tools else None
        return tok.render_key(list(p.messages), tools, False, None, tok.hf.get_chat_template(None, tools))

    assert all(memo.get(key(p)) is not None and memo.get_kept(key(p)) is not None for p in kept)
    assert all(memo.get(key(p)) is None and memo.get_kept(key(p)) is None for p in new)
    # the offsets of a prompt not kept are found again from its text, as a kept one's are read back
    for a, b in zip(got, fresh.tokenize_many(prompts, offsets=True)):
        c = a.compact()
        assert [c.char_range(i) for i in range(len(c))] == [b.char_range(i) for i in range(len(b))]


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


def test_the_sweep_digests_each_chat_prompt_once_and_tokenizes_each_distinct_one_once(monkeypatch):
    """The sweep's batch (:func:`~cachectl.engines.repair.rows.rows_later`) finds a chat prompt's duplicates
    by its key in the render memo, the digest the memo lookup takes anyway: one digest a parsed line, one render a
    distinct prompt, and the tokens of each row are the prompts' own."""
    from types import SimpleNamespace

    from cachectl import spool, tokenization
    from cachectl.engines.repair import rows as sweep_rows

    tok = load_tokenizer(str(TOK_DIR))
    tok.remember_renders()
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
