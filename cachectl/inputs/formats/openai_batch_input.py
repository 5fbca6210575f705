"""OpenAI Batch API input files: one request per line, ``{"custom_id", "method", "url", "body"}``.

Read from OpenAI's Batch guide and API reference (platform.openai.com/docs/guides/batch,
/docs/api-reference/batch/request-input) and vLLM's ``run_batch`` example
(vllm-project/vllm examples/offline_inference/openai_batch/openai_example_batch.jsonl): ``body`` is the request
body of ``url`` (``/v1/chat/completions``, ``/v1/responses``, ...), sent as is. Every record is marked as a Batch
API call (``batch``: priced at the provider's batch rates where the price table has them), with its ``custom_id``
as a key; the body is taken verbatim from ``body`` (edits can be written back: ``fix`` reads and rewrites these lines
as cachectl's own, whose request is at ``body`` too, :data:`REWRITTEN_AS_NATIVE`). The output file's usage joins it by
``custom_id`` (:mod:`.openai_batch_output`). No timestamps: a batch runs within its completion window, in no
order the file gives (``--every`` spaces the lines).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from ...errors import InputError
from .base import Head, LogShape, Record, Verdict

SHAPE = LogShape(
    "openai-batch-input", "OpenAI Batch API input files",
    "a JSON object per line with `custom_id`, `method`, `url` and a `body` object",
    "the request body, its `custom_id`, marked as a Batch API call (batch prices); joined to the output's usage "
    "by `custom_id` with `--usage OUTPUT.jsonl`",
    ("prompt-cost", "report", "fix", "semantic-probe dupes"),
    "fixtures/logs/openai_batch_input.jsonl",
    "https://platform.openai.com/docs/api-reference/batch/request-input",
)


#: a line is a request itself, its body at ``body`` as in cachectl's own wrapper: ``fix`` rewrites the file as one of
#: cachectl's own (a Batch line is priced at the batch rates there too:
#: :func:`cachectl.engines.provider.cache.is_batch_line`)
REWRITTEN_AS_NATIVE = True


def detect(head: Head) -> Verdict:
    first = head.first
    if not isinstance(first, dict) or "custom_id" not in first:
        return Verdict.no()
    if isinstance(first.get("body"), dict) and "url" in first:
        return Verdict.yes()
    if "url" in first or "method" in first:
        return Verdict.almost("has no `body` object (the request)")
    return Verdict.no()


def check_line(value: object, source: str, n: int) -> tuple[dict, str]:
    """A batch request line's body and ``custom_id``, or one located line: ``report`` reads each line through it,
    and ``fix`` (which reads the lines as cachectl's own) too, so that both refuse the same lines."""
    if not isinstance(value, dict):
        raise InputError("expected a batch request line {custom_id, method, url, body}", source=source, line=n)
    body = value.get("body")
    if not isinstance(body, dict):
        raise InputError("expected the request body (an object)", source=source, line=n, field="body")
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str):
        raise InputError("expected a string", source=source, line=n, field="custom_id")
    return body, custom_id


def read(lines: Iterable[tuple[int, bytes]], source: str) -> Iterator[Record]:
    from ..files import parse_jsonl_line

    for n, raw in lines:
        body, custom_id = check_line(parse_jsonl_line(raw, source, n), source, n)
        model = body.get("model")
        yield Record(shape=SHAPE.name, source=source, line=n, body=body,
                     model=model if isinstance(model, str) else None, keys={"custom_id": custom_id},
                     batch=True, body_path="body")
