#!/usr/bin/env python3
"""Summarize a kernel-test report (the JSON a recipe's kernel_tests.py writes): counts, worst error/tolerance,
and the failed cases grouped by family and dtype with the sequence lengths they failed at, so a planted fault's
pattern (e.g. seqlen % chunk < vec) is visible in a few lines.

    python3 scripts/kernel-report-summary.py REPORT.json [...]
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path


def summarize(path: Path) -> list[str]:
    report = json.loads(path.read_text())
    counts = report.get("counts", {})
    lines = [f"{path.name}: {report.get('status')} on {report.get('gpu')} (seed {report.get('seed')}, quick "
             f"{report.get('quick')}): " + ", ".join(f"{v} {k}" for k, v in counts.items())
             + (f"; worst {report['worst']:.3f} of tolerance" if report.get("worst") is not None else "")]
    groups: dict[tuple[str, str], list[str]] = defaultdict(list)
    for case in report.get("cases", []):
        if case["status"] != "failed":
            continue
        parts = case["name"].split("/")
        # causal-conv1d/mamba name a length L123 or T123; flash-attn a query and key length q64/k65
        length = "/".join(p for p in parts if re.fullmatch(r"[LTqk]\d+", p)) or "?"
        groups[(parts[0], parts[1] if len(parts) > 1 else "")].append(length)
    for (family, dtype), lengths in sorted(groups.items()):
        lines.append(f"  FAILED {family} {dtype}: {len(lengths)} case(s) at {' '.join(sorted(set(lengths), key=_num))}")
    failed = [c for c in report.get("cases", []) if c["status"] == "failed"]
    if failed:
        lines.append(f"  first: {failed[0]['name']}: {failed[0]['detail'][:300]}")
    return lines


def _num(text: str) -> tuple[int, ...]:
    """Sort key of a length label: its numbers in order (q64/k65 -> (64, 65)); "?" first."""
    return tuple(int(n) for n in re.findall(r"\d+", text)) or (-1,)


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print("\n".join(summarize(Path(arg))))
