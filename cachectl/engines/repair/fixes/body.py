"""A logged line's request body as the fix codes edit it: JSON paths into it, the body inside a wrapper, its
messages and tools, and a rewritten turn carried into the later requests of its conversation."""

from __future__ import annotations

import copy
import json
import re
from typing import Any

from ....inputs.request import unwrap

# -------------------------------------------------------------------------------------------- json paths

_SEG = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]")


def steps(path: str) -> list[str | int]:
    return [m.group(1) if m.group(1) is not None else int(m.group(2)) for m in _SEG.finditer(path)]


def get_at(obj: Any, path: str) -> Any:
    cur = obj
    for s in steps(path):
        cur = cur[s]
    return cur


def set_at(obj: Any, path: str, value: Any) -> None:
    parts = steps(path)
    cur = obj
    for s in parts[:-1]:
        cur = cur[s]
    cur[parts[-1]] = value


def body_of(value: Any) -> tuple[Any, str]:
    """The request body inside a line (a wrapper's body, or the line), and its path prefix."""
    if isinstance(value, list):
        return {"messages": value}, "<list>"
    body, body_path, _ = unwrap(value)
    return body, body_path


def put_body(value: Any, body: Any, body_path: str) -> Any:
    if body_path == "<list>":
        return body["messages"]
    if body_path:
        out = dict(value)
        out[body_path.rstrip(".")] = body
        return out
    return body


def path_prefix(value: Any) -> str:
    """What a fix's path starts with in this line (the wrapper's body field; nothing for a bare body or a list)."""
    if isinstance(value, list):
        return ""
    return body_of(value)[1]


# -------------------------------------------------------------------------------------- messages and tools


def messages_of(value: Any) -> list | None:
    body, _ = body_of(value)
    if not isinstance(body, dict):
        return None
    msgs = body.get("messages")
    if isinstance(msgs, list):
        return msgs
    items = body.get("input")
    return items if isinstance(items, list) else None


def with_messages(value: Any, msgs: list) -> Any:
    body, bp = body_of(value)
    new_body = dict(body)
    new_body["messages" if "messages" in body else "input"] = msgs
    return put_body(value, new_body, bp)


def apply_carry(msgs: list, carry: list[tuple[int, str, Any]]) -> list:
    """Later requests of a conversation: a turn rewritten earlier (where it was the last) is rewritten the same
    way where it is history. Inserts shift later indices, so they are applied from the last one down."""
    out = list(msgs)
    for idx, original, repl in sorted(carry, key=lambda c: -c[0]):
        if idx < len(out) and json.dumps(out[idx], sort_keys=True) == original and idx < len(out) - 1:
            out[idx:idx + 1] = copy.deepcopy(repl)
    return out


def tools_of(value: Any) -> tuple[dict, list] | None:
    """The body and its tool list, when it has tools."""
    body, _ = body_of(value)
    tools = body.get("tools") if isinstance(body, dict) else None
    if not isinstance(tools, list) or not tools:
        return None
    return body, tools


def tool_name(t: Any) -> str:
    if isinstance(t, dict):
        fn = t.get("function")
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            return fn["name"]
        if isinstance(t.get("name"), str):
            return t["name"]
    return "?"


# ------------------------------------------------------------------------------------- text blocks and parts


def text_parts(x: Any) -> list[tuple[str, int, str]] | None:
    """A list of text blocks or content parts (an Anthropic ``system``, an OpenAI message's ``content``) as the
    request parser reads it, its texts joined by newlines: ``(sub-path, start in the joined text, text)`` for each
    text part (``[j].text``, or ``[j]`` for a bare string part); None when ``x`` is not such a list. Parts without
    text (images, files) are left out of the joined text, as the parser leaves them."""
    if not isinstance(x, list):
        return None
    out: list[tuple[str, int, str]] = []
    at = 0
    for j, part in enumerate(x):
        if isinstance(part, str):
            sub, text = f"[{j}]", part
        elif isinstance(part, dict) and isinstance(part.get("text"), str) and part.get("type", "text") in (
                "text", "input_text", "output_text"):
            sub, text = f"[{j}].text", part["text"]
        elif isinstance(part, dict) and part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
            sub, text = f"[{j}].refusal", part["refusal"]
        else:
            continue
        out.append((sub, at, text))
        at += len(text) + 1
    return out


_PART_TEXT = re.compile(r"^(.*)\[(\d+)\](?:\.(?:text|refusal))?$")


def drop_emptied_parts(body: dict, slots: list[str]) -> list[str]:
    """After a fix emptied the text of the parts at ``slots`` (``system[0].text``, ``messages[0].content[1]``):
    each such part removed from its list (the request stays valid: Anthropic refuses an empty text block); a
    ``cache_control`` it carried goes to the part before it, when that one has none. A list left with no part
    becomes an empty string content (OpenAI), or the key is removed (an Anthropic ``system``, as is an Anthropic
    ``system`` string left empty). The slots whose part was removed."""
    gone: dict[str, list[int]] = {}
    for slot in slots:
        m = _PART_TEXT.match(slot)
        if m is None:
            continue
        try:
            parent = get_at(body, m.group(1))
            part = parent[int(m.group(2))]
        except (KeyError, IndexError, TypeError):
            continue
        text = part if isinstance(part, str) else part.get("text", part.get("refusal")) if isinstance(part, dict) else None
        if isinstance(parent, list) and isinstance(text, str) and not text.strip():
            gone.setdefault(m.group(1), []).append(int(m.group(2)))
    for slot in slots:  # an Anthropic system prompt left empty: no system prompt (an empty one is refused)
        if slot == "system" and isinstance(body.get("system"), str) and not body["system"].strip():
            del body["system"]
    removed: list[str] = []
    for parent_path, idxs in gone.items():
        parent = get_at(body, parent_path)
        for j in sorted(set(idxs), reverse=True):
            part = parent.pop(j)
            mark = part.get("cache_control") if isinstance(part, dict) else None
            if mark is not None and j > 0 and isinstance(parent[j - 1], dict) and "cache_control" not in parent[j - 1]:
                parent[j - 1]["cache_control"] = mark
        removed.extend(s for s in slots if (m := _PART_TEXT.match(s)) and m.group(1) == parent_path)
        if not parent:
            if parent_path == "system":
                del body["system"]
            else:
                set_at(body, parent_path, "")
    return removed
