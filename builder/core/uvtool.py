"""Running uv (the installer we use for every venv and package install) as a subprocess."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from builder.core import net
from builder.core.errors import ToolchainError
from builder.core.log import log
from builder.core.net import NetPolicy


def uv_bin() -> str:
    """The uv binary that came with our own dependency ``uv`` (falls back to PATH)."""
    try:
        from uv import find_uv_bin  # here on purpose: without the uv package, the uv on PATH

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        return "uv"


def uv_env(env: Mapping[str, str] | None = None, policy: NetPolicy | None = None) -> dict[str, str]:
    """The environment for a uv process: ``env`` (the process's by default) with the network policy's timeouts
    and retries (``NetPolicy.uv_env``) where ``env`` does not set uv's own, and no progress bars."""
    full_env = dict(os.environ if env is None else env)
    for key, value in (policy or net.current()).uv_env().items():
        full_env.setdefault(key, value)
    full_env.setdefault("UV_NO_PROGRESS", "1")
    return full_env


def run_uv(args: Sequence[str], *, what: str, env: Mapping[str, str] | None = None,
           policy: NetPolicy | None = None) -> str:
    """Run ``uv ARGS`` under the network policy (``run_uv_process``); on failure raise ToolchainError naming
    ``what`` with uv's last lines."""
    result = run_uv_process([uv_bin(), *args], what=what, env=env, policy=policy)
    if result.returncode != 0:
        raise install_failure(what, result.stderr, where=_install_target(args))
    return result.stdout


def run_uv_process(argv: Sequence[str], *, what: str, env: Mapping[str, str] | None = None,
                   policy: NetPolicy | None = None) -> subprocess.CompletedProcess[str]:
    """Run the uv command line ``argv`` with the network policy's environment (``uv_env``), stopped with its
    children after the policy's ``uv_deadline_s`` (uv's own timeout is per read: a server that drips bytes
    never trips it): a ToolchainError naming ``what``. Its output is captured; its exit code is the caller's."""
    policy = policy or net.current()
    log.command(argv)
    try:
        proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=uv_env(env, policy), start_new_session=True)
    except FileNotFoundError as e:
        raise ToolchainError("uv is not installed", "pip install uv (it is a dependency of this tool)") from e
    try:
        stdout, stderr = proc.communicate(timeout=policy.uv_deadline_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        cure = "check the index it downloads from, or raise the limit with BUILDER_UV_DEADLINE=SECONDS"
        raise ToolchainError(f"{what}: uv ran past the {policy.uv_deadline_s:g} s deadline and was stopped", cure) \
            from None
    finally:
        if proc.poll() is None:  # interrupted (Ctrl-C): leave no uv behind
            _kill_group(proc)
    return subprocess.CompletedProcess(list(argv), proc.returncode, stdout, stderr)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.communicate()


# A CUDA build of torch with its nvidia-* libraries fills about 5 GiB of venv (plus the same again in uv's cache
# where the two cannot be hard-linked): below this, a failed install is most likely a full disk.
LOW_DISK_BYTES = 6 * 1024**3


def install_failure(what: str, output: str, *, where: Path | None, limit: int = 600) -> ToolchainError:
    """The error for a failed uv run: its last lines, cut from the front so the root cause (uv prints it last)
    survives, and the fix for a full disk when that is what the output or the free space says."""
    lines = [" ".join(line.split()) for line in output.strip().splitlines() if line.strip()]
    tail = " | ".join(lines[-6:])
    if len(tail) > limit:
        tail = "…" + tail[-limit:]
    hint = None
    free = free_bytes(where) if where is not None else None
    full = "No space left on device" in output or "os error 28" in output
    writing = any(w in output.lower() for w in ("failed to copy", "failed to write", "failed to extract", "os error"))
    if full or (writing and free is not None and free < LOW_DISK_BYTES):
        shown = f"{free / 1024**3:.1f} GiB free" if free is not None else "the disk is full"
        hint = (f"{shown} at {where}: a build venv with a CUDA torch needs about 5 GiB; free space there or "
                "point BUILDER_CACHE_DIR at a larger disk")
    return ToolchainError(f"{what} failed: {tail}", hint)


def warn_if_low_disk(path: Path) -> None:
    """Say before a multi-GiB install, not after it, that the disk may not hold it."""
    free = free_bytes(path)
    if free is not None and free < LOW_DISK_BYTES:
        log.warning(f"only {free / 1024**3:.1f} GiB free at {path}: a build venv with a CUDA torch needs about "
                    "5 GiB; the install may fail for lack of space")


def free_bytes(path: Path) -> int | None:
    """Free bytes on the filesystem holding ``path`` (or its nearest existing parent); None if unknown."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            try:
                return shutil.disk_usage(candidate).free
            except OSError:
                return None
    return None


def _install_target(args: Sequence[str]) -> Path | None:
    """The venv a uv command writes to (``--python PY`` or ``venv DIR``), for the free-space check."""
    args = list(args)
    if args[:1] == ["venv"]:
        return Path(args[-1])
    if "--python" in args and args.index("--python") + 1 < len(args):
        return Path(args[args.index("--python") + 1]).parent.parent
    return None
