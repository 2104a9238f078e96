"""`builder coverage`'s inputs checked before any work (issue 54 item 6): the wheelhouse is a folder (or not made
yet), the recipes folder exists, and ``NAME==VERSION`` names a release of NAME (in the wheelhouse, pinned by the
recipe, or on PyPI's release list, cached or read once), not a pre-release nobody published, a local label (which
names a wheel, not a release) or 5000 digits. Each refusal is one line naming the input."""

from __future__ import annotations

from collections.abc import Iterable

from packaging.version import InvalidVersion, Version

from builder.core.errors import BuilderError, UsageError
from builder.core.settings import Settings
from builder.model.recipe import Recipe

MAX_VERSION_CHARS = 64  # 1.6.2.post1+cu130torch2.14 is 26


def check_folders(settings: Settings, *, what: str = "coverage") -> None:
    """A wheelhouse that is a file, and a recipes folder that is missing or a file, are refused (before: read as
    empty, exit 0 with nothing to show)."""
    house = settings.wheelhouse
    if house.exists() and not house.is_dir():
        raise UsageError(f"{what}: --wheelhouse {house} is a file, not a folder",
                         "give the wheelhouse folder (it holds wheels/ and simple/)")
    recipes = settings.recipes_dir
    if not recipes.is_dir():
        raise UsageError(f"{what}: --recipes {recipes} is {'a file' if recipes.exists() else 'not there'}, not a "
                         "folder of recipes", "give the folder holding <package>/recipe.toml (default: the packaged "
                         "recipes)")


def parse_asked(recipe: Recipe, asked: str) -> Version:
    """``asked`` as a version: refused when it is not one (5000 digits included: packaging's int() would raise
    ValueError, not InvalidVersion) or carries a local label."""
    example = f"name a release, e.g. {recipe.name}==1.7.0"
    if len(asked) > MAX_VERSION_CHARS:
        raise UsageError(f"coverage: {recipe.name}=={asked[:20]}…: a version of {len(asked)} characters is not a "
                         "version number", example)
    try:
        version = Version(asked)
    except (InvalidVersion, ValueError):
        raise UsageError(f"coverage: {recipe.name}=={asked}: {asked!r} is not a version number", example) from None
    if version.local is not None:
        raise UsageError(f"coverage: {recipe.name}=={asked}: +{version.local} is a wheel's local label, not a "
                         "release", f"name the release: {recipe.name}=={version.public}")
    return version


def check_release(recipe: Recipe, version: Version, have: Iterable[str], releases: Iterable[str] | None,
                  why_unknown: str = "") -> None:
    """Refuse ``version`` unless it is a release: one the wheelhouse has wheels of (``have``), the recipe pins, or
    PyPI lists (``releases``; None where the list could not be read: ``why_unknown``)."""
    known = {*have, *recipe.source.sha256, *recipe.source.commits, *(recipe.default_version or "",)} - {""}
    if any(_same(version, k) for k in known):
        return
    if releases is None:
        raise UsageError(f"coverage: {recipe.name}=={version}: not in the wheelhouse, not pinned by the recipe, and "
                         f"PyPI's release list cannot be read ({why_unknown})",
                         "run once where PyPI is reachable (the list is cached), or name a version the wheelhouse has")
    listed = list(releases)
    if any(_same(version, r) for r in listed):
        return
    near = sorted((r for r in listed if _parses(r) and recipe.versions.contains(Version(r), prereleases=True)),
                  key=Version)[-4:]
    raise UsageError(f"coverage: {recipe.name}=={version} is not a release of {recipe.name} (not on PyPI, not in "
                     "the wheelhouse, not pinned by the recipe)",
                     f"releases in the recipe's range: {', '.join(near) or 'none'}")


def releases_or_why(name: str, settings: Settings) -> tuple[list[str] | None, str]:
    """PyPI's releases of ``name`` (stages/resolve.py: cached, read at most once per process), or None and why."""
    from builder.stages.resolve import pypi_releases

    try:
        return list(pypi_releases(name, settings)), ""
    except BuilderError as e:
        return None, e.one_line()


def _same(version: Version, text: str) -> bool:
    return _parses(text) and Version(text) == version


def _parses(text: str) -> bool:
    try:
        Version(text)
    except (InvalidVersion, ValueError):
        return False
    return True
