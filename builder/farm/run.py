"""Farm mode: a build matrix (``farm.toml``) expanded into targets, checked against the wheelhouse and built.

A farm file names packages × versions (pinned, or the newest N on PyPI inside the recipe's range) × CUDA × arch
lists × Python × torch, with defaults, per-package overrides and exclusions. It is validated as strictly as a
recipe: every problem names the file and the dotted field, and an unknown key names the key it most likely meant.

Three consumers:

- ``builder farm`` builds the expanded targets here (``run_target`` is the worker that runs in a child process,
  one per target, its output in one log file per target). Before anything is started, ``find_unchanged`` computes
  each target's real cache key with the pipeline's own functions (memoised per toolkit, build venv and source)
  and reports targets already in the wheelhouse as unchanged without starting a worker.
- ``builder matrix`` renders the targets (for GitHub Actions: ``{"include": [...]}``); ``--changed`` keeps the
  targets that no wheelhouse record matches (``record_matches``: same package, version, CUDA, archs, Python,
  torch, index, recipe, patches, source and builder version; it needs no toolkit and no build venv, so it runs
  on any CPU runner).
- ``builder watch`` (watch.py) compares PyPI with the versions in the wheelhouse.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
import re
import sys
import time
import tomllib
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder import __version__
from builder.core.datafiles import default_patches_dir
from builder.core.errors import BuilderError, RecipeError, UsageError
from builder.core.settings import Settings
from builder.discovery.compat import check_torch_matches_cuda, default_torch, resolve_index
from builder.model.arch import check_archs_for_cuda, format_arch_list, parse_arch_list, supported_archs
from builder.model.recipe import Recipe, TomlChecker, find_recipe, load_recipe
from builder.stages.plan import KNOWN_CUDA, Target
from builder.toolchain import TOOLCHAINS

DEFAULT_FARM_FILE = "farm.toml"
DEFAULT_RUNNER = "gpu-sm{arch}"


class FarmError(RecipeError):
    """A farm file that is missing, malformed, or names a combination that cannot be built (exit code 3)."""


# ---------------------------------------------------------------- schema

# Settings every [[package]] inherits from [defaults] and may override.
_SETTINGS: dict[str, tuple[type, ...]] = {
    "recipes": (str,),
    "toolchain": (str,),
    "cuda": (str, list),
    "archs": (str, list),
    "python": (str, list),
    "torch": (str, list),
    "torch-index": (str,),
    "jobs": (int,),
    "torch-newest": (int,),
    "archs-where-supported": (bool,),
}
_TOP: dict[str, tuple[type, ...]] = {"defaults": (dict,), "package": (list,), "exclude": (list,), "runners": (dict,)}
_PACKAGE: dict[str, tuple[type, ...]] = {"name": (str,), "versions": (str, list), "newest": (int,), "source": (str, dict),
                                         **_SETTINGS}
_EXCLUDE: dict[str, tuple[type, ...]] = {k: (str,) for k in ("package", "version", "cuda", "arch", "python", "torch")}


@dataclass(frozen=True, kw_only=True)
class FarmEntry:
    """One [[package]] table with the [defaults] merged in."""

    where: str  # "package[0]", for messages
    name: str
    versions: tuple[str, ...] = ()  # pinned; empty → newest
    newest: int | None = None
    source: str | None = None  # a path / URL / git+URL@ref for every version; "{version}" is substituted
    sources: dict[str, str] = field(default_factory=dict)  # per version
    recipes: Path | None = None  # None: the project's (or --recipes)
    toolchain: str = "auto"
    cuda: tuple[str, ...] = ()
    archs: tuple[str, ...] = ()  # each a normalised arch list: "120", "90,120+ptx"
    python: tuple[str, ...] = ("3.12",)
    torch: tuple[str, ...] = ()  # empty → the newest torch built for each CUDA on the index
    torch_index: str | None = None
    jobs: int | None = None
    torch_newest: int = 1  # torch omitted: the newest N torch minors built for each CUDA (newest patch of each)
    archs_where_supported: bool = False  # drop from each arch list what a target's CUDA cannot compile

    def source_for(self, version: str) -> str | None:
        if version in self.sources:
            return self.sources[version]
        return self.source.replace("{version}", version) if self.source else None


@dataclass(frozen=True, kw_only=True)
class Exclusion:
    """[[exclude]]: a target matching every given field is dropped (``version`` may be a range)."""

    where: str
    package: str | None = None
    version: SpecifierSet | None = None
    cuda: str | None = None
    arch: str | None = None
    python: str | None = None
    torch: str | None = None

    def matches(self, package: str, version: str, cuda: str, archs: str, python: str, torch: str | None) -> bool:
        if self.package is not None and canonicalize_name(self.package) != canonicalize_name(package):
            return False
        if self.version is not None and not self.version.contains(Version(version), prereleases=True):
            return False
        if self.cuda is not None and _cuda_key(self.cuda) != _cuda_key(cuda):
            return False
        if self.arch is not None and self.arch != archs:
            return False
        if self.python is not None and self.python != python:
            return False
        return self.torch is None or (torch is not None and Version(self.torch) == Version(torch))


@dataclass(frozen=True)
class Farm:
    file: Path
    entries: tuple[FarmEntry, ...]
    excludes: tuple[Exclusion, ...]
    runners: dict[str, str]  # arch number → runner label; "default" → template with {arch}

    @property
    def directory(self) -> Path:
        return self.file.parent

    def runner_for(self, archs: str) -> str:
        """The GPU test runner label: the newest arch of the list that [runners] names, else the default
        template filled with the newest arch (a wheel with SASS for 90 and 120 is tested on an sm_120 runner)."""
        numbers = sorted({int(m.group(0)) for a in archs.split(",") if (m := re.match(r"\d+", a))}, reverse=True)
        for number in numbers:
            if str(number) in self.runners:
                return self.runners[str(number)]
        newest = str(numbers[0]) if numbers else archs
        return self.runners.get("default", DEFAULT_RUNNER).format(arch=newest)

    def package_names(self) -> list[str]:
        return sorted({e.name for e in self.entries})


@dataclass(frozen=True, kw_only=True)
class FarmTarget:
    """One cell of the expanded matrix: everything ``builder build`` needs."""

    package: str
    version: str
    kind: str
    cuda: str
    archs: str  # normalised arch list
    python: str
    torch: str
    torch_index: str | None
    toolchain: str
    recipes: Path
    source: str | None
    jobs: int | None
    entry: str  # "package[0]"

    @property
    def id(self) -> str:
        """A name safe for files and artifact names: tinyext-0.1.0-cu130-sm90-py3.11-torch2.14.1."""
        cuda = "cu" + self.cuda.replace(".", "")
        python = self.python if not _is_path(self.python) else Path(self.python).name
        parts = [canonicalize_name(self.package), self.version, cuda]
        if self.kind == "cuda-extension":
            parts.append("sm" + self.archs.replace(",", "_").replace("+ptx", "ptx"))
        parts += [f"py{python}", f"torch{self.torch}"]
        return re.sub(r"[^A-Za-z0-9._-]", "_", "-".join(parts))

    @property
    def wheel_identity(self) -> tuple[str, ...]:
        """What the wheel's file name is made of: targets equal here would overwrite each other's wheel."""
        torch = Version(self.torch)
        tag = self.python if self.kind == "cuda-extension" else "py3-none-any"
        return (canonicalize_name(self.package), str(Version(self.version)), _cuda_key(self.cuda),
                f"{torch.major}.{torch.minor}", tag)

    def to_target(self, jobs: int) -> Target:
        return Target(
            package=self.package,
            version=self.version,
            cuda=Version(self.cuda),
            archs=parse_arch_list(self.archs),
            python=self.python,
            torch=self.torch,
            torch_index=self.torch_index,
            toolchain=self.toolchain,
            source=self.source,
            jobs=self.jobs or jobs,
        )

    def settings(self, base: Settings) -> Settings:
        return dataclasses.replace(base, recipes_dir=self.recipes, patches_dir=default_patches_dir(self.recipes))


# ---------------------------------------------------------------- loading


def find_farm_file(given: Path | None, cwd: Path | None = None) -> Path:
    if given is not None:
        return given
    here = cwd or Path.cwd()
    for folder in (here, *here.parents):
        if (folder / DEFAULT_FARM_FILE).is_file():
            return folder / DEFAULT_FARM_FILE
    return here / DEFAULT_FARM_FILE


def load_farm(path: Path) -> Farm:
    """Parse and validate a farm file (schema and values; recipes and PyPI are consulted by ``expand``)."""
    path = path.resolve()
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError as e:
        raise FarmError(f"{path}: farm file not found", "pass --file PATH or create farm.toml") from e
    except tomllib.TOMLDecodeError as e:
        raise FarmError(f"{path}: not valid TOML: {e}") from e
    c = _Checker(path)
    c.keys(data, _TOP, "")
    defaults_table = data.get("defaults", {})
    c.keys(defaults_table, _SETTINGS, "defaults")
    defaults = c.settings(defaults_table, "defaults")
    packages = data.get("package", [])
    if not packages:
        c.fail("package", "is required: at least one [[package]] table")
    entries = []
    for i, table in enumerate(packages):
        where = f"package[{i}]"
        if not isinstance(table, dict):
            c.fail(where, "must be a table ([[package]])")
        c.keys(table, _PACKAGE, where)
        entries.append(c.entry(table, where, defaults))
    excludes = []
    for i, table in enumerate(data.get("exclude", [])):
        where = f"exclude[{i}]"
        if not isinstance(table, dict):
            c.fail(where, "must be a table ([[exclude]])")
        c.keys(table, _EXCLUDE, where)
        if not table:
            c.fail(where, "is empty: it would exclude every target", f"give some of {', '.join(_EXCLUDE)}")
        excludes.append(c.exclusion(table, where))
    runners = data.get("runners", {})
    for key, value in runners.items():
        if not isinstance(value, str) or not value:
            c.fail(f"runners.{key}", "must be a non-empty string (a runner label)")
        if key != "default" and not re.fullmatch(r"\d{2,3}[af]?", key):
            c.fail(f"runners.{key}", "must be an arch number such as 120, or 'default'")
        if key == "default":
            try:
                value.format(arch="120")
            except (KeyError, IndexError, ValueError):
                c.fail("runners.default", f"is not a label template: {value!r}", "use {arch}, e.g. 'gpu-sm{arch}'")
    return Farm(path, tuple(entries), tuple(excludes), dict(runners))


class _Checker(TomlChecker):
    """The recipe checker's conventions (file + dotted field + "did you mean"), raising FarmError."""

    error = FarmError

    def strings(self, value: str | list[Any], dotted: str) -> tuple[str, ...]:
        """A string or a list of strings, as a tuple; an empty list is an error."""
        items = [value] if isinstance(value, str) else value
        if not items:
            self.fail(dotted, "is empty")
        for i, item in enumerate(items):
            if not isinstance(item, str):
                self.fail(f"{dotted}[{i}]", f"must be a string, not {type(item).__name__}")
        if len(set(items)) != len(items):
            self.fail(dotted, f"repeats a value: {items}")
        return tuple(items)

    def settings(self, table: dict[str, Any], where: str) -> dict[str, Any]:
        """Validated, normalised values of the settings keys present in ``table``."""
        out: dict[str, Any] = {}
        at = lambda key: f"{where}.{key}"  # noqa: E731
        if "recipes" in table:
            recipes = (self.path.parent / table["recipes"]).resolve()
            if not recipes.is_dir():
                self.fail(at("recipes"), f"folder {recipes} does not exist")
            out["recipes"] = recipes
        if "toolchain" in table:
            if table["toolchain"] not in TOOLCHAINS:
                close = difflib.get_close_matches(table["toolchain"], TOOLCHAINS, n=1)
                self.fail(at("toolchain"), f"is {table['toolchain']!r}",
                          f"did you mean {close[0]!r}?" if close else f"use one of {', '.join(TOOLCHAINS)}")
            out["toolchain"] = table["toolchain"]
        if "cuda" in table:
            values = self.strings(table["cuda"], at("cuda"))
            for i, value in enumerate(values):
                try:
                    ok = _cuda_key(value) in KNOWN_CUDA
                except InvalidVersion:
                    ok = False
                if not ok:
                    self.fail(f"{at('cuda')}[{i}]", f"is not a known CUDA version: {value!r}",
                              f"use one of {', '.join(KNOWN_CUDA)}")
            out["cuda"] = values
        if "archs" in table:
            normalised = []
            for i, value in enumerate(self.strings(table["archs"], at("archs"))):
                try:
                    normalised.append(format_arch_list(parse_arch_list(value)))
                except UsageError as e:
                    self.fail(f"{at('archs')}[{i}]", f"is not an arch list: {value!r}",
                              "each item is one target's archs: '120', '90,120' or '120+ptx'")
                    raise AssertionError from e  # unreachable
            if len(set(normalised)) != len(normalised):
                self.fail(at("archs"), f"names one arch list twice: {list(table['archs'])}")
            out["archs"] = tuple(normalised)
        if "python" in table:
            values = self.strings(table["python"], at("python"))
            for i, value in enumerate(values):
                if not (_is_path(value) or re.fullmatch(r"3\.\d{1,2}", value)):
                    self.fail(f"{at('python')}[{i}]", f"is neither a Python version nor a path: {value!r}",
                              "use a version such as '3.12' or a path to an interpreter")
            out["python"] = values
        if "torch" in table:
            values = self.strings(table["torch"], at("torch"))
            for i, value in enumerate(values):
                self.version(value, f"{at('torch')}[{i}]")
            out["torch"] = values
        if "torch-index" in table:
            try:
                resolve_index(table["torch-index"])
            except UsageError as e:
                self.fail(at("torch-index"), f"is neither a URL nor a known index: {table['torch-index']!r}", e.hint)
            out["torch_index"] = table["torch-index"]
        if "jobs" in table:
            if table["jobs"] < 1:
                self.fail(at("jobs"), "must be at least 1")
            out["jobs"] = table["jobs"]
        if "torch-newest" in table:
            if table["torch-newest"] < 1:
                self.fail(at("torch-newest"), "must be at least 1")
            if "torch" in table:
                self.fail(where, "gives both 'torch' and 'torch-newest'", "pin torch, or take the newest N, not both")
            out["torch_newest"] = table["torch-newest"]
        if "archs-where-supported" in table:
            out["archs_where_supported"] = table["archs-where-supported"]
        return out

    def entry(self, table: dict[str, Any], where: str, defaults: dict[str, Any]) -> FarmEntry:
        name = self.required(table, "name", where)
        if "versions" in table and "newest" in table:
            self.fail(where, "gives both 'versions' and 'newest'", "pin versions, or take the newest N, not both")
        versions = self.strings(table["versions"], f"{where}.versions") if "versions" in table else ()
        for i, version in enumerate(versions):
            self.version(version, f"{where}.versions[{i}]")
        newest = table.get("newest")
        if newest is not None and newest < 1:
            self.fail(f"{where}.newest", "must be at least 1")
        source: str | None = None
        sources: dict[str, str] = {}
        given = table.get("source")
        if isinstance(given, str):
            source = self.location(given)
        elif isinstance(given, dict):
            for version, location in given.items():
                dotted = f"{where}.source.{version}"
                self.version(version, dotted)
                if not isinstance(location, str):
                    self.fail(dotted, f"must be a string, not {type(location).__name__}")
                if version not in versions:
                    self.fail(dotted, f"names a version that is not in {where}.versions ({', '.join(versions) or 'none'})",
                              "a per-version source needs the version pinned in 'versions'")
                sources[version] = self.location(location)
        own = self.settings(table, where)
        merged = {**defaults, **own}
        if "torch_newest" in own and "torch" not in own:  # the package's own choice wins over [defaults] torch
            merged.pop("torch", None)
        elif "torch" in own:
            merged.pop("torch_newest", None)
        if "cuda" not in merged:
            self.fail(f"{where}.cuda", "is required (here or in [defaults])", "e.g. cuda = ['13.0']")
        if "archs" not in merged:
            self.fail(f"{where}.archs", "is required (here or in [defaults])", "e.g. archs = ['120', '90']")
        return FarmEntry(where=where, name=name, versions=versions, newest=newest, source=source, sources=sources,
                         **merged)

    def location(self, text: str) -> str:
        """A source: URLs and git+ stay as given; a relative local path is taken from the farm file's folder."""
        if "://" in text or text.startswith("git+"):
            return text
        return str((self.path.parent / Path(text).expanduser()).resolve())

    def exclusion(self, table: dict[str, Any], where: str) -> Exclusion:
        values: dict[str, Any] = {}
        if "version" in table:
            text = table["version"]
            try:
                Version(text)
                spec = SpecifierSet(f"=={text}")
            except InvalidVersion:
                try:
                    spec = SpecifierSet(text)
                except InvalidSpecifier as e:
                    raise FarmError(f"{self.path}: field '{where}.version' is neither a version nor a range: {text!r}",
                                    "e.g. '1.6.1' or '<1.6'") from e
            values["version"] = spec
        if "arch" in table:
            try:
                values["arch"] = format_arch_list(parse_arch_list(table["arch"]))
            except UsageError as e:
                raise FarmError(f"{self.path}: field '{where}.arch' is not an arch list: {table['arch']!r}") from e
        if "cuda" in table:
            settings = self.settings({"cuda": table["cuda"]}, where)
            values["cuda"] = settings["cuda"][0]
        if "torch" in table:
            self.version(table["torch"], f"{where}.torch")
            values["torch"] = table["torch"]
        for key in ("package", "python"):
            if key in table:
                values[key] = table[key]
        return Exclusion(where=where, **values)


def _cuda_key(text: str) -> str:
    v = Version(text)
    return f"{v.major}.{v.minor}"


def _is_path(python: str) -> bool:
    return "/" in python or not python[:1].isdigit()


# ---------------------------------------------------------------- expansion

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
    wanted = {canonicalize_name(o) for o in only}
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
        version = found or recipe.default_version
        if version is None:
            raise fail("versions", "is required: cannot tell which version the source holds", "pin 'versions'")
        return [version]
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
    cuda_ext = recipe.kind == "cuda-extension"
    # A pure-Python wheel holds no GPU code: it is built once; its first arch list only picks the test runner.
    arch_lists = entry.archs if cuda_ext else entry.archs[:1]
    for cuda in entry.cuda:
        torches = entry.torch
        if not torches:
            try:
                torches = newest_torches(index, Version(cuda), entry.torch_newest)
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


def newest_torches(index: Any, cuda: Version, count: int) -> tuple[str, ...]:
    """The newest ``count`` torch minors built for ``cuda`` on ``index``: the newest patch of each, newest first."""
    default_torch(index, cuda)  # the error naming what the index has, when it has nothing for this CUDA
    by_minor: dict[tuple[int, int], Version] = {}
    for text in index.torch_by_cuda.get(f"{cuda.major}.{cuda.minor}", ()):
        v = Version(text)
        if not (v.is_prerelease or v.is_devrelease):
            key = (v.major, v.minor)
            by_minor[key] = max(by_minor.get(key, v), v)
    return tuple(str(by_minor[k]) for k in sorted(by_minor, reverse=True)[:count])


def _arch_lists(arch_lists: tuple[str, ...], cuda: str, trim: bool, settings: Settings | None) -> list[str]:
    """Each arch list as given, or (``archs-where-supported``) without the archs this CUDA cannot compile."""
    if not trim:
        return list(arch_lists)
    known = supported_archs(Version(cuda), settings)
    out: list[str] = []
    for archs in arch_lists:
        kept = tuple(a for a in parse_arch_list(archs) if known is None or a.number in known)
        text = format_arch_list(kept) if kept else ""
        if text and text not in out:
            out.append(text)
    return out


def _check_cell(farm: Farm, entry: FarmEntry, cuda_ext: bool, index: Any, cuda: str, archs: str, torch: str,
                settings: Settings | None = None) -> None:
    """Every combination the farm names must be buildable; the ones that are not are excluded explicitly."""
    try:
        check_torch_matches_cuda(index, torch, Version(cuda), settings)
    except UsageError as e:
        raise FarmError(f"{farm.file}: {entry.where} combines CUDA {cuda} with torch {torch}: {e.message}",
                        f"add [[exclude]] package = {entry.name!r}, cuda = {cuda!r}, torch = {torch!r}") from e
    if cuda_ext:
        try:
            check_archs_for_cuda(parse_arch_list(archs), Version(cuda), settings)
        except UsageError as e:
            raise FarmError(f"{farm.file}: {entry.where} combines CUDA {cuda} with archs {archs}: "
                            f"{e.message.removeprefix('--arch ')}",
                            f"set archs-where-supported = true, or add [[exclude]] package = {entry.name!r}, "
                            f"cuda = {cuda!r}, arch = {archs!r}") from e


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
            "kind": t.kind,
            "cuda": t.cuda,
            "arch": t.archs,
            "python": t.python,
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


# ---------------------------------------------------------------- what the wheelhouse already holds


def wheelhouse_records(root: Path, *, staging: bool = True) -> list[dict[str, Any]]:
    """Every readable build record of wheels that exist (published, and staged unless ``staging=False``)."""
    from builder.index.store import Wheelhouse

    house = Wheelhouse(root)
    areas = [house, house.staging()] if staging else [house]
    records = []
    for area in areas:
        if not area.records.is_dir():
            continue
        for path in sorted(area.records.glob("*.whl.json")):
            wheel = area.wheels / path.name.removesuffix(".json")
            try:
                record = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            if isinstance(record, dict) and wheel.exists():
                records.append({**record, "_wheel": str(wheel)})
    return records


@dataclass(frozen=True)
class Identity:
    """What a target's wheel is made of, without a toolkit or build venv (for ``matrix --changed``)."""

    recipe_sha256: str
    patches: tuple[tuple[str, str], ...]
    source_sha256: str | None  # None: a git checkout (its commit is known only after cloning)
    index_url: str


def identity(target: FarmTarget, settings: Settings) -> Identity:
    from builder.core.errors import SourceError
    from builder.core.fsutil import sha256_file, tree_digest
    from builder.stages.plan import make_plan

    target_settings = target.settings(settings)
    try:  # the release list expand() fetched is in the cache: no request per target
        plan = make_plan(target.to_target(1), dataclasses.replace(target_settings, offline=True))
    except SourceError:
        plan = make_plan(target.to_target(1), target_settings)
    digest: str | None = plan.source.sha256
    if plan.source.kind == "path":
        path = Path(plan.source.location)
        digest = tree_digest(path) if path.is_dir() else sha256_file(path)
    elif plan.source.kind == "git":
        digest = None
    return Identity(plan.recipe.sha256(), tuple((p.name, p.sha256()) for p in plan.patches), digest, plan.index.url)


def record_matches(record: dict[str, Any], target: FarmTarget, ident: Identity) -> bool:
    try:
        python = record.get("python") or {}
        patches = tuple((p["file"], p["sha256"]) for p in record.get("patches", []))
        same = (
            canonicalize_name(str(record.get("package"))) == canonicalize_name(target.package)
            and Version(str(record.get("version"))) == Version(target.version)
            and _cuda_key(str(record.get("cuda"))) == _cuda_key(target.cuda)
            and (target.kind != "cuda-extension"
                 or list(record.get("archs") or []) == [str(a) for a in parse_arch_list(target.archs)])
            and _python_matches(str(python.get("version")), target.python)
            and Version(str(python.get("torch"))).public == Version(target.torch).public
            and record.get("torch_index") == ident.index_url
            and (record.get("recipe") or {}).get("sha256") == ident.recipe_sha256
            and patches == ident.patches
            and (ident.source_sha256 is None or (record.get("source") or {}).get("sha256") == ident.source_sha256)
            and record.get("builder_version") == __version__
        )
    except (InvalidVersion, KeyError, TypeError, AttributeError):
        return False
    return bool(same)


def _python_matches(recorded: str, wanted: str) -> bool:
    if _is_path(wanted):
        return True  # an interpreter path: its version is known only by running it
    return recorded == wanted or recorded.startswith(wanted + ".")


def changed_targets(targets: list[FarmTarget], settings: Settings) -> list[FarmTarget]:
    """The targets that no wheelhouse record matches (``record_matches``)."""
    records = wheelhouse_records(settings.wheelhouse)
    by_package: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_package.setdefault(canonicalize_name(str(record.get("package"))), []).append(record)
    changed = []
    for target in targets:
        candidates = by_package.get(canonicalize_name(target.package), [])
        if not candidates:
            changed.append(target)
            continue
        ident = identity(target, settings)
        if not any(record_matches(r, target, ident) for r in candidates):
            changed.append(target)
    return changed


# ---------------------------------------------------------------- the exact "unchanged" check, before any worker


class _Undecided(Exception):
    """The up-front check cannot decide this target without side effects; the worker decides."""


@dataclass
class Unchanged:
    wheel: Path
    cache_key: str
    seconds: float  # time this target's decision took


def find_unchanged(targets: list[FarmTarget], settings: Settings, *, stage: bool = False) -> dict[str, Unchanged]:
    """Targets whose real cache key (the pipeline's, over every input) has a wheel in the wheelhouse.

    Uses the pipeline's own functions with offline settings, memoised per toolkit, build venv and source, so
    N unchanged targets cost one ``nvcc --version`` per toolkit and one torch probe per build venv. Anything that
    cannot be decided from what is cached (a venv not created yet, a source not downloaded, a toolchain that
    fails) is left to the worker, whose run_build decides again with the same key.
    """
    from builder.index.store import Wheelhouse
    from builder.pipeline.run import _python_env, compiler_identity
    from builder.stages.plan import cache_key, make_plan
    from builder.stages.source import fetch
    from builder.toolchain import select_toolkit
    from builder.toolchain.select import container_engine_answers

    house = Wheelhouse(settings.wheelhouse)
    keys: dict[str, Path] = {}
    for area in ([house, house.staging()] if stage else [house]):
        if not area.records.is_dir():
            continue
        for path in area.records.glob("*.whl.json"):
            try:
                key = json.loads(path.read_text()).get("cache_key")
            except (OSError, json.JSONDecodeError, AttributeError):
                continue
            wheel = area.wheels / path.name.removesuffix(".json")
            if key and wheel.exists():
                keys.setdefault(key, wheel)
    if not keys:
        return {}
    toolkits: dict[tuple[str, str], Any] = {}
    envs: dict[tuple[Any, ...], Any] = {}
    sources: dict[tuple[str, str], tuple[Path, str]] = {}
    compilers: dict[str, dict[str, str] | None] = {}  # host compiler per recipe env (a recipe may set CXX)
    found: dict[str, Unchanged] = {}
    environ = dict(os.environ)
    engine: list[bool] = []  # memo: does a container engine answer here?

    def toolkit_for(toolchain: str, cuda: Version, offline: Settings) -> Any:
        # A container build's toolkit and Python live in the image: leave those targets to the worker. "auto"
        # picks the container when an engine answers, so it is decided here only when none does.
        if toolchain == "docker":
            raise _Undecided
        if toolchain == "auto":
            if not engine:
                engine.append(container_engine_answers(environ) is not None)
            if engine[0]:
                raise _Undecided
        choice = select_toolkit(toolchain, cuda, offline, environ)
        container = getattr(choice, "container", None)
        if container is not None:
            close = getattr(container, "close", None)
            if close is not None:
                close()
            raise _Undecided
        return choice.toolkit

    for farm_target in targets:
        start = time.monotonic()
        offline = dataclasses.replace(farm_target.settings(settings), offline=True)
        try:
            plan = make_plan(farm_target.to_target(1), offline)
            toolkit = None
            if plan.recipe.kind == "cuda-extension":
                tk_key = (plan.target.toolchain, str(plan.cuda))
                if tk_key not in toolkits:
                    try:
                        toolkits[tk_key] = toolkit_for(plan.target.toolchain, plan.cuda, offline)
                    except (_Undecided, BuilderError):
                        toolkits[tk_key] = None
                toolkit = toolkits[tk_key]
                if toolkit is None:
                    continue
            env_key = (plan.target.python, plan.torch, plan.index.url, plan.recipe.build_requires)
            if env_key not in envs:
                envs[env_key] = _python_env(plan, offline)[0]
            python = envs[env_key]
            src_key = (plan.source.kind, plan.source.location)
            if src_key not in sources:
                sources[src_key] = fetch(plan.source, offline)
            cc_key = json.dumps(sorted(plan.env.items())) if toolkit is not None else ""
            if cc_key not in compilers:
                compilers[cc_key] = compiler_identity(plan, environ, toolkit, None)
            key = cache_key(plan, source_digest=sources[src_key][1], toolkit=toolkit.record() if toolkit else None,
                            python=python.version, torch=python.torch or "", compiler=compilers[cc_key])
        except (BuilderError, _Undecided):
            continue
        # verified like the pipeline's own check: the wheel's bytes match its record and the pages list it
        verified = house.find_record(key) or (house.staging().find_record(key) if stage else None) \
            if key in keys else None
        if verified:
            found[farm_target.id] = Unchanged(verified[0], key, round(time.monotonic() - start, 2))
    return found


# ---------------------------------------------------------------- the worker (one child process per target)


def run_target(farm_target: FarmTarget, settings: Settings, options: Any, jobs: int, log_path: str) -> dict[str, Any]:
    """Build one target with the pipeline, all output into ``log_path``; returns a small summary (picklable)."""
    from rich.console import Console

    from builder.core.log import log
    from builder.pipeline.run import run_build

    start = time.monotonic()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
    log.console = Console(file=sys.stderr, highlight=False, soft_wrap=True, no_color=True, width=200,
                          force_terminal=False)
    log.quiet = False
    summary: dict[str, Any] = {"id": farm_target.id, "status": "failed", "wheel": None, "timings": {}, "error": None}
    try:
        result = run_build(farm_target.to_target(jobs), farm_target.settings(settings), options)
        summary.update(status=result.status, wheel=str(result.wheel) if result.wheel else None,
                       timings=dict(result.timings))
        log.ok(f"farm: {result.status}: {result.wheel}")
    except BuilderError as e:
        log.error(f"error: {e.one_line()}")
        for line in e.extra:
            log.error(f"  {line}")
        summary.update(error="; ".join([e.one_line(), *e.extra]), exit_code=e.exit_code)
    except Exception as e:  # noqa: BLE001 - one target's bug must not stop the farm; the traceback is in its log
        traceback.print_exc()
        summary.update(error=f"internal error: {type(e).__name__}: {e} (traceback in the log)", exit_code=1)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    summary["seconds"] = round(time.monotonic() - start, 2)
    return summary
