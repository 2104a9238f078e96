"""A recipe's sections, each read and checked on its own: ``[source]`` (``SourceSpec``, its sha256 and commit pins),
``[[patch]]`` (``PatchSpec``), ``[[known-bad]]``, ``[stable-abi]``, ``[per-torch-abi3]``, ``[runtime] drop``, and the
``env``, ``cuda-components`` and ``kernel-tests`` keys of ``[build]`` and ``[test]``. model/recipe.py reads the file
and assembles the ``Recipe`` from them."""

from __future__ import annotations

import difflib
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.core.errors import UsageError
from builder.model.abi import Abi, PerTorchAbi3, StableAbi
from builder.model.arch import KnownBad, parse_arch_list
from builder.model.cudacomponents import CUDA_COMPONENTS
from builder.model.tomlcheck import TomlChecker, TomlSchema

_SOURCE: TomlSchema = {"pypi": str, "git": str, "git-ref": str, "path": str, "sha256": dict, "commits": dict}
_PATCH: TomlSchema = {"file": str, "versions": str, "summary": str, "test-only": bool, "abi": str, "build": int}
_STABLE_ABI: TomlSchema = {"versions": str, "torch-floor": str, "namespaces": list, "python-floor": str}
_PER_TORCH_ABI3: TomlSchema = {"versions": str, "python-floor": str}
DEFAULT_KERNEL_TESTS_TIMEOUT_S = 3600
_KNOWN_BAD: TomlSchema = {"archs": list, "cuda": str, "versions": str, "reason": str, "instead": str}
_SUBSET: TomlSchema = {"name": str, "env": dict, "summary": str}


@dataclass(frozen=True)
class Subset:
    """A recipe's ``[[subset]]``: a smaller build for tests and CI only (flash-attn with one head dim, so a GPU check
    fits one short call), made by setting ``env`` for the build. ``builder build --subset NAME``; its wheel is
    tested, never published (index/store.py refuses it)."""

    name: str
    env: dict[str, str]
    summary: str


def load_subset(checker: TomlChecker, item: Any, where: str) -> Subset:
    """``[[subset]] name = "hdim128", env = { FLASH_ATTN_HDIMS = "128" }, summary = "..."``."""
    if not isinstance(item, dict):
        checker.fail(where, "must be a table ([[subset]])")
    checker.keys(item, _SUBSET, where)
    name = checker.required(item, "name", where)
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name):
        checker.fail(f"{where}.name", f"is {name!r}", "use lowercase letters, digits and '-', e.g. 'hdim128'")
    env = string_table(checker, item, where)
    if not env:
        checker.fail(f"{where}.env", "is required: the build variables that make the subset")
    return Subset(name=name, env=env, summary=checker.required(item, "summary", where))


@dataclass(frozen=True)
class PatchSpec:
    """A unified diff for upstream sources, applied only to versions inside ``versions``."""

    path: Path
    versions: SpecifierSet
    summary: str
    test_only: bool = False  # applied only when asked (planted faults for kernel-test checks)
    abi: Abi | None = None  # applied only to builds of this ABI (a stable-ABI port); None: to every build
    # the wheel build number this patch brings (a fix that changes the kernels' results: docs/INDEX.md "Superseded
    # builds"): a wheel's build tag is the highest of its patches'; 0: the patch changes no result
    build: int = 0

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def short(self) -> str:
        """``0005`` of ``0005-bwd-silu-short-tail-history-1.5.2-1.7.0.patch``."""
        return self.name.split("-", 1)[0]

    def sha256(self) -> str:
        return hashlib.sha256(self.path.read_bytes()).hexdigest()


def wheel_build(patches: tuple[PatchSpec, ...] | list[PatchSpec]) -> tuple[int, tuple[PatchSpec, ...]]:
    """The wheel build number of a build with these patches (the highest ``build`` among them, 0 for none) and
    the patches that bring it."""
    number = max((p.build for p in patches), default=0)
    return number, tuple(p for p in patches if number and p.build == number)


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




def load_stable_abi(checker: TomlChecker, table: dict[str, Any]) -> StableAbi:
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


def load_per_torch_abi3(checker: TomlChecker, table: dict[str, Any], kind: str, cuda_ext: bool,
                        patches: tuple[PatchSpec, ...], releases: tuple[str, ...]) -> PerTorchAbi3:
    """``[per-torch-abi3] versions = "==1.7.0"`` (``python-floor`` defaults to 3.10): the releases whose per-torch
    build gives one cp310-abi3 wheel. The port that makes it so is a ``[[patch]]`` with ``abi = "per-torch"``
    covering each such release (``releases``: those the recipe pins a sha256 or commit for, and the table's own
    ``==`` pins); without one the wheel would be a cpXY pybind module, so the recipe is refused. ``kind`` is the
    recipe's kind as written, ``cuda_ext`` whether it is a CUDA extension (model/recipe.py ``RecipeKind``)."""
    checker.keys(table, _PER_TORCH_ABI3, "per-torch-abi3")
    if not cuda_ext:
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


def string_table(checker: TomlChecker, section: dict[str, Any], where: str) -> dict[str, str]:
    """``[build] env`` / ``[test] env``: names to string values."""
    env = section.get("env", {})
    for key, value in env.items():
        if not isinstance(value, str):
            checker.fail(f"{where}.env.{key}", f"must be a string, not {type(value).__name__}")
    return dict(env)


def cuda_components(checker: TomlChecker, build: dict[str, Any]) -> tuple[str, ...]:
    """``[build] cuda-components``: extra CUDA libraries every toolchain must provide, e.g. ["cublas", "cusparse"];
    sorted and without repeats, so the same set is the same toolkit."""
    names = checker.str_list(build, "cuda-components", "build")
    for i, name in enumerate(names):
        if name not in CUDA_COMPONENTS:
            close = difflib.get_close_matches(name.lower(), list(CUDA_COMPONENTS), n=1)
            checker.fail(f"build.cuda-components[{i}]", f"is not a known CUDA component: {name!r}",
                         f"did you mean {close[0]!r}?" if close else f"known: {', '.join(CUDA_COMPONENTS)}")
    return tuple(sorted(set(names)))


def kernel_tests(checker: TomlChecker, test: dict[str, Any], path: Path) -> tuple[Path | None, int]:
    """``[test] kernel-tests`` (a file beside the recipe) and its timeout in seconds."""
    kernel_tests = test.get("kernel-tests")
    kernel_path = path.parent / kernel_tests if kernel_tests else None  # may not exist yet: the test stage checks
    timeout_s = test.get("kernel-tests-timeout", DEFAULT_KERNEL_TESTS_TIMEOUT_S)
    if timeout_s <= 0:
        checker.fail("test.kernel-tests-timeout", f"must be a positive number of seconds, not {timeout_s}")
    return kernel_path, timeout_s


def load_known_bad(checker: TomlChecker, item: Any, where: str) -> KnownBad:
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


def load_drop(checker: TomlChecker, runtime: dict[str, Any]) -> tuple[str, ...]:
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


def load_source(checker: TomlChecker, table: dict[str, Any], path: Path) -> SourceSpec:
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


def sole_git_version(source: SourceSpec, versions: SpecifierSet) -> str | None:
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


def load_patch(checker: TomlChecker, item: Any, where: str, patches_root: Path) -> PatchSpec:
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
    build = item.get("build", 0)
    if "build" in item and build < 1:
        checker.fail(f"{where}.build", f"is {build!r}",
                     "the wheel build number this fix brings: a whole number from 1 (docs/INDEX.md \"Superseded "
                     "builds\"); leave it out for a patch that changes no kernel's result")
    if build and item.get("test-only", False):
        checker.fail(f"{where}.build", "is set on a test-only patch", "a planted fault is never published: drop it")
    abi = item.get("abi")
    if abi is not None and abi not in tuple(Abi):
        checker.fail(f"{where}.abi", f"is {abi!r}", f"use one of {', '.join(Abi)} (or leave it out: every build)")
    return PatchSpec(
        path=patch_path,
        versions=checker.specifier(checker.required(item, "versions", where), f"{where}.versions"),
        summary=item.get("summary", ""),
        test_only=item.get("test-only", False),
        abi=Abi(abi) if abi is not None else None,
        build=build,
    )
