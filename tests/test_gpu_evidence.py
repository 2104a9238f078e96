"""evidence/gpu-runs.json: the project's GPU runs as data (builder/farm/gpuevidence.py, evidence/README.md).

The reader takes the file strictly (one error naming the file and field), `builder coverage` prints per package what
it holds and nothing it does not, and every entry whose numbers came from a raw file is derived again from that file
in git history, so a number edited by hand fails here."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path

import pytest

from builder.cli.main import main
from builder.farm import coverage as cov
from builder.farm import gpuevidence as ev
from tests.test_coverage import fake_indexes, make_house

ROOT = Path(__file__).resolve().parent.parent
EVIDENCE = ROOT / "evidence" / "gpu-runs.json"

REPORT = {"package": "causal-conv1d", "version": "1.7.0+cu13", "torch": "2.11.0+cu130", "triton": "3.6.0",
          "gpu": "NVIDIA H100 80GB HBM3", "capability": "9.0", "seed": 1, "quick": False, "status": "passed",
          "reason": "", "counts": {"passed": 627, "failed": 0, "skipped": 0},
          "cases": [{"name": "fn/fp32", "status": "passed"}], "worst": 0.37512345}


def entry(**changes: object) -> dict:
    base = {"id": "t-1", "date": "2026-12-07", "section": 17, "session": 17, "gpu": "NVIDIA H100 80GB HBM3",
            "sm": "sm_90", "package": "causal-conv1d", "version": "1.7.0+cu13", "torch": "2.11.0+cu130",
            "wheel": "causal_conv1d-1.7.0+cu13-cp310-abi3-linux_x86_64.whl", "command": "builder test WHEEL",
            "expect": None, "outcome": {"status": "passed", "passed": 627, "failed": 0, "skipped": 0, "worst": 0.3751},
            "source": "report", "raw": {"commit": "a" * 40, "path": "docs/gpu-results/r.json", "sha256": "0" * 64}}
    base.update(changes)
    return base


def write(path: Path, runs: list[dict]) -> Path:
    path.write_text(ev.dump(runs))
    return path


# --- the reader ---

def test_the_projects_file_reads_and_each_id_is_one_run() -> None:
    runs = ev.load(EVIDENCE)
    assert len(runs) >= 40 and len({r.id for r in runs}) == len(runs)
    by = {r.id: r for r in runs}
    fixed = by["s17-c1-02-fixed"]  # docs/GPU-RESULTS.md section 17's table, run 02
    assert (fixed.outcome.passed, fixed.outcome.failed, fixed.outcome.worst) == (627, 0, 0.375)
    assert fixed.gpu_short == "H100" and fixed.sm == "sm_90" and fixed.met is True
    assert by["s03-planted-silu"].planted and by["s03-planted-silu"].outcome.failed == 23
    assert all(r.source in ev.SOURCES for r in runs)
    assert all(r.raw_path is not None for r in runs if r.source != "prose")
    assert ev.dump([r.to_json() for r in runs]) == EVIDENCE.read_text()  # the writer's own form, untouched


def test_a_good_file_round_trips(tmp_path: Path) -> None:
    (run,) = ev.load(write(tmp_path / "e.json", [entry()]))
    assert run.to_json() == entry()
    assert run.headline() == ("2026-12-07 H100 sm_90 causal-conv1d 1.7.0+cu13: 627 passed, 0 failed, 0 skipped, "
                              "worst 0.375 of tolerance")


@pytest.mark.parametrize(("runs", "message"), [
    ([entry(outcome={"status": "passed", "passed": "627", "failed": 0, "skipped": 0, "worst": None})],
     "runs[0].outcome.passed is a string, not a whole number"),
    ([entry(date="7 Dec")], "runs[0].date is '7 Dec', not a date YYYY-MM-DD"),
    ([entry(), entry(sm=90)], "runs[1].sm is a number, not a string"),
    ([entry(colour="red")], "runs[0]: unknown field 'colour'"),
    ([entry(expect="maybe")], "runs[0].expect is 'maybe', not one of pass, fail"),
    ([entry(raw=None)], "runs[0].raw is null, but a report entry names its raw file"),
    ([entry(raw={"commit": "HEAD", "path": "p", "sha256": "0"})], "runs[0].raw.commit is 'HEAD', not a 40-digit"),
    ([entry(), entry()], "runs[1].id 't-1' appears twice"),
    ([entry(outcome={"status": "passed", "passed": -1, "failed": 0, "skipped": 0, "worst": None})],
     "runs[0].outcome.passed is -1, not a whole number >= 0"),
    ([entry(source="summary")], "runs[0].raw.line is missing, not a string"),
])
def test_a_bad_entry_is_one_error_naming_the_file_and_field(tmp_path: Path, runs: list[dict], message: str) -> None:
    path = write(tmp_path / "e.json", runs)
    with pytest.raises(ev.EvidenceError) as err:
        ev.load(path)
    assert str(err.value).startswith(f"{path}: ") and message in str(err.value)


@pytest.mark.parametrize(("text", "message"), [
    ("{", "not JSON"), ("[]", "holds a list, not a JSON object"), ('{"format": 2, "runs": []}', "'format' is 2, not 1"),
    ('{"format": 1}', "field 'runs' is missing, not a list"),
])
def test_a_bad_file_is_one_error(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "e.json"
    path.write_text(text)
    with pytest.raises(ev.EvidenceError, match=message):
        ev.load(path)


def test_a_missing_file_is_an_error_when_named(tmp_path: Path) -> None:
    with pytest.raises(ev.EvidenceError, match="no such evidence file"):
        ev.load(tmp_path / "none.json")


# --- what coverage prints ---

def coverage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *extra: str) -> int:
    monkeypatch.setattr(cov, "known_indexes", fake_indexes)
    house = make_house(tmp_path)
    monkeypatch.chdir(tmp_path)
    return main(["coverage", "causal-conv1d", "--wheelhouse", str(house.root), "--cache-dir", str(tmp_path / "cache"),
                 "--offline", *extra])


def test_coverage_shows_the_packages_gpu_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    planted = entry(id="t-2", date="2026-11-29", expect="fail", gpu="NVIDIA H200",
                    outcome={"status": "failed", "passed": 184, "failed": 23, "skipped": 0, "worst": None})
    other = entry(id="t-3", package="mamba-ssm", version="2.3.2.post1+cu13")
    path = write(tmp_path / "e.json", [planted, entry(), other])
    assert coverage(tmp_path, monkeypatch, "--evidence", str(path)) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "GPU evidence: 2 runs, 2026-11-29 to 2026-12-07, on H100 sm_90, H200 sm_90; 2 of 1.7.0" in text
    assert ("last: 2026-12-07 H100 sm_90 causal-conv1d 1.7.0+cu13: 627 passed, 0 failed, 0 skipped, worst 0.375 of "
            "tolerance (GPU-RESULTS.md section 17; git show aaaaaaaaaaaa:docs/gpu-results/r.json)") in text
    assert "expected to fail (planted faults, unfixed defects): 1 run, 1 failed as expected" in text
    assert "mamba-ssm" not in text
    assert coverage(tmp_path, monkeypatch, "--evidence", str(path), "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["evidence_file"] == str(path)
    assert [r["id"] for r in data["packages"][0]["gpu_evidence"]] == ["t-2", "t-1"]


def test_coverage_without_evidence_prints_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "e.json", [entry(package="mamba-ssm")])  # nothing of causal-conv1d
    assert coverage(tmp_path, monkeypatch, "--evidence", str(path)) == 0
    assert "GPU evidence" not in capsys.readouterr().out
    monkeypatch.setattr(ev, "default_path", lambda: tmp_path / "absent" / "gpu-runs.json")  # a clone without one
    assert coverage(tmp_path, monkeypatch) == 0
    assert "GPU evidence" not in capsys.readouterr().out
    assert coverage(tmp_path, monkeypatch, "--json") == 0
    data = json.loads(capsys.readouterr().out)
    assert data["evidence_file"] is None and data["packages"][0]["gpu_evidence"] == []


def test_coverage_stops_on_a_bad_or_missing_evidence_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "e.json", [entry(sm="90")])
    assert coverage(tmp_path, monkeypatch, "--evidence", str(path)) != 0
    err = capsys.readouterr().err
    assert f"{path}: runs[0].sm is '90', not sm_NN" in " ".join(err.split()) and "Traceback" not in err
    assert coverage(tmp_path, monkeypatch, "--evidence", str(tmp_path / "none.json")) != 0
    assert "no such evidence file" in capsys.readouterr().err


# --- the numbers come from the raw files ---

def test_a_reports_facts_are_what_it_holds_and_nothing_more() -> None:
    facts = ev.report_facts(json.dumps(REPORT).encode())
    assert facts == {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "sm": "sm_90",
                     "package": "causal-conv1d", "version": "1.7.0+cu13",
                     "outcome": {"status": "passed", "passed": 627, "failed": 0, "skipped": 0, "worst": 0.3751}}
    old = {k: v for k, v in REPORT.items() if k != "worst"}  # reports before issue 39 had no worst
    assert ev.report_facts(json.dumps(old).encode())["outcome"]["worst"] is None
    check = {"check": "transformers", "status": "passed", "gpu": "NVIDIA H200", "torch": "2.11.0+cu130"}
    assert ev.report_facts(json.dumps(check).encode())["outcome"] == {
        "status": "passed", "passed": None, "failed": None, "skipped": None, "worst": None}


def test_a_summary_line_is_read_by_its_report_name() -> None:
    text = ("01-pass.json: passed on NVIDIA H100 80GB HBM3 (seed 5, quick False): 95 passed, 0 failed, 443 skipped; "
            "worst 0.404 of tolerance\n02-fail.json: failed on NVIDIA H100 80GB HBM3 (seed 6, quick False): 71 passed,"
            " 24 failed, 443 skipped; worst 261914.062 of tolerance\n  FAILED base bf16: 1 case(s) at q113/k203\n")
    assert ev.summary_facts(text, "02-fail.json")["outcome"] == {
        "status": "failed", "passed": 71, "failed": 24, "skipped": 443, "worst": 261914.062}
    with pytest.raises(ValueError, match="no summary line for 03"):
        ev.summary_facts(text, "03-pass.json")


def test_a_hand_edited_number_no_longer_matches_its_report(tmp_path: Path) -> None:
    data = json.dumps(REPORT).encode()
    good = entry(raw={"commit": "a" * 40, "path": "r.json", "sha256": ev.sha256(data)})
    (run,) = ev.load(write(tmp_path / "e.json", [good]))
    check = ev.derived(run, data)
    assert check["derived"] == check["entry"]
    edited = copy.deepcopy(good)
    edited["outcome"]["failed"] = 1
    (run,) = ev.load(write(tmp_path / "e.json", [edited]))
    check = ev.derived(run, data)
    assert check["derived"] != check["entry"]


def git_show(commit: str, path: str) -> bytes | None:
    try:
        done = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path}"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def test_every_derived_entry_matches_its_raw_file_in_git_history() -> None:
    runs = [r for r in ev.load(EVIDENCE) if r.source != "prose" or r.raw_path]
    checked, missing = 0, []
    for run in runs:
        assert run.raw_commit and run.raw_path
        data = git_show(run.raw_commit, run.raw_path)
        if data is None:
            missing.append(run.id)
            continue
        assert ev.sha256(data) == run.raw_sha256, f"{run.id}: {run.raw_path} is not the file the entry was made from"
        if run.source != "prose":
            check = ev.derived(run, data)
            assert check["derived"] == check["entry"], f"{run.id}: the entry's numbers differ from {run.raw_path}"
        checked += 1
    if missing and not checked:
        pytest.skip(f"this clone lacks the commits of the raw files ({len(missing)} entries)")
    assert not missing, f"raw files not found in git history: {missing}"


@pytest.mark.heavy  # 45 script runs, 20-60 s: the integration tier
def test_the_file_is_what_its_seed_script_writes(tmp_path: Path) -> None:
    """evidence/seed.sh (one scripts/evidence-add.py call per run) writes the committed file byte for byte: no entry
    was typed or edited by hand."""
    if git_show(ev.load(EVIDENCE)[0].raw_commit or "", "docs/GPU-RESULTS.md") is None:
        pytest.skip("this clone lacks the commit the seed reads from")
    out = tmp_path / "gpu-runs.json"
    done = subprocess.run(["bash", str(ROOT / "evidence" / "seed.sh")], env={**os.environ, "EVIDENCE_FILE": str(out)},
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.read_text() == EVIDENCE.read_text()
