"""scripts/kernel-report-summary.py: the failed cases of a kernel-test report grouped by family and dtype, with the
lengths they failed at, for each recipe's case-name grammar (L123 for causal-conv1d, q64/k65 for flash-attn)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "kernel-report-summary.py"


def _case(name: str, status: str = "failed") -> dict[str, object]:
    return {"name": name, "status": status, "detail": f"{name} detail", "checks": []}


def _summary(tmp_path: Path, cases: list[dict[str, object]]) -> list[str]:
    report = tmp_path / "r.json"
    failed = sum(c["status"] == "failed" for c in cases)
    report.write_text(json.dumps({"status": "failed" if failed else "passed", "gpu": "G", "seed": 1, "quick": False,
                                  "counts": {"passed": len(cases) - failed, "failed": failed}, "worst": 2.5,
                                  "cases": cases}))
    out = subprocess.run([sys.executable, str(SCRIPT), str(report)], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_flash_attn_cases_name_their_query_and_key_lengths(tmp_path: Path) -> None:
    lines = _summary(tmp_path, [_case("edge_seq/bf16/d128/q65/k255/causal"), _case("edge_seq/bf16/d128/q63/k257/causal"),
                                _case("edge_seq/bf16/d128/q64/k64/full", "passed")])
    assert "  FAILED edge_seq bf16: 2 case(s) at q63/k257 q65/k255" in lines
    assert lines[0].endswith("1 passed, 2 failed; worst 2.500 of tolerance")


def test_causal_conv1d_lengths_sort_by_number(tmp_path: Path) -> None:
    lines = _summary(tmp_path, [_case("fwd/fp16/L1025/w4"), _case("fwd/fp16/L17/w4"), _case("fwd/fp16/nolength")])
    assert "  FAILED fwd fp16: 3 case(s) at ? L17 L1025" in lines
    assert lines[-1].startswith("  first: fwd/fp16/L1025/w4: ")
