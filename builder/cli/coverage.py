"""`builder coverage [PACKAGE…]`: every (torch minor, CUDA line, Python, platform) cell users live in, and the wheel of the
wheelhouse that serves it, with its evidence, or why none does (builder/farm/coverage.py)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from rich.markup import escape
from rich.table import Column, Table

from builder.cli.common import out, settings_from_args


def register(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> dict:
    p = sub.add_parser("coverage", help="the users' matrix per package: which cells a verified wheel serves",
                       description="The (torch minor, CUDA line >= 12.8, Python, platform) cells the known torch "
                                   "indexes offer (x86_64 and aarch64), each with the wheelhouse's wheel that serves it and its evidence "
                                   "(kernel-tested, import-verified, built), or why it is missing (known-bad; below "
                                   "the port's floor; not in farm.toml: no farm target would serve it; a farm target "
                                   "serves it, not built yet). A cell counts as served only with evidence. `builder "
                                   "matrix` counts the farm's targets against the same cells.")
    p.add_argument("packages", nargs="*", metavar="PACKAGE", help="recipes to show (default: every recipe)")
    p.add_argument("--farm", type=Path, metavar="FILE", help="the farm file whose targets explain a missing cell "
                   "(default: farm.toml here or above)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="the same data as JSON (the nightly's summary)")
    fmt.add_argument("--markdown", action="store_true", help="tables as GitHub markdown")
    add_common(p, "cache-dir", "wheelhouse", "recipes", "patches", "offline", "net-deadline")
    return {"coverage": cmd_coverage}


def cmd_coverage(args: argparse.Namespace) -> int:
    from builder.farm.coverage import MISSING, compact_pythons, coverage_report, totals_line
    from builder.farm.proven import ALL, proof_lines, proofs_of_farm

    settings = settings_from_args(args)
    if args.farm is not None:  # named on purpose: one that cannot be read is an error, not a note (the default
        from builder.farm.spec import load_farm  # farm.toml, looked for in parent folders, stays optional)

        load_farm(args.farm, settings)
    reports, meta = coverage_report(args.packages, settings, farm_file=args.farm)
    proofs, farm_note = proofs_of_farm(args.farm, settings, [r.package for r in reports])
    proof_of = {(p.package, p.version): p for p in proofs}
    if args.json:
        print(json.dumps({**meta, "packages": [
            {**r.to_json(), "farm": {v.name: v.to_json() for v in proof_of[r.package, r.version].views}
             if (r.package, r.version) in proof_of else None} for r in reports]}, indent=1))
        return 0
    if args.markdown:
        for r in reports:
            print(f"### {r.package} {r.version}\n\n| platform | CUDA | torch | Python | evidence | wheel |\n"
                  "|---|---|---|---|---|---|")
            for platform, cuda, torch, pythons, c in r.rows():
                print(f"| {platform} | {cuda} | {torch} | {compact_pythons(pythons)} | {c.evidence} | {c.wheel or ''} |")
            print(f"\n{totals_line(r)}\n")
            if (r.package, r.version) in proof_of:
                print("\n".join(proof_lines(proof_of[r.package, r.version])) + "\n")
        return 0
    styles = {"kernel-tested": "green", "import-verified": "cyan", "built": "yellow", MISSING: "red"}
    for r in reports:
        table = Table("platform", "CUDA", "torch", "Python", Column("evidence", overflow="fold"),
                      Column("wheel", overflow="fold"),
                      title=f"{r.package} {r.version}: {' and '.join(meta['platforms'])}, wheelhouse "
                            f"{escape(str(meta['wheelhouse']))}")
        for platform, cuda, torch, pythons, c in r.rows():
            table.add_row(platform, cuda, torch, compact_pythons(pythons),
                          f"[{styles.get(c.status, '')}]{escape(c.evidence)}[/]", escape(c.wheel or ""))
        out.print(table)
        out.print(escape(totals_line(r)))
        for note in r.notes:
            out.print(f"note: {escape(note)}")
        proof = proof_of.get((r.package, r.version))
        if proof is not None:
            out.print(f"farm.toml, claimed → installable → GPU-evidenced (not covered: {ALL}):")
            for line in proof_lines(proof):
                out.print("  " + escape(line))
    if farm_note:
        out.print(f"note: {escape(farm_note)}")
    sources = "; ".join(f"{i['name']}: {i['source']}" for i in meta["indexes"])
    out.print(f"matrix: {meta['matrix_cells']} cells (CUDA >= {meta['min_cuda']}, {' and '.join(meta['platforms'])}: "
              f"aarch64 Pythons {meta['aarch64_pythons']}; free-threaded Pythons not counted) from {escape(sources)}")
    for note in meta["notes"]:
        out.print(f"note: {escape(note)}")
    return 0
