"""A farm expanded into targets: packages × versions (pinned, or the newest N on PyPI inside the recipe's range)
× platforms × CUDA × arch lists × Python × torch, less the exclusions; every cell checked buildable. Each platform
takes its own arch lists (model/platform.py's defaults where the farm gives none; an arch its machines never carry
dropped with ``archs-where-supported``, else refused); a pure-Python wheel is one build for every platform. Where a
recipe's stable-ABI port covers a version, the cells at or above the port's torch floor collapse into one
``torch-stable`` target per platform, CUDA major and arch list (one ``cp310-abi3`` wheel, ``+cu13``); the cells
below the floor stay per-torch, one per Python, except where the recipe's ``[per-torch-abi3]`` covers the version:
then the per-torch cells of one torch, CUDA line, arch list and platform are one compile (a ``cp310-abi3`` wheel
labelled ``+cu130torch2.9``). Also the GitHub Actions matrix (``{"include": [...]}``) of those targets, with the build runner of each platform and the GPU
runner that tests it (or why none can), and what they serve: the (torch minor, CUDA line, Python, platform) cells a
user can have that some target's wheel is built for (``served_cells``, ``coverage``)."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.core.datafiles import default_patches_dir
from builder.core.errors import UsageError
from builder.core.settings import Settings
from builder.discovery.compat import (
    TorchIndex,
    check_torch_has_python,
    check_torch_matches_cuda,
    default_torch,
    resolve_index,
    torch_cuda,
)
from builder.farm.spec import Archs, Farm, FarmEntry, FarmError, FarmTarget
from builder.model.abi import Abi, StableAbi
from builder.model.arch import check_archs_for_cuda, format_arch_list, parse_arch_list, supported_archs
from builder.model.cuda import CudaVersion
from builder.model.platform import Platform
from builder.model.python import PythonSpec
from builder.model.recipe import Recipe, find_recipe, load_recipe
from builder.stages.plan import default_build_torch
from builder.stages.resolve import local_version, pypi_releases

Releases = Callable[[str, Settings], Iterable[str]]


def pypi_versions(name: str, settings: Settings) -> list[str]:
    return list(pypi_releases(name, settings))


def expand(
    farm: Farm,
    settings: Settings,
    *,
    only: Iterable[str] = (),
    releases: Releases = pypi_versions,
) -> list[FarmTarget]:
    """The matrix as targets, in file order. Consults recipes and (for PyPI sources) PyPI's release list."""
    wanted = check_only(farm, only)
    targets: list[FarmTarget] = []
    seen: dict[str, str] = {}
    wheels: dict[tuple[str, ...], FarmTarget] = {}
    for entry in farm.entries:
        if wanted and canonicalize_name(entry.name) not in wanted:
            continue
        recipes = entry.recipes or settings.recipes_dir
        recipe = load_recipe(find_recipe(entry.name, recipes), default_patches_dir(recipes))
        for version in _versions(farm, entry, recipe, settings, releases):
            for target in _cells(farm, entry, recipe, recipes, version, settings):
                if _fold_stable(targets, wheels, target, settings):
                    continue
                if target.id in seen:
                    raise FarmError(f"{farm.file}: {entry.where} repeats target {target.id} of {seen[target.id]}",
                                    "remove the duplicate or narrow one of the entries")
                seen[target.id] = entry.where
                other = wheels.setdefault(target.wheel_identity, target)
                if other is not target:
                    raise FarmError(
                        f"{farm.file}: {entry.where} target {target.id} would publish the same wheel file as "
                        f"{other.id} ({other.entry}): a wheel's name carries its version, CUDA, torch minor and "
                        "Python tag, not its archs",
                        "build one wheel with SASS for both (one arch list such as archs = ['90,120']), or exclude "
                        "one of them with [[exclude]]",
                    )
                targets.append(target)
    return targets


def _fold_stable(targets: list[FarmTarget], wheels: dict[tuple[str, ...], FarmTarget], target: FarmTarget,
                 settings: Settings) -> bool:
    """Whether ``target`` is a torch-stable target whose wheel an earlier entry already builds (the same package,
    version, CUDA major, arch list and platform: one ``+cu13`` ``cp310-abi3`` file), and so no compile of its own.
    Two entries reach the same stable wheel when their torches cross the port's floor on different indexes (PyPI's
    2.11+ and PyTorch's cu130 channel's 2.10 both land in the +cu13 wheel): the wheel serves every cell of its CUDA
    major at or above the floor, whichever index the torch comes from (``stable_serves``). The one kept is built on
    the older CUDA line of the two (a wheel from a newer nvcc is not promised to an older CUDA runtime), with that
    line's arch list: the two lists must be one list as each line trims it (``archs-where-supported``: 12.8 drops the
    sm_103 that 12.9 keeps), as within one entry (``_stable_target``); other arch lists clash (expand() refuses)."""
    if not target.stable:
        return False
    other = wheels.get(target.wheel_identity)
    if other is None or not other.stable:
        return False
    older, newer = sorted((other, target), key=lambda t: (t.cuda.major, t.cuda.minor))
    known = supported_archs(older.cuda, settings)
    if tuple(a for a in newer.archs if known is None or a.number in known) != older.archs:
        return False
    if older is target:
        targets[targets.index(other)] = wheels[target.wheel_identity] = dataclasses.replace(
            target, entry=other.entry)
    return True


def check_only(farm: Farm, only: Iterable[str]) -> set[str]:
    """The canonical names given with --only, each checked to be a package of the farm."""
    wanted: set[str] = {canonicalize_name(o) for o in only}
    names = {canonicalize_name(e.name) for e in farm.entries}
    for name in sorted(wanted - names):
        close = difflib.get_close_matches(name, sorted(names), n=1)
        raise UsageError(f"--only {name}: the farm {farm.file} has no package of that name",
                         f"did you mean {close[0]!r}?" if close else f"packages: {', '.join(sorted(names))}")
    return wanted


def _from_pypi(entry: FarmEntry, recipe: Recipe) -> bool:
    return recipe.source.path is None and recipe.source.git is None


def _versions(farm: Farm, entry: FarmEntry, recipe: Recipe, settings: Settings, releases: Releases) -> list[str]:
    fail = lambda field_name, problem, hint=None: FarmError(  # noqa: E731
        f"{farm.file}: field '{entry.where}.{field_name}' {problem}", hint)
    if entry.versions:
        available: set[str] | None = None
        for i, version in enumerate(entry.versions):
            if not recipe.versions.contains(Version(version), prereleases=True):
                raise fail(f"versions[{i}]", f"{recipe.name} {version} is outside the recipe's range {recipe.versions}",
                           f"see {recipe.file}")
            location = entry.source_for(version)
            if location is None and _from_pypi(entry, recipe):
                if available is None:
                    available = set(releases(recipe.source.pypi or recipe.name, settings))
                if version not in available:
                    raise fail(f"versions[{i}]", f"{recipe.name} {version} has no sdist on PyPI")
            elif location is not None and "://" not in location and not location.startswith("git+"):
                _check_local_source(fail, "source", location, version)
        return list(entry.versions)
    if entry.source is not None or not _from_pypi(entry, recipe):
        if entry.newest is not None or entry.previous is not None:
            raise fail("newest" if entry.newest is not None else "previous", "needs a PyPI source",
                       f"{recipe.name} builds from a local path or git; pin 'versions'")

        location = entry.source or (str(recipe.source.path) if recipe.source.path else None)
        found = local_version(Path(location)) if location and "://" not in location and not location.startswith("git+") else None
        chosen = found or recipe.default_version
        if chosen is None:
            raise fail("versions", "is required: cannot tell which version the source holds", "pin 'versions'")
        return [chosen]
    newest = entry.newest or 1
    in_range = versions_in_range(recipe, releases(recipe.source.pypi or recipe.name, settings))
    if not in_range:
        raise fail("newest", f"PyPI has no release of {recipe.name} inside the recipe's range {recipe.versions}")
    if entry.previous is not None:  # the releases before the newest: none while the range holds only one
        return in_range[-entry.previous - 1:-1][::-1]
    return in_range[-newest:][::-1]


def versions_in_range(recipe: Recipe, available: Iterable[str]) -> list[str]:
    """Final releases inside the recipe's range, oldest first."""
    good = [v for v in available if _valid(v) and recipe.versions.contains(Version(v)) and not Version(v).is_prerelease]
    return sorted(good, key=Version)


def _valid(text: str) -> bool:
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def _check_local_source(fail: Callable[..., FarmError], field_name: str, location: str, version: str) -> None:
    path = Path(location)
    if not path.exists():
        raise fail(field_name, f"source path {path} does not exist")
    found = local_version(path)
    if found is not None and Version(found) != Version(version):
        raise fail(field_name, f"{path} holds version {found}, not {version}", "point each version at its own source")


def _cells(farm: Farm, entry: FarmEntry, recipe: Recipe, recipes: Path, version: str,
           settings: Settings | None = None) -> list[FarmTarget]:
    cells: list[tuple[FarmTarget, int]] = []  # each with the position of its arch list in its platform's lists
    index = resolve_index(entry.torch_index, settings)
    pypi = index if index.name == "pypi" else resolve_index(None, settings)
    cuda_ext = recipe.kind.is_cuda
    # A pure-Python wheel holds no GPU code and no machine code: it is built once per version for every platform,
    # CUDA, torch and Python (the first cell of the entry: its first CUDA, that CUDA's newest torch, the first Python
    # that torch has); its first arch list only picks the test runner.
    builds = [(p,) for p in entry.platforms] if cuda_ext else [entry.platforms]
    for platforms in builds:
        platform_lists = platform_arch_lists(farm, entry, platforms[0], cuda_ext)
        arch_lists = platform_lists if cuda_ext else platform_lists[:1]
        for cuda in entry.cuda:
            torches = entry.torch
            if not torches:
                try:
                    torches = newest_torches(index, cuda, entry.torch_newest)
                except UsageError as e:
                    raise FarmError(f"{farm.file}: field '{entry.where}.torch' is needed for CUDA {cuda}: {e.message}",
                                    "give torch = ['X.Y.Z'] (here or in [defaults])") from e
            for position, archs in _arch_lists(arch_lists, cuda, cuda_ext and entry.archs_where_supported, settings):
                for python in entry.python:
                    for torch in torches:
                        platform = platforms[0] if cuda_ext else None  # [[exclude]] platform: CUDA builds only
                        if any(x.matches(recipe.name, version, cuda, archs, python, torch, platform)
                               for x in farm.excludes) or not torch_has_python(index, pypi, torch, python):
                            continue
                        _check_cell(farm, entry, cuda_ext, index, cuda, archs, torch, settings)
                        cells.append((FarmTarget(
                            package=recipe.name, version=version, kind=recipe.kind, cuda=cuda, archs=archs,
                            python=python, torch=torch, torch_index=entry.torch_index, toolchain=entry.toolchain,
                            recipes=recipes, source=entry.source_for(version), jobs=entry.jobs, entry=entry.where,
                            platforms=platforms, variants=entry.variants and cuda_ext,
                        ), position))
    targets = _fold_pythons(farm, entry, recipe, version, _choose_abi(farm, entry, recipe, version, index, cells,
                                                                      settings))
    return targets if cuda_ext else targets[:1]  # one py3-none-any wheel per version: the first cell builds it


def torch_has_python(index: TorchIndex, pypi: TorchIndex, torch: str, python: PythonSpec) -> bool:
    """Whether torch ``torch`` has a wheel for ``python``: as ``index`` names the release's Pythons, else as PyPI
    names those of the same release (a PyTorch channel's row from release notes names none, as in the users'
    matrix, farm/coverage.users_matrix); True where neither says, or for an interpreter path. A farm's Python list
    spans torches whose Pythons differ (2.8: 3.9-3.13; 2.15: 3.11-3.15): a Python the torch has no wheel for is no
    cell a user can have, and no target."""
    if python.version is None:
        return True
    for listing in (index.listing, pypi.listing):
        release = listing.release(torch) if listing else None
        if release is not None and release.pythons:
            return python.version in release.pythons
    return True


def platform_arch_lists(farm: Farm, entry: FarmEntry, platform: Platform, cuda_ext: bool) -> tuple[Archs, ...]:
    """The entry's arch lists for one platform: as given, or the platform's default list (one wheel with SASS for
    each). An arch no machine of the platform carries (sm_121 on x86_64) is dropped with ``archs-where-supported``
    (a list left empty is dropped), else refused naming the entry, the platform and the arch."""
    if not entry.archs:
        return (parse_arch_list(",".join(map(str, platform.default_archs))),)
    out: list[Archs] = []
    for archs in entry.archs:
        kept = []
        for arch in archs:
            why = platform.carries(arch)
            if why is None:
                kept.append(arch)
            elif cuda_ext and not entry.archs_where_supported:
                raise FarmError(f"{farm.file}: {entry.where} builds archs {format_arch_list(archs)} for platform "
                                f"{platform}: {why}",
                                "set archs-where-supported = true (each platform keeps the archs it carries), leave "
                                f"archs out ({platform} defaults to {','.join(map(str, platform.default_archs))}), "
                                f"or set platforms = [...] for {entry.name}")
        if kept and tuple(kept) not in out:
            out.append(tuple(kept))
    if cuda_ext and not out:
        raise FarmError(f"{farm.file}: {entry.where}: none of its arch lists has an arch a {platform} machine carries",
                        f"leave archs out ({platform} defaults to {','.join(map(str, platform.default_archs))}), or "
                        f"set platforms = [...] for {entry.name} without {platform}")
    return tuple(out) or entry.archs[:1]


# ---------------------------------------------------------------- the ABI: per-torch cells, or one stable target


def _choose_abi(farm: Farm, entry: FarmEntry, recipe: Recipe, version: str, index: TorchIndex,
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
        why_not = _not_stable(cell, port)
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
            slots.append(dataclasses.replace(cell, port=port))
    return [slot if isinstance(slot, FarmTarget)
            else _stable_target(farm, entry, recipe, port, index, groups[slot], settings) for slot in slots]


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
    (stages/plan.default_build_torch: the floor minor's newest release) and the first of the group's Pythons."""
    first = min(group, key=lambda c: (c.cuda.major, c.cuda.minor))  # min keeps the first of equals: file order
    on_line = sorted((c.torch for c in group if c.cuda.same_line(first.cuda)), key=Version)
    try:
        torch = default_build_torch(index, first.cuda, recipe, Abi.TORCH_STABLE)
    except UsageError:  # the index lists nothing for this CUDA (a custom index): the farm's own oldest torch
        torch = on_line[0]
    if not port.admits(torch):  # the index has no torch at or above the floor: the farm names one
        torch = on_line[0]
    _check_cell(farm, entry, True, index, first.cuda, first.archs, torch, settings)
    python = first.python.version or ""
    try:
        check_torch_has_python(index, torch, python)
    except UsageError as e:
        raise FarmError(f"{farm.file}: {entry.where}: the torch-stable target for CUDA {first.cuda.major} is built "
                        f"with torch {torch} and Python {python}: {e.message}",
                        f"put one of the Pythons torch {torch} has first in python, or set abi = 'per-torch'") from e
    return dataclasses.replace(first, torch=torch, abi=Abi.TORCH_STABLE, port=port)


def _fold_pythons(farm: Farm, entry: FarmEntry, recipe: Recipe, version: str,
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


# ---------------------------------------------------------------- what the targets serve


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
    ``pythons`` where its wheel is one cp310-abi3 file (the recipe's ``[per-torch-abi3]``). A torch-stable target:
    every cell of ``universe`` of the target's CUDA major on a line not older than the one it is built on (a wheel
    from a newer nvcc is not promised to an older CUDA runtime), torch at or above the port's floor, Python at or
    above the port's abi3 floor, whichever index that torch comes from (13.0 × 2.15 is PyTorch's cu130 channel's).
    A pure-Python target (one ``py3-none-any`` wheel per version): every cell of ``universe`` (its recipe names no
    torch range; torch and triton come with the user's torch). What a wheel is finally offered for is what its
    torch checks verified (index/checks.py ``wheel_channels``)."""
    platforms = {p.name for p in target.platforms}
    if not target.kind.is_cuda:
        return frozenset(c for c in universe if c.platform in platforms)
    if not target.stable or target.port is None:
        torch = Version(target.torch)
        line = torch_cuda(index, str(torch.public), target.cuda).line
        pythons = target.pythons or (target.python,)  # a Python-agnostic per-torch wheel: each Python it serves
        return frozenset(Cell(f"{torch.major}.{torch.minor}", line, python.name, p)
                         for python in pythons for p in sorted(platforms))
    return frozenset(c for c in universe if c.platform in platforms and stable_serves(target.port, target.cuda, c))


def stable_serves(port: StableAbi, built: CudaVersion, cell: Cell) -> bool:
    """Whether a stable-ABI wheel of ``port`` built on CUDA ``built`` is for ``cell``: the same CUDA major, a line not
    older than ``built``'s, torch at or above the floor, Python at or above the abi3 floor."""
    cuda = CudaVersion.parse(cell.cuda)
    return (cuda.major == built.major and (cuda.major, cuda.minor) >= (built.major, built.minor)
            and port.admits(cell.torch) and Version(cell.python) >= Version(port.python_floor))


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


def newest_torches(index: TorchIndex, cuda: CudaVersion, count: int) -> tuple[str, ...]:
    """The newest ``count`` torch minors built for ``cuda`` on ``index``: the newest patch of each, newest first."""
    default_torch(index, cuda)  # the error naming what the index has, when it has nothing for this CUDA
    by_minor: dict[tuple[int, int], Version] = {}
    for text in index.torch_for(cuda):
        v = Version(text)
        if not (v.is_prerelease or v.is_devrelease):
            key = (v.major, v.minor)
            by_minor[key] = max(by_minor.get(key, v), v)
    return tuple(str(by_minor[k]) for k in sorted(by_minor, reverse=True)[:count])


def _arch_lists(arch_lists: tuple[Archs, ...], cuda: CudaVersion, trim: bool,
                settings: Settings | None) -> list[tuple[int, Archs]]:
    """Each arch list as given, or (``archs-where-supported``) without the archs this CUDA cannot compile; with
    its position in the farm's list (a stable target groups the CUDA lines' trims of one list)."""
    if not trim:
        return list(enumerate(arch_lists))
    known = supported_archs(cuda, settings)
    out: list[tuple[int, Archs]] = []
    for position, archs in enumerate(arch_lists):
        kept = tuple(a for a in archs if known is None or a.number in known)
        if kept and kept not in (k for _, k in out):
            out.append((position, kept))
    return out


def _check_cell(farm: Farm, entry: FarmEntry, cuda_ext: bool, index: TorchIndex, cuda: CudaVersion, archs: Archs,
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


# ---------------------------------------------------------------- GitHub matrix


@dataclass(frozen=True)
class Route:
    """Where a target's wheel is kernel-tested: the GPU runner of each arch it ships that a configured runner has
    (``tests``: (arch, label), newest first, one per label; ``runner``: the first), the archs no runner has
    (``untested_archs``), or, where no runner can test it at all, why (``untested``)."""

    runner: str | None
    untested: str | None = None  # "untested: no runner for aarch64 sm_121,110,103,100,90 (...)"
    tests: tuple[tuple[int, str], ...] = ()
    untested_archs: tuple[int, ...] = ()


def route(farm: Farm, target: FarmTarget) -> Route:
    """A CUDA target: a GPU runner of its platform for EACH arch its wheel carries that [runners] available has
    (farm/spec.py ``Farm.runners_per_arch``; an arch whose label an newer arch already took is tested in that job),
    the others listed untested. A pure-Python wheel, which ships no GPU code: one runner, of each platform it serves
    in order, for an arch of its first list (``Farm.runner_for``). None at all: "untested: no runner for ..."."""
    numbers = sorted({a.number for a in target.archs}, reverse=True)
    if target.kind.is_cuda:
        tests: dict[str, int] = {}
        missing: list[int] = []
        for number, label in farm.runners_per_arch(target.archs, target.platform):
            if label is None:
                missing.append(number)
            else:
                tests.setdefault(label, number)
        if tests:
            pairs = tuple((number, label) for label, number in tests.items())
            return Route(pairs[0][1], None, pairs, tuple(missing))
    else:
        for platform in target.platforms:
            label = farm.runner_for(target.archs, platform)
            if label is not None:
                arch = next((n for n in numbers if farm.runner_label(n, platform) == label), numbers[0] if numbers
                            else 0)
                return Route(label, None, ((arch, label),))
    platforms = "/".join(p.name for p in target.platforms)
    wanted = ", ".join(farm.runner_label(n, p) for p in target.platforms for n in numbers)
    return Route(None, f"untested: no runner for {platforms} sm_{','.join(map(str, numbers))} (none of {wanted} is "
                       "in [runners] available)", (), tuple(numbers) if target.kind.is_cuda else ())


def github_matrix(farm: Farm, targets: list[FarmTarget]) -> dict[str, list[dict[str, str]]]:
    """``{"include": [...]}`` for ``strategy.matrix``: one job per target, with the platform, the runner that builds
    it natively (``build_runner``: ubuntu-24.04, ubuntu-24.04-arm) and the GPU runner label by platform and arch
    (``runner``; "" with ``untested`` saying why when no configured runner can test it)."""
    base = farm.directory
    include = []
    for t in targets:
        where = route(farm, t)
        include.append({
            "id": t.id,
            "package": t.package,
            "version": t.version,
            "kind": str(t.kind),
            "platform": t.platform.name,
            "build_runner": t.platform.runner,
            "cuda": str(t.cuda),
            "arch": format_arch_list(t.archs),
            "python": str(t.python),
            "torch": t.torch,
            "torch_index": t.torch_index or "",
            "recipes": _relative(t.recipes, base),
            "source": _relative(Path(t.source), base) if t.source and "://" not in t.source
            and not t.source.startswith("git+") else (t.source or ""),
            "runner": where.runner or "",
            "untested": where.untested or "",
            # one GPU test job per (target, runner): the labels and the arch each tests, newest first (tested_matrix
            # and the nightly's jq fan them out); the archs no runner has, named in the plan's summary
            "runners": " ".join(label for _, label in where.tests),
            "test_archs": " ".join(str(number) for number, _ in where.tests),
            "untested_archs": _untested_archs(farm, t, where),
        })
        # the farm decided (a version with a port could go either way with auto): `builder build --abi` says so
        include[-1]["abi"] = str(t.abi) if t.port is not None else "auto"
        include[-1]["variants"] = "true" if t.variants else ""
    return {"include": include}


def _untested_archs(farm: Farm, target: FarmTarget, where: Route) -> str:
    """``sm_103,100 (no gpu-sm103-x86_64, gpu-sm100-x86_64 in [runners] available)`` for a target some of whose archs
    a runner tests; "" where every arch is tested or none is (``untested`` says that)."""
    if not where.tests or not where.untested_archs:
        return ""
    labels = ", ".join(farm.runner_label(n, target.platform) for n in where.untested_archs)
    return (f"{target.platform.name} sm_{','.join(map(str, where.untested_archs))} (no {labels} in [runners] "
            "available)")


def tested_matrix(matrix: dict[str, list[dict[str, str]]]) -> dict[str, list[dict[str, str]]]:
    """The nightly's GPU test jobs: one per (target, runner) of the GitHub matrix, for each arch of the target that a
    configured runner has (``runner``: that label, ``test_arch``, ``test_id``: ``<id>-sm<arch>``, unique per job for
    its artifact); the targets no runner has are reported untested. The plan's jq filter does the same."""
    include = []
    for row in matrix["include"]:
        if not row["runner"]:
            continue
        for label, arch in zip(row["runners"].split(" "), row["test_archs"].split(" "), strict=True):
            include.append({**row, "runner": label, "test_arch": arch, "test_id": f"{row['id']}-sm{arch}"})
    return {"include": include}


def _relative(path: Path, base: Path) -> str:
    try:
        return path.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return str(path)
