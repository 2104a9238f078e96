"""Which version and which source: upstream releases on PyPI, the recipe's range, a --source override.

Part of planning: it runs before anything is fetched, and the plan (and its cache key) holds the SourceRef.
"""

from __future__ import annotations

import json
import os
import re
import tomllib
import urllib.error
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidSdistFilename, canonicalize_name, parse_sdist_filename
from packaging.version import InvalidVersion, Version

from builder.core import net
from builder.core.errors import ChecksumError, RecipeError, SourceError, UsageError
from builder.core.fsutil import atomic_write
from builder.core.settings import Settings
from builder.core.statefile import read_json_or_none
from builder.model.recipe import Recipe

PYPI_JSON = "https://pypi.org/pypi/{name}/json"


@dataclass(frozen=True)
class SourceRef:
    """One resolved source: ``kind`` is pypi, url, git or path; ``sha256`` is what the file must hash to; for git,
    ``git_ref`` is the tag or branch cloned and ``commit`` the one it must be at (the recipe's source.commits)."""

    kind: str
    location: str
    filename: str
    sha256: str | None
    git_ref: str | None = None
    commit: str | None = None

    def describe(self) -> str:
        """The plan's source row: where from and what pins it (git: the ref and its commit)."""
        if self.kind == "git":
            pin = f"commit {self.commit}" if self.commit else "commit not pinned"
            return f"git: {self.location} at {self.git_ref} ({pin})"
        return f"{self.kind}: {self.location}" + (f" sha256 {self.sha256[:16]}…" if self.sha256 else "")


_READ: dict[tuple[Path, str], dict] = {}  # (cache file, name) → PyPI's answer, read at most once per process


def pypi_releases(name: str, settings: Settings, *, refresh: bool = False) -> dict[str, SourceRef]:
    """Versions on PyPI that have an sdist, with its URL and sha256. Read at most once per process; a cached list
    younger than the index time-to-live (24 h, ``BUILDER_INDEX_TTL``; discovery/torchindex.py) answers without the
    network, as does any cached list ``--offline`` or when PyPI cannot be reached. ``refresh`` (or
    ``BUILDER_INDEX_REFRESH=1``): ask PyPI now (a version newer than the cached list)."""
    from builder.discovery.torchindex import cache_age_s, ttl_s, warn_once

    cache_file = settings.cache("index") / f"{canonicalize_name(name)}.json"
    key = (cache_file, canonicalize_name(name))
    refresh = refresh or os.environ.get("BUILDER_INDEX_REFRESH") == "1"
    data = None if refresh else _READ.get(key)
    if data is None and not refresh and cache_file.exists() and cache_age_s(cache_file) < ttl_s():
        data = _read_cached(cache_file)
    if data is None and not settings.offline:
        try:
            data = json.loads(net.fetch_bytes(PYPI_JSON.format(name=name)))
            atomic_write(cache_file, json.dumps(data))
        except urllib.error.HTTPError as e:
            if e.code == 404:
                raise SourceError(f"{name!r} is not on PyPI") from e
            warn_once(f"PyPI answered {e.code}; using the cached release lists")
        except (urllib.error.URLError, TimeoutError, OSError) as e:  # said once per process (issue 54 item 2)
            if not _UNREACHABLE_SAID:
                _UNREACHABLE_SAID.append(True)
                warn_once(f"PyPI unreachable ({e}); using the cached release lists")
    if data is None:
        if not cache_file.exists():
            raise SourceError(
                f"no cached release list for {name!r} and PyPI is not used (offline or unreachable)",
                "run once online (without --offline) to fill the cache",
            )
        data = _read_cached(cache_file)
    if data is None:
        raise SourceError(f"the cached release list of {name!r} ({cache_file}) cannot be read",
                          "delete it; the next run online reads PyPI again")
    _READ[key] = data
    releases: dict[str, SourceRef] = {}
    listed = data.get("releases", {})
    if not isinstance(listed, dict):
        raise SourceError(f"the release list of {name!r} ({cache_file}) has 'releases' of the wrong type "
                          f"({type(listed).__name__})", "delete it; the next run online reads PyPI again")
    for version, files in listed.items():
        for f in files if isinstance(files, list) else ():
            if not isinstance(f, dict) or f.get("packagetype") != "sdist" or f.get("yanked", False):
                continue
            digest = f["digests"].get("sha256") if isinstance(f.get("digests"), dict) else None
            if not all(isinstance(x, str) and x for x in (f.get("url"), f.get("filename"), digest)):
                continue  # an entry without its URL, name or sha256 cannot be fetched safely
            url = urllib.parse.urljoin(PYPI_JSON.format(name=name), f["url"])  # some mirrors answer relative URLs
            releases[version] = SourceRef("pypi", url, f["filename"], digest)
    return releases


_UNREACHABLE_SAID: list[bool] = []  # "PyPI unreachable" is said once per process, not at every step


def _read_cached(path: Path) -> dict | None:
    """The cached release list; None when it is damaged (not JSON, a folder, a fifo: never opened to read)."""
    data = read_json_or_none(path, limit=256 << 20)
    return data if isinstance(data, dict) and isinstance(data.get("releases", {}), dict) else None


def resolve_version(recipe: Recipe, requested: str | None, available: list[str]) -> str:
    """Pick the requested version (checked against the recipe's range) or the newest one in range."""
    if requested is not None:
        try:
            wanted = Version(requested)
        except InvalidVersion as e:
            raise UsageError(f"--version {requested!r} is not a version number") from e
        if not recipe.versions.contains(wanted, prereleases=True):  # the flag's fault: the usage code (issue 55)
            raise UsageError(
                f"--version: {recipe.name} {requested} is outside the recipe's supported range {recipe.versions}",
                f"supported versions available: {', '.join(_in_range(recipe, available)) or 'none'}",
            )
        matches = [v for v in available if Version(v) == wanted]
        if available and not matches:
            raise SourceError(
                f"{recipe.name} {requested} does not exist upstream",
                f"versions in range: {', '.join(_in_range(recipe, available)) or 'none'}",
            )
        return matches[0] if matches else requested
    if recipe.default_version:
        return recipe.default_version
    candidates = _in_range(recipe, available)
    if not candidates:
        raise SourceError(f"no upstream version of {recipe.name} is inside {recipe.versions}")
    return candidates[-1]


def local_version(path: Path) -> str | None:
    """The version a local source declares: an sdist's file name (``causal_conv1d-1.7.0.tar.gz``), or a tree's
    PKG-INFO, pyproject.toml or a literal in setup.py."""
    if path.is_file():
        try:
            return str(parse_sdist_filename(path.name)[1])
        except InvalidSdistFilename:
            return None
    pkg_info = path / "PKG-INFO"
    if pkg_info.exists():
        for line in pkg_info.read_text(errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.split(":", 1)[1].strip()
    pyproject = path / "pyproject.toml"
    if pyproject.exists():
        version = tomllib.loads(pyproject.read_text()).get("project", {}).get("version")
        if version:
            return str(version)
    setup_py = path / "setup.py"
    if setup_py.exists():
        match = re.search(r"""(?:VERSION|version)\s*=\s*["']([0-9][^"']*)["']""", setup_py.read_text(errors="replace"))
        if match:
            return match.group(1)
    return None


def _in_range(recipe: Recipe, available: list[str]) -> list[str]:
    good = []
    for v in available:
        try:
            if recipe.versions.contains(Version(v)):
                good.append(v)
        except InvalidVersion:
            continue
    return sorted(good, key=Version)


def source_for(recipe: Recipe, version: str, override: str | None, settings: Settings) -> SourceRef:
    """Where this version's sources come from: ``--source`` first, then the recipe, then PyPI."""
    recorded = recipe.source.sha256.get(version)
    location = override
    if location is None and recipe.source.path is not None:
        location = str(recipe.source.path)
    if location is None and recipe.source.git is not None:
        location = "git+" + recipe.source.git
    if location is not None:
        if override is None:
            check_recipe_path(recipe)
        commit = recipe.source.commits.get(version) if override is None else None  # a pin is the recipe's URL's
        return _ref_from_location(location, version, recipe, recorded, commit)
    releases = pypi_releases(recipe.source.pypi or recipe.name, settings)
    if version not in releases and not settings.offline:  # released since the cached list was read
        releases = pypi_releases(recipe.source.pypi or recipe.name, settings, refresh=True)
    if version not in releases:
        raise SourceError(f"{recipe.name} {version} has no sdist on PyPI")
    ref = releases[version]
    if recorded and recorded != ref.sha256:
        raise ChecksumError(
            f"PyPI's sha256 for {ref.filename} is {ref.sha256}, the recipe records {recorded}",
            "the upstream file changed: check it, then update source.sha256 in the recipe",
        )
    return ref


def check_recipe_path(recipe: Recipe) -> None:
    """A recipe's ``source.path`` must exist; the error names the recipe file and the field."""
    if recipe.source.path is not None and not recipe.source.path.exists():
        raise RecipeError(f"{recipe.file}: field 'source.path' names {recipe.source.path}, which does not exist",
                          "fix the path (relative to the recipe's folder) or give --source")


def _ref_from_location(location: str, version: str, recipe: Recipe, recorded: str | None,
                       commit: str | None = None) -> SourceRef:
    if location.startswith("git+"):
        url, _, ref = location[4:].partition("@")
        return SourceRef("git", url, Path(url).name, None, ref or recipe.source.git_ref.format(version=version),
                         commit)
    if "://" in location:
        return SourceRef("url", location, location.rsplit("/", 1)[-1], recorded)
    path = Path(location).expanduser().resolve()
    if not path.exists():
        raise SourceError(f"source path {path} does not exist")
    return SourceRef("path", str(path), path.name, recorded if path.is_file() else None)
