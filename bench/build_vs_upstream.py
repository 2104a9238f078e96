#!/usr/bin/env python3
"""Issue 9, item 1: a cold build of causal-conv1d for one arch with the builder, against upstream's own build.

    python bench/build_vs_upstream.py --out bench/results/build-vs-upstream.json [--arch 120] [--skip-upstream]
        [--variant no-ptxas-split] [--variant issue-19-before]
        [--package mamba-ssm --version 2.3.2.post1 --torch 2.11.0]
    python bench/build_vs_upstream.py --write-recipes DIR --variant V ...   (the recipe copies only)

Builder variants (issue 19), each a cold build of its own, one after another in this one run: `defaults` (always),
`no-ptxas-split` (a recipe copy with `[build] ptxas-split = false`) and `issue-19-before` (that, plus
NVCC_APPEND_FLAGS=--compress-mode=default: the builder's nvcc flags before issue 19, bar -frandom-seed, which
changes names only).

Both sides use the same toolkit (the host's nvcc, --toolchain host), the same torch (2.14.1, CUDA 13.0 build),
Python 3.12, MAX_JOBS sized the same way, and the same sdist from PyPI:

- builder: `builder build causal-conv1d --version 1.7.0 --cuda 13.0 --arch ARCH --toolchain host` with an empty
  builder cache (sources, build venv, logs all start empty; uv's own download cache stays warm, as it would on any
  machine that has installed torch once). Its per-step timings come from its own `timings:` line.
- upstream: what a user without a prebuilt wheel does, `pip install --no-build-isolation --no-deps SDIST` with
  CAUSAL_CONV1D_FORCE_BUILD=TRUE or MAMBA_FORCE_BUILD=TRUE (else setup.py tries to download a wheel from GitHub)
  into a venv that already holds torch, setuptools, wheel, ninja and packaging (its creation is not timed):
  upstream's default arch list.

Writes wall times, wheel sizes and the ratio measured in this one run.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
VERSION, TORCH, PYTHON = "1.7.0", "2.14.1", "3.12"
PACKAGE = "causal-conv1d"  # or --package mamba-ssm --version 2.3.2.post1 --torch 2.11.0
UPSTREAM = {  # package → (the env var that makes its setup.py compile instead of downloading, its extension's name)
    "causal-conv1d": ("CAUSAL_CONV1D_FORCE_BUILD", "causal_conv1d_cuda"),
    "mamba-ssm": ("MAMBA_FORCE_BUILD", "selective_scan_cuda"),
}


def run(argv: list[str], env: dict[str, str] | None = None, log: Path | None = None) -> dict[str, Any]:
    """Run argv, return wall seconds and peak RSS of the largest child (GNU time), output into log."""
    timed = ["/usr/bin/time", "-f", "TIME %e %M", *argv]
    start = time.monotonic()
    proc = subprocess.run(timed, env=env, capture_output=True, text=True)
    wall = time.monotonic() - start
    text = proc.stdout + proc.stderr
    if log:
        log.write_text(text)
    peak = re.findall(r"TIME [\d.]+ (\d+)", text)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[0]} failed ({proc.returncode}); log: {log}\n{text[-3000:]}")
    return {"wall_s": round(wall, 1), "peak_rss_mib": round(int(peak[-1]) / 1024) if peak else None, "text": text}


def dist() -> str:
    return PACKAGE.replace("-", "_")


def sdist(cache: Path) -> Path:
    """The sdist the builder fetched (same bytes for both sides)."""
    found = sorted(cache.rglob(f"{dist()}-{VERSION}.tar.gz"))
    if not found:
        raise SystemExit(f"no {dist()}-{VERSION}.tar.gz under {cache}")
    return found[0]


def wheel_archs(wheel: Path) -> list[str]:
    """SASS archs in the wheel's extension (cuobjdump through the builder's inspect stage)."""
    out = subprocess.run([sys.executable, "-m", "builder", "inspect", str(wheel)], capture_output=True, text=True,
                         cwd=ROOT)
    return sorted(set(re.findall(r"sm_\d+[af]?", out.stdout + out.stderr)))


VARIANTS = {  # name → lines added to the recipe's [build] table (and its env) in a copy of recipes/
    "defaults": ("", {}),
    "no-ptxas-split": ("ptxas-split = false", {}),
    "issue-19-before": ("ptxas-split = false", {"NVCC_APPEND_FLAGS": "--compress-mode=default"}),
}


def recipes_for(variant: str, work: Path) -> Path:
    """recipes/ and patches/ copied, the package's recipe's [build] table edited for `variant`."""
    import shutil

    line, env = VARIANTS[variant]
    root = work / f"recipes-{variant}"
    for name in ("recipes", "patches"):
        shutil.copytree(ROOT / name, root / name)
    recipe = root / "recipes" / PACKAGE / "recipe.toml"
    text = recipe.read_text()
    extra = "".join(f', {k} = "{v}"' for k, v in env.items())
    text = re.sub(r"(?m)^(env = \{.*?) \}$", lambda m: f"{m.group(1)}{extra} }}", text, count=1)
    recipe.write_text(text.replace("[build]\n", f"[build]\n{line}\n", 1))
    return root / "recipes"


def bench_builder(work: Path, arch: str, jobs: int, variant: str = "defaults") -> dict[str, Any]:
    cache, house = work / f"builder-cache-{variant}", work / f"wh-{variant}"
    env = dict(os.environ, BUILDER_CACHE_DIR=str(cache))
    argv = [sys.executable, "-m", "builder", "build", PACKAGE, "--version", VERSION, "--cuda", "13.0",
            "--arch", arch, "--torch", TORCH, "--python", PYTHON, "--toolchain", "host", "--jobs", str(jobs),
            "--no-kernel-tests", "--wheelhouse", str(house), "--recipes", str(recipes_for(variant, work))]
    result = run(argv, env, work / f"builder-{variant}.log")
    timings = json.loads(re.findall(r"timings: (\{.*\})", result.pop("text"))[-1])
    wheel = next((house / "wheels").glob(f"{dist()}-*.whl"))
    return {**result, "steps_s": timings, "wheel": wheel.name, "wheel_mib": round(wheel.stat().st_size / 2**20, 1),
            "archs": wheel_archs(wheel), "sdist": str(sdist(cache))}


def bench_upstream(work: Path, source: Path, jobs: int) -> dict[str, Any]:
    from builder.core.uvtool import uv_bin
    from builder.stages.pyenv import find_interpreter

    venv = work / "upstream-venv"
    subprocess.run([uv_bin(), "venv", "-q", "--python", str(find_interpreter(PYTHON)), str(venv)], check=True)
    subprocess.run([uv_bin(), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), f"torch=={TORCH}",
                    "setuptools", "wheel", "ninja", "packaging", "pip"], check=True)
    force, extension = UPSTREAM[PACKAGE]
    env = dict(os.environ, **{force: "TRUE"}, MAX_JOBS=str(jobs), PIP_NO_CACHE_DIR="1",
               CUDA_HOME=os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    result = run([str(venv / "bin" / "pip"), "install", "--no-build-isolation", "--no-deps", "-v", str(source)],
                 env, work / "upstream.log")
    result.pop("text")
    site = next(venv.glob("lib/python*/site-packages"))
    so = sorted(site.glob(f"{extension}*.so"))
    return {**result, "extension_mib": round(so[0].stat().st_size / 2**20, 1) if so else None,
            "archs": sorted(set(re.findall(r"sm_\d+[af]?", (work / "upstream.log").read_text())))}


def same_code_as(work: Path, a: str, b: str) -> bool | None:
    """Whether two variants' wheels hold the same GPU code (bench/compile_profile.py same-code; None: no cuobjdump
    on this machine: PATH, /usr/local/cuda*, the builder's user cache)."""
    from builder.core.settings import Settings
    from builder.stages.inspection import find_local_cuobjdump

    found = find_local_cuobjdump(Settings.from_env(os.environ))
    if found is None:
        return None
    wa, wb = (next((work / f"wh-{v}" / "wheels").glob(f"{dist()}-*.whl")) for v in (a, b))
    env = dict(os.environ, PATH=f"{found.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "compile_profile.py"), "same-code", str(wa), str(wb),
                          "--work", str(work / f"same-{b}")], capture_output=True, text=True, env=env)
    print(out.stdout[-600:], flush=True)
    return out.returncode == 0


def machine() -> dict[str, Any]:
    nvcc = subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    mem = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {"host": platform.node(), "cores": os.cpu_count(), "memory_gib": round(mem / 2**30, 1),
            "nvcc": nvcc[-1] if nvcc else None, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def main(argv: list[str] | None = None) -> int:
    global PACKAGE, VERSION, TORCH
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, help="the report (JSON); required unless --write-recipes")
    parser.add_argument("--arch", default="120")
    parser.add_argument("--package", default="causal-conv1d", help=f"a recipe (upstream's side: {', '.join(UPSTREAM)})")
    parser.add_argument("--version", default="1.7.0")
    parser.add_argument("--torch", default=TORCH, help="mamba-ssm before its patch 0003 needed < 2.14 (-std=c++17)")
    parser.add_argument("--skip-upstream", action="store_true", help="builder side only (upstream takes ~16 min)")
    parser.add_argument("--variant", action="append", default=[], choices=sorted(VARIANTS),
                        help="another builder variant, built after the defaults")
    parser.add_argument("--write-recipes", type=Path, metavar="DIR",
                        help="write each --variant's recipes/ copy (DIR/recipes-VARIANT/recipes), nothing else")
    args = parser.parse_args(argv)
    PACKAGE, VERSION, TORCH = args.package, args.version, args.torch
    if args.write_recipes:  # bench/h200_build_speed.sh builds these on the lent GPU host
        for variant in args.variant or ["defaults"]:
            print(recipes_for(variant, args.write_recipes))
        return 0
    if not args.out:
        parser.error("--out is required")
    if PACKAGE not in UPSTREAM and not args.skip_upstream:
        raise SystemExit(f"upstream's build is scripted for {', '.join(UPSTREAM)} only: add --skip-upstream")
    sys.path.insert(0, str(ROOT))
    from builder.core.settings import default_jobs

    jobs = default_jobs()
    report: dict[str, Any] = {"machine": machine(), "jobs": jobs, "version": VERSION, "torch": TORCH}
    with tempfile.TemporaryDirectory(prefix="bench-build-") as tmp:
        work = Path(tmp)
        print(f"builder: cold build for sm_{args.arch} (MAX_JOBS={jobs}) ...", flush=True)
        report["builder"] = bench_builder(work, args.arch, jobs)
        print(f"  {report['builder']['wall_s']} s, {report['builder']['archs']}", flush=True)
        for variant in [v for v in args.variant if v != "defaults"]:
            print(f"builder, {variant}: cold build for sm_{args.arch} ...", flush=True)
            report[f"builder-{variant}"] = bench_builder(work, args.arch, jobs, variant)
            print(f"  {report[f'builder-{variant}']['wall_s']} s", flush=True)
            report[f"builder-{variant}"]["same_code_as_defaults"] = same_code_as(work, "defaults", variant)
        if not args.skip_upstream:
            print("upstream: pip install --no-build-isolation (its default arch list) ...", flush=True)
            report["upstream"] = bench_upstream(work, Path(report["builder"]["sdist"]), jobs)
            print(f"  {report['upstream']['wall_s']} s, {report['upstream']['archs']}", flush=True)
            report["ratio_upstream_over_builder"] = round(report["upstream"]["wall_s"] / report["builder"]["wall_s"], 2)
        keep = args.out.parent / "logs"
        keep.mkdir(parents=True, exist_ok=True)
        prefix = "build-vs-upstream-" + ("" if PACKAGE == "causal-conv1d" else f"{PACKAGE}-")
        for name in [f"builder-{v}.log" for v in ("defaults", *args.variant)] + ["upstream.log"]:  # last 200 lines
            if (work / name).exists():
                lines = (work / name).read_text(errors="replace").splitlines()[-200:]
                (keep / f"{prefix}{name}").write_text("\n".join(lines) + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "machine"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
