"""Reading a log in each shape against reading the same calls in cachectl's own wrapper, side by side.

For each log shape with a module (``cachectl.inputs.formats.MODULES``), its example log in the repository is
grown to N calls (its lines repeated with their ids made distinct per copy; a cassette's interactions repeated;
at most --max-mb of log: a shape whose calls are large gets fewer, said in the calls column), read through
``log_values`` (detection, the shape's reader, the record turned into cachectl's wrapper line), and each value
parsed into the canonical request where it has a body. The baseline: the same calls written as cachectl's own
wrapper lines (``Record.value()``), read and parsed the same way, each side's runs interleaved, with the garbage
collector set as a ``cachectl`` command sets it (``cachectl.cli.common.GC_THRESHOLDS``). Printed: the
bytes per call of each log, CPU seconds for each and their ratio (the issue's bar: at most 1.5x), the ratio of
seconds per byte read (a shape whose log holds more than its records, a transcript's conversation, reads more), and
the parser's floor: the CPU seconds of only parsing the shape's file, every line by orjson (a JSONL shape), every
event by libyaml (a cassette) or only reading the lines (a text log), over the wrapper's whole read. Where that
floor is over 1.5x, no reader that parses its input can meet the bar: the shape's own bytes cost more to parse
than the wrapper's whole read does.

    python bench/bench_formats.py --calls 100000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


#: keys whose string values identify a call, a response, a session or a span: made distinct in each copy, so
#: that a grown log holds distinct calls (readers that join or count once by id would otherwise fold the copies)
_ID_KEYS = {"id", "uuid", "parentuuid", "leafuuid", "requestid", "request_id", "custom_id", "traceid", "spanid",
            "parentspanid", "sessionid", "session_id", "message_id", "observationid", "parentobservationid"}


def _distinct(value, suffix: str):
    if isinstance(value, dict):
        return {k: (v + suffix if isinstance(v, str) and k.lower() in _ID_KEYS else _distinct(v, suffix))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_distinct(v, suffix) for v in value]
    return value


def _grow(example: Path, out: Path, calls: int, max_bytes: int, module) -> None:
    """``example`` repeated to about ``calls`` calls (at most ``max_bytes``), each copy's ids made distinct."""
    from cachectl.inputs.formats import log_values

    per_copy = sum(1 for _ in log_values(str(example), module.SHAPE.name))
    data = example.read_bytes()
    copies = max(1, min(calls // max(1, per_copy), max_bytes // max(1, len(data))))
    if example.suffix in (".yaml", ".yml"):  # a cassette: one document, its interactions repeated
        import yaml

        doc = yaml.safe_load(data)
        items = doc["interactions"]

        class Plain(yaml.SafeDumper):  # each interaction written out whole, not as an alias of the first copy
            def ignore_aliases(self, data) -> bool:
                return True

        bound = getattr(module, "MAX_BYTES", None)  # a cassette is one document, read whole: kept under its bound
        if bound is not None:
            one = len(yaml.dump(doc, Dumper=Plain, sort_keys=False).encode())
            copies = max(1, min(copies, int(bound * 0.95) // one))
        doc["interactions"] = [i for _ in range(copies) for i in items]
        out.write_text(yaml.dump(doc, Dumper=Plain, sort_keys=False), encoding="utf-8")
        return
    lines = [orjson.loads(line) if line.strip()[:1] in (b"{", b"[") else line for line in data.splitlines()]
    with open(out, "wb") as fh:
        for k in range(copies):
            for line in lines:
                fh.write(line + b"\n" if isinstance(line, bytes) else orjson.dumps(_distinct(line, f"-{k}")) + b"\n")


def _read(path: Path, log_format: str | None) -> tuple[int, float]:
    """``(values read, CPU seconds)``: the process's CPU time (one thread does the work), which a shared machine's
    other load moves far less than wall time."""
    from cachectl.inputs import parse_request
    from cachectl.inputs.formats import log_values
    from cachectl.inputs.request import is_request_body, unwrap

    start = time.process_time()
    n = 0
    for line, value in log_values(str(path), log_format):
        n += 1
        body, _, _ = unwrap(value)
        if is_request_body(body):
            parse_request(value, source=str(path), line=line)
    return n, time.process_time() - start


def _floor(path: Path) -> float:
    """CPU seconds of only parsing ``path``: what any reader of the shape must at least do (see the docstring)."""
    start = time.process_time()
    with open(path, "rb") as fh:
        if path.suffix in (".yaml", ".yml"):
            import yaml

            for _ in yaml.parse(fh, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
                pass
        elif path.suffix == ".jsonl":
            loads = orjson.loads
            for line in fh:
                if not line.isspace():
                    loads(line)
        else:
            for _ in fh:
                pass
    return time.process_time() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each, the best kept")
    ap.add_argument("--only", help="comma-separated shape names")
    ap.add_argument("--max-mb", type=int, default=300, help="the most a grown log may take (fewer calls then)")
    args = ap.parse_args()
    import gc

    from cachectl.cli.common import GC_THRESHOLDS
    from cachectl.inputs.formats import MODULES, SHAPES, log_values

    gc.freeze()  # the collector as a cachectl command runs it: start-up's objects left alone, its thresholds
    gc.set_threshold(*GC_THRESHOLDS)

    only = set(args.only.split(",")) if args.only else None
    print(f"{'shape':24} {'calls':>8} {'size':>9} {'B/call':>8} {'wrap B/c':>8} {'shape s':>9} {'wrapper s':>9} "
          f"{'ratio':>6} {'per MB':>7} {'floor':>6}")
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for module in MODULES:
            name = module.SHAPE.name
            if only and name not in only:
                continue
            example = ROOT / SHAPES[name].example
            grown = Path(tmp) / f"{name}{example.suffix}"
            _grow(example, grown, args.calls, args.max_mb << 20, module)
            wrapper = Path(tmp) / f"{name}.wrapper.jsonl"
            with open(wrapper, "wb") as fh:
                for _, value in log_values(str(grown), name):
                    fh.write(orjson.dumps(value) + b"\n")
            runs, wraps, floors = [], [], []
            for _ in range(args.repeat):  # interleaved: a busy machine slows both sides alike
                runs.append(_read(grown, None))
                wraps.append(_read(wrapper, "native"))
                floors.append(_floor(grown))
            calls = runs[0][0]
            assert calls == wraps[0][0], (name, calls, wraps[0][0])
            shape_s, wrap_s = min(t for _, t in runs), min(t for _, t in wraps)
            ratio = shape_s / wrap_s if wrap_s else float("inf")
            worst = max(worst, ratio)
            size, wrap_size = grown.stat().st_size, wrapper.stat().st_size
            # seconds per byte read, shape against wrapper: how the reader does on the bytes it has to read
            per_mb = (shape_s / size) / (wrap_s / wrap_size) if wrap_s else float("inf")
            floor = min(floors) / wrap_s if wrap_s else float("inf")
            print(f"{name:24} {calls:>8,} {size >> 20:>6} MB {size / calls:>8,.0f} {wrap_size / calls:>8,.0f} "
                  f"{shape_s:>9.2f} {wrap_s:>9.2f} {ratio:>5.2f}x {per_mb:>6.2f}x {floor:>5.2f}x", flush=True)
            grown.unlink()
            wrapper.unlink()
    print(f"worst ratio {worst:.2f}x (bar: 1.5x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
