"""A compile's progress read from the build's own output and processes: which translation unit each line or running
compiler is (``compile_step``, ``running_unit``: nvcc, the host compilers, ccache in front), how many units ninja has
(``ninja_units``), and ``CompileProgress``, which turns them into one status line (``[3/7] nvcc x.cu``, the units
running and for how long) and shows a failed unit's compiler error as it fails. stages/compile.py drives it."""

from __future__ import annotations

import contextvars
import json
import re
import statistics
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from builder.core.log import elapsed, log
from builder.core.streaming import Process, descendants, process_cwd
from builder.model.records import BuildRecord

_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]\s+(.*)$")
_NINJA_PREFIX = re.compile(r"^\[\d+/\d+\]\s+")
_SOURCE_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c")
_COMPILERS = re.compile(r"^(nvcc|c\+\+|g\+\+|gcc|cc|clang\+\+|clang|.*-g\+\+|.*-gcc)(-\d+)?$")
_WRAPPERS = ("ccache", "sccache")
# nvcc's intermediates of x.cu, compiled by the host compiler nvcc runs: /tmp/tmpxft_000057d4_00000000-6_x.cudafe1.cpp
_NVCC_ANY = re.compile(r"tmpxft_[0-9a-f]+_[0-9a-f]+-\d+")  # any nvcc temporary, e.g. tmpxft_00000ee3_00000000-2.cpp
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
    if temp is None and _NVCC_ANY.match(name):
        return None  # an nvcc temporary that names no source (tmpxft_…-2.cpp): the nvcc running it is listed
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


@dataclass(frozen=True)
class PastBuild:
    """An earlier build of the same recipe and archs, from its record: its build stage's seconds and MAX_JOBS."""

    seconds: float
    jobs: int


@dataclass(frozen=True)
class ExpectedTime:
    """How long this compile should take, from earlier builds of the same recipe and archs (the wheelhouse's
    records: their ``build`` timing, a compiler-cache hit left out, as that is no compile) scaled from their MAX_JOBS
    to this build's: the work spreads over min(jobs, units) processes, so a build of 4 units gains nothing past 4
    jobs. The median of the scaled times; what else runs on the machine is not known, so it is an estimate."""

    past: tuple[PastBuild, ...]
    jobs: int
    what: str  # "causal-conv1d for sm_120"

    @classmethod
    def from_records(cls, records: Iterable[BuildRecord], package: str, archs: Sequence[str],
                     jobs: int) -> ExpectedTime | None:
        wanted = sorted(archs)
        past = []
        for record in records:
            timings, parallel, cache = record.timings or {}, record.parallel or {}, record.compiler_cache or {}
            if (record.package != package or sorted(record.archs) != wanted or record.variant is not None
                    or not timings.get("build") or cache.get("hits", 0) > 0):
                continue
            past.append(PastBuild(float(timings["build"]), int(parallel.get("max_jobs") or jobs)))
        shown = ", ".join(f"sm_{a}" for a in wanted)
        return cls(tuple(past), jobs, f"{package} for {shown}") if past else None

    @classmethod
    def of_files(cls, paths: Iterable[Path], package: str, archs: Sequence[str], jobs: int) -> ExpectedTime | None:
        """From the record files ``paths`` (a wheelhouse's ``records/<wheel>.json``; the pipeline names them),
        those of ``package``'s wheels read; one that cannot be read is skipped: an estimate never stops a build."""
        module = package.replace("-", "_")
        records = []
        for path in paths:
            if not path.name.startswith(f"{module}-"):
                continue
            try:
                records.append(BuildRecord.from_json(json.loads(path.read_text())))
            except (OSError, ValueError, TypeError, AttributeError):
                continue
        return cls.from_records(records, package, archs, jobs)

    def seconds(self, units: int | None = None) -> float:
        def spread(jobs: int) -> int:
            return max(1, min(jobs, units) if units else jobs)
        return statistics.median(p.seconds * spread(p.jobs) / spread(self.jobs) for p in self.past)

    def describe(self, units: int | None = None) -> str:
        jobs = sorted({p.jobs for p in self.past})
        scaled = "" if jobs == [self.jobs] else f", scaled from MAX_JOBS {'/'.join(map(str, jobs))} to {self.jobs}"
        builds = "build" if len(self.past) == 1 else f"{len(self.past)} builds"
        return (f"about {elapsed(self.seconds(units))}, by the earlier {builds} of {self.what} in this "
                f"wheelhouse's records{scaled} (more while other work shares the cores)")

    def left(self, ran_s: float, units: int | None) -> str:
        """The status line's part: ``about 2m10s left of ~4m40s``, or that it runs past the estimate."""
        total = self.seconds(units)
        if ran_s < total:
            return f"about {elapsed(total - ran_s)} left of ~{elapsed(total)}"
        return f"past the ~{elapsed(total)} earlier builds took"


class CompileProgress:
    """Turns the build into one status line: how many units there are and how many are done, which are running
    and for how long each (``1/4 done; running causal_conv1d_bwd.cu for 3m10s, causal_conv1d_fwd.cu for 40s``),
    with ``expected`` how long is left by earlier builds (``about 1m20s left of ~4m40s``), and the units that failed;
    warnings and upstream noise stay in the log file.

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
                 refresh_s: float = PLAIN_REFRESH_S, clock: Callable[[], float] = time.monotonic,
                 expected: ExpectedTime | None = None) -> None:
        self.update = update
        self.expected = expected  # earlier builds' time, for the line's "about … left"
        self._started = clock()
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
        if parts and self.expected is not None and not self.failed:  # a time, so not part of what was said
            parts.append(self.expected.left(self._clock() - self._started, self.total))
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
