"""`builder torch-table`: which torch exists for which CUDA and Python on which index, and where that was read."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from rich.markup import escape
from rich.table import Table

from builder.cli.common import out, settings_from_args
from builder.core.errors import SourceError
from builder.discovery.compat import KNOWN_INDEXES, TorchIndex, resolve_index, source_text
from builder.discovery.snapshot import build_snapshot, write_snapshot_file
from builder.discovery.torchindex import discover, toolkit_versions


def register(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> dict:
    p = sub.add_parser("torch-table", help="which torch versions exist per CUDA version on which index",
                       description="Read from the indexes (cached for 24 h; BUILDER_INDEX_TTL seconds), else the "
                                   "cache, else the snapshot shipped with the builder. Every row names its source.")
    p.add_argument("--refresh", action="store_true", help="read the indexes now, ignoring the cache's age")
    p.add_argument("--releases", action="store_true", help="one row per release: its CUDA, Pythons and evidence")
    p.add_argument("--json", action="store_true", help="everything, as JSON")
    p.add_argument("--torch-index", metavar="INDEX",
                   help="only this index: pypi, cu128 (PyTorch's channel) or any URL or folder, as for builder build")
    p.add_argument("--write-snapshot", action="store_true",
                   help="read every index now and write the snapshot shipped in the package (maintainers)")
    add_common(p, "cache-dir", "offline", "net-deadline")
    return {"torch-table": cmd_torch_table}


def cmd_torch_table(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    if args.write_snapshot:
        if settings.offline:
            raise SourceError("--write-snapshot reads the indexes: it cannot run --offline")
        try:
            listings, toolkits = build_snapshot(settings)
        except OSError as e:
            raise SourceError(f"snapshot not written: {e}", "run it where PyPI is reachable") from e
        path = write_snapshot_file(listings, toolkits)
        out.print(f"snapshot written: {path} ({sum(len(x.releases) for x in listings)} releases, "
                  f"{len(listings)} indexes; cuda-toolkit {', '.join(toolkits)})")
        return 0
    if args.torch_index:
        chosen = resolve_index(args.torch_index, settings)
        indexes = [TorchIndex(chosen.name, chosen.url, discover(chosen.name, chosen.url, settings,
                                                                 refresh=args.refresh))]
    else:
        indexes = [TorchIndex(name, url, discover(name, url, settings, refresh=args.refresh))
                   for name, url in KNOWN_INDEXES.items()]
    toolkits, toolkit_source = toolkit_versions(settings, refresh=args.refresh)
    if args.json:
        print(json.dumps({"indexes": [{"name": i.name, "url": i.url, "source": i.source,
                                       "read_at": i.listing.read_at if i.listing else None,
                                       "releases": [r.__dict__ for r in (i.listing.releases if i.listing else ())]}
                                      for i in indexes],
                          "cuda_toolkit": {"versions": list(toolkits), "source": toolkit_source}}, indent=1))
        return 0
    if args.releases:
        table = Table("index", "torch", "CUDA", "Python", "evidence", title="torch releases")
        for index in indexes:
            for r in index.listing.releases if index.listing else ():
                table.add_row(index.name, r.version, r.cuda or "?", " ".join(r.pythons) or "?", escape(r.evidence))
        out.print(table)
        return 0
    table = Table("index", "CUDA", "torch versions", "Python (newest torch)", "source", title="torch per CUDA")
    for index in indexes:
        source = escape(source_text(index))
        for cuda, versions in index.torch_by_cuda.items():
            newest = index.listing.release(versions[-1]) if index.listing else None
            pythons = " ".join(newest.pythons) if newest and newest.pythons else "?"
            table.add_row(index.name, cuda, ", ".join(versions), pythons, source)
        if not index.torch_by_cuda:
            table.add_row(index.name, "-", "nothing known", "-", source)
    out.print(table)
    out.print(f"pip toolchain (cuda-toolkit on PyPI): CUDA {', '.join(toolkits) or 'none known'}  "
              f"[{escape(toolkit_source)}]", highlight=False)
    return 0
