"""No function in proxy/ is over 60 lines (its def to its last line, docstring and comments included): a longer one
is a flow with steps that want names. Read with ast; no network.

Run: tests/run.sh tests/test_function_size.py
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 60


def long_functions(limit: int = LIMIT) -> dict[tuple[str, str], int]:
    found = {}
    for path in sorted((ROOT / "proxy").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > limit:
                    found[(str(path.relative_to(ROOT)), node.name)] = lines
    return found


def test_no_function_is_over_60_lines():
    over = long_functions()
    assert not over, f"functions over {LIMIT} lines: {over}"


def test_the_check_reads_the_tree():
    """The walk measures functions at all (so the test above can fail): create_app is over 20 lines."""
    assert ("proxy/http/app.py", "create_app") in long_functions(20)
