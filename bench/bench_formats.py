"""Reading a log in each shape against reading the same calls in cachectl's own wrapper, side by side.

For each log shape with a module (``cachectl.inputs.formats.MODULES``), its example log in the repository is
grown to N calls (its lines repeated, the JSONL ones; a cassette's interactions repeated), read through
``log_values`` (detection, the shape's reader, the record turned into cachectl's wrapper line), and each value
parsed into the canonical request where it has a body. The baseline: the same calls written as cachectl's own
wrapper lines (``Record.value()``), read and parsed the same way. Printed: seconds for each and their ratio
(the issue's bar: at most 1.5x).

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


def _grow(example: Path, out: Path, calls: int, module) -> int:
    """Write ``example`` grown to about ``calls`` calls; returns the calls written."""
    from cachectl.inputs.formats import log_values

    per_copy = sum(1 for _ in log_values(str(example), module.SHAPE.name))
    copies = max(1, calls // max(1, per_copy))
    data = example.read_bytes()
    if example.suffix in (".yaml", ".yml", ".json") and hasattr(module, "grow"):
        out.write_bytes(module.grow(data, copies))
    else:
        body = data if data.endswith(b"\n") else data + b"\n"
        with open(out, "wb") as fh:
            for _ in range(copies):
                fh.write(body)
    return per_copy * copies


def _read(path: Path, log_format: str | None) -> tuple[int, float]:
    from cachectl.inputs import parse_request
    from cachectl.inputs.formats import log_values
    from cachectl.inputs.request import is_request_body, unwrap

    start = time.perf_counter()
    n = 0
    for line, value in log_values(str(path), log_format):
        n += 1
        body, _, _ = unwrap(value)
        if is_request_body(body):
            parse_request(value, source=str(path), line=line)
    return n, time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--repeat", type=int, default=2, help="runs of each, the best kept")
    ap.add_argument("--only", help="comma-separated shape names")
    args = ap.parse_args()
    from cachectl.inputs.formats import MODULES, SHAPES, log_values

    only = set(args.only.split(",")) if args.only else None
    print(f"{'shape':24} {'calls':>8} {'shape s':>9} {'wrapper s':>9} {'ratio':>6}")
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for module in MODULES:
            name = module.SHAPE.name
            if only and name not in only:
                continue
            example = ROOT / SHAPES[name].example
            grown = Path(tmp) / f"{name}{example.suffix}"
            calls = _grow(example, grown, args.calls, module)
            wrapper = Path(tmp) / f"{name}.wrapper.jsonl"
            with open(wrapper, "wb") as fh:
                for _, value in log_values(str(grown), name):
                    fh.write(orjson.dumps(value) + b"\n")
            shape_s = min(_read(grown, None)[1] for _ in range(args.repeat))
            wrap_s = min(_read(wrapper, "native")[1] for _ in range(args.repeat))
            ratio = shape_s / wrap_s if wrap_s else float("inf")
            worst = max(worst, ratio)
            print(f"{name:24} {calls:>8,} {shape_s:>9.2f} {wrap_s:>9.2f} {ratio:>5.2f}x", flush=True)
    print(f"worst ratio {worst:.2f}x (bar: 1.5x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
