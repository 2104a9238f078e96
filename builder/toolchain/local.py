"""Builds on this machine (the pip and host toolchains, and pure-Python builds): commands run as subprocesses.

Also where this machine's interpreters are found: PATH, pyenv, uv-managed Pythons.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TextIO

from builder.core.errors import ToolchainError
from builder.core.filememo import remembered
from builder.core.log import log
from builder.core.smallrun import run_small
from builder.core.streaming import stream
from builder.core.uvtool import uv_bin
from builder.toolchain.base import (
    NO_MOUNTS,
    PROBE_OUTPUT_LIMIT,
    PYTHON_PROBE,
    CudaToolkit,
    Mounts,
    PreparedPython,
    RunResult,
    WheelRequest,
    probe_answer,
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
    if (pyenv_root := pyenv_shim_root(python)) is not None:
        return _shim_facts(python, pyenv_root, memo)
    return remembered(memo, "python", [python], [str(python), "--no-torch"],
                      lambda: _ask_interpreter(python, with_torch=False))


class _FailsToStart(ToolchainError):
    """The interpreter ran and exited non-zero (a pyenv shim whose selected version lacks the command): an answer
    that holds while its inputs do, unlike "cannot run it" (a timeout, a missing file)."""


def _ask_interpreter(python: Path, *, with_torch: bool) -> dict[str, str | None]:
    argv = [str(python), "-c", PYTHON_PROBE] + ([] if with_torch else ["--no-torch"])
    try:  # bounded: an interpreter that floods stdout is stopped, never read whole
        result = run_small(argv, limit=PROBE_OUTPUT_LIMIT, timeout_s=300, merge=False)
    except OSError as e:
        raise ToolchainError(f"--python {python}: cannot run it: {e}") from e
    if result.overflowed:
        raise ToolchainError(f"--python {python}: printed more than {PROBE_OUTPUT_LIMIT} bytes answering the "
                             "interpreter probe; stopped", "give a working Python interpreter (VENV/bin/python)")
    if result.timed_out:
        raise ToolchainError(f"--python {python}: cannot run it: no answer to the interpreter probe within 300 s")
    if result.code != 0:
        raise _FailsToStart(f"--python {python}: it fails to start: {result.errors.strip()[-200:]}")
    lines = result.output.strip().splitlines()
    return probe_answer(lines[-1] if lines else "", python, result.output)


def pyenv_shim_root(path: Path) -> Path | None:
    """The PYENV_ROOT a pyenv shim names (``export PYENV_ROOT="…"`` … ``exec "…/libexec/pyenv" exec``), or None
    when ``path`` is no pyenv shim."""
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return None
    if not head.startswith(b"#!") or b'/libexec/pyenv" exec ' not in head:
        return None
    match = re.search(rb'^export PYENV_ROOT="([^"\n]+)"$', head, re.MULTILINE)
    return Path(os.fsdecode(match.group(1))) if match else None


def pyenv_selection(shim: Path, root: Path, environ: Mapping[str, str] | None = None,
                    cwd: Path | None = None) -> tuple[list[Path], list[str]]:
    """Everything a pyenv shim reads to pick the program it runs, as (files, question) for core/filememo.py: the
    shim and pyenv itself, the version file in force (PYENV_VERSION, else the first ``.python-version`` up from
    PYENV_DIR, then up from the working directory, else ROOT/version: pyenv-version-file), the installed versions
    (ROOT/versions: a version added or removed changes the folder), the plugins, and the variables pyenv reads
    (PATH finds a "system" version)."""
    environ = os.environ if environ is None else environ
    cwd = Path.cwd() if cwd is None else cwd
    files = [shim, root / "libexec" / "pyenv", root / "versions"]
    files += [root / "plugins"] if (root / "plugins").is_dir() else []  # their hooks (pyenv-virtualenv's) run too
    version_file: Path | None = None
    if not environ.get("PYENV_VERSION"):
        starts = [Path(environ.get("PYENV_DIR") or cwd), cwd]
        version_file = next((d / ".python-version" for start in starts for d in (start, *start.parents)
                             if (d / ".python-version").is_file()), None)
        if version_file is None and (root / "version").is_file():
            version_file = root / "version"
    if version_file is not None:
        files.append(version_file)
    variables = [f"{name}={environ.get(name, '')}" for name in
                 ("PYENV_VERSION", "PYENV_DIR", "PYENV_HOOK_PATH", "PYENV_DEBUG", "PATH")]
    return files, [str(shim), "--no-torch", f"version file: {version_file or 'none'}", *variables]


def _shim_facts(shim: Path, root: Path, memo: Path) -> dict[str, str | None]:
    """A pyenv shim resolved to the interpreter it runs, remembered keyed on what selects it (``pyenv_selection``;
    a failure too: hundreds of bash processes per shim call); that interpreter's facts are remembered keyed on its
    own file."""

    def ask() -> dict[str, str | None]:
        try:
            return {"executable": _ask_interpreter(shim, with_torch=False)["executable"]}
        except _FailsToStart as e:
            return {"error": e.message}

    files, question = pyenv_selection(shim, root)
    answer = remembered(memo, "pyenv-shim", files, question, ask, complete=True)
    if answer.get("error") or not answer.get("executable"):
        raise ToolchainError(answer.get("error") or f"--python {shim}: it names no interpreter")
    real = Path(answer["executable"])  # asked as interpreter_facts asks a real file (no shim: no recursion)
    return remembered(memo, "python", [real], [str(real), "--no-torch"],
                      lambda: _ask_interpreter(real, with_torch=False))


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
