"""The render and tokenize step of ``report`` and ``fix``, mapped over a Ray cluster (``--ray ADDRESS``), before
the run's passes: each distinct chat prompt of the log is rendered through the chat template and encoded once, on
the cluster, and its text and token IDs are kept (:class:`ClusterRenders`, the tokenizer's ``prefilled``) under the
key the passes look them up by. The driver then does what is sequential (grouping, the replays, the fork tree, the
fixes) without rendering or encoding an original prompt again; the results are the same as without the cluster (the
same template, tokenizer and key).

``prefill(lines, tokenizer, generation_prompts=(True,), ray_address="local") -> Prefilled``

A task loads the tokenizer by the name and chat template file the run loaded it from (a worker keeps it for its
next tasks), so a cluster past this machine needs them at the same paths. A prompt a task cannot render is left
to the driver, which renders it in its pass and reports the error there, naming the line. Raw-text and token-ID
prompts have no render to keep: the passes encode them as before.
"""

from __future__ import annotations

import os
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ...spool import Spool
from ..prefix.packed import RenderCodec

#: prompts a task renders (a task's messages travel to it pickled, its texts and IDs back)
CHUNK = 256


@dataclass(frozen=True)
class Prefilled:
    prompts: int        # distinct (prompt, generation prompt) renders asked of the cluster
    rendered: int       # of them, rendered and encoded there (the rest: left to the driver)
    tasks: int


class ClusterRenders:
    """The cluster's renders, read by the tokenizer instead of rendered (its ``prefilled``): each render's text and
    token IDs by its :meth:`~cachectl.tokenization.TokenizerHandle.prefill_key`, packed as the fork analysis packs a
    render (:class:`~cachectl.engines.prefix.packed.RenderCodec`) in a spool on disk; in memory a dict entry a
    render."""

    __slots__ = ("_at", "_codec", "_spool")

    def __init__(self) -> None:
        self._at: dict[bytes, int] = {}
        self._codec = RenderCodec()
        self._spool = Spool()

    def __contains__(self, key: bytes) -> bool:
        return key in self._at

    def put(self, key: bytes, text: str, ids: Sequence[int]) -> None:
        self._at[key] = self._spool.put_bytes(self._codec.pack(array("I", ids), text=text))

    def get(self, key: bytes) -> tuple[str, array] | None:
        """The render kept under ``key`` (its text, its token IDs), or None."""
        k = self._at.get(key)
        if k is None:
            return None
        ids, _, _, text = self._codec.unpack(self._spool.get_bytes(k))
        assert text is not None
        return text, ids


def kept_renders(tokenizer: Any) -> ClusterRenders:
    """``tokenizer``'s prefilled renders, made empty on first use: from then on a chat prompt kept there is read, not
    rendered and encoded."""
    if tokenizer.prefilled is None:
        tokenizer.prefilled = ClusterRenders()
    return tokenizer.prefilled


def prefill(lines: Iterable[Any], tokenizer: Any, *, generation_prompts: Sequence[bool] = (True,),
            ray_address: str | None = None, jobs: int = 1) -> Prefilled:
    """Render and encode the chat prompts of ``lines`` (:class:`~.groups.LogLine`) on Ray, once each per value of
    ``generation_prompts``, into ``tokenizer``'s prefilled renders (read from now on instead of rendered:
    :func:`kept_renders`). ``ray_address``: as :func:`cachectl.raycluster.ray_cluster` takes it (``local``: a Ray
    instance of ``jobs`` CPUs for the run)."""
    from ...raycluster import ray_cluster, task_error

    if tokenizer.chat_template is None:  # (the driver's first render says so, naming the line)
        return Prefilled(0, 0, 0)
    kept = kept_renders(tokenizer)
    todo: dict[bytes, tuple] = {}  # render key -> (messages, tools, add_generation_prompt)
    for ln in lines:
        p = ln.prompt
        if not p.is_chat or not p.messages:
            continue
        msgs = list(p.messages)
        tools = list(p.tools) if p.tools else None
        source = tokenizer.hf.get_chat_template(None, tools)
        for gen in generation_prompts:
            key = tokenizer.prefill_key(msgs, tools, gen, None, source)  # (the key the passes look it up by)
            if key is not None and key not in todo and key not in kept:
                todo[key] = (msgs, tools, gen)
    if not todo:
        return Prefilled(0, 0, 0)
    keys = list(todo)
    chunks = [keys[k:k + CHUNK] for k in range(0, len(keys), CHUNK)]
    spec = (_path_or_name(tokenizer.name), _path_or_name(tokenizer.template_source))
    rendered = 0
    with ray_cluster(ray_address, jobs=jobs, origin="--ray") as ray:
        task = ray.remote(render_chunk)
        refs = [task.remote(spec, [todo[k] for k in chunk]) for chunk in chunks]
        for chunk, ref in zip(chunks, refs):
            try:
                got = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                raise task_error(ray, exc) from None
            for key, item in zip(chunk, got):
                if item is None:
                    continue
                text, data = item
                kept.put(key, text, array("I", data))
                rendered += 1
    return Prefilled(len(keys), rendered, len(chunks))


def render_chunk(spec: tuple[str, str | None], items: Sequence[tuple]) -> list[tuple[str, bytes] | None]:
    """A task: each ``(messages, tools, add_generation_prompt)`` rendered through the chat template and encoded
    as the passes encode a chat render (no special tokens added: the template wrote them); None for one that does
    not render, or whose text is past the tokenize bound (the driver renders it again and says why)."""
    from ...errors import CachectlError
    from ...inputs import PromptInput

    tok = _tokenizer(spec)
    out: list[tuple[str, bytes] | None] = []
    for msgs, tools, gen in items:
        p = PromptInput(kind="openai", source="", line=None, messages=tuple(msgs), tools=tuple(tools) if tools else None)
        try:
            text = tok.render_chat(p, add_generation_prompt=gen)
            ids = tok.backend.encode(text, add_special_tokens=False).ids
        except CachectlError:  # (a render or a text the bounds refuse: the driver meets it again, naming the line)
            out.append(None)
            continue
        out.append((text, array("I", ids).tobytes()))
    return out


_LOADED: dict[tuple, Any] = {}


def _tokenizer(spec: tuple[str, str | None]) -> Any:
    """The tokenizer a task renders with, loaded once per worker process."""
    got = _LOADED.get(spec)
    if got is None:
        from ...tokenization import load_tokenizer

        got = _LOADED[spec] = load_tokenizer(spec[0], chat_template_file=spec[1])
    return got


def _path_or_name(spec: str | None) -> Any:
    """A local path made absolute (a worker's directory is not the driver's); a hub name as it is."""
    if spec is None or not os.path.exists(spec):
        return spec
    return os.path.abspath(spec)
