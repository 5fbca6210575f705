"""The template sandbox's budget: a chat or prompt template is untrusted input (lint runs in CI on pull
requests), so every render has a wall-clock and a memory budget, and the operations that amplify are bounded.

Two layers, both applied to the environment instance :mod:`cachectl.tokenization` gets from transformers:

- **Bounds on what one operation may build**, checked before it is built: ``center``, ``indent``,
  ``replace``, ``join``, ``format`` and ``%`` widths, ``~`` and ``+``, ``*`` and ``**``, ``tojson(indent=)``,
  ``lipsum``, ``batch``, ``slice``, ``wordwrap``, the filters that build an item a character or word of a text
  (``title``, ``sort``, ``urlize``...), the ``str`` methods that pad or join, the output buffer, and the size
  of a nested value before it is turned into text (a list built as ``[x, x]`` forty times over is 2**40
  items once printed). A single operation may build at most the memory budget (strings) or
  :data:`MAX_ITEMS` items (lists), so no one step can exhaust the machine.
- **A watchdog thread**, outside the render: it wakes every :data:`POLL_S` while a render runs, and marks the
  render over budget when its wall-clock time or the process's resident memory above the render's start
  passes the budget. The render sees the mark at its next checkpoint (every loop iteration, every macro
  or callable call, every filter and test, every output), and raises :class:`RenderBudgetExceeded`, a
  ``SecurityError`` the caller turns into one located line. A render that reaches no checkpoint within
  :data:`GRACE_S` of its deadline (stuck inside one C call) is ended by the hard stop a CLI installs
  (:func:`set_hard_stop`); a library user gets the mark only.

Budgets are per render and set with :func:`budget` (a context manager; the default is
:data:`DEFAULT_BUDGET`).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.environment import Template
from jinja2.exceptions import SecurityError, TemplateSyntaxError


@dataclass(frozen=True)
class RenderBudget:
    """What one render of a template may use: wall-clock seconds, and bytes of memory above the process's resident
    size as it starts (read at most :data:`RSS_FRESH_S` before)."""

    seconds: float = 5.0
    memory_bytes: int = 256 * 2 ** 20

    def describe(self) -> str:
        return f"{self.seconds:g} s and {self.memory_bytes / 2 ** 20:,.0f} MB"


DEFAULT_BUDGET = RenderBudget()
#: the most items one operation of a template may put in a list (a render's own lists, not its inputs)
MAX_ITEMS = 1_000_000
#: how often the watchdog looks at a running render once one has run this long
POLL_S = 0.01
#: the longest the watchdog waits between looks while every render it finds is younger than :data:`POLL_S`: the wait
#: doubles from :data:`POLL_S` at each such look, and is :data:`POLL_S` again once a render has run that long. A
#: whole-log command renders thousands of prompts a second, each in some 150 µs: looking every 10 ms through them cost
#: about 4% of one process (each wake took the interpreter lock from the render and its own lock from the next
#: render's start). So a render is first looked at within this and :data:`POLL_S` of its start, then every
#: :data:`POLL_S`
MAX_NAP_S = 0.16
#: how long past its deadline a render stuck in one operation is given before the hard stop
GRACE_S = 2.0
#: how old the resident size that a render's memory is counted from may be: read at most once in this time, not at
#: each render's start. A whole-log command starts thousands of renders a second, and reading /proc/self/statm right
#: after a render took 13.6 µs while the watchdog thread polled (0.8 µs with it asleep: the read gives up the
#: interpreter lock). So what the process took in the last 10 ms, a render started just before included, counts
#: against the next render (two back-to-back renders that keep more than half the budget each can trip the second),
#: and what it let go in that time the next render may take beyond its budget
RSS_FRESH_S = 0.01
#: how long the watchdog goes on polling after the last render ended, before it sleeps until the next one: a
#: whole-log command renders thousands of prompts a second, and waking the thread for each cost some tenth of
#: their time (a Condition.notify and the thread switch it causes)
LINGER_S = 1.0

_BUDGET: contextvars.ContextVar[RenderBudget] = contextvars.ContextVar("cachectl_render_budget",
                                                                         default=DEFAULT_BUDGET)


class RenderBudgetExceeded(SecurityError):
    """A render ran past its wall-clock or memory budget."""


class SandboxLimit(SecurityError):
    """One operation of a template would build more than the sandbox allows."""


#: the most expressions and statements (Jinja AST nodes) a template may have: compiling one takes some 8 KB a node
#: (Python's ``compile`` of the code Jinja generates), outside any render's budget, so a template of '{{ a }}' a
#: million times over would take gigabytes before its first render. The largest chat templates in
#: fixtures/chat_templates have about 1,300 (Kimi-K3: 1,286); 20,000 compile in about 160 MB
MAX_TEMPLATE_NODES = 20_000


class TemplateTooLarge(TemplateSyntaxError):
    """A template past :data:`MAX_TEMPLATE_NODES`: refused before it is compiled (a syntax error's path: each caller
    names the template)."""


def _bounded_parse(parse: Callable[..., Any]) -> Callable[..., Any]:
    """``Environment._parse`` (behind ``parse`` and every compile) refusing a template past
    :data:`MAX_TEMPLATE_NODES`: its tags counted before it is lexed (each is a node at least), its nodes after."""
    def _parse(source: str, name: str | None, filename: str | None) -> nodes.Template:
        tags = source.count("{{") + source.count("{%")
        if tags > MAX_TEMPLATE_NODES:
            raise TemplateTooLarge(f"a template of {tags:,} tags is refused by the sandbox (at most "
                                   f"{MAX_TEMPLATE_NODES:,} expressions and statements; the largest chat templates "
                                   "have about 1,300)", 1, name, filename)
        tree = parse(source, name, filename)
        count = sum(1 for _ in tree.find_all(nodes.Node))
        if count > MAX_TEMPLATE_NODES:
            raise TemplateTooLarge(f"a template of {count:,} expressions and statements is refused by the sandbox (at "
                                   f"most {MAX_TEMPLATE_NODES:,}; the largest chat templates have about 1,300)", 1,
                                   name, filename)
        return tree

    return _parse


@contextlib.contextmanager
def budget(value: RenderBudget) -> Iterator[RenderBudget]:
    """Renders inside the block run under ``value``."""
    token = _BUDGET.set(value)
    try:
        yield value
    finally:
        _BUDGET.reset(token)


def current_budget() -> RenderBudget:
    return _BUDGET.get()


# ------------------------------------------------------------------------------------------- watchdog

#: thread ids whose running render is over budget: what every checkpoint looks at (empty almost always)
_tripped: set[int] = set()


def checkpoint() -> None:
    """Raise :class:`RenderBudgetExceeded` when the watchdog marked this thread's render over budget."""
    if _tripped and threading.get_ident() in _tripped:
        _WATCHDOG.raise_over()


def _rss_reader() -> Callable[[], int | None]:
    try:
        fd = os.open("/proc/self/statm", os.O_RDONLY)
    except OSError:  # not Linux: the peak resident size, which grows only past the previous peak
        try:
            import resource
        except ImportError:  # pragma: no cover - Windows: the per-operation bounds only
            return lambda: None
        scale = 1 if sys.platform == "darwin" else 1024
        return lambda: resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    page = os.sysconf("SC_PAGE_SIZE")

    def read() -> int | None:
        try:
            return int(os.pread(fd, 64, 0).split()[1]) * page
        except (OSError, ValueError, IndexError):  # pragma: no cover
            return None

    return read


class _Watch:
    __slots__ = ("thread", "started", "deadline", "rss0", "budget", "reason", "tripped_at", "label")

    def __init__(self, thread: int, value: RenderBudget, rss0: int | None, label: str | None):
        self.thread = thread
        self.started = time.monotonic()
        self.deadline = self.started + value.seconds
        self.rss0 = rss0
        self.budget = value
        self.reason: str | None = None
        self.tripped_at = 0.0
        self.label = label


class _Watchdog:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._active: dict[int, _Watch] = {}
        self._thread: threading.Thread | None = None
        self._rss = _rss_reader()
        self._rss_read: tuple[float, int | None] = (-RSS_FRESH_S, None)  # (when, what) the size was last read at a start
        self._sleeping = False    # the thread waits for a render to start (not polling): start() wakes it
        self.hard_stop: Callable[[str], None] | None = None

    def start(self, value: RenderBudget, label: str | None) -> _Watch:
        at, rss0 = self._rss_read
        now = time.monotonic()
        if now - at >= RSS_FRESH_S:
            self._rss_read = (now, rss0 := self._rss())
        watch = _Watch(threading.get_ident(), value, rss0, label)
        with self._cond:
            self._active[watch.thread] = watch
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="cachectl-render-watchdog", daemon=True)
                self._thread.start()
            elif self._sleeping:
                self._cond.notify()
        return watch

    def stop(self, watch: _Watch) -> None:
        with self._cond:
            if self._active.get(watch.thread) is watch:
                del self._active[watch.thread]
            _tripped.discard(watch.thread)

    def raise_over(self) -> None:
        watch = self._active.get(threading.get_ident())
        if watch is None or watch.reason is None:  # pragma: no cover - a mark without a render
            _tripped.discard(threading.get_ident())
            return
        raise RenderBudgetExceeded(watch.reason)

    def _run(self) -> None:
        idle_since: float | None = None
        nap = POLL_S  # (the wait until the next look: longer while every render found is younger than POLL_S)
        while True:
            with self._cond:
                if not self._active:  # polls on for LINGER_S (a render starting then is seen at the next poll)
                    now = time.monotonic()
                    idle_since = idle_since if idle_since is not None else now
                    if now - idle_since < LINGER_S:
                        self._cond.wait(nap)
                        nap = min(2 * nap, MAX_NAP_S)
                        continue
                    self._sleeping = True
                    while not self._active:
                        self._cond.wait()
                    self._sleeping = False
                    nap = POLL_S
                idle_since = None
                now = time.monotonic()
                old = any(now - w.started >= POLL_S for w in self._active.values())
                rss = self._rss() if old else None
                nap = POLL_S if old else min(2 * nap, MAX_NAP_S)
                stuck = None
                for w in self._active.values():
                    if w.reason is None:
                        if now > w.deadline:
                            w.reason = (f"the render ran past its budget of {w.budget.seconds:g} s of wall-clock "
                                        "time (render timeout)")
                        elif rss is not None and w.rss0 is not None and rss - w.rss0 > w.budget.memory_bytes:
                            w.reason = (f"the render grew past its memory budget of "
                                        f"{w.budget.memory_bytes / 2 ** 20:,.0f} MB (render memory)")
                        if w.reason is not None:
                            w.tripped_at = now
                            _tripped.add(w.thread)
                    elif now - w.tripped_at > max(GRACE_S, w.budget.seconds) and self.hard_stop is not None:
                        stuck = w
                self._cond.wait(nap)
            if stuck is not None and self.hard_stop is not None:
                where = f"{stuck.label}: " if stuck.label else ""
                self.hard_stop(f"{where}{stuck.reason}, and could not be interrupted (stuck in one operation)")


_WATCHDOG = _Watchdog()


def _after_fork_in_child() -> None:
    """A forked child (:mod:`cachectl.workers`) has no watchdog thread, and its lock may have been held at the fork:
    it starts afresh (with the first render), without the parent's hard stop (which would print)."""
    _WATCHDOG.__init__()  # type: ignore[misc]
    _tripped.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
_SITE: contextvars.ContextVar[str | None] = contextvars.ContextVar("cachectl_render_site", default=None)


def set_hard_stop(stop: Callable[[str], None] | None) -> None:
    """What ends a render that is over budget and reaches no checkpoint (a CLI: print the line, exit 2)."""
    _WATCHDOG.hard_stop = stop


@contextlib.contextmanager
def site(label: str | None) -> Iterator[None]:
    """Name what renders inside the block (a file), for the hard stop's line."""
    token = _SITE.set(label)
    try:
        yield
    finally:
        _SITE.reset(token)


def guarded(render: Callable[[], Any]) -> Any:
    """Run one render under the current budget, watched (a render inside a render shares the outer watch)."""
    if threading.get_ident() in _WATCHDOG._active:
        return render()
    watch = _WATCHDOG.start(_BUDGET.get(), _SITE.get())
    try:
        return render()
    finally:
        _WATCHDOG.stop(watch)


# ---------------------------------------------------------------------------------------- the bounds


def _refuse(what: str, why: str = "") -> SandboxLimit:
    return SandboxLimit(f"{what} is refused by the sandbox{why}")


def _over(chars: int, limit: int, *parts: Any) -> bool:
    """Whether a string of ``chars`` characters built from ``parts`` takes more than ``limit`` bytes (4 a character
    where any part is past ASCII, else 1): the parts are looked at only where 4 a character would be over."""
    if chars * 4 <= limit:
        return False
    wide = any(isinstance(p, str) and not p.isascii() for p in parts)
    return chars * (4 if wide else 1) > limit


def op_limit() -> int:
    """The bytes one operation may build: a quarter of the render's memory budget (its inputs, the result
    and the output buffer must all fit)."""
    return _BUDGET.get().memory_bytes // 4


def check_chars(chars: int, what: str, *parts: Any) -> None:
    limit = op_limit()
    if _over(chars, limit, *parts):
        raise _refuse(f"{what} of {chars:,} characters", f" (one operation may build {limit / 2 ** 20:,.0f} MB, "
                      "a quarter of the render's memory budget)")


def check_items(items: int, what: str) -> None:
    if items > MAX_ITEMS:
        raise _refuse(f"{what} of {items:,} items", f" (at most {MAX_ITEMS:,})")


_CONTAINERS = (list, tuple, dict, set, frozenset)
#: the texts a template can build: strings, and bytes (``'x'.encode()``), bounded alike (a byte a character)
_TEXTS = (str, bytes, bytearray)


def text_size(value: Any, what: str) -> int:
    """About how many characters ``str(value)`` (or its JSON) holds; refused past the budget, counted without
    building it (a shared sub-list counts each time it is printed)."""
    if type(value) is str or isinstance(value, (bytes, bytearray)):
        return len(value)
    if not isinstance(value, _CONTAINERS):
        return 32
    limit = op_limit()
    stack = [value]
    items = size = 0
    while stack:
        x = stack.pop()
        items += 1
        if not items & 0xFFFF:
            checkpoint()
        if isinstance(x, _TEXTS):
            size += len(x) + 4
        elif isinstance(x, dict):
            stack.extend(x.keys())
            stack.extend(x.values())
            size += 2
        elif isinstance(x, _CONTAINERS):
            stack.extend(x)
            size += 2
        else:
            size += 4
        if items > MAX_ITEMS or size > limit:
            raise _refuse(f"{what} of a value of more than {min(items, MAX_ITEMS):,} items or {min(size, limit):,} "
                          "characters once printed")
    return size


def _finalize(value: Any) -> Any:
    """Every ``{{ output }}``: a checkpoint, and a nested value is sized before it is printed."""
    checkpoint()
    if type(value) is not str and isinstance(value, _CONTAINERS):
        text_size(value, "printing")
    return value


def _concat(parts: Any) -> str:
    """The output buffer of a render, a macro or a ``{% set %}`` block."""
    buf = list(parts)
    chars = 0
    for p in buf:
        chars += len(p)
    check_chars(chars, "an output", *buf[:64])
    return "".join(buf)


def _str_concat(parts: tuple) -> str:
    """``a ~ b``."""
    checkpoint()
    chars = sum(text_size(p, "'~'") for p in parts)
    check_chars(chars, "a '~' concatenation", *parts)
    return "".join([p if type(p) is str else str(p) for p in parts])


class _Checked:
    """What a ``{% for %}`` loop iterates: its iterable, with a checkpoint at each item."""

    __slots__ = ("it",)

    def __init__(self, it: Any):
        self.it = it

    def __len__(self) -> int:
        return len(self.it)

    def __iter__(self) -> Iterator[Any]:
        for x in self.it:
            if _tripped:
                checkpoint()
            yield x


_LOOP_FILTER = "cachectl_checked_loop"


class _BudgetCodeGenerator(CodeGenerator):
    """transformers' code generator, with ``~`` bounded and every loop's iterable checked."""

    def visit_Template(self, node: nodes.Template, frame: Any = None) -> None:
        for loop in node.find_all(nodes.For):
            it = loop.iter
            loop.iter = nodes.Filter(it, _LOOP_FILTER, [], [], None, None, lineno=it.lineno)
        super().visit_Template(node, frame)

    def visit_Concat(self, node: nodes.Concat, frame: Any) -> None:
        if frame.eval_ctx.volatile or frame.eval_ctx.autoescape:  # pragma: no cover - chat templates never escape
            super().visit_Concat(node, frame)
            return
        self.write("environment.cachectl_str_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


_PERCENT_SPEC = None


def _format_widths(fmt: str, args: Any, what: str) -> None:
    """``'%2000000000d' % 1`` and ``'%*d' % (10**9, 1)``: widths and precisions bounded by the budget."""
    import re

    global _PERCENT_SPEC
    if _PERCENT_SPEC is None:
        _PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-+ #0]*(\*|\d+)?(?:\.(\*|\d+))?")
    stars = []
    total = len(fmt)
    for m in _PERCENT_SPEC.finditer(fmt):
        for g in m.groups():
            if g == "*":
                stars.append(g)
            elif g:
                total += int(g) if len(g) < 12 else 10 ** 12
    if stars:
        for a in (args if isinstance(args, tuple) else (args,)):
            if isinstance(a, int) and not isinstance(a, bool):
                total += abs(a)
    for a in (args if isinstance(args, tuple) else (args,)):
        total += text_size(a, what)
    if isinstance(args, dict):
        total += text_size(args, what)
    check_chars(total, what, fmt)


def _brace_widths(fmt: str, args: tuple, kwargs: dict, what: str) -> None:
    """``'{:>2000000000}'.format(x)``: the format specs' numbers bounded, nested specs refused."""
    import re
    import string

    total = len(fmt)
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # the real call raises the same error
    for _, name, spec, _ in fields:
        if spec:
            if "{" in spec:
                raise _refuse(f"{what} with a nested format spec {{{name}:{spec}}}")
            for n in re.findall(r"\d+", spec):
                total += int(n) if len(n) < 12 else 10 ** 12
    for a in (*args, *kwargs.values()):
        total += text_size(a, what)
    check_chars(total, what, fmt)


def _bounded_str_method(obj: Any, args: tuple, kwargs: dict) -> None:
    """The ``str`` (and ``bytes``) methods that pad, repeat or split: their result sized before it is built."""
    s = obj.__self__
    name = obj.__name__
    what = f"{type(s).__name__}.{name}()"
    text = type(s)  # (str, or bytes: the arguments a size is read from are of the same type)
    if name in ("center", "ljust", "rjust", "zfill"):
        width = args[0] if args else kwargs.get("width", 0)
        if isinstance(width, int):
            check_chars(width, what, s, *args[1:])
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int):
            check_chars(len(s) + s.count("\t") * max(size, 0), what, s)
    elif name == "replace" and len(args) >= 2 and isinstance(args[0], text) and isinstance(args[1], text):
        _replace_size(s, args[0], args[1], args[2] if len(args) > 2 else -1, what)
    elif name == "join" and args:
        _join_size(args[0], s, what)
    elif name in ("split", "rsplit", "splitlines"):
        sep = args[0] if args and isinstance(args[0], text) and name != "splitlines" else None
        newline = "\n" if text is str else b"\n"
        pieces = s.count(sep) + 1 if sep else s.count(newline) + 1 if name == "splitlines" else len(s) // 2 + 1
        check_items(pieces, what)
    elif name == "hex":  # (bytes: two characters a byte)
        check_chars(2 * len(s), what)
    elif name in ("format", "format_map"):
        if name == "format_map":
            _brace_widths(s, (), args[0] if args and isinstance(args[0], dict) else {}, what)
        else:
            _brace_widths(s, args, kwargs, what)


def _replace_size(s: str, old: str, new: str, count: Any, what: str) -> None:
    n = len(s) + 1 if old == "" else s.count(old)
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    check_chars(len(s) + n * (len(new) - len(old)), what, s, new)


def _join_size(items: Any, sep: Any, what: str) -> None:
    if isinstance(items, _TEXTS):
        n, chars = len(items), len(items)
    elif isinstance(items, (*_CONTAINERS, range)):
        n = len(items)
        check_items(n, what)
        chars = sum(text_size(x, what) for x in items)
    else:
        return  # a generator (map, select): its items are checked as they are made
    check_chars(chars + max(n - 1, 0) * (len(sep) if isinstance(sep, _TEXTS) else len(str(sep))), what, sep)


# ---------------------------------------------------------------------------------------- the filters


def _first_str(value: Any, what: str) -> int:
    return text_size(value, what)


def _wrap(name: str, original: Callable, pre: Callable | None) -> Callable:
    """A filter or test with a checkpoint, and the bound ``pre`` checks on its arguments first."""
    pass_arg = getattr(original, "jinja_pass_arg", None)
    skip = 1 if pass_arg is not None else 0  # the context / environment argument jinja passes first

    @functools.wraps(original)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        if _tripped:
            checkpoint()
        if pre is not None:
            pre(*args[skip:], **kwargs)
        return original(*args, **kwargs)

    bounded.__name__ = getattr(original, "__name__", name)
    return bounded


def _pre_center(value: Any = "", width: Any = 80, *a: Any, **k: Any) -> None:
    if isinstance(width, int):
        check_chars(max(width, _first_str(value, "center")), "center", value)


def _pre_indent(s: Any = "", width: Any = 4, first: Any = False, blank: Any = False, **k: Any) -> None:
    width = k.get("width", width)
    pad = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    chars = _first_str(s, "indent")
    lines = s.count("\n") + 1 if isinstance(s, str) else chars
    check_chars(chars + lines * max(pad, 0), "indent", s, width)


def _pre_replace(s: Any = "", old: Any = "", new: Any = "", count: Any = None, **k: Any) -> None:
    old, new, count = k.get("old", old), k.get("new", new), k.get("count", count)
    text = s if isinstance(s, str) else None
    if text is not None and isinstance(old, str) and isinstance(new, str):
        _replace_size(text, old, new, count if count is not None else -1, "replace")
    else:
        _first_str(s, "replace")


def _pre_join(value: Any = (), d: Any = "", attribute: Any = None, **k: Any) -> None:
    if attribute is None and k.get("attribute") is None:
        _join_size(value, k.get("d", d), "join")


def _pre_format(value: Any = "", *args: Any, **kwargs: Any) -> None:
    if isinstance(value, str):
        _format_widths(value, kwargs if kwargs else tuple(args), "format")


def _pre_tojson(x: Any = None, ensure_ascii: Any = False, indent: Any = None, separators: Any = None,
                sort_keys: Any = False, **k: Any) -> None:
    indent = k.get("indent", indent)
    separators = k.get("separators", separators)
    pad = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
    if pad > 64:
        raise _refuse(f"tojson with an indent of {pad:,} (at most 64)")
    if separators is not None and sum(len(s) for s in separators if isinstance(s, str)) > 64:
        raise _refuse("tojson with separators longer than 64 characters")
    size = text_size(x, "tojson")
    check_chars(size * (1 + pad), "tojson", x)


def _pre_text(value: Any = "", *a: Any, **k: Any) -> None:
    text_size(value, "the text")


def _pre_list(value: Any = (), *a: Any, **k: Any) -> None:
    if isinstance(value, str):
        check_items(len(value), "list")


def _pre_batch(value: Any = (), linecount: Any = 1, fill_with: Any = None, **k: Any) -> None:
    if isinstance(linecount, int):
        check_items(linecount, "batch")
    _check_text_items(value, "batch")


def _check_text_items(value: Any, name: str, text: bool = False) -> None:
    """A filter that builds a list of an item a character or a word of a text (``title`` keeps 80 bytes a
    character, ``sort`` over 160): the text at most :data:`MAX_ITEMS` characters. With ``text``, a filter of
    the text a value prints as (``title`` of a list)."""
    if (text or isinstance(value, str)) and (chars := text_size(value, name)) > MAX_ITEMS:
        raise _refuse(f"{name} over a text of {chars:,} characters", f" (at most {MAX_ITEMS:,})")


def _pre_items(name: str, text: bool = False) -> Callable:
    """:func:`_check_text_items` as the ``pre`` check of the filter ``name``."""
    def pre(value: Any = (), *a: Any, **k: Any) -> None:
        _check_text_items(value, name, text)
    return pre


def _pre_slice(value: Any = (), slices: Any = 1, *a: Any, **k: Any) -> None:
    slices = k.get("slices", slices)
    if isinstance(slices, int):
        check_items(slices, "slice")
    _check_text_items(value, "slice")


def _pre_wordwrap(s: Any = "", width: Any = 79, break_long_words: Any = True, wrapstring: Any = None,
                  *a: Any, **k: Any) -> None:
    wrapstring = k.get("wrapstring", wrapstring)
    width = k.get("width", width)
    chars = _first_str(s, "wordwrap")
    _check_text_items(s, "wordwrap", text=True)
    if isinstance(wrapstring, str) and isinstance(width, int):
        check_chars(chars + (chars // max(width, 1) + 1) * len(wrapstring), "wordwrap", s, wrapstring)


def _pre_urlize(value: Any = "", *a: Any, **k: Any) -> None:
    for key in ("target", "rel"):
        v = k.get(key)
        if isinstance(v, str) and len(v) > 256:
            raise _refuse(f"urlize with a {key} of {len(v):,} characters (at most 256)")
    _check_text_items(value, "urlize", text=True)


def _pre_sum(iterable: Any = (), attribute: Any = None, start: Any = 0, **k: Any) -> None:
    start = k.get("start", start)
    if not isinstance(start, (int, float)):
        raise _refuse("sum with a start that is not a number (a list or string built by repeated concatenation)")


_PRE: dict[str, Callable] = {
    "center": _pre_center, "indent": _pre_indent, "replace": _pre_replace, "join": _pre_join,
    "format": _pre_format, "tojson": _pre_tojson, "list": _pre_list, "batch": _pre_batch,
    "wordwrap": _pre_wordwrap, "urlize": _pre_urlize, "sum": _pre_sum, "slice": _pre_slice,
    **{n: _pre_items(n, text=True) for n in ("title", "striptags", "wordcount")},  # (regex passes over the text)
    **{n: _pre_items(n) for n in ("sort", "groupby", "unique", "dictsort", "map", "select", "reject", "selectattr",
                                  "rejectattr")},
    **{n: _pre_text for n in ("string", "pprint", "upper", "lower", "capitalize", "trim", "escape", "e",
                              "forceescape", "truncate", "urlencode", "xmlattr")},
}


def _lipsum(original: Callable) -> Callable:
    def lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> Any:  # noqa: A002
        checkpoint()
        if not all(isinstance(v, int) for v in (n, min, max)) or n * max > 10_000 or n > 1000:
            raise _refuse(f"lipsum of {n!r} paragraphs of up to {max!r} words (at most 10,000 words)")
        return original(n, html, min, max)

    return lipsum


def _range(original: Callable) -> Callable:
    def range_(*args: int) -> Any:  # jinja's safe_range already stops at 100,000 items
        checkpoint()
        return original(*args)

    return range_


def _power_bits(left: Any, right: Any) -> int:
    return abs(left).bit_length() * right


#: the most bits a ``**`` may produce (a big power is slow to compute, in one step the watchdog cannot stop)
MAX_POWER_BITS = 1_000_000


def apply(env: Any, base: Any) -> Any:
    """Bound ``env`` (an overlay of transformers' environment ``base``): filters, tests, globals, operators,
    calls, output and loops, and its templates render under the watchdog."""
    env.filters = {name: _wrap(name, f, _PRE.get(name)) for name, f in base.filters.items()}
    env.filters[_LOOP_FILTER] = _Checked
    env.tests = {name: _wrap(name, t, None) for name, t in base.tests.items()}
    env.globals = dict(base.globals)
    if "lipsum" in env.globals:
        env.globals["lipsum"] = _lipsum(env.globals["lipsum"])
    if "range" in env.globals:
        env.globals["range"] = _range(env.globals["range"])
    env.finalize = _finalize
    env.concat = _concat
    env.cachectl_str_concat = _str_concat
    env.code_generator_class = _BudgetCodeGenerator
    env._parse = _bounded_parse(env._parse)
    env.template_class = _template_class(type(base).template_class)
    base_call = type(env).call
    base_binop = base.call_binop
    depth = threading.local()

    def call(context: Any, obj: Any, *args: Any, **kwargs: Any) -> Any:
        """Every call a template makes: a checkpoint, the str methods bounded, macro recursion counted."""
        if _tripped:
            checkpoint()
        wrapped = getattr(obj, "__wrapped__", obj)  # the sandbox's str.format wrapper
        if isinstance(getattr(wrapped, "__self__", None), _TEXTS) and hasattr(wrapped, "__name__"):
            _bounded_str_method(wrapped, args, kwargs)
        level = getattr(depth, "n", 0)
        if level >= MAX_CALL_DEPTH:
            raise _refuse(f"a call nested {level} deep (macro recursion, at most {MAX_CALL_DEPTH})")
        depth.n = level + 1
        try:
            return base_call(env, context, obj, *args, **kwargs)
        finally:
            depth.n = level

    def binop(context: Any, operator: str, left: Any, right: Any) -> Any:
        """``*`` and ``**`` whose result would be huge ('%s' * 10**9, 9**9**9) are refused, not computed, and
        so are ``+`` and ``%`` past the budget: a template must not exhaust the machine that lints it."""
        if _tripped:
            checkpoint()
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (*_TEXTS, list, tuple)) and isinstance(n, int) and n > 0:
                    if isinstance(seq, _TEXTS):
                        if _over(len(seq) * n, op_limit(), seq):
                            raise _refuse(f"a repetition of {len(seq):,} x {n:,} items")
                    elif len(seq) * n > MAX_ITEMS:
                        raise _refuse(f"a repetition of {len(seq):,} x {n:,} items")
            return left * right
        if operator == "**":
            if isinstance(left, int) and isinstance(right, int) and right > 0 and \
                    _power_bits(left, right) > MAX_POWER_BITS:
                raise _refuse(f"a power with a {_power_bits(left, right):,}-bit result")
            return left ** right
        if operator == "+":
            if isinstance(left, _TEXTS) and isinstance(right, _TEXTS):
                check_chars(len(left) + len(right), "a '+' concatenation", left, right)
            elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
                check_items(len(left) + len(right), "a '+' concatenation")
            return left + right
        if operator == "%" and isinstance(left, _TEXTS):
            _format_widths(left if isinstance(left, str) else left.decode("latin-1"), right, "a '%' format")
        return base_binop(context, operator, left, right)

    env.intercepted_binops = frozenset(["*", "**", "+", "%"])
    env.call_binop = binop
    env.call = call
    return env


#: how deep calls may nest (a macro calling itself; real templates' recursive macros nest a few levels)
MAX_CALL_DEPTH = 64


@functools.cache
def _template_class(base: type[Template]) -> type[Template]:
    class BudgetedTemplate(base):  # type: ignore[valid-type, misc]
        """A template of the bounded environment: each render runs under the watchdog."""

        def render(self, *args: Any, **kwargs: Any) -> str:
            return guarded(lambda: base.render(self, *args, **kwargs))

        def generate(self, *args: Any, **kwargs: Any) -> Iterator[str]:
            yield guarded(lambda: base.render(self, *args, **kwargs))

    BudgetedTemplate.__name__ = base.__name__
    return BudgetedTemplate

