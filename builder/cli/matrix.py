"""`builder matrix` (the farm's targets listed, or emitted for GitHub Actions, and the users' cells they serve) and
`builder watch` (PyPI versions newer than the wheelhouse's).

The farm modules (farm/expand, served, ghmatrix, cellstext, coverage, proven, unchanged, watch) are imported in the
handlers, not at the top: together they add about 40 modules and 100 ms to every `builder` start (``python -X
importtime -c 'import builder.cli.main'``), which `builder --help` and the other commands need not pay (issue 19)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from packaging.version import Version
from rich.markup import escape
from rich.table import Column, Table

from builder.cli.common import out, settings_from_args
from builder.cli.farmcommon import emit, farm_file_args, load_targets, noting_fetches, quiet
from builder.core.datafiles import default_patches_dir
from builder.core.errors import UsageError
from builder.discovery.compat import known_indexes
from builder.model.recipe import find_recipe, load_recipe

GITHUB_MATRIX_LIMIT = 256  # jobs per matrix


def register(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> dict:
    p = sub.add_parser("matrix", help="list the farm's targets, or emit them as a GitHub Actions matrix")
    farm_file_args(p)
    p.add_argument("--format", choices=("table", "json", "github"), default="table",
                   help="github: {\"include\": [...]} on one line, for strategy.matrix")
    p.add_argument("--changed", action="store_true",
                   help="only targets that no wheel in the wheelhouse was built from (same inputs)")
    p.add_argument("--tested", action="store_true",
                   help="with --format github: only the targets a configured GPU runner can test ([runners] available)")
    p.add_argument("--details", action="store_true",
                   help="with --format table: every target, what each package serves, and the untested targets "
                   "(default: a one-screen summary)")
    add_common(p)

    p = sub.add_parser("watch", help="upstream versions on PyPI newer than the wheelhouse holds")
    farm_file_args(p, platform=False)
    p.add_argument("--format", choices=("table", "json", "markdown"), default="table",
                   help="table (default), json, or markdown (for a GitHub step summary)")
    add_common(p)
    return {"matrix": noting_fetches(cmd_matrix), "watch": cmd_watch}


def cmd_matrix(args: argparse.Namespace) -> int:
    from builder.farm.ghmatrix import github_matrix, tested_matrix
    from builder.farm.served import coverage, serving, summary
    from builder.farm.unchanged import changed_targets

    settings, farm, targets = load_targets(args)
    total = len(targets)
    if args.changed:
        with quiet():
            targets = changed_targets(targets, settings)
    matrix = github_matrix(farm, targets)
    if args.format == "github" and len(targets) > GITHUB_MATRIX_LIMIT:
        raise UsageError(f"{len(targets)} targets: a GitHub Actions matrix holds at most {GITHUB_MATRIX_LIMIT} jobs",
                         "split the farm with --only PACKAGE, or narrow it")
    if args.format == "github":
        emit(json.dumps(matrix if not args.tested else tested_matrix(matrix), separators=(",", ":")))
        return 0
    untested = [row for row in matrix["include"] if row["untested"]]
    universe, serves = _users_matrix(settings)
    served = serving(targets, settings, universe)
    covered = coverage(targets, served)
    versions = [serves(c) for c in covered]
    totals = {**summary(covered), "untested": len(untested), "matrix_cells": len(universe)}
    if args.format == "json":
        emit(json.dumps(_matrix_json(farm, targets, matrix, served, covered, versions, totals), indent=2))
    elif not args.details:
        _print_summary(args, settings, farm, targets, served, totals, total)
    else:
        _print_targets_table(args, farm, targets, matrix, served, total)
        _print_served_table(covered, versions)
        _print_totals(args.changed, totals, len(universe), versions, untested, len(targets))
    return 0


def _matrix_json(farm: Any, targets: list, matrix: dict, served: dict, covered: list, versions: list,
                 totals: dict) -> dict:
    """``builder matrix --format json``: each target's matrix row, the totals, and each package version's cells."""
    return {
        "farm": str(farm.file),
        "targets": [{**row, "abi": str(t.abi), "cells_served": len(served[t.id]),
                     "platforms": [p.name for p in t.platforms]}
                    for t, row in zip(targets, matrix["include"], strict=True)],
        "summary": totals,
        "packages": [{"package": c.package, "version": c.version, "targets": len(c.targets),
                      "compiles": c.compiles, "stable_compiles": c.stable, "cells_served": len(c.cells),
                      **v.to_json(),
                      "cells": [cell.as_list() for cell in sorted(c.cells, key=_cell_order)]}
                     for c, v in zip(covered, versions, strict=True)],
    }


def _print_summary(args: argparse.Namespace, settings: Any, farm: Any, targets: list, served: dict, totals: dict,
                   total: int) -> None:
    """The default one-screen table output (``summary_lines``), with the farm's proofs and evidence."""
    from builder.farm.proven import prove_farm

    with quiet():
        proofs = prove_farm(farm, targets, settings)
    evidence = _evidence(settings, proofs)
    for line in summary_lines(farm.file, targets, served, totals, proofs, changed=args.changed, total=total,
                              evidence=evidence, wheelhouse=settings.wheelhouse):
        out.print(escape(line), soft_wrap=True)


def _print_targets_table(args: argparse.Namespace, farm: Any, targets: list, matrix: dict, served: dict,
                         total: int) -> None:
    """``--details``: one row per target (its matrix row, ABI, cells served, GPU runner or why untested)."""
    table = Table("package", "version", "platform", "cuda", "arch", "python", "torch", "abi", "cells", "toolchain",
                  Column("GPU runner", overflow="fold"),
                  title=f"{farm.file}: {len(targets)} targets" + (f" changed of {total}" if args.changed else ""))
    for target, row in zip(targets, matrix["include"], strict=True):
        abi = f"stable >={target.port.floor_text}" if target.stable and target.port else "per-torch"
        platform = row["platform"] if target.kind.is_cuda else "+".join(p.name for p in target.platforms) + " (any)"
        table.add_row(row["package"], row["version"], platform, row["cuda"],
                      row["arch"] if target.kind.is_cuda else "(any)", row["python"], row["torch"], abi,
                      str(len(served[target.id])), target.toolchain,
                      row["runner"] or f"[yellow]{escape(_short_untested(row['untested']))}[/]")
    out.print(table)


def _print_served_table(covered: list, versions: list) -> None:
    """``--details``: one row per package version, the cells it serves."""
    from builder.farm.cellstext import cells_text

    table = Table("package", "version", "targets", "compiles", "cells served",
                  Column("torch minors × Pythons, per CUDA line and platform", overflow="fold"),
                  title="what they serve: the (torch minor, CUDA line, Python, platform) cells a user can have")
    for c, v in zip(covered, versions, strict=True):
        table.add_row(c.package, c.version, str(len(c.targets)),
                      f"{c.compiles}" + (f" ({c.stable} stable)" if c.stable else ""),
                      f"{len(v.served)} of {v.cells} ({v.percent:.1f} %)", escape(cells_text(c.cells)))
    out.print(table)


def _print_totals(changed: bool, totals: dict, universe_cells: int, versions: list, untested: list,
                  targets: int) -> None:
    """``--details``: compiles needed, cells served, each version's share of the users' matrix, the untested."""
    which = "the changed targets" if changed else "the farm"
    out.print(f"compiles needed: [bold]{totals['compiles']}[/bold] ({totals['stable_compiles']} stable-ABI, "
              f"{totals['per_torch_compiles']} per-torch), plus {totals['pure_python_builds']} pure-Python builds "
              "(one py3-none-any wheel per version, offered to every torch and CUDA its checks verify)")
    per_platform = ", ".join(f"{k.removeprefix('cells_served_')} {v}" for k, v in totals.items()
                             if k.startswith("cells_served_"))
    out.print(f"cells served by {which}: [bold]{totals['cells_served']}[/bold] (torch minor × CUDA line × Python × "
              f"platform, summed over package versions{': ' + per_platform if per_platform else ''}); per-torch "
              f"wheels for the compiled packages' {totals['compiled_cells_served']} cells would take "
              f"{totals['compiled_cells_served']} compiles")
    who = "the changed targets" if changed else "farm targets"
    out.print(f"the users' matrix ([bold]builder coverage[/bold]'s): {universe_cells} cells per package; once built "
              f"and verified, {who} serve:")
    for v in versions:
        out.print("  " + escape(v.line(who)))
    if untested:
        out.print(f"[yellow]untested: {len(untested)} of {targets} targets[/yellow] (built and staged, not "
                  "promoted: no configured GPU runner has their platform and an arch they carry)")
        for row in untested:
            out.print(f"  {escape(row['id'])}: {escape(row['untested'])}")


def summary_lines(file: Path, targets: list, served: dict, totals: dict, proofs: list, *, changed: bool = False,
                  total: int = 0, evidence: dict | None = None, wheelhouse: Path | None = None) -> list[str]:
    """``builder matrix``'s one screen (under 100 columns): targets, compiles, the cells they serve and the cells
    per compile, then per package version what farm.toml plans for the users' cells (claimed / installable /
    GPU-planned, farm/proven.py; all channels and PyPI only) beside what the wheelhouse's records show (built /
    ran / GPU, farm/coverage.py ``evidence_counts``; all channels)."""
    from builder.farm.proven import ALL, PYPI

    cuda = [t for t in targets if t.kind.is_cuda]
    stable = [t for t in cuda if t.stable]
    per_torch = [t for t in cuda if not t.stable]
    def cells(group: list) -> int:  # summed over package versions (each package's wheel is its own install)
        by: dict[tuple[str, str], set] = {}
        for t in group:
            by.setdefault((t.package, t.version), set()).update(served[t.id])
        return sum(len(v) for v in by.values())

    compiles = len(cuda)
    per = totals["compiled_cells_served"] / compiles if compiles else 0.0
    lines = [f"{file}: {len(targets)} targets" + (f" changed of {total}" if changed else ""),
             f"compiles {compiles} ({len(stable)} stable-ABI, {len(per_torch)} per-torch) + "
             f"{totals['pure_python_builds']} pure-Python builds",
             f"cells per compile {per:.1f}: {len(stable)} stable compiles serve {cells(stable)} cells, "
             f"{len(per_torch)} per-torch compiles serve {cells(per_torch)}",
             f"untested targets (no GPU runner for their platform and archs): {totals['untested']} of {len(targets)}",
             "",
             f"{'':<37}{'planned (farm.toml, not results)':^38}{'evidence (records)':>21}",
             f"{'package':<24}{'version':<13}{'all channels':>18}{'PyPI':>18}{'all channels':>21}",
             f"{'':<37}{'claimed/inst/GPU':>18}{'claimed/inst/GPU':>18}{'built/ran/GPU':>21}"]
    unknown = 0
    for proof in proofs:
        every, pypi = proof.view(ALL).counts(), proof.view(PYPI).counts()
        unknown = max(unknown, every["unknown"])
        text = lambda c: f"{c['claimed']}/{c['installable']}/{c['evidenced']} of {c['cells']}"  # noqa: E731
        seen = (evidence or {}).get((proof.package, proof.version))
        shown = f"{seen['built']}/{seen['ran']}/{seen['gpu']}" if seen else "?"
        lines.append(f"{proof.package:<24}{proof.version:<13}{text(every):>18}{text(pypi):>18}{shown:>21}")
    lines += ["", "planned: claimed, a target's wheel would be built for the cell; installable, beside every torch",
              "release of it unchanged (torch, triton, Python, platform); GPU, the nightly would run its kernels on",
              "a GPU of each arch it ships. evidence: read from the wheelhouse's wheels and records: built, a wheel",
              "for the cell; ran, its import or kernel tests ran on the cell's Python and platform; GPU, its kernel",
              "tests ran there (cells only inferred, abi3 => other Pythons, are not counted: builder coverage)."]
    if unknown:
        lines.append(f"unknown: {unknown} cells of all channels whose platform facts were not read (not counted).")
    lines.append("Why each cell is left out: builder coverage. Every target and cell: builder matrix --details")
    return lines


def _evidence(settings: Any, proofs: list) -> dict:
    """(package, version) → what the wheelhouse's records show on the proof's all-channels matrix."""
    from builder.farm.coverage import evidence_counts
    from builder.farm.proven import ALL
    from builder.index.store import Wheelhouse

    house = Wheelhouse(settings.wheelhouse)
    found = {}
    for proof in proofs:
        recipe = load_recipe(find_recipe(proof.package, settings.recipes_dir),
                             settings.patches_dir or default_patches_dir(settings.recipes_dir))
        found[proof.package, proof.version] = evidence_counts(recipe, house, proof.view(ALL).matrix, proof.version)
    return found


def _users_matrix(settings: Any) -> tuple[Any, Callable[[Any], Any]]:
    """The users' matrix (``builder coverage``'s, farm/coverage.users_matrix) and how one package version of the
    farm (served.Coverage) counts against it (coverage.farm_serves)."""
    from builder.farm.coverage import FarmView, farm_serves, users_matrix

    universe, _ = users_matrix(known_indexes(settings))

    def serves(c: Any) -> Any:
        recipes = c.targets[0].recipes
        recipe = load_recipe(find_recipe(c.package, recipes), default_patches_dir(recipes))
        archs = tuple(dict.fromkeys(t.archs for t in c.targets if t.kind.is_cuda))
        return farm_serves(recipe, c.version, universe, FarmView(c.cells & universe, archs))

    return universe, serves


def _short_untested(text: str) -> str:
    """``untested: no runner for aarch64 sm_121,110 (none of ...)`` → without the parenthesis (the table's cell)."""
    return text.split(" (", 1)[0]


def _cell_order(cell: Any) -> tuple:
    return Version(cell.cuda), Version(cell.torch), Version(cell.python), cell.platform



# ---------------------------------------------------------------- builder watch


def cmd_watch(args: argparse.Namespace) -> int:
    from builder.farm.expand import check_only
    from builder.farm.spec import find_farm_file, load_farm
    from builder.farm.watch import watch, watch_torch

    settings = settings_from_args(args)
    farm = load_farm(find_farm_file(args.file), settings)
    wanted = check_only(farm, args.only)
    rows = watch(farm, settings, only=wanted)
    if args.format == "json":
        emit(json.dumps([r.as_dict() for r in rows], indent=2))
        return 0
    headers = ("package", "recipe range", "built", "newer on PyPI (in range)", "above the range", "note")
    cells = [(r.package, r.versions, ", ".join(r.built) or "none", ", ".join(r.newer) or "-", ", ".join(r.beyond) or "-",
              r.note) for r in rows]
    torch_headers = ("torch index", "CUDA", "in farm", "torch on the index", "built", "not built yet", "note", "read from")
    torch_cells = [(r.index, r.cuda, "yes" if r.in_farm else "no", _short(r.available), ", ".join(r.built) or "none",
                    ", ".join(r.unbuilt) or "-", r.note, r.source) for r in watch_torch(farm, settings)]
    if args.format == "markdown":
        for heads, body in ((headers, cells), (torch_headers, torch_cells)):
            print("| " + " | ".join(heads) + " |")
            print("|" + " --- |" * len(heads))
            for row in body:
                print("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
            print()
        return 0
    table = Table(*headers, title=f"{farm.file} vs {settings.wheelhouse}")
    for row in cells:
        table.add_row(*(escape(c) for c in row))
    out.print(table)
    table = Table(*torch_headers, title="torch releases and CUDA toolkits")
    for row in torch_cells:
        table.add_row(*(escape(c) for c in row))
    out.print(table)
    return 0


def _short(versions: tuple[str, ...]) -> str:
    return ", ".join(versions) if len(versions) <= 4 else f"{versions[0]} … {', '.join(versions[-3:])}"
