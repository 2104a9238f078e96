"""Run a subprocess with its output streamed into a log file line by line, the latest line offered as progress.

Used by the compile (build.py, through pypa/build's runner hook) and by the kernel tests (testing.py), which also
need a time limit: then the child runs in its own process group, and the whole group (worker processes too) is
killed when the limit passes or when the builder is interrupted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TextIO


def stream(argv: Sequence[str], *, out: TextIO, on_line: Callable[[str], None], cwd: str | os.PathLike | None = None,
           env: Mapping[str, str] | None = None, timeout_s: float | None = None) -> tuple[int | None, str]:
    """Run argv, write stdout+stderr into `out` as they come, call on_line(each non-empty line, stripped, whole:
    the compile progress needs the end of nvcc's long command lines to name the translation unit).

    Returns (exit code, last non-empty line); the exit code is None when timeout_s passed and the child's process
    group was killed.
    """
    last = ""
    own_group = timeout_s is not None
    proc = subprocess.Popen(list(argv), cwd=cwd, env=None if env is None else dict(env), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=own_group)
    stopped = threading.Event()

    def stop() -> None:
        stopped.set()
        _kill_group(proc)

    timer = threading.Timer(timeout_s, stop) if timeout_s is not None else None
    if timer is not None:
        timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            out.flush()
            if line.strip():
                last = line.strip()
                on_line(last)
        code = proc.wait()
    finally:
        if timer is not None:
            timer.cancel()
        if own_group and proc.poll() is None:  # interrupted (Ctrl-C, SIGTERM): leave no GPU job behind
            _kill_group(proc)
            proc.wait()
    return (None if stopped.is_set() else code), last


def _kill_group(proc: subprocess.Popen) -> None:  # type: ignore[type-arg]
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
