"""Benchmark: `kv-inspect --run`'s measured prefill/decode loop against plain `generate` on the same prompt.

A random-weight Llama built from a config (default 4 layers, hidden 256: no download), the same prompt of
N tokens, M new tokens, greedy; both on the same loaded model, interleaved, median of R runs.
Target: the inspection loop (DynamicCache, per-token argmax, the cache measurement) <= 1.10x generate.

    python bench/bench_kv_live.py [--prompt-tokens 256] [--new-tokens 32] [--runs 7] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig

    from cachectl.engines.kv.live import cache_keyword, inspect_model

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=2048, hidden_size=args.hidden, intermediate_size=args.hidden * 4,
                      num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=2,
                      max_position_embeddings=4096)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    ids = torch.randint(0, 2048, (1, args.prompt_tokens))
    prompt = ids[0].tolist()

    def plain() -> float:
        t0 = time.perf_counter()
        with torch.no_grad():
            # the keyword the model takes the cache by (cache= from transformers 5.24, past_key_values= before)
            model.generate(ids, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                           pad_token_id=0, **{cache_keyword(model): DynamicCache(config=model.config)})
        return time.perf_counter() - t0

    def inspected() -> float:
        t0 = time.perf_counter()
        run = inspect_model(model, prompt, max_new_tokens=args.new_tokens)
        assert run.agree
        return time.perf_counter() - t0

    plain(), inspected()  # warm-up
    a, b = [], []
    for _ in range(args.runs):
        a.append(plain())
        b.append(inspected())
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"random Llama {args.layers} layers x hidden {args.hidden}, prompt {args.prompt_tokens} tokens, "
          f"{args.new_tokens} new tokens, {args.threads} threads, median of {args.runs}")
    print(f"{'plain generate':<28}{ma * 1000:>10.1f} ms")
    print(f"{'kv-inspect --run loop':<28}{mb * 1000:>10.1f} ms{mb / ma:>8.2f}x")


if __name__ == "__main__":
    main()
