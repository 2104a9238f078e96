"""Which torch ABI a build targets, and what a stable-ABI wheel promises.

A ``per-torch`` wheel is compiled against one torch with the ordinary C++ API and runs with that torch minor only:
it is pinned to that minor (``torch>=X.Y.0,<X.Y+1``: the C++ ABI holds across patch releases) and labelled by its CUDA
major, ``+cu12torch2.9`` (``per_torch_label``), as upstream's own release wheels are (``cu12torch2.5``): built on the
oldest CUDA line of that major it serves, it is offered in the channel of each line its torch checks passed on (a 12.8
build beside torch 2.9.1+cu128 and +cu129), so one compile serves both lines. Older wheels labelled by CUDA line
(``+cu128torch2.9``) stay in that line's channel alone. A ``torch-stable`` wheel uses only LibTorch's stable
ABI (torch/csrc/stable, the C shims) and Python's limited API: one ``cp310-abi3`` wheel per CUDA major, pinned
``torch>=FLOOR`` and labelled ``+cu13``, offered for each torch it was verified on (the ``torch-range`` check of
the test stage, stages/torchrange.py). The CUDA major still splits wheels: the .so needs ``libcudart.so.13``. So
the floor of a wheel of CUDA major M is no lower than the first torch whose PyPI build is of major M
(``StableAbi.for_cuda_major``: 2.11 for CUDA 13, PyPI's 2.10.0 being a CUDA 12.8 build), or a resolver pairs the
``+cu13`` wheel with PyPI's torch 2.10.0 (PEP 440 cannot tell ``2.10.0`` from ``2.10.0+cu130``; issue 51).
A per-torch wheel whose recipe has ``[per-torch-abi3]`` for its release (``PerTorchAbi3``) is labelled and pinned like
any per-torch wheel but tagged ``cp310-abi3``: one compile serves every Python of that torch.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from builder.model.cuda import CudaVersion
from builder.model.label import Label


class Abi(StrEnum):
    PER_TORCH = "per-torch"
    TORCH_STABLE = "torch-stable"


ABI_CHOICES = ("auto", *(a.value for a in Abi))  # what --abi and a farm's abi accept


@dataclass(frozen=True)
class AbiChoice:
    """The ABI a build targets and why (``--abi auto`` decided, or the user asked): the plan's "abi choice" row
    and the build record's ``abi_choice``."""

    abi: Abi
    why: str


@dataclass(frozen=True)
class StableAbi:
    """A recipe's ``[stable-abi]``: the releases its stable-ABI port covers, the oldest torch it targets, and the
    torch.ops namespaces whose every op must have a CUDA kernel on each torch the wheel claims."""

    versions: SpecifierSet
    torch_floor: Version  # major.minor: TORCH_TARGET_VERSION and Requires-Dist torch>=
    namespaces: tuple[str, ...]
    python_floor: str = "3.10"  # the abi3 tag's Python (cp310)

    def covers(self, version: str) -> bool:
        return self.versions.contains(Version(version), prereleases=True)

    def admits(self, torch: str) -> bool:
        """Whether a build or run against ``torch`` is at or above the floor (local parts ignored)."""
        return torch_minor(torch) >= (self.torch_floor.major, self.torch_floor.minor)

    @property
    def floor_text(self) -> str:
        return f"{self.torch_floor.major}.{self.torch_floor.minor}"

    def build_env(self) -> dict[str, str]:
        """The patched setup.py reads the floor from here (→ ``-DTORCH_TARGET_VERSION``)."""
        return {"BUILDER_TORCH_FLOOR": self.floor_text}

    @property
    def requirement(self) -> str:
        """What finalize writes as the wheel's torch requirement."""
        return f"torch>={self.floor_text}"

    def for_cuda_major(self, first: Version | None) -> StableAbi:
        """The port as a wheel of one CUDA major offers it: its floor raised to the minor of ``first``, the first
        torch release whose PyPI build is of that major (``first_torch_of_major``), where that is above the recipe's.
        A ``+cu13`` wheel then says ``torch>=2.11`` (PyPI's 2.10.0 is CUDA 12.8) and a ``+cu12`` one keeps the
        recipe's 2.10; None (a major PyPI's torch has not reached): the recipe's floor, and the combined index
        leaves the wheel out (index/channelpolicy.py ``root_lists``). The floor is a minor (TORCH_TARGET_VERSION is one):
        were a major to start at X.Y.1, X.Y.0 of the other major would still be admitted, and ``root_lists`` keeps
        such a wheel out of the combined index."""
        if first is None or (first.major, first.minor) <= (self.torch_floor.major, self.torch_floor.minor):
            return self
        return replace(self, torch_floor=Version(f"{first.major}.{first.minor}"))


@dataclass(frozen=True)
class PerTorchAbi3:
    """A recipe's ``[per-torch-abi3]``: the releases whose per-torch build is Python-agnostic. Their port (a
    ``[[patch]]`` with ``abi = "per-torch"``) registers the ops with ``TORCH_LIBRARY`` instead of a pybind11
    module and builds a limited-API ``_C`` (``py_limited_api``), so the wheel is still tied to the torch minor it
    was built with (torch's ordinary C++ ABI: labelled ``+cu130torch2.11``, pinned ``torch>=2.11.0,<2.12``) but
    not to a Python: one ``cp310-abi3`` wheel per (torch minor, CUDA line, platform) serves every CPython from
    ``python_floor`` up that the torch has wheels for."""

    versions: SpecifierSet
    python_floor: str = "3.10"  # the abi3 tag's Python (cp310)

    def covers(self, version: str) -> bool:
        return self.versions.contains(Version(version), prereleases=True)

    @property
    def tag(self) -> str:
        """``cp310-abi3``: the Python and ABI tags of every such wheel."""
        return f"cp{self.python_floor.replace('.', '')}-abi3"


def per_torch_requirement(torch: str) -> str:
    """What finalize writes as a per-torch wheel's torch requirement: every patch release of the minor it was built
    with, ``torch>=2.9.0,<2.10`` for a build on 2.9.1. PyTorch keeps the C++ ABI across the patch releases of one
    minor (they are bug-fix cherry-picks onto the release branch); a new minor may break it (a plain causal-conv1d
    built on 2.11 fails on 2.13 with an undefined symbol), so the pin stops below the next minor."""
    major, minor = torch_minor(torch)
    return f"torch>={major}.{minor}.0,<{major}.{minor + 1}"


def cuda_line_major(line: str) -> int | None:
    """``13.2`` → 13; None for ``cpu`` or anything else that names no CUDA line."""
    match = re.fullmatch(r"(\d+)\.\d+(?:\.\d+)?", line)
    return int(match.group(1)) if match else None


def first_torch_of_major(torch_by_cuda: Mapping[str, Sequence[str]], major: int) -> Version | None:
    """The oldest torch release an index builds for a CUDA line of ``major`` (``TorchIndex.torch_by_cuda``, read from
    the index: PyPI gives 2.1.0 for 12 and 2.11.0 for 13); None where it builds none."""
    return min((Version(v) for line, versions in torch_by_cuda.items() if cuda_line_major(line) == major
                for v in versions), default=None)


def torch_minor(torch: str) -> tuple[int, int]:
    v = Version(torch)
    return v.major, v.minor


def stable_label(cuda: CudaVersion) -> str:
    """The local label of a stable-ABI wheel: the CUDA major only (``cu13``, model/label.py), no torch."""
    return str(Label.stable(cuda))


def per_torch_label(cuda: CudaVersion, torch: str) -> str:
    """The local label of a per-torch wheel: its CUDA major and torch minor, ``cu12torch2.9`` (model/label.py)."""
    return str(Label.per_torch(cuda, torch))


def channel_label(cuda_line: str, torch: str) -> str:
    """The channel (per-torch label) users of ``torch`` built for CUDA ``cuda_line`` ("13.0") point at:
    ``cu130torch2.12`` (model/label.py). A stable wheel is listed in the channel of every torch it was verified on."""
    return str(Label.channel(cuda_line, torch))
