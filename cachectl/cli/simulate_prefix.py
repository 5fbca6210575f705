"""``cachectl simulate-prefix``: replay traffic through a vLLM-faithful prefix cache.

One command per mode (``replay``, ``served``, ``curve``, ``fleet``, ``partition``), each taking the options of
its mode; and the plain spelling ``simulate-prefix TRACE [OPTIONS]``, which takes every option and picks the
mode from them, as the single command did before the modes were split.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from difflib import get_close_matches
from typing import Annotated, Any, Literal, Optional

import typer

from ..errors import InputError, UsageError
from .common import (
    EXIT_OK,
    AsOpt,
    BlockSizeOpt,
    CachectlGroup,
    CapacityBlocksOpt,
    CapacityGibOpt,
    ChatTemplateOpt,
    Dtype,
    Format,
    FormatOpt,
    HashFn,
    InputKind,
    KvCapacity,
    KvDtypeOpt,
    Policy,
    Progress,
    TimeUnit,
    TimeUnitOpt,
    TimeZoneOpt,
    TokenizerOpt,
    check_plot,
    data_names,
    emit_json,
    handle_errors,
    in_panel,
    lazy_command,
    new_figure,
    print_note,
    run_inputs,
    save_figure,
    stdout,
    tidy_help,
    timestamp_note,
    timestamp_reader,
    write_sections,
)
from .logformat import LogFormatOpt, log_format_name

HELP = """Replay a request trace through a server prefix cache.

Hits are counted the way vLLM counts them. Each command runs one mode; its --help lists its options.
Without a command, simulate-prefix TRACE [OPTIONS] takes every option and picks the mode, as it always did
(simulate-prefix TRACE --help lists them all).
"""

TRACE_HELP = "JSONL trace (- for stdin), Parquet trace, or a partition directory written by --partition-dir."

PLAIN_HELP = """Replay a request trace through a server prefix cache.

Hits are counted the way vLLM counts them.

TRACE is JSONL: {"tokens": [...], "salt"?, "timestamp"?, "output_tokens"?}; text or chat requests
("prompt", "messages", OpenAI/Anthropic bodies) with --tokenizer; or Mooncake lines
{"timestamp", "input_length", "output_length", "hash_ids"}; or a Parquet file with those fields as columns;
or a partition directory written by --partition-dir (replayed as routed, see its manifest.json). Requests replay one after another unless
--concurrency lets them overlap (they then pin their blocks until they finish). A fleet: --replicas N
--router R (or all) routes the trace over N such servers; --cpu-offload-blocks adds a CPU tier to each;
--model with --gpu prices the hits.
"""

# The help panels (typer's rich_help_panel) that --help lists the options under, in this order.
INPUT, CACHE, CURVE, FLEET = "Input", "Cache", "Curve and sweeps", "Fleet and tiers"
PARTITIONS, WORTH, OUTPUT = "Partitions", "What the hits are worth", "Output"

# ------------------------------------------------------------------------ the options, declared once

TraceArg = Annotated[str, typer.Argument(metavar="TRACE", help=TRACE_HELP, show_default=False)]
# input: the trace and how its lines become requests
AsKindOpt = Annotated[Optional[InputKind], in_panel(AsOpt, INPUT)]
LogFmtOpt = Annotated[Optional[str], in_panel(LogFormatOpt, INPUT)]
HashBlockSizeOpt = Annotated[int, typer.Option("--hash-block-size", min=1, metavar="N",
                                               help="Tokens per hash_ids entry in Mooncake traces.", rich_help_panel=INPUT)]
TokOpt = Annotated[Optional[str], in_panel(TokenizerOpt, INPUT)]
TemplateOpt = Annotated[Optional[str], in_panel(ChatTemplateOpt, INPUT)]
NoGenerationPromptOpt = Annotated[bool, typer.Option("--no-generation-prompt",
                                                     help="Tokenize chat requests without the assistant header "
                                                          "(completion-style logs); by default they are rendered "
                                                          "as vLLM's chat endpoint does.", rich_help_panel=INPUT)]
SaltFieldOpt = Annotated[Optional[str], typer.Option("--salt-field", metavar="FIELD",
                                                     help="Field holding the per-tenant cache salt (default: salt "
                                                          "or cache_salt).", rich_help_panel=INPUT)]
TenantFieldOpt = Annotated[Optional[str], typer.Option("--tenant-field", metavar="FIELD",
                                                       help="Field naming the tenant without salting, to measure "
                                                            "cross-tenant sharing.", rich_help_panel=INPUT)]
NoSaltOpt = Annotated[bool, typer.Option("--no-salt", help="Ignore cache salts: what sharing would happen "
                                                            "without them (with --tenant-field).", rich_help_panel=INPUT)]
TimeOpt = Annotated[Optional[TimeUnit], in_panel(TimeUnitOpt, INPUT)]
ZoneOpt = Annotated[Optional[str], in_panel(TimeZoneOpt, INPUT)]
ReadJobsOpt = Annotated[Optional[int], typer.Option("--read-jobs", min=1, metavar="N",
                                                    help="Processes that read and key a large token trace (a "
                                                         "JSONL file of 8 MiB or more) for one replay or a curve; "
                                                         "the results are the same. Default: one per CPU, up to "
                                                         "8; 1 reads in this process.", rich_help_panel=INPUT)]
# the cache: one server's pool
PolicyOpt = Annotated[Policy, typer.Option("--policy", case_sensitive=False,
                                           help="vllm, radix (SGLang), chunk (LMCache/CacheBlend), infinite (no "
                                                "eviction: the ceiling).", rich_help_panel=CACHE)]
BlockOpt = Annotated[int, in_panel(BlockSizeOpt, CACHE)]
CapBlocksOpt = Annotated[Optional[int], in_panel(CapacityBlocksOpt, CACHE)]
CapGibOpt = Annotated[Optional[float], in_panel(CapacityGibOpt, CACHE)]
ModelOpt = Annotated[Optional[str], typer.Option("--model", metavar="MODEL", help="For --capacity-gib: a catalog name, cached HF id, "
                                                 "model directory, config.json or .gguf (as kv-inspect).", rich_help_panel=CACHE)]
DtypeOpt = Annotated[Dtype, in_panel(KvDtypeOpt, CACHE)]
HashOpt = Annotated[HashFn, typer.Option("--hash", case_sensitive=False,
                                         help="Block key: builtin (fast) or sha256 (vLLM's).", rich_help_panel=CACHE)]
ChunkSizeOpt = Annotated[int, typer.Option("--chunk-size", min=1, metavar="N", help="chunk policy: tokens per chunk.", rich_help_panel=CACHE)]
RecomputeOpt = Annotated[float, typer.Option("--recompute-ratio", metavar="SHARE",
                                             help="chunk policy: share of a reused non-prefix chunk that is "
                                                  "recomputed.", rich_help_panel=CACHE)]
ConcurrencyOpt = Annotated[int, typer.Option("--concurrency", min=1, metavar="N", help="Requests in flight at once.", rich_help_panel=CACHE)]
DecodeMsOpt = Annotated[float, typer.Option("--decode-ms-per-token", min=0.0, max=3.6e6, metavar="MS",
                                            help="With --concurrency: how long a request holds its blocks per "
                                                 "output token.", rich_help_panel=CACHE)]
WarmupOpt = Annotated[Optional[str], typer.Option("--warmup", metavar="N|SHARE",
                                                  help="Requests that fill the cache but are not counted: a "
                                                       "number (50) or a share of the trace (0.5).", rich_help_panel=CACHE)]
# curve and sweeps
CurveOpt = Annotated[bool, typer.Option("--curve", help="The whole hit-rate-vs-capacity curve: about --curve-points "
                                                        "log-spaced capacities from the smallest that fits to the "
                                                        "no-eviction ceiling, from one read.", rich_help_panel=CURVE)]
CurvePointsOpt = Annotated[int, typer.Option("--curve-points", min=2, max=100_000, help="Points of --curve.",
                                             rich_help_panel=CURVE)]
OptimalOpt = Annotated[bool, typer.Option("--optimal", help="With --curve/--sweep-capacity: also the offline optimal "
                                                            "bound (Belady) at each capacity.", rich_help_panel=CURVE)]
SweepCapacityOpt = Annotated[Optional[str], typer.Option("--sweep-capacity", metavar="N,N,...",
                                                         help="Capacities in blocks to sweep.", rich_help_panel=CURVE)]
SweepBlockSizeOpt = Annotated[Optional[str], typer.Option("--sweep-block-size", metavar="B,B,...",
                                                          help="Block sizes to sweep.", rich_help_panel=CURVE)]
# fleet and tiers
ReplicasOpt = Annotated[Optional[int], typer.Option("--replicas", min=1, max=100_000, help="Replicas behind a router, each an "
                                                    "independent pool of --capacity-blocks.", rich_help_panel=FLEET)]
RouterOpt = Annotated[Optional[str], typer.Option("--router", metavar="R",
                                                  help="round-robin, random, session, prefix-hash, least-loaded, "
                                                       "cache-aware (SGLang's rule), or all (side by side).", rich_help_panel=FLEET)]
SessionFieldOpt = Annotated[Optional[str], typer.Option("--session-field", metavar="FIELD",
                                                        help="session router: the field to hash (default: the first "
                                                             "of conversation, session_id, chat_id present).", rich_help_panel=FLEET)]
PrefixBlocksOpt = Annotated[int, typer.Option("--prefix-blocks", min=1, help="prefix-hash router: full blocks hashed.",
                                              rich_help_panel=FLEET)]
SeedOpt = Annotated[int, typer.Option("--seed", help="random router: the seed.", rich_help_panel=FLEET)]
CacheThresholdOpt = Annotated[float, typer.Option("--cache-threshold", help="cache-aware: least match ratio for "
                                                                            "prefix routing.", rich_help_panel=FLEET)]
BalanceAbsOpt = Annotated[int, typer.Option("--balance-abs-threshold", min=0, help="cache-aware: load gap that may "
                                                                                   "mean imbalance.", rich_help_panel=FLEET)]
BalanceRelOpt = Annotated[float, typer.Option("--balance-rel-threshold", help="cache-aware: load ratio that may mean "
                                                                              "imbalance.", rich_help_panel=FLEET)]
RouterEvictionOpt = Annotated[float, typer.Option("--router-eviction-interval", min=0.0,
                                                  help="cache-aware: seconds between tree prunings.", rich_help_panel=FLEET)]
RouterTreeOpt = Annotated[int, typer.Option("--router-max-tree-tokens", min=0,
                                            help="cache-aware: tree size kept at each pruning.", rich_help_panel=FLEET)]
FleetJobsOpt = Annotated[int, typer.Option("--jobs", min=1, help="Fleet: replicas replayed in this many processes.", rich_help_panel=FLEET)]
CpuGibOpt = Annotated[Optional[float], typer.Option("--cpu-offload-gib", help="CPU tier per replica in GiB (needs "
                                                                              "--model).", rich_help_panel=FLEET)]
CpuBlocksOpt = Annotated[Optional[int], typer.Option("--cpu-offload-blocks", min=1,
                                                     help="CPU tier per replica in blocks.", rich_help_panel=FLEET)]
LinkOpt = Annotated[str, typer.Option("--link", metavar="LINK", help="Host link for CPU-tier transfers: "
                                      f"{data_names('links.json', 'links')} (data/links.json).", rich_help_panel=FLEET)]
# partitions
PartitionDirOpt = Annotated[Optional[str], typer.Option("--partition-dir", metavar="DIR",
                                                        help="Route the trace once (--replicas N, --router "
                                                             "round-robin|random|session|prefix-hash) and write one "
                                                             "Parquet partition per replica to DIR; replay them with "
                                                             "TRACE = DIR.", rich_help_panel=PARTITIONS)]
RayOpt = Annotated[bool, typer.Option("--ray", help="Replay a partition directory on Ray, one task per partition (a "
                                                    "local Ray unless --ray-address or RAY_ADDRESS).", rich_help_panel=PARTITIONS)]
RayAddressOpt = Annotated[Optional[str], typer.Option("--ray-address", metavar="ADDRESS",
                                                      help="With --ray: the cluster to connect to.", rich_help_panel=PARTITIONS)]
# what the hits are worth
GpuOpt = Annotated[Optional[str], typer.Option("--gpu", metavar="GPU", help="With --model: what the hits are worth on "
                                               f"this GPU: {data_names('gpus.json', 'gpus', only='gpu_flops.json')}.",
                                               rich_help_panel=WORTH)]
GpuHourOpt = Annotated[Optional[float], typer.Option("--gpu-hour-usd", min=0.0, help="With --gpu: dollars.", rich_help_panel=WORTH)]
UtilizationOpt = Annotated[float, typer.Option("--utilization", help="With --gpu: share of peak FLOPs prefill "
                                                                     "reaches.", rich_help_panel=WORTH)]
BatchOpt = Annotated[int, typer.Option("--batch", min=1, metavar="N", help="With --gpu: sequences decoded per step, "
                                       "for the decode roofline and the throughput figure.", rich_help_panel=WORTH)]
# output
PerRequestOpt = Annotated[bool, typer.Option("--per-request", help="List each request's hit tokens.", rich_help_panel=OUTPUT)]
PlotOpt = Annotated[Optional[str], typer.Option("--plot", metavar="FILE.png",
                                                help="Draw hit rate against capacity per block size.", rich_help_panel=OUTPUT)]
FmtOpt = Annotated[Format, in_panel(FormatOpt, OUTPUT)]


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


Mode = Literal["replay", "sweep", "fleet", "write partitions", "replay partitions"]
#: the commands: each runs one mode (``served`` is a replay that compares with the server's counts)
Command = Literal["replay", "served", "curve", "fleet", "partition"]


@dataclass(frozen=True)
class Options:
    """What one ``simulate-prefix`` run was asked, parsed and checked; each mode reads the fields it needs."""

    # input: the trace and how its lines become requests
    trace: str
    name: str                      # the trace as messages name it (<stdin> for -)
    tok: Optional[_ChatAware]
    salt_field: Optional[str]
    tenant_field: Optional[str]
    no_salt: bool
    as_kind: Optional[str]
    log_format: Optional[str]      # --log-format (None: found from the first lines)
    add_generation_prompt: bool    # chat requests rendered as vLLM's chat endpoint does
    hash_block_size: int
    read_jobs: Optional[int]
    timestamps: Any                # the run's TimestampReader (--time-unit)
    # the cache: one server's pool
    policy: str
    hash_fn: str
    block_size: int
    capacity: KvCapacity
    warm: int | float              # requests, or a share of the trace (below 1)
    concurrency: int
    decode_s: float                # seconds a request holds its blocks per output token
    chunk_size: int
    recompute_ratio: float
    # curve and sweeps
    sizes: tuple[int, ...]         # the block sizes (the one --block-size unless --sweep-block-size)
    caps: tuple[int, ...]          # --sweep-capacity
    curve: bool
    curve_points: int
    optimal: bool
    # fleet, partitions and tiers
    replicas: Optional[int]
    router: Optional[str]
    session_field: Optional[str]
    seed: int
    prefix_blocks: int
    cache_threshold: float
    balance_abs: int
    balance_rel: float
    router_eviction_s: float
    router_tree_tokens: int
    cpu_offload_gib: Optional[float]
    cpu_offload_blocks: Optional[int]
    link: str
    jobs: int
    partition_dir: Optional[str]   # write partitions here
    partitions: Optional[tuple[list[str], dict]]  # the trace is a partition directory: its files and manifest
    ray: bool
    ray_address: Optional[str]
    # the model (its KV bytes per token, for a CPU tier) and what the hits are worth
    model: Optional[str]
    dtype: str
    gpu: Optional[str]
    gpu_hour_usd: Optional[float]
    utilization: float
    batch: int                     # sequences decoded per step (the decode roofline, throughput)
    # output
    per_request: bool
    plot: Optional[str]
    fmt: Format
    served_only: bool = False      # the served command: the trace must carry the server's cached tokens


# --------------------------------------------------------------------------------------- the commands
# Each command takes the options of its mode and hands them, as given, to _start (``**locals()``: the
# command's parameters, nothing else, since it is the first statement).


@handle_errors
def replay_command(
    ctx: typer.Context, trace: TraceArg,
    as_kind: AsKindOpt = None, log_format: LogFmtOpt = None, hash_block_size: HashBlockSizeOpt = 512, tokenizer: TokOpt = None,
    chat_template: TemplateOpt = None, no_generation_prompt: NoGenerationPromptOpt = False,
    salt_field: SaltFieldOpt = None, tenant_field: TenantFieldOpt = None, no_salt: NoSaltOpt = False,
    time_unit: TimeOpt = None, time_zone: ZoneOpt = None, read_jobs: ReadJobsOpt = None,
    policy: PolicyOpt = Policy.vllm, block_size: BlockOpt = 16, capacity_blocks: CapBlocksOpt = None,
    capacity_gib: CapGibOpt = None, model: ModelOpt = None, dtype: DtypeOpt = Dtype.bf16,
    hash_fn: HashOpt = HashFn.builtin, chunk_size: ChunkSizeOpt = 256, recompute_ratio: RecomputeOpt = 0.15,
    concurrency: ConcurrencyOpt = 1, decode_ms: DecodeMsOpt = 20.0, warmup: WarmupOpt = None,
    gpu: GpuOpt = None, gpu_hour_usd: GpuHourOpt = None, utilization: UtilizationOpt = 0.4, batch: BatchOpt = 32,
    per_request: PerRequestOpt = False, fmt: FmtOpt = Format.text,
) -> None:
    """One server at one capacity: the hit rate.

    Hits are counted the way vLLM counts them; per tenant with --tenant-field, per request with
    --per-request; --model with --gpu prices them. A log that carries the server's cached tokens is also
    compared with them (see served).
    """
    _start("replay", **locals())


@handle_errors
def served_command(
    ctx: typer.Context, trace: TraceArg,
    as_kind: AsKindOpt = None, log_format: LogFmtOpt = None, hash_block_size: HashBlockSizeOpt = 512, tokenizer: TokOpt = None,
    chat_template: TemplateOpt = None, no_generation_prompt: NoGenerationPromptOpt = False,
    salt_field: SaltFieldOpt = None, tenant_field: TenantFieldOpt = None, no_salt: NoSaltOpt = False,
    time_unit: TimeOpt = None, time_zone: ZoneOpt = None, read_jobs: ReadJobsOpt = None,
    policy: PolicyOpt = Policy.vllm, block_size: BlockOpt = 16, capacity_blocks: CapBlocksOpt = None,
    capacity_gib: CapGibOpt = None, model: ModelOpt = None, dtype: DtypeOpt = Dtype.bf16,
    hash_fn: HashOpt = HashFn.builtin, chunk_size: ChunkSizeOpt = 256, recompute_ratio: RecomputeOpt = 0.15,
    concurrency: ConcurrencyOpt = 1, decode_ms: DecodeMsOpt = 20.0, warmup: WarmupOpt = None,
    gpu: GpuOpt = None, gpu_hour_usd: GpuHourOpt = None, utilization: UtilizationOpt = 0.4, batch: BatchOpt = 32,
    per_request: PerRequestOpt = False, fmt: FmtOpt = Format.text,
) -> None:
    """Predicted hits beside the server's cached tokens.

    TRACE is a log whose responses carry the prompt tokens the server served from its cache (vLLM's
    usage.prompt_tokens_details.cached_tokens, SGLang's meta_info.cached_tokens). Each request the replay
    disagrees on gets its likely reason (another capacity, block size, template, preemption) and how sure
    that is; --per-request lists every request.
    """
    _start("served", **locals())


@handle_errors
def curve_command(
    ctx: typer.Context, trace: TraceArg,
    as_kind: AsKindOpt = None, log_format: LogFmtOpt = None, hash_block_size: HashBlockSizeOpt = 512, tokenizer: TokOpt = None,
    chat_template: TemplateOpt = None, no_generation_prompt: NoGenerationPromptOpt = False,
    salt_field: SaltFieldOpt = None, tenant_field: TenantFieldOpt = None, no_salt: NoSaltOpt = False,
    time_unit: TimeOpt = None, time_zone: ZoneOpt = None, read_jobs: ReadJobsOpt = None,
    policy: PolicyOpt = Policy.vllm, block_size: BlockOpt = 16, capacity_blocks: CapBlocksOpt = None,
    capacity_gib: CapGibOpt = None, model: ModelOpt = None, dtype: DtypeOpt = Dtype.bf16,
    hash_fn: HashOpt = HashFn.builtin, chunk_size: ChunkSizeOpt = 256, recompute_ratio: RecomputeOpt = 0.15,
    concurrency: ConcurrencyOpt = 1, decode_ms: DecodeMsOpt = 20.0, warmup: WarmupOpt = None,
    curve: CurveOpt = False, curve_points: CurvePointsOpt = 32, optimal: OptimalOpt = False,
    sweep_capacity: SweepCapacityOpt = None, sweep_block_size: SweepBlockSizeOpt = None,
    plot: PlotOpt = None, fmt: FmtOpt = Format.text,
) -> None:
    """Hit rate against capacity: a curve or a sweep.

    Unless --sweep-capacity or a capacity picks the points, the whole curve (--curve): about --curve-points
    log-spaced capacities from the smallest that fits to the no-eviction ceiling, from one read of the trace.
    --sweep-block-size repeats it per block size, --optimal adds the offline optimal bound, --plot draws it.
    """
    if not (sweep_capacity or capacity_blocks is not None or capacity_gib is not None):
        if policy is not Policy.vllm:
            raise UsageError(f"the whole curve follows the vllm policy's block rules: use --policy vllm, or give "
                             f"the {policy} policy's capacities with --sweep-capacity N,N,...")
        curve = True
    _start("curve", **locals())


@handle_errors
def fleet_command(
    ctx: typer.Context, trace: TraceArg,
    as_kind: AsKindOpt = None, log_format: LogFmtOpt = None, hash_block_size: HashBlockSizeOpt = 512, tokenizer: TokOpt = None,
    chat_template: TemplateOpt = None, no_generation_prompt: NoGenerationPromptOpt = False,
    salt_field: SaltFieldOpt = None, tenant_field: TenantFieldOpt = None, no_salt: NoSaltOpt = False,
    time_unit: TimeOpt = None, time_zone: ZoneOpt = None,
    policy: PolicyOpt = Policy.vllm, block_size: BlockOpt = 16, capacity_blocks: CapBlocksOpt = None,
    capacity_gib: CapGibOpt = None, model: ModelOpt = None, dtype: DtypeOpt = Dtype.bf16,
    hash_fn: HashOpt = HashFn.builtin, concurrency: ConcurrencyOpt = 1, decode_ms: DecodeMsOpt = 20.0,
    warmup: WarmupOpt = None,
    replicas: ReplicasOpt = None, router: RouterOpt = None, session_field: SessionFieldOpt = None,
    prefix_blocks: PrefixBlocksOpt = 4, seed: SeedOpt = 0, cache_threshold: CacheThresholdOpt = 0.5,
    balance_abs: BalanceAbsOpt = 32, balance_rel: BalanceRelOpt = 1.1, router_eviction_s: RouterEvictionOpt = 30.0,
    router_tree_tokens: RouterTreeOpt = 10000, jobs: FleetJobsOpt = 1, cpu_offload_gib: CpuGibOpt = None,
    cpu_offload_blocks: CpuBlocksOpt = None, link: LinkOpt = "pcie5-x16",
    ray: RayOpt = False, ray_address: RayAddressOpt = None,
    gpu: GpuOpt = None, gpu_hour_usd: GpuHourOpt = None, utilization: UtilizationOpt = 0.4, batch: BatchOpt = 32,
    plot: PlotOpt = None, fmt: FmtOpt = Format.text,
) -> None:
    """Replicas behind a router, and a CPU tier.

    --replicas N --router R (or all, side by side) routes the trace over N servers of --capacity-blocks
    each; --cpu-offload-blocks (or --cpu-offload-gib with --model) adds a CPU tier to each; --model with
    --gpu prices the hits. TRACE may be a partition directory (see partition), replayed as it was routed,
    in --jobs processes or on Ray (--ray).
    """
    _start("fleet", **locals())


@handle_errors
def partition_command(
    ctx: typer.Context, trace: TraceArg,
    partition_dir: Annotated[str, typer.Option("--partition-dir", metavar="DIR", help="Where to write the partitions "
                                               "and their manifest.json.", rich_help_panel=PARTITIONS)],
    as_kind: AsKindOpt = None, log_format: LogFmtOpt = None, hash_block_size: HashBlockSizeOpt = 512, tokenizer: TokOpt = None,
    chat_template: TemplateOpt = None, no_generation_prompt: NoGenerationPromptOpt = False,
    salt_field: SaltFieldOpt = None, tenant_field: TenantFieldOpt = None, no_salt: NoSaltOpt = False,
    time_unit: TimeOpt = None, time_zone: ZoneOpt = None, block_size: BlockOpt = 16,
    replicas: ReplicasOpt = None, router: RouterOpt = None, session_field: SessionFieldOpt = None,
    prefix_blocks: PrefixBlocksOpt = 4, seed: SeedOpt = 0,
    fmt: FmtOpt = Format.text,
) -> None:
    """Route a trace once into one partition per replica.

    --replicas N --router round-robin|random|session|prefix-hash routes the trace up front and writes one
    Parquet partition per replica, and a manifest.json, to --partition-dir DIR; the fleet command replays
    DIR as it was routed, in --jobs processes or on Ray.
    """
    _start("partition", **locals())


@handle_errors
def plain_command(
    ctx: typer.Context, trace: TraceArg,
    as_kind: AsKindOpt = None, log_format: LogFmtOpt = None, hash_block_size: HashBlockSizeOpt = 512, tokenizer: TokOpt = None,
    chat_template: TemplateOpt = None, no_generation_prompt: NoGenerationPromptOpt = False,
    salt_field: SaltFieldOpt = None, tenant_field: TenantFieldOpt = None, no_salt: NoSaltOpt = False,
    time_unit: TimeOpt = None, time_zone: ZoneOpt = None, read_jobs: ReadJobsOpt = None,
    policy: PolicyOpt = Policy.vllm, block_size: BlockOpt = 16, capacity_blocks: CapBlocksOpt = None,
    capacity_gib: CapGibOpt = None, model: ModelOpt = None, dtype: DtypeOpt = Dtype.bf16,
    hash_fn: HashOpt = HashFn.builtin, chunk_size: ChunkSizeOpt = 256, recompute_ratio: RecomputeOpt = 0.15,
    concurrency: ConcurrencyOpt = 1, decode_ms: DecodeMsOpt = 20.0, warmup: WarmupOpt = None,
    curve: CurveOpt = False, curve_points: CurvePointsOpt = 32, optimal: OptimalOpt = False,
    sweep_capacity: SweepCapacityOpt = None, sweep_block_size: SweepBlockSizeOpt = None,
    replicas: ReplicasOpt = None, router: RouterOpt = None, session_field: SessionFieldOpt = None,
    prefix_blocks: PrefixBlocksOpt = 4, seed: SeedOpt = 0, cache_threshold: CacheThresholdOpt = 0.5,
    balance_abs: BalanceAbsOpt = 32, balance_rel: BalanceRelOpt = 1.1, router_eviction_s: RouterEvictionOpt = 30.0,
    router_tree_tokens: RouterTreeOpt = 10000, jobs: FleetJobsOpt = 1, cpu_offload_gib: CpuGibOpt = None,
    cpu_offload_blocks: CpuBlocksOpt = None, link: LinkOpt = "pcie5-x16",
    partition_dir: PartitionDirOpt = None, ray: RayOpt = False, ray_address: RayAddressOpt = None,
    gpu: GpuOpt = None, gpu_hour_usd: GpuHourOpt = None, utilization: UtilizationOpt = 0.4, batch: BatchOpt = 32,
    per_request: PerRequestOpt = False, plot: PlotOpt = None, fmt: FmtOpt = Format.text,
) -> None:
    _start(None, **locals())


plain_command.__doc__ = PLAIN_HELP


def _start(command: Optional[Command], ctx: typer.Context, trace: str, *,
           as_kind: Optional[InputKind] = None, log_format: Optional[str] = None, hash_block_size: int = 512, tokenizer: Optional[str] = None,
           chat_template: Optional[str] = None, no_generation_prompt: bool = False, salt_field: Optional[str] = None,
           tenant_field: Optional[str] = None, no_salt: bool = False, time_unit: Optional[TimeUnit] = None,
           time_zone: Optional[str] = None,
           read_jobs: Optional[int] = None,
           policy: Policy = Policy.vllm, block_size: int = 16, capacity_blocks: Optional[int] = None,
           capacity_gib: Optional[float] = None, model: Optional[str] = None, dtype: Dtype = Dtype.bf16,
           hash_fn: HashFn = HashFn.builtin, chunk_size: int = 256, recompute_ratio: float = 0.15,
           concurrency: int = 1, decode_ms: float = 20.0, warmup: Optional[str] = None,
           curve: bool = False, curve_points: int = 32, optimal: bool = False, sweep_capacity: Optional[str] = None,
           sweep_block_size: Optional[str] = None,
           replicas: Optional[int] = None, router: Optional[str] = None, session_field: Optional[str] = None,
           prefix_blocks: int = 4, seed: int = 0, cache_threshold: float = 0.5, balance_abs: int = 32,
           balance_rel: float = 1.1, router_eviction_s: float = 30.0, router_tree_tokens: int = 10000,
           jobs: int = 1, cpu_offload_gib: Optional[float] = None, cpu_offload_blocks: Optional[int] = None,
           link: str = "pcie5-x16", partition_dir: Optional[str] = None, ray: bool = False,
           ray_address: Optional[str] = None, gpu: Optional[str] = None, gpu_hour_usd: Optional[float] = None,
           utilization: float = 0.4, batch: int = 32, per_request: bool = False, plot: Optional[str] = None,
           fmt: Format = Format.text) -> None:
    """A run: the options checked, parsed into one :class:`Options` and handed to the mode's function.
    ``command``: the command run; None for the plain spelling, which picks it from the options. The
    defaults are the commands' (a test checks that they agree)."""
    check_plot(plot, run_inputs(trace, log_label="the input trace", tokenizer=tokenizer, chat_template=chat_template,
                                models=(model,)))  # before anything is read
    capacity = KvCapacity(capacity_blocks, capacity_gib, model, dtype.value, block_size)
    warm = _warmup(warmup)
    if chat_template and tokenizer is None:
        raise UsageError("--chat-template needs --tokenizer")
    tok = _ChatAware(tokenizer, not no_generation_prompt, chat_template) if tokenizer is not None else None
    name = "<stdin>" if trace == "-" else trace
    partitions = _partition_input(ctx, trace, name, writes=partition_dir is not None, ray=ray, ray_address=ray_address,
                                  read_options=bool(tokenizer or salt_field or tenant_field or session_field or no_salt
                                                    or as_kind))
    if command is None:
        fleet = (partitions is not None or replicas is not None or router is not None or cpu_offload_gib is not None
                 or cpu_offload_blocks is not None)
        command = _plain_mode(partition_dir=partition_dir, fleet=fleet, plot=plot, per_request=per_request,
                              sweeps=bool(sweep_block_size or sweep_capacity or curve or optimal))
    elif partitions is not None and command != "fleet":
        raise UsageError(f"{name} is a partition directory: cachectl simulate-prefix fleet {name} replays it")
    sizes: list[int] = [block_size]
    caps: list[int] = []
    if command in ("replay", "served", "curve"):
        sizes, caps = _sizes_and_capacities(sweep_block_size, sweep_capacity, block_size, curve=curve,
                                            optimal=optimal, policy=policy.value)
        if len(sizes) > 1 or caps or curve:
            command = "curve"
    if command == "curve" and (gpu is not None or gpu_hour_usd is not None):
        raise UsageError("--gpu/--gpu-hour-usd price one replay or a fleet run: drop --sweep-*/--curve")
    if command == "curve" and per_request:
        raise UsageError("--per-request lists one replay: drop it from sweeps")
    o = Options(
        trace=trace, name=name, tok=tok, salt_field=salt_field, tenant_field=tenant_field, no_salt=no_salt,
        as_kind=as_kind.value if as_kind else None, log_format=log_format_name(log_format),
        add_generation_prompt=not no_generation_prompt,
        hash_block_size=hash_block_size, read_jobs=read_jobs, timestamps=timestamp_reader(time_unit, time_zone),
        policy=policy.value, hash_fn=hash_fn.value, block_size=block_size, capacity=capacity, warm=warm,
        concurrency=concurrency, decode_s=decode_ms / 1000.0, chunk_size=chunk_size, recompute_ratio=recompute_ratio,
        sizes=tuple(sizes), caps=tuple(caps), curve=curve, curve_points=curve_points, optimal=optimal,
        replicas=replicas, router=router, session_field=session_field, seed=seed, prefix_blocks=prefix_blocks,
        cache_threshold=cache_threshold, balance_abs=balance_abs, balance_rel=balance_rel,
        router_eviction_s=router_eviction_s, router_tree_tokens=router_tree_tokens, cpu_offload_gib=cpu_offload_gib,
        cpu_offload_blocks=cpu_offload_blocks, link=link, jobs=jobs, partition_dir=partition_dir,
        partitions=partitions, ray=ray, ray_address=ray_address, model=model, dtype=dtype.value, gpu=gpu,
        gpu_hour_usd=gpu_hour_usd, utilization=utilization, batch=batch, per_request=per_request, plot=plot, fmt=fmt,
        served_only=command == "served")
    _run(_MODES[command] if partitions is None else "replay partitions", o)


#: the mode each command runs (a fleet command given a partition directory replays the partitions)
_MODES: dict[str, Mode] = {"replay": "replay", "served": "replay", "curve": "sweep", "fleet": "fleet",
                           "partition": "write partitions"}


def _plain_mode(*, partition_dir: Optional[str], fleet: bool, sweeps: bool, plot: Optional[str],
                per_request: bool) -> Command:
    """The plain spelling's command, from the options given (the first conflict found is the one reported):
    a replay unless the sweep options make it a curve (decided once the sweeps are read)."""
    sweeps = sweeps or per_request
    if partition_dir is not None:
        if sweeps or plot:
            raise UsageError("--partition-dir writes partitions and replays nothing: drop --sweep-*, --curve, "
                             "--optimal, --per-request and --plot")
        return "partition"
    if fleet:
        if sweeps:
            raise UsageError("--replicas/--router/--cpu-offload-* replay one capacity: drop --sweep-*, --curve, "
                             "--optimal and --per-request")
        return "fleet"
    return "replay"


def _run(mode: Mode, o: Options) -> None:
    match mode:
        case "replay":
            _replay_one(o)
        case "sweep":
            _sweep(o)
        case "fleet":
            _fleet(o)
        case "write partitions":
            _write_partitions(o)
        case "replay partitions":
            _replay_partitions(o)
    timestamp_note(o.timestamps)
    raise typer.Exit(EXIT_OK)


# ---------------------------------------------------------------------------------------- the group

#: the commands in the order help lists them, each with the help panel of its mode, under which
#: ``simulate-prefix --help`` lists it
COMMANDS: dict[str, tuple[str, str]] = {"replay": ("replay_command", CACHE), "served": ("served_command", CACHE),
                                        "curve": ("curve_command", CURVE), "fleet": ("fleet_command", FLEET),
                                        "partition": ("partition_command", PARTITIONS)}

#: ``simulate-prefix --help``: beside the commands, an option to know of the panels no command stands for
#: (each command's --help lists all of its options)
OVERVIEW_OPTIONS = {
    INPUT: ("-t, --tokenizer T", "Text and chat requests, tokenized (token IDs and Mooncake lines need none)."),
    CACHE: ("--capacity-blocks N", "The pool in blocks, or --capacity-gib GIB with --model."),
    FLEET: ("--link LINK", f"CPU-tier transfers over {data_names('links.json', 'links')}."),
    WORTH: ("--gpu GPU", "With --model: what the hits save (replay, served, fleet) on "
                         f"{data_names('gpus.json', 'gpus', only='gpu_flops.json')}."),
    OUTPUT: ("-f, --format", "text or json (every command); --plot FILE.png draws curves and fleets."),
}

#: the plain spelling's command as the group resolves it: no argument can be this name (argv holds no NUL)
PLAIN = "\0plain"


class _PlainContext(typer.Context):
    """The plain spelling's context: its path is its group's, ``cachectl simulate-prefix``, so that its usage
    line and errors name the command as it was typed."""

    @property
    def command_path(self) -> str:
        return self.parent.command_path if self.parent is not None else super().command_path


@functools.cache
def _plain() -> Any:
    cmd = lazy_command("simulate-prefix", __name__, "plain_command")()
    cmd.context_class = _PlainContext
    tidy_help(cmd)
    return cmd


class SimulatePrefixGroup(CachectlGroup):
    """The commands, built on first use, and the plain spelling: arguments whose first is no command's name
    (a trace, an option) go to the command of every option, which picks the mode as it always did."""

    lazy_commands = {name: lazy_command(name, __name__, function) for name, (function, _) in COMMANDS.items()}

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            if not os.path.exists(args[0]) and get_close_matches(args[0], list(self.commands), n=1):
                ctx.fail(f"No such command {args[0]!r}. Did you mean "
                         f"{get_close_matches(args[0], list(self.commands), n=1)[0]!r}?")
            args = [PLAIN, *args]
        return super().parse_args(ctx, args)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        return _plain() if cmd_name == PLAIN else super().get_command(ctx, cmd_name)

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        return ["[COMMAND]", "TRACE", "[OPTIONS]"]

    def format_options(self, ctx: Any, formatter: Any) -> None:
        """The panels of the options, each with the commands of its mode (their summaries) or an option."""
        sections: dict[str, list[tuple[str, str]]] = {"Arguments": [("TRACE", TRACE_HELP)]}
        for panel in (INPUT, CACHE, CURVE, FLEET, PARTITIONS, WORTH, OUTPUT):
            rows = sections.setdefault(panel, [])
            rows += [(name, self.commands[name].get_short_help_str(limit=200))
                     for name, (_, where) in COMMANDS.items() if where == panel]
            if panel in OVERVIEW_OPTIONS:
                rows.append(OVERVIEW_OPTIONS[panel])
        sections["Options"] = [("-h, --help", "Show this message and exit.")]
        write_sections(formatter, sections)


app = typer.Typer(cls=SimulatePrefixGroup, help=HELP, no_args_is_help=True, rich_markup_mode=None,
                  add_completion=False, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})


# ----------------------------------------------------------------------------------------------- modes


def _replay_one(o: Options) -> None:
    """One block size at one capacity: one replay (``--per-request`` lists its requests)."""
    from ..engines.prefix.pools import CapacityError

    bs = o.sizes[0]
    cap = o.capacity.blocks(bs)
    largest = _Largest(_read(o, f"{o.policy} bs={bs}", keyed_at=bs if o.policy in ("vllm", "infinite") else None), bs)
    kept = _Kept(largest)                          # a log with served counts is kept, to replay it again
    try:
        if isinstance(o.warm, float) and o.warm < 1:  # a share: count the requests first (kept in memory once)
            requests = list(kept)
            skip = _resolve_warmup(o.warm, len(requests))
            report = _simulate(o, requests, bs, cap, o.per_request, skip)
        else:
            skip = int(o.warm or 0)
            report = _simulate(o, kept, bs, cap, o.per_request, skip)
    except CapacityError as exc:
        if o.policy != "vllm" or cap is None:
            raise
        largest.drain()                        # read on: the true minimum is the largest request's
        raise UsageError(f"{exc}; the whole trace needs {largest.need:,} blocks of {bs} (its largest request, "
                         f"line {largest.line}): --capacity-blocks {largest.need} or more, or --curve") from None
    if o.served_only and not report.served_requests:
        raise InputError("no request carries the server's cached tokens (vLLM's usage.prompt_tokens_details."
                         "cached_tokens, SGLang's meta_info.cached_tokens): nothing to compare (cachectl "
                         "simulate-prefix replay replays the trace alone)", source=o.name)
    if o.plot:
        raise UsageError("--plot draws sweeps: add --curve, --sweep-capacity and/or --sweep-block-size")
    worth = _worth(o, report)
    served = None
    if report.served_requests:
        from ..engines.prefix.served import compare_served

        served = compare_served(kept.requests, report, settings=_settings(o, bs, cap, skip))
    if o.fmt is Format.json:
        import dataclasses

        out = {**dataclasses.asdict(report), "chat_generation_prompt": o.tok.used if o.tok else None}
        if served is not None:
            verdicts = {r.index: r for r in served.rows}
            for row in out["per_request"]:
                v = verdicts.get(row["index"])
                row.update(agrees=None if v is None else v.agrees, reason=None if v is None else v.reason,
                           confidence=None if v is None else v.confidence)
            out["served"] = {k: v for k, v in dataclasses.asdict(served).items() if k != "rows"}
            out["served"]["disagreements"] = [dataclasses.asdict(r) for r in served.rows if not r.agrees]
        if worth is not None:
            out["worth"] = dataclasses.asdict(worth)
        emit_json(out)
    else:
        _render(report, o.salt_field, o.tenant_field, o.per_request, served)
        if served is not None:
            _render_served(served, o.per_request)
        if worth is not None:
            from .simulate_fleet import render_worth

            render_worth(worth, o.model)
        _generation_note(o.tok)


def _worth(o: Options, report):
    """``--gpu`` on one server: what its hits are worth, end to end (None without --gpu)."""
    from .simulate_fleet import parse_value

    if o.gpu is None:
        parse_value(None, None, o.gpu_hour_usd, o.utilization)   # --gpu-hour-usd alone is refused there
        return None
    if o.model is None:
        raise UsageError("--gpu needs --model: the FLOPs a hit saves come from the model's configuration")
    from ..engines.kv.config import resolve_model
    from ..engines.prefix.value import hits_worth

    config, source, _ = resolve_model(o.model)
    value = parse_value((config, source), o.gpu, o.gpu_hour_usd, o.utilization)
    assert value is not None
    return hits_worth(report.hit_tokens, hit_square_sum=report.hit_square_sum, requests=report.requests,
                      query_tokens=report.query_tokens, query_square_sum=report.query_square_sum,
                      output_tokens=report.output_tokens, batch=o.batch, dtype=o.dtype, hash_fn="sha256", **value)


def _sweep(o: Options) -> None:
    """Several capacities or block sizes (``--sweep-*``), or the whole curve (``--curve``)."""
    from ..engines.prefix.replay import SCHEMA_VERSION

    skip = 0
    if o.policy == "vllm":
        curves, runs = _curves(o)
    else:
        curves = []
        runs, skip = _token_level_sweep(o)
    result = {"schema_version": SCHEMA_VERSION, "policy": o.policy, "mode": "curve" if o.curve else "sweep",
              "chat_generation_prompt": o.tok.used if o.tok else None, "curves": curves, "sweep": runs}
    if o.plot:
        _plot(runs, o.plot, o.policy, curves)
    if o.fmt is Format.json:
        emit_json(result)
    else:
        _render_sweep(runs, o.policy, curves, "curve" if o.curve else "sweep")
        if not curves and skip:
            stdout.print(f"note: the first {skip} requests warmed the cache and are not counted", markup=False)
        _generation_note(o.tok)


def _curves(o: Options) -> tuple[list, list[dict]]:
    """The vllm policy: the trace read and keyed once, then each capacity of each block size from the keys."""
    from ..engines.prefix import curve as prefix_curve

    keyed = prefix_curve.key_trace(_read(o, "reading and keying", keyed_at=o.sizes[0] if len(o.sizes) == 1 else None),
                                   list(o.sizes), hash_fn=o.hash_fn, source=o.name)
    curves = []
    for bs in o.sizes:
        points: list[int] | None = None
        if not o.curve:
            one = o.capacity.blocks(bs)
            if not o.caps and one is None:
                raise UsageError("the vllm policy needs --capacity-blocks, --sweep-capacity or --curve")
            points = [*o.caps] if o.caps else [one] if one is not None else []
        with Progress(f"replaying (blocks of {bs})") as progress:
            curves.append(prefix_curve.capacity_curve(keyed[bs], points, points=o.curve_points, warmup=o.warm,
                                                      concurrency=o.concurrency, decode_s_per_token=o.decode_s,
                                                      optimal=o.optimal, source=o.name, progress=progress.advance))
    if not any(p.fits for c in curves for p in c.points):
        c = curves[0]
        raise UsageError(f"no capacity holds the largest request ({o.name}:{c.min_capacity_line}, "
                         f"{c.min_capacity_blocks} blocks of {c.block_size}): the minimum that works is "
                         f"{c.min_capacity_blocks} blocks")
    runs = [{"block_size": c.block_size, "capacity_blocks": p.capacity_blocks,
             "capacity_tokens": p.capacity_tokens, "fits": p.fits, "requests": c.counted_requests,
             "query_tokens": c.query_tokens, "hit_tokens": p.hit_tokens, "hit_rate": p.hit_rate,
             "evicted_blocks": p.evicted_blocks, "optimal_hit_tokens": p.optimal_hit_tokens,
             "optimal_hit_rate": p.optimal_hit_rate} for c in curves for p in c.points]
    return curves, runs


def _token_level_sweep(o: Options) -> tuple[list[dict], int]:
    """The token-level policies: the requests kept in memory and replayed per point; the runs and the warm-up."""
    requests = list(_read(o, "reading"))
    skip = _resolve_warmup(o.warm, len(requests))
    runs = []
    for bs in o.sizes:
        for cap in ([*o.caps] if o.caps else [o.capacity.blocks(bs)]):
            r = _simulate(o, requests, bs, cap, False, skip)
            runs.append({"block_size": bs, "capacity_blocks": cap,
                         "capacity_tokens": None if cap is None else cap * bs, "fits": True,
                         "requests": r.requests, "query_tokens": r.query_tokens, "hit_tokens": r.hit_tokens,
                         "hit_rate": r.hit_rate, "evicted_blocks": r.evicted_blocks})
    return runs, skip


def _fleet(o: Options) -> None:
    """Replicas behind a router (``--replicas``, ``--router``), with a CPU tier (``--cpu-offload-*``)."""
    fields = _session_fields(o)
    _run_fleet(o, _read(o, "reading", fields), fields)
    _generation_note(o.tok)


def _replay_partitions(o: Options) -> None:
    """A partition directory as TRACE: each partition replayed on its replica, as it was routed."""
    _run_fleet(o, (), _session_fields(o), o.partitions)


def _write_partitions(o: Options) -> None:
    """``--partition-dir``: route the trace once and write one partition per replica."""
    from .simulate_fleet import write_partitions

    assert o.partition_dir is not None
    fields = _session_fields(o)
    with _parquet_rows(o.trace, o.name):
        write_partitions(read=_read(o, "routing", fields if o.router == "session" else ()), name=o.name,
                         directory=o.partition_dir, replicas=o.replicas, router=o.router, block_size=o.block_size,
                         hash_block_size=o.hash_block_size, seed=o.seed, prefix_blocks=o.prefix_blocks,
                         session_fields=fields, fmt=o.fmt)


def _run_fleet(o: Options, requests: Iterable, fields: tuple,
               partitions: Optional[tuple[list[str], dict]] = None) -> None:
    from ..engines.prefix.fleet import CacheAwareParams
    from .simulate_fleet import parse_value, run_fleet

    model_config, bytes_per_token, gpu_capacity = None, o.capacity.bytes_per_token, o.capacity.blocks(o.block_size)
    if o.model is not None:
        from ..engines.kv.config import kv_shape, resolve_model

        config, msource, _ = resolve_model(o.model)
        model_config = (config, msource)
        bytes_per_token = kv_shape(config, o.dtype, msource).bytes_per_token
    value = parse_value(model_config, o.gpu, o.gpu_hour_usd, o.utilization)
    if value is not None:
        value.update(batch=o.batch, dtype=o.dtype, hash_fn="sha256")
    params = CacheAwareParams(cache_threshold=o.cache_threshold, balance_abs_threshold=o.balance_abs,
                              balance_rel_threshold=o.balance_rel, eviction_interval_s=o.router_eviction_s,
                              max_tree_tokens=o.router_tree_tokens)
    with _parquet_rows(o.trace, o.name):
        run_fleet(read=requests, name=o.name, replicas=o.replicas, router=o.router, block_size=o.block_size,
                  capacity_blocks=gpu_capacity, policy=o.policy, hash_fn=o.hash_fn, concurrency=o.concurrency,
                  decode_s=o.decode_s, warm=o.warm, seed=o.seed, prefix_blocks=o.prefix_blocks, params=params,
                  cpu_offload_gib=o.cpu_offload_gib, cpu_offload_blocks=o.cpu_offload_blocks,
                  bytes_per_token=bytes_per_token, link=o.link, jobs=o.jobs, value=value, plot=o.plot, fmt=o.fmt,
                  session_fields=fields, partitions=partitions, ray=o.ray, ray_address=o.ray_address)


# ------------------------------------------------------------------------------------- the trace, read


def _read(o: Options, label: str, session_fields: tuple = (), keyed_at: Optional[int] = None) -> Iterator:
    """The trace's requests, streamed (one read). ``keyed_at``: the replay only needs block keys at this
    block size, so a large token trace may be read and keyed by forked processes (the same requests)."""
    from ..engines.prefix import read as prefix_read
    from ..engines.prefix.trace import iter_trace, trace_records
    from ..inputs import parquet
    from ..inputs.formats import shape_of

    trace_opts: dict[str, Any] = {
        "salt_field": o.salt_field, "tenant_field": o.tenant_field, "hash_block_size": o.hash_block_size,
        "no_salt": o.no_salt, "as_kind": o.as_kind, "add_generation_prompt": o.add_generation_prompt,
        "session_fields": session_fields, "timestamps": o.timestamps}
    columnar = parquet.is_parquet(o.trace)
    requests: Any
    jobs = o.read_jobs or prefix_read.default_jobs()
    if keyed_at is not None and o.tok is None and not columnar and prefix_read.can_read_in_parallel(o.trace, jobs) \
            and (o.log_format or shape_of(o.trace)) == "native":  # cachectl's own lines, read in chunks
        from ..inputs.files import JsonlChunks

        requests = prefix_read.KeyedTrace(JsonlChunks(o.trace), block_size=keyed_at, hash_fn=o.hash_fn, jobs=jobs,
                                          **trace_opts)
        requests.start()  # fork before the progress bar's thread starts
    else:
        if columnar:  # the same rows as JSONL lines would give, read a batch at a time
            records = parquet.parquet_records(o.trace, parquet.trace_columns(o.salt_field, o.tenant_field,
                                                                             *session_fields))
        else:
            records = trace_records(o.trace, o.log_format)
        requests = iter_trace(records, source=o.name, tokenizer=o.tok, **trace_opts)
        if columnar:
            requests = parquet.located_rows(requests, o.name)
    try:
        with Progress(label) as progress:
            for r in requests:
                progress.advance()
                yield r
    finally:
        if hasattr(requests, "close"):
            requests.close()


def _simulate(o: Options, requests: Iterable, bs: int, cap: Optional[int], keep_rows: bool, skip: int):
    """One replay of ``requests`` through the pool the options describe, at block size ``bs``."""
    from ..engines.prefix.replay import simulate

    return simulate(requests, policy=o.policy, block_size=bs, capacity_blocks=cap, hash_fn=o.hash_fn,
                    concurrency=o.concurrency, decode_s_per_token=o.decode_s, chunk_size=o.chunk_size,
                    recompute_ratio=o.recompute_ratio, per_request=keep_rows, source=o.name, warmup=skip)


def _settings(o: Options, bs: int, cap: Optional[int], skip: int) -> dict[str, Any]:
    """The keyword arguments of :func:`_simulate`'s replay, for replays of the same log under other set-ups."""
    return {"policy": o.policy, "block_size": bs, "capacity_blocks": cap, "hash_fn": o.hash_fn,
            "concurrency": o.concurrency, "decode_s_per_token": o.decode_s, "chunk_size": o.chunk_size,
            "recompute_ratio": o.recompute_ratio, "source": o.name, "warmup": skip}


class _Kept:
    """Requests passed through; kept (``requests``) when the first carries a served count, since the
    comparison with the server replays the log under other set-ups (None otherwise: the trace streams)."""

    def __init__(self, requests):
        self._it = iter(requests)
        self.requests: Optional[list] = None
        self._first = True

    def __iter__(self):
        return self

    def __next__(self):
        r = next(self._it)
        if self._first:
            self._first = False
            if r.served_cached_tokens is not None:
                self.requests = []
        if self.requests is not None:
            self.requests.append(r)
        return r


def _session_fields(o: Options) -> tuple:
    from ..engines.prefix.fleet import SESSION_FIELDS

    return (o.session_field,) if o.session_field else SESSION_FIELDS


# --------------------------------------------------------------------------------------------- checks


def _partition_input(ctx: typer.Context, trace: str, name: str, *, writes: bool, read_options: bool, ray: bool,
                     ray_address: Optional[str]) -> Optional[tuple[list[str], dict]]:
    """TRACE as a partition directory: its partition files and manifest, the options it refuses checked;
    None for any other trace (``--ray`` refused)."""
    from ..inputs import parquet as parquet_io

    if trace != "-" and os.path.isdir(trace) and not parquet_io.is_partition_dir(trace):
        raise InputError(f"no {parquet_io.MANIFEST}: not a partition directory (write one with --partition-dir)",
                         source=name)
    if not parquet_io.is_partition_dir(trace):
        if ray or ray_address:
            raise UsageError("--ray replays trace partitions: write them first with --partition-dir DIR (and "
                             "--replicas, --router), then give DIR as the trace")
        return None
    if writes:
        raise UsageError(f"{name} holds partitions already: --partition-dir takes a trace")
    if read_options:
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
    return list(parquet_io.partition_paths(trace, manifest)), manifest


def _sizes_and_capacities(sweep_block_size: Optional[str], sweep_capacity: Optional[str], block_size: int, *,
                          curve: bool, optimal: bool, policy: str) -> tuple[list[int], list[int]]:
    """One server's run (no fleet): the block sizes and capacities it replays, its flags checked."""
    from ..engines.prefix.replay import MAX_BLOCK_SIZE, MAX_CAPACITY_BLOCKS

    sizes = _ints(sweep_block_size, "--sweep-block-size", MAX_BLOCK_SIZE) or [block_size]
    caps = _ints(sweep_capacity, "--sweep-capacity", MAX_CAPACITY_BLOCKS)
    if curve and caps:
        raise UsageError("--curve picks the capacities itself: drop --sweep-capacity (or --curve)")
    if (curve or optimal) and policy != "vllm":
        raise UsageError("--curve and --optimal follow the vllm policy's block rules: use --policy vllm")
    if optimal and not (curve or caps):
        raise UsageError("--optimal draws the bound beside a curve: add --curve or --sweep-capacity")
    return sizes, caps


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



def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _render(r, salt_field: Optional[str] = None, tenant_field: Optional[str] = None, rows: bool = True,
            served=None) -> None:
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
    if r.per_request is not None and rows:
        verdicts = {} if served is None else {v.index: v for v in served.rows}
        t = Table(header_style="bold", box=None, pad_edge=False)
        cols = ["#", "line", "prompt tokens", "hit tokens"] + (["served", "agrees", "reason"] if verdicts else [])
        for col in cols:
            t.add_column(col, justify="left" if col == "reason" else "right")
        for q in r.per_request:
            row = [str(q.index), str(q.line), f"{q.prompt_tokens:,}", f"{q.hit_tokens:,.0f}"]
            if verdicts:
                v = verdicts.get(q.index)
                row += ["" if v is None else f"{v.served_cached_tokens:,}", "" if v is None else
                        ("yes" if v.agrees else "no"), "" if v is None or v.reason is None else _reason_label(v)]
            t.add_row(*row)
        stdout.print(t)
    if r.unsalted_requests:
        stdout.print(f"note: {r.unsalted_requests:,} of {r.requests:,} requests have no '{salt_field}': cached "
                     "unsalted, shareable by every tenant", soft_wrap=True, markup=False)
    if tenant_field and r.requests_without_tenant:
        whole = " (so no tenant table)" if r.requests_without_tenant == r.requests else ""
        stdout.print(f"note: --tenant-field '{tenant_field}' is absent on {r.requests_without_tenant:,} of "
                     f"{r.requests:,} requests{whole}", soft_wrap=True, markup=False)
    for note in r.notes:
        print_note(note)


def _reason_label(v) -> str:
    from ..engines.prefix.served import REASONS

    return f"{REASONS[v.reason]} ({v.confidence})"


#: disagreeing requests listed without --per-request
SERVED_ROWS_SHOWN = 8


def _render_served(s, all_rows: bool) -> None:
    """Predicted beside served: the agreement, the reasons with their evidence, the first disagreements."""
    from rich.table import Table

    without = f" (not on {s.requests_without_served:,})" if s.requests_without_served else ""
    stdout.print(f"predicted vs served: {s.requests:,} requests carry the server's cached tokens{without}; "
                 f"{s.agree:,} agree ({_pct(s.agreement_rate)}), {s.disagree:,} do not ({s.served_below:,} served "
                 f"less, {s.served_above:,} more); predicted {s.predicted_hit_tokens:,.0f} hit tokens, served "
                 f"{s.served_hit_tokens:,}", soft_wrap=True, markup=False)
    for c in s.reasons:
        sure = ", ".join(f"{n:,} {k}" for k, n in c.by_confidence.items()) if len(c.by_confidence) > 1 else c.confidence
        stdout.print(f"  {c.label}: {c.requests:,} requests ({sure}): {c.evidence}", soft_wrap=True, markup=False)
    wrong = [r for r in s.rows if not r.agrees]
    if wrong and not all_rows:
        t = Table(header_style="bold", box=None, pad_edge=False)
        for col in ("line", "prompt tokens", "predicted", "served", "reason"):
            t.add_column(col, justify="left" if col == "reason" else "right")
        for r in wrong[:SERVED_ROWS_SHOWN]:
            t.add_row(str(r.line), f"{r.prompt_tokens:,}", f"{r.predicted_hit_tokens:,.0f}",
                      f"{r.served_cached_tokens:,}", _reason_label(r))
        stdout.print(t)
        if len(wrong) > SERVED_ROWS_SHOWN:
            stdout.print(f"... {len(wrong) - SERVED_ROWS_SHOWN:,} more disagreements (--per-request lists every "
                         "request)", markup=False)
    for note in s.notes:
        print_note(note)


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
        print_note(note)


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
