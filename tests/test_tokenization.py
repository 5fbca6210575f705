"""Tokenizer loading and the token path, on the project's own BPE tokenizer and the real MiniLM WordPiece."""

from __future__ import annotations


import pytest

from cachectl.engines.tokendiff import diff_tokens
from cachectl.errors import InputError, TokenizerError
from cachectl.inputs import read_prompt
from cachectl.tokenization import load_tokenizer

from .conftest import PROMPTS, TOK_DIR, chat_prompt, text_prompt


CHATS = [
    PROMPTS / "chat_with_system.json",
    PROMPTS / "chat_no_system.json",
    PROMPTS / "openai_tools_a.json",
    PROMPTS / "think_conversation.json",
    PROMPTS / "anthropic_body.json",
]


@pytest.mark.parametrize("path", CHATS, ids=lambda p: p.name)
@pytest.mark.parametrize("gen", [False, True])
def test_chat_ids_equal_apply_chat_template_token_path(tok, path, gen):
    """Our render-then-encode path gives exactly transformers' apply_chat_template(tokenize=True) IDs."""
    p = read_prompt(str(path))
    ours = tok.tokenize(p, add_generation_prompt=gen).ids
    theirs = tok.hf.apply_chat_template(list(p.messages), tools=list(p.tools) if p.tools else None,
                                        add_generation_prompt=gen, tokenize=True, return_dict=False)
    assert ours == list(theirs)


def test_an_encoder_thread_hands_back_ids_and_offsets_not_encodings(tok):
    """With an encoder thread, each ``Encoding`` is read and let go there: the caller gets IDs and offsets that equal
    the ones encoded on its own thread (kept as :class:`KeptOffsets` for the prompts ``located`` marks; found again,
    by encoding the text, for the others), never a ``tokenizers.Encoding``."""
    from concurrent.futures import ThreadPoolExecutor

    from cachectl.tokenization import KeptOffsets

    prompts = [read_prompt(str(path)) for path in CHATS]
    prompts.append(text_prompt("You are a helpful assistant.\nHow do I reset my password?"))
    here = tok.tokenize_many(prompts, add_generation_prompt=True)
    marks = [True, False] * 3
    with ThreadPoolExecutor(1) as encoder:
        there = tok.tokenize_later(prompts, add_generation_prompt=True, encoder=encoder, located=marks)()
    for mine, theirs, located in zip(here, there, marks):
        assert list(theirs.ids) == list(mine.ids) and theirs.text == mine.text
        assert isinstance(theirs.encoding, KeptOffsets) if located else theirs.encoding is None
        kept = theirs.compact(offsets=True).encoding  # (kept offsets stay kept; none are made up)
        assert isinstance(kept, KeptOffsets) if located else kept is None
        assert theirs.compact().encoding is None
        assert theirs.offsets() == mine.offsets()
        assert [theirs.char_range(i) for i in range(len(mine.ids) + 1)] == \
            [mine.char_range(i) for i in range(len(mine.ids) + 1)]


def test_text_path_equals_tokenizer_call(tok):
    text = "You are a helpful assistant.\nHow do I reset my password?"
    t = tok.tokenize(text_prompt(text))
    assert t.ids == tok.hf(text)["input_ids"]
    assert t.ids[0] == tok.bos_token_id  # the post-processor adds BOS to raw text
    no_special = tok.tokenize(text_prompt(text), add_special_tokens=False)
    assert no_special.ids == t.ids[1:]


def test_template_writes_bos_and_reencoding_doubles_it(tok):
    """The pitfall the fixture reproduces: rendered text re-encoded with special tokens has two BOS."""
    p = read_prompt(str(PROMPTS / "chat_with_system.json"))
    rendered = tok.render_chat(p)
    assert rendered.startswith("<|bos|>")
    token_path = tok.tokenize(p)
    reencoded = tok.tokenize(text_prompt(rendered))  # add_special_tokens=True
    assert reencoded.ids[:2] == [tok.bos_token_id, tok.bos_token_id]
    d = diff_tokens(token_path, reencoded, tokenizer=tok)
    assert d.kind == "mismatch" and d.first_diff_index == 1
    assert d.cause is not None and d.cause.id == "doubled_bos"
    assert "B starts with two copies" in d.cause.message


def test_default_system_prompt_is_template_text(tok):
    p = read_prompt(str(PROMPTS / "chat_no_system.json"))
    t = tok.tokenize(p)
    assert "You are Fixture" in t.text
    i = t.text.index("Fixture")
    token = next(k for k in range(len(t)) if t.char_range(k) and t.char_range(k)[0] <= i < t.char_range(k)[1])
    loc = t.location(token)
    assert loc.in_template and loc.message_index is None


def test_location_maps_to_message_field_and_char(tok):
    p = chat_prompt([{"role": "system", "content": "You are a cache expert."},
                     {"role": "user", "content": "How do I reset my password?"}])
    t = tok.tokenize(p)
    start = t.text.index("reset")
    k = next(k for k in range(len(t)) if t.char_range(k) and t.char_range(k)[0] <= start < t.char_range(k)[1])
    loc = t.location(k)
    assert (loc.message_index, loc.role, loc.field) == (1, "user", "[1].content")
    content = p.messages[1]["content"]
    assert content[loc.char_offset:].lstrip().startswith("reset") or content[loc.char_offset:].startswith(" reset")


def test_tool_schema_span(tok):
    p = read_prompt(str(PROMPTS / "openai_tools_a.json"))
    t = tok.tokenize(p)
    assert any(s.field == "tools[0]" for s in t.spans)


def test_load_from_tokenizer_json_file_has_no_chat_template():
    t = load_tokenizer(str(TOK_DIR / "tokenizer.json"))
    assert t.tokenize(text_prompt("hello")).ids[0] == t.backend.token_to_id("<|bos|>")
    with pytest.raises(TokenizerError, match="has no chat template"):
        t.tokenize(chat_prompt([{"role": "user", "content": "hi"}]))


def test_chat_template_file_option(tmp_path):
    tmpl = tmp_path / "t.jinja"
    tmpl.write_text("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}", encoding="utf-8")
    t = load_tokenizer(str(TOK_DIR / "tokenizer.json"), chat_template_file=str(tmpl))
    out = t.tokenize(chat_prompt([{"role": "user", "content": "hi"}]))
    assert out.text == "[user]hi"


def test_load_via_tokenizer_config_path(tok):
    t = load_tokenizer(str(TOK_DIR / "tokenizer_config.json"))
    assert t.chat_template == tok.chat_template


def test_unknown_path_is_a_clear_error(tmp_path):
    with pytest.raises(TokenizerError, match="tokenizer path not found"):
        load_tokenizer(str(tmp_path / "nope" / "tokenizer.json"))


def test_uncached_hub_id_says_what_to_pass(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    import huggingface_hub.constants as c

    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(TokenizerError) as exc:
        load_tokenizer("some-org/some-model")
    msg = str(exc.value)
    assert "never downloads" in msg and "some-org/some-model" in msg and "\n" not in msg


def test_directory_without_tokenizer_files(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer files"):
        load_tokenizer(str(tmp_path))


def test_broken_tokenizer_json(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{\"not\": \"a tokenizer\"}", encoding="utf-8")
    with pytest.raises(TokenizerError, match="not a tokenizers JSON file"):
        load_tokenizer(str(bad))


def test_template_error_is_an_input_error(tmp_path):
    tmpl = tmp_path / "t.jinja"
    tmpl.write_text("{{ raise_exception('roles must alternate') }}", encoding="utf-8")
    t = load_tokenizer(str(TOK_DIR / "tokenizer.json"), chat_template_file=str(tmpl))
    with pytest.raises(InputError, match="roles must alternate"):
        t.tokenize(chat_prompt([{"role": "user", "content": "hi"}]))


# ------------------------------------------------------------------------- the real MiniLM WordPiece


def test_minilm_wordpiece_diff(minilm):
    a = text_prompt("How do I reset my password?")
    b = text_prompt("How can I reset my password?")
    ta, tb = minilm.tokenize(a), minilm.tokenize(b)
    assert ta.ids == minilm.hf(a.text)["input_ids"]
    assert ta.ids[0] == minilm.hf.cls_token_id and ta.ids[-1] == minilm.hf.sep_token_id
    d = diff_tokens(ta, tb, tokenizer=minilm)
    ref = next(i for i, (x, y) in enumerate(zip(ta.ids, tb.ids)) if x != y)
    assert d.kind == "mismatch" and d.first_diff_index == ref
    assert d.a.location.char_offset == a.text.index("do")
    assert d.b.location.char_offset == b.text.index("can")
    assert d.a.window_tokens[d.first_diff_index - d.a.window_start] == "do"


def test_minilm_has_no_chat_template(minilm):
    with pytest.raises(TokenizerError, match="has no chat template"):
        minilm.tokenize(chat_prompt([{"role": "user", "content": "hi"}]))


def test_a_tokenizer_the_tokenizers_library_panics_on_is_one_line(cli, tmp_path):
    """A tokenizer.json whose normalizer replaces an empty pattern makes the Rust library panic while it encodes;
    pyo3's PanicException is a BaseException, so it went past every handler as a traceback. Now it is the last
    line, naming the tokenizer, exit 2 (the library's own panic note, printed by Rust, comes before it)."""
    import json
    import shutil

    tok = tmp_path / "tok"
    shutil.copytree(TOK_DIR, tok)
    data = json.loads((tok / "tokenizer.json").read_text())
    data["normalizer"] = {"type": "Replace", "pattern": {"String": ""}, "content": "xx"}
    (tok / "tokenizer.json").write_text(json.dumps(data))
    prompt = tmp_path / "p.txt"
    prompt.write_text("Hello there, general Kenobi\n")
    r = cli("diff-tokens", prompt, prompt, "-t", tok)
    assert r.exit_code == 2
    assert r.stderr.strip().splitlines()[-1].startswith(f"cachectl: error: tokenizer {tok}: the tokenizers library "
                                                        "failed while encoding (")
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr


@pytest.mark.parametrize("where", ["tokenizer_config.json", "chat_template.jinja"])
def test_an_invalid_chat_template_of_a_model_directory_is_named_at_its_file(cli, tmp_path, where):
    """The error named the prompt file ("chat_no_system.json: chat template failed to render: Expected an
    expression"), whose content was not at fault; now the file the template came from, and its line."""
    import json
    import shutil

    tok = tmp_path / "tok"
    shutil.copytree(TOK_DIR, tok)
    bad = "{% for m in messages %}{{ m.content }}{% endfor %}\n{% if %}"
    config = json.loads((tok / "tokenizer_config.json").read_text())
    (tok / "chat_template.jinja").unlink(missing_ok=True)
    if where == "chat_template.jinja":
        config.pop("chat_template", None)
        (tok / "chat_template.jinja").write_text(bad)
    else:
        config["chat_template"] = bad
    (tok / "tokenizer_config.json").write_text(json.dumps(config))
    prompt = str(PROMPTS / "chat_no_system.json")
    r = cli("diff-tokens", "-t", tok, prompt, prompt)
    assert r.exit_code == 2
    if where == "chat_template.jinja":
        assert f"{tok / where}:2: invalid chat template: " in r.stderr
    else:
        assert f"{tok / where}: field 'chat_template': invalid chat template: " in r.stderr
        assert "(chat_template line 2)" in r.stderr


def test_stability_refuses_a_conversation_past_its_bound_before_rendering(cli, tmp_path):
    """--stability renders every prefix: 2,000 short messages (74 KB) ran past a minute."""
    import json

    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"} for i in range(1001)]
    conv = tmp_path / "conv.json"
    conv.write_text(json.dumps(msgs))
    r = cli("diff-tokens", "-t", TOK_DIR, "--stability", conv)
    assert r.exit_code == 2 and "1,001 messages: --stability renders the conversation once a turn" in r.stderr


def test_a_tokenizer_path_that_is_a_device_or_a_dangling_link_says_so(tmp_path):
    """`-t /dev/zero` said "tokenizer path not found: /dev/zero (did you mean /dev/zero?)"."""
    with pytest.raises(TokenizerError, match="not a tokenizer directory or a tokenizer.json file"):
        load_tokenizer("/dev/zero")
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(TokenizerError, match="a symbolic link to nothing"):
        load_tokenizer(str(loop))
