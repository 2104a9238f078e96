"""The build stage: one wheel from the patched source, built by the toolchain's BuildHost, against the pinned torch.

Every toolchain builds through ``BuildHost.build_wheel``: pip and host with pypa/build's ProjectBuilder here
(toolchain/frontend.py), the docker toolchain with cibuildwheel in its image (toolchain/cibw.py). Each host names
its own build step on the console (the ProjectBuilder, or the cibuildwheel command it runs) and feeds its output
lines through the one loop of core/streaming.py. This stage owns what is the same for all of them: the log file
(one per target), the console lines, the compile progress (a failed unit's error shown when it fails), and on
failure the one summary: the log's tail, its most telling line and the units that failed.
"""

from __future__ import annotations

import contextvars
import os
import re
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from builder.core.errors import BuildFailed
from builder.core.log import elapsed, log
from builder.core.settings import memory_slots
from builder.core.streaming import Process, descendants, process_cwd
from builder.model.arch import Arch
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
                cores: int | None = None, slots: int | None = None) -> Parallelism:
    """MAX_JOBS as given; nvcc threads for a multi-arch list, bounded by cores and memory (one nvcc thread holds
    a whole cicc and ptxas); ptxas threads where the toolkit takes the flag and the recipe did not turn it off."""
    if toolkit is None:
        return Parallelism(max_jobs=jobs)
    cores = cores or os.cpu_count() or 1
    slots = slots or memory_slots()
    threads = min(len(archs), cores, slots) if len(archs) > 1 else 1
    flags = toolkit.nvcc_flags_for(ptxas_split=ptxas_split)
    split = any(f.startswith("--ptxas-options=--split-compile=") for f in flags)
    return Parallelism(max_jobs=jobs, nvcc_threads=threads, ptxas_threads=PTXAS_THREADS if split else 1)


def build_wheel(request: WheelRequest, host: BuildHost = LOCAL) -> Path:
    """Build one wheel; returns its path. On failure raises BuildFailed with the log's tail."""
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
            live = log.console.is_terminal and not log.quiet  # log.status's spinner: its line is redrawn
            with log.status("compiling", each_change=True) as update:
                progress = CompileProgress(update, refresh_s=LIVE_TICK_S if live else PLAIN_REFRESH_S)
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


_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]\s+(.*)$")
_NINJA_PREFIX = re.compile(r"^\[\d+/\d+\]\s+")
_SOURCE_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c")
_COMPILERS = re.compile(r"^(nvcc|c\+\+|g\+\+|gcc|cc|clang\+\+|clang|.*-g\+\+|.*-gcc)(-\d+)?$")
_WRAPPERS = ("ccache", "sccache")
# nvcc's intermediates of x.cu, compiled by the host compiler nvcc runs: /tmp/tmpxft_000057d4_00000000-6_x.cudafe1.cpp
_NVCC_TEMP = re.compile(r"tmpxft_[0-9a-f]+_[0-9a-f]+-\d+_(.+?)\.(?:cudafe1\.(?:cpp|c)|cpp\d\.ii|stub\.c|fatbin\.c)$")


def _unit_source(words: Sequence[str]) -> str | None:
    """The translation unit a compiler command line works on, by name: the last source file on it (torch's ninja
    lines say `-c -c SRC`, so not simply the word after -c); an nvcc temporary stands for its CUDA source
    (``tmpxft_…_x.cudafe1.cpp`` → ``x.cu``: nvcc names its intermediates after the .cu file it compiles)."""
    sources = [w for w in words if w.endswith(_SOURCE_SUFFIXES) and not w.startswith("-")]
    if not sources:
        return None
    name = Path(sources[-1]).name
    temp = _NVCC_TEMP.fullmatch(name)
    return f"{temp.group(1)}.cu" if temp else name


def compile_step(line: str) -> str | None:
    """A compile command as a short step: ``[3/4] nvcc causal_conv1d_bwd.cu``, ``[4/4] link x.so`` or
    ``c++ binding.cpp`` (setuptools without ninja); setuptools' ``running build_ext`` passes as it
    is; None for anything else (warnings, notes, upstream noise)."""
    line = line.strip()
    if line == "running build_ext":  # setuptools' other stages take no time worth a line
        return line
    match = _NINJA_STEP.match(line)
    words = (match.group(3) if match else line).split()
    while words and Path(words[0]).name in _WRAPPERS:
        words = words[1:]
    if not words or not (match or _COMPILERS.match(Path(words[0]).name)):
        return None
    prefix = f"[{match.group(1)}/{match.group(2)}] " if match else ""
    tool = Path(words[0]).name
    if (source := _unit_source(words[1:])) is not None:
        return f"{prefix}{tool} {source}"
    if "-o" in words[:-1]:
        return f"{prefix}link {Path(words[words.index('-o') + 1]).name}"
    return f"{prefix}{tool}" if match else None


_NINJA_FAILED = "FAILED: "
_NINJA_STOPPED = "ninja: build stopped"
FAILURE_LINES = 40  # of a failed unit's compiler output on the console (the log file has all of it)
LIVE_TICK_S = 1.0  # a terminal's status line: the running units' clocks tick every second
PLAIN_TICK_S = 2.0  # a log (CI): how often the running units are sampled (a unit that starts or ends: a line)
PLAIN_REFRESH_S = 26.0  # a log: the running units' times, a line this often; under log.status's 30 s heartbeat,
#                         which so stays quiet while the units are seen (no two lines for one moment)
SHOWN_RUNNING = 4  # running units named on the line; more are counted


def running_unit(argv: Sequence[str]) -> str | None:
    """The unit a compiler process works on, by its command line: the source's name (``causal_conv1d_fwd.cu``:
    nvcc, and the host compiler nvcc runs on its ``tmpxft_…_causal_conv1d_fwd.cudafe1.cpp``, alike),
    ``link x.so`` for a shared-library link, None for anything else (ninja, python, cicc and ptxas)."""
    words = list(argv)
    while words and Path(words[0]).name in _WRAPPERS:
        words = words[1:]
    if not words or not _COMPILERS.match(Path(words[0]).name):
        return None
    if (source := _unit_source(words[1:])) is not None:
        return source
    if "-shared" in words and "-o" in words[:-1]:
        return f"link {Path(words[words.index('-o') + 1]).name}"
    return None


_NINJA_EDGE = re.compile(r"^build\s+(?:[^:$]|\$.)+:\s*(\S+)")


def ninja_units(text: str) -> int:
    """How many steps a build.ninja file holds: its ``build`` edges, ``phony`` ones left out (torch's file has one
    edge per translation unit, plus a device link when the extension asks for one)."""
    return sum(1 for line in text.splitlines() if (m := _NINJA_EDGE.match(line)) and m.group(1) != "phony")


def _ninja_file(argv: Sequence[str], cwd: Path) -> Path:
    """The build file a ninja command line reads: ``-f FILE`` relative to ``-C DIR`` relative to its cwd."""
    words = list(argv[1:])
    folder, name = cwd, "build.ninja"
    for flag, i in ((w, i) for i, w in enumerate(words) if i + 1 < len(words)):
        if flag == "-C":
            folder = folder / words[i + 1]
        elif flag == "-f":
            name = words[i + 1]
    return folder / name


class CompileProgress:
    """Turns the build into one status line: how many units there are and how many are done, which are running
    and for how long each (``1/4 done; running causal_conv1d_bwd.cu for 3m10s, causal_conv1d_fwd.cu for 40s``),
    and the units that failed; warnings and upstream noise stay in the log file.

    Where it comes from. ninja, writing into a pipe (not a terminal), prints a step's ``[n/N] command`` line when
    the step *ends*: it gives the count done and the total, but nothing until the first unit ends (19 minutes of a
    cold causal-conv1d on a loaded 2-core machine). So ``sample`` (called every few seconds by ``watching``) reads
    the processes under the builder (core/streaming.descendants): the compilers running now, each named by the
    source on its command line and timed by its kernel start time, and ninja's own build file (its cwd, -C, -f),
    whose edges are the total before any step ends. The processes are the truth for "what runs": ninja starts up
    to MAX_JOBS edges in an order of its own (critical path first in ninja 1.12, file order before), skips edges
    that are up to date and may run a ccache hit for a second, so the build file's edges minus the finished ones
    would only guess. A build whose compilers are not below this process (a container's: its engine starts them)
    shows no compiler; then the line is what ninja printed: ``n/N done (latest nvcc x.cu)`` and the failed units.

    A unit that fails is shown when it fails. For a failed step ninja prints ``FAILED: <outputs>``, its command
    again and the compiler's output, all at once; it then waits for the units still running (a long nvcc: many
    minutes) before ``ninja: build stopped``. So on ``FAILED:`` the unit is named and its compiler output goes to
    ``report`` as it comes (FAILURE_LINES of it), the repeated command is not taken for a new step, and the line
    says which units it waits for; ``failed`` lists such units.

    ``update`` gets a new line when what it says changes (a unit started, ended or failed) and, while units run,
    every ``refresh_s`` with their times (a terminal: every second; a log: PLAIN_REFRESH_S)."""

    def __init__(self, update: Callable[[str], None], report: Callable[[str], None] = log.error, *,
                 processes: Callable[[], list[Process] | None] | None = descendants,
                 refresh_s: float = PLAIN_REFRESH_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.update = update
        self.report = report
        self.current = ""  # the latest step as compile_step reads it (``[2/4] nvcc x.cu``, ``link x.so``)
        self.failed: list[str] = []  # units ninja reported FAILED, as their steps read (``c++ x.cpp``)
        self.done = 0  # steps ninja reported ended (its n), of the current ninja run
        self.total: int | None = None  # its N, else the edges of its build file; None: not known (yet)
        self.running: dict[str, float] = {}  # unit -> seconds it has run, at the last sample
        self._processes = processes
        self._seen_compiler = False  # a compiler was ever seen below us: the running set is real, not unknown
        self._ninja_pid: int | None = None
        self._refresh_s = refresh_s
        self._clock = clock
        self._shown: tuple[object, ...] | None = None  # what the last line said, times left out
        self._shown_at = 0.0
        self._lock = threading.RLock()  # lines come from the output loop, samples from the watcher's thread
        self._outputs = ""  # a FAILED line's outputs, until the command after it names the unit
        self._failure_shown: int | None = None  # lines of the failing unit's output shown; None: not in one

    def __call__(self, line: str) -> None:
        with self._lock:
            if line.startswith(_NINJA_FAILED):
                self._outputs, self._failure_shown = line[len(_NINJA_FAILED):].strip(), None
                return
            if self._outputs:  # the failed step's command, repeated by ninja: it names the unit, it is no new step
                self._unit_failed(line)
                return
            if self._failure_shown is not None:
                if not (_NINJA_STEP.match(line) or line.startswith(_NINJA_STOPPED)):
                    self._show_failure(line)
                    return
                self._failure_shown = None
            step = compile_step(line)
            if match := _NINJA_STEP.match(line):
                self.done, self.total = int(match.group(1)), int(match.group(2))
                if step is not None:  # the unit ended: off the running list before the next sample says so
                    self.running.pop(step.split()[-1], None)
            if step is not None and step != self.current:
                self.current = step
                self._show()

    def sample(self) -> None:
        """Read the processes under the builder: the running units and their times, ninja's build file for the
        total; then show the line if it changed (or its times are due)."""
        found = self._processes() if self._processes is not None else None
        with self._lock:
            if found is not None:
                running: dict[str, float] = {}
                for process in found:
                    if (unit := running_unit(process.argv)) is not None:
                        running[unit] = max(running.get(unit, 0.0), process.age_s)
                ninjas = [p for p in found if Path(p.argv[0]).name == "ninja"]
                if ninjas and self._ninja_pid not in {p.pid for p in ninjas}:  # the oldest: a fork is no new run
                    self._new_ninja(max(ninjas, key=lambda p: p.age_s))
                self._seen_compiler = self._seen_compiler or bool(running)
                self.running = running
            self._show()

    def _new_ninja(self, process: Process) -> None:
        """A ninja started: its build file's edges are the total until it prints its own; a second ninja (another
        extension of the same package) starts its count from 0."""
        if self._ninja_pid is not None:
            self.done, self.total = 0, None
        self._ninja_pid = process.pid
        cwd = process_cwd(process.pid)
        if cwd is not None and self.total is None:
            try:
                self.total = ninja_units(_ninja_file(process.argv, cwd).read_text(errors="replace")) or None
            except OSError:
                pass

    @contextmanager
    def watching(self, tick_s: float = PLAIN_TICK_S) -> Iterator[None]:
        """``sample`` every ``tick_s`` in a thread while the build runs (a silent nvcc prints nothing for many
        minutes); a sample that fails is skipped, it never stops the build."""
        done = threading.Event()

        def loop() -> None:
            while not done.wait(tick_s):
                try:
                    self.sample()
                except Exception:  # noqa: BLE001 - progress is a view; the build goes on without it
                    pass

        # the thread sees this context's target prefix (ContextVars are per thread otherwise)
        thread = threading.Thread(target=contextvars.copy_context().run, args=(loop,), daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def line(self) -> tuple[str, tuple[object, ...]]:
        """The status line, and what it says with the times left out (a change of that is worth a line)."""
        parts: list[str] = []
        if self.total is not None:
            parts.append(f"{self.done}/{self.total} done")
        if self.failed:
            parts.append(f"{', '.join(self.failed)} failed")
        oldest = sorted(self.running.items(), key=lambda item: (-item[1], item[0]))
        if oldest:
            shown = [f"{unit} for {elapsed(age)}" for unit, age in oldest[:SHOWN_RUNNING]]
            more = f" and {len(oldest) - SHOWN_RUNNING} more" if len(oldest) > SHOWN_RUNNING else ""
            parts.append(("still running " if self.failed else "running ") + ", ".join(shown) + more)
        elif self.failed and (self.total is None or self.done < self.total) and not self._seen_compiler:
            parts.append("waiting for the units still running")
        latest = ""
        if not oldest and not self._seen_compiler and self.current and not self.failed:
            step = _NINJA_PREFIX.sub("", self.current)
            ended = step != self.current  # ninja's line: the step ended; setuptools' own: it starts
            if ended and parts:
                latest = f"(latest {step})"
                parts[-1] += f" {latest}"
            else:
                latest = step
                parts.append(latest)
        text = "; ".join(parts)
        return text, (self.done, self.total, tuple(self.failed), tuple(u for u, _ in oldest), latest)

    def _show(self) -> None:
        text, said = self.line()
        now = self._clock()
        if text and (said != self._shown or (self.running and now - self._shown_at >= self._refresh_s)):
            self._shown, self._shown_at = said, now
            self.update(text)

    def _unit_failed(self, command: str) -> None:
        step = compile_step(command)
        unit = _NINJA_PREFIX.sub("", step) if step else self._outputs
        self.failed.append(unit)
        self._outputs, self._failure_shown = "", 0
        self.report(f"{unit} failed (ninja goes on until the units still running end); its output:")
        self._show()

    def _show_failure(self, line: str) -> None:
        assert self._failure_shown is not None
        self._failure_shown += 1
        if self._failure_shown <= FAILURE_LINES:
            self.report("  " + (line if len(line) <= 300 else line[:299] + "…"))
        elif self._failure_shown == FAILURE_LINES + 1:
            self.report("  … (the rest is in the build log)")


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
