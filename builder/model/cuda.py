"""A CUDA release as the builder names it: ``13.0``, ``12.8`` (a patch such as ``13.0.1`` is kept where given).

Compared by its line (major.minor) where a farm decides whether two names mean the same CUDA; written back as
given (``str``), so a cache key or record that names it does not change."""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import Version

# The CUDA lines the container toolchain's one Dockerfile template builds an image for, on every platform (NVIDIA's
# rhel8 x86_64 and sbsa repositories carry each one's packages): a new line is one entry here
# (toolchain/images.py builds them; discovery/compat.py counts them among the known lines).
IMAGE_CUDAS = ("12.8", "12.9", "13.0", "13.2")


@dataclass(frozen=True, order=True)
class CudaVersion:
    release: tuple[int, ...]

    @classmethod
    def parse(cls, text: str) -> CudaVersion:
        """``"13.0"`` → 13.0; raises packaging's InvalidVersion for text that is not a version."""
        return cls(Version(text).release)  # as given: "13" stays "13" (str(Version) is what keys and records say)

    @property
    def major(self) -> int:
        return self.release[0]

    @property
    def minor(self) -> int:
        return self.release[1] if len(self.release) > 1 else 0

    @property
    def line(self) -> str:
        """``13.0`` for 13.0 and 13.0.1: the CUDA line torch builds and toolkits are made for."""
        return f"{self.major}.{self.minor}"

    @property
    def version(self) -> Version:
        return Version(str(self))

    @classmethod
    def of(cls, version: Version) -> CudaVersion:
        """A packaging ``Version`` (an nvcc release, a requirement's pin) as a CUDA version: its release part."""
        return cls(version.release)

    @property
    def flavour(self) -> str:
        """``cu130`` for 13.0 and 13.0.1: the spelling of PyTorch's indexes and of the builder's local labels."""
        return f"cu{self.major}{self.minor}"

    @classmethod
    def from_flavour(cls, flavour: str) -> CudaVersion | None:
        """``cu128`` → 12.8 (the last digit is the minor); None for text that is not such a flavour."""
        match = re.fullmatch(r"cu(\d+)(\d)", flavour)
        return cls((int(match.group(1)), int(match.group(2)))) if match else None

    def same_line(self, other: CudaVersion) -> bool:
        return (self.major, self.minor) == (other.major, other.minor)

    def __str__(self) -> str:
        return ".".join(map(str, self.release))
