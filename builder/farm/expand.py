"""A farm expanded into targets: packages × versions (pinned, or the newest N on PyPI inside the recipe's range)
× platforms × CUDA × arch lists × Python × torch, less the exclusions; every cell checked buildable. Each platform
takes its own arch lists (model/platform.py's defaults where the farm gives none; an arch its machines never carry
dropped with ``archs-where-supported``, else refused); a pure-Python wheel is one build for every platform. The cells
are then folded by ABI (farm/abifold.py: one ``torch-stable`` target where a stable-ABI port covers the version, one
``cp310-abi3`` wheel per torch under ``[per-torch-abi3]``). What the targets serve is farm/served.py; their GitHub
Actions matrix and test runners farm/ghmatrix.py."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.core.datafiles import default_patches_dir
from builder.core.errors import UsageError
from builder.core.settings import Settings
from builder.discovery.compat import TorchIndex, default_torch, resolve_index
from builder.farm.abifold import check_cell, fold_abi, fold_major, fold_pythons
from builder.farm.spec import Archs, Farm, FarmEntry, FarmError, FarmTarget
from builder.model.arch import format_arch_list, parse_arch_list, supported_archs
from builder.model.cuda import CudaVersion
from builder.model.platform import Platform
from builder.model.python import PythonSpec
from builder.model.recipe import Recipe, find_recipe, load_recipe
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
                if fold_major(targets, wheels, target, settings):
                    continue
                if target.id in seen:
                    raise FarmError(f"{farm.file}: {entry.where} repeats target {target.id} of {seen[target.id]}",
                                    "remove the duplicate or narrow one of the entries")
                seen[target.id] = entry.where
                other = wheels.setdefault(target.wheel_identity, target)
                if other is not target:
                    raise FarmError(
                        f"{farm.file}: {entry.where} target {target.id} would publish the same wheel file as "
                        f"{other.id} ({other.entry}): a wheel's name carries its version, CUDA major, torch minor "
                        "and Python tag, not its CUDA line or archs (two lines of one major fold into one wheel "
                        "only where their arch lists are one list as each line trims it)",
                        "build one wheel with SASS for both (one arch list such as archs = ['90,120'], with "
                        "archs-where-supported = true across CUDA lines), or exclude one of them with [[exclude]]",
                    )
                targets.append(target)
    return targets



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
                        check_cell(farm, entry, cuda_ext, index, cuda, archs, torch, settings)
                        cells.append((FarmTarget(
                            package=recipe.name, version=version, kind=recipe.kind, cuda=cuda, archs=archs,
                            python=python, torch=torch, torch_index=entry.torch_index, toolchain=entry.toolchain,
                            recipes=recipes, source=entry.source_for(version), jobs=entry.jobs, entry=entry.where,
                            platforms=platforms, variants=entry.variants and cuda_ext,
                        ), position))
    targets = fold_pythons(farm, entry, recipe, version, fold_abi(farm, entry, recipe, version, index, cells,
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
