"""Engines: plain library modules, one package per cache. They take plain values, return frozen dataclasses,
and never print, exit or import typer or rich.

- :mod:`.tokendiff`: where two prompts stop matching in token space, and why
- :mod:`.prefix`: the server's prefix cache (vLLM, SGLang, LMCache): replay, capacity curve, fleets
- :mod:`.provider`: the provider's prompt cache (Anthropic, OpenAI): cost, usage reconciliation, prices
- :mod:`.kv`: the KV cache of one model: config arithmetic and live transformers runs
- :mod:`.semantic`: semantic-cache wrong hits and exact-match duplicates
- :mod:`.lint`: template and request-body lint, the safe template fix, SARIF/GitHub output
- :mod:`.repair`: a whole log fixed (``cachectl fix``) and reported (``cachectl report``)
- :mod:`.names`: the model names two engines both look up (kv's catalog, the price table), for hints
"""
