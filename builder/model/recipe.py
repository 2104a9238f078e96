"""Strict loading of recipe files (recipes/<name>/recipe.toml) into frozen ``Recipe`` objects.

Every problem names the file and the dotted field; an unknown key also names the key it most likely meant.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, NoReturn

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.core.datafiles import default_patches_dir
from builder.core.errors import BuilderError, RecipeError, UsageError
from builder.core.tomlfile import read_toml
from builder.model.abi import Abi, PerTorchAbi3, StableAbi
from builder.model.arch import KnownBad, parse_arch_list
from builder.model.cudacomponents import CUDA_COMPONENTS


class RecipeKind(StrEnum):
    """What a recipe builds: GPU code compiled per CUDA and arch, or a pure-Python wheel (any CUDA, no arch)."""

    CUDA_EXTENSION = "cuda-extension"
    PURE_PYTHON = "pure-python"

    @property
    def is_cuda(self) -> bool:
        return self is RecipeKind.CUDA_EXTENSION


KINDS = tuple(RecipeKind)


@dataclass(frozen=True)
class PatchSpec:
    """A unified diff for upstream sources, applied only to versions inside ``versions``."""

    path: Path
    versions: SpecifierSet
    summary: str
    test_only: bool = False  # applied only when asked (planted faults for kernel-test checks)
    abi: Abi | None = None  # applied only to builds of this ABI (a stable-ABI port); None: to every build

    @property
    def name(self) -> str:
        return self.path.name

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class SourceSpec:
    """Where sources come from: a PyPI sdist (default), a git URL, or a local path or archive. An sdist or
    archive is pinned by ``sha256``, a git checkout by ``commits`` (version → the commit its tag must be at)."""

    pypi: str | None = None
    git: str | None = None
    git_ref: str = "v{version}"
    path: Path | None = None
    sha256: dict[str, str] = field(default_factory=dict)
    commits: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Recipe:
    name: str
    file: Path
    summary: str
    kind: RecipeKind
    versions: SpecifierSet
    default_version: str | None
    source: SourceSpec
    build_env: dict[str, str]
    build_requires: tuple[str, ...]
    patches: tuple[PatchSpec, ...]
    imports: tuple[str, ...]
    kernel_tests: Path | None
    kernel_tests_timeout_s: int
    test_requires: tuple[str, ...]
    runtime_requires: tuple[str, ...]
    test_env: dict[str, str] = field(default_factory=dict)  # [test] env: set for the kernel tests
    # upstream Requires-Dist names the wheel does not need at run time (build-time tools), and why
    runtime_drop: tuple[str, ...] = ()
    runtime_drop_reason: str = ""
    known_bad: tuple[KnownBad, ...] = ()  # [[known-bad]]: (arch, CUDA) combinations the plan refuses
    ptxas_split: bool = True  # [build] ptxas-split: false turns off the builder's parallel ptxas (toolchain/base.py)
    cuda_components: tuple[str, ...] = ()  # [build] cuda-components: extra CUDA libraries, sorted (cudacomponents.py)
    stable_abi: StableAbi | None = None  # [stable-abi]: the releases with a stable-ABI port (model/abi.py)
    per_torch_abi3: PerTorchAbi3 | None = None  # [per-torch-abi3]: releases whose per-torch wheel is cp310-abi3

    def python_agnostic(self, version: str) -> PerTorchAbi3 | None:
        """The ``[per-torch-abi3]`` that makes this release's per-torch build one abi3 wheel for every Python, or
        None (a cpXY wheel per Python)."""
        spec = self.per_torch_abi3
        return spec if spec is not None and self.kind.is_cuda and spec.covers(version) else None

    @property
    def directory(self) -> Path:
        return self.file.parent

    def patches_for(self, version: str, include_test_only: tuple[str, ...] = (),
                    abi: Abi = Abi.PER_TORCH) -> tuple[PatchSpec, ...]:
        v = Version(version)
        return tuple(
            p
            for p in self.patches
            if p.versions.contains(v, prereleases=True) and (not p.test_only or p.name in include_test_only)
            and p.abi in (None, abi)
        )

    def sha256(self) -> str:
        return hashlib.sha256(self.file.read_bytes()).hexdigest()

    def content_digest(self) -> str:
        """The sha256 of the recipe's parsed data as canonical JSON (keys sorted): what the cache key covers, so
        that comments, blank lines, quoting and key order do not rebuild; ``sha256()`` is the file's bytes."""
        data = _read_toml(self.file)
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
        return hashlib.sha256(text.encode()).hexdigest()


# A TOML table's schema: each legal key → its type, or a tuple of the types it may have.
TomlSchema = Mapping[str, type | tuple[type, ...]]

# The schema: section → {key: expected type}. It is also the registry of legal names (for "did you mean").
_TOP: TomlSchema = {
    "name": str,
    "summary": str,
    "kind": str,
    "versions": str,
    "default-version": str,
    "source": dict,
    "build": dict,
    "patch": list,
    "test": dict,
    "runtime": dict,
    "known-bad": list,
    "stable-abi": dict,
    "per-torch-abi3": dict,
}
_SOURCE: TomlSchema = {"pypi": str, "git": str, "git-ref": str, "path": str, "sha256": dict, "commits": dict}
_BUILD: TomlSchema = {"env": dict, "requires": list, "ptxas-split": bool, "cuda-components": list}
_PATCH: TomlSchema = {"file": str, "versions": str, "summary": str, "test-only": bool, "abi": str}
_STABLE_ABI: TomlSchema = {"versions": str, "torch-floor": str, "namespaces": list, "python-floor": str}
_PER_TORCH_ABI3: TomlSchema = {"versions": str, "python-floor": str}
_TEST: TomlSchema = {"imports": list, "kernel-tests": str, "kernel-tests-timeout": int, "requires": list, "env": dict}
DEFAULT_KERNEL_TESTS_TIMEOUT_S = 3600
_RUNTIME: TomlSchema = {"requires": list, "drop": list, "drop-reason": str}
_KNOWN_BAD: TomlSchema = {"archs": list, "cuda": str, "versions": str, "reason": str, "instead": str}


def list_recipes(recipes_dir: Path) -> list[Path]:
    return sorted(recipes_dir.glob("*/recipe.toml"))


def load_aliases(recipes_dir: Path) -> dict[str, list[str]]:
    """``recipes/aliases.toml``: a name that stands for several recipes (``fla`` → fla-core, flash-linear-attention)."""
    path = recipes_dir / "aliases.toml"
    if not os.path.lexists(path):
        return {}
    data = read_toml(path, RecipeError, what="aliases file")
    for key, members in data.items():
        if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
            raise RecipeError(f"{path}: field '{key}' must be a list of recipe names")
    return {canonicalize_name(k): list(v) for k, v in data.items()}


def expand_name(name: str, recipes_dir: Path) -> list[str]:
    return load_aliases(recipes_dir).get(canonicalize_name(name), [name])


def find_recipe(name: str, recipes_dir: Path) -> Path:
    """The recipe file for a package name (PEP 503-normalised), or a RecipeError suggesting close names."""
    wanted = canonicalize_name(name)
    files = {canonicalize_name(p.parent.name): p for p in list_recipes(recipes_dir)}
    if wanted in files:
        return files[wanted]
    close = difflib.get_close_matches(wanted, list(files), n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"known recipes: {', '.join(sorted(files)) or 'none'}"
    raise RecipeError(f"no recipe for package {name!r} in {recipes_dir}", hint)


def _read_toml(path: Path) -> dict[str, Any]:
    """The recipe file's TOML; every way it can fail (a folder, a fifo, a device, too large, not UTF-8, nested too
    deep) is one RecipeError naming the file."""
    return read_toml(path, RecipeError, what="recipe file")


def load_recipe(path: Path, patches_dir: Path | None = None) -> Recipe:
    """Parse and validate one recipe file."""
    data = _read_toml(path)
    checker = TomlChecker(path)
    checker.keys(data, _TOP, "")
    name = checker.required(data, "name", "")
    kind = data.get("kind", RecipeKind.CUDA_EXTENSION.value)
    if kind not in KINDS:
        raise RecipeError(f"{path}: field 'kind' is {kind!r}", f"use one of {', '.join(KINDS)}")
    versions = checker.specifier(data.get("versions", ""), "versions")
    default_version = data.get("default-version")
    if default_version is not None:
        checker.version(default_version, "default-version")

    source = _load_source(checker, data.get("source", {}), path)
    if default_version is None:
        default_version = _sole_git_version(source, versions)
    build = data.get("build", {})
    checker.keys(build, _BUILD, "build")
    env = _string_table(checker, build, "build")
    patches_root = (patches_dir or default_patches_dir(path.parent.parent)) / path.parent.name
    patches = tuple(
        _load_patch(checker, item, f"patch[{i}]", patches_root) for i, item in enumerate(data.get("patch", []))
    )
    test = data.get("test", {})
    checker.keys(test, _TEST, "test")
    kernel_path, timeout_s = _kernel_tests(checker, test, path)
    test_env = _string_table(checker, test, "test")
    runtime = data.get("runtime", {})
    checker.keys(runtime, _RUNTIME, "runtime")
    drop = _load_drop(checker, runtime)
    return Recipe(
        name=name,
        file=path,
        summary=data.get("summary", ""),
        kind=RecipeKind(kind),
        versions=versions,
        default_version=default_version,
        source=source,
        build_env=dict(env),
        build_requires=tuple(checker.str_list(build, "requires", "build")),
        ptxas_split=build.get("ptxas-split", True),
        cuda_components=_cuda_components(checker, build),
        patches=patches,
        imports=tuple(checker.str_list(test, "imports", "test")),
        kernel_tests=kernel_path,
        kernel_tests_timeout_s=timeout_s,
        test_requires=tuple(checker.str_list(test, "requires", "test")),
        test_env=dict(test_env),
        runtime_requires=tuple(checker.str_list(runtime, "requires", "runtime")),
        runtime_drop=drop,
        runtime_drop_reason=runtime.get("drop-reason", ""),
        known_bad=tuple(_load_known_bad(checker, item, f"known-bad[{i}]")
                        for i, item in enumerate(data.get("known-bad", []))),
        stable_abi=_load_stable_abi(checker, data["stable-abi"]) if "stable-abi" in data else None,
        per_torch_abi3=_load_per_torch_abi3(checker, data["per-torch-abi3"], RecipeKind(kind), patches,
                                            tuple(source.sha256) + tuple(source.commits))
        if "per-torch-abi3" in data else None,
    )


def _load_stable_abi(checker: TomlChecker, table: dict[str, Any]) -> StableAbi:
    """``[stable-abi] versions = "==1.7.0", torch-floor = "2.11", namespaces = ["causal_conv1d_cuda"]``."""
    checker.keys(table, _STABLE_ABI, "stable-abi")
    versions = checker.specifier(checker.required(table, "versions", "stable-abi"), "stable-abi.versions")
    floor_text = checker.required(table, "torch-floor", "stable-abi")
    if not re.fullmatch(r"\d+\.\d+", floor_text):
        checker.fail("stable-abi.torch-floor", f"must be a torch minor such as '2.11', not {floor_text!r}")
    floor = Version(floor_text)
    if (floor.major, floor.minor) < (2, 10):
        checker.fail("stable-abi.torch-floor", f"is {floor_text}: the stable ABI's versioned shims start at 2.10")
    namespaces = checker.str_list(table, "namespaces", "stable-abi")
    if not namespaces:
        checker.fail("stable-abi.namespaces", "is required: the torch.ops namespaces the port registers",
                     "e.g. namespaces = [\"causal_conv1d_cuda\"]: each op there must have a CUDA kernel")
    python_floor = table.get("python-floor", "3.10")
    if not re.fullmatch(r"3\.\d+", python_floor):
        checker.fail("stable-abi.python-floor", f"must be a Python minor such as '3.10', not {python_floor!r}")
    return StableAbi(versions=versions, torch_floor=floor, namespaces=tuple(namespaces), python_floor=python_floor)


def _load_per_torch_abi3(checker: TomlChecker, table: dict[str, Any], kind: RecipeKind,
                         patches: tuple[PatchSpec, ...], releases: tuple[str, ...]) -> PerTorchAbi3:
    """``[per-torch-abi3] versions = "==1.7.0"`` (``python-floor`` defaults to 3.10): the releases whose per-torch
    build gives one cp310-abi3 wheel. The port that makes it so is a ``[[patch]]`` with ``abi = "per-torch"``
    covering each such release (``releases``: those the recipe pins a sha256 or commit for, and the table's own
    ``==`` pins); without one the wheel would be a cpXY pybind module, so the recipe is refused."""
    checker.keys(table, _PER_TORCH_ABI3, "per-torch-abi3")
    if not kind.is_cuda:
        checker.fail("per-torch-abi3", f"is for CUDA extensions; a {kind} recipe builds one py3-none-any wheel "
                     "already", "remove the [per-torch-abi3] table")
    versions = checker.specifier(checker.required(table, "versions", "per-torch-abi3"), "per-torch-abi3.versions")
    python_floor = table.get("python-floor", "3.10")
    if not re.fullmatch(r"3\.\d+", python_floor):
        checker.fail("per-torch-abi3.python-floor", f"must be a Python minor such as '3.10', not {python_floor!r}")
    ports = [p for p in patches if p.abi is Abi.PER_TORCH and not p.test_only]
    listed = sorted({*releases, *(spec.version for spec in versions if spec.operator == "==")}, key=Version)
    uncovered = [v for v in listed if versions.contains(Version(v), prereleases=True)
                 and not any(p.versions.contains(Version(v), prereleases=True) for p in ports)]
    if not ports or uncovered:
        which = ", ".join(uncovered) if uncovered else str(versions)
        checker.fail("per-torch-abi3.versions",
                     f"is {versions}, but no [[patch]] with abi = \"per-torch\" covers {which}: without a port "
                     "(TORCH_LIBRARY ops, py_limited_api) the per-torch wheel is a cpXY pybind module",
                     "add the port as a [[patch]] with abi = \"per-torch\" for those releases, or narrow versions")
    return PerTorchAbi3(versions=versions, python_floor=python_floor)


def _string_table(checker: TomlChecker, section: dict[str, Any], where: str) -> dict[str, str]:
    """``[build] env`` / ``[test] env``: names to string values."""
    env = section.get("env", {})
    for key, value in env.items():
        if not isinstance(value, str):
            checker.fail(f"{where}.env.{key}", f"must be a string, not {type(value).__name__}")
    return dict(env)


def _cuda_components(checker: TomlChecker, build: dict[str, Any]) -> tuple[str, ...]:
    """``[build] cuda-components``: extra CUDA libraries every toolchain must provide, e.g. ["cublas", "cusparse"];
    sorted and without repeats, so the same set is the same toolkit."""
    names = checker.str_list(build, "cuda-components", "build")
    for i, name in enumerate(names):
        if name not in CUDA_COMPONENTS:
            close = difflib.get_close_matches(name.lower(), list(CUDA_COMPONENTS), n=1)
            checker.fail(f"build.cuda-components[{i}]", f"is not a known CUDA component: {name!r}",
                         f"did you mean {close[0]!r}?" if close else f"known: {', '.join(CUDA_COMPONENTS)}")
    return tuple(sorted(set(names)))


def _kernel_tests(checker: TomlChecker, test: dict[str, Any], path: Path) -> tuple[Path | None, int]:
    """``[test] kernel-tests`` (a file beside the recipe) and its timeout in seconds."""
    kernel_tests = test.get("kernel-tests")
    kernel_path = path.parent / kernel_tests if kernel_tests else None  # may not exist yet: the test stage checks
    timeout_s = test.get("kernel-tests-timeout", DEFAULT_KERNEL_TESTS_TIMEOUT_S)
    if timeout_s <= 0:
        checker.fail("test.kernel-tests-timeout", f"must be a positive number of seconds, not {timeout_s}")
    return kernel_path, timeout_s


def _load_known_bad(checker: TomlChecker, item: Any, where: str) -> KnownBad:
    """``[[known-bad]] archs = ["103"], cuda = ">=13", reason = "...", instead = "100+ptx"`` (versions optional)."""
    if not isinstance(item, dict):
        checker.fail(where, "must be a table ([[known-bad]])")
    checker.keys(item, _KNOWN_BAD, where)
    archs = checker.str_list(item, "archs", where)
    if not archs:
        checker.fail(f"{where}.archs", "is required: the SASS archs that give wrong code, e.g. ['103']")
    for i, arch in enumerate(archs):
        try:
            parsed = parse_arch_list(arch)
        except UsageError:
            parsed = ()
        if len(parsed) != 1 or parsed[0].ptx:
            checker.fail(f"{where}.archs[{i}]", f"is not one SASS arch: {arch!r}", "e.g. '103' or '103a'")
    reason = checker.required(item, "reason", where).strip()
    if not reason:
        checker.fail(f"{where}.reason", "is empty: say what goes wrong (and where it was reported)")
    instead = item.get("instead")
    if instead is not None:
        try:
            parse_arch_list(instead)
        except UsageError:
            checker.fail(f"{where}.instead", f"is not an arch list: {instead!r}", "e.g. '100+ptx'")
    versions = item.get("versions")
    return KnownBad(
        archs=tuple(archs),
        cuda=checker.specifier(checker.required(item, "cuda", where), f"{where}.cuda"),
        reason=reason,
        instead=instead,
        versions=checker.specifier(versions, f"{where}.versions") if versions is not None else None,
    )


def _load_drop(checker: TomlChecker, runtime: dict[str, Any]) -> tuple[str, ...]:
    """``[runtime] drop``: project names removed from the wheel's Requires-Dist, with a required ``drop-reason``.

    torch cannot be dropped (finalize pins it), and a name cannot be both dropped and required."""
    names = checker.str_list(runtime, "drop", "runtime")
    for i, name in enumerate(names):
        if not _NAME.fullmatch(name):
            checker.fail(f"runtime.drop[{i}]", f"must be a bare project name (no version or marker), not {name!r}")
        if canonicalize_name(name) == "torch":
            checker.fail(f"runtime.drop[{i}]", "cannot drop torch", "the wheel is pinned to the torch it was built with")
    if names and not runtime.get("drop-reason", "").strip():
        checker.fail("runtime.drop-reason", "is required with runtime.drop",
                     "say why the wheel does not need them at run time, e.g. 'build-time only: not imported by …'")
    required = {canonicalize_name(_requirement_name(r)) for r in checker.str_list(runtime, "requires", "runtime")}
    both = sorted({canonicalize_name(n) for n in names} & required)
    if both:
        checker.fail("runtime.drop", f"names {', '.join(both)}, which runtime.requires also lists")
    return tuple(canonicalize_name(n) for n in names)


_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")


def _requirement_name(text: str) -> str:
    try:
        return Requirement(text).name
    except InvalidRequirement:
        return text


def _load_source(checker: TomlChecker, table: dict[str, Any], path: Path) -> SourceSpec:
    checker.keys(table, _SOURCE, "source")
    given = [k for k in ("pypi", "git", "path") if k in table]
    if len(given) > 1:
        checker.fail("source", f"give only one of pypi, git, path (found {', '.join(given)})")
    sha256 = table.get("sha256", {})
    if sha256 and "git" in table:
        checker.fail("source.sha256", "pins nothing for a git source (a clone is not an archive)",
                     'pin each version to its commit instead: [source.commits] "<version>" = "<40-hex commit>"')
    for version, digest in sha256.items():
        checker.version(version, f"source.sha256.{version}")
        if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            checker.fail(f"source.sha256.{version}", "must be 64 lowercase hex digits")
    commits = _load_commits(checker, table)
    local = table.get("path")
    git_ref = checker.template(table.get("git-ref", "v{version}"), "source.git-ref", "version")
    return SourceSpec(
        pypi=table.get("pypi"),
        git=table.get("git"),
        git_ref=git_ref,
        path=(path.parent / local).resolve() if local else None,
        sha256=dict(sha256),
        commits=commits,
    )


def _load_commits(checker: TomlChecker, table: dict[str, Any]) -> dict[str, str]:
    """``[source.commits]``: version → the full commit id its git ref must be at (checked after the clone)."""
    commits = table.get("commits", {})
    if commits and "git" not in table:
        checker.fail("source.commits", "is only for a git source", "an sdist or archive is pinned by [source.sha256]")
    for version, commit in commits.items():
        checker.version(version, f"source.commits.{version}")
        if not isinstance(commit, str) or not _COMMIT.fullmatch(commit):
            checker.fail(f"source.commits.{version}",
                         f"must be a full commit id (40 lowercase hex digits), not {commit!r}",
                         "`git ls-remote URL TAG 'TAG^{}'` prints it (an annotated tag's commit is the ^{} line)")
    return dict(commits)


_COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # SHA-1, or SHA-256 for repositories in that format


def _sole_git_version(source: SourceSpec, versions: SpecifierSet) -> str | None:
    """The version a git recipe builds when none is given and it names no ``default-version``: the only one it
    pins in ``[source.commits]``, else the only one its range allows (``versions = "==X"``); None when several."""
    if source.git is None:
        return None
    pinned = [v for v in source.commits if versions.contains(v, prereleases=True)]
    if len(pinned) == 1:
        return pinned[0]
    if pinned:
        return None
    specs = list(versions)
    if len(specs) == 1 and specs[0].operator in ("==", "===") and "*" not in specs[0].version:
        return specs[0].version
    return None


def _load_patch(checker: TomlChecker, item: Any, where: str, patches_root: Path) -> PatchSpec:
    if not isinstance(item, dict):
        checker.fail(where, "must be a table ([[patch]])")
    checker.keys(item, _PATCH, where)
    file = checker.required(item, "file", where)
    patch_path = patches_root / file
    if not patch_path.is_file():
        checker.fail(f"{where}.file", f"patch {patch_path} does not exist",
                     f"a recipe's patches are read from <patches>/{patches_root.name}/, where <patches> is the "
                     "patches/ folder beside the recipes folder unless --patches DIR (or BUILDER_PATCHES) names "
                     "another")
    abi = item.get("abi")
    if abi is not None and abi not in tuple(Abi):
        checker.fail(f"{where}.abi", f"is {abi!r}", f"use one of {', '.join(Abi)} (or leave it out: every build)")
    return PatchSpec(
        path=patch_path,
        versions=checker.specifier(checker.required(item, "versions", where), f"{where}.versions"),
        summary=item.get("summary", ""),
        test_only=item.get("test-only", False),
        abi=Abi(abi) if abi is not None else None,
    )


_TYPE_NAMES: dict[type, str] = {str: "string", list: "list", dict: "table", int: "integer", bool: "boolean"}


class TomlChecker:
    """Validation helpers for TOML files (recipes, farm.toml): every error names the file and the dotted field.

    ``error`` is the BuilderError subclass raised; a schema maps each legal key to a type or a tuple of types, and
    is also the registry of names for "did you mean".
    """

    error: type[BuilderError] = RecipeError

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, field_name: str, problem: str, hint: str | None = None) -> NoReturn:
        raise self.error(f"{self.path}: field '{field_name}' {problem}", hint)

    def keys(self, table: Any, schema: TomlSchema, where: str) -> None:
        if not isinstance(table, dict):
            self.fail(where or "(top level)", "must be a table")
        for key, value in table.items():
            dotted = f"{where}.{key}" if where else key
            if key not in schema:
                close = difflib.get_close_matches(key, list(schema), n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(schema)}"
                raise self.error(f"{self.path}: unknown field '{dotted}'", hint)
            expected = schema[key]
            types = expected if isinstance(expected, tuple) else (expected,)
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                wanted = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)
                article = "an" if wanted[0] in "aeiou" else "a"
                self.fail(dotted, f"must be {article} {wanted}, not {type(value).__name__}")

    def template(self, text: str, field_name: str, placeholder: str) -> str:
        """A string in which ``{placeholder}`` is replaced (``str.format``): that placeholder alone, bare. A format
        spec or conversion is refused, not tried: ``{version:999999999}`` would build a gigabyte string."""
        try:
            fields = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(text)
                      if name is not None]
        except ValueError as e:
            self.fail(field_name, f"is {text!r}: {e}", f"write {{{placeholder}}} for the placeholder and {{{{ }}}} "
                      "for a literal brace")
        for name, spec, conversion in fields:
            if name != placeholder or spec or conversion:
                shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
                self.fail(field_name, f"is {text!r}: {shown} is not allowed", f"the only placeholder it may hold is "
                          f"{{{placeholder}}}, with no format spec or conversion")
        return text

    def required(self, table: dict[str, Any], key: str, where: str) -> Any:
        if key not in table:
            self.fail(f"{where}.{key}" if where else key, "is required")
        return table[key]

    def str_list(self, table: dict[str, Any], key: str, where: str) -> list[str]:
        values = table.get(key, [])
        for i, value in enumerate(values):
            if not isinstance(value, str):
                self.fail(f"{where}.{key}[{i}]", f"must be a string, not {type(value).__name__}")
        return list(values)

    def specifier(self, text: str, field_name: str) -> SpecifierSet:
        try:
            spec = SpecifierSet(text)
        except InvalidSpecifier as e:
            raise self.error(
                f"{self.path}: field '{field_name}' is not a version range: {text!r}",
                "use a PEP 440 specifier such as '>=1.5.2,<=1.7.0'",
            ) from e
        return spec

    def version(self, text: str, field_name: str) -> None:
        try:
            Version(text)
        except InvalidVersion as e:
            raise self.error(f"{self.path}: field '{field_name}' is not a version: {text!r}") from e
