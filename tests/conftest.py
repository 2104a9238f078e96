"""Shared fixtures: running the real CLI, temporary recipe trees, the local torch index."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
# torch 2.14.1 (a CUDA 13.0 build) and its nvidia wheels lie on this workplace's disk for Python 3.11.
LOCAL_TORCH_INDEX = Path("/opt/pypi-more/simple")


def local_cuda_path_missing() -> str | None:
    """Why the fast local CUDA path (host nvcc 13.0 + torch 2.14.1 for Python 3.11 on disk) is unusable, or None."""
    if not LOCAL_TORCH_INDEX.is_dir():
        return f"no local torch index at {LOCAL_TORCH_INDEX}"
    if not shutil.which("nvcc"):
        return "no nvcc on PATH"
    if not shutil.which("python3.11") and not list(Path.home().glob(".pyenv/versions/3.11.*/bin/python3.11")):
        return "no Python 3.11 interpreter"
    return None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="run slow tests (full upstream builds)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--run-slow"):
        return
    skip = pytest.mark.skip(reason="slow test: full upstream build, run by hand with --run-slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        return [l for l in self.stderr.splitlines() if l.startswith("error:")]


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: int = 1800) -> CliResult:
    """Run the real ``builder`` command line in a subprocess."""
    full_env = {**os.environ, **(env or {}), "COLUMNS": "200"}
    result = subprocess.run(
        [sys.executable, "-m", "builder", *args],
        capture_output=True, text=True, env=full_env, cwd=cwd or ROOT, timeout=timeout,
    )
    return CliResult(result.returncode, result.stdout, result.stderr)


# Runs the CLI like ``python -m builder`` with an audit hook noting each subprocess the builder process starts.
_AUDITED = r"""
import json, os, sys
started = []
def hook(event, args):
    if event == "subprocess.Popen":
        started.append([os.fspath(a) for a in (args[1] if isinstance(args[1], (list, tuple)) else [args[1]])])
sys.addaudithook(hook)
from builder.cli.main import main
try:
    code = main(sys.argv[1:])
finally:
    with open(os.environ["BUILDER_TEST_SPAWNS"], "w") as f:
        json.dump(started, f)
sys.exit(code)
"""


def run_cli_audited(*args: str, spawns: Path, env: dict[str, str] | None = None) -> tuple[CliResult, list[list[str]]]:
    """``run_cli``, also returning the argv of every subprocess the builder process started (children of those
    are not seen)."""
    full_env = {**os.environ, **(env or {}), "COLUMNS": "200", "BUILDER_TEST_SPAWNS": str(spawns)}
    result = subprocess.run([sys.executable, "-c", _AUDITED, *args], capture_output=True, text=True, env=full_env,
                            cwd=ROOT, timeout=1800)
    return CliResult(result.returncode, result.stdout, result.stderr), json.loads(spawns.read_text())


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """A private cache and wheelhouse for one test."""
    return {"BUILDER_CACHE_DIR": str(tmp_path / "cache"), "BUILDER_WHEELHOUSE": str(tmp_path / "wheelhouse")}


@pytest.fixture
def recipe_tree(tmp_path: Path) -> Path:
    """A copy of the fixture recipes/patches/sources that a test may edit; returns its recipes/ folder."""
    root = tmp_path / "tree"
    for name in ("recipes", "patches", "tinyext"):
        shutil.copytree(FIXTURES / name, root / name)
    return root / "recipes"


def assert_one_line_error(result: CliResult, *needles: str) -> None:
    """A user error: non-zero exit, exactly one 'error:' line naming the cause, no traceback."""
    assert result.code != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert len(result.error_lines) == 1, result.stderr
    for needle in needles:
        assert needle in result.error_lines[0], result.error_lines[0]
