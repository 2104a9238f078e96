"""model/records.py: the typed records read what main wrote and write it back equal as data."""

from __future__ import annotations

import json
import platform
from dataclasses import replace
from pathlib import Path

import pytest
from packaging.version import Version

from builder import __version__
from builder.model.records import BuildRecord, FarmOutcome, RecordShapeError, TestReport, parse_capability
from tests.test_inputs import build_venv, tinyext_plan

# records/<wheel>.json as main (52c90c2) wrote it for a tinyext build (paths shortened; values as written)
MAIN_RECORD = {
    "archs": ["90"], "build_log": "/c/logs/tinyext-0.1.0-0c551d6c5ccb.log", "builder_version": "0.1.0",
    "cache_key": "0c551d6c5ccb60458d25f8cb883426127a1c745dbc3cab78dc1d40a824082b34", "compiler_cache": None,
    "cuda": "13.0", "host": {"machine": "x86_64", "system": "Linux-6.8.0-x86_64-with-glibc2.39"},
    "host_compiler": {"cxx": "/usr/bin/c++: c++ (Ubuntu 13.3.0-6ubuntu2~24.04) 13.3.0"},
    "inspect": {"name": "tinyext", "objects": [{"needed": ["libc10.so"], "path": "tinyext/_C.so", "ptx": [],
                                                "sass": ["sm_90"]}], "record": {"cache_key": "0c55"},
                "requires": ["torch==2.14.1"], "tags": ["cp311-cp311-linux_x86_64"], "version": "0.1.0",
                "wheel": "tinyext.whl"},
    "package": "tinyext", "patches": [{"file": "fix.patch", "sha256": "ab" * 32, "versions": ">=0.1,<1"}],
    "python": {"python": "/c/venvs/build-1/bin/python", "torch": "2.14.1+cu130", "torch_cuda": "13.0",
               "version": "3.11.7"},
    "recipe": {"file": "recipe.toml", "sha256": "f7" * 32},
    "source": {"kind": "path", "location": "/src/tinyext", "sha256": "00" * 32},
    "tests": {"counts": {}, "gpu": None, "import_detail": "imported tinyext", "import_status": "passed",
              "kernel_reason": "--no-kernel-tests", "kernel_status": "skipped", "speed": [], "torch": "2.14.1+cu130"},
    "timings": {"build": 41.2, "plan": 0.3}, "toolchain": {"cuda_home": "/usr/local/cuda", "kind": "host",
                                                             "nvcc": "13.0.88", "reason": "host nvcc"},
    "torch_index": "file:///opt/pypi-more/simple", "version": "0.1.0", "wheel": "tinyext.whl",
    "wheel_sha256": "cd" * 32,
}
AFTER_FINALIZE = ("timings", "tests", "inspect", "wheel", "compiler_cache", "wheel_sha256")


def test_a_record_main_wrote_loads_and_is_written_back_equal() -> None:
    record = BuildRecord.from_json(MAIN_RECORD)
    assert record.tests == TestReport(import_status="passed", import_detail="imported tinyext",
                                      kernel_status="skipped", kernel_reason="--no-kernel-tests", torch="2.14.1+cu130")
    assert record.to_json() == MAIN_RECORD
    assert json.loads(record.file_bytes()) == MAIN_RECORD
    in_wheel = {k: v for k, v in MAIN_RECORD.items() if k not in AFTER_FINALIZE}
    assert json.loads(record.wheel_bytes()) == in_wheel
    # keys this builder does not know (a newer or older builder's) survive a read and a write
    assert BuildRecord.from_json({**MAIN_RECORD, "future": [1]}).to_json() == {**MAIN_RECORD, "future": [1]}


def test_the_pipeline_record_is_the_one_main_wrote_into_the_wheel(tmp_path: Path) -> None:
    """pipeline/run.build_record against the dict main's _build_in built, field for field, for the same inputs."""
    from builder.pipeline.run import build_record
    from builder.toolchain.base import CudaToolkit

    plan = tinyext_plan(tmp_path)
    python = build_venv("3.11.7", "2.14.1+cu130")
    toolkit = CudaToolkit(kind="host", cuda_home=Path("/usr/local/cuda"), version=Version("13.0.88"),
                          reason="host nvcc")
    compiler = {"cxx": "/usr/bin/c++: g++ 13.3.0"}
    log_file = tmp_path / "x.log"
    record = build_record(plan, key="k" * 64, source_digest="0" * 64, toolkit=toolkit, compiler=compiler,
                          python=python, log_file=log_file)
    main = {  # as main's pipeline/run.py _build_in wrote it (52c90c2), with the recipe's content digest (issue 26)
        "builder_version": __version__, "cache_key": "k" * 64, "package": plan.recipe.name, "version": plan.version,
        "recipe": {"file": plan.recipe.file.name, "sha256": plan.recipe.sha256(),
                   "content_sha256": plan.recipe.content_digest()},
        "source": {"kind": plan.source.kind, "location": plan.source.location, "sha256": "0" * 64},
        "patches": [{"file": p.name, "sha256": p.sha256(), "versions": str(p.versions)} for p in plan.patches],
        "cuda": str(plan.cuda), "archs": [str(a) for a in plan.target.archs], "toolchain": toolkit.record(),
        "host_compiler": compiler, "python": python.record(), "torch_index": plan.index.url,
        "host": {"machine": platform.machine(), "system": platform.platform()}, "build_log": str(log_file),
    }
    assert record.in_wheel().to_json() == main
    pure = build_record(plan, key="k" * 64, source_digest="0" * 64, toolkit=None, compiler=None, python=python,
                        log_file=log_file).to_json()
    assert pure["archs"] == [] and pure["toolchain"] == {"kind": "none (pure Python)"} and pure["host_compiler"] is None
    assert "runtime_dropped" not in pure  # absent unless the recipe drops requirements, as before


def test_farm_outcome_json_is_the_summary_entry_main_wrote() -> None:
    failed = FarmOutcome(id="t", status="failed", error="boom", exit_code=3).took(1.5).with_log("/l/t.log")
    assert failed.to_json() == {"id": "t", "status": "failed", "wheel": None, "timings": {}, "error": "boom",
                                "exit_code": 3, "seconds": 1.5, "log": "/l/t.log"}
    assert "exit_code" not in FarmOutcome(id="t", status="built", wheel="w.whl").to_json()


def test_a_partial_record_is_written_back_with_its_own_keys() -> None:
    """Records of older builders (or hand-made ones) keep their keys: no defaults are added on a rewrite."""
    old = {"cache_key": "k", "package": "demo", "tests": {"kernel_status": "passed"}}
    record = BuildRecord.from_json(old)
    assert record.to_json() == old and record.tests is not None and record.tests.import_status == "not run"
    assert record.with_(wheel_sha256="ab").to_json() == {**old, "wheel_sha256": "ab"}
    assert BuildRecord.from_json({}).to_json() == {} and BuildRecord.from_json({}) == BuildRecord()


def test_two_gpu_archs_keep_a_report_each_and_an_old_single_report_record_still_reads() -> None:
    """Issue 39: the nightly's sm_90 and sm_120 test jobs of one wheel overwrote each other's report."""
    old = BuildRecord.from_json({**MAIN_RECORD, "tests": {**MAIN_RECORD["tests"], "kernel_status": "passed",
                                                          "kernel_reason": "", "gpu": "NVIDIA H200",
                                                          "capability": "9.0"}})
    assert [str(r.capability) for r in old.gpu_reports] == ["90"]  # the old shape: its one report
    assert BuildRecord.from_json(MAIN_RECORD).gpu_reports == ()  # no GPU ran: none
    rtx = TestReport(import_status="passed", kernel_status="passed", gpu="NVIDIA RTX 5090",
                     capability=parse_capability("12.0"))
    both = old.with_tests(rtx)
    assert both.tests == rtx and [r.gpu for r in both.gpu_reports] == ["NVIDIA H200", "NVIDIA RTX 5090"]
    again = both.with_tests(replace(rtx, kernel_status="failed"))  # the same arch's next run replaces its own
    assert [(r.gpu, r.kernel_status) for r in again.gpu_reports] == [("NVIDIA H200", "passed"),
                                                                     ("NVIDIA RTX 5090", "failed")]
    written = json.loads(again.file_bytes())
    assert [r["capability"] for r in written["gpu_tests"]] == ["9.0", "12.0"]
    assert written["tests"]["capability"] == "12.0"  # the latest, for readers of the single report
    assert BuildRecord.from_json(written) == again
    assert old.with_tests(TestReport(import_status="passed")).gpu_tests is None  # a CPU-only run adds no GPU report
    with pytest.raises(RecordShapeError, match=r"gpu_tests\[0\].counts"):
        BuildRecord.from_json({**MAIN_RECORD, "gpu_tests": [{"counts": [1]}]})
