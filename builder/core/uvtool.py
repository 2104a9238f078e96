"""Running uv (the installer we use for every venv and package install) as a subprocess."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from builder.core.errors import ToolchainError
from builder.core.log import log


def uv_bin() -> str:
    """The uv binary that came with our own dependency ``uv`` (falls back to PATH)."""
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        return "uv"


def run_uv(args: Sequence[str], *, what: str, env: Mapping[str, str] | None = None) -> str:
    """Run ``uv ARGS``; on failure raise ToolchainError naming ``what`` with uv's last lines."""
    argv = [uv_bin(), *args]
    log.command(argv)
    full_env = dict(os.environ if env is None else env)
    full_env.setdefault("UV_NO_PROGRESS", "1")
    try:
        result = subprocess.run(argv, capture_output=True, text=True, env=full_env)
    except FileNotFoundError as e:
        raise ToolchainError("uv is not installed", "pip install uv (it is a dependency of this tool)") from e
    if result.returncode != 0:
        raise install_failure(what, result.stderr, where=_install_target(args))
    return result.stdout


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
