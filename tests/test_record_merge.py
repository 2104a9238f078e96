"""Issue 51 item 4: per-arch evidence kept. One rule merges two machines' records of one wheel
(model/recordmerge.py): a test report per (GPU arch, GPU model, torch), a torch check per (torch, CUDA line, how,
GPU), a later one of the same key winning; records of two different wheels are refused. `builder index merge`
(index/merge.py) applies it to whole folders, as the nightly's publish job does with each GPU job's promoted folder,
and the dashboard and coverage read what it merged."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from builder.index.store import Wheelhouse
from builder.model.recordmerge import GPU_KERNEL_TESTS, RecordMergeError, check_key, merge_checks, merge_records
from builder.model.records import BuildRecord, TestReport, TorchCheck, parse_capability
from tests.helpers import assert_one_line_error, run_cli
from tests.test_index import raw_wheel

WHEEL = "demo_kernels-1.0-py3-none-any.whl"


def report(gpu: str, capability: str, torch: str = "2.14.1+cu130", status: str = "passed") -> TestReport:
    return TestReport(import_status="passed", kernel_status=status, counts={"passed": 12}, gpu=gpu, torch=torch,
                      capability=parse_capability(capability))


def gpu_check(gpu: str, torch: str = "2.14.1", detail: str = "12 passed") -> TorchCheck:
    return TorchCheck(torch=torch, cuda="13.0", python="3.12.3", how=GPU_KERNEL_TESTS, status="passed",
                      detail=f"{detail} on {gpu}")


def runner_record(gpu: str, capability: str, torch: str = "2.14.1+cu130", sha: str | None = "ab" * 32,
                  wheel: str | None = WHEEL) -> BuildRecord:
    """What one GPU test job writes: the staged record with its own report and GPU check."""
    staged = BuildRecord(package="demo-kernels", version="1.0", cuda="13.0", archs=("90", "120"), wheel=wheel,
                         wheel_sha256=sha)
    tested = staged.with_tests(report(gpu, capability, torch))
    return tested.with_(torch_checks=(gpu_check(gpu, torch.split("+")[0]),))


def reports_of(record: BuildRecord) -> list[tuple[str, str | None, str | None]]:
    return [(r.capability.sm if r.capability else "-", r.gpu, r.torch) for r in record.gpu_reports]


# ---------------------------------------------------------------- the rule


def test_two_runners_records_merged_keep_every_report() -> None:
    """sm_90 on an H100 and sm_120 on an RTX 5090; an H200 of the same arch as the H100; the H100 again with
    another torch: four keys, four reports, in arch, GPU, torch order, and a GPU check from each GPU."""
    h100 = runner_record("NVIDIA H100 80GB HBM3", "9.0")
    rtx = runner_record("NVIDIA GeForce RTX 5090", "12.0")
    h200 = runner_record("NVIDIA H200", "9.0")
    newer = runner_record("NVIDIA H100 80GB HBM3", "9.0", torch="2.15.0+cu130")
    merged = merge_records(merge_records(merge_records(h100, rtx), h200), newer)
    assert reports_of(merged) == [("sm_90", "NVIDIA H100 80GB HBM3", "2.14.1+cu130"),
                                  ("sm_90", "NVIDIA H100 80GB HBM3", "2.15.0+cu130"),
                                  ("sm_90", "NVIDIA H200", "2.14.1+cu130"),
                                  ("sm_120", "NVIDIA GeForce RTX 5090", "2.14.1+cu130")]
    assert [(c.torch, c.detail) for c in merged.torch_checks or ()] == [
        ("2.14.1", "12 passed on NVIDIA H100 80GB HBM3"), ("2.14.1", "12 passed on NVIDIA GeForce RTX 5090"),
        ("2.14.1", "12 passed on NVIDIA H200"), ("2.15.0", "12 passed on NVIDIA H100 80GB HBM3")]
    assert merged.tests == newer.tests  # the latest report stays the later record's
    again = BuildRecord.from_json(json.loads(merged.file_bytes()))
    assert again == merged and [r["capability"] for r in json.loads(merged.file_bytes())["gpu_tests"]] == [
        "9.0", "9.0", "9.0", "12.0"]


def test_the_same_key_later_wins_and_merging_is_idempotent() -> None:
    first = runner_record("NVIDIA H100", "9.0")
    rerun = first.with_tests(replace(report("NVIDIA H100", "9.0"), kernel_status="failed", counts={"failed": 1}))
    rerun = rerun.with_(torch_checks=(replace(gpu_check("NVIDIA H100"), status="failed", detail="1 failed on "
                                              "NVIDIA H100"),))
    merged = merge_records(first, rerun)
    assert [(r.gpu, r.kernel_status) for r in merged.gpu_reports] == [("NVIDIA H100", "failed")]
    assert [(c.status, c.detail) for c in merged.torch_checks or ()] == [("failed", "1 failed on NVIDIA H100")]
    assert merge_records(merged, merged) == merged
    back = merge_records(rerun, first)  # the order given is the order of time: the later one wins
    assert [r.kernel_status for r in back.gpu_reports] == ["passed"]


def test_torch_checks_key_on_torch_line_how_and_gpu_only_for_gpu_checks() -> None:
    imported = TorchCheck(torch="2.14.1", cuda="13.0", python="3.12", how="import+registration", status="failed",
                          detail="import failed on a machine")  # " on " in an import check names no GPU
    again = replace(imported, status="passed", cuda="13.0.2", detail="")  # CUDA 13.0.2 is the 13.0 line
    assert check_key(imported) == check_key(again)
    assert merge_checks((imported, gpu_check("NVIDIA H100")), (again,)) == (gpu_check("NVIDIA H100"), again)
    assert check_key(gpu_check("NVIDIA H100")) != check_key(gpu_check("NVIDIA H200"))
    assert check_key(gpu_check("NVIDIA H100", detail="3 passed")) == check_key(gpu_check("NVIDIA H100"))


def test_a_torch_not_checked_stays_until_a_merged_check_covers_it() -> None:
    waiting = TorchCheck(torch="2.15.0", cuda="13.0", python="3.12", how="import+registration", status="not checked")
    other = replace(waiting, torch="2.13.0")
    offline = runner_record("NVIDIA H100", "9.0").with_(torch_unchecked=(waiting, other))
    online = runner_record("NVIDIA GeForce RTX 5090", "12.0").with_(torch_checks=(
        replace(waiting, status="passed"), gpu_check("NVIDIA GeForce RTX 5090")))
    merged = merge_records(offline, online)
    assert [c.torch for c in merged.torch_unchecked or ()] == ["2.13.0"]
    assert merge_records(online, online).torch_unchecked is None


def test_records_of_two_different_wheels_are_refused() -> None:
    a = runner_record("NVIDIA H100", "9.0", sha="aa" * 32)
    b = runner_record("NVIDIA GeForce RTX 5090", "12.0", sha="bb" * 32)
    with pytest.raises(RecordMergeError, match=r"refusing to merge the records one.json and two.json: they are of "
                                               r"two different wheels \(wheel_sha256 a+ and b+\)"):
        merge_records(a, b, earlier_name="one.json", later_name="two.json")
    renamed = runner_record("NVIDIA H100", "9.0", wheel="demo_kernels-1.0-1-py3-none-any.whl")
    with pytest.raises(RecordMergeError, match="wheel demo_kernels-1.0-py3-none-any.whl and demo_kernels-1.0-1-"):
        merge_records(a, renamed)
    assert merge_records(a, a.with_(wheel_sha256=None)).wheel_sha256 == "aa" * 32  # one naming none: same wheel


def test_with_tests_and_the_gpu_check_follow_the_same_rule() -> None:
    """`builder test` adds its report (``with_tests``) and its GPU check (``checks.with_gpu_check``) by the merge
    rule: an H200 after an H100 of the same arch is a second report, not a replacement."""
    from builder.pipeline import checks
    from builder.stages.pyenv import PythonEnv
    from builder.stages.torchrange import GPU_KERNEL_TESTS as STAGE_NAME

    assert STAGE_NAME == GPU_KERNEL_TESTS
    record = runner_record("NVIDIA H100", "9.0").with_tests(report("NVIDIA H200", "9.0"))
    assert reports_of(record) == [("sm_90", "NVIDIA H100", "2.14.1+cu130"), ("sm_90", "NVIDIA H200", "2.14.1+cu130")]
    rerun = record.with_tests(report("NVIDIA H200", "9.0", status="failed"))
    assert [r.kernel_status for r in rerun.gpu_reports] == ["passed", "failed"]
    env = PythonEnv(python=Path("/usr/bin/python3"), version="3.12.3", torch="2.14.1+cu130", torch_cuda="13.0",
                    purelib=Path("/nowhere"), managed=False)
    added = checks.with_gpu_check(record, env, report("NVIDIA H200", "9.0"))
    assert [c.detail for c in added] == ["12 passed on NVIDIA H100", "12 passed on NVIDIA H200"]
    assert checks.with_gpu_check(record.with_(torch_checks=added), env, report("NVIDIA H200", "9.0")) == added


# ---------------------------------------------------------------- `builder index merge` on real folders


def promoted(root: Path, wheel: Path, record: BuildRecord | None) -> Path:
    """A GPU test job's promoted folder: wheels/ and records/, as the nightly's artifact holds them."""
    (root / "wheels").mkdir(parents=True)
    shutil.copy2(wheel, root / "wheels" / wheel.name)
    if record is not None:
        (root / "records").mkdir()
        (root / "records" / f"{wheel.name}.json").write_bytes(record.file_bytes())
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink() and p.name != ".publish.lock"}


@pytest.fixture
def two_runners(tmp_path: Path) -> tuple[Path, Path, Path, str]:
    """One small real wheel promoted by an sm_90 (H100) job and an sm_120 (RTX 5090) job, each folder with its
    own record; the wheel's sha256."""
    wheel = raw_wheel(tmp_path / "built", "demo-kernels", "1.0")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    sm90 = promoted(tmp_path / "promoted-sm90", wheel, runner_record("NVIDIA H100 80GB HBM3", "9.0", sha=sha))
    sm120 = promoted(tmp_path / "promoted-sm120", wheel, runner_record("NVIDIA GeForce RTX 5090", "12.0", sha=sha))
    return wheel, sm90, sm120, sha


def test_builder_index_merge_keeps_both_runners_reports_and_lists_the_wheel(
        tmp_path: Path, two_runners: tuple[Path, Path, Path, str]) -> None:
    wheel, sm90, sm120, sha = two_runners
    house = tmp_path / "wheelhouse"
    result = run_cli("index", "merge", str(sm90), str(sm120), "--wheelhouse", str(house))
    assert result.code == 0, result.stderr[-2000:]
    print(result.stdout)
    assert f"merged 2 folders into {house}: 1 wheel added, 0 already there (same bytes), 1 record written" \
        in result.stdout
    assert "sm_90 NVIDIA H100 80GB HBM3, torch 2.14.1+cu130: import passed; kernel tests passed" in result.stdout
    assert "sm_120 NVIDIA GeForce RTX 5090, torch 2.14.1+cu130" in result.stdout
    merged = Wheelhouse(house).record_of(wheel.name)
    assert merged is not None and merged.wheel_sha256 == sha
    assert reports_of(merged) == [("sm_90", "NVIDIA H100 80GB HBM3", "2.14.1+cu130"),
                                  ("sm_120", "NVIDIA GeForce RTX 5090", "2.14.1+cu130")]
    assert len(merged.torch_checks or ()) == 2
    assert (house / "wheels" / wheel.name).read_bytes() == wheel.read_bytes()
    assert wheel.name in (house / "simple" / "demo-kernels" / "index.html").read_text()  # pages in the same commit
    assert (house / "wheels" / f"{wheel.name}.metadata").is_file()

    # a later night: the published wheelhouse holds that record; an H200 job of the same wheel adds its report
    h200 = promoted(tmp_path / "promoted-h200", wheel, runner_record("NVIDIA H200", "9.0", sha=sha))
    again = run_cli("index", "merge", str(h200), "--wheelhouse", str(house))
    assert again.code == 0, again.stderr[-2000:]
    assert "0 wheels added, 1 already there (same bytes), 1 record written" in again.stdout
    final = Wheelhouse(house).record_of(wheel.name)
    assert final is not None and [r.gpu for r in final.gpu_reports] == [
        "NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA GeForce RTX 5090"]


def test_the_dashboard_and_coverage_read_the_merged_reports(tmp_path: Path,
                                                            two_runners: tuple[Path, Path, Path, str]) -> None:
    from builder.farm.wheelcells import tested_arch_name
    from builder.index.dashrows import WheelFacts, rows_from

    wheel, sm90, sm120, _ = two_runners
    house = Wheelhouse(tmp_path / "wheelhouse")
    house.merge_from([Wheelhouse(sm90), Wheelhouse(sm120)])
    record = house.record_of(wheel.name)
    (row,) = rows_from([WheelFacts(wheel.name, wheel.stat().st_size, record, False)], area="published")
    assert row.tested_arch == "sm_90,sm_120"
    assert "kernel evidence: sm_90,sm_120" in house.dashboard.read_text()  # the page the merge's commit rendered
    assert tested_arch_name(record) == "sm_90,sm_120"  # coverage (farm/wheelcells.py) counts both archs


def test_other_bytes_under_one_file_name_are_refused_and_nothing_changes(
        tmp_path: Path, two_runners: tuple[Path, Path, Path, str]) -> None:
    wheel, sm90, sm120, _ = two_runners
    house = tmp_path / "wheelhouse"
    assert run_cli("index", "merge", str(sm90), "--wheelhouse", str(house)).code == 0
    before = snapshot(house)
    rebuilt = raw_wheel(tmp_path / "rebuilt", "demo-kernels", "1.0", requires=("numpy",))  # same name, other bytes
    assert rebuilt.name == wheel.name
    shutil.copy2(rebuilt, sm120 / "wheels" / wheel.name)
    result = run_cli("index", "merge", str(sm120), "--wheelhouse", str(house))
    assert result.code == 11
    assert_one_line_error(result, f"refusing to merge {sm120 / 'wheels' / wheel.name}:",
                          f"{house / 'wheels' / wheel.name} has other bytes under the same file name",
                          "nothing was changed", "needs a new build tag")
    assert snapshot(house) == before
    fresh = tmp_path / "fresh"  # two sources disagreeing: refused before the wheelhouse is created
    result = run_cli("index", "merge", str(sm90), str(sm120), "--wheelhouse", str(fresh))
    assert result.code == 11 and f"{sm90 / 'wheels' / wheel.name} has other bytes" in result.stderr
    assert not (fresh / "wheels").exists()


def test_a_record_of_another_wheel_is_refused_and_nothing_changes(
        tmp_path: Path, two_runners: tuple[Path, Path, Path, str]) -> None:
    wheel, sm90, sm120, _ = two_runners
    house = tmp_path / "wheelhouse"
    assert run_cli("index", "merge", str(sm90), "--wheelhouse", str(house)).code == 0
    before = snapshot(house)
    stray = sm120 / "records" / f"{wheel.name}.json"
    stray.write_bytes(runner_record("NVIDIA GeForce RTX 5090", "12.0", sha="cd" * 32).file_bytes())
    result = run_cli("index", "merge", str(sm120), "--wheelhouse", str(house))
    assert result.code == 11
    assert_one_line_error(result, f"{stray}: the record of a wheel with sha256 {'cd' * 32}, not of {wheel.name}")
    assert snapshot(house) == before
    missing = run_cli("index", "merge", str(tmp_path / "nowhere"), "--wheelhouse", str(house))
    assert missing.code == 2
    assert_one_line_error(missing, f"{tmp_path / 'nowhere'}: no such folder")
