"""cachectl: diagnostics for the caches around LLMs.

The library API mirrors the CLI: read prompts with :mod:`cachectl.inputs`, load a tokenizer with
:func:`load_tokenizer`, and call an engine. Names are imported on first use so that ``import cachectl``
stays cheap.

    >>> from cachectl import load_tokenizer, read_prompt, diff_tokens
    >>> tok = load_tokenizer("fixtures/tok")
    >>> a, b = (tok.tokenize(read_prompt(p)) for p in ("a.json", "b.json"))
    >>> diff_tokens(a, b, tokenizer=tok).first_diff_index
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "CachectlError": "cachectl.errors",
    "InputError": "cachectl.errors",
    "TokenizerError": "cachectl.errors",
    "UsageError": "cachectl.errors",
    "PromptInput": "cachectl.inputs",
    "read_prompt": "cachectl.inputs",
    "iter_log": "cachectl.inputs",
    "prompt_from_value": "cachectl.inputs",
    "load_tokenizer": "cachectl.tokenization",
    "TokenizerHandle": "cachectl.tokenization",
    "Tokenized": "cachectl.tokenization",
    "common_prefix_length": "cachectl.engines.tokendiff",
    "diff_tokens": "cachectl.engines.tokendiff",
    "diff_log": "cachectl.engines.tokendiff",
    "check_stability": "cachectl.engines.tokendiff",
    "TokenDiff": "cachectl.engines.tokendiff",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cachectl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
