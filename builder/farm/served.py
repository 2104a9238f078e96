"""What a farm's targets serve: the users' matrix cell (``Cell``: torch minor, CUDA line, Python, platform), the
cells one target's wheel serves (``served_cells``; a torch-stable wheel every cell of its CUDA major at or above the
port's floors, ``stable_serves``), and per package version the targets and their cells together (``Coverage``,
``coverage``) with the farm's totals (``summary``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.core.settings import Settings
from builder.discovery.compat import TorchIndex, resolve_index, torch_cuda
from builder.farm.spec import FarmTarget
from builder.model.abi import StableAbi
from builder.model.cuda import CudaVersion


@dataclass(frozen=True, order=True)
class Cell:
    """An environment a user can have: a torch minor, the CUDA line that torch is a build of, a Python minor, the
    CPU platform (torch's CUDA wheels exist for both: the indexes name Pythons per release, not platforms, so a
    release is taken to have the same Pythons on aarch64)."""

    torch: str  # 2.12
    cuda: str  # 13.0
    python: str  # 3.12
    platform: str = "x86_64"

    def as_list(self) -> list[str]:
        return [self.torch, self.cuda, self.python, self.platform]


def served_cells(target: FarmTarget, index: TorchIndex, universe: frozenset[Cell]) -> frozenset[Cell]:
    """The cells a target's wheel would serve once built and verified, on each platform it serves (a pure-Python
    wheel: every platform of its entry). ``universe`` is the users' matrix (farm/coverage.users_matrix: every torch
    index the builder knows, PyPI and PyTorch's channels), so that the farm and ``builder coverage`` count against
    one set of cells.

    A per-torch target: its own (torch minor, that torch's CUDA line on ``index``, Python), or with each of its
    ``pythons`` where its wheel is one cp310-abi3 file (the recipe's ``[per-torch-abi3]``), and the same torch minor
    and Pythons on every line of ``universe`` of its CUDA major not older than its own (its ``+cu12torch2.9`` label
    names the major: a 12.8 build serves cu129's 2.9 too, once its torch checks pass there). A torch-stable target:
    every cell of ``universe`` of the target's CUDA major on a line not older than the one it is built on (a wheel
    from a newer nvcc is not promised to an older CUDA runtime), torch at or above the port's floor, Python at or
    above the port's abi3 floor, whichever index that torch comes from (13.0 × 2.15 is PyTorch's cu130 channel's).
    A pure-Python target (one ``py3-none-any`` wheel per version): every cell of ``universe`` (its recipe names no
    torch range; torch and triton come with the user's torch). What a wheel is finally offered for is what its
    torch checks verified (index/channelpolicy.py ``wheel_channels``)."""
    platforms = {p.name for p in target.platforms}
    if not target.kind.is_cuda:
        return frozenset(c for c in universe if c.platform in platforms)
    if not target.stable or target.port is None:
        torch = Version(target.torch)
        built = torch_cuda(index, str(torch.public), target.cuda)
        minor = f"{torch.major}.{torch.minor}"
        pythons = {p.name for p in target.pythons or (target.python,)}  # an abi3 per-torch wheel: each Python
        own = {Cell(minor, built.line, python, p) for python in pythons for p in platforms}
        return frozenset(own | {c for c in universe if c.torch == minor and c.python in pythons
                                and c.platform in platforms and on_major(built, c)})
    return frozenset(c for c in universe if c.platform in platforms and stable_serves(target.port, target.cuda, c))


def stable_serves(port: StableAbi, built: CudaVersion, cell: Cell) -> bool:
    """Whether a stable-ABI wheel of ``port`` built on CUDA ``built`` is for ``cell``: the same CUDA major, a line not
    older than ``built``'s, torch at or above the floor, Python at or above the abi3 floor."""
    return on_major(built, cell) and port.admits(cell.torch) and Version(cell.python) >= Version(port.python_floor)


def on_major(built: CudaVersion, cell: Cell) -> bool:
    """Whether ``cell``'s CUDA is a line of ``built``'s major not older than ``built``'s: where a wheel labelled by
    CUDA major (``+cu13``, ``+cu12torch2.9``) built on ``built`` is offered."""
    cuda = CudaVersion.parse(cell.cuda)
    return cuda.major == built.major and (cuda.major, cuda.minor) >= (built.major, built.minor)


@dataclass(frozen=True)
class Coverage:
    """One package version of the farm: its targets and the cells they serve together."""

    package: str
    version: str
    targets: tuple[FarmTarget, ...]
    cells: frozenset[Cell]

    @property
    def compiles(self) -> int:
        return sum(1 for t in self.targets if t.kind.is_cuda)

    @property
    def stable(self) -> int:
        return sum(1 for t in self.targets if t.stable)


def serving(targets: Iterable[FarmTarget], settings: Settings,
            universe: frozenset[Cell]) -> dict[str, frozenset[Cell]]:
    """Each target's served cells (``served_cells``), by target id (one index read per torch index)."""
    indexes: dict[str | None, TorchIndex] = {}
    out = {}
    for t in targets:
        if t.torch_index not in indexes:
            indexes[t.torch_index] = resolve_index(t.torch_index, settings)
        out[t.id] = served_cells(t, indexes[t.torch_index], universe)
    return out


def coverage(targets: Iterable[FarmTarget], served: Mapping[str, frozenset[Cell]]) -> list[Coverage]:
    """Per package version (in the targets' order): its targets and the union of the cells they serve."""
    grouped: dict[tuple[str, str], list[FarmTarget]] = {}
    for t in targets:
        grouped.setdefault((canonicalize_name(t.package), t.version), []).append(t)
    return [Coverage(package=group[0].package, version=version, targets=tuple(group),
                     cells=frozenset().union(*(served[t.id] for t in group)))
            for (_, version), group in grouped.items()]


def summary(coverages: list[Coverage]) -> dict[str, int]:
    """The farm's totals: its builds, the compiles among them (stable-ABI and per-torch), the cells they serve, and
    how many per-torch compiles would serve the same cells of the CUDA extensions."""
    targets = [t for c in coverages for t in c.targets]
    compiles = sum(c.compiles for c in coverages)
    stable = sum(c.stable for c in coverages)
    return {
        "targets": len(targets),
        "compiles": compiles,
        "stable_compiles": stable,
        "per_torch_compiles": compiles - stable,
        "pure_python_builds": len(targets) - compiles,
        "cells_served": sum(len(c.cells) for c in coverages),
        "compiled_cells_served": sum(len(c.cells) for c in coverages if c.compiles),
        **{f"cells_served_{p}": sum(1 for c in coverages for cell in c.cells if cell.platform == p)
           for p in sorted({cell.platform for c in coverages for cell in c.cells})},
    }
