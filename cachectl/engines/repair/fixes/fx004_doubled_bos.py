"""``FX004 doubled_bos`` (unsafe; needs a tokenizer): a raw-text prompt that starts with the BOS text, which
encoding then doubles, loses that text (token-ID prompts lose the duplicate ID); the model then sees one BOS, not
two."""

from __future__ import annotations

from ....tokenization import check_text_size
from ..groups import line_facts
from .body import set_at
from .rewriter import FixCode, Rewriter


def apply(rw: Rewriter) -> None:
    tok = rw.tok
    if tok is None or tok.bos_token_id is None:
        if tok is None and any(line_facts(rw.lines, i)[1] is None for i in range(len(rw.lines))):
            rw.notes.append("doubled BOS (FX004) is checked only with a tokenizer")
        return
    bos_id, bos = tok.bos_token_id, tok.bos_token
    for i in range(len(rw.lines)):
        if line_facts(rw.lines, i)[0] not in ("text", "ids"):  # (a chat prompt: nothing to parse)
            continue
        ln = rw.lines[i]
        p = ln.prompt
        if p.kind == "text" and p.text is not None and bos and p.text.startswith(bos):
            check_text_size(p.text, p)  # (refused naming its line, before the backend refuses it unnamed)
            ids = tok.backend.encode(p.text, add_special_tokens=True).ids
            if len(ids) > 1 and ids[0] == ids[1] == bos_id:
                path = p.field_paths[0] if p.field_paths else "prompt"
                if rw.record(FX004, ln, path, f"the text starts with {bos!r} and encoding adds BOS "
                             "again: the text's copy removed", p.text[:len(bos) + 20],
                             p.text[len(bos):len(bos) + 20]):
                    value = rw.values[i]
                    set_at(value, path, p.text[len(bos):])
                    rw.values[i] = value
        elif p.kind == "ids" and p.ids is not None and len(p.ids) > 1 and p.ids[0] == p.ids[1] == bos_id:
            value = rw.values[i]
            fieldname = next((k for k in ("tokens", "prompt_token_ids", "input_ids", "token_ids", "prompt")
                              if isinstance(value, dict) and k in value), None)
            if fieldname is None:
                continue
            if rw.record(FX004, ln, fieldname, "the token IDs start with BOS twice: one is removed",
                         list(p.ids[:3]), list(p.ids[1:3])):
                value[fieldname] = list(p.ids[1:])
                rw.values[i] = value


FX004 = FixCode("FX004", "doubled_bos", safe=False, description="remove a doubled BOS from a raw-text prompt",
                causes=("doubled_bos", "bos_mismatch"), apply=apply,
                across=("doubled_bos",))
