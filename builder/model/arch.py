"""GPU architecture parsing (``--arch 90,120+ptx``), what each CUDA release can compile, and per-recipe
known-bad (arch, CUDA) combinations.

What a CUDA release compiles is read from its own nvcc (``nvcc --list-gpu-code`` / ``--list-gpu-arch``) where one is at hand: a
pip-provisioned toolkit in the cache, or the nvcc on PATH / in CUDA_HOME when its release matches. The answer is
cached per nvcc (``<cache>/index/nvcc-archs.json``). The table below answers otherwise.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from builder.core.cachedir import memo_dir
from builder.core.errors import UsageError
from builder.core.filememo import remembered
from builder.core.fsutil import atomic_write
from builder.core.settings import Settings
from builder.core.statefile import read_json_or_none
from builder.model.cuda import CudaVersion

_ARCH_RE = re.compile(r"^(sm_|compute_)?(\d{2,3})([af]?)(\+ptx)?$", re.IGNORECASE)


@dataclass(frozen=True, order=True)
class Arch:
    """One requested GPU architecture: ``120`` is sm_120 SASS; ``ptx`` also embeds compute_120 PTX."""

    number: int
    suffix: str = ""  # "a" or "f" (arch-specific / family-specific features), usually empty
    ptx: bool = False

    @property
    def code(self) -> str:
        """The arch without PTX: ``120``, ``90a``; nvcc's names put ``sm_`` or ``compute_`` before it."""
        return f"{self.number}{self.suffix}"

    @property
    def sm(self) -> str:
        return "sm_" + self.code

    @property
    def compute(self) -> str:
        return "compute_" + self.code

    @property
    def torch_name(self) -> str:
        """The TORCH_CUDA_ARCH_LIST spelling: ``12.0``, ``9.0a``, ``12.0+PTX``."""
        major, minor = divmod(self.number, 10)
        return f"{major}.{minor}{self.suffix}" + ("+PTX" if self.ptx else "")

    def __str__(self) -> str:
        return self.code + ("+ptx" if self.ptx else "")


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


def table_archs(cuda: CudaVersion) -> tuple[int, ...] | None:
    """The table's answer: SASS archs nvcc of this CUDA major.minor can build, or None when it has no row."""
    if cuda.line in _SUPPORTED_ARCHS:
        return _SUPPORTED_ARCHS[cuda.line]
    if cuda.major == 13:  # later 13.x minors keep 13.0's list (and may add to it)
        return _SUPPORTED_ARCHS["13.0"]
    return None


@dataclass(frozen=True)
class ArchSupport:
    """What one CUDA release compiles: SASS (sm_XX) and PTX (compute_XX) numbers, and where that was read."""

    sass: tuple[int, ...]
    ptx: tuple[int, ...]
    source: str  # "nvcc 13.2.78 at /path (nvcc --list-gpu-code)" or "builder/arch.py table"


def parse_gpu_list(text: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``nvcc --list-gpu-code`` / ``--list-gpu-arch`` output (``sm_120``, ``compute_120``) → (SASS, PTX) numbers."""
    sass = sorted({int(m.group(1)) for m in re.finditer(r"\bsm_(\d+)[af]?\b", text)})
    ptx = sorted({int(m.group(1)) for m in re.finditer(r"\bcompute_(\d+)[af]?\b", text)})
    return tuple(sass), tuple(ptx)


_NVCC_RELEASE = re.compile(r"release (\d+\.\d+), V(\d+\.\d+\.\d+)")


def parse_nvcc_version(text: str) -> Version | None:
    """nvcc's full version from its ``--version`` text (``Cuda compilation tools, release 13.0, V13.0.88`` →
    13.0.88; its major.minor is the release); None where the text has no such line. The one reading of that
    text: the toolkit probes (toolchain/base.py, toolchain/container.py) and the lookups below use it."""
    match = _NVCC_RELEASE.search(text)
    return Version(match.group(2)) if match else None


def nvcc_arch_support(nvcc: Path, settings: Settings | None = None) -> ArchSupport:
    """Ask ``nvcc`` itself (cached per nvcc path and file identity)."""
    stat = nvcc.resolve().stat()
    key = f"v2:{nvcc.resolve()}:{stat.st_size}:{int(stat.st_mtime)}"
    cache = settings.cache("index") / "nvcc-archs.json" if settings is not None else None
    known: dict[str, Any] = {}
    if cache is not None:  # damaged (not JSON, a fifo, a folder, odd entries): nvcc is asked again, the file rewritten
        read = read_json_or_none(cache)
        known = read if isinstance(read, dict) else {}
    entry = known.get(key)
    if isinstance(entry, dict) and all(isinstance(entry.get(k), list) and all(isinstance(a, str) for a in entry[k])
                                       for k in ("sass", "ptx")):
        return ArchSupport(tuple(entry["sass"]), tuple(entry["ptx"]), str(entry.get("source", "")))
    def run(*args: str) -> str:
        return subprocess.run([str(nvcc), *args], capture_output=True, text=True, timeout=60, check=True).stdout

    version = parse_nvcc_version(run("--version"))
    sass, _ = parse_gpu_list(run("--list-gpu-code"))  # sm_XX: the SASS it can emit
    _, ptx = parse_gpu_list(run("--list-gpu-arch"))  # compute_XX: the virtual archs (PTX)
    source = f"nvcc {version or '?'} at {nvcc} (--list-gpu-code/--list-gpu-arch)"
    if cache is not None:
        known[key] = {"sass": list(sass), "ptx": list(ptx), "source": source,
                      "release": CudaVersion.of(version).line if version else None}
        atomic_write(cache, json.dumps(known, indent=1))
    return ArchSupport(sass, ptx, source)


def _nvcc_release(nvcc: Path, settings: Settings | None = None) -> str | None:
    """``nvcc --version``'s major.minor, remembered keyed by nvcc's file identity (core/filememo.py)."""
    memo = memo_dir(settings) if settings is not None else None
    return remembered(memo, "nvcc-release", [nvcc], ["--version"], lambda: _ask_release(nvcc))


def _ask_release(nvcc: Path) -> str | None:
    try:
        text = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60,
                              check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    version = parse_nvcc_version(text)
    return CudaVersion.of(version).line if version else None


def nvcc_at_hand(cuda: CudaVersion, settings: Settings | None, env: Mapping[str, str] = os.environ) -> Path | None:
    """An nvcc of this CUDA major.minor that is already here: the pip toolkit cache, CUDA_HOME or PATH."""
    key = cuda.line
    candidates: list[Path] = []
    if settings is not None:
        candidates.append(settings.cache_dir / "toolkits" / f"cuda-{key}" / "nvidia" / f"cu{cuda.major}" / "bin" / "nvcc")
    if env.get("CUDA_HOME"):
        candidates.append(Path(env["CUDA_HOME"]) / "bin" / "nvcc")
    on_path = shutil.which("nvcc", path=env.get("PATH"))
    if on_path:
        candidates.append(Path(on_path))
    for nvcc in candidates:
        if nvcc.is_file() and _nvcc_release(nvcc, settings) == key:
            return nvcc
    return None


def arch_support(cuda: CudaVersion, settings: Settings | None = None, env: Mapping[str, str] = os.environ) -> ArchSupport | None:
    """What CUDA ``cuda`` compiles: from its nvcc where one is at hand, else from the table (None: unknown)."""
    nvcc = nvcc_at_hand(cuda, settings, env) if settings is not None else None
    if nvcc is not None:
        try:
            return nvcc_arch_support(nvcc, settings)
        except (OSError, subprocess.SubprocessError, KeyError):
            pass
    table = table_archs(cuda)
    return ArchSupport(table, table, "builder/arch.py table") if table is not None else None


def supported_archs(cuda: CudaVersion, settings: Settings | None = None) -> tuple[int, ...] | None:
    """The SASS archs nvcc of this CUDA major.minor can build, or None when nothing says."""
    support = arch_support(cuda, settings)
    return support.sass if support else None


def check_archs_for_cuda(archs: tuple[Arch, ...], cuda: CudaVersion, settings: Settings | None = None) -> None:
    """Refuse an arch this CUDA release cannot compile, before anything is downloaded."""
    support = arch_support(cuda, settings)
    if support is None:
        return
    for arch in archs:
        if arch.number not in support.sass:
            raise UsageError(
                f"--arch {arch}: CUDA {cuda} cannot compile sm_{arch.number}",
                f"CUDA {cuda} builds {', '.join(map(str, support.sass))} (from {support.source})",
            )
        if arch.ptx and arch.number not in support.ptx:
            raise UsageError(f"--arch {arch}: CUDA {cuda} cannot emit compute_{arch.number} PTX",
                             f"PTX for {', '.join(map(str, support.ptx))} (from {support.source})")


# ---------------------------------------------------------------- per-recipe known-bad combinations


@dataclass(frozen=True)
class KnownBad:
    """A recipe's ``[[known-bad]]``: SASS for ``archs`` from a CUDA inside ``cuda`` is refused (for package
    versions inside ``versions``), with the reason and the arch list to use ``instead``."""

    archs: tuple[str, ...]  # "103", "103a": matched against the SASS an --arch item asks for
    cuda: SpecifierSet
    reason: str
    instead: str | None = None
    versions: SpecifierSet | None = None

    def matches(self, arch: Arch, cuda: CudaVersion, version: str) -> bool:
        if self.versions is not None and not self.versions.contains(Version(version), prereleases=True):
            return False
        if not self.cuda.contains(cuda.version, prereleases=True):
            return False
        return any(_same_sass(bad, arch) for bad in self.archs)


def _same_sass(bad: str, arch: Arch) -> bool:
    match = re.fullmatch(r"(?:sm_)?(\d{2,3})([af]?)", bad.strip().lower())
    return match is not None and int(match.group(1)) == arch.number and (not match.group(2) or match.group(2) == arch.suffix)


def check_known_bad(package: str, known_bad: Sequence[KnownBad], archs: tuple[Arch, ...], cuda: CudaVersion,
                    version: str) -> None:
    """Refuse a combination the recipe knows gives wrong code, naming the reason and the alternative."""
    for entry in known_bad:
        for arch in archs:
            if entry.matches(arch, cuda, version):
                raise UsageError(
                    f"--arch {arch}: {arch.sm} code of {package} {version} from CUDA {cuda} is "
                    f"known bad: {entry.reason}",
                    f"use --arch {entry.instead} instead" if entry.instead else "leave this arch out",
                )


def runs_on(sass: tuple[str, ...], ptx: tuple[str, ...], cc: int) -> bool:
    """Whether a GPU of compute capability ``cc`` (120) can run this code.

    SASS for X.y runs on X.z with z >= y (arch-specific ``a`` SASS only on X.y itself); PTX for XY is compiled by
    the driver for any GPU of XY or newer.
    """
    for name in sass:
        match = re.fullmatch(r"sm_(\d+)(\w?)", name)
        if not match:
            continue
        number, suffix = int(match.group(1)), match.group(2)
        if suffix == "a" and number == cc:
            return True
        if suffix != "a" and number // 10 == cc // 10 and number % 10 <= cc % 10:
            return True
    for name in ptx:
        match = re.fullmatch(r"compute_(\d+)(\w?)", name)
        if match and not match.group(2) and int(match.group(1)) <= cc:
            return True
    return False
