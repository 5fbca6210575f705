"""What every log-shape module shares: the record one call becomes, the head of a file a shape is detected from,
and a detector's verdict.

A shape module (one per log shape under this package) defines:

- ``SHAPE``: its :class:`LogShape` (name, how it is recognized, what it carries, the commands that read it, an
  example in the repository, where it is specified);
- ``detect(head: Head) -> Verdict``: cheap, from the first non-empty lines only;
- ``read(path: str) -> Iterator[Record]``: one :class:`Record` per call, in file order, with its origin;
- optionally ``values(lines, source) -> Iterator[tuple[int, dict]]``: ``(record.line, record.value())`` of each
  record ``read`` yields, built by :func:`wrapper_value` without the records (a shape whose calls are small: the record would cost as
  much as the rest of reading one); :func:`~cachectl.inputs.formats.record_values` reads it where it is defined.

and one line in the registry (``cachectl/inputs/formats/__init__.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

#: how many non-empty lines a detector sees
HEAD_LINES = 5
#: the most bytes of the file a detector sees (a line longer than that is seen cut: no JSON value)
HEAD_BYTES = 1 << 20


@dataclass(frozen=True)
class LogShape:
    #: the stable name (what ``--log-format`` takes)
    name: str
    title: str
    #: how cachectl tells a file of this shape from the others
    recognized: str
    #: what a record carries that the commands use
    carries: str
    #: the commands that read a log of this shape
    commands: tuple[str, ...]
    #: an example in this repository (relative to its root) that the tests run each command on
    example: str
    #: where the shape is specified (the tool's docs or code)
    spec: str


@dataclass(frozen=True)
class HeadLine:
    line: int
    raw: bytes
    #: the line's JSON value, or None when the line is not one JSON value (text logs, YAML, a cut line)
    value: Any


@dataclass(frozen=True)
class Head:
    """The first non-empty lines of a file, as a detector sees them, and the file's name (some shapes are
    known by it: ``.yaml`` cassettes)."""

    source: str
    lines: tuple[HeadLine, ...]
    #: the first bytes of the file (documents spread over lines: YAML, pretty-printed JSON)
    text: bytes = b""

    @property
    def values(self) -> list[Any]:
        return [h.value for h in self.lines if h.value is not None]

    @property
    def first(self) -> Any:
        return self.lines[0].value if self.lines else None


@dataclass(frozen=True)
class Verdict:
    """A detector's answer: ``score`` 0 (not this shape), 1 (looks like it, but ``lacks`` something it
    needs), 2 (this shape). The registry takes the first 2 in its order, and names the best 1 when none is."""

    score: int
    lacks: str | None = None

    @classmethod
    def no(cls) -> Verdict:
        return cls(0)

    @classmethod
    def yes(cls) -> Verdict:
        return cls(2)

    @classmethod
    def almost(cls, lacks: str) -> Verdict:
        return cls(1, lacks)


@dataclass(frozen=True, init=False)
class Record:
    """One call as a log of any shape tells it. Every field the shape does not carry is None (or empty).

    ``body`` is the provider request body as the API received it (OpenAI Chat or Responses, Anthropic
    Messages), read by :func:`cachectl.inputs.request.parse_request`, the one parser of bodies; ``usage`` the
    billed counters in the provider's own convention (:func:`cachectl.inputs.usage.parse_usage` reads them).
    """

    shape: str
    source: str
    #: the first line of the file the record came from (1-based)
    line: int
    body: dict | None = None
    usage: dict | None = None
    #: a self-hosted server's counters: vLLM's ``usage.prompt_tokens_details.cached_tokens``-style usage
    served: dict | None = None
    #: as logged: an ISO 8601 string or epoch seconds (the run's timestamp rule reads it)
    timestamp: Any = None
    model: str | None = None
    #: conversation/session, user, tenant, request and response ids, ... as the shape names them
    keys: dict[str, Any] = field(default_factory=dict)
    output_tokens: int | None = None
    #: the prompt's token IDs where the log has them (vLLM), and its text where only that is logged
    tokens: list[int] | None = None
    prompt: str | None = None
    #: came through a provider's Batch API (priced at its batch rates)
    batch: bool = False
    #: the JSON path, in the original line's value, of the object ``body`` was taken from verbatim (``body``,
    #: ``request.body``); None when the body was assembled from several places (no edit can be written back)
    body_path: str | None = None
    #: what the shape could not give for this record (said once per run: "no request body", ...)
    missing: tuple[str, ...] = ()
    #: the text the model answered, where the log keeps it (``semantic-probe replay`` compares it)
    response: str | None = None

    def __init__(self, shape: str, source: str, line: int, body: dict | None = None, usage: dict | None = None,
                 served: dict | None = None, timestamp: Any = None, model: str | None = None,
                 keys: dict[str, Any] | None = None, output_tokens: int | None = None,
                 tokens: list[int] | None = None, prompt: str | None = None, batch: bool = False,
                 body_path: str | None = None, missing: tuple[str, ...] = (), response: str | None = None) -> None:
        """The fields written into the instance's ``__dict__`` at once: a reader builds one record per call, and
        the frozen dataclass's own ``__init__`` (one ``object.__setattr__`` a field) cost as much as the rest of
        reading a small call."""
        self.__dict__.update(shape=shape, source=source, line=line, body=body, usage=usage, served=served,
                             timestamp=timestamp, model=model, keys={} if keys is None else keys,
                             output_tokens=output_tokens, tokens=tokens, prompt=prompt, batch=batch,
                             body_path=body_path, missing=missing, response=response)

    def value(self, response: bool = False) -> dict[str, Any]:
        """The record as cachectl's own wrapper line (:func:`wrapper_value`); ``response``: with the text the
        model answered, as ``response``, where the log keeps it (the whole-log commands do not read it)."""
        out = wrapper_value(self.keys, timestamp=self.timestamp, body=self.body, usage=self.usage,
                            served=self.served, model=self.model, output_tokens=self.output_tokens,
                            tokens=self.tokens, prompt=self.prompt, batch=self.batch)
        if response and self.response is not None:
            out["response"] = self.response
        return out


def wrapper_value(keys: dict[str, Any], *, timestamp: Any = None, body: dict | None = None,
                  usage: dict | None = None, served: dict | None = None, model: str | None = None,
                  output_tokens: int | None = None, tokens: list[int] | None = None, prompt: str | None = None,
                  batch: bool = False) -> dict[str, Any]:
    """A call as cachectl's own wrapper line: ``{...keys, timestamp, body, usage, model, output_tokens, ...}``
    (what the whole-log commands read), from :class:`Record`'s fields; a shape's ``values`` builds it from them
    without the record."""
    out: dict[str, Any] = {k: v for k, v in keys.items() if v is not None}
    for k, v in (("timestamp", timestamp), ("body", body), ("usage", usage if usage is not None else served),
                 ("model", model), ("output_tokens", output_tokens), ("prompt_token_ids", tokens)):
        if v is not None:
            out[k] = v
    if prompt is not None and body is None and tokens is None:
        out["prompt"] = prompt
    if batch:
        out["batch"] = True
    return out


def text_of(value: Any, key: str) -> str | None:
    """``value[key]`` where it is a string, else None: a line's kind or type compared with a set of names (a list
    or an object there is no name, and no set holds it)."""
    got = value.get(key) if isinstance(value, dict) else None
    return got if isinstance(got, str) else None


def id_of(value: dict, key: str, *, source: str, line: int, field: str | None = None) -> str | int | None:
    """``value[key]`` as an id (a session's, a request's): a string or an integer, None where it is absent or
    null; anything else is bad input, named by ``field`` (``key`` by default)."""
    got = value.get(key)
    if got is None or isinstance(got, str) or (isinstance(got, int) and not isinstance(got, bool)):
        return got
    from ...errors import InputError

    raise InputError(f"expected an id (a string), got {_kind(got)}", source=source, line=line, field=field or key)


def _kind(v: Any) -> str:
    return ("an object" if isinstance(v, dict) else "a list" if isinstance(v, list) else "a boolean"
            if isinstance(v, bool) else "a number" if isinstance(v, (int, float)) else type(v).__name__)


def json_value(raw: bytes) -> Any:
    """The JSON value of one line, or None when it is not one (a detector never raises)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None


def get(value: Any, *path: str | int) -> Any:
    """``value[p0][p1]...`` through dicts and lists; None where any step is absent."""
    cur = value
    for p in path:
        if isinstance(p, int):
            if not isinstance(cur, list) or not -len(cur) <= p < len(cur):
                return None
        elif not isinstance(cur, dict):
            return None
        cur = cur[p] if isinstance(p, int) else cur.get(p)
    return cur
