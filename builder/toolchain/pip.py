"""The pip toolchain: a complete CUDA >= 13 compiler provisioned from PyPI into a cached CUDA_HOME.

NVIDIA publishes `cuda-toolkit[nvcc,crt,nvvm,cccl,cudart]` for CUDA 13.x; it unpacks a CUDA home at
``site-packages/nvidia/cu13``. Every 13.x minor PyPI carries is served (the list is discovered:
torchindex.toolkit_versions; 13.2 provisioned and checked here on 2026-12-01). CUDA 12.x has no compiler on PyPI
(nvidia-cuda-nvcc-cu12 ships only ptxas, libnvvm and headers: no nvcc, cicc, cudafe++, fatbinary or nvlink), so
12.x is refused with the alternatives.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from packaging.version import Version

from builder.core.cachedir import entry_lock, memo_dir
from builder.core.errors import ToolchainError
from builder.core.log import log
from builder.core.settings import Settings
from builder.core.uvtool import run_uv
from builder.toolchain.base import CudaToolkit, nvcc_version, same_minor

TOOLKIT_EXTRAS = "nvcc,crt,nvvm,cccl,cudart"
MARKER = ".builder-toolkit.json"
# Files without which the toolkit cannot compile; a cached toolkit missing one is provisioned again.
ESSENTIAL = ("bin/nvcc", "bin/ptxas", "bin/fatbinary", "bin/nvlink", "bin/cudafe++", "nvvm/bin/cicc", "include/cuda_runtime.h")


def refuse_cuda12(cuda: Version) -> ToolchainError:
    return ToolchainError(
        f"--toolchain pip cannot provide CUDA {cuda}: PyPI has no CUDA 12 compiler "
        "(nvidia-cuda-nvcc-cu12 ships ptxas and headers only, no nvcc/cicc)",
        f"use --toolchain docker (a manylinux CUDA {cuda} image) or --toolchain host with CUDA_HOME "
        f"pointing at a CUDA {cuda} install; or build with this toolchain for --cuda 13.0, with a CUDA 13.0 torch",
    )


def provision(cuda: Version, settings: Settings) -> CudaToolkit:
    """Return a cached CUDA_HOME for ``cuda`` (e.g. 13.0), installing it from PyPI the first time."""
    if cuda.major < 13:
        raise refuse_cuda12(cuda)
    key = f"cuda-{cuda.major}.{cuda.minor}"
    root = settings.cache("toolkits")
    target = root / key
    with entry_lock(target):
        home = _home_in(target, cuda)
        if home is not None and _healthy(target, home, memo_dir(settings)):
            version = nvcc_version(home / "bin" / "nvcc", memo_dir(settings))
            log.info(f"toolchain pip: cached CUDA {version} at {home}")
            return CudaToolkit("pip", home, version, "pip-provisioned from PyPI (cached)")
        if target.exists():
            log.warning(f"cached toolkit at {target} is incomplete or damaged; provisioning it again")
            shutil.rmtree(target)
        if settings.offline:
            raise ToolchainError(f"CUDA {cuda} is not in the toolkit cache and --offline forbids downloading")
        check_on_pypi(cuda, settings)
        return _install(cuda, target)


def cached_home(cuda: Version, settings: Settings) -> Path | None:
    """The cached, healthy CUDA home for ``cuda`` if one was provisioned before; never downloads (for ``plan``)."""
    target = settings.cache_dir / "toolkits" / f"cuda-{cuda.major}.{cuda.minor}"
    home = _home_in(target, cuda)
    return home if home is not None and _healthy(target, home, memo_dir(settings)) else None


def check_on_pypi(cuda: Version, settings: Settings) -> None:
    """Refuse a CUDA minor that PyPI's cuda-toolkit does not carry (the list is discovered: torchindex.py)."""
    from builder.discovery.torchindex import toolkit_versions

    versions, source = toolkit_versions(settings)
    if versions and f"{cuda.major}.{cuda.minor}" not in versions:
        raise ToolchainError(
            f"--toolchain pip cannot provide CUDA {cuda.major}.{cuda.minor}: PyPI's cuda-toolkit has "
            f"{', '.join(versions)} ({source})",
            "pick one of those with --cuda, or use --toolchain docker / host",
        )


def _install(cuda: Version, target: Path) -> CudaToolkit:
    requirement = f"cuda-toolkit[{TOOLKIT_EXTRAS}]=={cuda.major}.{cuda.minor}.*"
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        with log.status(f"provisioning {requirement} from PyPI (about 100 MB, first time only)"):
            run_uv(["pip", "install", "--quiet", "--target", str(staging), requirement], what="toolkit download")
        home = _home_in(staging, cuda)
        if home is None:
            raise ToolchainError(f"{requirement} installed no nvcc (looked for nvidia/cu{cuda.major}/bin/nvcc)")
        _fix_cudart_link(home)
        version = nvcc_version(home / "bin" / "nvcc")
        if not same_minor(version, cuda):
            raise ToolchainError(f"{requirement} gave nvcc {version}, not CUDA {cuda}")
        missing = [f for f in ESSENTIAL if not (home / f).exists()]
        if missing:
            raise ToolchainError(f"{requirement} lacks {', '.join(missing)}")
        (staging / MARKER).write_text(json.dumps({"nvcc": str(version), "requirement": requirement}))
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    home = _home_in(target, cuda)
    assert home is not None
    log.info(f"toolchain pip: provisioned CUDA {version} at {home}")
    return CudaToolkit("pip", home, version, "pip-provisioned from PyPI")


def _home_in(target: Path, cuda: Version) -> Path | None:
    home = target / "nvidia" / f"cu{cuda.major}"
    return home if (home / "bin" / "nvcc").exists() else None


def _healthy(target: Path, home: Path, memo: Path | None = None) -> bool:
    if not (target / MARKER).exists() or any(not (home / f).exists() for f in ESSENTIAL):
        return False
    try:
        nvcc_version(home / "bin" / "nvcc", memo)
    except ToolchainError:
        return False
    return True


def _fix_cudart_link(home: Path) -> None:
    """The wheels ship lib/libcudart.so.13 only; linking with -lcudart needs the unversioned name."""
    lib = home / "lib"
    link = lib / "libcudart.so"
    if link.exists() or not lib.is_dir():
        return
    versioned = sorted(lib.glob("libcudart.so.*"))
    if versioned:
        link.symlink_to(versioned[0].name)
