"""Claude Code session transcripts: ``~/.claude/projects/<project>/<session>.jsonl`` and their subagents'
``<session>/subagents/agent-<id>.jsonl``.

Read as Claude Code 2.1.x writes them (no official schema exists; read from the transcripts themselves and from
the tools that parse them):

- real transcripts of Claude Code 2.1.39 (marot/spotter ``test/fixtures/transcripts/``, MIT, commit
  8cc42b0bd39d04e71e509d7d58e6782ab435329f): the trimmed excerpts in ``fixtures/logs/claude_code*``;
- ccusage (ryoppippi/ccusage, ``rust/crates/ccusage/src/adapter/claude/mod.rs`` and ``README.md`` at commit
  5816e640e8824986f33427203da164b01394a161): usage at ``message.usage`` of ``type: "assistant"`` lines, one
  usage per ``message.id`` + ``requestId``, sidechain replays of a parent's message dropped, ``<synthetic>``
  messages not API calls, ``usage.speed`` (``"fast"`` is another price);
- claude-code-log (daaain/claude-code-log ``test/test_data/``): ``summary`` lines (``summary``, ``leafUuid``),
  ``system`` ``compact_boundary`` lines (``compactMetadata.trigger``/``preTokens``) followed by a ``user`` line
  with ``isCompactSummary: true``.

What a line is:

- ``assistant``: one content block of an API response. Claude Code writes each block of one response on its own
  line, every line repeating the response's ``message.id``, the ``requestId`` and a ``usage``; the lines before
  the last carry the usage of the stream's start (the final ``output_tokens`` only on the last, which adds
  ``server_tool_use`` and ``iterations: []``). One :class:`~.base.Record` per response: its first line's place
  and timestamp, the usage of its line with the most output tokens; the prompt counters (input, cache read, cache
  write) must agree over its lines. Model ``<synthetic>`` lines (Claude Code's own error and interrupt notes) are
  not API calls: skipped.
- ``isSidechain: true`` (a subagent's line: in its own ``subagents/agent-<id>.jsonl``, ``agentId`` set; older
  versions wrote them into the session file): a call of its own, on the subagent's own cache timeline (key
  ``agent``). ``progress`` lines (``data.type: agent_progress``) repeat a running subagent's messages, usage
  included, inside the parent's file: never counted (the subagent's own file counts them).
- ``system`` ``compact_boundary``, a ``user`` line with ``isCompactSummary``, or a ``/compact`` command: the
  conversation was compacted; the next response of the session's main thread carries ``after_compaction``.
- ``summary`` (a conversation's title, ``leafUuid``), ``file-history-snapshot``, ``queue-operation``,
  ``attachment``, other ``system`` lines: no call, skipped.
- a ``user`` line opening with ``<task-notification>`` (a background task finished): the next response of the
  main thread carries ``after: "task-notification"`` (in real transcripts, such calls rewrite the prompt behind
  the system prompt: their cache reads fall, and the next call reads the old prefix again).

A transcript has no request body (only the text of each turn, not the system prompt, tools and cache markers
Claude Code sent), so every record says ``missing=("request body",)``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from ...errors import InputError
from .base import Head, LogShape, Record, Verdict, id_of, json_value, text_of

SHAPE = LogShape(
    "claude-code", "Claude Code session transcripts",
    "JSON lines with `type` (user, assistant, system, summary, progress, file-history-snapshot, ...) and "
    "`sessionId`/`uuid`, or `summary` lines with `leafUuid`",
    "one record per API response (its lines joined by `message.id` + `requestId`, the usage counted once): "
    "usage with the 5m/1h write split, model, timestamp, session, request and message ids, sidechain (subagent), "
    "cwd, compactions; no request body: `report` audits the cache timeline (breaks and their causes, the 1-hour "
    "TTL what-if)",
    ("report", "prompt-cost"),
    "fixtures/logs/claude_code/4d5611e5-241a-462a-8d15-5122611a9569.jsonl",
    "no official schema; Claude Code 2.1.x transcripts as written (see fixtures/logs/SOURCES.md), ccusage's "
    "reader (https://github.com/ryoppippi/ccusage)")

#: what commands that need request bodies say on a transcript (fix, diff-tokens --log)
NO_BODY = ("a Claude Code transcript has no request bodies (only each response's usage): `cachectl report` "
           "audits its cache timeline, `cachectl prompt-cost --usage` prices it")

_LINE_TYPES = {"user", "assistant", "system", "summary", "progress", "file-history-snapshot", "queue-operation",
               "attachment", "result"}
#: usage values that mean nothing was counted (an unknown key holding one is dropped, not refused)
_EMPTY: tuple[Any, ...] = ([], {}, 0, None, "")
#: the usage keys passed to the usage reader as they are (it knows them); the rest: dropped when empty, else kept
#: so that the reader refuses them (an unknown counter would be priced wrongly)
_KNOWN = {"input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
          "cache_creation", "server_tool_use", "service_tier", "inference_geo"}


def _is_line(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    kind = text_of(value, "type")
    if kind == "summary":
        return "leafUuid" in value or "summary" in value
    if kind == "file-history-snapshot":
        return "snapshot" in value or "messageId" in value
    return kind in _LINE_TYPES and "sessionId" in value and ("uuid" in value or "parentUuid" in value
                                                             or kind == "queue-operation")


def detect(head: Head) -> Verdict:
    values = head.values
    if values and any(_is_line(v) for v in values) and all(isinstance(v, dict) and "type" in v for v in values):
        return Verdict.yes()
    if any(isinstance(v, dict) and "sessionId" in v and isinstance(v.get("message"), dict) and "type" not in v
           for v in values):
        return Verdict.almost("has no `type` on its lines (user, assistant, ...)")
    return Verdict.no()


def clean_usage(usage: Any, *, source: str, line: int) -> dict:
    """The usage as the provider's reader takes it: unknown keys that hold nothing dropped (``iterations: []``,
    ``speed: "standard"`` the ordinary price); anything else kept, for the reader to refuse it by name."""
    if not isinstance(usage, dict):
        raise InputError("expected a usage object", source=source, line=line, field="message.usage")
    if _KNOWN.issuperset(usage):  # every key known (most lines): the usage as it stands, told at C speed
        return dict(usage)
    out = {}
    for k, v in usage.items():
        if k in _KNOWN:
            out[k] = v
        elif k == "speed" and v in ("standard", None):
            continue
        elif any(v == e and type(v) is type(e) for e in _EMPTY) or v is None:
            continue
        else:
            out[k] = v
    return out


def _prompt(usage: dict) -> tuple[Any, Any, Any]:
    return (usage.get("input_tokens"), usage.get("cache_read_input_tokens"),
            usage.get("cache_creation_input_tokens"))


def _text_of(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and isinstance(content[0], dict):
        text = content[0].get("text")
        return text if isinstance(text, str) else ""
    return ""


class _Response:
    __slots__ = ("line", "timestamp", "usage", "usage_line", "model", "keys")

    def __init__(self, line: int, timestamp: Any, usage: dict, model: Any, keys: dict) -> None:
        self.line = line
        self.timestamp = timestamp
        self.usage = usage
        self.usage_line = line
        self.model = model
        self.keys = keys


def read(lines: Iterable[tuple[int, bytes]], source: str) -> Iterator[Record]:
    from ..files import parse_jsonl_line

    responses: dict[tuple[Any, Any], _Response] = {}
    order: list[tuple[Any, Any]] = []
    #: session -> the pending marks for its main thread's next response
    compacted: dict[Any, Any] = {}
    notified: dict[Any, bool] = {}
    for n, raw in lines:
        value = parse_jsonl_line(raw, source, n)
        if not isinstance(value, dict):
            raise InputError("expected a JSON object (a transcript line)", source=source, line=n)
        kind = value.get("type")
        session = id_of(value, "sessionId", source=source, line=n)
        if kind == "system" and value.get("subtype") == "compact_boundary":
            meta = value.get("compactMetadata")
            compacted[session] = (meta.get("trigger") if isinstance(meta, dict) else None) or "compact"
            continue
        if kind == "user" and not value.get("isSidechain"):
            if value.get("isCompactSummary"):
                compacted.setdefault(session, "compact")
            text = _text_of(value.get("message"))
            if "<command-name>/compact</command-name>" in text:
                compacted.setdefault(session, "manual")
            if text.startswith("<task-notification>"):
                notified[session] = True
            elif text and not value.get("isMeta"):
                notified.pop(session, None)
            continue
        if kind != "assistant":
            continue
        message = value.get("message")
        if not isinstance(message, dict):
            raise InputError("expected an object (the API response)", source=source, line=n, field="message")
        model = message.get("model")
        if model == "<synthetic>" or value.get("isApiErrorMessage"):
            continue
        if "usage" not in message:
            raise InputError("an assistant line without usage", source=source, line=n, field="message.usage")
        usage = clean_usage(message["usage"], source=source, line=n)
        mid, rid = message.get("id"), id_of(value, "requestId", source=source, line=n)
        if not isinstance(mid, str) or not mid:
            raise InputError("expected the response's id (a string)", source=source, line=n, field="message.id")
        if model is not None and not isinstance(model, str):
            raise InputError("expected a string", source=source, line=n, field="message.model")
        key = (mid, rid)
        got = responses.get(key)
        if got is not None:
            if _prompt(got.usage) != _prompt(usage):
                raise InputError(f"the lines of response {mid} disagree on its prompt counters (line "
                                 f"{got.usage_line}: {_prompt(got.usage)}, here: {_prompt(usage)})",
                                 source=source, line=n, field="message.usage")
            out_new, out_old = usage.get("output_tokens"), got.usage.get("output_tokens")
            if isinstance(out_new, int) and (not isinstance(out_old, int) or out_new >= out_old):
                got.usage, got.usage_line = usage, n
            continue
        sidechain = bool(value.get("isSidechain"))
        keys: dict[str, Any] = {"session": session, "request_id": rid, "message_id": mid, "sidechain": sidechain}
        if value.get("agentId") is not None:
            keys["agent"] = id_of(value, "agentId", source=source, line=n)
        for src, dst in (("cwd", "cwd"), ("version", "claude_code_version")):
            if value.get(src) is not None:
                keys[dst] = value[src]
        if not sidechain:
            if session in compacted:
                keys["after_compaction"] = compacted.pop(session)
            if notified.pop(session, False):
                keys["after"] = "task-notification"
        responses[key] = _Response(n, value.get("timestamp"), usage, model, keys)
        order.append(key)
    for key in order:
        r = responses.pop(key)
        out = r.usage.get("output_tokens")
        yield Record(shape=SHAPE.name, source=source, line=r.line, usage=r.usage, timestamp=r.timestamp,
                     model=r.model, keys=r.keys, output_tokens=out if isinstance(out, int) else None,
                     missing=("request body",))


def read_path(path: str) -> Iterator[Record]:
    """The records of one transcript file (its shape checked: a file in another shape is one line saying so)."""
    from ..files import display_name, iter_raw_lines

    source = display_name(path)
    lines = iter_raw_lines(path)
    taken = []
    for item in lines:
        taken.append(item)
        if len(taken) == 5:
            break
    from .base import HeadLine

    head = Head(source, tuple(HeadLine(n, raw, json_value(raw)) for n, raw, _ in taken))
    verdict = detect(head)
    if verdict.score != 2:
        why = f": it {verdict.lacks}" if verdict.lacks else ""
        raise InputError(f"not a Claude Code transcript{why}", source=source,
                         line=taken[0][0] if taken else None)
    import itertools

    yield from read(((n, raw) for n, raw, _ in itertools.chain(taken, lines)), source)


def transcript_files(path: str) -> list[str]:
    """The transcript files a path names: the file itself, or every ``*.jsonl`` under a directory (a project's
    folder, a session's with its ``subagents/``), sorted; a directory without one is an error."""
    import os

    if not os.path.isdir(path):
        return [path]
    found = sorted(os.path.join(root, f) for root, _, files in os.walk(path) for f in files if f.endswith(".jsonl"))
    if not found:
        raise InputError("no transcript (*.jsonl) in this directory", source=path)
    return found


def is_transcript(path: str) -> bool:
    """Whether ``path`` is a Claude Code transcript, or a directory holding them (judged from its first file);
    never raises."""
    import os

    from ..files import iter_raw_lines

    try:
        if path == "-" or not (os.path.isdir(path) or os.path.isfile(path)):
            return False  # stdin, a pipe, /dev/stdin: read once, by the reader (never peeked here)
        first = transcript_files(path)[0]
        heads = []
        for n, raw, _ in iter_raw_lines(first):
            from .base import HeadLine

            heads.append(HeadLine(n, raw, json_value(raw)))
            if len(heads) == 5:
                break
        return detect(Head(first, tuple(heads))).score == 2
    except Exception:  # a detector never raises: an unreadable path is not a transcript
        return False
