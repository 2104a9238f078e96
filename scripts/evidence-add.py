#!/usr/bin/env python3
"""Add (or replace, by id) one GPU run in evidence/gpu-runs.json, its numbers read from the raw file.

    scripts/evidence-add.py --id ID --date YYYY-MM-DD --section N [--session N] --command CMD [--wheel FILE]
        [--expect pass|fail|memcheck-pass|memcheck-fail|racecheck-pass] [--note TEXT] [--commit REV]
        (--report PATH | --summary PATH --line NAME.json | --prose [--raw PATH])
        [--package P --version V --sm sm_NN --torch T --gpu G]        (what the raw file does not say)
        [--status S --passed N --failed N --skipped N --worst W]      (--prose only: the numbers of GPU-RESULTS.md)

--report: a kernel-test report (recipes/*/kernel_tests.py) or a check script's JSON; --summary: the summary.txt
scripts/kernel-report-summary.py wrote on the GPU machine, and the report name of the line to read. The raw file is
read from git (`git show REV:PATH`, REV default HEAD), so it must be committed: the entry records the commit, the
path and the file's sha256, and tests/test_gpu_evidence.py derives the numbers again from there. A flag that
disagrees with the raw file is an error. evidence/README.md describes the format.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from builder.farm import gpuevidence as ev  # noqa: E402


def git(*args: str) -> bytes:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True).stdout


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--file", type=Path, default=Path(os.environ.get("EVIDENCE_FILE") or ROOT / "evidence" / "gpu-runs.json"),
                   help="default: $EVIDENCE_FILE, else evidence/gpu-runs.json")
    p.add_argument("--id", required=True)
    p.add_argument("--date", required=True)
    p.add_argument("--section", type=int, required=True)
    p.add_argument("--session", type=int)
    p.add_argument("--command", required=True)
    p.add_argument("--wheel")
    p.add_argument("--expect", choices=ev.EXPECTS)
    p.add_argument("--note")
    p.add_argument("--commit", default="HEAD")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--report")
    src.add_argument("--summary")
    src.add_argument("--prose", action="store_true")
    p.add_argument("--line", help="--summary: the report name its line starts with")
    p.add_argument("--raw", help="--prose: a log of the run, if one was kept")
    for key in ("package", "version", "sm", "torch", "gpu", "status"):
        p.add_argument(f"--{key}")
    for key in ("passed", "failed", "skipped"):
        p.add_argument(f"--{key}", type=int)
    p.add_argument("--worst", type=float)
    args = p.parse_args(argv)

    given = {k: getattr(args, k) for k in ("package", "version", "sm", "torch", "gpu") if getattr(args, k)}
    numbers = {k: getattr(args, k) for k in ("status", "passed", "failed", "skipped", "worst")
               if getattr(args, k) is not None}
    commit = git("rev-parse", args.commit).decode().strip() if not args.prose or args.raw else None
    raw = None
    if args.prose:
        facts = {"outcome": {"status": numbers.pop("status", None), "passed": None, "failed": None, "skipped": None,
                             "worst": None, **numbers}}
        if args.raw:
            raw = {"commit": commit, "path": args.raw, "sha256": ev.sha256(git("show", f"{commit}:{args.raw}"))}
    else:
        if numbers:
            p.error("--status/--passed/--failed/--skipped/--worst are for --prose: the raw file says them")
        path = args.report or args.summary
        data = git("show", f"{commit}:{path}")
        if args.report:
            facts = ev.report_facts(data)
        else:
            if not args.line:
                p.error("--summary needs --line NAME.json")
            facts = ev.summary_facts(data.decode(), args.line)
        raw = {"commit": commit, "path": path, "sha256": ev.sha256(data), **({"line": args.line} if args.line else {})}
        for key, value in given.items():
            if key in facts and facts[key] != value:
                p.error(f"--{key} {value!r}, but {path} says {facts[key]!r}")
    entry = {"id": args.id, "date": args.date, "section": args.section, "session": args.session,
             "gpu": facts.get("gpu") or given.get("gpu"), "sm": facts.get("sm") or given.get("sm"),
             "package": facts.get("package") or given.get("package"),
             "version": facts.get("version") or given.get("version"),
             "torch": facts.get("torch") or given.get("torch"), "wheel": args.wheel, "command": args.command,
             "expect": args.expect, "outcome": facts["outcome"], "source": "prose" if args.prose else
             ("report" if args.report else "summary"), "raw": raw}
    if args.note:
        entry["note"] = args.note
    run = ev.parse_run(entry, f"the new entry {args.id}")  # the reader's checks, before anything is written
    runs = json.loads(args.file.read_text())["runs"] if args.file.exists() else []
    ids = [r["id"] for r in runs]
    if args.id in ids:  # replaced where it stands
        runs[ids.index(args.id)] = run.to_json()
    else:
        runs.append(run.to_json())
    args.file.parent.mkdir(parents=True, exist_ok=True)
    args.file.write_text(ev.dump(runs))
    ev.load(args.file)
    print(f"{args.id}: {run.headline()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
