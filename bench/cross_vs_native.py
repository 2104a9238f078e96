#!/usr/bin/env python3
"""Issue 27: the cross build for aarch64 against the same build for x86_64, side by side in one run.

    python bench/cross_vs_native.py --out bench/results/cross-vs-native.json [--package causal-conv1d] [--arch 90]

Both sides: `builder build PACKAGE --cuda 13.0 --arch ARCH --toolchain host --force --compiler-cache off
--no-torch-range --platform P`, one after the other, each into a wheelhouse of its own, sharing one builder cache (the
build venv, the target Python and the target torch are made once, before the timed runs, by a warm-up build of each
platform; the timed runs compile everything again: --force, no ccache). Measured per side: the whole command's wall
time, the builder's own step timings (build = the compile; test = the import test, under qemu for aarch64), the peak
RSS of the largest single process of the run (`/usr/bin/time -v`'s maximum resident set size: the biggest compiler
process) and the wheel's size.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(platform: str, args: argparse.Namespace, cache: Path, house: Path) -> dict:
    argv = ["/usr/bin/time", "-v", sys.executable, "-m", "builder", "build", args.package, "--cuda", "13.0",
            "--arch", args.arch, "--toolchain", "host", "--force", "--compiler-cache", "off", "--no-torch-range",
            "--platform", platform]
    env = {**os.environ, "BUILDER_CACHE_DIR": str(cache), "BUILDER_WHEELHOUSE": str(house)}
    start = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.monotonic() - start
    if result.returncode != 0:
        sys.exit(f"{platform} build failed:\n{result.stderr[-3000:]}")
    timings = json.loads(re.search(r"^timings: (\{.*\})$", result.stdout + result.stderr, re.M).group(1))
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", result.stderr).group(1))
    (wheel,) = (house / "wheels").glob("*.whl")
    return {"platform": platform, "wall_s": round(wall, 1), "timings": timings, "peak_rss_mib": round(rss_kb / 1024),
            "wheel": wheel.name, "wheel_bytes": wheel.stat().st_size}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--package", default="causal-conv1d")
    parser.add_argument("--arch", default="90")
    parser.add_argument("--cache", type=Path, help="builder cache to share (default: a fresh one)")
    args = parser.parse_args()
    cache = args.cache or Path(tempfile.mkdtemp(prefix="cross-bench-cache-"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="cross-bench-") as tmp:
        for platform in ("x86_64", "aarch64"):
            rows.append(build(platform, args, cache, Path(tmp) / platform))
            print(json.dumps(rows[-1]), flush=True)
    native, crossed = rows
    ratio = {"wall": round(crossed["wall_s"] / native["wall_s"], 2),
             "compile": round(crossed["timings"]["build"] / native["timings"]["build"], 2),
             "peak_rss": round(crossed["peak_rss_mib"] / native["peak_rss_mib"], 2)}
    out = {"package": args.package, "arch": args.arch, "machine": os.uname().machine, "cores": os.cpu_count(),
           "runs": rows, "aarch64_over_x86_64": ratio}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(ratio))


if __name__ == "__main__":
    main()
