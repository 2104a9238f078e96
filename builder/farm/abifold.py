"""A farm's cells folded by ABI, so that one wheel is built once: where a recipe's stable-ABI port covers a version,
the cells at or above the port's torch floor become one ``torch-stable`` target per platform, CUDA major and arch list
(``fold_abi``; one ``cp310-abi3`` ``+cu13`` wheel), and two entries reaching the same wheel of one CUDA major keep
one (``fold_major``: a stable wheel, or a per-torch ``+cu12torch2.9`` one); where ``[per-torch-abi3]`` covers it,
the per-torch cells of one torch, CUDA line, arch list and platform become one target serving every Python
(``fold_pythons``). ``check_cell`` is the buildability check every
cell passes (expand.py's cells and the stable targets made here)."""

from __future__ import annotations

import dataclasses

from packaging.version import Version

from builder.core.errors import UsageError
from builder.core.settings import Settings
from builder.discovery.compat import TorchIndex, check_torch_has_python, check_torch_matches_cuda
from builder.farm.spec import Archs, Farm, FarmEntry, FarmError, FarmTarget
from builder.model.abi import Abi, StableAbi
from builder.model.arch import check_archs_for_cuda, format_arch_list, supported_archs
from builder.model.cuda import CudaVersion
from builder.model.recipe import Recipe
from builder.stages.abichoice import default_build_torch
from builder.stages.plan import stable_on_major


def fold_major(targets: list[FarmTarget], wheels: dict[tuple[str, ...], FarmTarget], target: FarmTarget,
               settings: Settings) -> bool:
    """Whether ``target``'s wheel an earlier target already builds, and so no compile of its own: a wheel's label
    names its CUDA major, not its line (a stable ``+cu13``; a per-torch ``+cu12torch2.9``, model/abi.py), so two
    targets of the same package, version, CUDA major, platform and Python tag (and, per torch, torch minor) on
    two lines of that major are one file. Two entries reach the same stable wheel when their torches cross the
    port's floor on different indexes (PyPI's 2.11+ and PyTorch's cu130 channel's 2.10 both land in the +cu13
    wheel); two per-torch targets when two entries name one torch minor on two lines (cu128's and cu129's 2.9).
    The wheel serves every cell of its CUDA major on a line not older than its own (farm/served.py), whichever
    index the torch comes from. The one kept is built on the older CUDA line of the two (a wheel from a newer nvcc
    is not promised to an older CUDA runtime), with that line's arch list: the two lists must be one list as each
    line trims it (``archs-where-supported``: 12.8 drops the sm_103 that 12.9 keeps), as within one entry
    (``_stable_target``); other arch lists clash (expand() refuses). A folded per-torch-abi3 target keeps the
    Pythons of both."""
    if not target.kind.is_cuda:
        return False
    other = wheels.get(target.wheel_identity)
    if other is None or other.stable != target.stable:
        return False
    if not target.stable and other.cuda.same_line(target.cuda):  # one line twice: a repeat, which expand() refuses
        return False
    older, newer = sorted((other, target), key=lambda t: (t.cuda.major, t.cuda.minor))
    known = supported_archs(older.cuda, settings)
    if tuple(a for a in newer.archs if known is None or a.number in known) != older.archs:
        return False
    pythons = (*older.pythons, *(p for p in newer.pythons if p not in older.pythons))
    kept = dataclasses.replace(older, entry=other.entry, pythons=pythons)
    if kept != other:
        targets[targets.index(other)] = wheels[target.wheel_identity] = kept
    return True


def fold_abi(farm: Farm, entry: FarmEntry, recipe: Recipe, version: str, index: TorchIndex,
                cells: list[tuple[FarmTarget, int]], settings: Settings | None) -> list[FarmTarget]:
    """The cells as targets: where the recipe's ``[stable-abi]`` covers this version (and the farm does not say
    ``abi = "per-torch"``), the cells a stable wheel can serve become one torch-stable target per CUDA major and arch
    list, in the place of the first of them; the others (torch below the floor, a Python below abi3's or given as a
    path) stay per-torch. ``abi = "torch-stable"`` refuses a cell that cannot be stable."""
    stable = recipe.stable_abi
    port = stable if stable is not None and recipe.kind.is_cuda and stable.covers(version) else None
    if entry.abi == Abi.TORCH_STABLE and port is None:
        why = ("is a pure-Python recipe" if not recipe.kind.is_cuda else "has no stable-ABI port ([stable-abi] in "
               f"{recipe.file})" if stable is None else f"is not covered by its stable-ABI port ({stable.versions})")
        raise FarmError(f"{farm.file}: field '{entry.where}.abi' is 'torch-stable', but {recipe.name} {version} {why}",
                        "leave abi out (auto: torch-stable where a port covers the version) or set abi = 'per-torch'")
    if port is None or entry.abi == Abi.PER_TORCH:
        return [dataclasses.replace(cell, port=port) for cell, _ in cells]
    slots: list[FarmTarget | tuple[str, int, int]] = []
    groups: dict[tuple[str, int, int], list[FarmTarget]] = {}
    for cell, position in cells:
        why_not = _not_stable(cell, on_major(port, cell.cuda))
        if why_not is None:
            key = (cell.platform.name, cell.cuda.major, position)
            if key not in groups:
                groups[key] = []
                slots.append(key)
            groups[key].append(cell)
        elif entry.abi == Abi.TORCH_STABLE:
            raise FarmError(f"{farm.file}: field '{entry.where}.abi' is 'torch-stable', but target {cell.id} cannot "
                            f"be: {why_not}",
                            f"add [[exclude]] package = {entry.name!r}, torch = {cell.torch!r} (or python = "
                            f"{str(cell.python)!r}), or leave abi out (auto: per-torch below the floor)")
        else:
            slots.append(dataclasses.replace(cell, port=on_major(port, cell.cuda)))
    return [slot if isinstance(slot, FarmTarget)
            else _stable_target(farm, entry, recipe, on_major(port, groups[slot][0].cuda), index, groups[slot],
                                settings) for slot in slots]


def on_major(port: StableAbi, cuda: CudaVersion) -> StableAbi:
    """The port as a wheel of ``cuda``'s major offers it (stages/plan.py ``for_cuda_major``, the plan's own rule): its
    floor raised to the first torch whose PyPI build is of that major (2.11 for CUDA 13: PyPI's 2.10.0 is a CUDA
    12.8 build), so a farm cell below it (the cu130 channel's 2.10) stays per-torch."""
    return stable_on_major(port, cuda.major)


def _not_stable(cell: FarmTarget, port: StableAbi) -> str | None:
    """Why a cell cannot be served by the port's abi3 wheel; None where it can."""
    if cell.python.version is None:
        return f"Python {cell.python} is an interpreter path: an abi3 build needs a Python version"
    if Version(cell.python.version) < Version(port.python_floor):
        return f"Python {cell.python} is below the abi3 wheel's {port.python_floor}"
    if not port.admits(cell.torch):
        return f"torch {cell.torch} is below the port's floor {port.floor_text}"
    return None


def _stable_target(farm: Farm, entry: FarmEntry, recipe: Recipe, port: StableAbi, index: TorchIndex,
                   group: list[FarmTarget], settings: Settings | None) -> FarmTarget:
    """One torch-stable target for a group of cells of one CUDA major and arch list: built on the group's oldest
    CUDA line (a wheel from a newer nvcc is not promised to an older CUDA runtime), with the plan's torch for it
    (stages/abichoice.default_build_torch: the floor minor's newest release) and the first of the group's Pythons."""
    first = min(group, key=lambda c: (c.cuda.major, c.cuda.minor))  # min keeps the first of equals: file order
    on_line = sorted((c.torch for c in group if c.cuda.same_line(first.cuda)), key=Version)
    try:
        torch = default_build_torch(index, first.cuda, recipe, Abi.TORCH_STABLE)
    except UsageError:  # the index lists nothing for this CUDA (a custom index): the farm's own oldest torch
        torch = on_line[0]
    if not port.admits(torch):  # the index has no torch at or above the floor: the farm names one
        torch = on_line[0]
    check_cell(farm, entry, True, index, first.cuda, first.archs, torch, settings)
    python = first.python.version or ""
    try:
        check_torch_has_python(index, torch, python)
    except UsageError as e:
        raise FarmError(f"{farm.file}: {entry.where}: the torch-stable target for CUDA {first.cuda.major} is built "
                        f"with torch {torch} and Python {python}: {e.message}",
                        f"put one of the Pythons torch {torch} has first in python, or set abi = 'per-torch'") from e
    return dataclasses.replace(first, torch=torch, abi=Abi.TORCH_STABLE, port=port)


def fold_pythons(farm: Farm, entry: FarmEntry, recipe: Recipe, version: str,
                  targets: list[FarmTarget]) -> list[FarmTarget]:
    """Where the recipe's ``[per-torch-abi3]`` covers this version, the per-torch targets of one (platform, CUDA,
    torch, arch list) become ONE target, in the place of the first: its ``cp310-abi3`` wheel serves every Python of
    the group (``pythons``), built with the first of them. A Python below the abi3 floor is refused (the port's
    wheel cannot serve it), as is an interpreter path (an abi3 build is named by the versions it serves)."""
    agnostic = recipe.python_agnostic(version)
    if agnostic is None:
        return targets
    out: list[FarmTarget] = []
    groups: dict[tuple[str, str, str, str], int] = {}
    for t in targets:
        if t.stable:
            out.append(t)
            continue
        if t.python.version is None or Version(t.python.version) < Version(agnostic.python_floor):
            raise FarmError(f"{farm.file}: {entry.where} target {t.id}: {recipe.name} {version}'s per-torch wheel is "
                            f"one {agnostic.tag} wheel ([per-torch-abi3] in {recipe.file}), which cannot serve "
                            f"Python {t.python}",
                            f"add [[exclude]] package = {entry.name!r}, python = {str(t.python)!r}, or list Pythons "
                            f"from {agnostic.python_floor} up")
        key = (t.platform.name, str(t.cuda), t.torch, format_arch_list(t.archs))
        if key in groups:
            first = out[groups[key]]
            out[groups[key]] = dataclasses.replace(first, pythons=(*first.pythons, t.python))
        else:
            groups[key] = len(out)
            out.append(dataclasses.replace(t, pythons=(t.python,)))
    return out



def check_cell(farm: Farm, entry: FarmEntry, cuda_ext: bool, index: TorchIndex, cuda: CudaVersion, archs: Archs,
                torch: str, settings: Settings | None = None) -> None:
    """Every combination the farm names must be buildable; the ones that are not are excluded explicitly."""
    try:
        check_torch_matches_cuda(index, torch, cuda, settings)
    except UsageError as e:
        raise FarmError(f"{farm.file}: {entry.where} combines CUDA {cuda} with torch {torch}: {e.message}",
                        f"add [[exclude]] package = {entry.name!r}, cuda = {str(cuda)!r}, torch = {torch!r}") from e
    if cuda_ext:
        try:
            check_archs_for_cuda(archs, cuda, settings)
        except UsageError as e:
            raise FarmError(f"{farm.file}: {entry.where} combines CUDA {cuda} with archs {format_arch_list(archs)}: "
                            f"{e.message.removeprefix('--arch ')}",
                            f"set archs-where-supported = true, or add [[exclude]] package = {entry.name!r}, "
                            f"cuda = {str(cuda)!r}, arch = {format_arch_list(archs)!r}") from e
