"""Is an installed wheel a superseded build? (docs/INDEX.md "Superseded builds")

A wheel built here carries its build number in its build record (``build.number``, absent: build 0) and as the
PEP 427 build tag of its file name. The same version built later with a fix patch of the recipe (``[[patch]]
build = N``) has a higher build number; an env that installed the older file keeps it (uv and pip see the same
version installed and change nothing unless told to reinstall), so doctor, install and verify compare the
installed build with the newest the wheelhouse lists for that version and the newest the recipe makes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from builder.core.wheelfile import build_number
from builder.model.recipe import Recipe
from builder.user.envprobe import PackageReport
from builder.user.fit import IndexedWheel


@dataclass(frozen=True)
class Superseded:
    """An installed (or published) wheel whose build a newer one supersedes."""

    package: str
    version: str  # 1.7.0+cu13
    build: int  # the installed wheel's
    newest: int  # the newest build the wheelhouse lists or the recipe makes for that version
    why: str  # what the newest build brought: "0005: kernel fix: …"
    wheel: str | None = None  # the wheelhouse's file of that build; None: only the recipe makes it (build it)

    def line(self, python: Path | None = None) -> str:
        """``causal-conv1d 1.7.0+cu13 build 0 is superseded by build 1 (0005: …): reinstall with builder install
        causal-conv1d``."""
        where = f" --python {python}" if python is not None else ""
        how = "reinstall" if self.wheel else "rebuild and reinstall"
        return (f"{self.package} {self.version} build {self.build} is superseded by build {self.newest}"
                f" ({self.why or 'a fix of the recipe'}): {how} with builder install {self.package}{where}")


def record_build(record: Mapping[str, object] | None) -> int:
    """The build number a build record (its JSON) says: 0 where it has none (a wheel from before build tags)."""
    build = record.get("build") if record else None
    number = build.get("number") if isinstance(build, Mapping) else 0
    return number if isinstance(number, int) and not isinstance(number, bool) else 0


def newer_build(package: str, version: Version, build: int, abi: str | None, recipe: Recipe | None,
                wheels: Iterable[IndexedWheel]) -> Superseded | None:
    """A Superseded when the wheelhouse (``wheels``: its wheels of ``package``) or the recipe has a higher build
    of ``version`` than ``build``; the wheelhouse's file is named where it has that build."""
    listed = [(build_number(w.filename), w.filename) for w in wheels if w.version == version]
    newest_listed, filename = max(listed, default=(0, None))
    newest_recipe, why = recipe.build_of(version, abi) if recipe is not None else (0, "")
    newest = max(newest_listed, newest_recipe)
    if newest <= build:
        return None
    return Superseded(package, str(version), build, newest, why if newest_recipe == newest else "",
                      filename if newest_listed == newest else None)


def installed_superseded(report: PackageReport, recipe: Recipe | None,
                         wheels: Iterable[IndexedWheel]) -> Superseded | None:
    """Whether the installed ``report`` is a superseded build; None where it is not, is not installed, or was not
    built here (no build record: not ours to number)."""
    if not report.installed or report.version is None or report.build_record is None:
        return None
    try:
        version = Version(report.version)
    except InvalidVersion:
        return None
    abi = report.build_record.get("abi")
    return newer_build(report.distribution, version, record_build(report.build_record),
                       abi if isinstance(abi, str) else None, recipe, wheels)
