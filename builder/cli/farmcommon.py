"""What the farm commands (cli/farm.py, cli/matrix.py) share: the farm-file flags, the farm loaded and expanded
into targets, machine-readable output, durations and quiet progress.

farm/expand.py is imported in ``load_targets``, not at the top: with farm/spec.py under it, it adds 15-30 ms to
every `builder` start (``python -X importtime -c 'import builder.cli.main'``), which the commands that never read
farm.toml need not pay."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from builder.cli.common import settings_from_args
from builder.core.log import log
from builder.model.platform import parse_platform


def farm_file_args(p: argparse.ArgumentParser, platform: bool = True) -> None:
    p.add_argument("--file", type=Path, help="farm file (default: farm.toml here or in a parent folder)")
    p.add_argument("--only", action="append", default=[], metavar="PACKAGE", help="only this package (repeatable)")
    if platform:
        p.add_argument("--platform", action="append", default=[], metavar="PLATFORM",
                       help="only the targets built for this platform, x86_64 or aarch64 (repeatable; a pure-Python "
                       "wheel, built once for every platform, is built on the first of its platforms)")


def load_targets(args: argparse.Namespace) -> tuple[Any, Any, list]:
    """The Settings, the farm and its targets (narrowed by --only and --platform)."""
    from builder.farm.expand import expand
    from builder.farm.spec import find_farm_file, load_farm

    wanted = {parse_platform(text) for text in getattr(args, "platform", None) or ()}  # a typo fails before any work
    settings = settings_from_args(args)
    farm = load_farm(find_farm_file(args.file), settings)
    targets = expand(farm, settings, only=args.only)
    return settings, farm, [t for t in targets if not wanted or t.platform in wanted]


def emit(text: str) -> None:
    """Machine-readable output on stdout; a reader that stops early (``| head``) is not an error."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s"


@contextmanager
def quiet() -> Iterator[None]:
    """Progress lines off for the block (an unchanged check over many targets)."""
    before = log.quiet
    log.quiet = True
    try:
        yield
    finally:
        log.quiet = before


def fetched_note() -> str | None:
    """``read from the network: 3 URLs (pypi.org 3) …`` where this process fetched anything (a cold cache), so a
    slow read-only command says why; None where everything came from the cache."""
    from collections import Counter
    from urllib.parse import urlsplit

    from builder.core.net import opened

    urls = opened()
    if not urls:
        return None
    hosts = Counter(urlsplit(u).hostname or "?" for u in urls)
    return (f"read from the network: {len(urls)} URLs ({', '.join(f'{h} {n}' for h, n in hosts.most_common())}); "
            "cached for 24 h (BUILDER_INDEX_TTL), the next run reads none")


def noting_fetches(command: Any) -> Any:
    """``command`` that ends by saying on stderr what it read from the network (``fetched_note``), if anything."""
    def run(args: argparse.Namespace) -> int:
        try:
            return int(command(args))
        finally:
            note = fetched_note()
            if note:
                print(f"note: {note}", file=sys.stderr)

    return run
