"""Issue 55 item 2: the compile's progress line says how long is left, by the earlier builds of the same recipe and
archs in the wheelhouse's records, scaled from their MAX_JOBS to this build's (no gain past the unit count)."""

from __future__ import annotations

import json
from pathlib import Path

from builder.model.records import BuildRecord, VariantInfo
from builder.stages.compileprogress import CompileProgress, ExpectedTime


def record(seconds: float, *, archs: tuple[str, ...] = ("120",), jobs: int = 2, hits: int = 0,
           package: str = "causal-conv1d", variant: VariantInfo | None = None) -> BuildRecord:
    return BuildRecord(package=package, version="1.7.0", archs=archs, timings={"build": seconds, "test": 13.0},
                       parallel={"max_jobs": jobs, "nvcc_threads": 1, "ptxas_threads": 8},
                       compiler_cache={"hits": hits, "misses": 4 - hits}, variant=variant)


def test_only_cold_builds_of_the_same_recipe_and_archs_count() -> None:
    records = [record(240.0), record(260.0), record(250.0, archs=("90", "120")), record(5.0, hits=4),
               record(90.0, package="mamba-ssm"),
               record(130.0, variant=VariantInfo("sm120", ("90", "120"), {}))]
    expected = ExpectedTime.from_records(records, "causal-conv1d", ["120"], jobs=2)
    assert expected is not None and expected.seconds() == 250.0  # the median of 240 and 260
    assert expected.describe() == ("about 4m10s, by the earlier 2 builds of causal-conv1d for sm_120 in this "
                                   "wheelhouse's records (more while other work shares the cores)")
    assert ExpectedTime.from_records(records, "causal-conv1d", ["100"], jobs=2) is None


def test_more_jobs_help_only_up_to_the_unit_count() -> None:
    expected = ExpectedTime.from_records([record(240.0, jobs=2)], "causal-conv1d", ["120"], jobs=8)
    assert expected is not None
    assert expected.seconds() == 60.0  # 240 s at 2 jobs, spread over 8
    assert expected.seconds(units=4) == 120.0  # 4 units: at most 4 run at once
    assert expected.seconds(units=1) == 240.0
    assert "scaled from MAX_JOBS 2 to 8" in expected.describe(units=4)


def test_record_files_are_read_and_a_broken_one_is_skipped(tmp_path: Path) -> None:
    good = tmp_path / "causal_conv1d-1.7.0+cu13-cp310-abi3-linux_x86_64.whl.json"
    good.write_text(json.dumps(record(300.0).to_json()))
    broken = tmp_path / "causal_conv1d-1.6.2+cu13-cp310-abi3-linux_x86_64.whl.json"
    broken.write_text("{not json")
    other = tmp_path / "mamba_ssm-2.3.2+cu13-cp310-abi3-linux_x86_64.whl.json"
    other.write_text(json.dumps(record(999.0, package="mamba-ssm").to_json()))
    expected = ExpectedTime.of_files([good, broken, other], "causal-conv1d", ["120"], jobs=2)
    assert expected is not None and expected.seconds() == 300.0 and len(expected.past) == 1


def test_the_progress_line_counts_down_without_a_line_per_second() -> None:
    now = [1000.0]
    shown: list[str] = []
    expected = ExpectedTime.from_records([record(280.0)], "causal-conv1d", ["120"], jobs=2)
    progress = CompileProgress(shown.append, processes=None, clock=lambda: now[0], expected=expected)
    progress("[1/4] /usr/local/cuda/bin/nvcc -c causal_conv1d.cu -o causal_conv1d.o")
    assert shown[-1] == "1/4 done (latest nvcc causal_conv1d.cu); about 4m40s left of ~4m40s"
    now[0] += 100
    text, said = progress.line()
    assert text.endswith("about 3m00s left of ~4m40s")
    progress.sample()
    assert len(shown) == 1  # only the time changed: not worth a line of its own
    now[0] += 500
    assert progress.line()[0].endswith("past the ~4m40s earlier builds took")
    plain = CompileProgress(shown.append, processes=None)
    plain("[1/4] /usr/local/cuda/bin/nvcc -c causal_conv1d.cu -o causal_conv1d.o")
    assert shown[-1] == "1/4 done (latest nvcc causal_conv1d.cu)"  # no records: no estimate
