"""pipeline/chain.py: the one order of a wheel's checks, and every command's checks run through it."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from builder.model.builtwheel import BuiltWheel
from builder.pipeline.chain import ORDER, Checked, run_chain

PIPELINE = Path(__file__).resolve().parents[1] / "builder" / "pipeline"
STEP_CALLS = {"inspect", "test", "torch_range", "with_gpu_check", "variants", "publish", "run_tests",
              "check_torch_range"}


def _state(tmp_path: Path) -> Checked:
    return Checked(BuiltWheel.made(tmp_path / "tinyext-0.1.0+cu13-cp310-abi3-linux_x86_64.whl", None))


def test_steps_run_in_the_chains_order_whatever_order_they_are_given(tmp_path: Path) -> None:
    ran: list[str] = []
    steps = {name: (lambda state, name=name: ran.append(name)) for name in reversed(ORDER)}
    timings: dict[str, float] = {}
    run_chain(_state(tmp_path), steps, timings=timings, announce=False)
    assert ran == list(ORDER) and list(timings) == list(ORDER)
    ran.clear()
    run_chain(_state(tmp_path), {"publish": steps["publish"], "inspect": steps["inspect"]}, announce=False)
    assert ran == ["inspect", "publish"]


def test_an_unknown_step_fails_before_any_runs(tmp_path: Path) -> None:
    ran: list[str] = []
    with pytest.raises(ValueError, match="no step 'promote'; the steps are inspect, test, torch range"):
        run_chain(_state(tmp_path), {"inspect": lambda s: ran.append("inspect"), "promote": lambda s: None})
    assert ran == []


def test_a_failing_step_stops_the_chain(tmp_path: Path) -> None:
    ran: list[str] = []

    def test(state: Checked) -> None:
        raise RuntimeError("kernel tests failed")

    with pytest.raises(RuntimeError):
        run_chain(_state(tmp_path), {"test": test, "publish": lambda s: ran.append("publish")}, announce=False)
    assert ran == []


def _outer_functions(tree: ast.AST) -> dict[int, str]:
    """line → the name of the top-level function (or "<module>") each line belongs to, and whether nested."""
    owner: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            nested = any(isinstance(n, ast.FunctionDef) and n is not node and node in ast.walk(n)
                         for n in ast.walk(tree))
            for line in range(node.lineno, (node.end_lineno or node.lineno) + 1):
                if nested or line not in owner:
                    owner[line] = ("step " if nested else "") + node.name
    return owner


def test_pipeline_commands_call_the_check_steps_only_from_chain_steps() -> None:
    """build (run.py), `builder test` (promote.py), `builder variants` (builtvariants.py) and `builder verify`
    (verify.py) call a check step (checks.inspect, run_tests, checks.publish, ...) only inside a function they hand
    to run_chain, so none of them can run the checks in an order of its own."""
    outside = []
    for name in ("run.py", "promote.py", "builtvariants.py", "verify.py"):
        tree = ast.parse((PIPELINE / name).read_text())
        owner = _outer_functions(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                via_checks = isinstance(func, ast.Attribute) and getattr(func.value, "id", "") == "checks"
                if called in STEP_CALLS and (via_checks or called in ("run_tests", "check_torch_range")):
                    where = owner.get(node.lineno, "<module>")
                    if not where.startswith("step ") and where != "_record_new":
                        outside.append(f"{name}:{node.lineno} {called} in {where}")
    assert not outside, outside
    assert "run_chain" in (PIPELINE / "run.py").read_text()
