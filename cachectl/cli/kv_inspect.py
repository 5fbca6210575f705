"""``cachectl kv-inspect``: what a model's KV cache holds and costs (config arithmetic, offline, instant)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..errors import UsageError
from .common import (
    EXIT_FINDING,
    EXIT_OK,
    CacheKind,
    Dtype,
    Format,
    FormatOpt,
    Nbits,
    Quantizer,
    TokenizerOpt,
    data_names,
    emit_json,
    handle_errors,
    plural,
    print_note,
    shown_name,
    stdout,
)

HELP = """What a model's KV cache holds and costs. From its configuration: offline, instant.

MODEL is a model directory or config.json, a .gguf file (its metadata), a Hugging Face id already in the
local cache, or a catalog name (--list-models). Reports bytes per token per layer type (GQA, MLA,
sliding windows, layers without KV), memory per context and batch, how many sequences fit in a GPU's
memory after the weights, the vLLM block count, and a decode lower bound from the GPU's bandwidth.
"""


def _contexts(text: str) -> list[int]:
    out = []
    for part in text.replace(" ", "").split(","):
        if not part:
            continue
        mult = 1
        if part[-1].lower() == "k":
            part, mult = part[:-1], 1024
        try:
            value = float(part) * mult
            whole = int(value)
        except (ValueError, OverflowError):
            raise UsageError(f"--context-lengths expects comma-separated token counts (4096,32k,128k), got {text!r}") from None
        if whole != value:  # (4096.9 was taken as 4,096 and 0.5 said "got 0")
            raise UsageError(f"--context-lengths expects whole token counts, got {part}{'k' if mult > 1 else ''} "
                             f"({value:g} tokens)")
        out.append(whole)
    if not out:
        raise UsageError("--context-lengths needs at least one token count")
    return out


@handle_errors
def command(
    model: Annotated[Optional[str], typer.Argument(metavar="MODEL", help="Model dir, config.json, .gguf, cached HF id or catalog name.",
                                                   show_default=False)] = None,
    dtype: Annotated[Optional[Dtype], typer.Option("--dtype", case_sensitive=False, show_default=False,
                                                   help="KV cache dtype (default: bf16; with --run, the dtype the "
                                                        "run measured).")] = None,
    context: Annotated[str, typer.Option("--context-lengths", "--context", metavar="N,N,...",
                                         help="Context lengths in tokens (k = 1024). --context is the older name "
                                              "(diff-tokens' --context is tokens shown around a divergence).")
                       ] = "4096,32768,131072",
    batch: Annotated[int, typer.Option("--batch", min=1, max=10**6, metavar="N",
                                       help="Sequences decoded together.")] = 1,
    gpu_memory: Annotated[Optional[str], typer.Option("--gpu-memory", metavar="SIZE",
                                                      help="GPU memory, e.g. 80GiB (default: the --gpu's).")] = None,
    gpu: Annotated[Optional[str], typer.Option("--gpu", metavar="NAME",
                                               help=f"A GPU from the table: {data_names('gpus.json', 'gpus')}.")] = None,
    gpu_memory_utilization: Annotated[float, typer.Option("--gpu-memory-utilization", metavar="SHARE",
                                                          help="Share of GPU memory vLLM may use.")] = 0.9,
    weights_gib: Annotated[Optional[float], typer.Option("--weights-gib", metavar="GIB", help="Weights size, when the estimate "
                                                                               "from the config does not fit.")] = None,
    block_size: Annotated[int, typer.Option("--block-size", min=1, max=1 << 20, metavar="N",
                                            help="KV-cache block size in tokens (vLLM: 16).")] = 16,
    run: Annotated[bool, typer.Option("--run", help="Load the model with transformers, prefill a DynamicCache, decode "
                                                    "greedily, and measure the cache against the prediction.")] = False,
    prompt: Annotated[Optional[str], typer.Option("--prompt", metavar="TEXT", help="With --run: the prompt text.")] = None,
    messages: Annotated[Optional[str], typer.Option("--messages", metavar="FILE",
                                                    help="With --run: a chat (rendered with the chat template).")] = None,
    tokenizer: TokenizerOpt = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", min=1, metavar="N", help="With --run: tokens to decode.")] = 20,
    random_weights: Annotated[bool, typer.Option("--random-weights", help="With --run: random weights built from the "
                                                                          "config (no weights needed).")] = False,
    threads: Annotated[Optional[int], typer.Option("--threads", min=1, max=1024, metavar="N",
                                                   help="With --run: torch CPU threads.")] = None,
    turns: Annotated[Optional[str], typer.Option("--turns", metavar="FILE",
                                                 help="Keep one cache across the turns of a conversation, verify it "
                                                      "is a token prefix of each new prompt, crop where it is not.")] = None,
    shared_prefix: Annotated[Optional[str], typer.Option("--shared-prefix", metavar="TEXT",
                                                         help="Prefill TEXT once and copy the cache per question.")] = None,
    questions: Annotated[Optional[str], typer.Option("--questions", metavar="FILE",
                                                     help="With --shared-prefix: one question per line.")] = None,
    cache_kind: Annotated[CacheKind, typer.Option("--cache", case_sensitive=False,
                                                  help="With --shared-prefix: the cache class.")] = CacheKind.dynamic,
    quantized: Annotated[Optional[Quantizer], typer.Option("--quantized", case_sensitive=False,
                                                           help="Compare a quantized cache with full precision: "
                                                                "memory and the first token where greedy output "
                                                                "diverges (quanto: the quanto extra; hqq: the hqq "
                                                                "extra).")] = None,
    nbits: Annotated[Nbits, typer.Option("--nbits", help="With --quantized: bits per value (quanto: 2 or 4; hqq: 1, "
                                                         "2, 3, 4 or 8).")] = Nbits.b4,
    list_models: Annotated[bool, typer.Option("--list-models", help="Show the model catalog and the GPU table.")] = False,
    fmt: FormatOpt = Format.text,
) -> None:
    from ..engines.kv import config as kvmath

    if list_models:
        _render_catalog(kvmath, fmt)
        raise typer.Exit(EXIT_OK)
    if model is None:
        raise UsageError("kv-inspect needs MODEL (or --list-models)")
    report = _report(Options(
        model=model, dtype=dtype.value if dtype else None, context=context, batch=batch, gpu=gpu,
        gpu_memory=gpu_memory, gpu_memory_utilization=gpu_memory_utilization, weights_gib=weights_gib,
        block_size=block_size, run=run, prompt=prompt, messages=messages, tokenizer=tokenizer,
        max_new_tokens=max_new_tokens, random_weights=random_weights, threads=threads, turns=turns,
        shared_prefix=shared_prefix, questions=questions, cache_kind=cache_kind.value,
        quantized=quantized.value if quantized else None, nbits=int(nbits.value)))
    if fmt is Format.json:
        emit_json(report)
    else:
        _render(report, kvmath.human_bytes)
        _render_live_extras(report)
    raise typer.Exit(EXIT_FINDING if report.findings else EXIT_OK)


command.__doc__ = HELP


@dataclass(frozen=True)
class Options:
    """What one ``kv-inspect MODEL`` was asked: the config arithmetic, and the live runs on top of it."""

    model: str
    dtype: Optional[str]           # None: bf16, or the dtype a live run measured
    context: str                   # --context-lengths, parsed with the arithmetic
    batch: int
    gpu: Optional[str]
    gpu_memory: Optional[str]
    gpu_memory_utilization: float
    weights_gib: Optional[float]
    block_size: int
    # live runs (transformers)
    run: bool
    prompt: Optional[str]
    messages: Optional[str]
    tokenizer: Optional[str]
    max_new_tokens: int
    random_weights: bool
    threads: Optional[int]
    turns: Optional[str]
    shared_prefix: Optional[str]
    questions: Optional[str]
    cache_kind: str
    quantized: Optional[str]       # the quantizer
    nbits: int

    @property
    def live(self) -> bool:
        """A mode that loads the model (--run, --quantized, --turns, --shared-prefix)."""
        return bool(self.run or self.quantized or self.turns is not None or self.shared_prefix is not None)


def _report(o: Options):
    """The config arithmetic, then what each live mode asked for adds to it."""
    from ..engines.kv import config as kvmath

    model = kvmath.resolve_model(o.model)
    # random weights are built in fp32: a live run's header says so unless --dtype asks otherwise
    report = _static(o, model, o.dtype or ("fp32" if o.random_weights and o.live else "bf16"))
    if o.random_weights and o.live:
        from ..engines.kv import live as kvlive

        kvlive.check_random_weights_memory(model[0], (model[2] or {}).get("params"))
    if o.run or o.quantized:
        report = _with_runs(o, model, report)
    if o.turns is not None or o.shared_prefix is not None:
        report = _with_reuse(o, model, report)
    elif not (o.run or o.quantized) and (o.prompt or o.messages or o.random_weights):
        raise UsageError("--prompt, --messages and --random-weights go with --run, --turns or --shared-prefix")
    return report


def _static(o: Options, model: tuple, dtype: str):
    """The config arithmetic (``model``: what ``resolve_model`` found), KV and weights in ``dtype``."""
    from ..engines.kv import config as kvmath

    config, source, entry = model
    return kvmath.inspect_config(
        config, model=o.model, source=source, dtype=dtype, weights_dtype=dtype, contexts=_contexts(o.context),
        batch=o.batch, gpu=o.gpu, gpu_memory=kvmath.parse_memory(o.gpu_memory) if o.gpu_memory else None,
        gpu_memory_utilization=o.gpu_memory_utilization, block_size=o.block_size,
        weights_bytes=o.weights_gib * kvmath.GIB if o.weights_gib is not None else None,
        published_params=(entry or {}).get("params"), active_params=(entry or {}).get("active_params"))


def _with_runs(o: Options, model: tuple, report):
    """--run (a prefill and greedy decode, the cache measured) and --quantized (a quantized cache beside it)."""
    import dataclasses

    from ..engines.kv import config as kvmath
    from ..engines.kv import live as kvlive

    config = model[0]
    ids = _prompt_ids(o.model, o.tokenizer, o.prompt, o.messages)
    if o.run:
        live = kvlive.run_live(o.model, config, ids, max_new_tokens=o.max_new_tokens, random_weights=o.random_weights,
                               threads=o.threads)
        if o.dtype is None and live.dtype != report.dtype and live.dtype in kvmath.DTYPE_BYTES:
            report = _static(o, model, live.dtype)  # the dtype the run measured, not bf16 over fp32
        note = kvlive.cache_note(config)
        report = dataclasses.replace(report, run=live, notes=(*report.notes, note) if note else report.notes)
    if o.quantized:
        report = dataclasses.replace(report, quantized=kvlive.run_quantized(
            o.model, config, ids, backend=o.quantized, nbits=o.nbits, max_new_tokens=o.max_new_tokens,
            random_weights=o.random_weights, threads=o.threads))
    return report


def _with_reuse(o: Options, model: tuple, report):
    """--turns (one cache kept across a conversation) and --shared-prefix (one prefill copied per question)."""
    import dataclasses

    from ..engines.kv import live as kvlive
    from ..tokenization import load_tokenizer

    config = model[0]
    tok = load_tokenizer(_tokenizer_spec(o.model, o.tokenizer, "--turns and --shared-prefix"))
    if o.turns is not None:
        from ..inputs import read_prompt

        report = dataclasses.replace(report, turns=kvlive.run_turns(
            o.model, config, tok, read_prompt(o.turns), random_weights=o.random_weights, threads=o.threads))
    if o.shared_prefix is not None:
        if o.questions is None:
            raise UsageError("--shared-prefix needs --questions FILE")
        from ..inputs import read_text

        text, _ = read_text(o.questions)
        qs = [q for q in text.splitlines() if q.strip()]
        report = dataclasses.replace(report, shared_prefix=kvlive.run_shared_prefix(
            o.model, config, tok, o.shared_prefix, qs, cache_kind=o.cache_kind, max_new_tokens=min(o.max_new_tokens, 8),
            random_weights=o.random_weights, threads=o.threads))
    return report


def _tokenizer_spec(model: str, tokenizer: Optional[str], what: str) -> str:
    """--tokenizer, else the model directory when it holds a tokenizer; else say to pass --tokenizer."""
    if tokenizer:
        return tokenizer
    path = Path(model).expanduser()
    if path.is_dir() and any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json",
                                                            "tokenizer.model")):
        return model
    where = f"{model} has no tokenizer files" if path.is_dir() else "the model is not a directory with a tokenizer"
    raise UsageError(f"{what} need --tokenizer DIR ({where})")


def _prompt_ids(model: str, tokenizer: Optional[str], prompt: Optional[str], messages: Optional[str]) -> list[int]:
    from ..inputs import PromptInput, read_prompt
    from ..tokenization import load_tokenizer

    if (prompt is None) == (messages is None):
        raise UsageError("--run and --quantized need --prompt TEXT or --messages FILE")
    tok = load_tokenizer(_tokenizer_spec(model, tokenizer, "--run and --quantized"))
    p = read_prompt(messages) if messages else PromptInput(kind="text", source="--prompt", text=prompt,
                                                           field_paths=("text",))
    return list(tok.tokenize(p, add_generation_prompt=p.is_chat).ids)



def _render(r, hb) -> None:
    from rich.table import Table

    shape = (f"MLA latent {r.mla_dim}" if r.mla_dim else f"{r.kv_heads} KV heads x head_dim {r.head_dim}"
             if r.kv_heads is not None and r.head_dim is not None else "KV heads and head dims per layer type")
    from rich.markup import escape

    stdout.print(f"[bold]{escape(r.model)}[/]: {r.layers} layers, {shape}, {r.dtype}: "
                 f"{r.bytes_per_token:,.0f} bytes per token ({hb(r.bytes_per_token)})", soft_wrap=True)
    stdout.print(f"from: {shown_name(r.source)}", markup=False, soft_wrap=True)
    from ..engines.kv.config import describe_defaults

    for line in describe_defaults(r.defaults_used, r.source):
        stdout.print(line, markup=False, soft_wrap=True)
    t = Table(header_style="bold", box=None, pad_edge=False)
    for col in ("layer type", "layers", "KV heads", "head dim", "window", "bytes/token"):
        t.add_column(col, justify="left" if col == "layer type" else "right")
    for g in r.layer_types:
        dims = "" if g.head_dim is None else (f"{g.head_dim}" if g.value_dim in (None, g.head_dim)
                                              else f"{g.head_dim} K / {g.value_dim} V")
        t.add_row(g.type, str(g.layers), "" if g.kv_heads is None else str(g.kv_heads), dims,
                  "" if g.window is None else f"{g.window:,}", f"{g.bytes_per_token:,.0f}")
    stdout.print(t)
    t = Table(header_style="bold", box=None, pad_edge=False)
    cols = ["context", "per sequence", f"batch of {r.batch}"]
    if r.kv_budget_bytes is not None:
        cols.append("sequences that fit")
    if any(c.decode_ms_per_token is not None for c in r.contexts):
        cols.append("decode >= ms/token")
    for col in cols:
        t.add_column(col, justify="right")
    for c in r.contexts:
        row = [f"{c.tokens:,}", hb(c.bytes), hb(c.batch_bytes)]
        if r.kv_budget_bytes is not None:
            row.append(f"{c.max_sequences:,}" if c.max_sequences is not None else "-")
        if "decode >= ms/token" in cols:
            row.append("-" if c.decode_ms_per_token is None else f"{c.decode_ms_per_token:.2f}")
        t.add_row(*row)
    stdout.print(t)
    if r.weights_bytes is not None:
        stdout.print(f"weights {hb(r.weights_bytes)} ({r.weights_source})", soft_wrap=True)
    if r.kv_budget_bytes is not None:
        where = f"{r.gpu} " if r.gpu else ""
        stdout.print(f"{where}KV budget {hb(r.kv_budget_bytes)} = {hb(r.gpu_memory_bytes)} x "
                     f"{r.gpu_memory_utilization:g} - weights: {r.vllm_blocks:,} vLLM blocks of {r.block_size} tokens"
                     if r.vllm_blocks is not None else f"{where}KV budget {hb(r.kv_budget_bytes)}", soft_wrap=True)
    for finding in r.findings:
        stdout.print(f"finding: {finding}", markup=False, soft_wrap=True)
    for note in r.notes:
        print_note(note)
    if r.run is not None:
        q = r.run
        verdict = "[green]agree[/]" if q.agree else "[red]DISAGREE[/]"
        stdout.print(f"[bold]run[/] ({q.weights} weights, {q.dtype}): {q.prompt_tokens} prompt + {q.generated_tokens} "
                     f"generated tokens -> get_seq_length() = {q.seq_length}, expected {q.expected_seq_length} (the last "
                     "token's K/V is computed only when it is fed back)", soft_wrap=True)
        stdout.print(f"measured {q.measured_bytes:,} bytes vs predicted {q.predicted_bytes:,.0f}: {verdict}; "
                     f"prefill {q.prefill_tokens_per_s:,.0f} tokens/s"
                     + (f", decode {q.decode_ms_per_token:.2f} ms/token" if q.decode_ms_per_token else ""),
                     soft_wrap=True)
        if q.layers:
            first = q.layers[0]
            stdout.print(f"layer 0 keys {first.keys_shape} values {first.values_shape} {first.dtype}; "
                         f"{len(q.layers)} layers with K/V", soft_wrap=True, markup=False)


def _render_live_extras(r) -> None:
    from rich.table import Table

    if r.turns is not None:
        t = Table(title="cache kept across turns", header_style="bold", box=None, pad_edge=False)
        for col in ("turn", "input", "cached", "common", "mismatch at", "prefilled kept", "rebuilt", "ms kept",
                    "ms rebuilt", "same next token"):
            t.add_column(col, justify="right")
        for q in r.turns.turns:
            t.add_row(str(q.turn), f"{q.input_tokens:,}", f"{q.cached_tokens:,}", f"{q.common_prefix:,}",
                      "" if q.mismatch_index is None else f"{q.mismatch_index:,}", f"{q.prefilled_kept:,}",
                      f"{q.prefilled_rebuilt:,}", f"{q.ms_kept:.1f}", f"{q.ms_rebuilt:.1f}",
                      "yes" if q.same_next_token else "NO")
        stdout.print(t)
        m = r.turns
        # both times, not their difference: a cache slower on a tiny model reads as "(-1.7 ms saved)" otherwise
        kept, rebuilt = sum(q.ms_kept for q in m.turns), sum(q.ms_rebuilt for q in m.turns)
        stdout.print(f"prefilled {m.prefilled_kept:,} tokens in {kept:,.1f} ms with the cache kept vs "
                     f"{m.prefilled_rebuilt:,} in {rebuilt:,.1f} ms rebuilt; {plural(m.mismatches, 'turn')} where the cache was not a token prefix "
                     "of the new prompt and was cropped to the common prefix", soft_wrap=True)
        for q in m.turns:
            if q.stale_max_logit_diff is not None:
                stdout.print(f"turn {q.turn}: trusting the stale cache would move the logits by up to "
                             f"{q.stale_max_logit_diff:.3g} (transformers does not check)", soft_wrap=True)
    if r.quantized is not None:
        q = r.quantized
        where = "identical for all" if q.first_divergence is None else f"diverges at generated token {q.first_divergence} of"
        stdout.print(f"[bold]quantized[/] {q.backend} {q.nbits}-bit cache: {q.quantized_bytes:,} bytes vs {q.full_bytes:,} "
                     f"full precision ({q.ratio:.1%}) at {q.seq_length} tokens (up to {q.residual_length} recent tokens stay full "
                     f"precision); greedy output {where} {q.generated_tokens} tokens", soft_wrap=True)
    if r.shared_prefix is not None:
        s = r.shared_prefix
        t = Table(title=f"shared prefix ({plural(s.prefix_tokens, 'token')}, {s.cache} cache, prefilled once in "
                        f"{s.prefix_ms:.1f} ms)", header_style="bold", box=None, pad_edge=False)
        for col in ("question", "input", "reused", "seam re-tokenized", "same output", "ms shared", "ms fresh"):
            t.add_column(col, justify="right")
        for q in s.questions:
            # a question by its line in --questions (from 1)
            t.add_row(str(q.index + 1), f"{q.input_tokens:,}", f"{q.reused_tokens:,}", "yes" if q.boundary_merge else "",
                      "yes" if q.same_output else "NO", f"{q.ms_shared:.1f}", f"{q.ms_fresh:.1f}")
        stdout.print(t)
        shared, fresh = s.prefix_ms + sum(q.ms_shared for q in s.questions), sum(q.ms_fresh for q in s.questions)
        stdout.print(f"{shared:,.1f} ms in all with the prefix shared, its prefill included, vs {fresh:,.1f} ms "
                     "fresh", soft_wrap=True)


def _render_catalog(kvmath, fmt: Format) -> None:
    models, gpus = kvmath.catalog(), kvmath.gpu_table()
    if fmt is Format.json:
        emit_json({"schema_version": kvmath.SCHEMA_VERSION, "models": models, "gpus": gpus})
        return
    from rich.table import Table

    t = Table(title="models", header_style="bold", box=None, pad_edge=False)
    for col in ("name", "hugging face id", "bf16 bytes/token", "as of"):
        t.add_column(col)
    for name, m in models.items():
        t.add_row(name, m.get("hf_id", ""), f"{kvmath.kv_shape(m['config']).bytes_per_token:,.0f}", m["as_of"])
    stdout.print(t)
    t = Table(title=f"GPUs ({gpus['source']})", header_style="bold", box=None, pad_edge=False)
    for col in ("name", "datasheet GB", "driver GiB", "bandwidth GB/s"):
        t.add_column(col)
    for name, g in gpus["gpus"].items():
        t.add_row(name, str(g["memory_gb"]), f"{g['memory_mib'] / 1024:.2f}", f"{g['bandwidth_gbps']:,}")
    stdout.print(t)
