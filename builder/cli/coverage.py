"""`builder coverage [PACKAGE…]`: every (torch minor, CUDA line, Python, platform) cell users live in, and the wheel of the
wheelhouse that serves it, with its evidence, or why none does (builder/farm/coverage.py).

farm/coverage, farm/proven, farm/resolvefarm and farm/spec are imported in the handler, not at the top: they add
about 50 modules and 100-200 ms to every `builder` start (``python -X importtime -c 'import builder.cli.main'``),
which the other commands need not pay (issue 19)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from rich.markup import escape
from rich.table import Column, Table

from builder.cli.common import out, settings_from_args
from builder.cli.farmcommon import noting_fetches
from builder.core.settings import Settings

if TYPE_CHECKING:
    from builder.farm.gpuevidence import GpuRun
    from builder.farm.proven import Proof
    from builder.farm.resolvefarm import ResolveReport


def register(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> dict:
    p = sub.add_parser("coverage", help="the users' matrix per package: which cells a verified wheel serves",
                       description="The (torch minor, CUDA line >= 12.8, Python, platform) cells the known torch "
                                   "indexes offer (x86_64 and aarch64), each with the wheelhouse's wheel that serves it and its evidence "
                                   "(kernel-tested, import-verified, built), or why it is missing (known-bad; below "
                                   "the port's floor; not in farm.toml: no farm target would serve it; a farm target "
                                   "serves it, not built yet). A cell counts as served only with evidence. `builder "
                                   "matrix` counts the farm's targets against the same cells.")
    p.add_argument("packages", nargs="*", metavar="PACKAGE",
                   help="recipes to show (default: every recipe), each at its newest version with wheels; "
                        "NAME==VERSION for another release (a previous one the farm builds)")
    p.add_argument("--farm", type=Path, metavar="FILE", help="the farm file whose targets explain a missing cell "
                   "(default: farm.toml here or above)")
    p.add_argument("--resolve", action="store_true",
                   help="also ask uv's resolver (uv pip compile, PyPI only) whether each claimed cell's wheel "
                        "installs beside each exact torch release of the cell without changing it: metadata twins "
                        "of the farm's wheels, uv's reason for each cell that does not; not with --offline")
    p.add_argument("--explain", metavar="CELL",
                   help="where each fact of one cell came from: PLATFORM/CUDA/TORCH/PYTHON, e.g. aarch64/13.0/2.11/3.12 "
                        "(CUDA may be *): each torch release's wheel read (URL, sha256, date, source), then each "
                        "package's status, wheel and record")
    p.add_argument("--evidence", type=Path, metavar="FILE",
                   help="the project's GPU runs to show per package (default: evidence/gpu-runs.json of the checkout, "
                        "if there is one; evidence/README.md)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="the same data as JSON (the nightly's summary)")
    fmt.add_argument("--markdown", action="store_true", help="tables as GitHub markdown")
    add_common(p, "cache-dir", "wheelhouse", "recipes", "patches", "offline", "net-deadline")
    return {"coverage": noting_fetches(cmd_coverage)}


def cmd_coverage(args: argparse.Namespace) -> int:
    from builder.farm.cellstext import compact_pythons
    from builder.farm.coverage import MISSING, coverage_report, totals_line
    from builder.farm.proven import ALL, proof_lines, proofs_of_farm

    settings = settings_from_args(args)
    if args.explain is not None:
        return explain(args, settings)
    if args.resolve:
        from builder.farm.resolvefarm import refuse_offline

        refuse_offline(settings)  # before the long part: --resolve needs PyPI
    if args.farm is not None:  # named on purpose: one that cannot be read is an error, not a note (the default
        from builder.farm.spec import load_farm  # farm.toml, looked for in parent folders, stays optional)

        load_farm(args.farm, settings)
    gpu_runs, evidence_file = gpu_evidence(args.evidence)  # a bad file stops the command before the long part
    reports, meta = coverage_report(args.packages, settings, farm_file=args.farm)
    proofs, farm_note = proofs_of_farm(args.farm, settings, [r.package for r in reports])
    proof_of = {(p.package, p.version): p for p in proofs}
    resolved, resolve_note = resolve_farm_of(args, settings, [r.package for r in reports])
    if args.json:
        print(json.dumps({**meta, "evidence_file": str(evidence_file) if evidence_file else None, "packages": [
            {**r.to_json(), "gpu_evidence": [run.to_json() for run in gpu_runs if run.package == r.package],
             "farm": {v.name: v.to_json() for v in proof_of[r.package, r.version].views}
             if (r.package, r.version) in proof_of else None,
             **({"resolve": view.to_json() if (view := resolved.view(r.package, r.version)) else None}
                if resolved else {})} for r in reports],
            **({"resolve": {"runs": resolved.runs, "questions": resolved.asked, "seconds": round(resolved.seconds, 1),
                            "probed": dict(resolved.channels)}} if resolved else {})}, indent=1))
        return 0
    if args.markdown:
        for r in reports:
            print(f"### {r.package} {r.version}\n\n| platform | CUDA | torch | Python | evidence | wheel |\n"
                  "|---|---|---|---|---|---|")
            for platform, cuda, torch, pythons, c in r.rows():
                print(f"| {platform} | {cuda} | {torch} | {compact_pythons(pythons)} | {c.evidence} | {c.wheel or ''} |")
            print(f"\n{totals_line(r)}\n")
            if lines := evidence_lines(gpu_runs, evidence_file, r.package, r.version):
                print("\n".join(lines) + "\n")
            if (r.package, r.version) in proof_of:
                print("\n".join(proof_lines(proof_of[r.package, r.version])) + "\n")
            for line in resolved_lines(resolved, proof_of, r.package, r.version):
                print(line)
        if resolved:
            print(f"\n{resolved.summary()}")
        return 0
    styles = {"kernel-tested": "green", "import-verified": "cyan", "inferred": "blue", "built": "yellow",
              MISSING: "red"}
    for r in reports:
        table = Table("platform", "CUDA", "torch", "Python", Column("evidence", overflow="fold"),
                      Column("wheel", overflow="fold"),
                      title=f"{r.package} {r.version}: {' and '.join(meta['platforms'])}, wheelhouse "
                            f"{escape(str(meta['wheelhouse']))}")
        for platform, cuda, torch, pythons, c in r.rows():
            table.add_row(platform, cuda, torch, compact_pythons(pythons),
                          f"[{styles.get(c.status, 'default')}]{escape(c.evidence)}[/]", escape(c.wheel or ""))
        out.print(table)
        out.print(escape(totals_line(r)))
        for note in r.notes:
            out.print(f"note: {escape(note)}")
        for line in evidence_lines(gpu_runs, evidence_file, r.package, r.version):
            out.print(escape(line))
        proof = proof_of.get((r.package, r.version))
        if proof is not None:
            out.print(f"farm.toml's plan, not results: claimed → installable → GPU-planned (not covered: {ALL}):")
            for line in proof_lines(proof):
                out.print("  " + escape(line))
        for line in resolved_lines(resolved, proof_of, r.package, r.version):
            out.print("  " + escape(line))
    if resolved:
        out.print(escape(resolved.summary()))
    if resolve_note:
        out.print(f"note: {escape(resolve_note)}")
    if farm_note:
        out.print(f"note: {escape(farm_note)}")
    sources = "; ".join(f"{i['name']}: {i['source']}" for i in meta["indexes"])
    out.print(f"matrix: {meta['matrix_cells']} cells (CUDA >= {meta['min_cuda']}, {' and '.join(meta['platforms'])}: "
              f"{meta['platform_facts']}; free-threaded Pythons not counted), {meta['unknown_cells']} unknown, from "
              f"{escape(sources)}")
    for note in meta["notes"]:
        out.print(f"note: {escape(note)}")
    return 0


def explain(args: argparse.Namespace, settings: Settings) -> int:
    """``--explain CELL``: the torch facts behind one cell, then each package's status of it."""
    from builder.discovery.compat import known_indexes
    from builder.farm.coverage import coverage_report
    from builder.farm.explain import package_lines, parse_cell, release_lines

    query = parse_cell(args.explain)
    read = known_indexes(settings)
    reports, _ = coverage_report(args.packages, settings, farm_file=args.farm, indexes=lambda _: read)
    out.print(f"[bold]{escape(query.text())}[/bold]: the torch facts (each read from one wheel of that platform)")
    for line in release_lines(query, read):
        out.print("  " + escape(line), soft_wrap=True)
    out.print("[bold]per package[/bold] (evidence read from the wheelhouse's records; missing: why)")
    for report in reports:
        for line in package_lines(query, report):
            out.print("  " + escape(line), soft_wrap=True)
    return 0


def gpu_evidence(named: Path | None) -> tuple[tuple[GpuRun, ...], Path | None]:
    """The project's GPU runs (farm/gpuevidence.py): the file named, else the checkout's when it has one; a named
    file that is missing, or any file that is damaged, is an error naming the file and field."""
    from builder.farm.gpuevidence import default_path, load

    path = named or default_path()
    if named is None and not path.is_file():
        return (), None
    return load(path), path


def evidence_lines(runs: tuple[GpuRun, ...], path: Path | None, package: str, version: str) -> list[str]:
    """What the evidence file says of one package: nothing when it says nothing."""
    from builder.farm.gpuevidence import package_lines

    lines = package_lines(runs, package, version)
    if lines:
        lines[0] += f" ({path}: the project's GPU sessions, not this wheelhouse's wheels)"
    return lines


def resolve_farm_of(args: argparse.Namespace, settings: Settings, packages: list[str]
                    ) -> tuple[ResolveReport | None, str]:
    """``--resolve``: the farm's claimed cells asked of uv (farm/resolvecheck.py); nothing without the flag."""
    if not args.resolve:
        return None, ""
    from builder.farm.resolvefarm import resolve_of_farm

    return resolve_of_farm(args.farm, settings, packages)


def resolved_lines(resolved: ResolveReport | None, proof_of: Mapping[tuple[str, str], Proof], package: str,
                   version: str) -> list[str]:
    """uv's verdict on one package version, against the rules' PyPI-only installable cells."""
    from builder.farm.proven import PYPI
    from builder.farm.resolvefarm import resolve_lines

    view = resolved.view(package, version) if resolved else None
    if view is None:
        return []
    proof = proof_of.get((package, version))
    return resolve_lines(view, proof.view(PYPI).installable if proof else None)
