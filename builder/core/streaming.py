"""Run a subprocess with its output streamed into a log file line by line, the latest line offered as progress.

``follow`` is the one output loop of every build: the pip and host toolchains' PEP 517 hooks (``stream``, through
toolchain/local.py), the docker toolchain's containers (toolchain/container.py) and cibuildwheel
(toolchain/cibw.py) all hand their lines to it, so the log file and the compile progress see the same lines
whichever toolchain runs. ``stream`` is also used by the kernel tests (stages/testing.py), which need a time
limit: then the child runs in its own process group, and the whole group (worker processes too) is killed when
the limit passes or when the builder is interrupted.

``descendants`` is what a line-driven loop cannot see: the processes running under this one right now (read from
/proc), so the compile progress can name the units that are compiling and how long each has run before ninja says
anything about them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO


def follow(lines: Iterable[str], *, out: TextIO | None, on_line: Callable[[str], None]) -> str:
    """Write each of ``lines`` into ``out`` as it comes (flushed: the log is read while it grows; a last line
    without its newline gets one) and hand each non-empty line, stripped and whole, to ``on_line`` (the compile
    progress needs the end of nvcc's long command lines to name the translation unit). Returns the last such
    line."""
    last = ""
    for line in lines:
        if out is not None:
            out.write(line if line.endswith("\n") else line + "\n")
            out.flush()
        if line.strip():
            last = line.strip()
            on_line(last)
    return last


def stream(argv: Sequence[str], *, out: TextIO, on_line: Callable[[str], None], cwd: str | os.PathLike | None = None,
           env: Mapping[str, str] | None = None, timeout_s: float | None = None) -> tuple[int | None, str]:
    """Run argv, its stdout+stderr followed into ``out`` and ``on_line`` (``follow``; bytes that are not UTF-8
    are replaced, not fatal: a compiler may quote a source's latin-1 comment).

    Returns (exit code, last non-empty line); the exit code is None when timeout_s passed and the child's process
    group was killed.
    """
    own_group = timeout_s is not None
    proc = subprocess.Popen(list(argv), cwd=cwd, env=None if env is None else dict(env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=own_group)
    stopped = threading.Event()

    def stop() -> None:
        stopped.set()
        _kill_group(proc)

    timer = threading.Timer(timeout_s, stop) if timeout_s is not None else None
    if timer is not None:
        timer.start()
    try:
        assert proc.stdout is not None
        last = follow(proc.stdout, out=out, on_line=on_line)
        code = proc.wait()
    finally:
        if timer is not None:
            timer.cancel()
        if own_group and proc.poll() is None:  # interrupted (Ctrl-C, SIGTERM): leave no GPU job behind
            _kill_group(proc)
            proc.wait()
    return (None if stopped.is_set() else code), last


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@dataclass(frozen=True)
class Process:
    """A process under this one: its id, command line and how long it has run (from the kernel's start time, so
    exact however seldom it is sampled)."""

    pid: int
    argv: tuple[str, ...]
    age_s: float


PROC = Path("/proc")


def descendants(root: int | None = None, proc: Path = PROC) -> list[Process] | None:
    """Every process below ``root`` (this process by default), read from ``proc``; None where it cannot be read
    (no /proc). Processes that end while being read are left out. A container's processes are no descendants
    (its engine starts them), so a containerised build shows none: callers fall back to what its output says."""
    root = os.getpid() if root is None else root
    try:
        uptime = float((proc / "uptime").read_text().split()[0])
        names = [n for n in os.listdir(proc) if n.isdigit()]
    except (OSError, ValueError, IndexError):
        return None
    tick = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    started: dict[int, float] = {}
    for name in names:
        try:
            stat = (proc / name / "stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()  # the command name (in parentheses) may hold spaces
            parent[int(name)], started[int(name)] = int(fields[1]), int(fields[19]) / tick
        except (OSError, ValueError, IndexError):
            continue
    children: dict[int, list[int]] = {}
    for pid, ppid in parent.items():
        children.setdefault(ppid, []).append(pid)
    found: list[Process] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            raw = (proc / str(pid) / "cmdline").read_bytes()
        except OSError:
            continue
        argv = tuple(a.decode(errors="replace") for a in raw.split(b"\0")[:-1]) if raw else ()
        if argv:  # a zombie or kernel thread has none
            found.append(Process(pid, argv, max(0.0, uptime - started[pid])))
    return found


def process_cwd(pid: int, proc: Path = PROC) -> Path | None:
    """The working folder of a process, None when it cannot be read (it ended, or is not ours to read)."""
    try:
        return Path(os.readlink(proc / str(pid) / "cwd"))
    except OSError:
        return None
