"""Benchmark: the cost of cachectl's bounded chat-template render (a wall-clock and memory budget watched by a
thread, checkpoints in loops and filters) against transformers' own compiled template on the same text.

Renders 5,000 short chats (a system and a user message, the fixture tokenizer's template) through
``TokenizerHandle.render_chat`` and through ``transformers``' ``_compile_jinja_template``,
best of three runs each, and prints wall and CPU time per render and their ratio. CPU counts every thread of the
process, so the watchdog's own wake-ups show there. ``--checkout DIR`` runs the same in another checkout, side by
side.

    python bench/bench_render.py [--renders 5000] [--checkout ../main]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
from cachectl.inputs import PromptInput
from cachectl.tokenization import load_tokenizer
from transformers.utils.chat_template_utils import _compile_jinja_template
n = int(sys.argv[1])
tok = load_tokenizer(sys.argv[2])
chats = [({"role": "system", "content": "You are a support agent."}, {"role": "user", "content": f"question {i}"})
         for i in range(n)]
prompts = [PromptInput(kind="chat", source="bench", messages=c) for c in chats]
template = _compile_jinja_template(tok.hf.chat_template)
special = tok.hf.special_tokens_map

def best(fn):
    runs = []
    for _ in range(3):
        w, c = time.perf_counter(), time.process_time()
        fn()
        runs.append((time.perf_counter() - w, time.process_time() - c))
    return min(runs)

ours = best(lambda: [tok.render_chat(p, add_generation_prompt=True) for p in prompts])
theirs = best(lambda: [template.render(messages=list(c), add_generation_prompt=True, **special) for c in chats])
same = tok.render_chat(prompts[0], add_generation_prompt=True) == template.render(
    messages=list(chats[0]), add_generation_prompt=True, **special)
print(json.dumps({"ours": ours, "theirs": theirs, "same_text": same}))
"""


def run(root: Path, n: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", CHILD, str(n), str(ROOT / "fixtures" / "tok")], env=env, cwd=root,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--renders", type=int, default=5000)
    ap.add_argument("--checkout", type=Path, help="another checkout to run side by side")
    a = ap.parse_args()
    print(f"{a.renders:,} renders, best of 3; us per render (wall / CPU of all threads)")
    print(f"{'checkout':<28} {'bounded':>16} {'transformers':>16} {'wall ratio':>10} {'CPU ratio':>10}")
    for root in [ROOT] + ([a.checkout.resolve()] if a.checkout else []):
        got = run(root, a.renders)
        (ow, oc), (tw, tc) = got["ours"], got["theirs"]
        us = 1e6 / a.renders
        print(f"{str(root)[-28:]:<28} {ow * us:7.0f} / {oc * us:6.0f} {tw * us:7.0f} / {tc * us:6.0f} "
              f"{ow / tw:10.2f} {oc / tc:10.2f}" + ("" if got["same_text"] else "  (texts differ!)"))


if __name__ == "__main__":
    main()
