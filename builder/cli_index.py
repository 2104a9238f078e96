"""Commands about the wheelhouse index: `builder index rebuild`."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def register(sub: argparse._SubParsersAction, add_common: Callable[[argparse.ArgumentParser], None]) -> dict:
    p = sub.add_parser("index", help="wheelhouse index maintenance")
    isub = p.add_subparsers(dest="index_command", required=True)
    rebuild = isub.add_parser("rebuild", help="regenerate every index page from the wheels")
    add_common(rebuild)
    return {"index": cmd_index}


def cmd_index(args: argparse.Namespace) -> int:
    from .cli import out, settings_from_args
    from .publish import Wheelhouse

    house = Wheelhouse(settings_from_args(args).wheelhouse)
    house.rebuild_index()
    out.print(f"index rebuilt: {house.index_url()}")
    return 0
