"""Strict loading of recipe files (recipes/<name>/recipe.toml) into frozen ``Recipe`` objects: the recipes found by
name (aliases, "did you mean"), the file read, its top-level keys checked, the sections (model/recipeparts.py, each
checked by model/tomlcheck.py's ``TomlChecker``) assembled into a ``Recipe``.

Every problem names the file and the dotted field; an unknown key also names the key it most likely meant.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.core.datafiles import default_patches_dir
from builder.core.errors import RecipeError, UsageError
from builder.core.tomlfile import read_toml
from builder.model.abi import Abi, PerTorchAbi3, StableAbi
from builder.model.arch import KnownBad
from builder.model.recipeparts import (
    PatchSpec,
    SourceSpec,
    Subset,
    cuda_components,
    kernel_tests,
    load_drop,
    load_known_bad,
    load_patch,
    load_per_torch_abi3,
    load_source,
    load_stable_abi,
    load_subset,
    sole_git_version,
    string_table,
    wheel_build,
)
from builder.model.tomlcheck import TomlChecker, TomlSchema


class RecipeKind(StrEnum):
    """What a recipe builds: GPU code compiled per CUDA and arch, or a pure-Python wheel (any CUDA, no arch)."""

    CUDA_EXTENSION = "cuda-extension"
    PURE_PYTHON = "pure-python"

    @property
    def is_cuda(self) -> bool:
        return self is RecipeKind.CUDA_EXTENSION


KINDS = tuple(RecipeKind)


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
    nvcc_peak_gib: float | None = None  # [build] nvcc-peak-gib: one nvcc process's measured peak (MAX_JOBS by memory)
    cuda_components: tuple[str, ...] = ()  # [build] cuda-components: extra CUDA libraries, sorted (cudacomponents.py)
    stable_abi: StableAbi | None = None  # [stable-abi]: the releases with a stable-ABI port (model/abi.py)
    per_torch_abi3: PerTorchAbi3 | None = None  # [per-torch-abi3]: releases whose per-torch wheel is cp310-abi3
    subsets: tuple[Subset, ...] = ()  # [[subset]]: smaller builds for tests only (--subset), never published

    def subset(self, name: str) -> Subset:
        """The ``[[subset]]`` called ``name``, or a UsageError naming the ones there are."""
        found = next((s for s in self.subsets if s.name == name), None)
        if found is None:
            known = ", ".join(s.name for s in self.subsets) or "none"
            raise UsageError(f"--subset {name}: {self.name}'s recipe has no [[subset]] of that name ({self.file})",
                             f"subsets: {known}")
        return found

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

    def build_of(self, version: Version, abi: str | None) -> tuple[int, str]:
        """The wheel build number this recipe makes for ``version`` (its public part) built for ``abi`` (a
        record's: "torch-stable", or None for a per-torch build) and what brought it ("0005: kernel fix: …");
        docs/INDEX.md "Superseded builds"."""
        number, by = wheel_build(self.patches_for(version.public, abi=Abi(abi) if abi else Abi.PER_TORCH))
        return number, "; ".join(f"{p.short}: {p.summary}" for p in by)

    def sha256(self) -> str:
        return hashlib.sha256(self.file.read_bytes()).hexdigest()

    def content_digest(self) -> str:
        """The sha256 of the recipe's parsed data as canonical JSON (keys sorted): what the cache key covers, so
        that comments, blank lines, quoting and key order do not rebuild; ``sha256()`` is the file's bytes."""
        data = _read_toml(self.file)
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
        return hashlib.sha256(text.encode()).hexdigest()



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
    "subset": list,
}
_BUILD: TomlSchema = {"env": dict, "requires": list, "ptxas-split": bool, "cuda-components": list,
                      "nvcc-peak-gib": (float, int)}
_TEST: TomlSchema = {"imports": list, "kernel-tests": str, "kernel-tests-timeout": int, "requires": list, "env": dict}
_RUNTIME: TomlSchema = {"requires": list, "drop": list, "drop-reason": str}



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
    name, kind, versions, default_version = _identity(checker, data, path)
    source = load_source(checker, data.get("source", {}), path)
    if default_version is None:
        default_version = sole_git_version(source, versions)
    build = data.get("build", {})
    checker.keys(build, _BUILD, "build")
    env = string_table(checker, build, "build")
    patches_root = (patches_dir or default_patches_dir(path.parent.parent)) / path.parent.name
    patches = tuple(
        load_patch(checker, item, f"patch[{i}]", patches_root) for i, item in enumerate(data.get("patch", []))
    )
    test = data.get("test", {})
    checker.keys(test, _TEST, "test")
    kernel_path, timeout_s = kernel_tests(checker, test, path)
    test_env = string_table(checker, test, "test")
    runtime = data.get("runtime", {})
    checker.keys(runtime, _RUNTIME, "runtime")
    drop = load_drop(checker, runtime)
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
        nvcc_peak_gib=_peak_gib(checker, build),
        cuda_components=cuda_components(checker, build),
        patches=patches,
        imports=tuple(checker.str_list(test, "imports", "test")),
        kernel_tests=kernel_path,
        kernel_tests_timeout_s=timeout_s,
        test_requires=tuple(checker.str_list(test, "requires", "test")),
        test_env=dict(test_env),
        runtime_requires=tuple(checker.str_list(runtime, "requires", "runtime")),
        runtime_drop=drop,
        runtime_drop_reason=runtime.get("drop-reason", ""),
        known_bad=tuple(load_known_bad(checker, item, f"known-bad[{i}]")
                        for i, item in enumerate(data.get("known-bad", []))),
        stable_abi=load_stable_abi(checker, data["stable-abi"]) if "stable-abi" in data else None,
        per_torch_abi3=load_per_torch_abi3(checker, data["per-torch-abi3"], kind, RecipeKind(kind).is_cuda, patches,
                                            tuple(source.sha256) + tuple(source.commits))
        if "per-torch-abi3" in data else None,
        subsets=_subsets(checker, data.get("subset", [])),
    )


def _identity(checker: TomlChecker, data: dict[str, Any], path: Path) -> tuple[str, str, SpecifierSet, str | None]:
    """The top-level keys checked, then (name, kind, versions, default-version): what the recipe is of."""
    checker.keys(data, _TOP, "")
    name = checker.required(data, "name", "")
    kind = data.get("kind", RecipeKind.CUDA_EXTENSION.value)
    if kind not in KINDS:
        raise RecipeError(f"{path}: field 'kind' is {kind!r}", f"use one of {', '.join(KINDS)}")
    versions = checker.specifier(data.get("versions", ""), "versions")
    default_version = data.get("default-version")
    if default_version is not None:
        checker.version(default_version, "default-version")
    return name, kind, versions, default_version


def _peak_gib(checker: TomlChecker, build: dict[str, Any]) -> float | None:
    """``[build] nvcc-peak-gib``: the measured peak memory of one nvcc process of this recipe, in GiB (> 0)."""
    value = build.get("nvcc-peak-gib")
    if value is None:
        return None
    if not 0 < float(value) <= 256:
        checker.fail("build.nvcc-peak-gib", f"is {value}", "give one nvcc process's measured peak in GiB, e.g. 6.5")
    return float(value)


def _subsets(checker: TomlChecker, items: list[Any]) -> tuple[Subset, ...]:
    found = tuple(load_subset(checker, item, f"subset[{i}]") for i, item in enumerate(items))
    names = [s.name for s in found]
    for i, name in enumerate(names):
        if name in names[:i]:
            checker.fail(f"subset[{i}].name", f"{name!r} is given twice")
    return found
