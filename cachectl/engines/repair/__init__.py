"""A whole request log, repaired and reported: :func:`fix_log` rewrites it so that its cacheable prefix is
stable, and :func:`build_report` joins the token diff, the provider cache and the prefix curve over it.

- :mod:`.groups`: the log's lines read as requests, and the conversation each belongs to
- :mod:`.fixes`: the fix codes FX001-FX007, one module each, and their registry
- :mod:`.shared_prefix`: the log's shared prefix across requests (its forks), once per log for fix, report and
  diff-tokens --log
- :mod:`.measure`: a log measured before and after (vLLM replay, provider cache, pair reuse)
- :mod:`.fix`: :func:`fix_log`, the fixes applied and measured, and the JSON of ``cachectl fix``
- :mod:`.report`: :func:`build_report`, the one-page report (the CLI renders it as text, JSON or HTML)
"""

from .fix import FixOptions, FixReport, fix_log
from .groups import group_sessions, log_lines
from .report import LogReport, build_report

__all__ = ["FixOptions", "FixReport", "LogReport", "build_report", "fix_log", "group_sessions", "log_lines"]
