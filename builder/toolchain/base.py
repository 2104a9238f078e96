"""What every toolchain hands to the build stage: a CUDA home with a working nvcc of a known version."""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.version import Version

from builder.core.errors import ToolchainError


@dataclass(frozen=True)
class CudaToolkit:
    """A usable CUDA toolkit. ``kind`` is pip, host or docker; ``version`` is nvcc's full version."""

    kind: str
    cuda_home: Path
    version: Version
    reason: str = ""
    image: str = ""  # docker toolchain: the build image's tag, content ID and registry digest
    image_id: str = ""
    image_digest: str = ""

    @property
    def nvcc(self) -> Path:
        return self.cuda_home / "bin" / "nvcc"

    def build_env(self, base_path: str) -> dict[str, str]:
        """Variables that point torch's cpp_extension and setup.py scripts at this toolkit."""
        return {
            "CUDA_HOME": str(self.cuda_home),
            "CUDA_PATH": str(self.cuda_home),
            "PATH": f"{self.cuda_home / 'bin'}:{base_path}",
        }

    def describe(self) -> str:
        where = f" in {self.image}" if self.image else ""
        return f"{self.kind} (nvcc {self.version} at {self.cuda_home}{where})"

    def record(self) -> dict[str, str]:
        record = {"kind": self.kind, "cuda_home": str(self.cuda_home), "nvcc": str(self.version), "reason": self.reason}
        if self.image:
            record.update(image=self.image, image_id=self.image_id, image_digest=self.image_digest)
        return record

    def with_reason(self, reason: str) -> CudaToolkit:
        return replace(self, reason=reason)


@dataclass(frozen=True)
class ToolchainChoice:
    """The outcome of selection, kept for the plan even when no toolkit could be found."""

    requested: str
    toolkit: CudaToolkit | None
    image: str | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)
    container: object | None = None  # docker toolchain: the ContainerToolchain that runs the build (close it after)


_RELEASE_RE = re.compile(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)")


def nvcc_version(nvcc: Path) -> Version:
    """Run ``nvcc --version`` and return e.g. 13.0.88; a ToolchainError if it does not run."""
    try:
        result = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolchainError(f"{nvcc} does not run: {e}") from e
    match = _RELEASE_RE.search(result.stdout)
    if result.returncode != 0 or not match:
        raise ToolchainError(f"{nvcc} --version failed: {(result.stderr or result.stdout).strip()[-200:]}")
    return Version(match.group(2))


def same_minor(a: Version, b: Version) -> bool:
    return (a.major, a.minor) == (b.major, b.minor)
