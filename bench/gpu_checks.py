"""Checks that need a real GPU (run by hand on a CUDA machine; CI never runs it).

What it measures, against what cachectl predicts from configuration files:
1. the memory the driver reports (``torch.cuda.mem_get_info``; nvidia-smi alongside) vs ``gpus.json``;
2. a bf16 matrix product's throughput vs the datasheet peak in ``gpu_flops.json``;
3. a random-weight model built from a catalog config (default llama-3.1-8b), prefilled on the GPU at several
   lengths: the DynamicCache's bytes vs ``kv-inspect``'s bytes per token, the FLOPs torch counts vs
   ``prefix_value``'s estimate, and the prefill time, i.e. the utilization a hit token's saved work really
   runs at (``simulate-prefix --utilization`` defaults to 0.4).

Usage: python3 bench/gpu_checks.py [--model llama-3.1-8b] [--lengths 512,2048,8192,32768] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        _sync()
        t = time.perf_counter()
        fn()
        _sync()
        out.append(time.perf_counter() - t)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--gpu", default="H200")
    ap.add_argument("--lengths", default="512,2048,8192,32768")
    ap.add_argument("--out")
    ap.add_argument("--device", default="cuda", help="cpu: a dry run of the script itself (small --lengths)")
    ap.add_argument("--matmul", type=int, default=8192)
    args = ap.parse_args()

    import torch
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

    from cachectl.engines.kv import config as kvmath
    from cachectl.engines.prefix import value as prefix_value

    result: dict = {"torch": torch.__version__}
    import transformers
    result["transformers"] = transformers.__version__
    dev = args.device
    if dev == "cuda":
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True)
        result["nvidia_smi"] = smi.stdout.strip()
        free, total = torch.cuda.mem_get_info()
        result["device_name"] = torch.cuda.get_device_properties(0).name
        result["mem_get_info_total_bytes"] = total
        result["mem_get_info_total_mib"] = total / 2**20
    gpus = kvmath.gpu_table()["gpus"]
    result["gpus_json_memory_mib"] = gpus[args.gpu]["memory_mib"]

    # 2. matmul throughput
    n = args.matmul
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    _timed(lambda: a @ b, 3)
    times = _timed(lambda: a @ b, 10)
    result[f"matmul_{n}_bf16_tflops"] = 2 * n**3 / statistics.median(times) / 1e12
    name, peak, _ = prefix_value.gpu_peak(args.gpu)
    result["datasheet_dense_bf16_tflops"] = peak

    # 3. a random-weight model from the catalog config
    config, source, _ = kvmath.resolve_model(args.model)
    cfg = AutoConfig.for_model(**{k: v for k, v in config.items() if k not in ("architectures",)})
    torch.manual_seed(0)
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    model.eval()
    groups = kvmath.layer_groups(config, "bf16", source)
    rows = []
    for length in [int(x) for x in args.lengths.split(",")]:
        ids = torch.randint(0, cfg.vocab_size, (1, length), device=dev)

        def prefill(cache=None, ids=ids):
            with torch.no_grad():
                return model(input_ids=ids, past_key_values=cache if cache is not None else DynamicCache(config=cfg),
                             use_cache=True, logits_to_keep=1)

        out = prefill()
        cache = out.past_key_values
        measured = 0
        for layer in cache.layers:
            measured += layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
        predicted = kvmath.kv_bytes(groups, length)
        del out, cache
        _timed(prefill, 2)
        times = _timed(prefill, 5)
        seconds = statistics.median(times)
        try:  # torch's counter refuses grouped-query SDPA on some versions
            with FlopCounterMode(display=False) as counter:
                prefill()
            counted: int | None = counter.get_total_flops()
        except AssertionError:
            counted = None
        worth = prefix_value.hits_worth(length, hit_square_sum=float(length) ** 2, config=config, model_source=source,
                                        gpu=args.gpu)
        rows.append({
            "tokens": length,
            "kv_bytes_measured": measured,
            "kv_bytes_predicted": predicted,
            "flops_torch_counted": counted,
            "flops_cachectl_estimate": worth.flops_saved,
            "prefill_seconds_median_of_5": seconds,
            "cachectl_gpu_seconds_at_peak": worth.gpu_seconds_at_peak,
            "achieved_utilization": worth.gpu_seconds_at_peak / seconds,
        })
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    result["model"] = args.model
    result["active_params"] = prefix_value.active_params(config)
    result["prefill"] = rows
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
