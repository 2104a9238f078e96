"""Running uv (the installer we use for every venv and package install) as a subprocess."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping, Sequence

from .errors import ToolchainError
from .log import log


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
        tail = " | ".join(line for line in result.stderr.strip().splitlines()[-4:] if line.strip())
        raise ToolchainError(f"{what} failed: {tail}")
    return result.stdout
