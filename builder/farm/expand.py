"""A farm expanded into targets: packages × versions (pinned, or the newest N on PyPI inside the recipe's range)
× CUDA × arch lists × Python × torch, less the exclusions; every cell checked buildable. Also the GitHub Actions
matrix (``{"include": [...]}``) of those targets."""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.core.datafiles import default_patches_dir
from builder.core.errors import UsageError
from builder.core.settings import Settings
from builder.discovery.compat import TorchIndex, check_torch_matches_cuda, default_torch, resolve_index
from builder.farm.spec import Archs, Farm, FarmEntry, FarmError, FarmTarget
from builder.model.arch import check_archs_for_cuda, format_arch_list, supported_archs
from builder.model.cuda import CudaVersion
from builder.model.recipe import Recipe, find_recipe, load_recipe

DEFAULT_FARM_FILE = "farm.toml"
DEFAULT_RUNNER = "gpu-sm{arch}"




Releases = Callable[[str, Settings], Iterable[str]]


def pypi_versions(name: str, settings: Settings) -> list[str]:
    from builder.stages.resolve import pypi_releases

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
        if entry.newest is not None:
            raise fail("newest", "needs a PyPI source", f"{recipe.name} builds from a local path or git; pin 'versions'")
        from builder.stages.resolve import local_version

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
    from builder.stages.resolve import local_version

    path = Path(location)
    if not path.exists():
        raise fail(field_name, f"source path {path} does not exist")
    found = local_version(path)
    if found is not None and Version(found) != Version(version):
        raise fail(field_name, f"{path} holds version {found}, not {version}", "point each version at its own source")


def _cells(farm: Farm, entry: FarmEntry, recipe: Recipe, recipes: Path, version: str,
           settings: Settings | None = None) -> list[FarmTarget]:
    cells: list[FarmTarget] = []
    index = resolve_index(entry.torch_index, settings)
    cuda_ext = recipe.kind.is_cuda
    # A pure-Python wheel holds no GPU code: it is built once; its first arch list only picks the test runner.
    arch_lists = entry.archs if cuda_ext else entry.archs[:1]
    for cuda in entry.cuda:
        torches = entry.torch
        if not torches:
            try:
                torches = newest_torches(index, cuda, entry.torch_newest)
            except UsageError as e:
                raise FarmError(f"{farm.file}: field '{entry.where}.torch' is needed for CUDA {cuda}: {e.message}",
                                "give torch = ['X.Y.Z'] (here or in [defaults])") from e
        for archs in _arch_lists(arch_lists, cuda, cuda_ext and entry.archs_where_supported, settings):
            for python in entry.python:
                for torch in torches:
                    if any(x.matches(recipe.name, version, cuda, archs, python, torch) for x in farm.excludes):
                        continue
                    _check_cell(farm, entry, cuda_ext, index, cuda, archs, torch, settings)
                    cells.append(FarmTarget(
                        package=recipe.name, version=version, kind=recipe.kind, cuda=cuda, archs=archs, python=python,
                        torch=torch, torch_index=entry.torch_index, toolchain=entry.toolchain, recipes=recipes,
                        source=entry.source_for(version), jobs=entry.jobs, entry=entry.where,
                    ))
    return cells


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
                settings: Settings | None) -> list[Archs]:
    """Each arch list as given, or (``archs-where-supported``) without the archs this CUDA cannot compile."""
    if not trim:
        return list(arch_lists)
    known = supported_archs(cuda, settings)
    out: list[Archs] = []
    for archs in arch_lists:
        kept = tuple(a for a in archs if known is None or a.number in known)
        if kept and kept not in out:
            out.append(kept)
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


def github_matrix(farm: Farm, targets: list[FarmTarget]) -> dict[str, list[dict[str, str]]]:
    """``{"include": [...]}`` for ``strategy.matrix``: one job per target, with the GPU runner label by arch."""
    base = farm.directory
    include = []
    for t in targets:
        include.append({
            "id": t.id,
            "package": t.package,
            "version": t.version,
            "kind": str(t.kind),
            "cuda": str(t.cuda),
            "arch": format_arch_list(t.archs),
            "python": str(t.python),
            "torch": t.torch,
            "torch_index": t.torch_index or "",
            "recipes": _relative(t.recipes, base),
            "source": _relative(Path(t.source), base) if t.source and "://" not in t.source
            and not t.source.startswith("git+") else (t.source or ""),
            "runner": farm.runner_for(t.archs),
        })
    return {"include": include}


def _relative(path: Path, base: Path) -> str:
    try:
        return path.resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        return str(path)
