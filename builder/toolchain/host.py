"""The host toolchain: an existing CUDA install (CUDA_HOME, nvcc on PATH, or /usr/local/cuda*)."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from packaging.version import Version

from builder.core.errors import ToolchainError
from builder.toolchain.base import CudaToolkit, nvcc_version, same_minor


def candidate_homes(env: Mapping[str, str]) -> list[Path]:
    """CUDA homes in the order a user would expect them to win: CUDA_HOME, nvcc on PATH, /usr/local."""
    homes: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if env.get(var):
            homes.append(Path(env[var]))
    nvcc = shutil.which("nvcc", path=env.get("PATH"))
    if nvcc:
        homes.append(Path(nvcc).resolve().parent.parent)
    homes.extend(sorted(Path("/usr/local").glob("cuda-*"), reverse=True))
    homes.append(Path("/usr/local/cuda"))
    unique: list[Path] = []
    for home in homes:
        complete = (home / "bin" / "nvcc").exists() and any(
            (home / inc / "cuda_runtime.h").exists() for inc in ("include", "targets/x86_64-linux/include")
        )  # /usr/local/bin/nvcc may be a wrapper script: its "home" has no headers
        if complete and home.resolve() not in [u.resolve() for u in unique]:
            unique.append(home)
    return unique


def find_host_toolkit(cuda: Version, env: Mapping[str, str], memo: Path | None = None) -> CudaToolkit:
    """The first host toolkit whose nvcc is CUDA ``cuda`` (major.minor); a ToolchainError listing what was found.
    ``memo``: where nvcc's answers are remembered (``nvcc_version``)."""
    seen: list[str] = []
    for home in candidate_homes(env):
        version = nvcc_version(home / "bin" / "nvcc", memo)
        if same_minor(version, cuda):
            return CudaToolkit("host", home, version, f"host CUDA at {home}")
        seen.append(f"{home} is CUDA {version.major}.{version.minor}")
    found = "; ".join(seen) if seen else "no nvcc found (CUDA_HOME unset, nvcc not on PATH, no /usr/local/cuda)"
    raise ToolchainError(
        f"--toolchain host: no CUDA {cuda} toolkit on this machine ({found})",
        f"set CUDA_HOME to a CUDA {cuda} install, or use --toolchain docker"
        + (" or --toolchain pip" if cuda.major >= 13 else ""),
    )
