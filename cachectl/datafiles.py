"""The data files cachectl ships (``cachectl/data/*.json``: prices and cache rules, model configs, GPUs, links,
probes), read by name: the one reader every engine and command uses."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any


def load_data(name: str) -> Any:
    """The parsed JSON of ``cachectl/data/<name>``: a fresh object each call, so a caller may change it."""
    return json.loads(resources.files("cachectl.data").joinpath(name).read_text(encoding="utf-8"))
