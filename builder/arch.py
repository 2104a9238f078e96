"""GPU architecture parsing (``--arch 90,120+ptx``) and what each CUDA release can compile."""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.version import Version

from .errors import UsageError

_ARCH_RE = re.compile(r"^(sm_|compute_)?(\d{2,3})([af]?)(\+ptx)?$", re.IGNORECASE)


@dataclass(frozen=True, order=True)
class Arch:
    """One requested GPU architecture: ``120`` is sm_120 SASS; ``ptx`` also embeds compute_120 PTX."""

    number: int
    suffix: str = ""  # "a" or "f" (arch-specific / family-specific features), usually empty
    ptx: bool = False

    @property
    def sm(self) -> str:
        return f"sm_{self.number}{self.suffix}"

    @property
    def compute(self) -> str:
        return f"compute_{self.number}{self.suffix}"

    @property
    def torch_name(self) -> str:
        """The TORCH_CUDA_ARCH_LIST spelling: ``12.0``, ``9.0a``, ``12.0+PTX``."""
        major, minor = divmod(self.number, 10)
        return f"{major}.{minor}{self.suffix}" + ("+PTX" if self.ptx else "")

    def __str__(self) -> str:
        return f"{self.number}{self.suffix}" + ("+ptx" if self.ptx else "")


def parse_arch_list(text: str) -> tuple[Arch, ...]:
    """Parse ``"90,120+ptx"`` (also ``sm_90``, ``9.0``, ``12.0+PTX``, ``;`` separators)."""
    archs: list[Arch] = []
    for raw in re.split(r"[,;\s]+", text.strip()):
        if not raw:
            continue
        item = raw
        dotted = re.match(r"^(\d+)\.(\d)([af]?)(\+ptx)?$", item, re.IGNORECASE)
        if dotted:
            item = f"{dotted.group(1)}{dotted.group(2)}{dotted.group(3)}{dotted.group(4) or ''}"
        match = _ARCH_RE.match(item)
        if not match:
            raise UsageError(
                f"--arch: {raw!r} is not a GPU architecture",
                "use compute capabilities such as 90, 100, 120 or 120+ptx, comma-separated",
            )
        archs.append(Arch(int(match.group(2)), match.group(3).lower(), bool(match.group(4))))
    if not archs:
        raise UsageError("--arch is empty", "give at least one architecture, e.g. --arch 120")
    return tuple(sorted(set(archs)))


def torch_arch_list(archs: tuple[Arch, ...]) -> str:
    return ";".join(a.torch_name for a in archs)


def format_arch_list(archs: tuple[Arch, ...]) -> str:
    return ",".join(str(a) for a in archs)


# Which real architectures (SASS) each CUDA release's nvcc accepts (``nvcc --list-gpu-arch``).
# CUDA 13.0 dropped everything below Turing (sm_75); 12.8 added Blackwell (100, 101, 120),
# 12.9 added 103 and 121; 13.0 renamed Thor's sm_101 to sm_110.
_SUPPORTED_ARCHS: dict[str, tuple[int, ...]] = {
    "12.4": (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90),
    "12.6": (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90),
    "12.8": (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 120),
    "12.9": (50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90, 100, 101, 103, 120, 121),
    "13.0": (75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121),
}


def supported_archs(cuda: Version) -> tuple[int, ...] | None:
    """The SASS archs nvcc of this CUDA major.minor can build, or None when we have no table."""
    key = f"{cuda.major}.{cuda.minor}"
    if key in _SUPPORTED_ARCHS:
        return _SUPPORTED_ARCHS[key]
    if cuda.major == 13:  # later 13.x minors keep 13.0's list (and may add to it)
        return _SUPPORTED_ARCHS["13.0"]
    return None


def check_archs_for_cuda(archs: tuple[Arch, ...], cuda: Version) -> None:
    """Refuse an arch this CUDA release cannot compile, before anything is downloaded."""
    known = supported_archs(cuda)
    if known is None:
        return
    for arch in archs:
        if arch.number not in known:
            raise UsageError(
                f"--arch {arch}: CUDA {cuda} cannot compile sm_{arch.number}",
                f"CUDA {cuda} builds {', '.join(map(str, known))}",
            )
