"""What every command module shares: the console, the common flags and the Settings they give."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console

from builder.core.settings import Settings

out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160)


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cache-dir", type=Path, help="cache for sources, toolkits, venvs, logs")
    parser.add_argument("--wheelhouse", type=Path, help="output index folder (default ./wheelhouse)")
    parser.add_argument("--recipes", type=Path, help="recipes folder (default: the project's recipes/)")
    parser.add_argument("--patches", type=Path, help="patches folder (default: patches/ beside the recipes folder; "
                        "BUILDER_PATCHES)")
    parser.add_argument("--offline", action="store_true", help="use cached sources and toolkits only")


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The Settings the common flags (--cache-dir, --wheelhouse, --recipes, --patches, --offline) give."""
    return Settings.from_env(
        os.environ,
        cache_dir=getattr(args, "cache_dir", None),
        wheelhouse=getattr(args, "wheelhouse", None),
        recipes_dir=getattr(args, "recipes", None),
        patches_dir=getattr(args, "patches", None),
        offline=getattr(args, "offline", False),
    )
