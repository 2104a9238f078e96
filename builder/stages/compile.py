"""The build stage: one wheel from the patched source, built by the toolchain's BuildHost, against the pinned torch.

Every toolchain builds through ``BuildHost.build_wheel``: pip and host with pypa/build's ProjectBuilder here
(toolchain/frontend.py), the docker toolchain with cibuildwheel in its image (toolchain/cibw.py). Each host names
its own build step on the console (the ProjectBuilder, or the cibuildwheel command it runs) and feeds its output
lines through the one loop of core/streaming.py. This stage owns what is the same for all of them: the log file
(one per target), the console lines, the compile progress (stages/compileprogress.py: a failed unit's error shown
when it fails), and on failure the one summary: the log's tail, its most telling line and the units that failed.
"""

from __future__ import annotations

import os
import re
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from builder.core.errors import BuildFailed
from builder.core.log import log
from builder.core.settings import NVCC_PEAK_GIB, memory_slots
from builder.model.arch import Arch
from builder.stages.compileprogress import (
    LIVE_TICK_S,
    PLAIN_REFRESH_S,
    PLAIN_TICK_S,
    CompileProgress,
    ExpectedTime,
)
from builder.toolchain.base import PTXAS_THREADS, BuildHost, CudaToolkit, WheelBuildFailed, WheelRequest
from builder.toolchain.local import LOCAL

TAIL_LINES = 25


@dataclass(frozen=True)
class Parallelism:
    """How one build spreads over the machine (docs/BENCHMARKS.md section 9): MAX_JOBS translation units at once;
    nvcc's ``--threads`` (one thread per ``-gencode`` target: a multi-arch list only) and ptxas's split compilation
    (a file's kernels in PTXAS_THREADS threads), which keep the last, longest file from running on one core.
    Neither changes the SASS. ``--threads`` follows the machine and changes no byte of the output, so it is in the
    build log and records/ but not in the wheel or the cache key; ptxas's count is a constant and is in both
    (CudaToolkit.nvcc_flags_for)."""

    max_jobs: int
    nvcc_threads: int = 1  # 1: not passed (the upstream setup.py's own value, if any, stays)
    ptxas_threads: int = 1  # 1: off

    def nvcc_flags(self) -> tuple[str, ...]:
        return (f"--threads={self.nvcc_threads}",) if self.nvcc_threads > 1 else ()

    def record(self) -> dict[str, int]:
        return {"max_jobs": self.max_jobs, "nvcc_threads": self.nvcc_threads, "ptxas_threads": self.ptxas_threads}

    def describe(self) -> str:
        return (f"MAX_JOBS {self.max_jobs}, nvcc --threads {self.nvcc_threads if self.nvcc_threads > 1 else 'not set'}"
                f", ptxas threads {self.ptxas_threads if self.ptxas_threads > 1 else 'off'}")


def parallelism(jobs: int, archs: tuple[Arch, ...], toolkit: CudaToolkit | None, *, ptxas_split: bool,
                cores: int | None = None, slots: int | None = None, peak_gib: float | None = None) -> Parallelism:
    """nvcc threads for a multi-arch list, bounded by cores and memory (one nvcc thread holds a whole cicc and
    ptxas); MAX_JOBS as given, lowered so that jobs × threads heavy processes fit the memory (``slots``, from the
    recipe's measured ``peak_gib`` per process: flash-attn's backward files take 6 GiB each, so a 23 GiB machine
    runs 3 of them, not 4); ptxas threads where the toolkit takes the flag and the recipe did not turn it off."""
    if toolkit is None:
        return Parallelism(max_jobs=jobs)
    cores = cores or os.cpu_count() or 1
    slots = slots or memory_slots(peak_gib)
    threads = min(len(archs), cores, slots) if len(archs) > 1 else 1
    fit = max(1, min(jobs, slots // threads))
    if fit < jobs:
        log.info(f"MAX_JOBS {fit}, not {jobs}: {jobs} jobs × {threads} nvcc thread(s) would not fit this machine's "
                 f"memory ({slots} heavy nvcc processes at {peak_gib or NVCC_PEAK_GIB} GiB each)")
    flags = toolkit.nvcc_flags_for(ptxas_split=ptxas_split)
    split = any(f.startswith("--ptxas-options=--split-compile=") for f in flags)
    return Parallelism(max_jobs=fit, nvcc_threads=threads, ptxas_threads=PTXAS_THREADS if split else 1)


def build_wheel(request: WheelRequest, host: BuildHost = LOCAL, expected: ExpectedTime | None = None,
                estimate_of: str = "") -> Path:
    """Build one wheel; returns its path. On failure raises BuildFailed with the log's tail. ``expected``: how
    long earlier builds of the same recipe and archs took (the progress line counts down from it); where there
    are none, ``estimate_of`` names what had none (``causal-conv1d for sm_120``)."""
    request.out_dir.mkdir(parents=True, exist_ok=True)
    log_file = request.log_file
    log_file.parent.mkdir(parents=True, exist_ok=True)
    log_file.write_text(f"# build of {request.source_dir} with {request.python}{host.where}\n")
    env = request.env
    interesting = ("CUDA_HOME", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NVCC_THREADS")
    log.info("build env: " + " ".join(f"{k}={env[k]}" for k in interesting if k in env))
    start = time.monotonic()
    # pypa/build re-raises the backend's warnings (NumPy's init warning, setuptools' license and deprecation
    # banners) as BuildBackendWarning in this process: they go into the log file, not the console
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        progress: CompileProgress | None = None
        try:
            log.info(f"build log: {log_file}")
            if expected is not None:
                log.info(f"compile time: {expected.describe()}")
            elif estimate_of:
                log.info(f"compile time: no earlier build of {estimate_of} in this wheelhouse's records to estimate "
                         "from (the README gives measured times)")
            live = log.console.is_terminal and not log.quiet  # log.status's spinner: its line is redrawn
            with log.status("compiling", each_change=True) as update:
                progress = CompileProgress(update, refresh_s=LIVE_TICK_S if live else PLAIN_REFRESH_S,
                                           expected=expected)
                with progress.watching(LIVE_TICK_S if live else PLAIN_TICK_S):
                    wheel = host.build_wheel(request, progress)
        except WheelBuildFailed as e:
            _log_warnings(caught, log_file)
            failed = progress.failed if progress is not None else []
            raise build_failed(log_file, host.where, time.monotonic() - start, e, failed) from e
        _log_warnings(caught, log_file)
    log.ok(f"built {wheel.name}{host.where} in {time.monotonic() - start:.0f}s")
    return wheel


def _log_warnings(caught: list[warnings.WarningMessage], log_file: Path) -> None:
    if caught:
        with log_file.open("a") as out:
            out.write("# warnings raised in the builder process during the build (backend warnings):\n")
            out.writelines(warnings.formatwarning(w.message, w.category, w.filename, w.lineno, w.line) for w in caught)


# Upstream output that tells a user nothing about their build: kept in the log file, left out of the console.
_NOISE = (
    re.compile(r"Failed to initialize NumPy"),
    re.compile(r"(SetuptoolsDeprecationWarning|_DeprecatedConfig|InformationOnly|SetuptoolsWarning):"),
    re.compile(r"BuildBackendWarning: (License classifiers are deprecated|.*is deprecated)"),
    re.compile(r"^\s*\*{20,}\s*$"),
)


def console_lines(lines: list[str]) -> list[str]:
    """``lines`` without upstream noise: NumPy's init warning (and the source line Python prints under it) and
    setuptools' deprecation/license banners (a warning line, then a ``!!`` … ``!!`` block of ``****`` rules)."""
    kept: list[str] = []
    in_banner = skip_next = False
    for line in lines:
        if line.strip() == "!!":
            in_banner = not in_banner
            continue
        if in_banner:
            continue
        if skip_next and line.startswith((" ", "\t")):
            skip_next = False
            continue
        skip_next = False
        if any(p.search(line) for p in _NOISE):
            skip_next = "Warning:" in line or "NumPy" in line  # Python's warning format shows the source line next
            continue
        kept.append(line)
    return kept


def build_failed(log_file: Path, where: str, seconds: float, cause: Exception, failed: Sequence[str] = ()
                 ) -> BuildFailed:
    """The one failure summary of every toolchain: the log's tail on the console, and the error whose message is
    the log's most telling line (else the frontend's own word) and names the units that failed."""
    text = log_file.read_text(errors="replace")
    log.error(failure_tail(text, log_file))
    units = f" ({', '.join(failed)} failed)" if failed else ""
    return BuildFailed(f"build failed{where} after {seconds:.0f}s{units}: {_summary(text) or cause}",
                       f"full log: {log_file}")


def failure_tail(text: str, log_file: Path) -> str:
    """The last TAIL_LINES lines of a failed build's log for the console, upstream noise left out."""
    lines = text.splitlines()
    clean = console_lines(lines)
    note = " (upstream noise left out; the file has everything)" if len(clean) != len(lines) else ""
    return f"--- last {TAIL_LINES} lines of {log_file}{note} ---\n" + "\n".join(clean[-TAIL_LINES:])


_COMPILER_ERROR = re.compile(r"(fatal error|error:|error #|: error|nvcc fatal)", re.IGNORECASE)


def _summary(text: str) -> str:
    """The most telling line of a failed build log: the first compiler error, else the last error line."""
    lines = [s.strip() for s in console_lines(text.splitlines()) if s.strip() and not s.startswith("+ ")]
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
