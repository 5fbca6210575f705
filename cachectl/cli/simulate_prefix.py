"""``cachectl simulate-prefix``: replay traffic through a vLLM-faithful prefix cache."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from ..errors import UsageError
from .common import (EXIT_OK, AsOpt, BlockSizeOpt, Format, FormatOpt, Progress, TokenizerOpt, emit_json,
                     handle_errors, new_figure, save_figure, stdout)

HELP = """Replay a request trace through a server prefix cache and count hits the way vLLM does.

TRACE is JSONL: {"tokens": [...], "salt"?, "timestamp"?, "output_tokens"?}; text or chat requests
("prompt", "messages", OpenAI/Anthropic bodies) with --tokenizer; or Mooncake lines
{"timestamp", "input_length", "output_length", "hash_ids"}. Requests replay one after another unless
--concurrency lets them overlap (they then pin their blocks until they finish).
"""


def _ints(text: Optional[str], name: str, most: int) -> list[int]:
    if not text:
        return []
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise UsageError(f"{name} expects comma-separated integers, got {text!r}") from None
    if not values or any(not 1 <= v <= most for v in values):
        raise UsageError(f"{name} expects integers from 1 to {most:,}, got {text!r}")
    return values


@handle_errors
def command(
    trace: Annotated[str, typer.Argument(help="JSONL trace (- for stdin).", show_default=False)],
    block_size: BlockSizeOpt = 16,
    capacity_blocks: Annotated[Optional[int], typer.Option("--capacity-blocks", min=1,
                                                           help="Usable KV blocks (vLLM adds one null block).")] = None,
    capacity_gib: Annotated[Optional[float], typer.Option("--capacity-gib", help="KV memory in GiB (needs --model).")] = None,
    model: Annotated[Optional[str], typer.Option("--model", help="Model directory or config.json, for --capacity-gib.")] = None,
    dtype: Annotated[str, typer.Option("--dtype", help="KV dtype for --capacity-gib: bf16, fp16, fp32, fp8, int4.")] = "bf16",
    policy: Annotated[str, typer.Option("--policy", help="vllm, radix (SGLang), chunk (LMCache/CacheBlend), "
                                                         "infinite (no eviction).")] = "vllm",
    salt_field: Annotated[Optional[str], typer.Option("--salt-field", metavar="F",
                                                      help="Field holding the per-tenant cache salt (default: salt "
                                                           "or cache_salt).")] = None,
    tenant_field: Annotated[Optional[str], typer.Option("--tenant-field", metavar="F",
                                                        help="Field naming the tenant without salting, to measure "
                                                             "cross-tenant sharing.")] = None,
    no_salt: Annotated[bool, typer.Option("--no-salt", help="Ignore cache salts: what sharing would happen "
                                                              "without them (with --tenant-field).")] = False,
    tokenizer: TokenizerOpt = None,
    as_kind: AsOpt = None,
    hash_block_size: Annotated[int, typer.Option("--hash-block-size", min=1,
                                                 help="Tokens per hash_ids entry in Mooncake traces.")] = 512,
    hash_fn: Annotated[str, typer.Option("--hash", help="Block key: builtin (fast) or sha256 (vLLM's).")] = "builtin",
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, help="Requests in flight at once.")] = 1,
    decode_ms: Annotated[float, typer.Option("--decode-ms-per-token", min=0.0,
                                             help="With --concurrency: how long a request holds its blocks "
                                                  "per output token.")] = 20.0,
    chunk_size: Annotated[int, typer.Option("--chunk-size", min=1, help="chunk policy: tokens per chunk.")] = 256,
    recompute_ratio: Annotated[float, typer.Option("--recompute-ratio",
                                                   help="chunk policy: share of a reused non-prefix chunk "
                                                        "that is recomputed.")] = 0.15,
    sweep_capacity: Annotated[Optional[str], typer.Option("--sweep-capacity", metavar="N,N,...",
                                                          help="Capacities in blocks to sweep.")] = None,
    sweep_block_size: Annotated[Optional[str], typer.Option("--sweep-block-size", metavar="B,B,...",
                                                            help="Block sizes to sweep.")] = None,
    per_request: Annotated[bool, typer.Option("--per-request", help="List each request's hit tokens.")] = False,
    plot: Annotated[Optional[str], typer.Option("--plot", metavar="FILE.png",
                                                help="Draw hit rate against capacity per block size.")] = None,
    fmt: FormatOpt = Format.text,
) -> None:
    from ..engines import prefix

    if hash_fn not in ("builtin", "sha256"):
        raise UsageError("--hash must be builtin or sha256")
    if capacity_gib is not None and capacity_blocks is not None:
        raise UsageError("give --capacity-blocks or --capacity-gib, not both")
    bytes_per_token = None
    source = None
    if capacity_gib is not None:
        if model is None:
            raise UsageError("--capacity-gib needs --model (a model directory or config.json)")
        from ..engines.kvmath import kv_shape, load_config

        config, source = load_config(model)
        bytes_per_token = kv_shape(config, dtype, source).bytes_per_token
        if bytes_per_token <= 0:
            raise UsageError(f"{source}: the model keeps no KV cache per token (no attention layers), so "
                             "--capacity-gib gives no block count; pass --capacity-blocks")
    tok = None
    if tokenizer is not None:
        from ..tokenization import load_tokenizer

        tok = load_tokenizer(tokenizer)
    name = "<stdin>" if trace == "-" else trace
    if trace == "-" and (sweep_capacity or sweep_block_size):
        raise UsageError("sweeps read the trace once per run: pass a file, not stdin")

    def capacity_for(bs: int) -> Optional[int]:
        if bytes_per_token is not None:
            from ..engines.kvmath import blocks_for_memory

            blocks = blocks_for_memory(capacity_gib, bytes_per_token, bs)
            if blocks < 1:
                raise UsageError(f"--capacity-gib {capacity_gib:g} holds no block of {bs} tokens of the model in "
                                 f"{source} ({bytes_per_token * bs:,.0f} bytes a block)")
            return blocks
        if capacity_blocks is not None and bs != block_size:  # same memory, other block size
            return max(1, capacity_blocks * block_size // bs)
        return capacity_blocks

    def run(bs: int, cap: Optional[int], keep_rows: bool):
        records = prefix.trace_records(trace)
        requests = prefix.iter_trace(records, source=name, tokenizer=tok, salt_field=salt_field,
                                     tenant_field=tenant_field, hash_block_size=hash_block_size, no_salt=no_salt,
                                     as_kind=as_kind.value if as_kind else None)
        with Progress(f"{policy} bs={bs}") as progress:
            def counted():
                for r in requests:
                    progress.advance()
                    yield r
            return prefix.simulate(counted(), policy=policy, block_size=bs, capacity_blocks=cap, hash_fn=hash_fn,
                                   concurrency=concurrency, decode_s_per_token=decode_ms / 1000.0,
                                   chunk_size=chunk_size, recompute_ratio=recompute_ratio, per_request=keep_rows,
                                   source=name)

    sizes = _ints(sweep_block_size, "--sweep-block-size", prefix.MAX_BLOCK_SIZE) or [block_size]
    caps = _ints(sweep_capacity, "--sweep-capacity", prefix.MAX_CAPACITY_BLOCKS)
    if len(sizes) == 1 and not caps:
        report = run(sizes[0], capacity_for(sizes[0]), per_request)
        if plot:
            raise UsageError("--plot draws sweeps: add --sweep-capacity and/or --sweep-block-size")
        if fmt is Format.json:
            emit_json(report)
        else:
            _render(report)
        raise typer.Exit(EXIT_OK)
    runs = []
    for bs in sizes:
        for cap in (caps or [capacity_for(bs)]):
            r = run(bs, cap, False)
            runs.append({"block_size": bs, "capacity_blocks": cap, "capacity_tokens": None if cap is None else cap * bs,
                         "requests": r.requests, "query_tokens": r.query_tokens, "hit_tokens": r.hit_tokens,
                         "hit_rate": r.hit_rate, "evicted_blocks": r.evicted_blocks})
    result = {"schema_version": prefix.SCHEMA_VERSION, "policy": policy, "sweep": runs}
    if plot:
        _plot(runs, plot, policy)
    if fmt is Format.json:
        emit_json(result)
    else:
        _render_sweep(runs, policy)
    raise typer.Exit(EXIT_OK)


command.__doc__ = HELP


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _render(r) -> None:
    from rich.table import Table

    cap = "unbounded" if r.capacity_blocks is None else f"{r.capacity_blocks:,} blocks"
    label = " (upper bound)" if r.upper_bound else ""
    stdout.print(f"[bold]{r.policy}[/], block size {r.block_size}, capacity {cap}: {r.requests:,} requests, "
                 f"{r.query_tokens:,} prompt tokens", soft_wrap=True)
    stdout.print(f"hit rate {_pct(r.hit_rate)}{label}: {r.hit_tokens:,.0f} tokens of prefill saved; "
                 f"{r.evicted_blocks:,} blocks evicted; peak {r.peak_blocks_in_use:,} blocks in use", soft_wrap=True)
    if len(r.per_tenant) > 1 or r.per_tenant[0].tenant is not None:
        t = Table(header_style="bold", box=None, pad_edge=False)
        for col in ("tenant", "requests", "prompt tokens", "hit tokens", "hit rate"):
            t.add_column(col, justify="left" if col == "tenant" else "right")
        for s in r.per_tenant:
            t.add_row(str(s.tenant), f"{s.requests:,}", f"{s.query_tokens:,}", f"{s.hit_tokens:,.0f}", _pct(s.hit_rate))
        stdout.print(t)
        shared = r.cross_tenant_shared_blocks
        verdict = ("isolated" if shared == 0 else
                   "tenants share cached blocks: prefix-sharing timing side channel; salt per tenant to isolate")
        stdout.print(f"cross-tenant shared blocks: {shared:,} ({verdict})", soft_wrap=True)
    if r.per_request is not None:
        t = Table(header_style="bold", box=None, pad_edge=False)
        for col in ("#", "line", "prompt tokens", "hit tokens"):
            t.add_column(col, justify="right")
        for q in r.per_request:
            t.add_row(str(q.index), str(q.line), f"{q.prompt_tokens:,}", f"{q.hit_tokens:,.0f}")
        stdout.print(t)
    for note in r.notes:
        stdout.print(f"note: {note}", soft_wrap=True, markup=False)


def _render_sweep(runs: list[dict], policy: str) -> None:
    from rich.table import Table

    t = Table(title=f"{policy} sweep", header_style="bold", box=None, pad_edge=False)
    for col in ("block size", "capacity blocks", "capacity tokens", "hit rate", "hit tokens", "evicted blocks"):
        t.add_column(col, justify="right")
    for r in runs:
        cap = "unbounded" if r["capacity_blocks"] is None else f"{r['capacity_blocks']:,}"
        tokens = "" if r["capacity_tokens"] is None else f"{r['capacity_tokens']:,}"
        t.add_row(str(r["block_size"]), cap, tokens, _pct(r["hit_rate"]), f"{r['hit_tokens']:,.0f}",
                  f"{r['evicted_blocks']:,}")
    stdout.print(t)


def _plot(runs: list[dict], path: str, policy: str) -> None:
    fig, ax = new_figure(f"cachectl simulate-prefix, policy {policy}", "capacity (tokens)",
                         "prefix-cache hit rate (%)")
    for bs in sorted({r["block_size"] for r in runs}):
        pts = sorted((r["capacity_tokens"] or 0, r["hit_rate"] or 0.0) for r in runs if r["block_size"] == bs)
        ax.plot([p[0] for p in pts], [p[1] * 100 for p in pts], marker="o", label=f"block size {bs}")
    save_figure(fig, path)
