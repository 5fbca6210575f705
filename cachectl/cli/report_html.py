"""The HTML page of ``cachectl report --html``: one self-contained file (inline CSS, inline SVG, no script, no
network). Every string that comes from the log goes through :func:`escape` (:func:`html.escape` of its control
characters and bidirectional overrides written visibly, as the text output writes them: a NUL is a parse error in
HTML, and a U+202E turned a conversation's name around); numbers are formatted here."""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape as _html_escape

from ..engines.causes import cause_label
from ..engines.prefix.forks import Fork, TreeNode
from ..engines.repair.report import BeforeAfter, CurveSection, LogReport, PairView
from ..engines.repair.sections import CostSection
from ..errors import plural, printable
from .common import flags_for_params
from .forks_view import where


def escape(text: str, quote: bool = True) -> str:
    return _html_escape(printable(text), quote)


CSS = """
:root { --ink:#1d2330; --muted:#5d6677; --line:#e3e6ec; --bg:#f6f7f9; --card:#fff; --accent:#2f6fde;
        --bad:#c8372d; --badbg:#fdecea; --good:#1d7f4e; --goodbg:#e6f4ec; --same:#eef0f4; }
* { box-sizing: border-box; }
body { margin:0; font:15px/1.5 -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, sans-serif;
       color:var(--ink); background:var(--bg); }
main { max-width:1120px; margin:0 auto; padding:28px 28px 48px; }
h1 { font-size:26px; margin:0 0 4px; }
h2 { font-size:19px; margin:36px 0 10px; padding-bottom:6px; border-bottom:1px solid var(--line); }
h3 { font-size:15px; margin:0; }
.sub { color:var(--muted); margin:0 0 20px; }
.cards { display:grid; grid-template-columns:repeat(3, 1fr); gap:12px; }
.cards.c4 { grid-template-columns:repeat(4, 1fr); }
.card { background:var(--card); border:1px solid var(--line); border-radius:10px; padding:14px 16px; }
.card .v { font-size:24px; font-weight:650; letter-spacing:-0.02em; }
.card .k { color:var(--muted); font-size:13px; }
.card.bad .v { color:var(--bad); }
.card.good .v { color:var(--good); }
table { border-collapse:collapse; width:100%; background:var(--card); border:1px solid var(--line);
        border-radius:10px; overflow:hidden; }
th, td { text-align:left; padding:8px 12px; border-bottom:1px solid var(--line); vertical-align:middle; }
th { font-size:12px; text-transform:uppercase; letter-spacing:0.04em; color:var(--muted); background:#fafbfc; }
td.n, th.n { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
tr:last-child td { border-bottom:0; }
.bar { height:10px; background:var(--bad); border-radius:5px; min-width:2px; }
.barcell { width:28%; }
code, .tok { font-family:ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; font-size:12.5px; }
.conv { background:var(--card); border:1px solid var(--line); border-radius:10px; padding:14px 16px;
        margin:0 0 14px; }
.conv .meta { color:var(--muted); font-size:13px; margin:2px 0 10px; }
.pill.safe { background:var(--goodbg); color:var(--good); }
.pill.unsafe { background:#fff4e0; color:#9a5b00; }
.mini { display:inline-block; width:90px; height:8px; background:var(--same); border-radius:4px; margin-left:8px;
        vertical-align:middle; overflow:hidden; }
.mini > span { display:block; height:100%; background:var(--accent); }
td.best { font-weight:650; color:var(--good); }
.ex code { background:var(--same); padding:1px 4px; border-radius:3px; word-break:break-all; }
.pill { display:inline-block; background:var(--badbg); color:var(--bad); border-radius:999px; padding:1px 9px;
        font-size:12px; margin-right:4px; }
.sides { display:grid; grid-template-columns:1fr 1fr; gap:12px; }
.side { border:1px solid var(--line); border-radius:8px; padding:8px 10px; min-width:0; }
.side .hd { font-size:12px; color:var(--muted); margin-bottom:6px; }
.toks { line-height:1.9; word-break:break-all; }
.tok { display:inline; padding:1px 2px; margin:0 1px 0 0; border-radius:3px; background:var(--same);
       white-space:pre-wrap; }
.tok.d.a { background:var(--badbg); color:var(--bad); outline:1px solid #f2c5c0; }
.tok.d.b { background:var(--goodbg); color:var(--good); outline:1px solid #bfe3cd; }
.tok.first { outline-width:2px; font-weight:700; }
.why { margin-top:8px; font-size:13px; }
.note { color:var(--muted); font-size:13px; margin:6px 0; }
.chart { background:var(--card); border:1px solid var(--line); border-radius:10px; padding:10px; }
.chart svg { display:block; width:100%; height:auto; }
.legend { font-size:13px; color:var(--muted); margin:8px 4px 0; }
.swatch { display:inline-block; width:18px; height:3px; vertical-align:middle; margin:0 6px 0 12px; }
footer { color:var(--muted); font-size:12px; margin-top:40px; }
"""


def _n(x: int | float) -> str:
    return f"{x:,.0f}"


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def _usd(x: float | None) -> str:
    if x is None:
        return "n/a"
    return f"${x:,.4f}" if abs(x) < 1 else f"${x:,.2f}"


def _tokens_html(tokens: tuple[str, ...], start: int, first: int | None, side: str) -> str:
    out = []
    for i, t in enumerate(tokens):
        idx = start + i
        cls = "tok"
        if first is not None and idx >= first:
            cls += f" d {side}" + (" first" if idx == first else "")
        text = escape(t.replace("␣", " ")).replace("↵", "↵\n")
        out.append(f'<span class="{cls}" title="token {idx}">{text}</span>')
    return "".join(out)


def _pair_html(p: PairView) -> str:
    first = p.first_diff_index
    head_a = f"line {p.line_a} &middot; {_n(p.tokens_a)} tokens" + (f" &middot; {escape(p.where_a)}" if p.where_a else "")
    head_b = f"line {p.line_b} &middot; {_n(p.tokens_b)} tokens" + (f" &middot; {escape(p.where_b)}" if p.where_b else "")
    why = escape(p.cause_message) if p.cause_message else "no rule explains this divergence"
    return f"""<div class="sides">
  <div class="side"><div class="hd">previous request: {head_a}</div>
    <div class="toks">{"&hellip;" if p.start_a else ""}{_tokens_html(p.window_a, p.start_a, first, "a")}</div></div>
  <div class="side"><div class="hd">next request: {head_b}</div>
    <div class="toks">{"&hellip;" if p.start_b else ""}{_tokens_html(p.window_b, p.start_b, first, "b")}</div></div>
</div>
<div class="why"><b>First difference at token {_n(first or 0)}</b> ({_n(p.common_prefix_tokens)} tokens shared,
{_n(p.tokens_lost)} of the previous request's tokens not reused): {why}</div>"""


def _nice_ticks(lo: float, hi: float) -> list[float]:
    """Round values between lo and hi for a log axis: 1, 2, 5 per decade (1 to 9 when the range is short)."""
    ticks = []
    steps = (1, 2, 5) if hi / lo > 30 else (1, 2, 3, 4, 5, 6, 7, 8, 9)
    e = math.floor(math.log10(max(lo, 1)))
    while 10 ** e <= hi * 1.0001:
        for m in steps:
            v = m * 10 ** e
            if lo <= v <= hi:
                ticks.append(float(v))
        e += 1
    return ticks


def _short(v: float) -> str:
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if v >= div:
            s = f"{v / div:.1f}".rstrip("0").rstrip(".")
            return s + unit
    return f"{v:.0f}"


def curve_svg(c: CurveSection, width: int = 1000, height: int = 340) -> str:
    """The hit-rate-vs-capacity curve as an inline SVG (log x axis)."""
    left, right, top, bottom = 64, 24, 18, 48
    pw, ph = width - left - right, height - top - bottom
    xs = [p[0] for p in c.points]
    lo, hi = min(xs), max(max(xs), c.ceiling_capacity_tokens)
    if hi <= lo:
        hi = lo * 2
    llo, lhi = math.log10(lo), math.log10(hi)

    def x(v: float) -> float:
        return left + (math.log10(v) - llo) / (lhi - llo) * pw

    def y(r: float) -> float:
        return top + (1 - r) * ph

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="vLLM prefix-cache hit rate against cache capacity">']
    for k in range(0, 11, 2):
        r = k / 10
        parts.append(f'<line x1="{left}" y1="{y(r):.1f}" x2="{left + pw}" y2="{y(r):.1f}" stroke="#e3e6ec"/>')
        parts.append(f'<text x="{left - 8}" y="{y(r) + 4:.1f}" font-size="12" text-anchor="end" fill="#5d6677">'
                     f'{k * 10}%</text>')
    for t in _nice_ticks(lo, hi):
        parts.append(f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{top + ph}" stroke="#f0f2f5"/>')
        parts.append(f'<text x="{x(t):.1f}" y="{top + ph + 18}" font-size="12" text-anchor="middle" '
                     f'fill="#5d6677">{_short(t)}</text>')
    parts.append(f'<text x="{left + pw / 2}" y="{height - 6}" font-size="13" text-anchor="middle" fill="#1d2330">'
                 f'cache capacity (tokens, log scale; blocks of {c.block_size})</text>')
    parts.append(f'<text x="14" y="{top + ph / 2}" font-size="13" text-anchor="middle" fill="#1d2330" '
                 f'transform="rotate(-90 14 {top + ph / 2})">prefix hit rate</text>')
    if c.ceiling_hit_rate is not None:
        parts.append(f'<line x1="{left}" y1="{y(c.ceiling_hit_rate):.1f}" x2="{left + pw}" '
                     f'y2="{y(c.ceiling_hit_rate):.1f}" stroke="#1d7f4e" stroke-dasharray="6 5" stroke-width="1.5"/>')
    path = " ".join(f"{'M' if i == 0 else 'L'}{x(cap):.1f},{y(r):.1f}" for i, (cap, r) in enumerate(c.points))
    parts.append(f'<path d="{path}" fill="none" stroke="#2f6fde" stroke-width="2.5"/>')
    for cap, r in c.points:
        parts.append(f'<circle cx="{x(cap):.1f}" cy="{y(r):.1f}" r="3.5" fill="#2f6fde">'
                     f'<title>{_n(cap)} tokens: {_pct(r)}</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def prefix_tree_svg(nodes: Sequence[TreeNode], forks: Sequence[Fork], label: str, width: int = 1000,
                    height: int = 220) -> str:
    """The shared-prefix tree as an icicle (inline SVG): left to right the tokens, top to bottom the requests;
    each branch a bar as long as the tokens it shares and as tall as its requests; a red mark where a fork with a
    fix splits; single-request branches bundled in grey."""
    left, right, top, bottom = 12, 12, 8, 30
    pw, ph = width - left - right, height - top - bottom
    span = max((n.end for n in nodes), default=1) or 1
    roots = [k for k, n in enumerate(nodes) if n.parent < 0]
    total = sum(nodes[k].requests for k in roots) or 1
    kids: dict[int, list[int]] = {}
    for k, n in enumerate(nodes):
        kids.setdefault(n.parent, []).append(k)
    place: dict[int, tuple[float, float]] = {}   # node -> (y, height)

    def lay(parent: int, y0: float, h: float, count: int) -> None:
        y = y0
        for k in kids.get(parent, []):
            hh = h * nodes[k].requests / max(count, 1)
            place[k] = (y, hh)
            y += hh
            lay(k, place[k][0], hh, nodes[k].requests)

    lay(-1, top, ph, total)

    def x(tok: float) -> float:
        return left + tok / span * pw

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="{escape(label)}">']
    for k, n in enumerate(nodes):
        y, h = place.get(k, (0.0, 0.0))
        x0, x1 = x(n.start), x(max(n.end, n.start + span / 400))
        fill = "#c9ced8" if n.alone else "#2f6fde"
        f = forks[n.fork] if n.fork is not None and n.fork < len(forks) else None
        what = (f"{n.alone:,} request(s), each on its own branch" if n.alone else f"{n.requests:,} requests share "
                f"tokens {n.start:,} to {n.end:,}")
        if f is not None:
            what += f"; they split at {where(f)}: {f.cause} ({plural(f.distinct_values, 'value')})"
        parts.append(f'<rect x="{x0:.1f}" y="{y + 0.5:.1f}" width="{max(x1 - x0, 1):.1f}" height="{max(h - 1, 0.5):.1f}" '
                     f'fill="{fill}" fill-opacity="{0.55 if n.alone else 0.8}" rx="2"><title>{escape(what)}</title>'
                     "</rect>")
        if h >= 14 and x1 - x0 >= 90:
            if n.alone:  # at the bar's end: a fork's label sits at its start
                parts.append(f'<text x="{x1 - 5:.1f}" y="{y + h / 2 + 4:.1f}" font-size="12" fill="#5d6677" '
                             f'text-anchor="end">{n.alone:,} alone</text>')
            else:
                parts.append(f'<text x="{x0 + 5:.1f}" y="{y + h / 2 + 4:.1f}" font-size="12" fill="#fff">'
                             f"{n.requests:,} req, {n.end - n.start:,} tok</text>")
        if f is not None and f.fixable:
            parts.append(f'<line x1="{x1:.1f}" y1="{y:.1f}" x2="{x1:.1f}" y2="{y + h:.1f}" stroke="#c8372d" '
                         f'stroke-width="3"><title>{escape(f.fixable + " " + f.cause)}</title></line>')
            parts.append(f'<text x="{x1 + 4:.1f}" y="{y + 13:.1f}" font-size="12" fill="#c8372d">'
                         f"{escape(f.fixable)} {escape(f.cause)}</text>")
    # a fork in the first block splits at the root, which has no bar: its mark is the left edge
    drawn = {n.fork for n in nodes}
    first = min((nodes[k].end for k in roots), default=0)
    for k, f in enumerate(forks):
        if k not in drawn and f.fixable and f.shared_tokens < first:
            parts.append(f'<line x1="{left:.1f}" y1="{top:.1f}" x2="{left:.1f}" y2="{top + ph:.1f}" stroke="#c8372d" '
                         f'stroke-width="3"><title>{escape(f.fixable + " " + f.cause)}</title></line>')
            parts.append(f'<text x="{left + 4:.1f}" y="{top + ph - 4:.1f}" font-size="12" fill="#c8372d">'
                         f"{escape(f.fixable)} {escape(f.cause)}</text>")
    step = next(m * 10 ** e for e in range(12) for m in (1, 2, 5) if m * 10 ** e >= span / 6)
    for k in range(1, int(span // step) + 1):
        parts.append(f'<text x="{x(k * step):.1f}" y="{height - 10}" font-size="12" text-anchor="middle" '
                     f'fill="#5d6677">{_short(k * step)}</text>')
    parts.append(f'<text x="{left}" y="{height - 10}" font-size="12" fill="#5d6677">token 0</text>')
    parts.append("</svg>")
    return "".join(parts)


def _shared_html(r: LogReport) -> str:
    sp = r.shared_prefix
    assert sp is not None
    out = ["<h2>Shared prefix across requests</h2>",
           f'<p class="note">Every request of the log in one prefix tree (blocks of {sp.block_size}), whatever its '
           "conversation: where requests that share a prefix split, why, and the tokens a replay with the diverging "
           f"line moved after the shared part recovers. With the {_n(sp.fixable_forks)} fork(s) that have a fix "
           f"fixed, the vLLM cache with no eviction hits {_n(sp.fixed_hit_tokens)} tokens instead of "
           f"{_n(sp.hit_tokens)}; beyond the within-conversation loss they cost {_n(sp.tokens_lost)} tokens"
           + (f" ({_usd(sp.usd_lost)})" if sp.usd_lost is not None else "") + ".</p>"]
    if sp.tree:
        out.append(f'<div class="chart">{prefix_tree_svg(sp.tree, r.forks, "the shared-prefix tree as logged")}'
                   '<div class="legend">as logged: each bar a prefix that many requests share (its length in tokens, '
                   "its height in requests); grey: requests on a branch of their own; red: a fork with a fix</div>"
                   "</div>")
    if sp.fixed_tree and sp.fixed_tree != sp.tree:
        out.append(f'<p></p><div class="chart">{prefix_tree_svg(sp.fixed_tree, (), "the shared-prefix tree with the forks fixed")}'
                   '<div class="legend">with every fork that has a fix fixed (the counterfactual replay)</div></div>')
    if r.forks:
        out.append('<p></p><table><tr><th>where the branches split</th><th>cause</th><th class="n">values</th>'
                   '<th class="n">requests</th><th class="n">tokens lost</th><th>fix</th></tr>')
        for f in r.forks[:10]:
            ex = "".join(f"<br><code>{escape(e)}</code>" for e in f.examples[:2])
            by = f" (predicted by <code>{escape(f.predicted_by)}</code>)" if f.predicted_by else ""
            out.append(f"<tr><td><code>{escape(where(f))}</code>{ex}</td>"
                       f"<td>{escape(f.cause)}{by}</td><td class=\"n\">{_n(f.distinct_values)}</td>"
                       f'<td class="n">{_n(f.requests)}</td><td class="n">{_n(f.tokens_lost)}</td>'
                       f"<td>{escape(f.fixable or '-')}</td></tr>")
        out.append("</table>")
        out.append('<p class="note">A fork\'s tokens lost: what keeping that one fork costs once every other fork with a '
                   "fix is fixed (two forks in one block each count the whole), so they may add up to more than the "
                   "total.</p>")
    return "\n".join(out)


def render(r: LogReport, version: str) -> str:
    """The whole page."""
    title = f"cachectl report: {r.source}"
    lost = r.tokens_lost if r.shared_prefix is None else r.total_tokens_lost
    usd = r.usd_lost if r.shared_prefix is None else r.total_usd_lost
    cards = [
        ("", f"{_n(r.requests)}", f"requests in {_n(r.conversations)} conversation(s)"),
        ("good" if (r.reuse_ratio or 0) >= 0.9 else "bad", _pct(r.reuse_ratio),
         f"of reusable prefix tokens reused ({_n(r.reused_tokens)} of {_n(r.reusable_tokens)})"),
        ("bad" if lost else "good", _n(lost), "prefix tokens recomputed that a cache could have served"
         + ("" if r.shared_prefix is None else f" ({_n(r.tokens_lost)} within conversations, "
            f"{_n(r.shared_prefix.tokens_lost)} more across requests)")),
    ]
    if usd is not None:
        cards.append(("bad" if usd else "good", _usd(usd), f"lost at {escape(r.prices_named())} (estimate)"))
    if r.cost is not None:
        cards.append(("", _usd(r.cost.total_usd), f"provider cost, vs {_usd(r.cost.uncached_usd)} uncached "
                                                   f"(cache hit rate {_pct(r.cost.hit_rate)})"))
    if r.curve is not None:
        cards.append(("", _pct(r.curve.ceiling_hit_rate), "vLLM prefix hit rate with no eviction"))
    out = [f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{escape(title)}</title>
<style>{CSS}</style></head>
<body><main>
<h1>Cache report</h1>
<p class="sub"><code>{escape(r.source)}</code> &middot; tokens counted with <code>{escape(r.tokenizer)}</code>
&middot; blocks of {r.block_size}</p>
<div class="cards">"""]
    for cls, v, k in cards:
        out.append(f'<div class="card {cls}"><div class="v">{v}</div><div class="k">{k}</div></div>')
    out.append("</div>")

    out.append("<h2>Tokens lost, per cause</h2>")
    if r.causes:
        top = max(c.tokens_lost for c in r.causes) or 1
        out.append('<table><tr><th>cause</th><th class="n">pairs</th><th class="n">tokens lost</th>'
                   + ('<th class="n">dollars lost</th>' if r.usd_lost is not None else "")
                   + '<th class="barcell"></th></tr>')
        for c in r.causes:
            width = 100 * c.tokens_lost / top
            out.append(f'<tr><td>{escape(c.label)}<br><code class="note">{escape(c.cause or "unexplained")}</code></td>'
                       f'<td class="n">{_n(c.pairs)}</td><td class="n">{_n(c.tokens_lost)}</td>'
                       + (f'<td class="n">{_usd(c.usd_lost)}</td>' if r.usd_lost is not None else "")
                       + f'<td class="barcell"><div class="bar" style="width:{width:.1f}%"></div></td></tr>')
        out.append("</table>")
    else:
        out.append('<p class="note">No request broke the prefix of the one before it: every pair was append-only.</p>')

    if r.shared_prefix is not None:
        out.append(_shared_html(r))

    if r.worst:
        out.append("<h2>Worst conversations</h2>")
        out.append('<p class="note">Each conversation\'s costliest pair: the previous request beside the next one, '
                   "from a few tokens before the first difference. Shared tokens are grey; from the first difference "
                   "on, the previous request is red and the next one green.</p>")
        for w in r.worst:
            pills = "".join(f'<span class="pill">{escape(cause_label(None if c == "unexplained" else c))}</span>'
                            for c in w.causes)
            money = f" &middot; {_usd(w.usd_lost)}" if w.usd_lost is not None else ""
            out.append(f'<div class="conv"><h3>conversation <code>{escape(str(w.key))}</code></h3>'
                       f'<div class="meta">{_n(w.requests)} requests &middot; {_n(w.tokens_lost)} tokens lost{money} '
                       f"&nbsp;{pills}</div>")
            if w.worst is not None:
                out.append(_pair_html(w.worst))
            out.append("</div>")

    if r.cost is not None:
        out.extend(_provider_html(r.cost))

    if r.curve is not None and r.curve.points:
        cv = r.curve
        out.append("<h2>vLLM prefix cache: hit rate against capacity</h2>")
        out.append(f'<p class="note">The log replayed through vLLM\'s block pool (blocks of {cv.block_size}, LRU '
                   f"eviction) at {plural(len(cv.points), 'capacity', 'capacities')}, from the smallest that holds the "
                   f"largest request ({_n(cv.min_capacity_tokens)} tokens) to the one where nothing is evicted "
                   f"({_n(cv.ceiling_capacity_tokens)} tokens).</p>")
        out.append(f'<div class="chart">{curve_svg(cv)}<div class="legend"><span class="swatch" '
                   'style="background:#2f6fde"></span>hit rate at that capacity<span class="swatch" '
                   'style="background:#1d7f4e"></span>no eviction (the ceiling: '
                   f"{_pct(cv.ceiling_hit_rate)})</div></div>")
        for n in cv.notes:
            out.append(f'<p class="note">{escape(flags_for_params(n))}</p>')

    if r.fixes is not None:
        out.append(_fixes_html(r.fixes))

    if r.notes:
        out.append("<h2>Notes</h2>")
        for n in r.notes:
            out.append(f'<p class="note">{escape(flags_for_params(n))}</p>')
    out.append(f"<footer>cachectl {escape(version)} &middot; one self-contained page: no script, no network."
               "</footer></main></body></html>\n")
    return "\n".join(out)


def _provider_html(cs: CostSection) -> list[str]:
    """The provider section: what the cache cost and saved, why requests missed, the billed usage it was checked
    against, and its findings and notes (as the text shows them)."""
    out: list[str] = []
    out.append("<h2>Provider prompt cache</h2>")
    out.append(f'<p class="note">Simulated with the price table\'s rules for {escape(", ".join(cs.models))}; '
               f"tokens from {escape(cs.token_source)}.</p>")
    out.append('<div class="cards c4">'
               f'<div class="card"><div class="v">{_usd(cs.total_usd)}</div><div class="k">paid with caching</div></div>'
               f'<div class="card"><div class="v">{_usd(cs.uncached_usd)}</div><div class="k">without caching</div></div>'
               f'<div class="card {"good" if cs.savings_usd >= 0 else "bad"}"><div class="v">{_usd(cs.savings_usd)}'
               f'</div><div class="k">saved by the cache</div></div>'
               f'<div class="card"><div class="v">{_pct(cs.hit_rate)}</div><div class="k">of prompt tokens read '
               "from cache</div></div></div>")
    if cs.misses:
        out.append('<p></p><table><tr><th>why requests missed</th><th class="n">requests</th>'
                   '<th class="n">uncached input tokens</th></tr>')
        for m in cs.misses:
            out.append(f'<tr><td>{escape(m.code.replace("_", " "))}</td><td class="n">{_n(m.requests)}</td>'
                       f'<td class="n">{_n(m.uncached_input_tokens)}</td></tr>')
        out.append("</table>")
    if cs.reconciled:
        billed = f"{_usd(cs.billed_usd)} billed" if cs.billed_usd is not None else "billed"
        out.append(f'<p class="note">Against the logged usage: {billed} for {plural(cs.reconciled, "request")}; '
                   f"the prediction agrees on {_n(cs.agreed)} (read or not, written or not).</p>")
    for f in cs.findings:
        out.append(f'<p class="note">finding: {escape(f)}</p>')
    for n in cs.notes:  # (what the rate and the dollars rest on: a minimum, a batch rate, lines left out)
        out.append(f'<p class="note">{escape(flags_for_params(n))}</p>')
    return out


def _fixes_html(fx: BeforeAfter) -> str:
    cols = fx.columns
    how = "by the key field" if fx.grouping.startswith("key") else "found automatically"
    out = ["<h2>Before and after <code>cachectl fix</code></h2>",
           f'<p class="note">The log rewritten by <code>cachectl fix</code> and measured again by the same engines '
           f"({fx.conversations} conversations, {how}). Safe fixes leave what the model reads unchanged; unsafe ones "
           "move content (<code>--unsafe-fixes</code>).</p>",
           "<table><tr><th></th>" + "".join(f'<th class="n">{escape(c.label)}</th>' for c in cols) + "</tr>"]

    def rate_row(name: str, values: list[float | None]) -> str:
        best = max((v for v in values if v is not None), default=None)
        cells = []
        for v in values:
            bar = "" if v is None else f'<span class="mini"><span style="width:{100 * v:.1f}%"></span></span>'
            cls = "n best" if v is not None and v == best and len(set(values)) > 1 else "n"
            cells.append(f'<td class="{cls}">{_pct(v)}{bar}</td>')
        return f"<tr><td>{name}</td>{''.join(cells)}</tr>"

    out.append(rate_row("vLLM prefix hit rate (no eviction)", [c.vllm_hit_rate for c in cols]))
    out.append(rate_row("provider cache hit rate", [c.provider_hit_rate for c in cols]))
    # (the headline's prefix reuse, measured again on each version: one figure, not two that read alike)
    out.append(rate_row("prefix reuse (reusable tokens reused within conversations)",
                        [None if not c.pair_reusable_tokens else (c.pair_reused_tokens or 0) / c.pair_reusable_tokens
                         for c in cols]))
    costs = [c.provider_cost_usd for c in cols]
    low = min((v for v in costs if v is not None), default=None)
    out.append("<tr><td>provider cost</td>" + "".join(
        f'<td class="{"n best" if v is not None and v == low and len(set(costs)) > 1 else "n"}">{_usd(v)}</td>'
        for v in costs) + "</tr>")
    out.append("<tr><td>fixes applied</td>" + "".join(f'<td class="n">{_n(c.fixes_applied)}</td>' for c in cols)
               + "</tr>")
    out.append("<tr><td>pairs still diverging</td>" + "".join(
        f'<td class="n">{_n(sum(c.causes.values()))}</td>' for c in cols) + "</tr></table>")
    if fx.gains:
        out.append('<p></p><table><tr><th>fix</th><th></th><th class="n">rewrites</th>'
                   '<th class="n">tokens reused gained</th><th class="n">provider dollars saved</th></tr>')
        for g in fx.gains:
            pill = '<span class="pill safe">safe</span>' if g.safe else '<span class="pill unsafe">unsafe</span>'
            out.append(f"<tr><td><code>{escape(g.code)}</code> {escape(g.name.replace('_', ' '))}</td><td>{pill}</td>"
                       f'<td class="n">{_n(g.fixes)}</td><td class="n">{_n(g.reused_tokens)}</td>'
                       f'<td class="n">{_usd(g.provider_saved_usd)}</td></tr>')
        out.append("</table>")
        out.append('<p class="note">Each code applied after the ones above it, so the gains add up to the '
                   "all-fixes column.</p>")
    for e in fx.examples:
        change = ""
        if e.before is not None or e.after is not None:
            change = (f"<br><code>{escape(e.before or '')}</code> &rarr; <code>{escape(e.after or '')}</code>")
        out.append(f'<p class="note ex"><b>{escape(e.code)}</b> line {e.line}, <code>{escape(e.path)}</code>: '
                   f"{escape(e.message)}{change}</p>")
    for n in fx.notes:
        out.append(f'<p class="note">{escape(flags_for_params(n))}</p>')
    return "\n".join(out)
