"""The shared kernel-test harness (recipes/_harness/kernel_harness.py) on a CPU: checks, refusals, a broken
case, worker processes, the report and its exit codes. There is no GPU here, so the suites' cases run on the CPU
device through the same Suite machinery a GPU run uses; the "no GPU" path is checked as the real skip."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="skipped: torch is not installed in the test environment")

HARNESS_DIR = Path(__file__).resolve().parent.parent / "recipes" / "_harness"
sys.path.insert(0, str(HARNESS_DIR))
import kernel_harness as kh

TOY_SUITE = '''
import re, sys, torch
from dataclasses import dataclass
sys.path.insert(0, {harness!r})
import kernel_harness as kh

@dataclass(frozen=True)
class Case:
    name: str
    kind: str

class Toy(kh.Suite):
    package = "toy"
    refusals = (re.compile(r"known to compute wrong on this GPU"),)
    def load(self):
        return None
    def cases(self, api, quick):
        return [Case("ok_a", "ok"), Case("ok_b", "ok"), Case("bad", "bad"), Case("refused", "refuse"),
                Case("lacking", "lack"), Case("raises", "raise")]
    def skip_reason(self, api, case):
        return "this version has no such feature" if case.kind == "lack" else None
    def group_key(self, case):
        return case.kind
    def run_case(self, api, case, device):
        x = torch.randn(64)
        if case.kind == "refuse":
            raise RuntimeError("Triton 3.4 known to compute wrong on this GPU")
        if case.kind == "raise":
            raise ValueError("boom")
        got = x + (0.5 if case.kind == "bad" else 1e-7)
        return kh.result_from_checks(case.name, [kh.check_close("out", got, x, 1e-3, 1e-3),
                                                 kh.check_ratio("out_ratio", got, x, 0.005)])

if __name__ == "__main__":
    import argparse
    suite = Toy()
    args = suite.parse_args(sys.argv[1:])
    report = suite.new_report(0, False)
    cases = suite.cases(None, False)
    report["cases"] = suite.run_groups(report, args.out, cases, args.jobs, None, torch.device("cpu"))
    kh.finalize(report)
    kh.write_report(report, args.out)
    kh.print_summary(report)
    sys.exit(kh.EXIT_CODES[report["status"]])
'''


@pytest.mark.parametrize("jobs", [1, 2])
def test_suite_machinery_in_process_and_in_workers(tmp_path: Path, jobs: int) -> None:
    script = tmp_path / "toy_tests.py"
    script.write_text(textwrap.dedent(TOY_SUITE.format(harness=str(HARNESS_DIR))))
    out = tmp_path / "report.json"
    result = subprocess.run([sys.executable, str(script), "--out", str(out), "--jobs", str(jobs)],
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 1, result.stdout + result.stderr  # "bad" and "raises" failed
    report = json.loads(out.read_text())
    status = {c["name"]: c["status"] for c in report["cases"]}
    assert status == {"ok_a": "passed", "ok_b": "passed", "bad": "failed", "refused": "skipped",
                      "lacking": "skipped", "raises": "failed"}
    detail = {c["name"]: c["detail"] for c in report["cases"]}
    assert detail["refused"].startswith("refused by the package: RuntimeError: Triton 3.4 known")
    assert detail["raises"].startswith("raised ValueError: boom [")  # timed: " [0.0s]"
    assert report["counts"] == {"passed": 2, "failed": 2, "skipped": 2}
    assert report["status"] == "failed" and report["reason"] == "2 case(s) failed"
    assert report["worst"] > 1  # the bad case's error is far above its bound
    assert "FAILED bad: out FAIL" in result.stdout
    assert report["jobs"] == jobs


def test_checks() -> None:
    x = torch.linspace(-1, 1, 101)
    close = kh.check_close("t", x + 5e-4, x, rtol=0.0, atol=1e-3)
    assert close.ok and close.worst == pytest.approx(0.5, rel=1e-3)
    assert not kh.check_close("t", x + 2e-3, x, rtol=0.0, atol=1e-3).ok
    nan = x.clone()
    nan[3] = float("nan")
    assert kh.check_close("t", nan, x, 1, 1).note == "1/101 non-finite"
    assert kh.check_close("t", x[:5], x, 1, 1).note == "shape (5,) != (101,)"
    ratio = kh.check_ratio("t", x * 1.001, x, tol=0.005)
    assert ratio.ok and ratio.ratio == pytest.approx(1e-3, rel=1e-3)
    assert not kh.check_ratio("t", x * 1.01, x, tol=0.005).ok
    assert kh.check_ratio("t", x + 1e-7, x, tol=1e-12).ok  # max abs err <= 1e-6 passes whatever the ratio
    assert kh.check_equal("t", x, x.clone()).ok and not kh.check_equal("t", x, x + 1).ok
    assert not kh.check_equal("t", x, x.double()).ok
    folded = kh.result_from_checks("c", [close, kh.check_close("u", x + 2e-3, x, 0.0, 1e-3)])
    assert folded.status == "failed" and folded.max_abs_err == pytest.approx(2e-3, rel=1e-3)
    assert "u FAIL" in folded.detail and "t ok" in folded.detail


def test_a_passed_run_says_what_it_skipped() -> None:
    report = {"status": None, "reason": "", "cases": [
        {"name": "a", "status": "passed", "detail": "", "worst": 0.2},
        {"name": "b", "status": "skipped", "detail": "no GVA in 0.4.0"},
        {"name": "c", "status": "skipped", "detail": "no GVA in 0.4.0"}]}
    kh.finalize(report)
    assert report["status"] == "passed" and report["reason"] == "2 case(s) skipped: no GVA in 0.4.0"
    assert report["worst"] == 0.2
    assert json.loads(json.dumps(kh.json_safe({"x": float("nan")}))) == {"x": None}
