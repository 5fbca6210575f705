"""``cachectl simulate-prefix``: replay traffic through a vLLM-faithful prefix cache."""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Annotated, Any, Optional

import typer

from ..errors import InputError, UsageError
from .common import (
    EXIT_OK,
    AsOpt,
    BlockSizeOpt,
    CapacityBlocksOpt,
    CapacityGibOpt,
    ChatTemplateOpt,
    Dtype,
    Format,
    FormatOpt,
    HashFn,
    KvCapacity,
    KvDtypeOpt,
    Policy,
    Progress,
    TokenizerOpt,
    emit_json,
    handle_errors,
    new_figure,
    save_figure,
    stdout,
)

HELP = """Replay a request trace through a server prefix cache and count hits the way vLLM does.

TRACE is JSONL: {"tokens": [...], "salt"?, "timestamp"?, "output_tokens"?}; text or chat requests
("prompt", "messages", OpenAI/Anthropic bodies) with --tokenizer; or Mooncake lines
{"timestamp", "input_length", "output_length", "hash_ids"}; or a Parquet file with those fields as columns;
or a partition directory written by --partition-dir (replayed as routed, see its manifest.json). Requests replay one after another unless
--concurrency lets them overlap (they then pin their blocks until they finish). A fleet: --replicas N
--router R (or all) routes the trace over N such servers; --cpu-offload-blocks adds a CPU tier to each;
--model with --gpu prices the hits.
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
    ctx: typer.Context,
    trace: Annotated[str, typer.Argument(metavar="TRACE", help="JSONL trace (- for stdin), Parquet trace, or a partition directory written by --partition-dir.", show_default=False)],
    block_size: BlockSizeOpt = 16,
    capacity_blocks: CapacityBlocksOpt = None,
    capacity_gib: CapacityGibOpt = None,
    model: Annotated[Optional[str], typer.Option("--model", metavar="MODEL", help="For --capacity-gib: a catalog name, cached HF id, "
                                                                 "model directory, config.json or .gguf (as kv-inspect).")] = None,
    dtype: KvDtypeOpt = Dtype.bf16,
    policy: Annotated[Policy, typer.Option("--policy", case_sensitive=False,
                                           help="vllm, radix (SGLang), chunk (LMCache/CacheBlend), infinite (no "
                                                "eviction: the ceiling).")] = Policy.vllm,
    salt_field: Annotated[Optional[str], typer.Option("--salt-field", metavar="FIELD",
                                                      help="Field holding the per-tenant cache salt (default: salt "
                                                           "or cache_salt).")] = None,
    tenant_field: Annotated[Optional[str], typer.Option("--tenant-field", metavar="FIELD",
                                                        help="Field naming the tenant without salting, to measure "
                                                             "cross-tenant sharing.")] = None,
    no_salt: Annotated[bool, typer.Option("--no-salt", help="Ignore cache salts: what sharing would happen "
                                                              "without them (with --tenant-field).")] = False,
    tokenizer: TokenizerOpt = None,
    chat_template: ChatTemplateOpt = None,
    as_kind: AsOpt = None,
    hash_block_size: Annotated[int, typer.Option("--hash-block-size", min=1, metavar="N",
                                                 help="Tokens per hash_ids entry in Mooncake traces.")] = 512,
    hash_fn: Annotated[HashFn, typer.Option("--hash", case_sensitive=False,
                                            help="Block key: builtin (fast) or sha256 (vLLM's).")] = HashFn.builtin,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, metavar="N", help="Requests in flight at once.")] = 1,
    decode_ms: Annotated[float, typer.Option("--decode-ms-per-token", min=0.0, metavar="MS",
                                             help="With --concurrency: how long a request holds its blocks "
                                                  "per output token.")] = 20.0,
    chunk_size: Annotated[int, typer.Option("--chunk-size", min=1, metavar="N", help="chunk policy: tokens per chunk.")] = 256,
    recompute_ratio: Annotated[float, typer.Option("--recompute-ratio", metavar="SHARE",
                                                   help="chunk policy: share of a reused non-prefix chunk "
                                                        "that is recomputed.")] = 0.15,
    sweep_capacity: Annotated[Optional[str], typer.Option("--sweep-capacity", metavar="N,N,...",
                                                          help="Capacities in blocks to sweep.")] = None,
    sweep_block_size: Annotated[Optional[str], typer.Option("--sweep-block-size", metavar="B,B,...",
                                                            help="Block sizes to sweep.")] = None,
    curve: Annotated[bool, typer.Option("--curve", help="The whole hit-rate-vs-capacity curve: about "
                                                        "--curve-points log-spaced capacities from the smallest "
                                                        "that fits to the no-eviction ceiling, from one read.")] = False,
    curve_points: Annotated[int, typer.Option("--curve-points", min=2, help="Points of --curve.")] = 32,
    optimal: Annotated[bool, typer.Option("--optimal", help="With --curve/--sweep-capacity: also the offline "
                                                            "optimal bound (Belady) at each capacity.")] = False,
    warmup: Annotated[Optional[str], typer.Option("--warmup", metavar="N|SHARE",
                                                  help="Requests that fill the cache but are not counted: a "
                                                       "number (50) or a share of the trace (0.5).")] = None,
    no_generation_prompt: Annotated[bool, typer.Option("--no-generation-prompt",
                                                       help="Tokenize chat requests without the assistant header "
                                                            "(completion-style logs); by default they are rendered "
                                                            "as vLLM's chat endpoint does.")] = False,
    per_request: Annotated[bool, typer.Option("--per-request", help="List each request's hit tokens.")] = False,
    plot: Annotated[Optional[str], typer.Option("--plot", metavar="FILE.png",
                                                help="Draw hit rate against capacity per block size.")] = None,
    replicas: Annotated[Optional[int], typer.Option("--replicas", min=1, help="Replicas behind a router, each an "
                                                   "independent pool of --capacity-blocks.")] = None,
    router: Annotated[Optional[str], typer.Option("--router", metavar="R",
                                                  help="round-robin, random, session, prefix-hash, least-loaded, "
                                                       "cache-aware (SGLang's rule), or all (side by side).")] = None,
    session_field: Annotated[Optional[str], typer.Option("--session-field", metavar="FIELD",
                                                         help="session router: the field to hash (default: the first "
                                                              "of conversation, session_id, chat_id present).")] = None,
    prefix_blocks: Annotated[int, typer.Option("--prefix-blocks", min=1, help="prefix-hash router: full blocks "
                                                                                 "hashed.")] = 4,
    seed: Annotated[int, typer.Option("--seed", help="random router: the seed.")] = 0,
    cache_threshold: Annotated[float, typer.Option("--cache-threshold", help="cache-aware: least match ratio for "
                                                                                  "prefix routing.")] = 0.5,
    balance_abs: Annotated[int, typer.Option("--balance-abs-threshold", min=0, help="cache-aware: load gap that "
                                                                                     "may mean imbalance.")] = 32,
    balance_rel: Annotated[float, typer.Option("--balance-rel-threshold", help="cache-aware: load ratio that may "
                                                                                "mean imbalance.")] = 1.1,
    router_eviction_s: Annotated[float, typer.Option("--router-eviction-interval", min=0.0,
                                                     help="cache-aware: seconds between tree prunings.")] = 30.0,
    router_tree_tokens: Annotated[int, typer.Option("--router-max-tree-tokens", min=0,
                                                    help="cache-aware: tree size kept at each pruning.")] = 10000,
    cpu_offload_gib: Annotated[Optional[float], typer.Option("--cpu-offload-gib", help="CPU tier per replica in "
                                                                                       "GiB (needs --model).")] = None,
    cpu_offload_blocks: Annotated[Optional[int], typer.Option("--cpu-offload-blocks", min=1,
                                                              help="CPU tier per replica in blocks.")] = None,
    link: Annotated[str, typer.Option("--link", help="Host link for CPU-tier transfers (data/links.json).")] = "pcie5-x16",
    gpu: Annotated[Optional[str], typer.Option("--gpu", help="With --model: what the hits are worth on this GPU.")] = None,
    gpu_hour_usd: Annotated[Optional[float], typer.Option("--gpu-hour-usd", min=0.0, help="With --gpu: dollars.")] = None,
    utilization: Annotated[float, typer.Option("--utilization", help="With --gpu: share of peak FLOPs prefill "
                                                                      "reaches.")] = 0.4,
    jobs: Annotated[int, typer.Option("--jobs", min=1, help="Fleet: replicas replayed in this many processes.")] = 1,
    read_jobs: Annotated[Optional[int], typer.Option("--read-jobs", min=1, metavar="N",
                                                     help="Processes that read and key a large token trace (a "
                                                          "JSONL file of 8 MiB or more) for one replay or a curve; "
                                                          "the results are the same. Default: one per CPU, up to "
                                                          "8; 1 reads in this process.")] = None,
    partition_dir: Annotated[Optional[str], typer.Option("--partition-dir", metavar="DIR",
                                                         help="Route the trace once (--replicas N, --router "
                                                              "round-robin|random|session|prefix-hash) and write one "
                                                              "Parquet partition per replica to DIR; replay them with "
                                                              "TRACE = DIR.")] = None,
    ray: Annotated[bool, typer.Option("--ray", help="Replay a partition directory on Ray, one task per partition "
                                                    "(a local Ray unless --ray-address or RAY_ADDRESS).")] = False,
    ray_address: Annotated[Optional[str], typer.Option("--ray-address", metavar="ADDRESS",
                                                       help="With --ray: the cluster to connect to.")] = None,
    fmt: FormatOpt = Format.text,
) -> None:
    from ..engines.prefix.pools import CapacityError
    from ..engines.prefix.replay import MAX_BLOCK_SIZE, MAX_CAPACITY_BLOCKS, SCHEMA_VERSION, simulate
    from ..engines.prefix.trace import iter_trace, trace_records

    policy_name, hash_name = policy.value, hash_fn.value
    kv_capacity = KvCapacity(capacity_blocks, capacity_gib, model, dtype.value, block_size)
    bytes_per_token = kv_capacity.bytes_per_token
    warm = _warmup(warmup)
    if chat_template and tokenizer is None:
        raise UsageError("--chat-template needs --tokenizer")
    tok = _ChatAware(tokenizer, not no_generation_prompt, chat_template) if tokenizer is not None else None
    name = "<stdin>" if trace == "-" else trace

    capacity_for = kv_capacity.blocks

    def read(label: str, session_fields: tuple = (), keyed_at: Optional[int] = None):
        """The trace's requests, streamed (one read). ``keyed_at``: the replay only needs block keys at this
        block size, so a large token trace may be read and keyed by forked processes (the same requests)."""
        from ..inputs import parquet

        trace_opts: dict[str, Any] = {
            "salt_field": salt_field, "tenant_field": tenant_field, "hash_block_size": hash_block_size,
            "no_salt": no_salt, "as_kind": as_kind.value if as_kind else None,
            "add_generation_prompt": not no_generation_prompt, "session_fields": session_fields}
        columnar = parquet.is_parquet(trace)
        requests: Any
        from ..engines.prefix import read as prefix_read

        jobs = read_jobs or prefix_read.default_jobs()
        if keyed_at is not None and tok is None and not columnar and prefix_read.can_read_in_parallel(trace, jobs):
            from ..inputs.files import JsonlChunks

            requests = prefix_read.KeyedTrace(JsonlChunks(trace), block_size=keyed_at, hash_fn=hash_name, jobs=jobs,
                                              **trace_opts)
            requests.start()  # fork before the progress bar's thread starts
        else:
            if columnar:  # the same rows as JSONL lines would give, read a batch at a time
                records = parquet.parquet_records(trace, parquet.trace_columns(salt_field, tenant_field,
                                                                               *session_fields))
            else:
                records = trace_records(trace)
            requests = iter_trace(records, source=name, tokenizer=tok, **trace_opts)
            if columnar:
                requests = parquet.located_rows(requests, name)
        try:
            with Progress(label) as progress:
                for r in requests:
                    progress.advance()
                    yield r
        finally:
            if hasattr(requests, "close"):
                requests.close()

    def run(requests, bs: int, cap: Optional[int], keep_rows: bool, skip: int):
        return simulate(requests, policy=policy_name, block_size=bs, capacity_blocks=cap, hash_fn=hash_name,
                               concurrency=concurrency, decode_s_per_token=decode_ms / 1000.0,
                               chunk_size=chunk_size, recompute_ratio=recompute_ratio, per_request=keep_rows,
                               source=name, warmup=skip)

    from ..inputs import parquet as parquet_io

    partitions = None
    if trace != "-" and os.path.isdir(trace) and not parquet_io.is_partition_dir(trace):
        raise InputError(f"no {parquet_io.MANIFEST}: not a partition directory (write one with --partition-dir)",
                         source=name)
    if parquet_io.is_partition_dir(trace):
        if partition_dir is not None:
            raise UsageError(f"{name} holds partitions already: --partition-dir takes a trace")
        if tokenizer or salt_field or tenant_field or session_field or no_salt or as_kind:
            raise UsageError("a partition directory holds requests as they were read: --tokenizer, --as and the "
                             "--*-field and --no-salt options apply when it is written")
        manifest_path = os.path.join(name, parquet_io.MANIFEST)
        reading = _given(ctx, "hash_block_size", "no_generation_prompt")
        if reading:
            raise UsageError(f"{', '.join(reading)}: a partition directory holds requests as they were read "
                             f"(see {manifest_path}): {'they apply' if len(reading) > 1 else 'it applies'} when "
                             "it is written")
        routing = _given(ctx, "prefix_blocks", "seed", "cache_threshold", "balance_abs", "balance_rel",
                         "router_eviction_s", "router_tree_tokens")
        if routing:
            raise UsageError(f"{', '.join(routing)}: routing was done when the partitions were written (see "
                             f"{manifest_path}): routing options change nothing on replay, drop "
                             f"{'them' if len(routing) > 1 else 'it'}")
        if ray_address is not None and not ray:
            raise UsageError("--ray-address names the cluster for --ray: add --ray (or drop --ray-address)")
        manifest = parquet_io.read_manifest(trace)
        partitions = (list(parquet_io.partition_paths(trace, manifest)), manifest)
    elif ray or ray_address:
        raise UsageError("--ray replays trace partitions: write them first with --partition-dir DIR (and --replicas, "
                         "--router), then give DIR as the trace")
    if partition_dir is not None:
        if sweep_block_size or sweep_capacity or curve or optimal or per_request or plot:
            raise UsageError("--partition-dir writes partitions and replays nothing: drop --sweep-*, --curve, "
                             "--optimal, --per-request and --plot")
        from ..engines.prefix.fleet import SESSION_FIELDS
        from .simulate_fleet import write_partitions

        fields = (session_field,) if session_field else SESSION_FIELDS
        with _parquet_rows(trace, name):
            write_partitions(read=read("routing", fields if router == "session" else ()), name=name,
                             directory=partition_dir, replicas=replicas, router=router, block_size=block_size,
                             hash_block_size=hash_block_size, seed=seed, prefix_blocks=prefix_blocks,
                             session_fields=fields, fmt=fmt)
        raise typer.Exit(EXIT_OK)
    if (partitions is not None or replicas is not None or router is not None or cpu_offload_gib is not None
            or cpu_offload_blocks is not None):
        if sweep_block_size or sweep_capacity or curve or optimal or per_request:
            raise UsageError("--replicas/--router/--cpu-offload-* replay one capacity: drop --sweep-*, --curve, "
                             "--optimal and --per-request")
        from ..engines.prefix.fleet import SESSION_FIELDS, CacheAwareParams
        from .simulate_fleet import parse_value, run_fleet

        model_config, fleet_bpt, gpu_capacity = None, bytes_per_token, capacity_for(block_size)
        if model is not None:
            from ..engines.kv.config import kv_shape, resolve_model

            config, msource, _ = resolve_model(model)
            model_config = (config, msource)
            fleet_bpt = kv_shape(config, dtype.value, msource).bytes_per_token
        value = parse_value(model_config, gpu, gpu_hour_usd, utilization)
        fields = (session_field,) if session_field else SESSION_FIELDS
        params = CacheAwareParams(cache_threshold=cache_threshold, balance_abs_threshold=balance_abs,
                                  balance_rel_threshold=balance_rel, eviction_interval_s=router_eviction_s,
                                  max_tree_tokens=router_tree_tokens)
        with _parquet_rows(trace, name):
            run_fleet(read=read("reading", fields), name=name, replicas=replicas, router=router,
                      block_size=block_size, capacity_blocks=gpu_capacity, policy=policy_name, hash_fn=hash_name,
                      concurrency=concurrency, decode_s=decode_ms / 1000.0, warm=warm, seed=seed,
                      prefix_blocks=prefix_blocks, params=params, cpu_offload_gib=cpu_offload_gib,
                      cpu_offload_blocks=cpu_offload_blocks, bytes_per_token=fleet_bpt, link=link, jobs=jobs,
                      value=value, plot=plot, fmt=fmt, session_fields=fields, partitions=partitions, ray=ray,
                      ray_address=ray_address)
        _generation_note(tok)
        raise typer.Exit(EXIT_OK)
    if gpu is not None or gpu_hour_usd is not None:
        raise UsageError("--gpu/--gpu-hour-usd price the hits of a fleet run: add --replicas N (1 for one server)")
    sizes = _ints(sweep_block_size, "--sweep-block-size", MAX_BLOCK_SIZE) or [block_size]
    caps = _ints(sweep_capacity, "--sweep-capacity", MAX_CAPACITY_BLOCKS)
    if curve and caps:
        raise UsageError("--curve picks the capacities itself: drop --sweep-capacity (or --curve)")
    if (curve or optimal) and policy_name != "vllm":
        raise UsageError("--curve and --optimal follow the vllm policy's block rules: use --policy vllm")
    if optimal and not (curve or caps):
        raise UsageError("--optimal draws the bound beside a curve: add --curve or --sweep-capacity")
    if len(sizes) == 1 and not caps and not curve:
        bs, cap = sizes[0], capacity_for(sizes[0])
        largest = _Largest(read(f"{policy_name} bs={bs}", keyed_at=bs if policy_name in ("vllm", "infinite") else None),
                           bs)
        try:
            if isinstance(warm, float) and warm < 1:  # a share: count the requests first (kept in memory once)
                requests = list(largest)
                report = run(requests, bs, cap, per_request, _resolve_warmup(warm, len(requests)))
            else:
                report = run(largest, bs, cap, per_request, int(warm or 0))
        except CapacityError as exc:
            if policy_name != "vllm" or cap is None:
                raise
            largest.drain()                        # read on: the true minimum is the largest request's
            raise UsageError(f"{exc}; the whole trace needs {largest.need:,} blocks of {bs} (its largest request, "
                             f"line {largest.line}): --capacity-blocks {largest.need} or more, or --curve") from None
        if plot:
            raise UsageError("--plot draws sweeps: add --curve, --sweep-capacity and/or --sweep-block-size")
        if fmt is Format.json:
            import dataclasses

            emit_json({**dataclasses.asdict(report), "chat_generation_prompt": tok.used if tok else None})
        else:
            _render(report, salt_field, tenant_field)
            _generation_note(tok)
        raise typer.Exit(EXIT_OK)
    if per_request:
        raise UsageError("--per-request lists one replay: drop it from sweeps")
    skip = 0
    if policy_name == "vllm":
        from ..engines.prefix import curve as prefix_curve

        keyed = prefix_curve.key_trace(read("reading and keying", keyed_at=sizes[0] if len(sizes) == 1 else None),
                                       sizes, hash_fn=hash_name, source=name)
        curves = []
        for bs in sizes:
            points: list[int] | None = None
            if not curve:
                one = capacity_for(bs)
                if not caps and one is None:
                    raise UsageError("the vllm policy needs --capacity-blocks, --sweep-capacity or --curve")
                points = [*caps] if caps else [one] if one is not None else []
            with Progress(f"replaying (blocks of {bs})") as progress:
                curves.append(prefix_curve.capacity_curve(keyed[bs], points, points=curve_points, warmup=warm,
                                                          concurrency=concurrency,
                                                          decode_s_per_token=decode_ms / 1000.0, optimal=optimal,
                                                          source=name, progress=progress.advance))
        if not any(p.fits for c in curves for p in c.points):
            c = curves[0]
            raise UsageError(f"no capacity holds the largest request ({name}:{c.min_capacity_line}, "
                             f"{c.min_capacity_blocks} blocks of {c.block_size}): the minimum that works is "
                             f"{c.min_capacity_blocks} blocks")
        runs = [{"block_size": c.block_size, "capacity_blocks": p.capacity_blocks,
                 "capacity_tokens": p.capacity_tokens, "fits": p.fits, "requests": c.counted_requests,
                 "query_tokens": c.query_tokens, "hit_tokens": p.hit_tokens, "hit_rate": p.hit_rate,
                 "evicted_blocks": p.evicted_blocks, "optimal_hit_tokens": p.optimal_hit_tokens,
                 "optimal_hit_rate": p.optimal_hit_rate} for c in curves for p in c.points]
    else:  # token-level policies: the requests are kept in memory and replayed per point
        requests = list(read("reading"))
        skip = _resolve_warmup(warm, len(requests))
        curves, runs = [], []
        for bs in sizes:
            for cap in ([*caps] if caps else [capacity_for(bs)]):
                r = run(requests, bs, cap, False, skip)
                runs.append({"block_size": bs, "capacity_blocks": cap,
                             "capacity_tokens": None if cap is None else cap * bs, "fits": True,
                             "requests": r.requests, "query_tokens": r.query_tokens, "hit_tokens": r.hit_tokens,
                             "hit_rate": r.hit_rate, "evicted_blocks": r.evicted_blocks})
    result = {"schema_version": SCHEMA_VERSION, "policy": policy_name, "mode": "curve" if curve else "sweep",
              "chat_generation_prompt": tok.used if tok else None, "curves": curves, "sweep": runs}
    if plot:
        _plot(runs, plot, policy_name, curves)
    if fmt is Format.json:
        emit_json(result)
    else:
        _render_sweep(runs, policy_name, curves, "curve" if curve else "sweep")
        if not curves and skip:
            stdout.print(f"note: the first {skip} requests warmed the cache and are not counted", markup=False)
        _generation_note(tok)
    raise typer.Exit(EXIT_OK)


def _given(ctx: typer.Context, *params: str) -> list[str]:
    """The options among ``params`` (parameter names) that the command line or the environment set."""
    def given(name: str) -> bool:
        source = ctx.get_parameter_source(name)
        return source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT")

    return [p.opts[0] for p in ctx.command.params if p.name in params and given(p.name)]


@contextmanager
def _parquet_rows(trace: str, name: str):
    """An input error the router raises at ``name:N`` (a line, a field) worded as row N, column C when the
    trace is Parquet, as the reader's own errors are."""
    try:
        yield
    except InputError as exc:
        from ..inputs import parquet

        if trace == "-" or os.path.isdir(trace) or not parquet.is_parquet(trace):
            raise
        raise parquet.row_error(exc, name) from None


class _Largest:
    """Requests passed through, remembering the one that needs the most blocks (and its line)."""

    def __init__(self, requests, block_size: int):
        self._it = iter(requests)
        self._bs = block_size
        self.need, self.line = 0, None

    def __iter__(self):
        return self

    def __next__(self):
        r = next(self._it)
        need = -(-r.prompt_tokens // self._bs)
        if need > self.need:
            self.need, self.line = need, r.line
        return r

    def drain(self) -> None:
        for _ in self:
            pass


class _ChatAware:
    """The tokenizer, loaded once, that renders chat requests with or without the generation prompt and
    remembers which it did (``used``: None while no chat request was rendered)."""

    def __init__(self, spec: str, add_generation_prompt: bool, chat_template: Optional[str] = None):
        from ..tokenization import load_tokenizer

        self._tok = load_tokenizer(spec, chat_template_file=chat_template)
        self._gen = add_generation_prompt
        self.used: Optional[bool] = None

    def tokenize_many(self, prompts, **kwargs):
        if any(p.is_chat for p in prompts):
            self.used = self._gen
        kwargs["add_generation_prompt"] = self._gen
        return self._tok.tokenize_many(prompts, **kwargs)


def _generation_note(tok: Optional[_ChatAware]) -> None:
    if tok is not None and tok.used is not None:
        how = ("with the generation prompt, as vLLM's chat endpoint does (--no-generation-prompt for "
               "completion-style logs)" if tok.used else "without the generation prompt (--no-generation-prompt)")
        stdout.print(f"note: chat requests tokenized {how}", soft_wrap=True, markup=False)


def _warmup(text: Optional[str]):
    """``--warmup``: 50 (requests) or 0.5 (a share); checked here, resolved once the count is known."""
    if text is None:
        return 0
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"--warmup expects a number of requests (50) or a share (0.5), got {text!r}") from None
    if value < 0 or value != value:
        raise UsageError(f"--warmup must not be negative, got {text!r}")
    if value < 1 and value != 0:
        return value
    if not value.is_integer():
        raise UsageError(f"--warmup {text} is neither a share below 1 nor a whole number of requests")
    return int(value)


def _resolve_warmup(warm, n: int) -> int:
    from ..engines.prefix.curve import resolve_warmup

    return resolve_warmup(warm, n)


command.__doc__ = HELP


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _render(r, salt_field: Optional[str] = None, tenant_field: Optional[str] = None) -> None:
    from rich.table import Table

    cap = "unbounded" if r.capacity_blocks is None else f"{r.capacity_blocks:,} blocks"
    label = " (upper bound)" if r.upper_bound else ""
    stdout.print(f"[bold]{r.policy}[/], block size {r.block_size}, capacity {cap}: {r.requests:,} requests, "
                 f"{r.query_tokens:,} prompt tokens", soft_wrap=True)
    # vllm counts what vLLM's KV-cache usage counts, blocks that running requests hold; cached blocks no request
    # holds are free to it. The other policies count what they cache.
    held = "held by running requests" if r.policy == "vllm" else "cached"
    stdout.print(f"hit rate {_pct(r.hit_rate)}{label}: {r.hit_tokens:,.0f} tokens of prefill saved; "
                 f"{r.evicted_blocks:,} blocks evicted; peak {r.peak_blocks_in_use:,} blocks {held}", soft_wrap=True)
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
    if r.unsalted_requests:
        stdout.print(f"note: {r.unsalted_requests:,} of {r.requests:,} requests have no '{salt_field}': cached "
                     "unsalted, shareable by every tenant", soft_wrap=True, markup=False)
    if tenant_field and r.requests_without_tenant:
        whole = " (so no tenant table)" if r.requests_without_tenant == r.requests else ""
        stdout.print(f"note: --tenant-field '{tenant_field}' is absent on {r.requests_without_tenant:,} of "
                     f"{r.requests:,} requests{whole}", soft_wrap=True, markup=False)
    for note in r.notes:
        stdout.print(f"note: {note}", soft_wrap=True, markup=False)


def _render_sweep(runs: list[dict], policy: str, curves: list, mode: str) -> None:
    from rich.table import Table

    opt = any(r.get("optimal_hit_rate") is not None for r in runs)
    t = Table(title=f"{policy} {mode}", header_style="bold", box=None, pad_edge=False)
    cols = ["block size", "capacity blocks", "capacity tokens", "hit rate"]
    cols += ["optimal (bound)"] if opt else []
    cols += ["hit tokens", "evicted blocks"]
    for col in cols:
        t.add_column(col, justify="right")
    for r in runs:
        cap = "unbounded" if r["capacity_blocks"] is None else f"{r['capacity_blocks']:,}"
        tokens = "" if r["capacity_tokens"] is None else f"{r['capacity_tokens']:,}"
        if not r.get("fits", True):
            row = [str(r["block_size"]), cap, tokens, "too small"] + ([""] if opt else []) + ["", ""]
        else:
            row = [str(r["block_size"]), cap, tokens, _pct(r["hit_rate"])]
            row += [_pct(r.get("optimal_hit_rate"))] if opt else []
            row += [f"{r['hit_tokens']:,.0f}", f"{r['evicted_blocks']:,}"]
        t.add_row(*row)
    stdout.print(t)
    for c in curves:
        stdout.print(f"block size {c.block_size}: minimum {c.min_capacity_blocks:,} blocks (the largest request, "
                     f"line {c.min_capacity_line}); no eviction from {c.ceiling_capacity_blocks:,} blocks, "
                     f"ceiling hit rate {_pct(c.ceiling_hit_rate)}; {c.counted_requests:,} requests counted",
                     soft_wrap=True, markup=False)
    for note in dict.fromkeys(n for c in curves for n in c.notes):
        stdout.print(f"note: {note}", soft_wrap=True, markup=False)


def _plot(runs: list[dict], path: str, policy: str, curves: list) -> None:
    fig, ax = new_figure(f"cachectl simulate-prefix, policy {policy}", "KV capacity (tokens)",
                         "prefix-cache hit rate (%)")
    for bs in sorted({r["block_size"] for r in runs}):
        pts = sorted((r["capacity_tokens"] or 0, r["hit_rate"] or 0.0, r.get("optimal_hit_rate"))
                     for r in runs if r["block_size"] == bs and r.get("fits", True))
        (line,) = ax.plot([p[0] for p in pts], [p[1] * 100 for p in pts], marker="o", markersize=3,
                          label=f"{policy} LRU, block size {bs}")
        if any(p[2] is not None for p in pts):
            ax.plot([p[0] for p in pts], [(p[2] or 0) * 100 for p in pts], linestyle="--", color=line.get_color(),
                    label=f"optimal bound (Belady), block size {bs}")
        for c in curves:
            if c.block_size != bs:
                continue
            ax.axvline(c.min_capacity_blocks * bs, color=line.get_color(), linestyle=":", alpha=0.7,
                       label=f"minimum {c.min_capacity_blocks:,} blocks")
            ax.axvline(c.ceiling_capacity_blocks * bs, color="grey", linestyle="-.", alpha=0.7,
                       label=f"no eviction from {c.ceiling_capacity_blocks:,} blocks")
            if c.ceiling_hit_rate is not None:
                ax.axhline(c.ceiling_hit_rate * 100, color="grey", linestyle=":", alpha=0.7,
                           label=f"ceiling {c.ceiling_hit_rate:.1%}")
    if len(runs) > 8:
        ax.set_xscale("log")
    save_figure(fig, path)
