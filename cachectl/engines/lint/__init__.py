"""Lint prompt templates and request bodies for patterns that break prefix and prompt caches, fix the safe
ones, and write the findings as SARIF or GitHub annotations.

- :mod:`.rules`: the rule table, :class:`Finding`, :class:`LintReport`, the ``[tool.cachectl.lint]`` config
- :mod:`.templates`: the template rules (Jinja AST and two renders in a sandbox, diffed in token space)
- :mod:`.body`: the request-body rules (breakpoints, minimum length, volatile content before the cache)
- :mod:`.run`: :func:`lint_paths`, files found, read and linted, one error per unreadable file
- :mod:`.fix`: :func:`fix_paths`, the safe template fix, kept only when lint no longer flags the line
- :mod:`.output`: SARIF and GitHub annotations
"""

from .body import lint_body
from .fix import FixResult, fix_paths
from .rules import RULES, FileError, Finding, LintConfig, LintReport, Rule, load_config
from .run import lint_paths
from .templates import lint_template

__all__ = ["RULES", "FileError", "Finding", "FixResult", "LintConfig", "LintReport", "Rule", "fix_paths",
           "lint_body", "lint_paths", "lint_template", "load_config"]
