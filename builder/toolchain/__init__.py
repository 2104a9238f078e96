"""The toolchain stage: a CUDA toolkit of the requested version (pip-provisioned, host, or container).

``select_toolkit`` is the single entry point; it prints and records which toolchain was chosen and why.
"""

from __future__ import annotations

from builder.toolchain.base import CudaToolkit, ToolchainChoice, nvcc_version
from builder.toolchain.select import TOOLCHAINS, docker_image_for, select_toolkit

__all__ = [
    "CudaToolkit",
    "ToolchainChoice",
    "TOOLCHAINS",
    "docker_image_for",
    "nvcc_version",
    "select_toolkit",
]
