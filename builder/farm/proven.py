"""Claimed, installable, GPU-planned: the farm's cells judged (issue 39). These are plans (what farm.toml's targets
would give once built and tested), never results: what was built and what ran is read from the wheelhouse's records
(farm/coverage.py), and ``builder matrix`` prints both, each in its own column.

A farm target *claims* the cells of the users' matrix its wheel is built for (farm/served.py ``served_cells``). A
claimed cell is *installable* when the target plans (farm/proof.py) and the wheel installs beside every torch
release of the cell without changing it: the wheel's torch requirement admits each release of the cell's minor on
that CUDA line (a ``torch==2.9.1`` pin leaves a 2.9.0 user out), the triton it requires admits the triton that
release pins (farm/facts.py ``torch_triton``, read from the release's METADATA), its Requires-Python admits the
cell's Python (``WHEEL_FACTS``), and the index publishes a CUDA build of that release for the cell's platform (read
from that platform's wheels: PyPI's aarch64 torch has CUDA from 2.11.0). An
installable cell is *GPU-planned* when the nightly would run the wheel's kernels on a GPU of every arch it ships (a
test job per arch a configured runner has: the others are "planned, kernel-untested on sm_X"); a pure-Python wheel, which ships no
GPU code, where a runner of the cell's platform runs it.

Two views: every channel the builder knows (PyPI and PyTorch's), and PyPI alone (what ``pip install torch`` gives).
Each cell left out of a count is listed with the first reason it fails.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.core.datafiles import default_patches_dir
from builder.core.errors import BuilderError
from builder.core.settings import Settings
from builder.discovery.compat import TorchIndex, known_indexes
from builder.farm.coverage import MIN_CUDA, USERS_PLATFORMS, FarmView, cells_list, farm_serves, matrix_facts
from builder.farm.expand import expand
from builder.farm.facts import triton_reason, wheel_facts
from builder.farm.ghmatrix import route
from builder.farm.proof import plan_all
from builder.farm.served import Cell, coverage, serving
from builder.farm.spec import Farm, FarmTarget, find_farm_file, load_farm
from builder.model.abi import per_torch_requirement, torch_minor
from builder.model.cuda import CudaVersion
from builder.model.recipe import Recipe, find_recipe, load_recipe

ALL = "all channels"
PYPI = "PyPI only"
Releases = Mapping[tuple[str, str, str], frozenset[str]]  # (torch minor, CUDA line, platform) → torch releases


def cell_releases(indexes: Iterable[TorchIndex], platforms: Iterable[str]) -> Releases:
    """The torch releases behind each (torch minor, CUDA line, platform) of the indexes: final releases on a CUDA
    line >= 12.8, each on the platforms whose wheels of it were read to carry that CUDA (``Release.cuda_on``)."""
    out: dict[tuple[str, str, str], set[str]] = {}
    platforms = tuple(platforms)
    for index in indexes:
        for release in index.listing.releases if index.listing else ():
            v = Version(release.version)
            if v.is_prerelease or v.is_devrelease:
                continue
            minor = "{}.{}".format(*torch_minor(release.version))
            for platform in platforms:
                line = release.cuda_on(platform)
                try:
                    cuda = CudaVersion.parse(line) if line and line != "cpu" else None
                except ValueError:
                    cuda = None
                if cuda is None or (cuda.major, cuda.minor) < (MIN_CUDA.major, MIN_CUDA.minor):
                    continue  # a CPU build, unknown, or below the users' matrix
                out.setdefault((minor, cuda.line, platform), set()).add(str(v.public))
    return {key: frozenset(value) for key, value in out.items()}


def torch_requirement(target: FarmTarget) -> str | None:
    """The torch requirement finalize writes for the target's wheel (stages/plan.Plan.torch_requirement): none for a
    pure-Python wheel (upstream's, under extras only), the port's floor for a stable one, else the per-torch pin."""
    if not target.kind.is_cuda:
        return None
    if target.stable and target.port is not None:
        return target.port.requirement
    return per_torch_requirement(target.torch)


def package_reason(package: str, version: str, recipe: Recipe, cell: Cell, releases: Iterable[str]) -> str | None:
    """Why no wheel of ``package`` ``version`` (whatever its torch pin) installs beside each torch release of
    ``cell`` without changing it: its Requires-Python, or a triton requirement the release's triton pin fails."""
    facts = wheel_facts(package, version)
    if facts is None:
        return f"{package} {version}: its wheel's requirements are not recorded (farm/facts.py)"
    if not facts.requires_python.contains(cell.python):
        return f"Python {cell.python}: {package} requires Python {facts.requires_python}"
    return triton_reason(package, (*recipe.runtime_requires, *facts.requires), sorted(releases, key=Version))


def install_reason(target: FarmTarget, recipe: Recipe, cell: Cell, releases: Iterable[str]) -> str | None:
    """Why the target's wheel cannot be installed beside each torch release of ``cell`` without changing torch;
    None where it can."""
    found = sorted(releases, key=Version)
    if not found:
        return f"no torch {cell.torch} release on CUDA {cell.cuda} for {cell.platform} on these indexes"
    why = package_reason(target.package, target.version, recipe, cell, found)
    if why is not None:
        return why
    torch = torch_requirement(target)
    for release in found:
        if torch is not None and not Requirement(torch).specifier.contains(release):
            return f"torch {release}: the wheel requires {torch}"
    return None


def untested_archs(farm: Farm, target: FarmTarget, platform: str) -> tuple[str, str | None]:
    """(the runners that kernel-test the target's wheel for ``platform``, or ""; why some of what it ships is not
    run on a GPU there, or None). One runner per arch the wheel ships (farm/ghmatrix.py ``route``): the archs no
    configured runner has are kernel-untested."""
    where = route(farm, target)
    numbers = sorted({a.number for a in target.archs}, reverse=True) if target.kind.is_cuda else []
    runners = ", ".join(label for _, label in where.tests)
    if not target.kind.is_cuda:
        runner = where.runner or ""
        runs_here = any(p.name == platform and farm.runner_for(target.archs, p) == runner for p in target.platforms)
        return (runner, None) if runner and runs_here else ("", f"no GPU runner for {platform}")
    if not where.tests:
        return "", f"no GPU runner for {platform} (sm_{','.join(map(str, numbers))})"
    rest = where.untested_archs
    return runners, (f"planned, kernel-untested on sm_{','.join(map(str, rest))} (runners: {runners} only)"
                     if rest else None)


@dataclass(frozen=True)
class View:
    """One view (all channels, or PyPI only) of one package version: its users' cells and how far each got."""

    name: str
    matrix: frozenset[Cell]
    claimed: frozenset[Cell]
    installable: frozenset[Cell]
    evidenced: frozenset[Cell]
    reasons: Mapping[str, frozenset[Cell]]  # every cell not evidenced, by the first reason it stops at
    unknown: int = 0  # cells whose platform facts were not read (farm/coverage.MatrixFacts): not in ``matrix``

    def counts(self) -> dict[str, int]:
        return {"cells": len(self.matrix), "claimed": len(self.claimed), "installable": len(self.installable),
                "evidenced": len(self.evidenced), "unknown": self.unknown}

    def to_json(self) -> dict[str, Any]:
        return {**self.counts(), "not_covered": {r: len(c) for r, c in self.reasons.items()}}


@dataclass(frozen=True)
class Proof:
    package: str
    version: str
    views: tuple[View, ...]

    def view(self, name: str) -> View:
        return next(v for v in self.views if v.name == name)


def prove(farm: Farm, recipe: Recipe, version: str, targets: Iterable[FarmTarget],
          served: Mapping[str, frozenset[Cell]], matrices: Mapping[str, frozenset[Cell]],
          releases: Mapping[str, Releases], refused: Mapping[str, str], not_claimed: Mapping[Cell, str],
          unknown: Mapping[str, int] | None = None) -> Proof:
    """The targets of ``recipe`` ``version`` judged in each view: ``matrices`` and ``releases`` by view name,
    ``served`` the cells each target claims (by id), ``refused`` the plan refusals (by id), ``not_claimed`` why a
    cell no target claims is left out (farm/coverage.missing_reason)."""
    targets = list(targets)
    views = []
    for name, matrix in matrices.items():
        verdicts: dict[Cell, tuple[int, str | None]] = {}  # 1 claimed, 2 installable, 3 evidenced; the reason
        for t in targets:
            for cell in served[t.id] & matrix:
                if t.id in refused:
                    verdict: tuple[int, str | None] = (1, f"target cannot plan: {refused[t.id]}")
                else:
                    why = install_reason(t, recipe, cell, releases[name].get((cell.torch, cell.cuda, cell.platform),
                                                                            ()))
                    verdict = (1, why) if why else (3, None)
                    if why is None:
                        _, untested = untested_archs(farm, t, cell.platform)
                        verdict = (2, untested) if untested else (3, None)
                if cell not in verdicts or verdict[0] > verdicts[cell][0]:
                    verdicts[cell] = verdict
        reasons: dict[str, set[Cell]] = {}
        for cell in matrix:
            unclaimed = (package_reason(recipe.name, version, recipe, cell,
                                        releases[name].get((cell.torch, cell.cuda, cell.platform), ()))
                         if wheel_facts(recipe.name, version) else None) or not_claimed.get(cell, "not in farm.toml")
            level, why = verdicts.get(cell, (0, unclaimed))
            if level < 3:
                reasons.setdefault(why or "?", set()).add(cell)
        views.append(View(name, matrix, frozenset(verdicts),
                          frozenset(c for c, (level, _) in verdicts.items() if level >= 2),
                          frozenset(c for c, (level, _) in verdicts.items() if level == 3),
                          {r: frozenset(c) for r, c in sorted(reasons.items(), key=lambda kv: -len(kv[1]))},
                          (unknown or {}).get(name, 0)))
    return Proof(recipe.name, version, tuple(views))


def prove_farm(farm: Farm, targets: list[FarmTarget], settings: Settings,
               indexes: list[TorchIndex] | None = None, *, plan: bool = True) -> list[Proof]:
    """Every package version of the targets judged against the users' matrix (farm/coverage.users_matrix) of every
    known channel and of PyPI alone; ``plan``: plan each target first (farm/proof.py), a refused one installs
    nothing."""
    read = indexes if indexes is not None else known_indexes(settings)
    pypi = [i for i in read if i.name == "pypi"]
    facts = {ALL: matrix_facts(read), PYPI: matrix_facts(pypi)}
    matrices = {name: f.cells for name, f in facts.items()}
    unknown = {name: len(f.unknown) for name, f in facts.items()}
    releases = {ALL: cell_releases(read, USERS_PLATFORMS), PYPI: cell_releases(pypi, USERS_PLATFORMS)}
    served = serving(targets, settings, matrices[ALL])
    refused = {r.target: r.error for r in plan_all(targets, settings)} if plan else {}
    proofs = []
    for c in coverage(targets, served):
        recipes = c.targets[0].recipes
        recipe = load_recipe(find_recipe(c.package, recipes), default_patches_dir(recipes))
        archs = tuple(dict.fromkeys(t.archs for t in c.targets if t.kind.is_cuda))
        not_claimed: dict[Cell, str] = {}
        for matrix in matrices.values():
            for reason, cells in farm_serves(recipe, c.version, matrix, FarmView(c.cells & matrix, archs)
                                             ).not_served.items():
                not_claimed.update(dict.fromkeys(cells, reason))
        proofs.append(prove(farm, recipe, c.version, c.targets, served, matrices, releases, refused, not_claimed,
                            unknown))
    return proofs


def proofs_of_farm(farm_file: Path | None, settings: Settings, packages: Iterable[str]) -> tuple[list[Proof], str]:
    """``builder coverage``'s farm section: the farm file's targets of ``packages`` judged (``prove_farm``), and a
    note where the farm cannot be read."""
    try:
        farm = load_farm(find_farm_file(farm_file), settings)
        wanted = [p for p in packages if canonicalize_name(p) in {canonicalize_name(e.name) for e in farm.entries}]
        targets = expand(farm, settings, only=wanted) if wanted else []
    except BuilderError as e:
        return [], f"farm not read: {e.one_line()}"
    return prove_farm(farm, targets, settings), ""


def proof_lines(proof: Proof, listed: int = 8) -> list[str]:
    """A package version's counts per view, then (all channels) each reason a cell is not covered, with the cells."""
    lines = []
    for v in proof.views:
        c = v.counts()
        lines.append(f"{proof.package} {proof.version}, {v.name}: claimed {c['claimed']}, installable "
                     f"{c['installable']}, GPU-planned {c['evidenced']} of {c['cells']} cells"
                     + (f" ({c['unknown']} unknown, not counted)" if c["unknown"] else ""))
    reasons = proof.view(ALL).reasons
    for reason, cells in list(reasons.items())[:listed]:
        lines.append(f"  {len(cells)} {reason}: {cells_list(cells)}")
    if len(reasons) > listed:
        lines.append(f"  ... {len(reasons) - listed} more reasons (--json lists every cell)")
    return lines
