"""Where things live: cache, wheelhouse, recipes. Resolved once from flags and the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from builder.core.datafiles import default_patches_dir, default_recipes_dir


@dataclass(frozen=True, kw_only=True)
class Settings:
    cache_dir: Path
    wheelhouse: Path
    recipes_dir: Path
    patches_dir: Path
    offline: bool = False

    @classmethod
    def from_env(
        cls,
        env: Mapping[str, str],
        *,
        cache_dir: Path | None = None,
        wheelhouse: Path | None = None,
        recipes_dir: Path | None = None,
        offline: bool = False,
    ) -> Settings:
        cache = cache_dir or Path(
            env.get("BUILDER_CACHE_DIR")
            or Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cuda-wheel-builder"
        )
        recipes = recipes_dir or (Path(env["BUILDER_RECIPES"]) if env.get("BUILDER_RECIPES") else default_recipes_dir())
        house = wheelhouse or Path(env.get("BUILDER_WHEELHOUSE") or Path.cwd() / "wheelhouse")
        return cls(
            cache_dir=cache.resolve(),
            wheelhouse=house.resolve(),
            recipes_dir=recipes.resolve(),
            patches_dir=default_patches_dir(recipes.resolve()),
            offline=offline or env.get("BUILDER_OFFLINE") == "1",
        )

    def cache(self, *parts: str) -> Path:
        path = self.cache_dir.joinpath(*parts)
        path.mkdir(parents=True, exist_ok=True)
        return path


def default_jobs(env: Mapping[str, str] = os.environ) -> int:
    """MAX_JOBS sized to cores and memory: nvcc on a heavy .cu file peaks near 3 GiB per job."""
    cores = os.cpu_count() or 1
    try:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        by_memory = max(1, int(pages / (3.5 * 1024**3)))
    except (ValueError, OSError):
        by_memory = cores
    return max(1, min(cores, by_memory))
