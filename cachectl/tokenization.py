"""Tokenizer loading and prompt tokenization, shared by every command.

``load_tokenizer`` accepts a local model directory, a ``tokenizer.json`` file or a Hugging Face model id
that is already in the local cache; it never downloads. transformers is imported here, lazily, only when a
tokenizer is actually loaded.

Chat prompts are rendered through the tokenizer's own chat template with transformers'
``apply_chat_template(tokenize=False)`` and the rendered text is encoded with ``add_special_tokens=False``:
this is exactly what ``apply_chat_template(tokenize=True)`` does in transformers 5 (a test keeps the two in
agreement), and it keeps the character offsets that map a token back to a message and field. Raw text
prompts are encoded with the tokenizer's special tokens (as a completions endpoint does) unless asked not
to; that is where a doubled BOS shows up.
"""

from __future__ import annotations

import functools
import json
import os
import re
from array import array
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from .errors import InputError, TokenizerError
from .inputs import PromptInput
from .inputs.request import dumps_alike
from .spool import content_digest

if TYPE_CHECKING:  # pragma: no cover
    import tokenizers

_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


@dataclass(frozen=True)
class Span:
    """A character range of the encoded text that came from one input field."""

    start: int
    end: int
    field: str
    message_index: int | None = None
    role: str | None = None
    offset: int = 0    # the field's character at ``start`` (a template may drop the field's head)


@dataclass(frozen=True)
class Location:
    """Where a token index falls in an input."""

    token_index: int
    field: str | None = None
    message_index: int | None = None
    role: str | None = None
    char_offset: int | None = None          # within ``field``
    rendered_char_offset: int | None = None  # within the text that was encoded
    in_template: bool = False               # text the chat template wrote, not from any field
    end_of_input: bool = False
    special_token: bool = False             # added by the tokenizer (a BOS from its post-processor)

    def describe(self) -> str:
        if self.end_of_input:
            return "end of input"
        if self.special_token:
            return "special token added by the tokenizer"
        if self.in_template:
            return f"chat-template text at char {self.rendered_char_offset}"
        if self.field is None:
            return f"token {self.token_index}"
        who = f"message {self.message_index} ({self.role}) " if self.message_index is not None else ""
        return f"{who}{self.field} char {self.char_offset}"


class Tokenized:
    """A prompt turned into token IDs, with what is needed to map an index back to the input.

    ``encoding`` is the ``tokenizers.Encoding`` when the tokenizer produced the IDs (offsets are read
    from it lazily, one token at a time, so a batch costs no more than the IDs themselves).
    """

    __slots__ = ("prompt", "ids", "text", "encoding", "_spans", "add_special_tokens", "_tokenizer", "render_opts")

    def __init__(self, prompt: PromptInput, ids: Sequence[int], text: str | None = None,
                 encoding: Any = None, spans: "Sequence[Span] | Callable[[], Sequence[Span]]" = (),
                 tokenizer: "TokenizerHandle | None" = None, add_special_tokens: bool = False,
                 render_opts: dict | None = None):
        self.prompt = prompt
        self.ids = ids
        self.text = text
        self.encoding = encoding
        # spans may be a function: chat spans cost a second (instrumented) render, paid only when a
        # location is asked for
        self._spans = spans if callable(spans) else tuple(spans)
        self.add_special_tokens = add_special_tokens
        self._tokenizer = tokenizer
        #: how a chat prompt was rendered (add_generation_prompt, template_vars): counterfactual renders reuse it
        self.render_opts = render_opts

    @property
    def spans(self) -> tuple[Span, ...]:
        if callable(self._spans):
            self._spans = tuple(self._spans())
        return self._spans

    @property
    def tokenizer(self) -> "TokenizerHandle | None":
        return self._tokenizer

    def compact(self, offsets: bool = False) -> "Tokenized":
        """The same prompt holding 4 bytes per token instead of a full ``Encoding`` (about 100 bytes per
        token): offsets are recomputed from the text on first use. For keeping many prompts around.
        ``offsets``: a fresh ``Encoding``'s offsets are kept as well (:class:`KeptOffsets`, 8 bytes a token more),
        for a prompt whose characters are likely asked for: reading them once costs about a tenth of encoding the
        text again."""
        enc = None
        if offsets and self.encoding is not None:
            enc = self.encoding if isinstance(self.encoding, KeptOffsets) else _kept_offsets(self.encoding.offsets)
        return Tokenized(self.prompt, array("I", self.ids), self.text, enc, self._spans, self._tokenizer,
                         self.add_special_tokens, self.render_opts)

    def __len__(self) -> int:
        return len(self.ids)

    def _encoded(self) -> Any:
        """The encoding, made again from the text when this one was compacted or its IDs were rendered elsewhere (None
        for ID inputs)."""
        if self.encoding is None and self.text is not None and self._tokenizer is not None:
            self.encoding = self._tokenizer.backend.encode(self.text, add_special_tokens=self.add_special_tokens)
        return self.encoding

    def offsets(self) -> Sequence[tuple[int, int]] | None:
        """Each token's (start, end) in ``text``; None for ID inputs."""
        enc = self._encoded()
        return None if enc is None else enc.offsets

    def char_range(self, i: int) -> tuple[int, int] | None:
        """Character range of token ``i`` in ``text``; None for added special tokens and ID inputs."""
        if not (0 <= i < len(self.ids)):
            return None
        enc = self._encoded()
        if enc is None:
            return None
        rng = enc.token_to_chars(i)
        if rng is None:
            return None
        start, end = rng
        if start == end:
            return None
        return start, end

    def token_text(self, i: int) -> str:
        """The surface text of token ``i`` (its slice of the input text, or its decoded form)."""
        rng = self.char_range(i)
        if rng is not None and self.text is not None:
            return self.text[rng[0]:rng[1]]
        if self._tokenizer is not None:
            return self._tokenizer.id_text(self.ids[i])
        return f"<{self.ids[i]}>"

    def location(self, i: int) -> Location:
        if i >= len(self.ids):
            return Location(token_index=i, end_of_input=True)
        rng = self.char_range(i)
        if rng is None:
            if self.text is None:
                return Location(token_index=i)
            return Location(token_index=i, special_token=True)
        char = rng[0]
        for span in self.spans:
            if span.start <= char < span.end:
                return Location(token_index=i, field=span.field, message_index=span.message_index,
                                role=span.role, char_offset=char - span.start + span.offset,
                                rendered_char_offset=char)
        return Location(token_index=i, rendered_char_offset=char, in_template=True)


def _import_transformers():
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        import transformers
    except ImportError as exc:  # pragma: no cover - a broken install
        raise TokenizerError(f"transformers is not installed ({exc}); install cachectl with its dependencies") from None
    transformers.utils.logging.set_verbosity_error()
    return transformers


#: the longest text cachectl hands the tokenizer at once, in characters (about 500,000 tokens): encoding holds some
#: 150 bytes per character (the Rust encoding with its offsets, the IDs, the render's copies), so a text past it
#: is refused in one line rather than taking gigabytes; ``CACHECTL_MAX_TOKENIZE_CHARS`` raises it
MAX_TOKENIZE_CHARS = 2 * 2**20


def max_tokenize_chars() -> int:
    try:
        return int(os.environ.get("CACHECTL_MAX_TOKENIZE_CHARS", MAX_TOKENIZE_CHARS))
    except ValueError:
        return MAX_TOKENIZE_CHARS


def check_text_size(text: str, prompt: PromptInput | None = None) -> None:
    """Refuse a text too long to tokenize within bounded memory (see :data:`MAX_TOKENIZE_CHARS`), naming the
    prompt's file and line when given."""
    limit = max_tokenize_chars()
    if len(text) > limit:
        raise InputError(f"a prompt of {len(text):,} characters to tokenize: past the {limit:,} cachectl tokenizes at "
                         "once (about 150 bytes of memory a character); split it, or set "
                         "CACHECTL_MAX_TOKENIZE_CHARS", source=prompt.source if prompt is not None else None,
                         line=prompt.line if prompt is not None else None)


class _SizedBackend:
    """The tokenizers backend, with every text checked against :data:`MAX_TOKENIZE_CHARS` before it is encoded
    (every caller encodes through ``TokenizerHandle.backend``)."""

    __slots__ = ("_backend", "_name")

    def __init__(self, backend: Any, name: str = "") -> None:
        object.__setattr__(self, "_backend", backend)
        object.__setattr__(self, "_name", name)

    def encode(self, text: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(text, str):
            check_text_size(text)
        return self._unpanicked(self._backend.encode, text, *args, **kwargs)

    def encode_batch(self, texts: Any, *args: Any, **kwargs: Any) -> Any:
        for t in texts:
            if isinstance(t, str):
                check_text_size(t)
        return self._unpanicked(self._backend.encode_batch, texts, *args, **kwargs)

    def _unpanicked(self, encode: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``encode(...)``, a panic of the Rust library (pyo3's PanicException, a BaseException that passes every
        ``except Exception``) turned into one error naming the tokenizer."""
        try:
            return encode(*args, **kwargs)
        except BaseException as exc:
            if type(exc).__name__ != "PanicException":
                raise
            raise TokenizerError(f"tokenizer {self._name}: the tokenizers library failed while encoding "
                                 f"({' '.join(str(exc).split())[:200]}): is its tokenizer.json one transformers "
                                 "saved?") from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._backend, name, value)


class KeptOffsets:
    """Each token's (start, end) in a render's text, as the fork analysis keeps and splices them and
    :meth:`Tokenized.compact` keeps them: what :class:`Tokenized` reads of a ``tokenizers.Encoding`` (``offsets``,
    ``token_to_chars``), without encoding the text again. A token that covers no character (a special token the
    tokenizer added) reads (s, s), where the Encoding says None: both are no character range to
    :meth:`Tokenized.char_range`."""

    __slots__ = ("ends", "starts")

    def __init__(self, starts: Sequence[int], ends: Sequence[int]) -> None:
        self.starts, self.ends = starts, ends

    def __reduce__(self) -> tuple:
        return KeptOffsets, (self.starts, self.ends)

    @property
    def offsets(self) -> list[tuple[int, int]]:
        return list(zip(self.starts, self.ends))

    def token_to_chars(self, i: int) -> tuple[int, int] | None:
        return (self.starts[i], self.ends[i]) if 0 <= i < len(self.starts) else None


def _kept_offsets(offsets: Sequence[tuple[int, int]]) -> KeptOffsets | None:
    """An ``Encoding``'s offsets as :class:`KeptOffsets` (None past 4-byte character offsets, or for no tokens)."""
    if not len(offsets):
        return None
    try:
        flat = array("I", chain.from_iterable(offsets))
    except OverflowError:
        return None
    return KeptOffsets(flat[0::2], flat[1::2])


def _read(enc: Any, offsets: bool) -> Any:
    """An ``Encoding`` as its IDs and, with ``offsets``, its offsets (:class:`KeptOffsets`; else None: found again if
    asked for), made on the thread that encoded it, which lets the ``Encoding`` go there; the ``Encoding`` itself
    where its offsets are past 4 bytes."""
    ids = enc.ids
    kept = _kept_offsets(enc.offsets) if offsets else None
    return enc if offsets and kept is None and ids else (array("I", ids), kept)


def serial_encoding() -> Callable[[], None]:
    """``TOKENIZERS_PARALLELISM`` false (the backend encodes a batch on the calling thread alone, and a forked child
    finds no thread pool it lacks) until the call returned is called: it sets the setting back as it was. The setting
    is the process's environment, read by the backend at each call: set it and set it back with no encoding in
    flight."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"

    def restore() -> None:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before
    return restore


def encoder_beside() -> tuple[Any, Callable[[], None]]:
    """A thread for a pass to encode its batches on beside the one that renders and measures them (an executor of
    one thread: :meth:`TokenizerHandle.tokenize_later`'s ``encoder``), and ``close()``, which waits for the last
    batch, lets the thread go and sets the tokenizer back. On a machine of two cores or fewer the backend encodes a
    batch on that one thread meanwhile (:func:`serial_encoding`) and leaves the other core to the pass: with its own
    threads on both cores too, the encoding and the pass shared two cores three ways, and a one-process ``fix`` on
    5,000 requests gained nothing (docs/benchmarks.md). Call both from the thread that runs the pass."""
    from concurrent.futures import ThreadPoolExecutor

    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover
        cores = os.cpu_count() or 1
    restore = serial_encoding() if cores <= 2 else (lambda: None)
    executor = ThreadPoolExecutor(1, thread_name_prefix="cachectl-encode")

    def close() -> None:
        executor.shutdown()
        restore()
    return executor, close


class TokenizerHandle:
    """A loaded tokenizer: the transformers tokenizer (for chat templates) and its fast backend."""

    def __init__(self, name: str, hf: Any, chat_template: str | None = None):
        #: the file a --chat-template came from (its syntax errors name it, not the prompt)
        self.template_source: str | None = None
        #: the file of the model directory the template came from (``chat_template.jinja`` or
        #: ``tokenizer_config.json``), which an invalid template's error names; not reloaded as a template file
        self.template_origin: str | None = None
        #: chat renders made before a run's passes, read instead of rendered: ``get(key)`` gives a render's (text, token
        #: IDs) kept under its :meth:`prefill_key`, or None (``--ray``'s cluster fills it:
        #: :class:`cachectl.engines.repair.prefill.ClusterRenders`); None: none
        self.prefilled: Any = None
        self.name = name
        self.hf = hf
        backend = getattr(hf, "backend_tokenizer", None) or getattr(hf, "_tokenizer", None)
        if backend is None:
            raise TokenizerError(f"tokenizer {name}: only fast (tokenizers-backed) tokenizers are supported")
        # A tokenizer.json may carry padding or truncation settings (MiniLM pads to 128): transformers
        # resets them on every call, and so do we, once, so that the batch path sees whole prompts.
        if backend.padding is not None:
            backend.no_padding()
        if backend.truncation is not None:
            backend.no_truncation()
        self.backend: "tokenizers.Tokenizer" = _SizedBackend(backend, name)  # type: ignore[assignment]
        if chat_template is not None:
            hf.chat_template = chat_template
        self.bos_token_id: int | None = getattr(hf, "bos_token_id", None)
        self.bos_token: str | None = getattr(hf, "bos_token", None)

    @property
    def chat_template(self) -> str | None:
        tmpl = getattr(self.hf, "chat_template", None)
        if isinstance(tmpl, dict):
            return tmpl.get("default") or next(iter(tmpl.values()), None)
        return tmpl

    def prefill_key(self, messages: list, tools: list | None, add_generation_prompt: bool,
                    template_vars: dict | None = None, source: str | None = None) -> bytes | None:
        """The key a chat render is kept under in :attr:`prefilled` (None: parts that do not pickle): a digest of the
        template ``source`` transformers picks for ``tools`` (found here when not given), the messages, the tools and
        the options, key order and types included."""
        if source is None:
            source = self.hf.get_chat_template(None, tools)
        return content_digest(source, messages, tools, add_generation_prompt, template_vars)

    def id_text(self, token_id: int) -> str:
        text = self.backend.decode([token_id], skip_special_tokens=False)
        if text == "":
            tok = self.backend.id_to_token(token_id)
            return tok if tok is not None else f"<{token_id}>"
        return text

    # ------------------------------------------------------------------------------ chat rendering

    def render_chat(self, prompt: PromptInput, *, add_generation_prompt: bool = False,
                    template_vars: dict | None = None, messages: Sequence[dict] | None = None) -> str:
        return self._rendered(prompt, add_generation_prompt, template_vars, messages)[0]

    def _rendered(self, prompt: PromptInput, add_generation_prompt: bool = False, template_vars: dict | None = None,
                  messages: Sequence[dict] | None = None) -> tuple[str, array | None]:
        """:meth:`render_chat`'s text, and its token IDs where :attr:`prefilled` kept the render (else None)."""
        if self.chat_template is None:
            raise TokenizerError(
                f"tokenizer {self.name} has no chat template; pass a model directory whose "
                "tokenizer_config.json or chat_template.jinja has one, or --chat-template FILE")
        msgs = list((prompt.messages or ()) if messages is None else messages)
        if not msgs:
            raise InputError("no messages to render", source=prompt.source, line=prompt.line, field="messages")
        tools = list(prompt.tools) if prompt.tools else None
        try:
            # apply_chat_template(tokenize=False), in the bounded environment: the template transformers
            # would pick (a "tool_use" one when there are tools), the values it passes, under the render budget
            source = self.hf.get_chat_template(None, tools)
            if self.prefilled is not None and messages is None:
                key = self.prefill_key(msgs, tools, add_generation_prompt, template_vars, source)
                got = self.prefilled.get(key) if key is not None else None
                if got is not None:
                    return got
            text = render_chat_template(_compiled_chat_template(source), msgs, tools=tools,
                                        add_generation_prompt=add_generation_prompt,
                                        special_tokens=dict(getattr(self.hf, "special_tokens_map", {}) or {}),
                                        **(template_vars or {}))
            return text, None
        except Exception as exc:  # jinja2 TemplateError, TypeError from a filter, the budget, ...
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if len(msg) > 300:  # e.g. an undefined name thousands of characters long
                msg = msg[:300] + "..."
            from jinja2 import TemplateSyntaxError

            origin = self.template_source or self.template_origin
            if isinstance(exc, TemplateSyntaxError) and origin:  # the template's fault, not the prompt's
                if origin.endswith("tokenizer_config.json"):  # (its line is the template's own)
                    raise InputError(f"invalid chat template: {msg} (chat_template line {exc.lineno})",
                                     source=origin, field="chat_template") from None
                raise InputError(f"invalid chat template: {msg}", source=origin, line=exc.lineno) from None
            if self.template_source:  # name both: the template raised on this prompt
                msg = f"{msg} (chat template {self.template_source})"
            raise InputError(f"chat template failed to render: {msg}", source=prompt.source,
                             line=prompt.line) from None

    # ------------------------------------------------------------------------------ tokenization

    def tokenize(self, prompt: PromptInput, **kwargs) -> Tokenized:
        return self.tokenize_many([prompt], **kwargs)[0]

    def tokenize_many(self, prompts: Sequence[PromptInput], *, add_generation_prompt: bool = False,
                      add_special_tokens: bool = True, template_vars: dict | None = None,
                      offsets: bool = False) -> list[Tokenized]:
        """Tokenize prompts in one batch (the Rust backend runs the batch in parallel). ``offsets``: a prefilled
        render (whose IDs are kept without their offsets) is encoded again in the batch, for them (a caller that
        locates every prompt's tokens: one batch, not one encode a prompt later)."""
        return self.tokenize_later(prompts, add_generation_prompt=add_generation_prompt,
                                   add_special_tokens=add_special_tokens, template_vars=template_vars,
                                   offsets=offsets)()

    def tokenize_later(self, prompts: Sequence[PromptInput], *, add_generation_prompt: bool = False,
                       add_special_tokens: bool = True, template_vars: dict | None = None,
                       offsets: bool = False, encoder: Any = None,
                       located: Sequence[bool] | None = None) -> Callable[[], list[Tokenized]]:
        """:meth:`tokenize_many` in two steps: the prompts are rendered (or read from :attr:`prefilled`) now, and
        ``done()``, the call returned, gives their :class:`Tokenized`. ``encoder`` (a
        :class:`concurrent.futures.Executor` of threads): the batch is encoded there, the backend's encoding
        releasing the GIL, while this thread goes on until it calls ``done()``; an error encoding is raised there.
        There each ``Encoding`` is also read and let go: its IDs (an array) and, for the prompts ``located`` marks
        (every one when None), its offsets (:class:`KeptOffsets`; the others' are found again if asked for). Let go
        on this thread instead, what the encoding of 5,000 requests' first read left (its ``Encoding`` objects, with
        the batches' prompts) took 0.23 s of it (docs/benchmarks.md)."""
        texts: list[str | None] = []
        spans: list[Any] = []
        known: list[array | None] = []    # a chat render's IDs, where it was prefilled
        opts = _render_opts(add_generation_prompt, template_vars)
        for p in prompts:
            got = None
            if p.ids is not None:
                texts.append(None)
                spans.append(())
            elif p.is_chat:
                text, got = self._rendered(p, add_generation_prompt, template_vars)
                got = None if offsets else got
                texts.append(text)
                spans.append(_lazy_chat_spans(self, p, text, opts))
            else:
                texts.append(p.text)
                spans.append(_text_spans(p))
            known.append(got)
        # Chat renders are encoded without special tokens (the template wrote them), like
        # apply_chat_template(tokenize=True); raw text gets them when asked.
        for t, p in zip(texts, prompts):
            if t is not None:
                check_text_size(t, p)
        chat_batch = [t for t, p, k in zip(texts, prompts, known) if t is not None and p.is_chat and k is None]
        text_batch = [t for t, p in zip(texts, prompts) if t is not None and not p.is_chat]
        backend = self.backend

        def encoded() -> tuple[list, list]:
            return (backend.encode_batch(chat_batch, add_special_tokens=False) if chat_batch else [],
                    backend.encode_batch(text_batch, add_special_tokens=add_special_tokens) if text_batch else [])

        def read() -> tuple[list, list]:  # (on the encoder's thread: only where there is one)
            chats, plain = encoded()
            # (whether each text of the two batches keeps its offsets, in their order)
            marks = list(located) if located is not None else [True] * len(prompts)
            chat_marks = [m for t, p, k, m in zip(texts, prompts, known, marks, strict=True)
                          if t is not None and p.is_chat and k is None]
            text_marks = [m for t, p, m in zip(texts, prompts, marks) if t is not None and not p.is_chat]
            return [_read(e, m) for e, m in zip(chats, chat_marks)], [_read(e, m) for e, m in zip(plain, text_marks)]

        future = encoder.submit(read) if encoder is not None and (chat_batch or text_batch) else None

        def done() -> list[Tokenized]:
            chats, plain = future.result() if future is not None else encoded()
            enc_chat, enc_text = iter(chats), iter(plain)
            out: list[Tokenized] = []
            for p, rendered, sp, kept in zip(prompts, texts, spans, known):
                if rendered is None:
                    out.append(Tokenized(p, list(p.ids or ()), tokenizer=self))
                elif kept is not None:  # rendered and encoded before the run (offsets found again if asked for)
                    out.append(Tokenized(p, kept.tolist(), rendered, None, sp, self, False, opts))
                else:
                    enc: Any = next(enc_chat) if p.is_chat else next(enc_text)
                    ids, enc = enc if type(enc) is tuple else (enc.ids, enc)
                    out.append(Tokenized(p, ids, text=rendered, encoding=enc, spans=sp, tokenizer=self,
                                         add_special_tokens=add_special_tokens and not p.is_chat,
                                         render_opts=opts if p.is_chat else None))
            return out
        return done


def _render_opts(add_generation_prompt: bool, template_vars: dict | None) -> dict:
    """How a chat prompt is rendered (``Tokenized.render_opts``)."""
    return {"add_generation_prompt": add_generation_prompt, "template_vars": dict(template_vars or {})}


def _text_spans(p: PromptInput) -> tuple[Span, ...]:
    """A raw-text prompt's one span: all of it, in its one field."""
    return (Span(0, len(p.text or ""), p.field_paths[0] if p.field_paths else "text"),)


def _lazy_chat_spans(tok: TokenizerHandle, prompt: PromptInput, text: str, opts: dict) -> Callable[[], tuple]:
    def render(messages: Sequence[dict]) -> str:
        return tok.render_chat(prompt, messages=messages, add_generation_prompt=opts["add_generation_prompt"],
                               template_vars=opts["template_vars"])

    return functools.partial(chat_spans, prompt, text, render=render)  # (the text first, the instrumented render if not)


# Markers from Unicode's supplementary private use area A (plane 15): message i's content is wrapped in
# chr(_MARK + 2i) ... chr(_MARK + 2i + 1) for one instrumented render.
_MARK = 0xF0000
_MARK_END = 0xFFFFD
_MARKS = re.compile("[\U000F0000-\U000FFFFD]")


def _edges(content: str) -> tuple[str, str, str]:
    """``content`` as its leading whitespace, the rest trimmed, and its trailing whitespace (``str.isspace``'s
    whitespace, which is the ``\\s`` of a ``str`` pattern: every code point was checked). A string of whitespace only
    is all lead."""
    core = content.strip()
    if not core:
        return content, "", ""
    lead = len(content) - len(content.lstrip())
    return content[:lead], core, content[lead + len(core):]


def _marked_spans(prompt: PromptInput, text: str, render: Callable[[Sequence[dict]], str]) -> list[Span] | None:
    """Spans read from one render with every message's content wrapped in invisible markers.

    Exact wherever the template put the content (Mistral moves the system prompt into the last user turn,
    reasoning templates cut a think block's head off): the markers travel with the text. None when the
    instrumented render differs from the real one once the markers are removed (a template that compares
    content to a literal), or when the content already holds such characters.
    """
    msgs = list(prompt.messages or ())
    if 2 * len(msgs) > _MARK_END - _MARK or _MARKS.search(text):
        return None
    marked: list[dict] = []
    cores: list[tuple[int, str] | None] = []
    for i, msg in enumerate(msgs):
        content = msg.get("content")
        if not isinstance(content, str) or not content.strip():
            marked.append(msg)
            cores.append(None)
            continue
        ws, core, trail = _edges(content)  # markers inside the edge whitespace: trim keeps them
        marked.append({**msg, "content": f"{ws}{chr(_MARK + 2 * i)}{core}{chr(_MARK + 2 * i + 1)}{trail}"})
        cores.append((len(ws), core))
    try:
        out = render(marked)
    except Exception:  # the instrumented render is a best effort; the real one already succeeded
        return None
    clean: list[str] = []
    where: dict[int, list[int]] = {}  # marker code -> positions in the clean text
    last = 0
    pos = 0
    for m in _MARKS.finditer(out):
        clean.append(out[last:m.start()])
        pos += m.start() - last
        where.setdefault(ord(m.group(0)) - _MARK, []).append(pos)
        last = m.end()
    clean.append(out[last:])
    if "".join(clean) != text:
        return None
    spans: list[Span] = []
    for i, (msg, path) in enumerate(zip(msgs, prompt.field_paths)):
        kept = cores[i]
        if kept is None:
            continue
        lead, core = kept
        starts, ends = where.get(2 * i, []), where.get(2 * i + 1, [])
        role = msg.get("role")
        for s in starts:  # a start marker: the content from there, as far as the text follows it
            e = next((e for e in ends if e >= s), None)
            if e is None:
                e = s + common_prefix(text[s:s + len(core)], core)
            spans.append(Span(s, e, path, i, role, lead))
        for e in ends:  # an end marker without its start: the tail the template kept
            if any(sp.start <= e <= sp.end and sp.message_index == i for sp in spans):
                continue
            n = common_suffix(text[max(0, e - len(core)):e], core)
            if n:
                spans.append(Span(e - n, e, path, i, role, lead + len(core) - n))
    return spans


def _found_spans(prompt: PromptInput, text: str) -> list[Span] | None:
    """The spans :func:`_marked_spans` would read, without its instrumented render, where the text itself proves
    them: every message's content, trimmed of its edge whitespace as the markers are placed, occurs in the text
    exactly once, each after the one before it. That one place is where the template wrote it (a template that
    dropped a content, moved it ahead of an earlier one, wrote it twice or cut it leaves the text otherwise, and
    the instrumented render decides). None when any content is not so found."""
    msgs = prompt.messages or ()
    if 2 * len(msgs) > _MARK_END - _MARK or _MARKS.search(text):
        return None
    spans: list[Span] = []
    after = 0
    for i, (msg, path) in enumerate(zip(msgs, prompt.field_paths)):
        content = msg.get("content")
        if not isinstance(content, str) or not content.strip():
            continue
        lead, core, _ = _edges(content)
        at = text.find(core)
        if at < after or text.find(core, at + 1) >= 0:
            return None
        after = at + len(core)
        spans.append(Span(at, after, path, i, msg.get("role"), len(lead)))
    return spans


def common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def common_suffix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[len(a) - 1 - i] == b[len(b) - 1 - i]:
        i += 1
    return i


def chat_spans(prompt: PromptInput, text: str,
               render: Callable[[Sequence[dict]], str] | None = None) -> tuple[Span, ...]:
    """Find where each message's content and each tool schema landed in the rendered text.

    With ``render`` (the same chat template, same options) the contents are located where the text proves
    them (:func:`_found_spans`: each found exactly once, in order), else by an instrumented render
    (:func:`_marked_spans`), wherever the template put them. Otherwise, or when that fails,
    contents are searched in order from a moving cursor. Text the template wrote itself (a default
    system prompt, a date line, role headers) stays unattributed, i.e. template text.
    """
    marked = _found_spans(prompt, text) if render is not None else None
    if marked is None and render is not None:
        marked = _marked_spans(prompt, text, render)
    return _with_tools(prompt, text, list(marked) if marked is not None else _searched_spans(prompt, text))


def _with_tools(prompt: PromptInput, text: str, spans: list[Span]) -> tuple[Span, ...]:
    """The messages' spans with each tool schema's (found as templates commonly serialize it), sorted."""
    for t_idx, tool in enumerate(prompt.tools or ()):
        for rendered in _tool_renderings(tool):
            pos = text.find(rendered)
            if pos >= 0:
                spans.append(Span(pos, pos + len(rendered), f"tools[{t_idx}]"))
                break
    spans.sort(key=lambda s: (s.start, s.end))
    return tuple(spans)


def _searched_spans(prompt: PromptInput, text: str) -> list[Span]:
    spans: list[Span] = []
    cursor = 0
    for idx, (msg, path) in enumerate(zip(prompt.messages or (), prompt.field_paths)):
        content = msg.get("content")
        if not isinstance(content, str) or not content:
            continue
        pos = text.find(content, cursor)
        if pos < 0:  # the template rewrote it (stripped a think block, trimmed): try its last line
            tail = content.rsplit("</think>", 1)[-1].strip()
            pos = text.find(tail, cursor) if tail else -1
            if pos < 0:
                continue
            spans.append(Span(pos, pos + len(tail), path, idx, msg.get("role"), content.rfind(tail)))
            cursor = pos + len(tail)
            continue
        spans.append(Span(pos, pos + len(content), path, idx, msg.get("role")))
        cursor = pos + len(content)
    return spans


def _tool_renderings(tool: dict) -> Iterable[str]:
    # The ways chat templates commonly serialize a tool: transformers' tojson (json.dumps, keys unsorted,
    # optionally indented), with and without the {"type": "function"} wrapper.
    fn = tool.get("function") if isinstance(tool.get("function"), dict) else None
    for obj in (tool, fn) if fn else (tool,):
        for indent in (None, 4, 2):
            yield dumps_alike(obj, ensure_ascii=False, indent=indent)


# ----------------------------------------------------------------------------------------- loading


def load_tokenizer(spec: str, *, chat_template_file: str | None = None) -> TokenizerHandle:
    """Load a tokenizer from a model directory, a tokenizer.json file, or a cached Hugging Face id."""
    handle = _load_tokenizer(spec, chat_template_file)
    if chat_template_file is not None:
        handle.template_source = chat_template_file
    return handle


def _load_tokenizer(spec: str, chat_template_file: str | None) -> TokenizerHandle:
    chat_template = None
    if chat_template_file is not None:
        from .inputs.files import read_text

        chat_template, _ = read_text(chat_template_file)  # (bounded, located errors: a stream, a non-UTF-8 file)
    path = Path(spec).expanduser()
    if path.is_file():
        if path.name == "tokenizer_config.json":
            return _load_dir(path.parent, spec, chat_template)
        return _load_file(path, spec, chat_template)
    if path.is_dir():
        return _load_dir(path, spec, chat_template)
    if _HF_ID.match(spec) and not spec.endswith(".json"):
        return _load_hub_cached(spec, chat_template)
    raise _path_not_found(spec)


def _path_not_found(spec: str) -> TokenizerError:
    """A local tokenizer path that does not exist, with the close names beside it."""
    import difflib

    path = Path(spec).expanduser()
    if path.exists():  # (a device, a FIFO, a socket: there, but neither a directory nor a file)
        return TokenizerError(f"{spec}: not a tokenizer directory or a tokenizer.json file")
    if path.is_symlink():
        return TokenizerError(f"{spec}: a symbolic link to nothing (or to itself)")
    close = []
    if path.parent.is_dir():
        close = [c for c in difflib.get_close_matches(path.name, [p.name for p in path.parent.iterdir()], n=3)
                 if c != path.name]
    hint = f" (did you mean {', '.join(str(Path(spec).parent / c) for c in close)}?)" if close else ""
    return TokenizerError(f"tokenizer path not found: {spec}{hint}")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _load_file(path: Path, spec: str, chat_template: str | None) -> TokenizerHandle:
    transformers = _import_transformers()
    import tokenizers

    try:
        backend = tokenizers.Tokenizer.from_file(str(path))
    except Exception as exc:
        raise TokenizerError(f"{spec}: not a tokenizers JSON file ({_first_line(exc)})") from None
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=backend)
    return TokenizerHandle(str(spec), hf, chat_template)


def _load_dir(path: Path, spec: str, chat_template: str | None) -> TokenizerHandle:
    transformers = _import_transformers()
    if not any((path / name).exists() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt",
                                                   "tokenizer.model")):
        raise TokenizerError(f"{spec}: no tokenizer files here (expected tokenizer.json or tokenizer_config.json)")
    try:
        if _generic_fast_tokenizer(path):
            # No model-specific class: load it directly, which spares AutoTokenizer's import of torch
            # (seconds of start-up) and gives the same tokenizer.
            hf = transformers.PreTrainedTokenizerFast.from_pretrained(str(path), local_files_only=True)
        else:
            hf = transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as exc:
        raise TokenizerError(f"{spec}: cannot load tokenizer ({_first_line(exc)})") from None
    handle = TokenizerHandle(str(spec), hf, chat_template)
    if chat_template is None:  # the file transformers read the template from, for the errors it causes
        jinja = path / "chat_template.jinja"
        handle.template_origin = str(jinja if jinja.is_file() else path / "tokenizer_config.json")
    return handle


def _generic_fast_tokenizer(path: Path) -> bool:
    if not (path / "tokenizer.json").is_file():
        return False
    try:
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get("tokenizer_class") in ("PreTrainedTokenizerFast",
                                                                          "TokenizersBackend")


def _load_hub_cached(repo_id: str, chat_template: str | None) -> TokenizerHandle:
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import HF_HUB_CACHE

    try:
        folder = snapshot_download(repo_id, local_files_only=True)
    except Exception:
        if Path(repo_id).parent.is_dir():  # "fixtures/tokk": a local path with a typo, not a Hugging Face id
            raise _path_not_found(repo_id) from None
        raise TokenizerError(
            f"tokenizer {repo_id!r} is not a local path and is not in the Hugging Face cache ({HF_HUB_CACHE}); "
            "cachectl never downloads: pass a local model directory or tokenizer.json "
            f"(for example after `hf download {repo_id} --include 'tokenizer*' 'chat_template*'`)") from None
    return _load_dir(Path(folder), repo_id, chat_template)


def tokenizer_files(spec: str) -> list[str]:
    """The local files loading ``spec`` may read (for the refusal to overwrite an input): a tokenizer file, a
    directory's files (``tokenizer_config.json``'s directory for that file), or the files of a Hugging Face id
    in the local cache. Nothing is imported or loaded."""
    from .outputs import path_files

    path = Path(spec).expanduser()
    if path.is_file():
        return path_files(str(path.parent)) if path.name == "tokenizer_config.json" else [str(path)]
    if path.is_dir():
        return path_files(str(path))
    if not _HF_ID.match(spec):
        return []
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    cache = Path(os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE") or
                 os.path.join(home, "hub"))
    repo = cache / ("models--" + spec.replace("/", "--"))
    if not repo.is_dir():
        return []
    return sorted(str(p) for p in repo.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------- chat templates, lint


def template_environment():
    """transformers' own chat-template environment, bounded, in an overlay that refuses sandbox escapes.

    The environment is the one ``apply_chat_template`` compiles templates in (``ImmutableSandboxedEnvironment``
    with trim_blocks and lstrip_blocks, jinja2's loopcontrols, the ``{% generation %}`` extension, its
    ``tojson``, ``raise_exception``, ``strftime_now``, ``namespace`` and ``dict``), reached through one
    compiled template, not rebuilt. Its templates render under a budget (:mod:`cachectl.sandbox`: wall-clock
    and memory per render, watched from outside the render, and bounds on the operations that amplify).
    The overlay differs in one more point: reaching for an unsafe attribute (``__class__``, a mutating
    method) raises ``SecurityError`` where transformers renders it as undefined, so lint reports the attempt
    instead of rendering around it. Filters and globals are copied so that nothing set here reaches
    transformers' own renders.
    """
    return _template_environment(strict=True)


def chat_environment():
    """The same bounded environment for rendering a tokenizer's chat template as ``apply_chat_template``
    does, unsafe attributes undefined as in transformers (:meth:`TokenizerHandle.render_chat`)."""
    return _template_environment(strict=False)


@functools.cache
def _template_environment(strict: bool):
    _import_transformers()
    from jinja2.exceptions import SecurityError

    from . import sandbox

    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:  # pragma: no cover - a transformers release that moved it
        raise TokenizerError("this transformers release has no chat-template compiler cachectl can reuse "
                             "(transformers.utils.chat_template_utils._compile_jinja_template); install the "
                             "version constraints.txt names") from None
    base = _compile_jinja_template("").environment
    env = sandbox.apply(base.overlay(), base)
    if strict:
        def unsafe_undefined(obj: Any, attribute: str) -> Any:
            raise SecurityError(f"access to {attribute!r} of a {type(obj).__name__} is refused by the sandbox")

        env.unsafe_undefined = unsafe_undefined
    return env


@functools.lru_cache(maxsize=64)
def _compiled_chat_template(source: str) -> Any:
    return chat_environment().from_string(source)


def template_data(value: Any) -> Any:
    """What a template sees of a value, as transformers builds it (plain JSON types only)."""
    from transformers.utils import chat_template_utils as ctu

    plain = getattr(ctu, "_plain_template_data", None)
    return plain(value) if plain is not None else value


def render_chat_template(template: Any, messages: Sequence[dict], *, tools: Sequence[dict] | None = None,
                         documents: Sequence[dict] | None = None, add_generation_prompt: bool = False,
                         special_tokens: dict | None = None, overrides: dict | None = None, **kwargs: Any) -> str:
    """Render a compiled chat template (from :func:`template_environment`) as ``apply_chat_template`` does.

    The same values reach the template: messages without None-valued keys and with reasoning aliased
    (transformers' own helpers), ``tools`` and ``documents`` (None when absent), ``add_generation_prompt``,
    the tokenizer's special tokens, then ``kwargs``. ``overrides`` go in last and untouched: lint's
    instrumented callables (a recording ``strftime_now``).
    """
    from transformers.utils import chat_template_utils as ctu

    normalize = getattr(ctu, "_normalize_chat_messages", None)  # drops None-valued keys, as apply_chat_template does
    msgs = normalize(list(messages)) if normalize is not None else [dict(m) for m in messages]
    msgs = template_data(msgs)
    alias = getattr(ctu, "_alias_reasoning_fields", None)
    if alias is not None:
        msgs = alias(msgs)
    values = template_data({**(special_tokens or {}), **kwargs})
    return template.render(messages=msgs, tools=template_data(list(tools) if tools is not None else None),
                           documents=template_data(list(documents) if documents is not None else None),
                           add_generation_prompt=add_generation_prompt, **values, **(overrides or {}))
