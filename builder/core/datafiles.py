"""Where the project's data folders (recipes/, patches/, dockerfiles/, evidence/) are found at run time.

A built package (wheel, `pip install .`, `uv tool install .`) carries copies at builder/_data/<name>, made by
setup.py's build_py; an editable install or a plain checkout has none there and reads the checkout's top-level
folders, which stay the single source of truth. --recipes / BUILDER_RECIPES still win (settings.py).
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGED = Path(__file__).resolve().parent.parent / "_data"
CHECKOUT = Path(__file__).resolve().parent.parent.parent


def data_dir(name: str) -> Path:
    """``recipes``, ``patches``, ``dockerfiles`` or ``evidence``: the packaged copy when present, else the checkout's folder."""
    packaged = PACKAGED / name
    return packaged if packaged.is_dir() else CHECKOUT / name


def default_recipes_dir() -> Path:
    """BUILDER_RECIPES, else the packaged or checkout recipes/ folder."""
    env = os.environ.get("BUILDER_RECIPES")
    return Path(env) if env else data_dir("recipes")


def default_patches_dir(recipes_dir: Path) -> Path:
    return recipes_dir.parent / "patches"
