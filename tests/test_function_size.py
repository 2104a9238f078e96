"""No new long functions (issue 53 item 5): the functions over MAX_FUNCTION_LINES lines in builder/ may only get fewer.

A long function is split into named steps; CEILING is the count today and is lowered as functions are split (never
raised: a new long one is split before it lands). Counted as anyone can rerun it::

    python -c "import ast,pathlib; print(sum(n.end_lineno-n.lineno+1>60 for p in pathlib.Path('builder').rglob('*.py')
    for n in ast.walk(ast.parse(p.read_text())) if isinstance(n,(ast.FunctionDef,ast.AsyncFunctionDef))))"
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "builder"
MAX_FUNCTION_LINES = 60
# today's four: cli/coverage.py cmd_coverage, user/doctor.py _next_steps, pipeline/checks.py torch_range,
# pipeline/run.py _build_steps
CEILING = 2


def long_functions(package: Path = PACKAGE, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``module:line name (N lines)`` for each function or method (nested ones too) longer than ``limit`` lines,
    its decorators not counted (``end_lineno - lineno + 1``)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1 if node.end_lineno else 0
                if length > limit:
                    found.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_long_functions_only_get_fewer() -> None:
    long = long_functions()
    assert len(long) <= CEILING, (
        f"{len(long)} functions over {MAX_FUNCTION_LINES} lines in builder/, the ceiling is {CEILING}: split the new "
        "one into named steps (do not raise CEILING):\n" + "\n".join(long))


def test_the_count_finds_a_long_function(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    (tmp_path / "pkg" / "m.py").write_text(f"def short():\n{body}\n\n\nasync def long():\n{body}\n    return 1\n")
    expected = f"pkg/m.py:{MAX_FUNCTION_LINES + 3} long ({MAX_FUNCTION_LINES + 1} lines)"
    assert long_functions(tmp_path / "pkg") == [expected]  # the 60-line one is not counted
