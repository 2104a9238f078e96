#!/usr/bin/env python3
"""Issue 9, items 2-4 and the compiler cache: the builder's fast paths, each run several times.

    python bench/cpu_steps.py --out bench/results/cpu-steps.json [--repeats 5] [--skip-provision]

1. farm: `builder farm --file <demo>/farm-demo.toml --parallel 2` (8 wheels; the demo tests/fixtures/farm_demo.py
   writes) once from an empty builder cache, then again `repeats` times with nothing changed (the time to decide
   nothing needs building);
2. one unchanged target: `builder build tinyext …` again, `repeats` times;
3. toolchain provisioning: `cuda-toolkit[…]==13.0.*` from PyPI into an empty cache once (bytes counted on the
   network interface, /proc/net/dev), then the cached lookup `repeats` times;
4. install: `uv pip install` of a farm wheel from the wheelhouse's PEP 503 index into a fresh venv (torch already
   in uv's cache), `repeats` times;
5. compiler cache: `builder build … --force` of one target again (same sources, new build folder), with the ccache
   the first build filled, against `--compiler-cache off`.

Medians and min..max spread; the machine and date are recorded. Uses this machine's CUDA 13.0 nvcc and the local
torch 2.14.1 index the tests use (tests/conftest.py), so nothing large is downloaded except in step 3.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_RECIPES = ROOT / "tests" / "fixtures" / "recipes"


def builder(*args: str, env: dict[str, str]) -> dict[str, Any]:
    """Run the builder CLI; wall seconds and its stderr (which carries its progress)."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "builder", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"builder {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return {"wall_s": wall, "stderr": proc.stderr}


def spread(values: list[float]) -> dict[str, Any]:
    return {"median_s": round(statistics.median(values), 2), "min_s": round(min(values), 2),
            "max_s": round(max(values), 2), "runs": [round(v, 2) for v in values]}


def rx_bytes() -> int:
    """Bytes received on all non-loopback interfaces so far."""
    total = 0
    for line in Path("/proc/net/dev").read_text().splitlines()[2:]:
        name, data = line.split(":", 1)
        if name.strip() != "lo":
            total += int(data.split()[0])
    return total


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def bench_farm(env: dict[str, str], demo: Path, repeats: int) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from tests.fixtures.farm_demo import write_farm_demo

    args = ("farm", "--file", str(write_farm_demo(demo)), "--parallel", "2")
    first = builder(*args, env=env)
    again = [builder(*args, env=env)["wall_s"] for _ in range(repeats)]
    built = len(re.findall(r"\bbuilt\b", first["stderr"]))
    return {"targets": 8, "first_run_s": round(first["wall_s"], 1), "built_lines": built,
            "unchanged": spread(again)}


def tinyext_args(house: Path) -> list[str]:
    sys.path.insert(0, str(ROOT))
    from tests.conftest import LOCAL_TORCH_INDEX

    return ["build", "tinyext", "--recipes", str(FIXTURE_RECIPES), "--cuda", "13.0", "--arch", "90", "--python",
            "3.11", "--torch", "2.14.1", "--torch-index", str(LOCAL_TORCH_INDEX), "--toolchain", "host",
            "--wheelhouse", str(house)]


def bench_target(env: dict[str, str], house: Path, repeats: int) -> dict[str, Any]:
    args = tinyext_args(house)
    first = builder(*args, env=env)
    again = [builder(*args, env=env) for _ in range(repeats)]
    assert all("unchanged:" in run["stderr"] for run in again)
    forced = builder(*args, "--force", env=env)
    plain = builder(*args, "--force", "--compiler-cache", "off", env=env)
    hits = re.findall(r"compiler cache: (\d+) hits, (\d+) misses", forced["stderr"])
    return {"first_build_s": round(first["wall_s"], 1), "unchanged": spread([r["wall_s"] for r in again]),
            "rebuild_with_ccache_s": round(forced["wall_s"], 1), "rebuild_without_ccache_s": round(plain["wall_s"], 1),
            "ccache_hits_misses": [int(x) for x in hits[-1]] if hits else None}


def bench_provision(env: dict[str, str], repeats: int) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from packaging.version import Version

    from builder.core.settings import Settings
    from builder.toolchain.pip import provision

    with tempfile.TemporaryDirectory(prefix="bench-toolkit-") as tmp:
        settings = Settings(cache_dir=Path(tmp), wheelhouse=Path(tmp) / "wh", recipes_dir=ROOT / "recipes",
                            patches_dir=ROOT / "patches")
        os.environ["UV_NO_CACHE"] = "1"  # a real download, not uv's cache
        before, start = rx_bytes(), time.monotonic()
        toolkit = provision(Version("13.0"), settings)
        first = time.monotonic() - start
        received = rx_bytes() - before
        os.environ.pop("UV_NO_CACHE")
        cached = []
        for _ in range(repeats):
            start = time.monotonic()
            provision(Version("13.0"), settings)
            cached.append(time.monotonic() - start)
        return {"first_s": round(first, 1), "downloaded_mib": round(received / 2**20, 1),
                "installed_mib": round(du(Path(tmp) / "toolkits") / 2**20, 1), "nvcc": str(toolkit.version),
                "cached": spread(cached)}


def bench_install(house: Path, repeats: int) -> dict[str, Any]:
    sys.path.insert(0, str(ROOT))
    from builder.core.uvtool import uv_bin
    from tests.conftest import LOCAL_TORCH_INDEX

    times = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="bench-install-") as tmp:
            venv = Path(tmp) / "venv"
            subprocess.run([uv_bin(), "venv", "-q", "--python", "3.11", str(venv)], check=True)
            start = time.monotonic()
            # as docs/USING.md says: PyPI stays the default index, the wheelhouse comes first as an extra one
            # (and the local torch 2.14.1 index, where this machine keeps torch for Python 3.11)
            subprocess.run([uv_bin(), "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
                            "--extra-index-url", (house / "simple").as_uri(), "--extra-index-url",
                            Path(LOCAL_TORCH_INDEX).as_uri(), "tinyext==0.1.0"], check=True)
            times.append(time.monotonic() - start)
    return {"uv_install": spread(times)}


def machine() -> dict[str, Any]:
    mem = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {"host": platform.node(), "cores": os.cpu_count(), "memory_gib": round(mem / 2**30, 1),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--skip-provision", action="store_true", help="no 100 MB toolkit download")
    parser.add_argument("--parts", default="farm,target,install,provision", help="comma-separated subset")
    args = parser.parse_args(argv)
    parts = set(args.parts.split(","))
    if args.skip_provision:
        parts.discard("provision")
    report: dict[str, Any] = {"machine": machine(), "repeats": args.repeats}
    if args.out.exists():  # parts run separately land in one file
        report = {**json.loads(args.out.read_text()), **report}
    with tempfile.TemporaryDirectory(prefix="bench-steps-") as tmp:
        base = Path(tmp)
        env = {**os.environ, "BUILDER_CACHE_DIR": str(base / "cache"), "BUILDER_WHEELHOUSE": str(base / "wh"),
               "COLUMNS": "200"}
        if "farm" in parts:
            print("farm of 8 ...", flush=True)
            report["farm"] = bench_farm(env, base / "demo", args.repeats)
            print(json.dumps(report["farm"]), flush=True)
        if "target" in parts:
            print("one target ...", flush=True)
            report["target"] = bench_target(env, base / "wh1", args.repeats)
            print(json.dumps(report["target"]), flush=True)
        if "install" in parts:
            if not (base / "wh1" / "simple").exists():
                builder(*tinyext_args(base / "wh1"), env=env)
            report["install"] = bench_install(base / "wh1", args.repeats)
            print(json.dumps(report["install"]), flush=True)
    if "provision" in parts:
        print("toolkit provisioning ...", flush=True)
        report["provision"] = bench_provision(dict(os.environ), args.repeats)
        print(json.dumps(report["provision"]), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
