"""What every command module shares: the console, the common flags and the Settings they give."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from rich.console import Console

from builder.core import net
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
    "net-deadline": {"type": net.seconds, "metavar": "SECONDS", "help": "the longest one download may take, retries "
                     "included (default 300; BUILDER_NET_DEADLINE; docs: Network policy)"},
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
    """The Settings the common flags (--cache-dir, --wheelhouse, --recipes, --patches, --offline,
    --net-deadline) give. Their network policy becomes the process's (``net.use``): every fetch follows it, and
    uv processes started from here inherit its timeouts."""
    settings = Settings.from_env(
        os.environ,
        cache_dir=getattr(args, "cache_dir", None),
        wheelhouse=getattr(args, "wheelhouse", None),
        recipes_dir=getattr(args, "recipes", None),
        patches_dir=getattr(args, "patches", None),
        offline=getattr(args, "offline", False),
        net_deadline_s=getattr(args, "net_deadline", None),
    )
    net.use(settings.net, os.environ)
    return settings
