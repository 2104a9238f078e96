#!/usr/bin/env python3
"""Issue 19 item 2: how long a no-op takes, before and after, side by side in one run.

    python bench/noop.py --base main [--runs 5] [--work /tmp/noop-bench] [--out bench/results/noop.json]

Two trees run the same commands against one builder cache and one wheelhouse: ``before`` is a detached git worktree
of ``--base`` (made under --work), ``after`` is this checkout. The wheelhouse is filled once by the ``before`` code,
so ``after`` reporting "unchanged" for every target also shows the cache keys did not move.

1. one unchanged target: ``builder build tinyext …`` (tests/fixtures/tinyext, host nvcc 13.0, torch 2.14.1 for
   Python 3.11 from the local index /opt/pypi-more/simple, as tests/test_e2e.py builds it);
2. an unchanged farm of 8: tinyext and tinyscale 0.1.0 and 0.2.0 (CUDA, sm_90) and four pure-Python packages
   (two build venvs in all), ``builder farm --file farm.toml``.

Each is run ``--runs`` times per tree, the trees interleaved so both see the same machine load; medians, spread and
the load average are recorded. Then one profiled run per tree and command: the subprocesses it starts (an audit
hook on subprocess.Popen), ``-X importtime``'s total for the builder's import, and cProfile's top entries.
"""
from __future__ import annotations

import argparse
import cProfile  # noqa: F401  (run through -m cProfile below)
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TORCH_INDEX = Path("/opt/pypi-more/simple")
PURE = ("purea", "pureb", "purec", "pured")

def fixture_tree(work: Path) -> Path:
    """Recipes, patches and sources for the farm; returns the farm file."""
    tree = work / "tree"
    if not tree.exists():
        sys.path.insert(0, str(ROOT))
        from tests.fixtures.farm_demo import write_farm_demo

        write_farm_demo(tree)  # tinyext and tinyscale with their 0.2.0 trees, laid out as farm.toml below names them
        for name in PURE:
            src = tree / "pure" / name
            (src / name).mkdir(parents=True)
            (src / name / "__init__.py").write_text(f'NAME = "{name}"\n')
            (src / "setup.py").write_text(f'from setuptools import setup\nsetup(name="{name}", version="0.1.0", '
                                          f'packages=["{name}"], python_requires=">=3.9")\n')
            (tree / "recipes" / name).mkdir()
            (tree / "recipes" / name / "recipe.toml").write_text(
                f'name = "{name}"\nkind = "pure-python"\nversions = ">=0.1,<1"\n[source]\npath = "../../pure/{name}"\n'
                f'[build]\nrequires = ["setuptools>=64", "wheel"]\n[test]\nimports = ["{name}"]\n')
    farm = tree / "farm.toml"
    farm.write_text(f"""
[defaults]
recipes = "recipes"
toolchain = "host"
cuda = "13.0"
archs = "90"
python = "3.11"
torch = "2.14.1"
torch-index = "{TORCH_INDEX}"

[[package]]
name = "tinyext"
versions = ["0.1.0", "0.2.0"]
source = {{ "0.2.0" = "farm/tinyext-0.2.0" }}

[[package]]
name = "tinyscale"
recipes = "farm/recipes"
versions = ["0.1.0", "0.2.0"]
source = {{ "0.2.0" = "farm/tinyscale-0.2.0" }}
""" + "".join(f'\n[[package]]\nname = "{name}"\nversions = ["0.1.0"]\n' for name in PURE))
    return farm


def before_tree(work: Path, base: str) -> Path:
    path = work / "before-src"
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", base], capture_output=True, text=True,
                            check=True).stdout.strip()
    if path.exists():
        subprocess.run(["git", "-C", str(path), "checkout", "-q", "--detach", commit], check=True)
    else:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach", str(path), commit], check=True)
    return path


def commands(tree: Path, farm: Path, work: Path) -> dict[str, list[str]]:
    return {
        "target": ["build", "tinyext", "--recipes", str(tree / "recipes"), "--cuda", "13.0", "--arch", "90",
                   "--python", "3.11", "--torch", "2.14.1", "--torch-index", str(TORCH_INDEX), "--toolchain", "host"],
        "farm": ["farm", "--file", str(farm), "--log-dir", str(work / "farm-logs")],
    }


def run(code: Path, args: list[str], env: dict[str, str], *, pre: list[str] = ()) -> tuple[float, str]:
    """``python [pre] -m builder ARGS`` with ``code`` first on sys.path; wall seconds and stderr."""
    full = {**env, "PYTHONPATH": str(code)}
    start = time.monotonic()
    proc = subprocess.run([sys.executable, *pre, "-m", "builder", *args], capture_output=True, text=True, env=full,
                          cwd=code)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{code}: builder {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall, proc.stderr


def check_unchanged(which: str, stderr: str, work: Path) -> None:
    if which == "target":
        ok = "unchanged:" in stderr and "==> build" not in stderr
    else:
        counts = json.loads((work / "farm-logs" / "summary.json").read_text())["counts"]
        ok = counts["unchanged"] == 8 and counts["built"] == 0
    if not ok:
        raise SystemExit(f"not a no-op ({which}):\n{stderr[-3000:]}")


def spread(values: list[float]) -> dict[str, Any]:
    return {"median_s": round(statistics.median(values), 2), "min_s": round(min(values), 2),
            "max_s": round(max(values), 2), "runs": [round(v, 2) for v in values]}


def profile(code: Path, args: list[str], env: dict[str, str], work: Path, label: str) -> dict[str, Any]:
    """One run each: the subprocesses it starts, the builder's import time, cProfile's top cumulative entries."""
    spawns_file = work / f"spawns-{label}.json"
    start = time.monotonic()
    sys.path.insert(0, str(ROOT))
    from tests.helpers import AUDITED_CLI  # the CLI with an audit hook noting each subprocess it starts

    proc = subprocess.run([sys.executable, "-c", AUDITED_CLI, *args], capture_output=True, text=True, cwd=code,
                          env={**env, "PYTHONPATH": str(code), "BUILDER_AUDIT_SPAWNS": str(spawns_file)})
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    spawns = [{"at_s": round(t - start, 3), "exe": exe, "argv": argv[:3]}
              for t, exe, argv in json.loads(spawns_file.read_text())]
    _, imports = run(code, ["--help"], env, pre=["-X", "importtime"])
    cumulative = {m.group(2).strip(): int(m.group(1)) for m in re.finditer(r"\|\s*(\d+) \|\s*(\S.*)$", imports, re.M)}
    stats_file = work / f"profile-{label}.pstats"
    run(code, args, env, pre=["-m", "cProfile", "-o", str(stats_file)])
    import pstats
    from io import StringIO

    text = StringIO()
    pstats.Stats(str(stats_file), stream=text).sort_stats("cumulative").print_stats(25)
    top = [line.strip() for line in text.getvalue().splitlines() if re.match(r"\s*\d", line)]
    return {"subprocesses": spawns, "import_builder_cli_main_ms": round(cumulative.get("builder.cli.main", 0) / 1000),
            "import_top_ms": sorted(((round(v / 1000), k) for k, v in cumulative.items() if v > 20000),
                                    reverse=True)[:12],
            "cprofile_top": top}


def machine() -> dict[str, Any]:
    mem = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return {"host": platform.node(), "cores": os.cpu_count(), "memory_gib": round(mem / 2**30, 1),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--base", default="main", help="the git revision measured as 'before'")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--work", type=Path, default=Path("/tmp/noop-bench"))
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "noop.json")
    parser.add_argument("--no-profile", action="store_true")
    opts = parser.parse_args()
    work = opts.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    trees = {"before": before_tree(work, opts.base), "after": ROOT}
    farm = fixture_tree(work)
    env = {**os.environ, "BUILDER_CACHE_DIR": str(work / "cache"), "BUILDER_WHEELHOUSE": str(work / "wheelhouse"),
           "COLUMNS": "200"}
    cmds = commands(work / "tree", farm, work)
    print("filling the wheelhouse with the 'before' code (first time: 4 tinyext-sized compiles) ...", flush=True)
    run(trees["before"], [*cmds["farm"], "--parallel", "2"], env)
    run(trees["before"], cmds["target"], env)
    for code in trees.values():  # both trees see every target as unchanged: the keys did not move
        for which, args in cmds.items():
            check_unchanged(which, run(code, args, env)[1], work)
    times: dict[str, dict[str, list[float]]] = {w: {t: [] for t in trees} for w in cmds}
    load = [os.getloadavg()[0]]
    for _ in range(opts.runs):
        for which, args in cmds.items():
            for label, code in trees.items():
                wall, stderr = run(code, args, env)
                check_unchanged(which, stderr, work)
                times[which][label].append(wall)
        load.append(os.getloadavg()[0])
    report: dict[str, Any] = {
        "machine": machine(), "runs": opts.runs, "base": opts.base,
        "commits": {label: subprocess.run(["git", "-C", str(code), "rev-parse", "--short", "HEAD"], capture_output=True,
                                          text=True).stdout.strip() for label, code in trees.items()},
        "load_avg_1min": {"min": min(load), "max": max(load), "samples": load},
        "unchanged_target": {label: spread(times["target"][label]) for label in trees},
        "unchanged_farm_of_8": {label: spread(times["farm"][label]) for label in trees},
    }
    for which in cmds:
        row = report["unchanged_target" if which == "target" else "unchanged_farm_of_8"]
        print(f"{which:6}  before {row['before']['median_s']:.2f} s  after {row['after']['median_s']:.2f} s  "
              f"(runs {row['before']['runs']} / {row['after']['runs']})", flush=True)
    if not opts.no_profile:
        report["profile"] = {f"{which}-{label}": profile(code, args, env, work, f"{which}-{label}")
                             for which, args in cmds.items() for label, code in trees.items()}
    opts.out.parent.mkdir(parents=True, exist_ok=True)
    opts.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"written {opts.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
