"""``FX005 reasoning_consistent`` (safe where a tokenizer shows the render unchanged, else unsafe): an assistant
turn whose reasoning (``<think>`` blocks, ``reasoning_content``, Anthropic thinking blocks) is present in some
requests of a conversation and absent in others (in the body, or in the chat template's render) has it dropped in
every request of the conversation. Anthropic thinking blocks of the current tool-use loop are kept (the API needs
them back)."""

from __future__ import annotations

from typing import Any

from ....errors import InputError
from ..groups import THINK, line_facts, reparse_at
from .body import messages_of, path_prefix, with_messages
from .rewriter import FixCode, Rewriter


def apply(rw: Rewriter) -> None:
    for members in rw.members():
        if len(members) < 2:
            continue
        seen: dict[int, set] = {}       # assistant message index -> reasoning texts seen ("" = none)
        rendered: dict[int, set] = {}   # ... -> whether the render holds it
        read = [(i, messages_of(rw.values[i])) for i in members]  # (each member's value read once here)
        for i, msgs in read:
            if msgs is None:
                continue
            # (a model that keeps only the last turn's thinking sees none before the current tool-use loop,
            # whether it was sent or not: that is no inconsistency)
            seen_from = _tool_loop_start(msgs) if _strips_prior_thinking(rw, i) else 0
            for m, msg in enumerate(msgs):
                if isinstance(msg, dict) and msg.get("role") == "assistant":
                    seen.setdefault(m, set()).add(_reasoning_of(msg) if m >= seen_from else "")
        if rw.tok is not None and rw.tok.chat_template is not None:
            for i, msgs in read:
                if msgs is None:
                    continue
                held = [(m, r) for m, msg in enumerate(msgs)
                        if isinstance(msg, dict) and msg.get("role") == "assistant" and (r := _reasoning_of(msg))]
                if not held:  # no reasoning to look for in the render: nothing to render
                    continue
                ln = rw.current(i)
                if not ln.prompt.is_chat:
                    continue
                try:
                    text = rw.tok.render_chat(ln.prompt, add_generation_prompt=True)
                except InputError:
                    continue
                for m, r in held:
                    rendered.setdefault(m, set()).add(r in text)
        bad = {m for m, s in seen.items() if len(s) > 1} | {m for m, s in rendered.items() if len(s) > 1}
        if not bad:
            continue
        for i in members:
            msgs = messages_of(rw.values[i])
            if msgs is None:
                continue
            before_render = _render(rw, i)
            changed = []
            loop_start = _tool_loop_start(msgs) if _is_anthropic(rw, i) else len(msgs)
            new_msgs = list(msgs)
            for m in sorted(bad):
                if m >= len(msgs) or m >= loop_start or not isinstance(msgs[m], dict):
                    continue
                dropped = _drop_reasoning(msgs[m])
                if dropped is not None:
                    new_msgs[m] = dropped
                    changed.append(m)
            if not changed:
                continue
            trial = with_messages(rw.values[i], new_msgs)
            after_render = _render_value(rw, i, trial)
            safe = before_render is not None and before_render == after_render
            how = ("the render is unchanged" if safe else
                   "the model no longer sees it" if before_render is not None else "not proven without a tokenizer")
            for m in changed:
                path = path_prefix(rw.values[i]) + f"messages[{m}]"
                if rw.record(FX005, rw.number(i), path, f"assistant message {m}'s reasoning is sent in some "
                             f"requests of the conversation and not in others: dropped ({how})",
                             _reasoning_of(msgs[m])[:40], "", safe=safe):
                    rw.values[i] = trial


def _render(rw: Rewriter, i: int) -> str | None:
    return _render_value(rw, i, rw.values[i])


def _render_value(rw: Rewriter, i: int, value: Any) -> str | None:
    if rw.tok is None or rw.tok.chat_template is None:
        return None
    ln = reparse_at(rw.lines, i, value)
    if not ln.prompt.is_chat:
        return None
    try:
        return str(rw.tok.render_chat(ln.prompt, add_generation_prompt=True))
    except InputError:
        return None


def _is_anthropic(rw: Rewriter, i: int) -> bool:
    """Whether line ``i``'s request is an Anthropic one (the line's kept facts: not parsed)."""
    return line_facts(rw.lines, i)[1] == "anthropic"


def _strips_prior_thinking(rw: Rewriter, i: int) -> bool:
    """Whether line ``i``'s model keeps only the last assistant turn's thinking (the price table's
    ``prior_thinking``): the API strips the thinking blocks before the current tool-use loop."""
    price = rw.price_of(line_facts(rw.lines, i)[2]) if _is_anthropic(rw, i) else None
    return price is not None and price.prior_thinking == "last_turn"  # (an unknown model sees what was sent)


def _reasoning_of(msg: dict) -> str:
    parts = []
    rc = msg.get("reasoning_content")
    if isinstance(rc, str) and rc:
        parts.append(rc)
    content = msg.get("content")
    if isinstance(content, str):
        m = THINK.search(content)
        if m:
            parts.append(m.group(0).strip())
    elif isinstance(content, list):
        for b in content:
            if isinstance(b, dict) and b.get("type") == "thinking":
                parts.append(str(b.get("thinking", "")))
            elif isinstance(b, dict) and b.get("type") == "redacted_thinking":
                parts.append(str(b.get("data", "")))
    return "\n".join(parts)


def _drop_reasoning(msg: dict) -> dict | None:
    out = dict(msg)
    changed = False
    if "reasoning_content" in out:
        del out["reasoning_content"]
        changed = True
    content = out.get("content")
    if isinstance(content, str) and "</think>" in content and "<think>" in content:
        # as the reasoning templates do: what follows the last </think>, leading newlines removed
        out["content"] = content.split("</think>")[-1].lstrip("\n")
        changed = True
    elif isinstance(content, list):
        kept = [b for b in content if not (isinstance(b, dict) and b.get("type") in ("thinking", "redacted_thinking"))]
        if len(kept) != len(content) and kept:
            out["content"] = kept
            changed = True
    return out if changed else None


def _tool_loop_start(msgs: list) -> int:
    """Index of the first assistant turn of the current tool-use loop (after the last user turn that is not only
    tool results); messages from there on keep their thinking blocks."""
    last_user = -1
    for m, msg in enumerate(msgs):
        if not isinstance(msg, dict) or msg.get("role") != "user":
            continue
        c = msg.get("content")
        only_results = isinstance(c, list) and c and all(isinstance(b, dict) and b.get("type") == "tool_result"
                                                         for b in c)
        if not only_results:
            last_user = m
    return last_user + 1


FX005 = FixCode("FX005", "reasoning_consistent", safe=False,
                description="drop reasoning from an assistant turn consistently", causes=("think_stripped",),
                apply=apply,
                across=("think_stripped",), proves_safe=True)
