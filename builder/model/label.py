"""A wheel's local label, the one grammar of ``+cu13``, ``+cu13torch2.9`` and ``+cu130torch2.14``: parsed here
(``Label.parse``) and printed here (``str(Label)``), nowhere else (tests/test_architecture.py fails on a label
regex in another module).

    cu<major>                      a stable-ABI wheel of one CUDA major, every torch from its floor: cu13
    cu<major>torch<X>.<Y>          a per-torch wheel by CUDA major (two digits), torch minor X.Y: cu12torch2.9
    cu<major><minor>torch<X>.<Y>   a per-torch wheel by CUDA line (three digits or more), the older shape and every
                                   channel's name: cu130torch2.14

The digits of a line are PyTorch's CUDA flavour (``cu130``: the last digit is the minor), read by
``CudaVersion.from_flavour`` (model/cuda.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from packaging.version import Version

from builder.model.cuda import CudaVersion

_GRAMMAR = re.compile(r"cu(\d+)(?:torch(\d+)\.(\d+))?")


class LabelKind(StrEnum):
    STABLE = "stable"  # cu13
    PER_TORCH_MAJOR = "per-torch by CUDA major"  # cu13torch2.14
    PER_TORCH_LINE = "per-torch by CUDA line"  # cu130torch2.14 (and a channel's name)


@dataclass(frozen=True, order=True)
class Label:
    """One parsed local label: its CUDA major, the line's minor (a line's label only) and the torch minor (a
    per-torch label only)."""

    cuda_major: int
    cuda_minor: int | None = None  # 0 of cu130torch2.14; None for cu13 and cu13torch2.14
    torch: tuple[int, int] | None = None  # (2, 14); None for a stable label

    @classmethod
    def parse(cls, text: str | None) -> Label | None:
        """``cu13`` / ``cu13torch2.9`` / ``cu130torch2.14`` → a Label; None for no label or one of another shape
        (``cu9torch2.1``, ``cpu``)."""
        match = _GRAMMAR.fullmatch(text or "")
        if match is None:
            return None
        digits, torch = match.group(1), (int(match.group(2)), int(match.group(3))) if match.group(2) else None
        if torch is None:
            return cls(int(digits))
        if len(digits) == 2:
            return cls(int(digits), None, torch)
        line = CudaVersion.from_flavour(f"cu{digits}")
        return cls(line.major, line.minor, torch) if line is not None else None

    @classmethod
    def stable(cls, cuda: CudaVersion) -> Label:
        """A stable-ABI wheel's: the CUDA major only (``cu13``), no torch."""
        return cls(cuda.major)

    @classmethod
    def per_torch(cls, cuda: CudaVersion, torch: str) -> Label:
        """A per-torch wheel's: its CUDA major and torch minor (``cu12torch2.9``)."""
        return cls(cuda.major, None, _minor(torch))

    @classmethod
    def channel(cls, cuda: CudaVersion | str, torch: str) -> Label:
        """The channel of ``torch`` built for CUDA line ``cuda`` (``13.0``): ``cu130torch2.12``."""
        line = CudaVersion.parse(cuda) if isinstance(cuda, str) else cuda
        return cls(line.major, line.minor, _minor(torch))

    @property
    def kind(self) -> LabelKind:
        if self.torch is None:
            return LabelKind.STABLE
        return LabelKind.PER_TORCH_MAJOR if self.cuda_minor is None else LabelKind.PER_TORCH_LINE

    @property
    def cuda_line(self) -> CudaVersion | None:
        """A line's label's CUDA (``cu130torch2.14`` → 13.0); None for a label that names a major only."""
        return CudaVersion((self.cuda_major, self.cuda_minor)) if self.cuda_minor is not None else None

    @property
    def torch_text(self) -> str | None:
        """``2.14`` of ``cu13torch2.14``; None for a stable label."""
        return f"{self.torch[0]}.{self.torch[1]}" if self.torch is not None else None

    def __str__(self) -> str:
        cuda = f"cu{self.cuda_major}" + ("" if self.cuda_minor is None else str(self.cuda_minor))
        return cuda if self.torch is None else f"{cuda}torch{self.torch[0]}.{self.torch[1]}"


def _minor(torch: str) -> tuple[int, int]:
    v = Version(torch)
    return v.major, v.minor
