"""OpenAI Batch API output files, and their join to the input file by ``custom_id``.

Read from OpenAI's Batch guide and API reference (platform.openai.com/docs/guides/batch,
/docs/api-reference/batch/request-output): a line is ``{"id", "custom_id", "response": {"status_code",
"request_id", "body"}, "error"}``; ``body`` is the endpoint's response (its ``usage`` in the endpoint's own
convention: Chat ``prompt_tokens``/``prompt_tokens_details.cached_tokens``, Responses
``input_tokens``/``input_tokens_details.cached_tokens``); a failed request has ``response: null`` and an
``error``, or a non-200 ``status_code``, and bills nothing: it is skipped. The order follows completion, not the
input. vLLM's ``run_batch`` writes the same lines (vllm-project/vllm examples/offline_inference/openai_batch/
README.md); its early versions put the response body directly in ``response`` (no ``status_code``/``body``),
read too.

A record is the billed usage of one Batch API call (``batch``), its model, ``custom_id`` and ``request_id``; it
has no request body. The join (:func:`usage_index`, :func:`join`): the output file is read first into a dict
``custom_id -> (usage, model, line)``, which holds only the usage objects (a few hundred bytes a call, never the
response bodies), then the input file streams through and each request takes its usage; memory is bounded by the
number of calls in the batch (at most 50,000 per OpenAI batch), whichever file is larger.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ...errors import InputError
from .base import Head, LogShape, Record, Verdict, wrapper_value

SHAPE = LogShape(
    "openai-batch-output", "OpenAI Batch API output files",
    "a JSON object per line with `custom_id` and a `response` holding the response `body` (or `response: null` "
    "with an `error`)",
    "the billed usage of each call, its model, `custom_id` and `request_id`, marked as a Batch API call (batch "
    "prices); no request: join it to the input with `prompt-cost INPUT.jsonl --usage OUTPUT.jsonl`",
    ("prompt-cost",),
    "fixtures/logs/openai_batch_output.jsonl",
    "https://platform.openai.com/docs/api-reference/batch/request-output",
)


def detect(head: Head) -> Verdict:
    first = head.first
    if not isinstance(first, dict) or "custom_id" not in first:
        return Verdict.no()
    response = first.get("response")
    if isinstance(response, dict) and (isinstance(response.get("body"), dict) or "usage" in response):
        return Verdict.yes()
    if response is None and "error" in first:
        return Verdict.yes()
    if "response" in first:
        return Verdict.almost("has no `response.body` (the response)")
    return Verdict.no()


def _call(value: Any, source: str, n: int) -> tuple[str, dict, str | None, str | None] | None:
    """``(custom_id, usage, model, request_id)`` of an output line; None for a failed (unbilled) request."""
    if not isinstance(value, dict):
        raise InputError("expected a batch output line {id, custom_id, response, error}", source=source, line=n)
    custom_id = value.get("custom_id")
    if not isinstance(custom_id, str):
        raise InputError("expected a string", source=source, line=n, field="custom_id")
    response = value.get("response")
    if response is None:
        return None
    if not isinstance(response, dict):
        raise InputError("expected an object or null", source=source, line=n, field="response")
    status = response.get("status_code", 200)
    if status != 200:
        return None
    body, path = (response["body"], "response.body") if "body" in response else (response, "response")
    if not isinstance(body, dict):
        raise InputError("expected the response body (an object)", source=source, line=n, field=path)
    usage = body.get("usage")
    if not isinstance(usage, dict):
        raise InputError("expected the billed usage (an object)", source=source, line=n, field=f"{path}.usage")
    model = body.get("model")
    request_id = response.get("request_id")
    return (custom_id, usage, model if isinstance(model, str) else None,
            request_id if isinstance(request_id, str) else None)


#: what commands that need request bodies say on a batch output (report, fix, diff-tokens --log)
NO_BODY = ("an OpenAI Batch output file holds the responses, not the requests: `cachectl prompt-cost --usage FILE` "
           "audits what they billed, and `cachectl prompt-cost INPUT.jsonl --usage FILE` joins them to the batch "
           "input's requests")

#: what every record of a batch output lacks
_MISSING = ("the request (a batch output has none: pass the input file, with this one as `--usage`)",)


def read(lines: Iterable[tuple[int, bytes]], source: str) -> Iterator[Record]:
    from ..files import parse_jsonl_line

    for n, raw in lines:
        call = _call(parse_jsonl_line(raw, source, n), source, n)
        if call is None:
            continue
        custom_id, usage, model, request_id = call
        yield Record(shape=SHAPE.name, source=source, line=n, usage=usage, model=model,
                     keys={"custom_id": custom_id, "request_id": request_id}, batch=True, missing=_MISSING)


def values(lines: Iterable[tuple[int, bytes]], source: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, record.value())`` of each record :func:`read` yields, without building the records."""
    from ..files import parse_jsonl_line

    for n, raw in lines:
        call = _call(parse_jsonl_line(raw, source, n), source, n)
        if call is None:
            continue
        custom_id, usage, model, request_id = call
        yield n, wrapper_value({"custom_id": custom_id, "request_id": request_id}, usage=usage, model=model,
                               batch=True)


def usage_index(path: str) -> dict[str, tuple[dict, str | None, int]]:
    """``custom_id -> (usage, model, line)`` of a batch output file; a ``custom_id`` twice is an error."""
    from ..files import display_name, iter_raw_lines, parse_jsonl_line

    source = display_name(path)
    index: dict[str, tuple[dict, str | None, int]] = {}
    for n, raw, src in iter_raw_lines(path):
        call = _call(parse_jsonl_line(raw, src, n), source, n)
        if call is None:
            continue
        custom_id, usage, model, _ = call
        if custom_id in index:
            raise InputError(f"custom_id {custom_id!r} is answered twice (first at line {index[custom_id][2]})",
                             source=source, line=n, field="custom_id")
        index[custom_id] = (usage, model, n)
    return index


def join(values: Iterable[tuple[int, Any]], index: dict[str, tuple[dict, str | None, int]], *, source: str,
         output: str) -> Iterator[tuple[int, Any]]:
    """The input's ``(line, value)`` with each request's billed ``usage`` from ``index`` (by ``custom_id``) and
    marked as a Batch API call; a request the output does not answer passes without usage. ``index`` is emptied;
    a ``custom_id`` of the output that no input line has is an error (the files are not one batch)."""
    for line, value in values:
        if isinstance(value, dict):
            custom_id = value.get("custom_id")
            if not isinstance(custom_id, str):
                raise InputError("expected a string: a batch input line joins its output by custom_id",
                                 source=source, line=line, field="custom_id")
            found = index.pop(custom_id, None)
            value = {**value, "batch": True}
            if found is not None:
                value["usage"] = found[0]
        yield line, value
    if index:
        custom_id, (_, _, n) = next(iter(index.items()))
        raise InputError(f"custom_id {custom_id!r} (and {len(index) - 1:,} more) is in no line of {source}: the "
                         "output and input are not the same batch", source=output, line=n, field="custom_id")
