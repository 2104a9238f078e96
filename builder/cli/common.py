"""What every command module shares: the console, the common flags and the Settings they give."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console

from builder.core.settings import Settings

out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160)


# The shared flags: name → (argparse keywords). Their order is the order --help lists them in.
COMMON_FLAGS: dict[str, dict[str, object]] = {
    "cache-dir": {"type": Path, "help": "cache for sources, toolkits, venvs, logs (default "
                  "~/.cache/cuda-wheel-builder; BUILDER_CACHE_DIR)"},
    "wheelhouse": {"type": Path, "help": "the wheelhouse folder (default ./wheelhouse; BUILDER_WHEELHOUSE)"},
    "recipes": {"type": Path, "help": "recipes folder (default: the project's recipes/; BUILDER_RECIPES)"},
    "patches": {"type": Path, "help": "patches folder (default: patches/ beside the recipes folder; BUILDER_PATCHES)"},
    "offline": {"action": "store_true", "help": "use cached sources, indexes, toolkits and venvs only "
                "(BUILDER_OFFLINE=1)"},
}


def add_common(parser: argparse.ArgumentParser, *only: str) -> None:
    """The shared flags a command means something with (``only``; all of them when none is named): a command
    lists no flag it ignores (`serve --recipes`, `torch-table --wheelhouse` were such)."""
    unknown = set(only) - set(COMMON_FLAGS)
    assert not unknown, unknown
    for name, keywords in COMMON_FLAGS.items():
        if not only or name in only:
            parser.add_argument(f"--{name}", **keywords)  # type: ignore[arg-type]


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
