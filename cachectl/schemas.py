"""JSON Schemas (draft 2020-12) of the documents that ``--format json`` writes, derived from the code.

:func:`json_schemas` returns one schema per output document, keyed by a stable name (``"diff-tokens"``,
``"simulate-prefix fleet"``, ``"semantic-probe sweep"``...). Each is built from the frozen result dataclasses
that the command writes (their fields, type hints, ``#:`` comments and trailing ``# comments``), following how
the output is serialized:

* a dataclass given to ``emit_json`` is written by orjson: every field in definition order, fields whose name
  starts with ``_`` left out; ``dataclasses.asdict`` writes the same fields. Every such field is always present,
  so every one is required, and no other key is allowed (``additionalProperties: false``);
* where a ``to_dict`` writes something else than its fields (a field left out, renamed, computed), the
  difference is declared once, in :data:`_shapes` below, class by class;
* where the command builds the document by hand (a sweep's rows, the partition manifest, the grouping record
  of ``diff-tokens --log``), the dict is described in the builder function of that document below, its
  properties taken from the dataclass fields they copy wherever they copy one.

A field typed ``dict`` (or ``Any``) is an open object (or any value): the output really is open there (a
request's usage as logged, a model's configuration). ``tests/test_json_schemas.py`` runs every command with
``--format json`` on the fixtures and validates the real output against these schemas, so a field added to a
dataclass shows up here by itself, and a key added by hand to a document fails the test until it is described.

Library code: no typer, rich or heavy import; the engines' result modules it reads import in a few hundred ms.
"""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import inspect
import io
import tokenize
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

DIALECT = "https://json-schema.org/draft/2020-12/schema"

Schema = dict[str, Any]

#: CostReport fields that prompt-cost's JSON leaves out (cli.prompt_cost._JSON_LEFT_OUT, which imports typer)
PROMPT_COST_LEFT_OUT = ("miss_tallies",)

# -------------------------------------------------------------------------------------- field comments


@dataclasses.dataclass(frozen=True)
class _Source:
    """A module's source, parsed once: its syntax tree and its comments (line -> text, alone on its line)."""

    tree: ast.Module
    comments: Mapping[int, tuple[str, bool]]


@functools.cache
def _module_source(module: types.ModuleType) -> _Source:
    comments: dict[int, tuple[str, bool]] = {}
    try:
        text = inspect.getsource(module)
        tree = ast.parse(text)
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = (tok.string, not tok.line[:tok.start[1]].strip())
    except (OSError, TypeError, SyntaxError, tokenize.TokenError):
        return _Source(ast.Module(body=[], type_ignores=[]), {})
    return _Source(tree, comments)


def _class_node(cls: type, tree: ast.Module) -> ast.ClassDef | None:
    """The definition of ``cls`` in its module's tree (by its qualified name; a local class by its name)."""
    path = [p for p in cls.__qualname__.split(".") if p != "<locals>"]
    body: list[ast.stmt] = tree.body
    node: ast.ClassDef | None = None
    for part in path:
        node = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == part), None)
        if node is None:
            return next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls.__name__), None)
        body = node.body
    return node


@functools.cache
def _field_docs(cls: type) -> dict[str, str]:
    """What the source says of each field of ``cls``: the ``#:`` comment lines right above it (Sphinx's
    convention), else the comment at the end of its line. Empty when the source cannot be read."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        module = inspect.getmodule(klass)
        if not dataclasses.is_dataclass(klass) or module is None:
            continue
        source = _module_source(module)
        node = _class_node(klass, source.tree)
        if node is None:
            continue
        comments = source.comments
        for stmt in node.body:
            if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
                continue
            text = ""
            above = []
            line = stmt.lineno - 1
            while line in comments and comments[line][1] and comments[line][0].startswith("#:"):
                above.append(comments[line][0][2:].strip())
                line -= 1
            if above:
                text = " ".join(reversed(above))
            else:
                trailing = comments.get(stmt.end_lineno or stmt.lineno) or comments.get(stmt.lineno)
                if trailing and not trailing[1]:
                    text = trailing[0].lstrip("#").strip()
            if text:
                docs[stmt.target.id] = text
            else:
                docs.pop(stmt.target.id, None)
    return docs


def _class_doc(cls: type) -> str | None:
    doc = cls.__dict__.get("__doc__")
    if not doc or doc.startswith(cls.__name__ + "("):  # dataclass's generated signature
        return None
    return " ".join(inspect.cleandoc(doc).split())


def _property_doc(cls: type, name: str) -> str | None:
    """The docstring of a property of ``cls`` (what ``to_dict`` writes of a computed value)."""
    attr = inspect.getattr_static(cls, name, None)
    doc = getattr(attr, "__doc__", None) if isinstance(attr, property) else None
    return " ".join(doc.split()) if doc else None


# ----------------------------------------------------------------------------------------------- types


@dataclasses.dataclass(frozen=True)
class _Shape:
    """How a class's ``to_dict`` differs from its fields: fields it leaves out, fields written with another
    schema (a name: a field of another type, or renamed), and keys it adds (all present)."""

    drop: tuple[str, ...] = ()
    retype: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    rename: Mapping[str, str] = dataclasses.field(default_factory=dict)
    add: Mapping[str, Schema] = dataclasses.field(default_factory=dict)
    #: keys written only in some runs (not required)
    optional: Mapping[str, Schema] = dataclasses.field(default_factory=dict)


_SIMPLE = {int: "integer", float: "number", str: "string", bool: "boolean", type(None): "null"}


def _nullable(schema: Schema) -> Schema:
    t = schema.get("type")
    if isinstance(t, str) and set(schema) <= {"type", "description"}:
        return {**schema, "type": [t, "null"]}
    if isinstance(t, list) and set(schema) <= {"type", "description"}:
        return schema if "null" in t else {**schema, "type": [*t, "null"]}
    return {"anyOf": [schema, {"type": "null"}]}


class _Builder:
    """Schemas of types, the dataclasses among them gathered in ``defs`` (referenced as ``#/$defs/Name``)."""

    def __init__(self, shapes: Mapping[type, _Shape]) -> None:
        self.shapes = shapes
        self.defs: dict[str, Schema] = {}
        self._names: dict[type, str] = {}

    # a type hint -> a schema
    def of(self, tp: Any) -> Schema:
        if tp is Any or tp is object:
            return {}
        if tp in _SIMPLE:
            return {"type": _SIMPLE[tp]}
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            return {"$ref": f"#/$defs/{self.define(tp)}"}
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return {"enum": [m.value for m in tp]}
        origin, args = typing.get_origin(tp), typing.get_args(tp)
        if origin in (typing.Union, types.UnionType):
            members = [a for a in args if a is not type(None)]
            inner = self.of(members[0]) if len(members) == 1 else self._union(members)
            return _nullable(inner) if len(members) < len(args) else inner
        if origin is typing.Literal:
            return {"enum": list(args)}
        if tp in (dict, Mapping) or origin in (dict, Mapping, typing.Mapping):
            value = self.of(args[1]) if len(args) == 2 else {}
            return {"type": "object", "additionalProperties": value} if value else {"type": "object"}
        if origin is tuple and args and args[-1] is not Ellipsis:
            return {"type": "array", "prefixItems": [self.of(a) for a in args], "items": False,
                    "minItems": len(args)}
        if tp in (list, tuple, set, frozenset) or origin in (list, tuple, set, frozenset) or (
                origin is not None and isinstance(origin, type) and issubclass(origin, typing.Sequence)):
            item = self.of(args[0]) if args else {}
            return {"type": "array", "items": item} if item else {"type": "array"}
        return {}  # a type JSON does not name (a callable, a class orjson cannot write): any value

    def _union(self, members: list) -> Schema:
        schemas = [self.of(m) for m in members]
        if all(set(s) == {"type"} and isinstance(s["type"], str) for s in schemas):
            return {"type": [s["type"] for s in schemas]}
        if any(not s for s in schemas):
            return {}
        return {"anyOf": schemas}

    # a dataclass -> its name in $defs
    def define(self, cls: type) -> str:
        if cls in self._names:
            return self._names[cls]
        name = cls.__name__
        if name in self.defs:  # two classes of one name: the module tells them apart
            name = f"{cls.__module__.rsplit('.', 1)[-1]}.{name}"
        self._names[cls] = name
        self.defs[name] = {}  # a placeholder for recursive types
        self.defs[name] = self.object(cls)
        return name

    def field(self, cls: type, name: str) -> Schema:
        """The schema of one field of ``cls`` (its type and what its comment says), to describe a key that a
        document copies from it."""
        hints = _hints(cls)
        schema = dict(self.of(hints.get(name, Any)))
        doc = _field_docs(cls).get(name)
        if doc:
            schema["description"] = doc
        return schema

    def object(self, cls: type, *, extra: Mapping[str, Schema] | None = None,
               optional: Mapping[str, Schema] | None = None, first: Mapping[str, Schema] | None = None) -> Schema:
        """``cls`` as it is written: its fields (with ``_shapes``' differences), then ``extra`` keys (all present)
        and ``optional`` ones; ``first``: keys written before the fields."""
        shape = self.shapes.get(cls, _Shape())
        hints = _hints(cls)
        docs = _field_docs(cls)
        props: dict[str, Schema] = dict(first or {})
        for f in dataclasses.fields(cls):
            if f.name.startswith("_") or f.name in shape.drop:
                continue
            tp = shape.retype.get(f.name, hints.get(f.name, Any))
            schema = dict(self.of(tp))
            if f.name == "schema_version" and isinstance(f.default, int):
                schema = _versioned(f.default)
            if f.name in docs:
                schema["description"] = docs[f.name]
            props[shape.rename.get(f.name, f.name)] = schema
        props.update(shape.add)
        props.update(extra or {})
        required = list(props)
        props.update(shape.optional)
        props.update(optional or {})
        out: Schema = {"type": "object"}
        doc = _class_doc(cls)
        if doc:
            out["description"] = doc
        out.update(properties=props, required=required, additionalProperties=False)
        return out


def _hints(cls: type) -> dict[str, Any]:
    """The type hints of ``cls``'s fields, evaluated in their modules; one that cannot be (a name imported for
    type checking only) is ``Any``."""
    try:
        return typing.get_type_hints(cls)
    except Exception:  # noqa: BLE001 - a forward reference that does not resolve at run time
        pass
    out: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        module = inspect.getmodule(klass)
        namespace = dict(vars(module)) if module is not None else {}
        for name, hint in klass.__dict__.get("__annotations__", {}).items():
            out[name] = _eval_hint(hint, namespace, module)
    return out


def _eval_hint(hint: Any, namespace: dict[str, Any], module: types.ModuleType | None) -> Any:
    """A string annotation evaluated in its module; a name the module imports under ``if TYPE_CHECKING:`` is
    imported then (only the names a hint needs: a module of results, not a heavy library). ``Any`` when it
    cannot be."""
    if not isinstance(hint, str):
        return hint
    for _ in range(8):
        try:
            return eval(hint, namespace)  # noqa: S307 - an annotation of our own source
        except NameError as exc:
            missing = getattr(exc, "name", None)
            found = _type_checking_import(module, missing) if missing else None
            if found is None:
                return Any
            namespace[missing] = found  # type: ignore[index]
        except Exception:  # noqa: BLE001 - anything else an annotation may raise when evaluated
            return Any
    return Any


def _type_checking_import(module: types.ModuleType | None, name: str) -> Any:
    """The object ``module`` imports as ``name`` under ``if TYPE_CHECKING:`` (None when it does not)."""
    import importlib

    if module is None:
        return None
    for node in _module_source(module).tree.body:
        if not (isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)):
            continue
        for stmt in node.body:
            if not isinstance(stmt, ast.ImportFrom):
                continue
            for alias in stmt.names:
                if (alias.asname or alias.name) != name:
                    continue
                source = "." * stmt.level + (stmt.module or "")
                try:
                    return getattr(importlib.import_module(source, module.__package__), alias.name)
                except (ImportError, AttributeError):
                    return None
    return None


def _doc(title: str, description: str, body: Schema, builder: _Builder) -> Schema:
    out: Schema = {"$schema": DIALECT, "title": title, "description": description}
    out.update(body)
    if builder.defs:
        out["$defs"] = dict(sorted(builder.defs.items()))
    return out


def _describe(schema: Schema, text: str) -> Schema:
    return {**schema, "description": text}


# ------------------------------------------------------------------------------------ per-class shapes


def _shapes() -> dict[type, _Shape]:
    """The classes whose JSON is not their fields as they are (a ``to_dict`` of their own, an ``Any`` field whose
    type the comment names): the one place that says how."""
    from .engines import tokendiff
    from .engines.kv import config as kv
    from .engines.kv import live
    from .engines.lint import rules
    from .engines.prefix import forks
    from .engines.provider import cache
    from .engines.repair import fix

    kinds = (tokendiff.IDENTICAL, tokendiff.A_PREFIX_OF_B, tokendiff.B_PREFIX_OF_A, tokendiff.MISMATCH)
    return {
        # TokenDiff.kind: one of tokendiff's four constants (typed str)
        tokendiff.TokenDiff: _Shape(retype={"kind": typing.Literal[kinds]}),
        # ForkReport.to_dict: request_gains is left out (a number per request; fix and report use it)
        forks.ForkReport: _Shape(drop=("request_gains",)),
        # Finding.to_dict: the rule's own safety where the finding names none, applied_by as fix_applied_by
        rules.Finding: _Shape(drop=("fix_safety", "applied_by"), add={
            "fix_safety": {"type": "string", "description": "\"safe\" or \"unsafe\" (the rule's own where the "
                                                            "finding names none)"},
            "fix_applied_by": {"type": ["string", "null"], "description": "the command that applies the fix: "
                               "\"cachectl lint --fix\", \"cachectl fix\"; null: a person applies it"}}),
        # LintReport.to_dict: the rule table is not written
        rules.LintReport: _Shape(drop=("rules",)),
        # FixReport.to_dict: the rewritten lines are not written; the forks are ForkReport.forks
        fix.FixReport: _Shape(drop=("output", "unsafe_preview"), retype={"forks": tuple[forks.Fork, ...]}, add={
            "applied": {"type": "integer", "description": "fixes applied"},
            "unsafe_skipped": {"type": "integer",
                               "description": "unsafe fixes found and not applied (--unsafe-fixes applies them)"}}),
        # cli.prompt_cost._JSON_LEFT_OUT: what the rows already say (the test checks the two agree)
        cache.CostReport: _Shape(drop=PROMPT_COST_LEFT_OUT),
        # KvReport's live parts are typed Any (their module imports torch when it runs); the comments name them
        kv.KvReport: _Shape(retype={"run": live.LiveRun | None, "turns": live.TurnsRun | None,
                                    "shared_prefix": live.SharedPrefixRun | None,
                                    "quantized": live.QuantizedRun | None}),
    }


# ------------------------------------------------------------------------------------------- documents


def _versioned(version: int) -> Schema:
    return {"type": "integer", "const": version,
            "description": "the version of this document's layout"}


def _diff_tokens(b: _Builder) -> Schema:
    from .engines.tokendiff import TokenDiff

    return b.object(TokenDiff)


def _stability(b: _Builder) -> Schema:
    from .engines.tokendiff import StabilityReport

    return b.object(StabilityReport)


def _diff_log(b: _Builder) -> Schema:
    """``diff-tokens --log``: JSON Lines, each line one record (``PairResult.to_json_obj``, ``LogSummary.to_dict``,
    the grouping record of ``cli.diff_tokens._auto_log`` and the forks record, ``ForkReport.to_dict``)."""
    from .engines import tokendiff
    from .engines.prefix.forks import ForkReport
    from .engines.repair.groups import Grouping
    from .engines.tokendiff import LogSummary, PairResult, TokenDiff

    def record(name: str, text: str) -> Schema:
        return {"const": name, "description": text}

    pair_first = {"record": record("pair", "a request compared with the previous one of its conversation"),
                  "schema_version": _versioned(tokendiff.SCHEMA_VERSION),
                  "line_a": b.field(PairResult, "line_a") | {"description": "line of the earlier request"},
                  "line_b": b.field(PairResult, "line_b") | {"description": "line of the later request"},
                  "key": {"description": "the conversation key (--key's value; automatic: the conversation's "
                                         "number)"}}
    b.defs["PairRecord"] = b.object(TokenDiff, first=pair_first)
    b.defs["PairRecord"]["description"] = "One pair: the TokenDiff of the two requests, after the pair's keys."
    b.defs["SummaryRecord"] = b.object(LogSummary, first={"record": record("summary", "the last line: totals")})
    b.defs["ForksRecord"] = b.object(ForkReport, first={"record": record(
        "forks", "without --key: the forks of the log's shared prefix across requests, before the summary")})
    b.defs["GroupingRecord"] = {
        "type": "object",
        "description": "Without --key, the first line: how the conversations were found (as fix and report find "
                       "them).",
        "properties": {
            "record": record("grouping", "the first line without --key"),
            "how": b.field(Grouping, "how"),
            "conversations": _describe(b.field(Grouping, "count"), "conversations found"),
            "window_s": b.field(Grouping, "window_s") | {
                "description": "seconds within which a request joins the conversation it extends"},
            "requests": {"type": "integer", "description": "requests (lines) in the log"},
            "notes": {"type": "array", "items": {"type": "string"}},
        },
        "required": ["record", "how", "conversations", "window_s", "requests", "notes"],
        "additionalProperties": False,
    }
    return {"oneOf": [{"$ref": f"#/$defs/{n}"} for n in ("GroupingRecord", "PairRecord", "ForksRecord",
                                                          "SummaryRecord")]}


def _generation_prompt() -> Schema:
    # cli.simulate_prefix: the tokenizer's `used` (None without --tokenizer)
    return {"type": ["boolean", "null"],
            "description": "with --tokenizer: whether chat requests were rendered with the generation prompt; "
                           "null without a tokenizer"}


def _simulate_prefix(b: _Builder) -> Schema:
    """One replay: ``asdict(PrefixReport)`` and what ``cli.simulate_prefix._replay_one`` adds."""
    from .engines.prefix.replay import PrefixReport, RequestHit
    from .engines.prefix.served import ServedReport, ServedRow
    from .engines.prefix.value import HitsWorth

    doc = b.object(PrefixReport, extra={"chat_generation_prompt": _generation_prompt()}, optional={
        "served": _describe(b.object(ServedReport, extra={"disagreements": {
            "type": "array", "items": b.of(ServedRow), "description": "the rows that disagree"}}), (
            "with served counts in the log (usage.prompt_tokens_details.cached_tokens...): the replay against what "
            "the server served; its rows are in per_request, those that disagree in disagreements")),
        "worth": _describe(b.of(HitsWorth), "with --gpu and --model: what the hits are worth")})
    doc["properties"]["served"]["properties"].pop("rows")
    doc["properties"]["served"]["required"].remove("rows")
    # with served counts, each per-request row gains the verdict of its ServedRow
    row = b.defs[b.define(RequestHit)]
    for name in ("agrees", "reason", "confidence"):
        row["properties"][name] = _nullable(b.field(ServedRow, name)) | {
            "description": f"with served counts: ServedRow.{name}" + (
                f" ({_field_docs(ServedRow)[name]})" if name in _field_docs(ServedRow) else "")}
    return doc


def _sweep(b: _Builder, mode: str) -> Schema:
    """``cli.simulate_prefix._sweep``: the curves (vllm policy) and a row per point (``_curves``'
    and ``_token_level_sweep``'s rows, copied from ``CurveReport``/``CurvePoint`` and ``PrefixReport``)."""
    from .engines.prefix import replay
    from .engines.prefix.curve import CurvePoint, CurveReport
    from .engines.prefix.replay import PrefixReport

    row_props = {
        "block_size": b.field(CurveReport, "block_size"),
        "capacity_blocks": _nullable(b.field(CurvePoint, "capacity_blocks")) | {
            "description": "the capacity replayed (null: unlimited, a token-level policy without one)"},
        "capacity_tokens": _nullable(b.field(CurvePoint, "capacity_tokens")),
        "fits": b.field(CurvePoint, "fits"),
        "requests": _describe(b.field(CurveReport, "counted_requests"), "requests counted (after the warm-up)"),
        "query_tokens": b.field(CurveReport, "query_tokens"),
        "hit_tokens": _nullable(b.field(CurvePoint, "hit_tokens")),
        "hit_rate": _nullable(b.field(CurvePoint, "hit_rate")),
        "evicted_blocks": _nullable(b.field(CurvePoint, "evicted_blocks")),
    }
    optimal = {"optimal_hit_tokens": _nullable(b.field(CurvePoint, "optimal_hit_tokens")),
               "optimal_hit_rate": _nullable(b.field(CurvePoint, "optimal_hit_rate"))}
    for key in ("hit_tokens", "hit_rate", "evicted_blocks"):  # token-level rows: PrefixReport's
        if "description" not in row_props[key] and key in _field_docs(PrefixReport):
            row_props[key]["description"] = _field_docs(PrefixReport)[key]
    b.defs["SweepRow"] = {"type": "object", "description": "One replayed point (null figures: the capacity does "
                          "not hold the largest request). The optimal_* keys: the vllm policy only.",
                          "properties": {**row_props, **optimal}, "required": list(row_props),
                          "additionalProperties": False}
    return {"type": "object", "properties": {
        "schema_version": _versioned(replay.SCHEMA_VERSION),
        "policy": b.field(PrefixReport, "policy"),
        "mode": {"const": mode},
        "chat_generation_prompt": _generation_prompt(),
        "curves": {"type": "array", "items": b.of(CurveReport),
                   "description": "the vllm policy: one curve per block size (empty for the token-level policies)"},
        "sweep": {"type": "array", "items": {"$ref": "#/$defs/SweepRow"},
                  "description": "a row per block size and capacity replayed"},
    }, "required": ["schema_version", "policy", "mode", "chat_generation_prompt", "curves", "sweep"],
        "additionalProperties": False}


def _fleet(b: _Builder) -> Schema:
    """``asdict(FleetReport)`` and what ``cli.simulate_fleet._finish`` adds (the link, each router's worth)."""
    from .engines.prefix.fleet import FleetReport, RouterResult
    from .engines.prefix.value import HitsWorth

    result = b.defs[b.define(RouterResult)]
    result["properties"]["worth"] = _describe(b.of(HitsWorth), "with --gpu and --model: what this router's hits "
                                                               "are worth")
    link = {"type": "object", "description": "--link: the CPU-GPU link of the offload tier, as the shipped table "
                                             "(data/links.json) has it",
            "properties": {"name": {"type": "string"}, "gbps": {"type": "number"}, "source": {"type": "string"}},
            "required": ["name", "gbps"]}
    return b.object(FleetReport, extra={"link": link})


def _partitions(b: _Builder) -> Schema:
    """``simulate-prefix --partition-dir``: ``cli.simulate_fleet.write_partitions``' document, the manifest
    ``inputs.parquet.PartitionWriter.close`` wrote after its mode and directory."""
    return {"type": "object", "properties": {
        "schema_version": _versioned(1),  # written as a literal 1 there
        "mode": {"const": "partition"},
        "directory": {"type": "string", "description": "the partition directory written"},
        "format": {"type": "string", "description": "the manifest's format name"},
        "version": {"type": "integer", "description": "the manifest's format version"},
        "source": {"type": "string", "description": "the trace routed"},
        "router": {"type": "string"},
        "replicas": {"type": "integer"},
        "requests": {"type": "integer"},
        "block_size": {"type": "integer"},
        "hash_block_size": {"type": "integer"},
        "router_params": {"type": "object", "description": "what the router decided from (seed, prefix_blocks, "
                                                           "ring_vnodes, session_fields)"},
        "partitions": {"type": "array", "description": "one file per replica", "items": {
            "type": "object", "properties": {"file": {"type": "string"}, "requests": {"type": "integer"},
                                             "prompt_tokens": {"type": "integer"}},
            "required": ["file", "requests", "prompt_tokens"], "additionalProperties": False}},
    }, "required": ["schema_version", "mode", "directory", "format", "version", "source", "router", "replicas",
                    "requests", "block_size", "hash_block_size", "router_params", "partitions"],
        "additionalProperties": False}


def _prompt_cost(b: _Builder) -> Schema:
    """``cli.prompt_cost._JsonOut``: the CostReport's fields but those in its ``_JSON_LEFT_OUT`` (see
    :func:`_shapes`)."""
    from .engines.provider.cache import CostReport

    return b.object(CostReport)


def _price_list(b: _Builder) -> Schema:
    """``prompt-cost --list-models``: ``cli.prompt_cost._render_models``' document."""
    from .engines.provider.prices import ModelPrice, PriceTable

    model = b.object(ModelPrice, extra={"rule": {"type": "string", "description": _property_doc(ModelPrice, "rule")}})
    b.defs["PricedModel"] = model
    return {"type": "object", "properties": {
        "schema_version": _versioned(1),  # written as a literal 1 there
        "models": {"type": "array", "items": {"$ref": "#/$defs/PricedModel"},
                   "description": "the shipped price table, a model each"},
        "not_shipped": b.field(PriceTable, "not_shipped"),
        "withheld": b.field(PriceTable, "withheld"),
    }, "required": ["schema_version", "models", "not_shipped", "withheld"], "additionalProperties": False}


def _kv_catalog(b: _Builder) -> Schema:
    """``kv-inspect --list-models``: the shipped data files as they are (data/models.json's models,
    data/gpus.json), open objects."""
    from .engines.kv import config as kv

    return {"type": "object", "properties": {
        "schema_version": _versioned(kv.SCHEMA_VERSION),
        "models": {"type": "object", "description": "catalog name -> its entry (config, hf_id, as_of...), as "
                                                    "data/models.json has it",
                   "additionalProperties": {"type": "object", "required": ["config"]}},
        "gpus": {"type": "object", "description": "the GPU table, as data/gpus.json has it (gpus: name -> memory "
                                                  "and bandwidth; source)",
                 "properties": {"gpus": {"type": "object", "additionalProperties": {"type": "object"}}},
                 "required": ["gpus"]},
    }, "required": ["schema_version", "models", "gpus"], "additionalProperties": False}


def _kv(b: _Builder) -> Schema:
    from .engines.kv.config import KvReport

    return b.object(KvReport)


def _lint(b: _Builder) -> Schema:
    from .engines.lint.rules import LintReport

    return b.object(LintReport)


def _lint_diff(b: _Builder) -> Schema:
    """``lint --diff``: ``cli.lint._show_diff``' document, a ``FileFix.to_dict`` per file."""
    from .engines.lint.fix import Edit, FileFix, FixResult

    b.defs["FileFix"] = {"type": "object", "description": _class_doc(FileFix), "properties": {
        "path": b.field(FileFix, "path"),
        "fixes": {"type": "array", "items": {"type": "object", "properties": {
            "rule": b.field(Edit, "rule"), "line": b.field(Edit, "line"), "column": b.field(Edit, "column")},
            "required": ["rule", "line", "column"], "additionalProperties": False}},
        "diff": {"type": "string", "description": "the unified diff of the file (patch -p0 applies it)"},
    }, "required": ["path", "fixes", "diff"], "additionalProperties": False}
    return {"type": "object", "properties": {
        "files": {"type": "array", "items": {"$ref": "#/$defs/FileFix"}},
        "errors": {"type": "array", "items": {"type": "string"}, "description": " ".join(filter(None, (
            _field_docs(FixResult).get("errors"), "; then the files lint reads but a fix must not rewrite")))},
    }, "required": ["files", "errors"], "additionalProperties": False}


def _fix(b: _Builder) -> Schema:
    """``FixReport.to_dict`` and what ``cli.fix`` adds."""
    from .engines.repair.fix import FixReport

    preview = {"type": "object", "description": "without --unsafe-fixes, when unsafe fixes were found: what they "
                                                "would give (cli.fix._preview)",
               "properties": {"applied": {"type": "integer", "description": "fixes applied with them"},
                              "vllm_hit_rate": {"type": ["number", "null"]},
                              "provider_cost_usd": {"type": ["number", "null"]}},
               "required": ["applied", "vllm_hit_rate", "provider_cost_usd"], "additionalProperties": False}
    return b.object(FixReport, extra={
        "out": {"type": ["string", "null"], "description": "--out: the file the fixed log was written to"},
        "changed_lines": {"type": "array", "items": {"type": "integer"},
                          "description": "the lines of the log the fixes change"}},
        optional={"with_unsafe_fixes": preview})


def _report(b: _Builder) -> Schema:
    from .engines.repair.report import LogReport

    return b.object(LogReport)


def _semantic(name: str) -> Callable[[_Builder], Schema]:
    def build(b: _Builder) -> Schema:
        from .engines import semantic

        return b.object(getattr(semantic, name))

    return build


#: name -> (the command and flags that write it, its builder); "--log" and the like name the mode
DOCUMENTS: dict[str, tuple[str, Callable[[_Builder], Schema]]] = {
    "diff-tokens": ("cachectl diff-tokens A B --format json: where two prompts stop matching.", _diff_tokens),
    "diff-tokens --log": ("cachectl diff-tokens --log FILE.jsonl --format json: JSON Lines, one record a line "
                          "(without --key: a grouping record first and a forks record before the summary).",
                          _diff_log),
    "diff-tokens --stability": ("cachectl diff-tokens --stability CONVERSATION.json --format json: whether each "
                                "turn's render is a token prefix of the next.", _stability),
    "simulate-prefix replay": ("cachectl simulate-prefix replay TRACE --format json (the plain spelling "
                               "simulate-prefix TRACE too): one block size and capacity (served when the log has "
                               "served counts, worth with --gpu).", _simulate_prefix),
    "simulate-prefix served": ("cachectl simulate-prefix served TRACE --format json: the replay's document, with "
                               "served: the predicted hits beside the server's cached tokens.", _simulate_prefix),
    "simulate-prefix curve (sweep)": ("cachectl simulate-prefix curve TRACE --sweep-capacity/--sweep-block-size "
                                      "--format json: a row per block size and capacity.",
                                      lambda b: _sweep(b, "sweep")),
    "simulate-prefix curve": ("cachectl simulate-prefix curve TRACE --format json (simulate-prefix TRACE --curve): "
                              "the hit rate against the capacity (vllm policy).", lambda b: _sweep(b, "curve")),
    "simulate-prefix fleet": ("cachectl simulate-prefix fleet TRACE --replicas N [--router R] --format json, or a "
                              "partition directory as TRACE: replicas behind a router.", _fleet),
    "simulate-prefix partition": ("cachectl simulate-prefix partition TRACE --partition-dir DIR --replicas N "
                                  "--router R --format json: the manifest of the partitions written.", _partitions),
    "prompt-cost": ("cachectl prompt-cost LOG --format json (also --usage, --model, --count-with-api): the "
                    "provider prompt-cache cost, a row per request.", _prompt_cost),
    "prompt-cost --list-models": ("cachectl prompt-cost --list-models --format json: the shipped price table.",
                                  _price_list),
    "kv-inspect": ("cachectl kv-inspect MODEL --format json (with --run, --turns, --shared-prefix, --quantized: "
                   "their live measurements).", _kv),
    "kv-inspect --list-models": ("cachectl kv-inspect --list-models --format json: the model catalog and the GPU "
                                 "table.", _kv_catalog),
    "lint": ("cachectl lint PATH... --format json (also with --fix: the findings left): findings and the files "
             "that could not be checked.", _lint),
    "lint --diff": ("cachectl lint PATH... --diff --format json: the safe fixes per file, nothing written.",
                    _lint_diff),
    "fix": ("cachectl fix LOG --format json: the fixes found and applied, the log measured before and after.",
            _fix),
    "report": ("cachectl report LOG --format json: what the log's caches lose, why, and what the fixes recover.",
               _report),
    "semantic-probe pairs": ("cachectl semantic-probe pairs PAIRS --format json: the cosine of each pair.",
                             _semantic("PairsReport")),
    "semantic-probe probe": ("cachectl semantic-probe probe [PROMPT...] --format json: which variants a semantic "
                             "cache would answer.", _semantic("ProbeReport")),
    "semantic-probe sweep": ("cachectl semantic-probe sweep PAIRS --format json: recall and false hits per "
                             "threshold.", _semantic("SweepReport")),
    "semantic-probe replay": ("cachectl semantic-probe replay LOG --format json: a log replayed through a semantic "
                              "cache.", _semantic("ReplayReport")),
    "semantic-probe dupes": ("cachectl semantic-probe dupes LOG --format json: exact duplicate prompts.",
                             _semantic("DupesReport")),
}


def json_schemas() -> dict[str, dict]:
    """A JSON Schema (draft 2020-12) per document that ``--format json`` writes, by name (see
    :data:`DOCUMENTS`): each with ``title``, ``description`` (the command and flags that write it) and its
    dataclasses in ``$defs``. Built afresh at each call, from the code."""
    shapes = _shapes()
    out: dict[str, dict] = {}
    for name, (description, build) in DOCUMENTS.items():
        b = _Builder(shapes)
        body = build(b)
        out[name] = _doc(f"cachectl {name} --format json", description, body, b)
    return out
