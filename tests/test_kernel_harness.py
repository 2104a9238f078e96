"""The shared kernel-test harness (recipes/_harness/kernel_harness.py) on a CPU: checks, refusals, a broken
case, worker processes, the report and its exit codes. There is no GPU here, so the suites' cases run on the CPU
device through the same Suite machinery a GPU run uses; the "no GPU" path is checked as the real skip."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="skipped: torch is not installed in the test environment")

HARNESS_DIR = Path(__file__).resolve().parent.parent / "recipes" / "_harness"
sys.path.insert(0, str(HARNESS_DIR))
import kernel_harness as kh  # noqa: E402 (found through the sys.path entry above)

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


KNOWN = "wrong dbias for seqlen 1 (https://github.com/example/toy/issues/42)"


@dataclass(frozen=True)
class Case:
    name: str
    kind: str


class DefectSuite(kh.Suite):
    """Cases named seqlen1_* are declared a known upstream defect; kind says what the case does: ok (passes),
    bad (fails its check), raise, lack (skipped: a feature this version lacks)."""

    package = "toy"
    known_defects = (kh.KnownDefect(r"^seqlen1_", "wrong dbias for seqlen 1",
                                    "https://github.com/example/toy/issues/42"),)

    def load(self) -> None:
        return None

    def skip_reason(self, api: object, case: Case) -> str | None:
        return "this version has no such feature" if case.kind == "lack" else None

    def run_case(self, api: object, case: Case, device: torch.device) -> kh.CaseResult:
        x = torch.randn(16)
        if case.kind == "raise":
            raise ValueError("boom")
        got = x + (0.5 if case.kind == "bad" else 0.0)
        return kh.result_from_checks(case.name, [kh.check_close("out", got, x, 1e-3, 1e-3)])


def run_defect_suite(cases: list[Case]) -> dict:
    report = {"status": None, "reason": "", "cases": [asdict(r) for r in
                                                      DefectSuite().run_cases(None, cases, torch.device("cpu"))]}
    kh.finalize(report)
    return report


def test_a_known_upstream_defect_is_counted_apart_never_as_passed(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 26 6(f): a declared case that fails is 'known upstream defect: <reason>' (counted as known_defect,
    named in the run's reason and the summary); the run passes on its other cases; a skip stays a skip."""
    report = run_defect_suite([Case("ok", "ok"), Case("seqlen1_bad", "bad"), Case("seqlen1_raises", "raise"),
                               Case("seqlen1_lacking", "lack")])
    status = {c["name"]: c["status"] for c in report["cases"]}
    assert status == {"ok": "passed", "seqlen1_bad": "known_defect", "seqlen1_raises": "known_defect",
                      "seqlen1_lacking": "skipped"}
    detail = {c["name"]: c["detail"] for c in report["cases"]}
    assert detail["seqlen1_bad"].startswith(f"known upstream defect: {KNOWN}; out FAIL")
    assert detail["seqlen1_raises"].startswith(f"known upstream defect: {KNOWN}; raised ValueError: boom [")
    assert report["counts"] == {"passed": 1, "failed": 0, "skipped": 1, "known_defect": 2}
    assert report["status"] == "passed"
    assert report["reason"] == (f"2 case(s) known upstream defect: {KNOWN}; "
                                "1 case(s) skipped: this version has no such feature")
    capsys.readouterr()
    kh.print_summary(report)
    out = capsys.readouterr().out.splitlines()
    assert f"KNOWN UPSTREAM DEFECT seqlen1_bad: {KNOWN}; out FAIL" in out[0]
    assert out[-1] == "1 passed, 0 failed, 1 skipped, 2 known upstream defect(s)"


def test_a_known_defect_that_passes_fails_the_run() -> None:
    """Strict, like xfail(strict=True): a declared case that passes fails, so a stale declaration cannot hide
    the next regression in that case; a run of known defects alone is not passed."""
    report = run_defect_suite([Case("ok", "ok"), Case("seqlen1_fixed", "ok"), Case("seqlen1_bad", "bad")])
    fixed = next(c for c in report["cases"] if c["name"] == "seqlen1_fixed")
    assert fixed["status"] == "failed"
    assert fixed["detail"].startswith(f"passed, but is declared a known upstream defect ({KNOWN}): if upstream "
                                      "fixed it, remove the declaration; out ok")
    assert report["status"] == "failed"
    assert report["reason"] == f"1 case(s) failed; 1 case(s) known upstream defect: {KNOWN}"
    alone = run_defect_suite([Case("seqlen1_bad", "bad")])
    assert (alone["status"], alone["reason"]) == ("skipped", f"1 case(s) known upstream defect: {KNOWN}")
    plain = run_defect_suite([Case("ok", "ok")])
    assert plain["counts"] == {"passed": 1, "failed": 0, "skipped": 0}  # no known_defect key without any


def test_a_known_defect_in_one_result_of_a_case_leaves_its_other_results() -> None:
    """A case may return several results (a forward and a backward): where the defect fails one, the others keep
    their status; where none fails, the passed ones fail as a stale declaration."""
    forward = kh.CaseResult("c_fwd", "passed", detail="out ok")
    backward = kh.CaseResult("c_bwd", "failed", detail="dx FAIL")
    assert [(r.status, r.detail) for r in kh.expect_defect([forward, backward], "dx wrong; see #1")] == [
        ("passed", "out ok"), ("known_defect", "known upstream defect: dx wrong, see #1; dx FAIL")]
    stale = kh.expect_defect([kh.CaseResult("c_fwd", "passed"), kh.CaseResult("c_bwd", "skipped", detail="no bwd")],
                             "dx wrong")
    assert [r.status for r in stale] == ["failed", "skipped"]
    assert kh.expect_defect([kh.CaseResult("c", "passed")], None)[0].status == "passed"


# --------------------------------------------------------------------------- boundaries from a kernel's structure


def test_boundary_values_are_every_chunk_edge_and_vector_tail() -> None:
    assert kh.boundary_values(512, 4) == [1, 3, 4, 5, 511, 512, 513, 515, 516, 517, 1023, 1024, 1025, 1027, 1028, 1029,
                                          1535]
    assert kh.boundary_values(64, 1, chunks=1, tails=(2, 3)) == [1, 2, 3, 63, 64, 65, 66, 67, 127]
    # every residue a short last chunk can have below one vector is reached above the first chunk
    values = kh.boundary_values(1024, 8, tails=range(1, 8))
    assert {v - 1024 for v in values if 1024 < v < 1032} == set(range(1, 8))
    tiling = kh.Tiling("k", "seqlen", 128, 8, "file.cu: line")
    assert tiling.boundaries() == kh.boundary_values(128, 8)
    with pytest.raises(ValueError):
        kh.boundary_values(0, 4)


def test_seeded_sample_keeps_what_it_must_and_replays_with_the_seed() -> None:
    items = list(range(100))
    torch.manual_seed(7)
    first = kh.seeded_sample(items, 20, keep=lambda i: i % 25 == 0)
    torch.manual_seed(7)
    assert kh.seeded_sample(items, 20, keep=lambda i: i % 25 == 0) == first  # the report's seed replays it
    assert len(first) == 20 and {0, 25, 50, 75} <= set(first) and first == sorted(first)
    torch.manual_seed(8)
    assert kh.seeded_sample(items, 20, keep=lambda i: i % 25 == 0) != first
    assert kh.seeded_sample(items, 2, keep=lambda i: i % 25 == 0) == [0, 25, 50, 75]  # kept items are never dropped
