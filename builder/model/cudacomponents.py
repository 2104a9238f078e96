"""CUDA components a recipe may ask for beyond the compiler (``[build] cuda-components``), and where each toolchain
finds them: the extra of PyPI's ``cuda-toolkit`` (pip), a header in the CUDA home (host), the NVIDIA repository's
package (docker: rhel8 rpm; host: the Debian/Ubuntu package named in the cure).

A torch extension whose ``.cpp`` includes ``<ATen/cuda/CUDAContext.h>`` needs cublas, cusparse and cusolver
headers (torch's CUDAContextLight.h includes cublas_v2.h, cublasLt.h, cusparse.h and cusolverDn.h); the pip
toolchain's compiler-only toolkit has none of them. Names, extras, headers and packages checked against
cuda-toolkit 13.0.2's METADATA, the nvidia-* 13.0 wheels' files and NVIDIA's rpm names (2026-12).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CudaComponent:
    """One CUDA library (headers and, where it has one, its shared library)."""

    name: str  # what a recipe writes; also cuda-toolkit's extra of that name on PyPI
    header: str  # under the CUDA home's include/: the file whose presence says the component is there
    package: str  # NVIDIA's package stem: rpm ``<stem>-devel-X-Y`` / deb ``<stem>-dev-X-Y``, or as is (no -devel)
    libs: tuple[str, ...] = ()  # shared libraries (lib<name>.so) the component brings, for -l<name>
    devel: bool = True  # whether the package has a -devel/-dev split (nvtx and profiler-api are headers only)

    def rpm(self, cuda_line: str) -> str:
        """The rhel8 rpm for CUDA ``cuda_line`` ("12.8"), e.g. ``libcusparse-devel-12-8``."""
        return f"{self.package}{'-devel' if self.devel else ''}-{cuda_line.replace('.', '-')}"

    def deb(self, cuda_line: str) -> str:
        """The Debian/Ubuntu package for CUDA ``cuda_line``, e.g. ``libcusparse-dev-12-8``."""
        return f"{self.package}{'-dev' if self.devel else ''}-{cuda_line.replace('.', '-')}"


CUDA_COMPONENTS: dict[str, CudaComponent] = {c.name: c for c in (
    CudaComponent("cublas", "cublas_v2.h", "libcublas", ("cublas", "cublasLt")),
    CudaComponent("cusparse", "cusparse.h", "libcusparse", ("cusparse",)),
    CudaComponent("cusolver", "cusolverDn.h", "libcusolver", ("cusolver",)),
    CudaComponent("curand", "curand.h", "libcurand", ("curand",)),
    CudaComponent("cufft", "cufft.h", "libcufft", ("cufft",)),
    CudaComponent("nvrtc", "nvrtc.h", "cuda-nvrtc", ("nvrtc",)),
    CudaComponent("nvjitlink", "nvJitLink.h", "libnvjitlink", ("nvJitLink",)),
    CudaComponent("nvtx", "nvtx3/nvToolsExt.h", "cuda-nvtx", devel=False),
    CudaComponent("profiler", "cuda_profiler_api.h", "cuda-profiler-api", devel=False),
)}


def components_of(names: tuple[str, ...]) -> tuple[CudaComponent, ...]:
    """The components named (already validated: recipe.py), in the given order."""
    return tuple(CUDA_COMPONENTS[n] for n in names)
