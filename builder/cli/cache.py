"""`builder cache` (where the disk goes) and `builder cache clean` (remove what can be made again)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from rich.table import Table

from builder.cli import numbers
from builder.cli.common import out, settings_from_args
from builder.core.cachedir import SECTIONS, clean, disk_bytes, usage
from builder.core.errors import UsageError
from builder.core.fsutil import human_size
from builder.core.uvtool import free_bytes


def register(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> dict:
    p = sub.add_parser("cache", help="show the cache's disk use per part, or clean parts of it")
    csub = p.add_subparsers(dest="cache_command")
    info = csub.add_parser("info", help="disk use per part (the default)")
    add_common(info, "cache-dir")
    clean = csub.add_parser("clean", help="remove the named parts' entries; entries in use are skipped",
                            description="Remove cache entries that the builder makes again when needed. "
                                        f"Parts: {', '.join(SECTIONS)}. Build venvs, build folders and the "
                                        "container uv cache are skipped while a build holds them; the other parts "
                                        "are tools and downloads a running build may be reading: clean those when "
                                        "none runs.")
    clean.add_argument("sections", nargs="*", metavar="PART", help="cache parts to clean (see `builder cache`)")
    clean.add_argument("--all", action="store_true", help="every part")
    clean.add_argument("--older-than", type=numbers.days, metavar="DAYS",
                       help="only entries not used for this many days")
    clean.add_argument("--dry-run", action="store_true", help="say what would be removed, remove nothing")
    add_common(clean, "cache-dir")
    add_common(p, "cache-dir")
    return {"cache": cmd_cache}


def _age(mtime: float | None) -> str:
    if mtime is None:
        return "-"
    days = (time.time() - mtime) / 86400
    return f"{days * 24:.0f} h ago" if days < 2 else f"{days:.0f} days ago"


def cmd_cache(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    root = settings.cache_dir
    if args.cache_command == "clean":
        if not args.sections and not args.all:
            raise UsageError("builder cache clean: name the parts to clean, or --all",
                             f"parts: {', '.join(SECTIONS)}")
        if args.older_than is not None and args.older_than < 0:
            raise UsageError(f"--older-than {args.older_than}: days must be 0 or more")
        sections = list(SECTIONS) if args.all else args.sections
        removals = clean(settings, sections, older_than_days=args.older_than, dry_run=args.dry_run)
        verb = "would remove" if args.dry_run else "removed"
        for r in removals:
            line = f"skipped {r.entry} ({r.skipped})" if r.skipped else f"{verb} {r.entry} ({human_size(r.bytes)})"
            out.print(line, markup=False)
        freed = sum(r.bytes for r in removals if not r.skipped)
        count = sum(1 for r in removals if not r.skipped)
        out.print(f"{verb} {count} entr{'y' if count == 1 else 'ies'}, {human_size(freed)} "
                  f"{'would be ' if args.dry_run else ''}freed", markup=False)
        return 0
    table = Table("part", "entries", "frees", "last used", "holds", title=f"cache {root}")
    rows = usage(settings)
    for row in rows:
        table.add_row(row.name, str(row.entries), human_size(row.bytes), _age(row.newest), SECTIONS[row.name])
    out.print(table)
    total = disk_bytes([root]) if root.is_dir() else 0
    free = free_bytes(root) or 0
    out.print(f"on disk in all: {human_size(total)} (files hard-linked from elsewhere, such as uv's cache, count here too); "
              f"{human_size(free)} free on its filesystem", markup=False)
    out.print("`frees`: what cleaning that part alone gives back; `builder cache clean PART` does it", markup=False)
    return 0
