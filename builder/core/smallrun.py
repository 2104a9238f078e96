"""Running a program whose answer is small (an interpreter asked about itself): its output bounded in bytes and
time, so a program that floods stdout costs at most ``limit`` bytes of memory and is stopped, never read whole.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SmallRun:
    code: int | None  # None: stopped (too much output, or past the deadline)
    output: str  # stdout (and stderr, when merged), at most ``limit`` bytes of it (undecodable bytes replaced)
    errors: str  # stderr when not merged, at most ``limit`` bytes
    overflowed: bool  # printed more than ``limit`` bytes on one stream: stopped there
    timed_out: bool


def run_small(argv: Sequence[str], *, limit: int = 1 << 20, timeout_s: float = 300.0,
              env: Mapping[str, str] | None = None, merge: bool = True) -> SmallRun:
    """Run ``argv`` keeping at most ``limit`` bytes of its stdout (with its stderr when ``merge``; else stderr is
    kept apart, bounded the same); the process group is killed when it prints more or runs past ``timeout_s``.
    OSError when it cannot start."""
    proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge else subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env=None if env is None else dict(env), start_new_session=True)
    pipes = [p for p in (proc.stdout, proc.stderr) if p is not None]
    fds = [p.fileno() if p is not None else -1 for p in (proc.stdout, proc.stderr)]
    kept = {fd: bytearray() for fd in fds if fd >= 0}
    overflowed = timed_out = False
    deadline = time.monotonic() + timeout_s
    try:
        with selectors.DefaultSelector() as selector:
            for fd in kept:
                selector.register(fd, selectors.EVENT_READ)
            open_fds = len(kept)
            while open_fds and not overflowed:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                for key, _ in selector.select(min(left, 1.0)):
                    fd = int(key.fd)
                    chunk = os.read(fd, 65536)
                    if not chunk:
                        selector.unregister(fd)
                        open_fds -= 1
                        continue
                    room = limit - len(kept[fd])
                    kept[fd] += chunk[:room]
                    if len(chunk) > room:
                        overflowed = True
                        break
        if overflowed or timed_out:
            _kill_group(proc)
        code = proc.wait()
    finally:
        if proc.poll() is None:
            _kill_group(proc)
            proc.wait()
        for p in pipes:
            p.close()
    out, err = (bytes(kept.get(fd, b"")) for fd in fds)
    return SmallRun(None if overflowed or timed_out else code, out.decode("utf-8", "replace"),
                    err.decode("utf-8", "replace"), overflowed, timed_out)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
