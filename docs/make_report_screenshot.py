"""Rebuild docs/report.png: the README's `cachectl report` run on fixtures/prompts/agent_log.jsonl, opened in
headless Chromium (needs chromium and chromedriver: apt-get install chromium chromium-driver)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.browser import visit  # noqa: E402

with tempfile.TemporaryDirectory() as tmp:
    page = Path(tmp) / "report.html"
    subprocess.run([sys.executable, "-m", "cachectl", "report", "fixtures/prompts/agent_log.jsonl", "--key", "session",
                    "-t", "fixtures/tok", "--html", str(page)], cwd=ROOT, check=False, stdout=subprocess.DEVNULL)
    shot = ROOT / "docs" / "report.png"
    v = visit(page, shot)
    from PIL import Image

    with Image.open(shot) as im:  # 256 colours: a third of the bytes, no visible change on a flat page
        im.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(shot, optimize=True)
    errors = [e for e in v.console if e.get("level") == "SEVERE"]
    if errors:
        raise SystemExit(f"console errors: {errors}")
    print(f"docs/report.png: {v.height} px tall, {len(v.console)} console message(s)")
