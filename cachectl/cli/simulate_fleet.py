"""The fleet path of ``cachectl simulate-prefix``: replicas behind a router, a CPU offload tier, what hits are
worth. Called by :mod:`cachectl.cli.simulate_prefix` when ``--replicas``, ``--router`` or ``--cpu-offload-*``
is given."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from ..datafiles import load_data
from ..errors import UsageError
from .common import Format, emit_json, new_figure, print_note, save_figure, stdout


def links() -> dict:
    return load_data("links.json")


def write_partitions(*, read, name: str, directory: str, replicas: Optional[int], router: Optional[str],
                     block_size: int, hash_block_size: int, seed: int, prefix_blocks: int, session_fields: tuple,
                     fmt: Format) -> None:
    """Route the trace once, as it streams, and write one Parquet partition per replica (and a manifest)."""
    from ..engines.prefix.fleet import RING_VNODES, STATELESS_ROUTERS, stateless_router
    from ..inputs.parquet import PartitionWriter

    if router is None or replicas is None:
        raise UsageError("--partition-dir routes the trace up front: give --replicas N and --router "
                         f"{'|'.join(STATELESS_ROUTERS)}")
    if router == "all":
        raise UsageError("--partition-dir routes up front with one router: --router all includes cache-aware and "
                         f"least-loaded, which decide from the state their earlier choices left; choose one of "
                         f"{'|'.join(STATELESS_ROUTERS)}")
    if router not in STATELESS_ROUTERS:
        raise UsageError(f"--partition-dir routes up front, which only {', '.join(STATELESS_ROUTERS)} can: "
                         f"{router} decides from the state its earlier choices left (loads, trees), so it "
                         "stays single-process (run it without --partition-dir)")
    pick = stateless_router(router, replicas=replicas, block_size=block_size, seed=seed, prefix_blocks=prefix_blocks,
                            source=name, session_fields=session_fields)
    n = 0
    with PartitionWriter(directory, replicas) as writer:  # an error or an interrupt leaves no partition behind
        for req in read:
            writer.add(pick(req), req)
            n += 1
        doc = writer.close({"source": name, "router": router, "replicas": replicas, "requests": n,
                            "block_size": block_size, "hash_block_size": hash_block_size,
                            "router_params": {"seed": seed, "prefix_blocks": prefix_blocks,
                                              "ring_vnodes": RING_VNODES, "session_fields": list(session_fields)}})
    if fmt is Format.json:
        emit_json({"schema_version": 1, "mode": "partition", "directory": directory, **doc})
        return
    stdout.print(f"{n:,} requests of {name} routed by {router} over {replicas} replicas into {directory}:",
                 soft_wrap=True, markup=False)
    for p in doc["partitions"]:
        stdout.print(f"  {p['file']}  {p['requests']:,} requests  {p['prompt_tokens']:,} prompt tokens",
                     soft_wrap=True, markup=False)
    stdout.print(f"replay: cachectl simulate-prefix {directory} --capacity-blocks N [--jobs N] [--ray]",
                 soft_wrap=True, markup=False)


def run_fleet(*, read, name: str, replicas: Optional[int], router: Optional[str], block_size: int,
              capacity_blocks: Optional[int], policy: str, hash_fn: str, concurrency: int, decode_s: float,
              warm, seed: int, prefix_blocks: int, params, cpu_offload_gib: Optional[float],
              cpu_offload_blocks: Optional[int], bytes_per_token: Optional[float], link: str, jobs: int,
              value: Optional[dict], plot: Optional[str], fmt: Format, session_fields: tuple = (),
              partitions: Optional[tuple[list[str], dict]] = None, ray: bool = False,
              ray_address: Optional[str] = None) -> None:
    from ..engines.prefix import curve as prefix_curve
    from ..engines.prefix.fleet import ROUTERS, SESSION_FIELDS, simulate_fleet, simulate_partitions

    routers = list(ROUTERS) if router == "all" else [router or "round-robin"]
    if routers[0] not in ROUTERS:
        raise UsageError(f"--router must be one of {', '.join(ROUTERS)} or all, got {router!r}")
    if partitions is not None and (router is not None or replicas is not None):
        raise UsageError("a partition directory was routed when it was written (its manifest says how): drop "
                         "--router and --replicas")
    if jobs < 1:
        raise UsageError("--jobs must be at least 1")
    if cpu_offload_gib is not None and cpu_offload_blocks is not None:
        raise UsageError("give --cpu-offload-gib or --cpu-offload-blocks, not both")
    if not 0.0 <= params.cache_threshold <= 1.0:
        raise UsageError(f"--cache-threshold must be between 0 and 1, got {params.cache_threshold}")
    if params.balance_rel_threshold < 0:
        raise UsageError(f"--balance-rel-threshold must not be negative, got {params.balance_rel_threshold}")
    if cpu_offload_gib is not None:
        if not cpu_offload_gib > 0:
            raise UsageError(f"--cpu-offload-gib must be positive, got {cpu_offload_gib}")
        if bytes_per_token is None:
            raise UsageError("--cpu-offload-gib needs --model (KV bytes per token)")
        from ..engines.kv.config import blocks_for_memory

        cpu_offload_blocks = blocks_for_memory(cpu_offload_gib, bytes_per_token, block_size)
        if cpu_offload_blocks < 1:
            raise UsageError(f"--cpu-offload-gib {cpu_offload_gib} holds less than one block")
    table = links()["links"]
    if link not in table:
        raise UsageError(f"--link must be one of {', '.join(table)}, got {link!r}")
    link_gbps = table[link]["gbps"]
    if partitions is not None:
        paths, manifest = partitions
        report = simulate_partitions(paths, manifest, policy=policy, block_size=block_size,
                                     capacity_blocks=capacity_blocks, hash_fn=hash_fn, concurrency=concurrency,
                                     decode_s_per_token=decode_s, cpu_offload_blocks=cpu_offload_blocks,
                                     bytes_per_token=bytes_per_token, link_gbps=link_gbps,
                                     warmup=prefix_curve.resolve_warmup(warm, manifest["requests"]), jobs=jobs,
                                     ray=ray, ray_address=ray_address, source=name)
        _finish(report, link, link_gbps, value, plot, fmt, table)
        return
    requests = list(read)
    skip = prefix_curve.resolve_warmup(warm, len(requests))
    notes = []
    if router == "all" and any(r.session is None for r in requests):
        routers.remove("session")
        notes.append(f"session left out: not every request has a session field ({', '.join(session_fields)}; "
                     "--session-field F names another)")
    report = simulate_fleet(requests, replicas=replicas or 1, routers=routers, policy=policy, block_size=block_size,
                            capacity_blocks=capacity_blocks, hash_fn=hash_fn, concurrency=concurrency,
                            decode_s_per_token=decode_s, seed=seed, prefix_blocks=prefix_blocks, params=params,
                            cpu_offload_blocks=cpu_offload_blocks, bytes_per_token=bytes_per_token,
                            link_gbps=link_gbps, warmup=skip, jobs=jobs, source=name, notes=notes,
                            session_fields=session_fields or SESSION_FIELDS)
    _finish(report, link, link_gbps, value, plot, fmt, table)


def _finish(report, link: str, link_gbps: float, value: Optional[dict], plot: Optional[str], fmt: Format,
            table: dict) -> None:
    worth = None
    if value is not None:
        from ..engines.prefix.value import hits_worth

        worth = {r.router: dataclasses.asdict(hits_worth(r.hit_tokens, hit_square_sum=r.hit_square_sum,
                                                         requests=r.requests, query_tokens=r.query_tokens,
                                                         query_square_sum=r.query_square_sum,
                                                         output_tokens=r.output_tokens, **value))
                 for r in report.results}
    if plot:
        _plot(report, plot)
    if fmt is Format.json:
        out = dataclasses.asdict(report)
        out["link"] = {"name": link, **table[link]}
        if worth is not None:
            for r in out["results"]:
                r["worth"] = worth[r["router"]]
        emit_json(out)
        return
    _render(report, link, link_gbps, worth)


def render_worth(w, model: Optional[str]) -> None:
    """What one server's hits are worth (``HitsWorth`` with its serving figures), each figure with what it
    assumes."""
    t = w.serving
    stdout.print(f"worth on {w.gpu} ({model}, {t.dtype}), {t.requests:,} requests at a batch of {t.batch}:",
                 soft_wrap=True, markup=False)
    lines = [
        f"prefill     {t.prompt_tokens:,.0f} prompt tokens: {t.prefill_s_without_hits:,.2f} GPU-s without hits; "
        f"the {w.hit_tokens:,.0f} hit tokens save {t.prefill_s_saved:,.2f} ({_pct(t.prefill_share_saved)})",
        f"decode      {t.output_tokens:,} output tokens: {t.decode_s:,.2f} GPU-s ({t.decode_step_s * 1e3:,.2f} ms a "
        "step), the same with or without hits",
        f"end to end  {t.end_to_end_s_without_hits:,.2f} GPU-s without hits, {t.end_to_end_s_with_hits:,.2f} with: "
        f"the hits save {_pct(t.share_saved)} of it",
        f"TTFT        {_ms(t.ttft_s_saved)} saved per request on average, of {_ms(t.ttft_s_without_hits)} without hits",
        f"throughput  {_x(t.throughput_gain)}x: {_rps(t.throughput_rps_without_hits)} -> "
        f"{_rps(t.throughput_rps_with_hits)} requests per GPU-second at a batch of {t.batch}",
        f"hashing     {t.hashed_tokens:,.0f} prompt tokens keyed at {t.hash_ns_per_token:g} ns each: "
        f"{t.hash_cpu_s:,.3f} CPU-s, {_pct(t.hash_share_of_prefill)} of the prefill time; with no reuse it is all "
        "cost",
    ]
    if w.usd is not None:
        lines.append(f"dollars     {w.usd:,.4f} USD saved at {w.gpu_hour_usd:g} USD per GPU-hour")
    for line in lines:
        stdout.print(f"  {line}", soft_wrap=True, markup=False)
    render_assumptions(w)


def render_assumptions(w) -> None:
    for a in w.serving.assumptions:
        stdout.print(f"assumes: {a}", soft_wrap=True, markup=False)
    stdout.print(f"GPU data: {w.flops_source}; bandwidth: {w.serving.bandwidth_source}", soft_wrap=True,
                 markup=False)


def _ms(s: Optional[float]) -> str:
    return "n/a" if s is None else f"{s * 1e3:,.1f} ms"


def _rps(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:,.2f}"


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _x(x) -> str:
    return "n/a" if x is None else f"{x:.2f}"


def _render(report, link: str, link_gbps: float, worth: Optional[dict]) -> None:
    from rich.table import Table

    cap = "unbounded" if report.capacity_blocks is None else f"{report.capacity_blocks:,} blocks"
    cpu = report.cpu_offload_blocks
    stdout.print(f"{report.replicas} replicas, {report.policy}, block size {report.block_size}, GPU capacity {cap} "
                 f"each" + (f", CPU tier {cpu:,} blocks each" if cpu else ""), soft_wrap=True, markup=False)
    t = Table(header_style="bold", box=None, pad_edge=False)
    cols = ["router", "requests", "hit rate", "hit tokens"]
    cols += ["GPU hits", "CPU hits"] if cpu else []
    cols += ["requests max/mean", "tokens max/mean", "requests per replica"]
    cols += ["GPU-s saved", "USD saved"] if worth else []
    for c in cols:
        t.add_column(c, justify="left" if c in ("router", "requests per replica") else "right")
    for r in report.results:
        row = [r.router, f"{r.requests:,}", _pct(r.hit_rate), f"{r.hit_tokens:,}"]
        row += [f"{r.gpu_hit_tokens:,}", f"{r.cpu_hit_tokens:,}"] if cpu else []
        row += [_x(r.request_imbalance), _x(r.token_imbalance), " ".join(str(s.requests) for s in r.replicas)]
        if worth:
            w = worth[r.router]
            row += [f"{w['gpu_seconds_at_utilization']:,.1f}",
                    "" if w["usd"] is None else f"{w['usd']:,.4f}"]
        t.add_row(*row)
    stdout.print(t)
    _render_tenants(report)
    for r in report.results:
        if r.decisions:
            d = r.decisions
            stdout.print(f"{r.router}: {d['prefix_match']:,} by prefix match, {d['smallest_tree']:,} to the smallest "
                         f"tree, {d['load_balance']:,} by load (imbalanced)", soft_wrap=True, markup=False)
        if r.cpu_read_bytes is not None:
            stdout.print(f"{r.router}: CPU tier read back {_gb(r.cpu_read_bytes)} ({r.cpu_read_s:,.3f} s at "
                         f"{link_gbps} GB/s, {link}), wrote {_gb(r.cpu_write_bytes)} ({r.cpu_write_s:,.3f} s)",
                         soft_wrap=True, markup=False)
    if worth:
        w = next(iter(worth.values()))
        stdout.print(f"worth: {w['flops_per_token']:,.3g} prefill FLOPs per token (2 x {w['active_params']:,} "
                     f"parameters) plus attention; {w['gpu']} at {w['peak_tflops']:,} TFLOPS peak, "
                     f"{w['utilization']:.0%} utilization", soft_wrap=True, markup=False)
        for router, w in worth.items():
            t = w["serving"]
            stdout.print(f"{router}: the hits save {_pct(t['share_saved'])} of {t['end_to_end_s_without_hits']:,.2f} "
                         f"GPU-s end to end (prefill {_pct(t['prefill_share_saved'])}), {_ms(t['ttft_s_saved'])} of "
                         f"TTFT per request, throughput {_x(t['throughput_gain'])}x at a batch of {t['batch']}",
                         soft_wrap=True, markup=False)
        first = next(iter(worth.values()))
        for a in first["serving"]["assumptions"]:
            stdout.print(f"assumes: {a}", soft_wrap=True, markup=False)
        stdout.print(f"GPU data: {first['flops_source']}; bandwidth: {first['serving']['bandwidth_source']}",
                     soft_wrap=True, markup=False)
    for note in report.notes:
        print_note(note)


def _render_tenants(report) -> None:
    """One row per tenant, the hit rate under each router side by side (tenants: --tenant-field, else salts)."""
    from rich.table import Table

    results = [r for r in report.results if r.per_tenant]
    if not results:
        return
    t = Table(header_style="bold", box=None, pad_edge=False)
    for c in ["tenant", "requests", "prompt tokens", *(f"{r.router} hit rate" for r in results)]:
        t.add_column(c, justify="left" if c == "tenant" else "right")
    rates = [{s.tenant: s.hit_rate for s in r.per_tenant} for r in results]
    for s in results[0].per_tenant:
        t.add_row(str(s.tenant), f"{s.requests:,}", f"{s.query_tokens:,}", *(_pct(m.get(s.tenant)) for m in rates))
    stdout.print(t)
    stdout.print("cross-tenant shared blocks: " + ", ".join(f"{r.router} {r.cross_tenant_shared_blocks:,}"
                                                            for r in results), soft_wrap=True, markup=False)


def _gb(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"


def _plot(report, path: str) -> None:
    fig, ax = new_figure(f"cachectl simulate-prefix: {report.replicas} replicas",
                         "router (above each bar: its busiest replica's requests / the mean)", "prefix-cache hit rate (%)")
    names = [r.router for r in report.results]
    gpu = [r.gpu_hit_tokens / r.query_tokens * 100 if r.query_tokens else 0 for r in report.results]
    cpu = [r.cpu_hit_tokens / r.query_tokens * 100 if r.query_tokens else 0 for r in report.results]
    ax.bar(names, gpu, label="GPU hits")
    if any(cpu):
        ax.bar(names, cpu, bottom=gpu, label="CPU-tier hits")
    for i, r in enumerate(report.results):
        # the number alone: a sentence per bar is wider than the bar and runs into its neighbours
        ax.text(i, (gpu[i] + cpu[i]) + 0.5, f"{_x(r.request_imbalance)}x", ha="center", fontsize=8)
    ax.tick_params(axis="x", labelrotation=20)
    save_figure(fig, path)


def parse_value(model_config: Optional[tuple], gpu: Optional[str], gpu_hour_usd: Optional[float],
                utilization: float) -> Optional[dict[str, Any]]:
    """The inputs of ``hits_worth`` from --model/--gpu/--gpu-hour-usd/--utilization (None without --gpu)."""
    if gpu is None:
        if gpu_hour_usd is not None:
            raise UsageError("--gpu-hour-usd needs --gpu (and --model)")
        return None
    if model_config is None:
        raise UsageError("--gpu needs --model: the FLOPs a hit saves come from the model's configuration")
    if not 0 < utilization <= 1:
        raise UsageError("--utilization must be in (0, 1]")
    config, source = model_config
    return {"config": config, "model_source": source, "gpu": gpu, "gpu_hour_usd": gpu_hour_usd,
            "utilization": utilization}
