"""`builder watch`: upstream versions on PyPI newer than what the farm has built.

For every package of the farm: the sdists on PyPI inside the recipe's range, compared with the versions of the
wheels in the wheelhouse (published and staged). Versions above the range are listed apart: the recipe (its
range, maybe its patches) has to be extended before the farm can build them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .farm import Farm, Releases, _pypi_versions, versions_in_range, wheelhouse_records
from .recipe import default_patches_dir, find_recipe, load_recipe
from .settings import Settings


@dataclass(frozen=True)
class WatchRow:
    package: str
    versions: str  # the recipe's range
    source: str  # pypi | path | git
    built: tuple[str, ...]  # versions with a wheel in the wheelhouse, oldest first
    newer: tuple[str, ...]  # PyPI versions inside the range newer than the newest built one (all, if none built)
    beyond: tuple[str, ...]  # PyPI final releases above the range: the recipe needs extending first
    note: str = ""

    def as_dict(self) -> dict[str, object]:
        return {"package": self.package, "versions": self.versions, "source": self.source, "built": list(self.built),
                "newer": list(self.newer), "beyond_range": list(self.beyond), "note": self.note}


def watch(farm: Farm, settings: Settings, *, only: Iterable[str] = (), releases: Releases = _pypi_versions) -> list[WatchRow]:
    """One row per package of the farm (``only``: canonical names to keep; empty keeps all)."""
    wanted = set(only)
    built: dict[str, set[Version]] = {}
    for record in wheelhouse_records(settings.wheelhouse):
        try:
            built.setdefault(canonicalize_name(str(record.get("package"))), set()).add(Version(str(record.get("version"))))
        except InvalidVersion:
            continue
    rows: list[WatchRow] = []
    seen: set[str] = set()
    for entry in farm.entries:
        if wanted and canonicalize_name(entry.name) not in wanted:
            continue
        recipes = entry.recipes or settings.recipes_dir
        recipe = load_recipe(find_recipe(entry.name, recipes), default_patches_dir(recipes))
        name = canonicalize_name(recipe.name)
        if name in seen:
            continue
        seen.add(name)
        have = sorted(built.get(name, set()))
        have_text = tuple(str(v) for v in have)
        if recipe.source.path is not None or recipe.source.git is not None or entry.source or entry.sources:
            kind = "git" if recipe.source.git else "path"
            rows.append(WatchRow(recipe.name, str(recipe.versions), kind, have_text, (), (),
                                 "not built from PyPI: nothing to watch"))
            continue
        available = list(releases(recipe.source.pypi or recipe.name, settings))
        in_range = versions_in_range(recipe, available)
        newest_built = have[-1] if have else None
        newer = tuple(v for v in in_range if newest_built is None or Version(v) > newest_built)
        top = Version(in_range[-1]) if in_range else None
        beyond = sorted(
            (v for v in available if _final(v) and not recipe.versions.contains(Version(v))
             and (top is None or Version(v) > top)),
            key=Version,
        )
        note = "up to date" if not newer and not beyond else ""
        if beyond:
            note = f"{len(beyond)} release(s) above the recipe's range: extend {recipe.file.name} to build them"
        rows.append(WatchRow(recipe.name, str(recipe.versions), "pypi", have_text, newer, tuple(beyond), note))
    return rows


def _final(text: str) -> bool:
    try:
        v = Version(text)
    except InvalidVersion:
        return False
    return not (v.is_prerelease or v.is_devrelease)
