"""The exact-match duplicate rate of a log, streaming: the cache that needs no embeddings."""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from dataclasses import dataclass

from ...errors import InputError, UsageError
from .pairs import SCHEMA_VERSION


@dataclass(frozen=True, kw_only=True)
class DupesReport:
    schema_version: int = SCHEMA_VERSION
    lines: int
    distinct: int
    duplicates: int
    duplicate_rate: float | None
    normalize: str
    top: tuple[dict, ...]


_WS_RUN = re.compile(rb"\s+")


def exact_dupes(path: str, field_name: str = "prompt", normalize: str = "none", top: int = 10) -> DupesReport:
    """Exact-match duplicate rate of a JSONL log, streaming; memory follows the distinct prompts (16-byte
    digests), with the text kept only for prompts seen twice."""
    from ...inputs import get_path, iter_raw_lines, parse_jsonl_line

    if normalize not in ("none", "whitespace", "case"):
        raise UsageError("--normalize must be none, whitespace or case")
    counts: Counter = Counter()
    first_text: dict[bytes, str] = {}
    total = 0
    simple = "." not in field_name
    for line, raw, source in iter_raw_lines(path):
        value = parse_jsonl_line(raw, source, line)
        prompt = value.get(field_name) if (simple and isinstance(value, dict)) else get_path(value, field_name)
        if not isinstance(prompt, str):
            raise InputError("no prompt text", source=source, line=line, field=field_name)
        data = prompt.encode("utf-8")
        if normalize in ("whitespace", "case"):
            data = _WS_RUN.sub(b" ", data.strip())
        if normalize == "case":
            data = data.lower()
        digest = hashlib.blake2b(data, digest_size=16).digest()
        counts[digest] += 1
        if counts[digest] == 2:
            first_text[digest] = prompt
        total += 1
    distinct = len(counts)
    common = [{"prompt": first_text[d], "count": c} for d, c in counts.most_common(top) if c > 1]
    return DupesReport(lines=total, distinct=distinct, duplicates=total - distinct,
                       duplicate_rate=(total - distinct) / total if total else None, normalize=normalize,
                       top=tuple(common))
