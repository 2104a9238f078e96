"""The kernel-test runner: output streamed into the log, a hung suite stopped at the recipe's timeout with its
worker processes, and the stop reported as a test failure (nothing published)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from builder.testing import run_streaming

CHILD_AND_GRANDCHILD = """
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("grandchild", grandchild.pid, flush=True)
print("case 1 passed", flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (already dead, not yet reaped by its parent) counts as dead
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_output_is_streamed_and_exit_code_kept(tmp_path: Path) -> None:
    log_file = tmp_path / "kernel-tests.log"
    code, last = run_streaming([sys.executable, "-c", "print('a'); print('b', flush=True); raise SystemExit(3)"],
                               tmp_path, dict(os.environ), log_file, 60, "testing")
    assert code == 3 and last == "b"
    assert log_file.read_text().splitlines() == ["a", "b"]


def test_a_hung_suite_is_stopped_with_its_workers(tmp_path: Path) -> None:
    log_file = tmp_path / "kernel-tests.log"
    start = time.monotonic()
    code, last = run_streaming([sys.executable, "-c", CHILD_AND_GRANDCHILD], tmp_path, dict(os.environ),
                               log_file, 5, "testing")
    assert code is None
    assert time.monotonic() - start < 30
    text = log_file.read_text()
    assert "case 1 passed" in text and "stopped by the builder after 5 s" in text
    grandchild = int(text.split("grandchild ")[1].split()[0])
    for _ in range(50):
        if not _alive(grandchild):
            break
        time.sleep(0.1)
    assert not _alive(grandchild)


def test_status_heartbeat_outside_a_terminal(capsys) -> None:  # type: ignore[no-untyped-def]
    """In CI logs (no terminal) a long step prints its latest line at most once per heartbeat."""
    from builder.log import log

    with log.status("compiling", heartbeat_s=0.0) as update:
        update("[1/3] nvcc binding.cu")
    with log.status("compiling", heartbeat_s=3600.0) as update:
        update("[2/3] never shown")
    err = capsys.readouterr().err
    assert "compiling: [1/3] nvcc binding.cu" in err and "never shown" not in err
