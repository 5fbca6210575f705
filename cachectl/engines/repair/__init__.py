"""A whole request log, repaired and reported: :func:`fix_log` rewrites it so that its cacheable prefix is
stable, and :func:`build_report` joins the token diff, the provider cache and the prefix curve over it.

- :mod:`.fix`: conversations found, the fix codes FX001-FX006, the before/after measure
- :mod:`.report`: :func:`build_report`, the one-page report (the CLI renders it as text, JSON or HTML)
"""

from .fix import FixOptions, FixReport, fix_log, group_sessions, log_lines
from .report import LogReport, build_report

__all__ = ["FixOptions", "FixReport", "LogReport", "build_report", "fix_log", "group_sessions", "log_lines"]
