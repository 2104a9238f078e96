"""What users have and what the wheelhouse gives them: ``builder coverage``.

The users' matrix of a package is every (torch minor, CUDA line, Python minor, platform) cell (``served.Cell``) that
the known torch indexes offer (PyPI and PyTorch's channels, ``discovery/compat.known_indexes``) on a CUDA line the
recipe can serve (>= 12.8: the Blackwell archs), on x86_64 and aarch64, each platform's CUDA and Pythons read from
that platform's own wheels (discovery/torchindex.py ``PlatformFacts``: PyPI's aarch64 torch has CUDA from 2.11.0).
A platform whose wheels were not read (PyTorch's channels in a snapshot written where they cannot be reached) is
unknown: its cells are shown as such (``MatrixFacts.unknown``), never counted. Free-threaded Pythons are not counted
(no recipe builds for them). For each cell, the wheel of the wheelhouse that serves it and the evidence, each
counted only where it ran (the Python of its venv, the platform it ran for):

- ``kernel-tested``: the wheel's kernel suite passed on a GPU with that torch (a per-torch wheel's record; a stable
  wheel's ``gpu-kernel-tests`` torch check on that torch minor and CUDA line, or its own kernel test there);
- ``import-verified``: a per-torch wheel whose import test passed on its own torch; a stable wheel with a passed
  ``import+registration`` check on that torch minor and CUDA line (and no failed one);
- ``inferred``: one of those, run on another Python or platform of the same file (abi3, py3-none-any); shown, not
  served;
- ``built``: a wheel for the cell, without evidence;
- ``missing``, with why: ``known-bad`` (the recipe's [[known-bad]] refuses every arch the farm builds for that
  CUDA), ``triton pin: …`` (no wheel of the version installs beside that torch: the torch release pins a triton
  the wheel's triton requirement refuses, farm/facts.py ``triton_reason``), ``below the port's floor and not a farm
  target``, ``not in farm.toml`` (no target of the farm would serve
  it: farm/served.py ``served_cells``, against this same matrix), ``a farm target serves it, not built yet``.

``builder matrix`` counts the farm's targets against this same matrix (``farm_serves``): the cells they would
serve once built and verified, and why each other cell is not served.

A cell counts as served only with evidence (kernel-tested or import-verified). A per-torch wheel's ``cp3XX`` tag
serves that Python alone (``py3``: every Python); a ``cp310-abi3`` wheel every Python >= 3.10; a wheel's platform
tag its platform (``any``: every platform). An unlabelled ``py3-none-any`` wheel (a pure-Python recipe built once per
version) is for every cell, verified per (torch minor, CUDA line) by its record's torch checks, as a stable wheel is.

The package version is the newest in the recipe's range that has a wheel in the wheelhouse, else the recipe's newest
known version (its pinned sdists and commits, its default version, its range's upper bound).

Over 400 lines on purpose: the users' matrix, each cell's evidence from the wheelhouse and each missing cell's reason
are one report made in one pass over the same cells; the parts that stand alone are rooms of their own already
(farm/wheelcells.py what one wheel serves, farm/cellstext.py the cells in words, farm/facts.py the installability
facts, farm/served.py what the farm's targets serve).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from builder.core.datafiles import default_patches_dir
from builder.core.errors import BuilderError, UsageError
from builder.core.settings import Settings
from builder.discovery.compat import TorchIndex, known_indexes, source_text
from builder.farm.abifold import on_major
from builder.farm.cellstext import cells_list
from builder.farm.coverageinputs import check_folders, check_release, parse_asked, releases_or_why
from builder.farm.expand import expand
from builder.farm.facts import minor_releases, triton_reason, wheel_facts
from builder.farm.served import Cell, serving
from builder.farm.spec import find_farm_file, load_farm
from builder.farm.wheelcells import (
    BUILT,
    IMPORT,
    INFERRED,
    KERNEL,
    UNKNOWN_ARCH,
    arch_number,
    rank,
    tested_arch_name,
    wheel_archs,
    wheel_cells,
    wheel_platforms,
)
from builder.index.store import Wheelhouse
from builder.model.abi import StableAbi, torch_minor
from builder.model.arch import Arch
from builder.model.cuda import CudaVersion
from builder.model.platform import PLATFORMS
from builder.model.recipe import Recipe, find_recipe, load_recipe
from builder.model.records import BuildRecord

MIN_CUDA = CudaVersion.parse("12.8")  # the first CUDA with Blackwell (sm_100, sm_120) code
USERS_PLATFORMS = tuple(PLATFORMS)  # x86_64, aarch64

MISSING = "missing"

NOT_IN_FARM = "not in farm.toml"
BELOW_FLOOR = "below the port's floor and not a farm target"
KNOWN_BAD = "known-bad"
NOT_BUILT = "a farm target serves it, not built yet"
TRITON_PIN = "triton pin"  # the reason's head; its tail names the torch release and the requirement

Indexes = Callable[[Settings | None], list[TorchIndex]]


@dataclass(frozen=True)
class CellStatus:
    """One cell of the users' matrix and what serves it."""

    cell: Cell
    status: str  # kernel-tested | import-verified | inferred | built | missing
    evidence: str  # "kernel-tested on sm_90 (GPU NVIDIA H200)", "import-verified on torch 2.12.1", ...
    wheel: str | None = None
    reason: str | None = None  # missing only
    # kernel-tested only: the archs the wheel ships ("sm_90", "sm_120") and the one its kernel tests ran on ("sm_90",
    # or "unknown arch" where the record names no capability and its GPU's name maps to no single arch)
    archs: tuple[str, ...] = ()
    tested_arch: str | None = None

    @property
    def served(self) -> bool:
        return self.status in (KERNEL, IMPORT)

    def to_json(self) -> dict[str, Any]:
        return {"torch": self.cell.torch, "cuda": self.cell.cuda, "python": self.cell.python,
                "platform": self.cell.platform, "status": self.status, "evidence": self.evidence, "wheel": self.wheel,
                "reason": self.reason, "tested_arch": self.tested_arch}


@dataclass(frozen=True)
class PackageCoverage:
    package: str
    version: str
    version_from: str  # "wheelhouse" | "recipe"
    cells: tuple[CellStatus, ...]
    notes: tuple[str, ...] = ()

    def totals(self) -> dict[str, Any]:
        missing: dict[str, int] = {}
        for c in self.cells:
            if c.status == MISSING:
                missing[c.reason or "?"] = missing.get(c.reason or "?", 0) + 1
        count = lambda status: sum(1 for c in self.cells if c.status == status)  # noqa: E731
        platforms = sorted({c.cell.platform for c in self.cells}, key=lambda p: (p != "x86_64", p))
        return {"cells": len(self.cells), "served": sum(1 for c in self.cells if c.served),
                "kernel_tested": count(KERNEL), "import_verified": count(IMPORT), "inferred": count(INFERRED),
                "built_unverified": count(BUILT),
                "missing": sum(missing.values()), "missing_by_reason": dict(sorted(missing.items())),
                "gpu_evidenced": self.gpu_evidenced(),
                "by_platform": {p: {"cells": sum(1 for c in self.cells if c.cell.platform == p),
                                    "served": sum(1 for c in self.cells if c.cell.platform == p and c.served)}
                                for p in platforms}}

    def gpu_evidenced(self) -> dict[str, int]:
        """Per arch the kernel-tested wheels ship, the cells whose kernel tests ran on a GPU of that arch (a record
        with capability 9.0 counts sm_90, not the wheel's sm_120); "unknown arch": kernel-tested where no arch is
        known."""
        out: dict[str, int] = {}
        for c in self.cells:
            if c.status != KERNEL:
                continue
            for arch in c.archs:
                out[arch] = out.get(arch, 0) + (arch in (c.tested_arch or "").split(","))
            if c.tested_arch == UNKNOWN_ARCH:
                out[UNKNOWN_ARCH] = out.get(UNKNOWN_ARCH, 0) + 1
        return dict(sorted(out.items(), key=lambda kv: (kv[0] == UNKNOWN_ARCH, arch_number(kv[0]))))

    def rows(self) -> list[tuple[str, str, str, tuple[str, ...], CellStatus]]:
        """The cells grouped compactly: (platform, CUDA line, torch minor, Pythons, one of them) per equal outcome."""
        groups: dict[tuple[str, str, str, str, str, str | None, str | None], list[CellStatus]] = {}
        order = lambda c: (c.cell.platform != "x86_64", c.cell.platform, Version(c.cell.cuda),  # noqa: E731
                           Version(c.cell.torch), Version(c.cell.python))
        for c in sorted(self.cells, key=order):
            groups.setdefault((c.cell.platform, c.cell.cuda, c.cell.torch, c.status, c.evidence, c.wheel, c.reason),
                              []).append(c)
        return [(key[0], key[1], key[2], tuple(c.cell.python for c in group), group[0])
                for key, group in groups.items()]

    def to_json(self) -> dict[str, Any]:
        return {"package": self.package, "version": self.version, "version_from": self.version_from,
                "totals": self.totals(), "notes": list(self.notes), "cells": [c.to_json() for c in self.cells]}


# ---------------------------------------------------------------- the users' matrix


def users_matrix(indexes: Iterable[TorchIndex], min_cuda: CudaVersion = MIN_CUDA,
                 platforms: Iterable[str] = USERS_PLATFORMS) -> tuple[frozenset[Cell], list[str]]:
    """Every (torch minor, CUDA line, Python, platform) the indexes offer on a CUDA line >= ``min_cuda`` (final
    releases), each platform's CUDA and Pythons as read from that platform's wheels (``Release.cuda_on``: PyPI's
    aarch64 torch 2.10 is a CPU build, so it makes no cell), and notes on what was left out."""
    facts = matrix_facts(indexes, min_cuda, platforms)
    return facts.cells, facts.notes


@dataclass(frozen=True)
class MatrixFacts:
    """The users' matrix and what could not be known: ``unknown`` holds the cells a release would make on a platform
    whose wheels were not read (a release-notes row says nothing of aarch64), where its x86_64 CUDA line is known;
    they are never counted, only shown."""

    cells: frozenset[Cell]
    unknown: frozenset[Cell]
    notes: list[str]


def matrix_facts(indexes: Iterable[TorchIndex], min_cuda: CudaVersion = MIN_CUDA,
                 platforms: Iterable[str] = USERS_PLATFORMS) -> MatrixFacts:
    """``users_matrix`` with the unknown cells (``MatrixFacts``)."""
    platforms = tuple(platforms)
    indexes = list(indexes)
    pythons_of: dict[tuple[Version, str], set[str]] = {}
    for index in indexes:
        for release in index.listing.releases if index.listing else ():
            for platform in platforms:
                pythons_of.setdefault((Version(release.version), platform), set()).update(
                    release.pythons_on(platform))
    cells: set[Cell] = set()
    unknown: set[Cell] = set()
    notes: list[str] = []
    unread: dict[tuple[str, str], list[str]] = {}
    for index in indexes:
        for release in index.listing.releases if index.listing else ():
            v = Version(release.version)
            if v.is_prerelease or v.is_devrelease:
                continue
            for platform in platforms:
                read = release.cuda_on(platform)
                cuda = _cuda_line(read if read is not None else release.cuda)
                if cuda is None or (cuda.major, cuda.minor) < (min_cuda.major, min_cuda.minor):
                    continue
                named = (release.pythons_on(platform) or pythons_of.get((v, platform))
                         or pythons_of.get((v, "x86_64")) or ())
                pythons = [p for p in named if not p.endswith("t")]
                if not pythons:
                    notes.append(f"torch {release.version} on {index.name} (CUDA {cuda.line}, {platform}): Pythons "
                                 "unknown, not counted")
                minor = "{}.{}".format(*torch_minor(release.version))
                found = {Cell(minor, cuda.line, p, platform) for p in pythons}
                if read is None:
                    unread.setdefault((index.name, platform), []).append(release.version)
                    unknown.update(found)
                else:
                    cells.update(found)
    for (name, platform), versions in unread.items():
        notes.append(f"{name} {platform}: the CUDA of torch {_releases_text(versions)} was not read from its wheels "
                     "(unknown, not counted)")
    return MatrixFacts(frozenset(cells), frozenset(unknown - cells), notes)


def _cuda_line(text: str | None) -> CudaVersion | None:
    """``12.8`` → its CudaVersion; "cpu", unknown (None) or unreadable → None."""
    try:
        return CudaVersion.parse(text) if text and text != "cpu" else None
    except (InvalidVersion, ValueError):
        return None


def _releases_text(versions: list[str]) -> str:
    ordered = sorted(versions, key=Version)
    return ", ".join(ordered) if len(ordered) <= 3 else f"{ordered[0]} … {ordered[-1]} ({len(ordered)} releases)"


# ---------------------------------------------------------------- one package


def newest_known(recipe: Recipe) -> str | None:
    """The recipe's newest known version without asking PyPI: its pinned sdists and commits, its default version, its
    range's ``==`` / ``<=`` bounds; those inside its range."""
    known = {*recipe.source.sha256, *recipe.source.commits}
    if recipe.default_version:
        known.add(recipe.default_version)
    known.update(s.version for s in recipe.versions if s.operator in ("==", "<=", "==="))
    good = []
    for text in known:
        try:
            if recipe.versions.contains(Version(text), prereleases=True):
                good.append(Version(text))
        except InvalidVersion:
            continue
    return str(max(good)) if good else None


def house_wheels(house: Wheelhouse, recipe: Recipe) -> dict[str, list[tuple[str, BuildRecord | None]]]:
    """The package's wheels in the wheelhouse by version (x86_64, aarch64 or any platform), inside the recipe's
    range."""
    name = canonicalize_name(recipe.name)
    found: dict[str, list[tuple[str, BuildRecord | None]]] = {}
    for path in house.wheel_files() if house.root.is_dir() else ():
        try:
            wname, version, _, _ = parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        if canonicalize_name(wname) != name or not recipe.versions.contains(Version(version.public),
                                                                             prereleases=True):
            continue
        if wheel_platforms(path.name) != set():
            found.setdefault(version.public, []).append((path.name, house.record_of(path.name)))
    return found


@dataclass(frozen=True)
class FarmView:
    """What the project's farm.toml builds of one package version: the cells its targets serve, its arch lists."""

    cells: frozenset[Cell]
    archs: tuple[tuple[Arch, ...], ...] = ()
    note: str = ""


def farm_view(farm_file: Path | None, settings: Settings, recipe: Recipe, matrix: frozenset[Cell],
              version: str) -> FarmView:
    """What the farm file builds of ``recipe`` ``version``: the cells of ``matrix`` (the users' matrix) its targets
    would serve, or a note saying why there are none."""
    try:
        farm = load_farm(find_farm_file(farm_file), settings)
        entries = [e for e in farm.entries if canonicalize_name(e.name) == canonicalize_name(recipe.name)]
        if not entries:
            return FarmView(frozenset(), note=f"{recipe.name} is not in {farm.file}")
        targets = [t for t in expand(farm, settings, only=[recipe.name]) if Version(t.version) == Version(version)]
    except BuilderError as e:
        return FarmView(frozenset(), note=f"farm not read: {e.one_line()}")
    archs = tuple(dict.fromkeys(t.archs for t in targets if t.kind.is_cuda))  # each platform's lists, as built
    if not targets:
        return FarmView(frozenset(), tuple(a for e in entries for a in e.archs),
                        note=f"{farm.file} builds no {recipe.name} {version}")
    served = serving(targets, settings, matrix)
    return FarmView(frozenset().union(*served.values()) & matrix, archs)


def _known_bad(recipe: Recipe, version: str, cell: Cell, archs: tuple[tuple[Arch, ...], ...]) -> str | None:
    """The reason of a [[known-bad]] entry that refuses every arch the farm builds for the cell's CUDA."""
    cuda = CudaVersion.parse(cell.cuda)
    flat = [a for group in archs for a in group]
    if not flat or not recipe.kind.is_cuda:
        return None
    for entry in recipe.known_bad:
        if all(entry.matches(a, cuda, version) for a in flat):
            return entry.reason
    return None


def _port(recipe: Recipe, version: str) -> StableAbi | None:
    stable = recipe.stable_abi
    return stable if recipe.kind.is_cuda and stable and version != "?" and stable.covers(version) else None


def missing_reason(recipe: Recipe, version: str, cell: Cell, view: FarmView,
                   port: StableAbi | None) -> tuple[str, str]:
    """(reason, evidence text) of a cell no wheel serves: known-bad, below the port's floor, not in farm.toml, or a
    farm target would serve it and is not built yet."""
    bad = _known_bad(recipe, version, cell, view.archs) if version != "?" else None
    if bad is not None:
        return KNOWN_BAD, f"missing: known-bad ({bad})"
    if cell in view.cells:
        return NOT_BUILT, f"missing: {NOT_BUILT}"
    pin = triton_pin_reason(recipe, version, cell)
    if pin is not None:  # the real reason before the floor: no wheel of this version installs beside that torch
        return pin, f"missing: {pin}"
    floor = on_major(port, CudaVersion.parse(cell.cuda)) if port is not None else None  # +cu13: 2.11
    if floor is not None and not floor.admits(cell.torch):
        return BELOW_FLOOR, f"missing: {BELOW_FLOOR} ({floor.floor_text})"
    return NOT_IN_FARM, f"missing: {NOT_IN_FARM}"


def triton_pin_reason(recipe: Recipe, version: str, cell: Cell) -> str | None:
    """``triton pin: torch 2.8.0 pins triton 3.4.0: mamba-ssm requires triton>=3.5.0`` where no wheel of
    ``version`` installs beside a torch release of the cell's minor (farm/facts.py ``triton_reason``, the check the
    installable count uses too); None where it does or the wheel's requirements are not recorded."""
    facts = wheel_facts(recipe.name, version) if version != "?" else None
    if facts is None:
        return None
    why = triton_reason(recipe.name, (*recipe.runtime_requires, *facts.requires), minor_releases(cell.torch))
    return f"{TRITON_PIN}: {why}" if why else None


@dataclass(frozen=True)
class FarmServes:
    """What a farm's targets of one package version would serve of the users' matrix once built and verified."""

    package: str
    version: str
    cells: int  # the users' matrix
    served: frozenset[Cell]
    not_served: dict[str, frozenset[Cell]]  # by reason (missing_reason)

    @property
    def percent(self) -> float:
        return 100.0 * len(self.served) / self.cells if self.cells else 0.0

    def line(self, who: str = "farm targets") -> str:
        """``causal-conv1d 1.7.0: farm targets serve 194 of 200 cells (97.0 %); not served: ...``."""
        why = "; ".join(f"{reason} {len(cells)}: {cells_list(cells)}" for reason, cells in self.not_served.items())
        return (f"{self.package} {self.version}: {who} serve {len(self.served)} of {self.cells} cells "
                f"({self.percent:.1f} %)" + (f"; not served: {why}" if why else ""))

    def to_json(self) -> dict[str, Any]:
        return {"matrix_cells": self.cells, "farm_serves": len(self.served), "percent": round(self.percent, 1),
                "not_served": {reason: len(cells) for reason, cells in self.not_served.items()}}


def farm_serves(recipe: Recipe, version: str, matrix: frozenset[Cell], view: FarmView) -> FarmServes:
    """The farm's targets of ``recipe`` ``version`` (``view``) against the users' matrix: the one count ``builder
    matrix`` prints and ``builder coverage`` explains."""
    port = _port(recipe, version)
    served = view.cells & matrix
    missing: dict[str, set[Cell]] = {}
    for cell in sorted(matrix - served):
        missing.setdefault(missing_reason(recipe, version, cell, view, port)[0], set()).add(cell)
    return FarmServes(recipe.name, version, len(matrix), served,
                      {reason: frozenset(cells) for reason, cells in sorted(missing.items())})


def package_coverage(recipe: Recipe, house: Wheelhouse, matrix: frozenset[Cell],
                     farm: Callable[[str], FarmView], asked: str | None = None) -> PackageCoverage:
    """One version's cells: ``asked`` (``builder coverage causal-conv1d==1.6.2.post1``: a previous release), else the
    newest with a wheel in the wheelhouse, else the recipe's newest known one."""
    wheels = house_wheels(house, recipe)
    if asked is not None:
        version, version_from = _asked_version(recipe, asked), "asked"
    elif wheels:
        version, version_from = str(max(map(Version, wheels))), "wheelhouse"
    else:
        version, version_from = newest_known(recipe) or "?", "recipe"
    view = farm(version) if version != "?" else FarmView(frozenset(), note="no version known")
    port = _port(recipe, version)
    best: dict[Cell, tuple[str, str, str]] = {}
    records = dict(wheels.get(version, ()))
    for filename, record in wheels.get(version, ()):
        for cell, (status, evidence) in wheel_cells(filename, record, matrix,
                                                    port.floor_text if port else None).items():
            if cell not in best or rank(status) > rank(best[cell][0]):
                best[cell] = (status, evidence, filename)
    out: list[CellStatus] = []
    for cell in sorted(matrix):
        if cell in best:
            status, evidence, filename = best[cell]
            record = records[filename]
            out.append(CellStatus(cell, status, evidence, filename, archs=wheel_archs(record) if status == KERNEL else (),
                                  tested_arch=tested_arch_name(record) if status == KERNEL else None))
            continue
        reason, evidence = missing_reason(recipe, version, cell, view, port)
        out.append(CellStatus(cell, MISSING, evidence, None, reason))
    notes = (view.note,) if view.note else ()
    return PackageCoverage(recipe.name, version, version_from, tuple(out), notes)


def evidence_counts(recipe: Recipe, house: Wheelhouse, matrix: frozenset[Cell], version: str) -> dict[str, int]:
    """What the wheelhouse's wheels of ``recipe`` ``version`` and their records show for ``matrix``: cells with a
    wheel (``built``, whatever its evidence), cells whose import or kernel tests ran there (``ran``: served), cells
    kernel-tested there (``gpu``), and cells only ``inferred``. Nothing from farm.toml: ``builder matrix``'s
    evidence column."""
    t = package_coverage(recipe, house, matrix, lambda _: FarmView(frozenset()), version).totals()
    return {"built": t["cells"] - t["missing"], "ran": t["served"], "gpu": t["kernel_tested"],
            "inferred": t["inferred"]}


def _asked_version(recipe: Recipe, asked: str) -> str:
    """``asked`` as the version the wheelhouse names (1.6.2.post1), refused outside the recipe's range."""
    version = parse_asked(recipe, asked)
    if not recipe.versions.contains(version, prereleases=True):
        raise UsageError(f"coverage: {recipe.name} {asked} is outside the recipe's supported range {recipe.versions} "
                         f"({recipe.file})", "name a version in that range, or widen the recipe's range")
    return str(version)


def coverage_report(names: Iterable[str], settings: Settings, *, farm_file: Path | None = None,
                    indexes: Indexes | None = None) -> tuple[list[PackageCoverage], dict[str, Any]]:
    """Each named recipe's coverage (every recipe when none is named; ``name==version`` for that release), and the
    matrix's sources; ``indexes``: the torch indexes to read (default ``known_indexes``)."""
    check_folders(settings)
    read = (indexes or known_indexes)(settings)
    facts = matrix_facts(read)
    matrix = facts.cells
    recipes_dir = settings.recipes_dir
    patches = settings.patches_dir or default_patches_dir(recipes_dir)
    wanted = list(names) or sorted(p.parent.name for p in recipes_dir.glob("*/recipe.toml"))
    house = Wheelhouse(settings.wheelhouse)
    reports = []
    for spec in wanted:
        name, _, asked = spec.partition("==")
        recipe = load_recipe(find_recipe(name, recipes_dir), patches)
        if asked:
            check_release(recipe, Version(_asked_version(recipe, asked)), house_wheels(house, recipe),
                          *releases_or_why(recipe.source.pypi or recipe.name, settings))
        reports.append(package_coverage(recipe, house, matrix, partial(farm_view, farm_file, settings, recipe,
                                                                       matrix), asked or None))
    meta = {"platforms": list(USERS_PLATFORMS), "min_cuda": MIN_CUDA.line, "free_threaded": "not counted",
            "platform_facts": "each platform's CUDA and Pythons read from its own wheels; unread ones unknown",
            "wheelhouse": str(settings.wheelhouse),
            "indexes": [{"name": i.name, "source": source_text(i)} for i in read], "notes": facts.notes,
            "matrix_cells": len(matrix), "unknown_cells": len(facts.unknown)}
    return reports, meta


def totals_line(report: PackageCoverage) -> str:
    t = report.totals()
    missing = ", ".join(f"{reason} {n}" for reason, n in t["missing_by_reason"].items())
    platforms = "; ".join(f"{p} {v['served']}/{v['cells']}" for p, v in t["by_platform"].items())
    return (f"{report.package} {report.version} ({report.version_from}): {t['cells']} cells, {t['served']} served "
            f"with evidence ({t['kernel_tested']} kernel-tested, {t['import_verified']} import-verified), "
            f"{t['inferred']} inferred (the same file checked on another Python or platform: not counted as served), "
            f"{t['built_unverified']} built not verified, {t['missing']} missing" + (f" ({missing})" if missing else "")
            + (f"; served per platform: {platforms}" if platforms else ""))
