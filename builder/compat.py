"""The one table of which torch builds exist for which CUDA version on which index.

A C++/CUDA extension must be compiled with the same CUDA major.minor that its torch was built with, and it
runs only with that torch. PyPI carries exactly one CUDA flavour per torch release; PyTorch's own indexes carry
one flavour per index (``.../whl/cu128``), with a ``+cu128`` local label on every wheel.
"""

from __future__ import annotations

from dataclasses import dataclass

from packaging.version import Version

from .errors import UsageError

PYPI_SIMPLE = "https://pypi.org/simple"
PYTORCH_INDEX = "https://download.pytorch.org/whl/{flavour}"


@dataclass(frozen=True)
class TorchIndex:
    """A package index that serves torch, and the torch releases it has per CUDA version."""

    name: str
    url: str
    torch_by_cuda: dict[str, tuple[str, ...]]

    def cuda_of(self, torch: str) -> str | None:
        for cuda, versions in self.torch_by_cuda.items():
            if torch in versions:
                return cuda
        return None


# Measured 2026-11-29 (see shared DESIGN.md): PyPI torch 2.8.0–2.10.0 pull nvidia-cuda-runtime-cu12==12.8.90,
# 2.11.0–2.14.1 pull cuda-toolkit==13.0.x. 2.7.x on PyPI were CUDA 12.6 builds. 2.15.0 is not classified yet.
TORCH_INDEXES: dict[str, TorchIndex] = {
    "pypi": TorchIndex(
        "pypi",
        PYPI_SIMPLE,
        {
            "12.6": ("2.7.0", "2.7.1"),
            "12.8": ("2.8.0", "2.9.0", "2.9.1", "2.10.0"),
            "13.0": ("2.11.0", "2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1"),
        },
    ),
    # PyTorch's own indexes (not reachable from this workplace; from the published index pages).
    "pytorch-cu126": TorchIndex(
        "pytorch-cu126",
        PYTORCH_INDEX.format(flavour="cu126"),
        {"12.6": ("2.6.0", "2.7.0", "2.7.1", "2.8.0", "2.9.0", "2.9.1", "2.10.0")},
    ),
    "pytorch-cu128": TorchIndex(
        "pytorch-cu128",
        PYTORCH_INDEX.format(flavour="cu128"),
        {"12.8": ("2.7.0", "2.7.1", "2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.11.0")},
    ),
    "pytorch-cu129": TorchIndex(
        "pytorch-cu129",
        PYTORCH_INDEX.format(flavour="cu129"),
        {"12.9": ("2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.11.0")},
    ),
    "pytorch-cu130": TorchIndex(
        "pytorch-cu130",
        PYTORCH_INDEX.format(flavour="cu130"),
        {"13.0": ("2.9.0", "2.9.1", "2.10.0", "2.11.0", "2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1")},
    ),
}


def resolve_index(spec: str | None) -> TorchIndex:
    """``None``/``pypi`` → PyPI; a known name; ``cu128``; or any URL (a PyTorch ``/whl/cuXYZ`` URL is classified)."""
    if spec is None or spec == "pypi":
        return TORCH_INDEXES["pypi"]
    if spec in TORCH_INDEXES:
        return TORCH_INDEXES[spec]
    if f"pytorch-{spec}" in TORCH_INDEXES:
        return TORCH_INDEXES[f"pytorch-{spec}"]
    for index in TORCH_INDEXES.values():
        if spec.rstrip("/") == index.url:
            return index
    if "://" not in spec and not spec.startswith("/"):
        raise UsageError(
            f"--torch-index: {spec!r} is neither a URL nor a known index",
            f"known: {', '.join(TORCH_INDEXES)}",
        )
    url = spec if "://" in spec else f"file://{spec}"
    return TorchIndex("custom", url.rstrip("/"), {})


def cuda_flavour(cuda: Version) -> str:
    """``12.8`` → ``cu128`` (the spelling of PyTorch's indexes and of our local labels)."""
    return f"cu{cuda.major}{cuda.minor}"


def default_torch(index: TorchIndex, cuda: Version) -> str:
    """The newest torch on ``index`` built for ``cuda``; a clear error when there is none."""
    key = f"{cuda.major}.{cuda.minor}"
    versions = index.torch_by_cuda.get(key)
    if not versions:
        where = ", ".join(f"{c}: {v[0]}–{v[-1]}" for c, v in index.torch_by_cuda.items()) or "nothing known"
        raise UsageError(
            f"no torch build for CUDA {key} is known on index {index.name} ({where})",
            "pass --torch X.Y.Z (and --torch-index for PyTorch's cuXYZ index), or another --cuda",
        )
    return max(versions, key=Version)


def check_torch_matches_cuda(index: TorchIndex, torch: str, cuda: Version) -> None:
    """Refuse a torch whose CUDA differs from the requested one on an index we can classify."""
    found = index.cuda_of(str(Version(torch).public))
    key = f"{cuda.major}.{cuda.minor}"
    if found is not None and found != key:
        alternatives = [n for n, i in TORCH_INDEXES.items() if torch in i.torch_by_cuda.get(key, ())]
        hint = (
            f"use --torch-index {alternatives[0]}" if alternatives else f"use --cuda {found}"
        ) + f", or omit --torch to get {default_torch_or_none(index, cuda) or 'the default'}"
        raise UsageError(f"torch {torch} on {index.name} is a CUDA {found} build, not CUDA {key}", hint)


def default_torch_or_none(index: TorchIndex, cuda: Version) -> str | None:
    try:
        return default_torch(index, cuda)
    except UsageError:
        return None


def table_rows() -> list[tuple[str, str, str]]:
    """(index, cuda, torch versions) rows, for ``builder torch-table`` and the docs."""
    return [
        (index.name, cuda, ", ".join(versions))
        for index in TORCH_INDEXES.values()
        for cuda, versions in index.torch_by_cuda.items()
    ]
