"""vLLM server logs written with ``--enable-log-requests`` (``vllm serve ... > server.log``).

Read from vLLM's own code (github.com/vllm-project/vllm): the line prefix is ``vllm/logger.py``'s ``_FORMAT``,
``"%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s"`` with ``_DATE_FORMAT = "%m-%d %H:%M:%S"``
(before about v0.6: ``%(filename)s:%(lineno)d]`` without the bracket; later ``%(fileinfo)s``; an optional
``VLLM_LOGGING_PREFIX`` before it, and ``(APIServer pid=N)`` where vLLM prefixes a child process's output). The
request line is ``vllm/entrypoints/logger.py`` ``RequestLogger.log_inputs``, in these versions:

- v0.4-v0.10 (one INFO line): ``Received request %s: prompt: %r, params: %s, prompt_token_ids: %s,
  [prompt_embeds shape: %s, ]lora_request: %s[, prompt_adapter_request: %s].`` (commits 01ff1262 and earlier);
  before ``RequestLogger`` (``async_llm_engine.py``, v0.3): ``Received request %s: prompt: %r,
  [prefix_pos: %s,]sampling_params: %s, prompt_token_ids: %s, lora_request: %s.``;
- v0.11.2 and later (commit 63c2b7ab): the prompt moved to DEBUG, ``Request %s details: prompt: %r,
  prompt_token_ids: %s, prompt_embeds shape: %s.`` then INFO ``Received request %s: params: %s, lora_request:
  %s.``: the prompt is in the log only with ``VLLM_LOGGING_LEVEL=DEBUG`` (vllm-project/vllm#29208, #34503).

``--max-log-len N`` cuts the prompt to N characters and the token IDs to N IDs, silently. A record's prompt is
flagged as cut (``missing``) where the log shows it: the text and the ID list both end at the same length, or, in
the first 64 requests, two different prompts stop at the same largest length (then every prompt of that length is
flagged).

The prompt is a Python ``repr``: its literal is found by scanning for its closing quote and read with
``ast.literal_eval`` on that literal alone (never ``eval``); the token IDs are a list of integers. What vLLM's
logger never writes: the model (one server serves one; pass ``--model``), a cache salt (``cache_salt`` is not in
any version's request line read), the output length (``max_tokens`` is a limit, not the output).

Timestamps: the prefix has month, day and time, no year and no zone (the server's local time). A record's
``timestamp`` is the seconds since the file's first request line (a relative time: gaps and TTLs are exact, the
date is not claimed); the logged ``MM-DD HH:MM:SS`` is kept as ``logged_at``. A date earlier than the previous
one by more than a day is read as the next year (a log across New Year). Lines that are not request lines
(startup, metrics, access logs, NCCL) are skipped.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from typing import Any, NamedTuple

import orjson

from ...errors import InputError
from .base import Head, LogShape, Record, Verdict, wrapper_value

SHAPE = LogShape(
    "vllm-log", "vLLM server logs with --enable-log-requests",
    "text lines in vLLM's logging format (`INFO 05-14 10:11:12 [logger.py:39] ...`)",
    "one record per `Received request` (or DEBUG `Request ... details`) line: the prompt text and its "
    "`prompt_token_ids` when logged (no tokenizer needed then), the request id, the time since the first request, "
    "the LoRA adapter; prompts cut by `--max-log-len` flagged",
    ("simulate-prefix", "report"),
    "fixtures/logs/vllm_requests.log",
    "github.com/vllm-project/vllm vllm/entrypoints/logger.py (RequestLogger.log_inputs), vllm/logger.py",
)

_PREFIX = re.compile(rb"(DEBUG|INFO|WARNING|ERROR|CRITICAL) (\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:[.,]\d+)? "
                     rb"\[?[\w./<>-]+:\d+\] ")
#: what ``_received`` tells (``Received request (\S+?): ``; no regex: a lazy group tries each length)
_RECEIVED = re.compile(r"Received request (\S+?): ")
_RECEIVED_OPENER = "Received request "
_DETAILS = re.compile(r"Request (\S+?) details: ")
_IDS = re.compile(r"prompt[_ ]token[_ ]ids: (None|\[[0-9, ]*\])")
#: the LoRA adapter: ``LoRARequest(`` up to the first ``)`` followed by the next field or the line's end; each
#: ``[^)\n]*\)`` runs to the next ``)`` (as ``.*?\)`` would, one character at a time), lazily: the same matches
_LORA = re.compile(r"lora_request: (None|LoRARequest\((?:[^)\n]*\))+?)(?:, prompt_adapter_request|\.?$)")
_LORA_OPENER = "lora_request: "
_LORA_NAME = re.compile(r"lora_name='([^']*)'")
#: how the message of a request line starts (INFO ``Received request``, DEBUG ``Request ... details``)
_REQUEST_LINE = (b"Received request ", b"Request ")
#: the prefix ends within a line's first 400 bytes, with ``] ``: a request line has one of these (``] `` and how
#: its message starts) within its first ``_SEEN`` bytes
_REQUEST_OPENERS = (b"] Received request ", b"] Request ")
#: what both openers start with: a line without it within its first ``_SEEN`` bytes has neither (one scan)
_OPENERS_START = b"] Re"
_SEEN = 400 + len(b"Received request ")
#: requests whose prompt lengths are looked at to infer a --max-log-len cap
_CAP_WINDOW = 64
#: DEBUG details lines waiting for their INFO line (they are adjacent; the bound only guards odd logs)
_PENDING = 4096


def detect(head: Head) -> Verdict:
    if head.values:
        return Verdict.no()
    lines = [h.raw for h in head.lines]
    if any(_PREFIX.search(raw[:400]) for raw in lines):
        return Verdict.yes()
    return Verdict.no()


#: a Python string literal as repr() writes it, single- or double-quoted, escapes included (found by the regex
#: engine, not a loop over characters)
_STRING = {"'": re.compile(r"'[^'\\]*(?:\\.[^'\\]*)*'", re.S), '"': re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)}


_OTHER_ESCAPE = re.compile(r"\\[^ntr\\'\"]")


def _unescape(body: str) -> str:
    """A literal's body whose escapes are only ``\\n \\t \\r \\\\ \\' \\"``, undone. An ASCII body by the
    ``unicode_escape`` codec (which reads exactly Python's escapes, these among them); any other: split at the
    escaped backslashes (a run of backslashes pairs up from its start, as str.split finds them), each part's
    one-backslash escapes replaced (what they become holds no backslash: no new escape is formed), joined by a
    backslash."""
    if body.isascii():
        return body.encode("ascii").decode("unicode_escape")
    return "\\".join(part.replace("\\n", "\n").replace("\\t", "\t").replace("\\r", "\r").replace("\\'", "'")
                      .replace('\\"', '"') for part in body.split("\\\\"))


def _closing(text: str, quote: str, start: int) -> int:
    """The index of the quote that closes the literal whose body starts at ``text[start]``, or -1: the first
    ``quote`` after an even run of backslashes (a run pairs up from its start: an odd one escapes the quote), as
    :data:`_STRING` matches it, told by ``str.find`` (most prompts escape no quote: one find)."""
    j = text.find(quote, start)
    while j >= 0:
        k = j
        while k > start and text[k - 1] == "\\":
            k -= 1
        if not (j - k) & 1:
            return j
        j = text.find(quote, j + 1)
    return -1


def _literal(text: str, start: int, where: dict[str, Any]) -> tuple[str | None, int]:
    """The Python string literal (or ``None``) at ``text[start:]``, and the index after it."""
    if text.startswith("None", start):
        return None, start + 4
    quote = text[start:start + 1]
    if quote not in _STRING:
        raise InputError("expected the prompt's Python string literal", field="prompt", **where)
    end = _closing(text, quote, start + 1)
    if end < 0:
        raise InputError("the prompt's string literal does not end on this line", field="prompt", **where)
    body = text[start + 1:end]
    if "\\" not in body:  # nothing escaped: the text is the literal's body
        return body, end + 1
    if body.count("\\") == body.count("\\n"):  # each backslash starts a \n (a chat prompt's only escape)
        return body.replace("\\n", "\n"), end + 1
    if _OTHER_ESCAPE.search(body) is None:  # only \n \t \r \\ \' \" (a chat prompt's): undone at C speed
        return _unescape(body), end + 1
    try:
        value = ast.literal_eval(text[start:end + 1])  # the literal alone, never eval
    except (ValueError, SyntaxError):
        raise InputError("the prompt's string literal does not end on this line", field="prompt", **where) from None
    if not isinstance(value, str):
        raise InputError("expected the prompt's Python string literal", field="prompt", **where)
    return value, end + 1


def _received(text: str) -> tuple[str, int] | None:
    """``(request id, the index after its ": ")`` of an INFO ``Received request ID: `` message, as
    ``_RECEIVED.match`` finds it: the id is the text up to the first ``": "`` after its first character, and has
    no white space (``str.split`` and the regex's ``\\s`` are the same white space: then no later ``": "`` can end
    the id either)."""
    if not text.startswith(_RECEIVED_OPENER):
        return None
    start = len(_RECEIVED_OPENER)
    end = text.find(": ", start + 1)
    if end < 0:
        return None
    rid = text[start:end]
    return (rid, end + 2) if rid.split() == [rid] else None


def _ids(text: str, where: dict[str, Any], pos: int = 0) -> list[int] | None:
    """The prompt's token IDs logged in ``text[pos:]`` (None where none are)."""
    m = _IDS.search(text, pos)
    if m is None or m.group(1) == "None":
        return None
    try:
        ids = orjson.loads(m.group(1))
    except orjson.JSONDecodeError:
        raise InputError("expected a list of token IDs", field="prompt_token_ids", **where) from None
    return ids


def _lora(text: str, pos: int = 0) -> str | None:
    """The adapter's name (or its whole ``LoRARequest(...)``) in ``text[pos:]`` as ``_LORA.search`` finds it: a
    match starts with ``lora_request: ``, so the pattern is matched where ``str.find`` finds that (the regex
    engine's own scan for it costs more)."""
    i = text.find(_LORA_OPENER, pos)
    m = None
    while i >= 0 and (m := _LORA.match(text, i)) is None:
        i = text.find(_LORA_OPENER, i + 1)
    if m is None or m.group(1) == "None":
        return None
    name = _LORA_NAME.search(m.group(1))
    return name.group(1) if name else m.group(1)


class _Clock:
    """Seconds since the first request line, from month-day-time prefixes without a year."""

    def __init__(self) -> None:
        self.first: datetime | None = None
        self.year = 2000  # a leap year, so 02-29 reads; only differences are used
        #: the last ``MM-DD HH:MM:SS`` read and its answer
        self.last: bytes | None = None
        self.last_seconds = 0.0
        #: the last time read, as the midnight of its day and the seconds since then, and that midnight's answer
        self.day: datetime | None = None
        self.offset = 0
        self.day_seconds = 0.0

    def seconds(self, stamp: bytes) -> float:
        """The seconds of ``MM-DD HH:MM:SS`` since the first request line's."""
        if stamp == self.last:  # lines logged in one second: the same answer (the clock does not move)
            return self.last_seconds
        hh, mm, ss = int(stamp[6:8]), int(stamp[9:11]), int(stamp[12:14])
        if self.last is not None and stamp[:5] == self.last[:5] and hh < 24 and mm < 60 and ss < 60:
            # the day of the last time: no datetime to build (nor a year to turn: within one day)
            self.offset = hh * 3600 + mm * 60 + ss
            self.last, self.last_seconds = stamp, self.day_seconds + self.offset
            return self.last_seconds
        when = datetime(self.year, int(stamp[:2]), int(stamp[3:5]), hh, mm, ss)
        if self.day is not None and (self.day + timedelta(seconds=self.offset) - when).total_seconds() > 86400:
            self.year += 1
            when = when.replace(year=self.year)
        if self.first is None:
            self.first = when
        self.day, self.offset = when.replace(hour=0, minute=0, second=0), hh * 3600 + mm * 60 + ss
        self.day_seconds = (self.day - self.first).total_seconds()
        self.last, self.last_seconds = stamp, (when - self.first).total_seconds()
        return self.last_seconds


class _Request(NamedTuple):
    """One request as its line (or its DEBUG and INFO lines) tell it: what its record and its wrapper line are
    built from."""

    line: int
    timestamp: float
    request_id: str
    logged_at: str
    lora: str | None
    prompt: str | None
    tokens: list[int] | None


#: what every record of a vLLM log lacks, and what a prompt cut by --max-log-len adds
_NO_MODEL = "model (vLLM's request line does not name it)"
_CUT = "the whole prompt (cut by --max-log-len)"


def read(lines: Iterable[tuple[int, bytes]], source: str) -> Iterator[Record]:
    requests = _requests(lines, source)
    window, cap = _held(requests)
    for r in itertools.chain(window, requests):
        yield Record(shape=SHAPE.name, source=source, line=r.line, timestamp=r.timestamp, tokens=r.tokens,
                     prompt=r.prompt, keys={"request_id": r.request_id, "logged_at": r.logged_at, "lora": r.lora},
                     missing=(_NO_MODEL, _CUT) if _cut(r, cap) else (_NO_MODEL,))


def values(lines: Iterable[tuple[int, bytes]], source: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line, record.value())`` of each record :func:`read` yields, without building the records (nor telling
    the cut prompts: a record's value does not say it), given when :func:`read` gives them."""
    requests = _requests(lines, source)
    window, _ = _held(requests)
    for r in itertools.chain(window, requests):
        yield r.line, wrapper_value({"request_id": r.request_id, "logged_at": r.logged_at, "lora": r.lora},
                                    timestamp=r.timestamp, tokens=r.tokens, prompt=r.prompt)


def _length(r: _Request) -> int:
    return len(r.prompt) if r.prompt is not None else len(r.tokens or ())


def _held(requests: Iterator[_Request]) -> tuple[list[_Request], int | None]:
    """The first :data:`_CAP_WINDOW` requests (read before any is given) and the --max-log-len cap they tell: the
    largest prompt length, where two different prompts have it."""
    window = list(itertools.islice(requests, _CAP_WINDOW))
    lengths = [_length(r) for r in window if r.prompt is not None or r.tokens]
    if not lengths:
        return window, None
    top = max(lengths)
    shapes = {(r.prompt, tuple(r.tokens or ())) for r in window if _length(r) == top}
    return window, top if top >= 16 and len(shapes) >= 2 else None


def _cut(r: _Request, cap: int | None) -> bool:
    """Whether the prompt was cut by --max-log-len: its text and its ID list end at one length, or it has the
    cap's length."""
    if r.prompt is not None and r.tokens is not None and len(r.prompt) == len(r.tokens) > 0:
        return True
    return cap is not None and _length(r) == cap


def _requests(lines: Iterable[tuple[int, bytes]], source: str) -> Iterator[_Request]:
    """The requests of a vLLM log in the order their records come: a DEBUG details line's once its INFO line is
    read (or at the end, or when too many wait)."""
    clock = _Clock()
    pending: OrderedDict[str, _Request] = OrderedDict()
    skipped = info_only = emitted = 0
    for n, raw in lines:
        if raw.find(_OPENERS_START, 0, _SEEN) < 0 or (raw.find(_REQUEST_OPENERS[0], 0, _SEEN) < 0
                                                     and raw.find(_REQUEST_OPENERS[1], 0, _SEEN) < 0):
            skipped += 1  # no request line (nor vLLM's ``Added request``): told by C-speed scans, not the regex
            continue
        head = _PREFIX.match(raw, 0, 400) or _PREFIX.search(raw, 0, 400)  # most lines start with their prefix
        if head is None or not raw.startswith(_REQUEST_LINE, head.end()):  # startup, metrics, access logs
            skipped += 1
            continue
        text = raw[head.end():].decode("utf-8", "replace")
        where: dict[str, Any] = {"source": source, "line": n}
        received = _received(text)  # an INFO line (most are): it starts otherwise than a DEBUG details line
        details = _DETAILS.match(text) if received is None else None
        if received is not None:
            rid, at = received
        elif details is not None:
            rid, at = details.group(1), details.end()
        else:
            skipped += 1
            continue
        stamp = raw[head.start(2):head.end(6)]  # MM-DD HH:MM:SS as logged
        try:
            seconds = clock.seconds(stamp)
        except ValueError:  # (a month 13, a day 45, an hour 99: the prefix's digits are not a date)
            raise InputError(f"{stamp.decode('ascii', 'replace')!r} is not a month, day and time (MM-DD HH:MM:SS)",
                             **where) from None
        if received is not None and rid in pending:  # v0.11.2+: the INFO line after the DEBUG details
            r = pending.pop(rid)
            lora = _lora(text, at)
            emitted += 1
            yield r._replace(lora=lora) if lora else r
            continue
        if text.startswith("prompt: ", at):
            prompt, end = _literal(text, at + len("prompt: "), where)
        elif received is not None and text.startswith("params: ", at):
            info_only += 1  # v0.11.2+ at INFO: the prompt is not in the log
            continue
        elif received is not None:  # (neither form: a request line cut or garbled, not to be left out unsaid)
            raise InputError("expected `prompt: ` or `params: ` after the request id", **where)
        else:
            raise InputError("expected `prompt: ` after the request id", **where)
        tokens = _ids(text, where, end)
        if prompt is None and tokens is None:
            skipped += 1  # prompt embeddings only
            continue
        request = _Request(n, seconds, rid, stamp.decode(), _lora(text, end), prompt, tokens)
        if details is None:
            emitted += 1
            yield request
            continue
        pending[rid] = request
        while len(pending) > _PENDING:
            emitted += 1
            yield pending.popitem(last=False)[1]
    emitted += len(pending)
    yield from pending.values()
    if not emitted:
        _nothing_read(source, skipped, info_only)


def _nothing_read(source: str, skipped: int, info_only: int) -> None:
    if info_only:
        raise InputError(f"{info_only:,} request lines, none with its prompt: vLLM 0.11.2 and later log the "
                         "prompt and its token IDs only at DEBUG (run the server with VLLM_LOGGING_LEVEL=DEBUG "
                         "and --enable-log-requests)", source=source)
    raise InputError(f"no request lines among {skipped:,} vLLM log lines: start the server with "
                     "--enable-log-requests", source=source)
