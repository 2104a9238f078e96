"""The build stage: pypa/build's ProjectBuilder, no isolation, against the pinned torch of the build env.

The PEP 517 hooks run in the build env's interpreter; their output goes to one log file per target, whose tail
is shown when the build fails.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import build as pypa_build
import pyproject_hooks

from .errors import BuildFailed
from .log import log
from .pythonenv import PythonEnv
from .streaming import stream

TAIL_LINES = 25


class LoggingRunner:
    """A pyproject_hooks runner that streams hook output into ``log_file`` with our build env merged in."""

    def __init__(self, log_file: Path, env: Mapping[str, str]) -> None:
        self.log_file = log_file
        self.env = dict(env)
        self.on_line: Callable[[str], None] = lambda line: None  # progress display hook

    def __call__(self, cmd: Sequence[str], cwd: str | None = None, extra_environ: Mapping[str, str] | None = None) -> None:
        env = {**self.env, **(extra_environ or {})}
        with self.log_file.open("a") as out:
            out.write(f"+ {' '.join(cmd)}\n")
            out.flush()
            code, _ = stream(cmd, out=out, on_line=self.on_line, cwd=cwd, env=env)
        if code != 0:
            raise subprocess.CalledProcessError(code, cmd)


def build_wheel(source_root: Path, python: PythonEnv, env: Mapping[str, str], outdir: Path, log_file: Path) -> Path:
    """Build one wheel; returns its path. On failure raises BuildFailed with the log's tail."""
    outdir.mkdir(parents=True, exist_ok=True)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_text(f"# build of {source_root} with {python.python}\n")
    runner = LoggingRunner(log_file, env)
    interesting = ("CUDA_HOME", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NVCC_THREADS")
    log.info("build env: " + " ".join(f"{k}={env[k]}" for k in interesting if k in env))
    log.command([str(python.python), "-m", "build", "--wheel", "--no-isolation", str(source_root)])
    start = time.monotonic()
    try:
        with log.status(f"compiling (log: {log_file})") as update:
            runner.on_line = update
            project = pypa_build.ProjectBuilder(source_root, python_executable=str(python.python), runner=runner)
            wheel = project.build("wheel", str(outdir))
    except (pypa_build.BuildException, pypa_build.BuildBackendException, subprocess.CalledProcessError,
            pyproject_hooks.BackendUnavailable) as e:
        tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-TAIL_LINES:])
        log.error(f"--- last {TAIL_LINES} lines of {log_file} ---\n{tail}")
        raise BuildFailed(
            f"build failed after {time.monotonic() - start:.0f}s: {_summary(log_file.read_text(errors='replace')) or e}",
            f"full log: {log_file}",
        ) from e
    log.ok(f"built {Path(wheel).name} in {time.monotonic() - start:.0f}s")
    return Path(wheel)


_COMPILER_ERROR = re.compile(r"(fatal error|error:|error #|: error|nvcc fatal)", re.IGNORECASE)


def _summary(text: str) -> str:
    """The most telling line of a failed build log: the first compiler error, else the last error line."""
    lines = [l.strip() for l in text.splitlines() if l.strip() and not l.startswith("+ ")]
    for line in lines:
        if _COMPILER_ERROR.search(line) and "Traceback" not in line and not line.startswith("File "):
            return line[:300]
    for line in reversed(lines):
        if "error" in line.lower():
            return line[:300]
    return lines[-1][:300] if lines else ""


def base_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment builds start from: ours, less variables that would redirect the build or change its
    output behind the cache key's back (nvcc's NVCC_APPEND/PREPEND_FLAGS: a recipe's [build] env sets those)."""
    source = dict(os.environ if env is None else env)
    for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PIP_REQUIRE_VIRTUALENV", "TORCH_CUDA_ARCH_LIST",
                "NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "PYTORCH_NVCC"):
        source.pop(var, None)
    return source


def prefix_map_env(env: Mapping[str, str], maps: Sequence[tuple[Path, str]]) -> dict[str, str]:
    """CFLAGS and NVCC_APPEND_FLAGS that rename the build's own folders inside the objects.

    Without them the wheel names the builder's cache: ``__FILE__`` in TORCH_CHECK of the sources and torch's
    headers, and DWARF's compile directory, carry the absolute build folder and build venv, so the same inputs
    built under another cache path gave another wheel (and told users where our cache was). GCC's
    ``-ffile-prefix-map`` rewrites both; setuptools passes CFLAGS to the C++ compile (torch takes compiler_so),
    nvcc gets it for its host compiler through NVCC_APPEND_FLAGS. Appended to what a recipe sets."""
    # CFLAGS is split on whitespace and nvcc's -Xcompiler on commas: such a path cannot be passed, stays unmapped
    flags = [f"-ffile-prefix-map={old}={new}" for old, new in maps if not re.search(r"[\s,]", str(old))]
    if not flags:
        return {}
    cflags = " ".join([env.get("CFLAGS", ""), *flags]).strip()
    nvcc = " ".join([env.get("NVCC_APPEND_FLAGS", ""), *(f"-Xcompiler={f}" for f in flags)]).strip()
    return {"CFLAGS": cflags, "NVCC_APPEND_FLAGS": nvcc}
