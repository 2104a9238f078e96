"""Where things live: cache, wheelhouse, recipes. Resolved once from flags and the environment."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from builder.core.datafiles import default_patches_dir, default_recipes_dir
from builder.core.errors import UsageError
from builder.core.net import NetPolicy


@dataclass(frozen=True, kw_only=True)
class Settings:
    cache_dir: Path
    wheelhouse: Path
    recipes_dir: Path
    patches_dir: Path
    offline: bool = False
    net: NetPolicy = field(default_factory=NetPolicy)  # BUILDER_NET_* (core/net.py)

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        *,
        cache_dir: Path | None = None,
        wheelhouse: Path | None = None,
        recipes_dir: Path | None = None,
        patches_dir: Path | None = None,
        offline: bool = False,
        net_deadline_s: float | None = None,
    ) -> Settings:
        cache = cache_dir or Path(
            env.get("BUILDER_CACHE_DIR")
            or Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cuda-wheel-builder"
        )
        recipes = recipes_dir or (Path(env["BUILDER_RECIPES"]) if env.get("BUILDER_RECIPES") else default_recipes_dir())
        house = wheelhouse or Path(env.get("BUILDER_WHEELHOUSE") or Path.cwd() / "wheelhouse")
        check_cache_dir(cache.resolve())
        return cls(
            cache_dir=cache.resolve(),
            wheelhouse=house.resolve(),
            recipes_dir=recipes.resolve(),
            patches_dir=(patches_dir or (Path(env["BUILDER_PATCHES"]) if env.get("BUILDER_PATCHES")
                                         else default_patches_dir(recipes.resolve()))).resolve(),
            offline=offline or env.get("BUILDER_OFFLINE") == "1",
            net=NetPolicy.from_env(env, deadline_s=net_deadline_s),
        )

    def cache(self, *parts: str) -> Path:
        path = self.cache_dir.joinpath(*parts)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError, PermissionError) as e:
            raise UsageError(f"cache folder {path}: cannot be made ({e.strerror or e})",
                             "point --cache-dir (or BUILDER_CACHE_DIR) at a folder you can write") from e
        return path


def check_cache_dir(path: Path) -> None:
    """Refuse a cache folder that is a file, or lies under one, before any work (mkdir would fail deep inside the
    first stage with NotADirectoryError); a folder that does not exist yet is fine: it is made on first use."""
    for folder in (path, *path.parents):
        try:
            mode = folder.stat().st_mode
        except (FileNotFoundError, NotADirectoryError):
            continue  # not there yet, or under a file: the loop reaches the file
        except OSError as e:
            raise UsageError(f"cache folder {path}: {folder} cannot be read ({e.strerror or e})",
                             "point --cache-dir (or BUILDER_CACHE_DIR) at a folder you can write") from e
        if not stat.S_ISDIR(mode):
            where = "is a file" if folder == path else f"lies under {folder}, which is a file"
            raise UsageError(f"cache folder {path} {where}, not a folder",
                             "point --cache-dir (or BUILDER_CACHE_DIR) at a folder, or move the file away")
        return


# One nvcc on a heavy .cu file (causal-conv1d's backward kernels) peaks at 3.0 GiB, and at 5.2 GiB with ptxas's
# split compilation, the builder's default (docs/BENCHMARKS.md section 9).
NVCC_PEAK_GIB = 5.5


def memory_slots(peak_gib: float | None = None) -> int:
    """How many heavy nvcc processes this machine's memory holds (``peak_gib`` each: a recipe's measured
    ``[build] nvcc-peak-gib``, else NVCC_PEAK_GIB)."""
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return max(1, int(pages / ((peak_gib or NVCC_PEAK_GIB) * 1024**3)))
    except (ValueError, OSError):
        return os.cpu_count() or 1


def default_jobs(env: Mapping[str, str] = os.environ) -> int:
    """MAX_JOBS sized to cores and memory (``memory_slots``)."""
    return max(1, min(os.cpu_count() or 1, memory_slots()))
