"""The pip toolchain: a complete CUDA >= 13 compiler provisioned from PyPI into a cached CUDA_HOME.

NVIDIA publishes `cuda-toolkit[nvcc,crt,nvvm,cccl,cudart]` for CUDA 13.x; it unpacks a CUDA home at
``site-packages/nvidia/cu13``. Every 13.x minor PyPI carries is served (the list is discovered:
torchindex.toolkit_versions; 13.2 provisioned and checked here on 2026-12-01). CUDA 12.x has no compiler on PyPI
(nvidia-cuda-nvcc-cu12 ships only ptxas, libnvvm and headers: no nvcc, cicc, cudafe++, fatbinary or nvlink), so
12.x is refused with the alternatives.

A recipe's ``[build] cuda-components`` (model/cudacomponents.py) adds cuda-toolkit's extra of each name (cublas,
cusparse, …: headers and libraries in the same CUDA home). Each component set is its own cached toolkit:
``toolkits/cuda-13.0`` without any (as before components existed), ``toolkits/cuda-13.0+cublas+cusparse`` with
two, so toolkits of different sets never overwrite one another and the recorded CUDA home names the set.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

from builder.core.cachedir import entry_lock, memo_dir
from builder.core.errors import ToolchainError
from builder.core.log import log
from builder.core.settings import Settings
from builder.core.uvtool import run_uv
from builder.discovery.torchindex import toolkit_versions
from builder.model.cuda import CudaVersion
from builder.model.cudacomponents import components_of
from builder.toolchain.base import CudaToolkit, nvcc_version, same_minor

TOOLKIT_EXTRAS = "nvcc,crt,nvvm,cccl,cudart"
MARKER = ".builder-toolkit.json"
# Files without which the toolkit cannot compile; a cached toolkit missing one is provisioned again.
ESSENTIAL = ("bin/nvcc", "bin/ptxas", "bin/fatbinary", "bin/nvlink", "bin/cudafe++", "nvvm/bin/cicc", "include/cuda_runtime.h")


def refuse_cuda12(cuda: CudaVersion) -> ToolchainError:
    return ToolchainError(
        f"--toolchain pip cannot provide CUDA {cuda}: PyPI has no CUDA 12 compiler "
        "(nvidia-cuda-nvcc-cu12 ships ptxas and headers only, no nvcc/cicc)",
        f"use --toolchain docker (a manylinux CUDA {cuda} image) or --toolchain host with CUDA_HOME "
        f"pointing at a CUDA {cuda} install; or build with this toolchain for --cuda 13.0, with a CUDA 13.0 torch",
    )


def provision(cuda: CudaVersion, settings: Settings, components: tuple[str, ...] = ()) -> CudaToolkit:
    """Return a cached CUDA_HOME for ``cuda`` (e.g. 13.0) with the extra ``components`` (a recipe's
    ``[build] cuda-components``, sorted), installing it from PyPI the first time."""
    if cuda.major < 13:
        raise refuse_cuda12(cuda)
    components = tuple(sorted(set(components)))
    target = settings.cache("toolkits") / folder_name(cuda, components)
    with entry_lock(target):
        home = _home_in(target, cuda)
        if home is not None and _healthy(target, home, memo_dir(settings), components):
            version = nvcc_version(home / "bin" / "nvcc", memo_dir(settings))
            log.info(f"toolchain pip: cached CUDA {version}{_with(components)} at {home}")
            return CudaToolkit("pip", home, version, f"pip-provisioned from PyPI{_with(components)} (cached)")
        if target.exists():
            log.warning(f"cached toolkit at {target} is incomplete or damaged; provisioning it again")
            shutil.rmtree(target)
        if settings.offline:
            raise ToolchainError(f"CUDA {cuda}{_with(components)} is not in the toolkit cache and --offline forbids "
                                 "downloading")
        check_on_pypi(cuda, settings)
        return _install(cuda, target, components)


def folder_name(cuda: CudaVersion, components: tuple[str, ...] = ()) -> str:
    """The toolkit's folder in the cache: ``cuda-13.0``, or ``cuda-13.0+cublas+cusparse`` with components."""
    return f"cuda-{cuda.line}" + "".join(f"+{name}" for name in sorted(set(components)))


def _with(components: tuple[str, ...]) -> str:
    return f" with {', '.join(components)}" if components else ""


def cached_home(cuda: CudaVersion, settings: Settings, components: tuple[str, ...] = ()) -> Path | None:
    """The cached, healthy CUDA home for ``cuda`` (with ``components``) if one was provisioned before; never
    downloads (for ``plan``)."""
    components = tuple(sorted(set(components)))
    target = settings.cache_dir / "toolkits" / folder_name(cuda, components)
    home = _home_in(target, cuda)
    return home if home is not None and _healthy(target, home, memo_dir(settings), components) else None


def check_on_pypi(cuda: CudaVersion, settings: Settings) -> None:
    """Refuse a CUDA minor that PyPI's cuda-toolkit does not carry (the list is discovered: torchindex.py)."""
    versions, source = toolkit_versions(settings)
    if versions and cuda.line not in versions:
        raise ToolchainError(
            f"--toolchain pip cannot provide CUDA {cuda.line}: PyPI's cuda-toolkit has "
            f"{', '.join(versions)} ({source})",
            "pick one of those with --cuda, or use --toolchain docker / host",
        )


def _install(cuda: CudaVersion, target: Path, components: tuple[str, ...] = ()) -> CudaToolkit:
    extras = ",".join((TOOLKIT_EXTRAS, *components))  # each component is cuda-toolkit's extra of that name
    requirement = f"cuda-toolkit[{extras}]=={cuda.line}.*"
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        size = "about 100 MB" + (" plus the components'" if components else "")
        with log.status(f"provisioning {requirement} from PyPI ({size}, first time only)"):
            run_uv(["pip", "install", "--quiet", "--target", str(staging), requirement], what="toolkit download")
        home = _home_in(staging, cuda)
        if home is None:
            raise ToolchainError(f"{requirement} installed no nvcc (looked for nvidia/cu{cuda.major}/bin/nvcc)")
        _link_unversioned(home, "cudart")
        for component in components_of(components):
            for name in component.libs:
                _link_unversioned(home, name)
        version = nvcc_version(home / "bin" / "nvcc")
        if not same_minor(version, cuda):
            raise ToolchainError(f"{requirement} gave nvcc {version}, not CUDA {cuda}")
        missing = [f for f in _essential(components) if not (home / f).exists()]
        if missing:
            raise ToolchainError(f"{requirement} lacks {', '.join(missing)}")
        marker = {"nvcc": str(version), "requirement": requirement}
        (staging / MARKER).write_text(json.dumps(marker | {"components": list(components)} if components else marker))
        staging.rename(target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    home = _home_in(target, cuda)
    assert home is not None
    log.info(f"toolchain pip: provisioned CUDA {version}{_with(components)} at {home}")
    return CudaToolkit("pip", home, version, f"pip-provisioned from PyPI{_with(components)}")


def _home_in(target: Path, cuda: CudaVersion) -> Path | None:
    home = target / "nvidia" / f"cu{cuda.major}"
    return home if (home / "bin" / "nvcc").exists() else None


def _essential(components: tuple[str, ...] = ()) -> tuple[str, ...]:
    """ESSENTIAL plus the header of each component."""
    return ESSENTIAL + tuple(f"include/{c.header}" for c in components_of(components))


def _healthy(target: Path, home: Path, memo: Path | None = None, components: tuple[str, ...] = ()) -> bool:
    if not (target / MARKER).exists() or any(not (home / f).exists() for f in _essential(components)):
        return False
    try:
        nvcc_version(home / "bin" / "nvcc", memo)
    except ToolchainError:
        return False
    return True


def _link_unversioned(home: Path, name: str) -> None:
    """The wheels ship lib/libcudart.so.13 (libcublas.so.13, …) only; linking with -lcudart needs the
    unversioned name."""
    lib = home / "lib"
    link = lib / f"lib{name}.so"
    if link.exists() or not lib.is_dir():
        return
    versioned = sorted(lib.glob(f"lib{name}.so.*"))
    if versioned:
        link.symlink_to(versioned[0].name)
