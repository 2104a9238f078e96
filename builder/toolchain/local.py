"""Builds on this machine (the pip and host toolchains, and pure-Python builds): commands run as subprocesses.

Also where this machine's interpreters are found: PATH, pyenv, uv-managed Pythons.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from builder.core.errors import ToolchainError
from builder.core.filememo import remembered
from builder.core.log import log
from builder.core.streaming import stream
from builder.core.uvtool import uv_bin
from builder.toolchain.base import (
    NO_MOUNTS,
    PYTHON_PROBE,
    CudaToolkit,
    Mounts,
    PreparedPython,
    RunResult,
    WheelRequest,
)
from builder.toolchain.frontend import pep517_wheel
from builder.toolchain.hostcompiler import host_compiler


class LocalRunner:
    """A ``BuildHost`` that is this machine: paths are what they are, mounts mean nothing and the network
    cannot be turned off (the sources are fetched before the build either way)."""

    where = ""

    def __init__(self, toolkit: CudaToolkit | None = None, *, memo: Path | None = None) -> None:
        self.toolkit = toolkit
        self.memo = memo  # where the answers of compilers and interpreters are remembered (core/filememo.py)
        self.uv = uv_bin()

    def __enter__(self) -> LocalRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        pass

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None,
            mounts: Mounts = NO_MOUNTS, network: bool = True, out: TextIO | None = None,
            on_line: Callable[[str], None] | None = None, timeout_s: float | None = None) -> RunResult:
        env = None if env is None else dict(env)
        if out is not None:
            code, _ = stream(argv, out=out, on_line=on_line or (lambda line: None), cwd=cwd, env=env,
                             timeout_s=timeout_s)
            return RunResult(-1 if code is None else code)
        result = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                                env=env, timeout=timeout_s)
        if on_line is not None:
            for line in result.stdout.splitlines():
                if line.strip():
                    on_line(line.strip())
        return RunResult(result.returncode, result.stdout)

    def path(self, host_path: Path) -> Path:
        return host_path

    def base_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        return dict(environ)

    def prepare_python(self, version: str, torch: str, index_url: str,
                       requirements: Sequence[str]) -> PreparedPython | None:
        return None  # the pyenv stage makes a cached build venv here

    def given_python(self, python: Path) -> Path:
        return Path(shutil.which(str(python)) or python)

    def host_compiler(self, env: Mapping[str, str]) -> dict[str, str] | None:
        return host_compiler(env, self.memo)

    def build_wheel(self, request: WheelRequest, on_line: Callable[[str], None]) -> Path:
        """pypa/build's ProjectBuilder in this process (no ``python -m build`` runs); each PEP 517 hook it calls is
        a command here, echoed into the build log."""
        log.info(f"build step: pypa/build ProjectBuilder with {request.python}, no isolation")
        return pep517_wheel(request, self, on_line)


def interpreter_facts(python: Path, *, with_torch: bool = True, memo: Path | None = None) -> dict[str, str | None]:
    """What ``python`` says about itself (PYTHON_PROBE) when run here; a ToolchainError if it does not run. With
    ``memo`` the answer without torch is remembered keyed by the interpreter's file (core/filememo.py); one with
    torch is always asked, since torch lives elsewhere."""
    if with_torch or memo is None:
        return _ask_interpreter(python, with_torch=with_torch)
    return remembered(memo, "python", [python], [str(python), "--no-torch"],
                      lambda: _ask_interpreter(python, with_torch=False))


def _ask_interpreter(python: Path, *, with_torch: bool) -> dict[str, str | None]:
    try:
        argv = [str(python), "-c", PYTHON_PROBE] + ([] if with_torch else ["--no-torch"])
        result = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolchainError(f"--python {python}: cannot run it: {e}") from e
    if result.returncode != 0:
        raise ToolchainError(f"--python {python}: it fails to start: {result.stderr.strip()[-200:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def find_interpreter(version: str, extra_dirs: Iterable[Path] = (), *, memo: Path | None = None) -> Path:
    """A base interpreter for Python ``version`` (3.12) on this machine: PATH, pyenv, uv-managed, or a clear error."""
    looked: list[str] = []
    for candidate in _interpreter_candidates(version, extra_dirs, looked):
        try:
            found = interpreter_facts(candidate, with_torch=False, memo=memo)
        except ToolchainError:
            continue
        if found["version"] == version:
            return Path(found["executable"] or candidate)
    raise ToolchainError(
        f"no Python {version} interpreter found (looked: {', '.join(looked)})",
        f"install one (`uv python install {version}` or pyenv) or pass --python /path/to/python{version}",
    )


def _interpreter_candidates(version: str, extra_dirs: Iterable[Path], looked: list[str]) -> list[Path]:
    found: list[Path] = []
    looked.append(f"python{version} on PATH")
    if on_path := shutil.which(f"python{version}"):
        found.append(Path(on_path))
    pyenv_root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    looked.append(f"pyenv ({pyenv_root}/versions)")
    pyenv_glob = f"{pyenv_root}/versions/{version}.*/bin/python{version}"
    found += [Path(p) for p in sorted(glob.glob(pyenv_glob), reverse=True)]
    uv_dir = Path(os.environ.get("UV_PYTHON_INSTALL_DIR") or Path.home() / ".local/share/uv/python")
    looked.append(f"uv-managed ({uv_dir})")
    found += [Path(p) for p in sorted(glob.glob(f"{uv_dir}/cpython-{version}.*/bin/python{version}"), reverse=True)]
    for directory in extra_dirs:
        looked.append(str(directory))
        found += [Path(p) for p in glob.glob(f"{directory}/python{version}")]
    return [p for p in found if p.exists()]


LOCAL = LocalRunner()  # this machine without a CUDA toolkit: pure-Python builds, and the default host
