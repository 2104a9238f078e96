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

from builder.core.datafiles import default_patches_dir
from builder.core.settings import Settings
from builder.discovery.compat import is_known_cuda, resolve_index, source_text
from builder.discovery.torchindex import toolkit_versions
from builder.farm.expand import Releases, pypi_versions, versions_in_range
from builder.farm.spec import Farm
from builder.farm.unchanged import wheelhouse_records
from builder.model.cuda import CudaVersion
from builder.model.recipe import find_recipe, load_recipe


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


def watch(farm: Farm, settings: Settings, *, only: Iterable[str] = (), releases: Releases = pypi_versions) -> list[WatchRow]:
    """One row per package of the farm (``only``: canonical names to keep; empty keeps all)."""
    wanted = set(only)
    built: dict[str, set[Version]] = {}
    for record in wheelhouse_records(settings.wheelhouse):
        try:
            built.setdefault(canonicalize_name(record.package), set()).add(Version(record.version))
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


# ---------------------------------------------------------------- torch releases and CUDA toolkits


@dataclass(frozen=True)
class TorchWatchRow:
    """One CUDA on one torch index: what the index has, what the wheelhouse was built with, what is missing."""

    index: str  # index name (pypi, pytorch-cu128, custom)
    cuda: str
    in_farm: bool  # the farm builds this CUDA against this index
    available: tuple[str, ...]  # torch releases on the index for this CUDA, oldest first
    built: tuple[str, ...]  # torch versions wheels in the wheelhouse were built with, for this CUDA and index
    unbuilt: tuple[str, ...]  # torch releases the wheelhouse has no wheel for yet, newer than the newest built
    source: str  # where the index's list came from (index / cache / snapshot) and when
    note: str = ""

    def as_dict(self) -> dict[str, object]:
        return {"index": self.index, "cuda": self.cuda, "in_farm": self.in_farm, "available": list(self.available),
                "built": list(self.built), "unbuilt": list(self.unbuilt), "source": self.source, "note": self.note}


def watch_torch(farm: Farm, settings: Settings) -> list[TorchWatchRow]:
    """Per torch index of the farm and per CUDA: torch releases not built yet; CUDA versions with torch builds (or
    cuda-toolkit compilers on PyPI) that the farm does not build at all."""
    wanted: dict[str, set[str]] = {}  # index spec → CUDA keys the farm builds
    specs: dict[str, str | None] = {}
    for entry in farm.entries:
        key = entry.torch_index or "pypi"
        specs[key] = entry.torch_index
        wanted.setdefault(key, set()).update(c.line for c in entry.cuda)
    built: dict[tuple[str, str], set[Version]] = {}
    for record in wheelhouse_records(settings.wheelhouse):
        record_cuda = record.cuda_version
        torch = record.build_torch
        if torch is not None and record_cuda is not None:
            built.setdefault((record.torch_index, record_cuda.line), set()).add(Version(torch.public))
    rows: list[TorchWatchRow] = []
    farm_cuda: set[str] = set()
    for key, spec in specs.items():
        index = resolve_index(spec, settings)
        source = source_text(index)
        table = index.torch_by_cuda
        minors = sorted({Version(v).release[:2] for versions in table.values() for v in versions}, reverse=True)[:2]
        farm_cuda |= wanted[key]
        for cuda in sorted(set(table) | wanted[key], key=_cuda_order):
            if not cuda[:1].isdigit():
                continue  # cpu builds
            available = table.get(cuda, ())
            have = sorted(built.get((index.url, cuda), set()))
            newest = have[-1] if have else None
            unbuilt = tuple(v for v in available if newest is None or Version(v) > newest)
            if cuda in wanted[key] and not have and available:
                unbuilt = (max(available, key=Version),)  # the farm's target; older ones are not built on purpose
            in_farm = cuda in wanted[key]
            if not in_farm and not any(Version(v).release[:2] in minors for v in available):
                continue  # an old CUDA line nobody builds any more
            note = (("not in the farm: add it to cuda = [...]" if is_known_cuda(CudaVersion.parse(cuda), settings)
                     else f"not in the farm, and no toolchain provides CUDA {cuda} yet: add "
                     f"{cuda} to IMAGE_CUDAS in builder/model/cuda.py (or wait for PyPI's cuda-toolkit {cuda}), then "
                     f"add it to cuda = [...]") if not in_farm else
                    "no torch build for this CUDA on the index" if not available else
                    f"{len(unbuilt)} torch release(s) not built yet" if unbuilt else "up to date")
            rows.append(TorchWatchRow(index.name, cuda, in_farm, available, tuple(str(v) for v in have),
                                      unbuilt if in_farm else (), source, note))
    toolkits, toolkit_source = toolkit_versions(settings)
    for cuda in toolkits:
        if cuda not in farm_cuda and not any(r.cuda == cuda for r in rows):
            rows.append(TorchWatchRow("cuda-toolkit", cuda, False, (), (), (), toolkit_source,
                                      "new CUDA compiler on PyPI; no torch build for it on the farm's indexes yet"))
    return rows




def _cuda_order(cuda: str) -> tuple[int, Version]:
    return (1, Version(cuda)) if cuda[:1].isdigit() else (0, Version("0"))
