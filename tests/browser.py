"""Open a local HTML page in headless Chromium (Debian's chromium + chromedriver, through selenium), collect
the browser console and the network requests, and take a full-page screenshot."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver") or ("/usr/bin/chromedriver" if Path("/usr/bin/chromedriver").exists()
                                                else None)


@dataclass
class PageVisit:
    console: list[dict]        # the browser log: every console message and page error
    requests: list[str]        # URLs the page asked for (the page itself included)
    title: str
    text: str                  # document.body.innerText
    height: int


def _driver(width: int):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--hide-scrollbars", f"--window-size={width},1000", "--force-device-scale-factor=1"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)


def _visit(driver, url: str, screenshot: Path | None, width: int) -> PageVisit:
    driver.get(url)
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    text = driver.execute_script("return document.body.innerText")
    if screenshot is not None:
        driver.set_window_size(width, height + 40)
        driver.save_screenshot(str(screenshot))
    console = driver.get_log("browser")
    requests = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            requests.append(msg["params"]["request"]["url"])
    return PageVisit(console=console, requests=requests, title=driver.title, text=text, height=height)


def visit(page: Path | str, screenshot: Path | None = None, width: int = 1200) -> PageVisit:
    """One page (a local file, or a URL) in a fresh browser."""
    driver = _driver(width)
    try:
        return _visit(driver, page if isinstance(page, str) else page.resolve().as_uri(), screenshot, width)
    finally:
        driver.quit()


def visit_all(urls: list[str], width: int = 1200) -> list[PageVisit]:
    """Several pages, one after another, in one browser (each visit's console and requests are its own)."""
    driver = _driver(width)
    try:
        return [_visit(driver, url, None, width) for url in urls]
    finally:
        driver.quit()
