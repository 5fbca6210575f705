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

# docs/shared-prefix-icicle.png: the icicle of the shared-prefix tree, as logged, of the three-apps log (report's
# HTML page draws it: each bar a prefix that many requests share, red where a fork with a fix splits)
with tempfile.TemporaryDirectory() as tmp:
    page = Path(tmp) / "report.html"
    subprocess.run([sys.executable, "-m", "cachectl", "report", "fixtures/prompts/shared_prefix_log.jsonl",
                    "-t", "fixtures/tok", "--html", str(page)], cwd=ROOT, check=False, stdout=subprocess.DEVNULL)
    from selenium.webdriver.common.by import By

    from tests.browser import _driver  # noqa: E402

    driver = _driver(1100)
    try:
        driver.get(page.resolve().as_uri())
        icicle = driver.find_element(By.CSS_SELECTOR, 'svg[aria-label="the shared-prefix tree as logged"]')
        shot = ROOT / "docs" / "shared-prefix-icicle.png"
        icicle.screenshot(str(shot))
    finally:
        driver.quit()
    print("docs/shared-prefix-icicle.png written")
