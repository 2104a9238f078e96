#!/usr/bin/env python3
"""Build speedups measured on the real package (issue 9, "then make the build faster"):

    python bench/causal_rebuild.py --out bench/results/causal-rebuild.json [--skip-compress]

1. cold: `builder build causal-conv1d --version 1.7.0 --cuda 13.0 --arch 120 --toolchain host` into an empty
   builder cache (the compiler cache starts empty too);
2. rebuild: the same with --force (a new build, same sources and flags: what a label change, a builder upgrade or
   a recipe edit that does not touch the C++ costs) — ccache serves every object;
3. compressed fatbins: a copy of the recipe whose [build] env sets NVCC_APPEND_FLAGS=--compress-mode=size (a new
   flag, so a full compile — the first version of this script got cache hits here, which is how the compiler
   cache learnt to put nvcc's environment flags into its namespace): wheel size against nvcc's default.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["build", "causal-conv1d", "--version", "1.7.0", "--cuda", "13.0", "--arch", "120", "--torch", "2.14.1",
        "--python", "3.12", "--toolchain", "host", "--no-kernel-tests"]


def build(extra: list[str], env: dict[str, str], house: Path) -> dict[str, Any]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "builder", *ARGS, *extra, "--wheelhouse", str(house)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"build failed:\n{proc.stderr[-3000:]}")
    timings = json.loads(re.findall(r"timings: (\{.*\})", proc.stderr + proc.stdout)[-1])
    stats = re.findall(r"compiler cache: (\d+) hits, (\d+) misses", proc.stderr)
    wheel = next((house / "wheels").glob("causal_conv1d-*.whl"))
    return {"wall_s": round(wall, 1), "compile_s": timings.get("build"), "wheel_bytes": wheel.stat().st_size,
            "ccache_hits_misses": [int(x) for x in stats[-1]] if stats else None}


def compress_recipes(base: Path) -> Path:
    """recipes/ and patches/ copied, causal-conv1d's recipe asking nvcc for size-optimised fatbin compression."""
    shutil.copytree(ROOT / "recipes", base / "recipes")
    shutil.copytree(ROOT / "patches", base / "patches")
    recipe = base / "recipes" / "causal-conv1d" / "recipe.toml"
    text = recipe.read_text()
    old = 'CAUSAL_CONV1D_SKIP_CUDA_BUILD = "FALSE" }'
    if old not in text:
        raise SystemExit(f"{recipe}: [build] env changed; update bench/causal_rebuild.py")
    recipe.write_text(text.replace(old, old[:-2] + ', NVCC_APPEND_FLAGS = "--compress-mode=size" }'))
    return base / "recipes"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--parts", default="cold,rebuild,compress", help="comma-separated subset")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    report: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    report.update(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), cores=os.cpu_count())
    with tempfile.TemporaryDirectory(prefix="bench-rebuild-") as tmp:
        base = Path(tmp)
        env = {**os.environ, "BUILDER_CACHE_DIR": str(base / "cache"), "COLUMNS": "200"}
        if "cold" in parts or "rebuild" in parts:
            report["cold"] = build([], env, base / "wh1")
            print("cold", report["cold"], flush=True)
        if "rebuild" in parts:
            report["rebuild_ccache"] = build(["--force"], env, base / "wh2")
            print("rebuild", report["rebuild_ccache"], flush=True)
        if "compress" in parts:
            recipes = compress_recipes(base / "compress")
            report["compress_size"] = build(["--recipes", str(recipes)], env, base / "wh3")
            print("compress", report["compress_size"], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
