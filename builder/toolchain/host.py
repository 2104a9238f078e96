"""The host toolchain: an existing CUDA install (CUDA_HOME, nvcc on PATH, or /usr/local/cuda*).

A recipe's ``[build] cuda-components`` are looked for as headers in the install (include/cusparse.h, …); an
install without one is refused before anything builds, naming the package that brings it."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

from builder.core.errors import ToolchainError
from builder.model.cuda import CudaVersion
from builder.model.cudacomponents import CudaComponent, components_of
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


def find_host_toolkit(cuda: CudaVersion, env: Mapping[str, str], memo: Path | None = None,
                      components: tuple[str, ...] = ()) -> CudaToolkit:
    """The first host toolkit whose nvcc is CUDA ``cuda`` (major.minor) and that has the headers of every one of
    ``components`` (a recipe's cuda-components); a ToolchainError listing what was found.
    ``memo``: where nvcc's answers are remembered (``nvcc_version``)."""
    seen: list[str] = []
    lacking: list[tuple[Path, tuple[CudaComponent, ...]]] = []
    for home in candidate_homes(env):
        version = nvcc_version(home / "bin" / "nvcc", memo)
        if same_minor(version, cuda):
            missing = missing_components(home, components)
            if not missing:
                return CudaToolkit("host", home, version, f"host CUDA at {home}")
            lacking.append((home, missing))
            continue
        seen.append(f"{home} is CUDA {CudaVersion.of(version).line}")
    if lacking:
        raise _lacks(cuda, *lacking[0])
    found = "; ".join(seen) if seen else "no nvcc found (CUDA_HOME unset, nvcc not on PATH, no /usr/local/cuda)"
    raise ToolchainError(
        f"--toolchain host: no CUDA {cuda} toolkit on this machine ({found})",
        f"set CUDA_HOME to a CUDA {cuda} install, or use --toolchain docker"
        + (" or --toolchain pip" if cuda.major >= 13 else ""),
    )


def missing_components(home: Path, components: tuple[str, ...]) -> tuple[CudaComponent, ...]:
    """Those of ``components`` whose header is in neither include/ nor targets/x86_64-linux/include of ``home``."""
    return tuple(c for c in components_of(components)
                 if not any((home / inc / c.header).exists() for inc in ("include", "targets/x86_64-linux/include")))


def _lacks(cuda: CudaVersion, home: Path, missing: tuple[CudaComponent, ...]) -> ToolchainError:
    line = cuda.line
    what = ", ".join(f"{c.name} (include/{c.header})" for c in missing)
    debs = " ".join(c.deb(line) for c in missing)
    rpms = " ".join(c.rpm(line) for c in missing)
    return ToolchainError(
        f"--toolchain host: CUDA {line} at {home} lacks {what}, which the recipe's [build] cuda-components "
        "asks for",
        f"install cuda-libraries-dev-{line.replace('.', '-')}, or just {debs} (rpm: {rpms}); "
        "or use --toolchain " + ("pip or docker" if cuda.major >= 13 else "docker"),
    )
