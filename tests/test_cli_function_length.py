"""The command line stays readable: no function in cachectl/cli is longer than a screen and a half."""

from __future__ import annotations

import ast

from .conftest import ROOT

MOST_LINES = 120


def test_no_cli_function_is_over_120_lines():
    long = []
    for path in sorted((ROOT / "cachectl" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                lines = (node.end_lineno or node.lineno) - first + 1
                if lines > MOST_LINES:
                    long.append(f"{path.name}:{node.lineno} {node.name}: {lines} lines")
    assert not long, long
