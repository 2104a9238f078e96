"""`builder coverage`: the users' matrix per package and the evidence the wheelhouse holds for each cell (no network:
a fake torch listing, a wheelhouse of fake wheels and records, a farm view given directly)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.cli.main import main
from builder.core.settings import Settings
from builder.discovery.compat import TorchIndex
from builder.discovery.torchfacts import Listing, PlatformFacts, Release
from builder.farm import coverage as cov
from builder.farm.cellstext import compact_pythons
from builder.farm.coverage import (
    NOT_BUILT,
    NOT_IN_FARM,
    FarmView,
    matrix_facts,
    newest_known,
    package_coverage,
    users_matrix,
)
from builder.farm.served import Cell
from builder.index.store import Wheelhouse
from builder.model.recipe import find_recipe, load_recipe
from builder.model.records import BuildRecord, TestReport, parse_capability
from tests.test_index import labelled_wheel
from tests.test_index_stable_abi import check, per_torch_record, stable_record, stable_wheel

PYTHONS = ("3.10", "3.11", "3.12", "3.13", "3.13t")


def fake_indexes(settings: Settings | None = None) -> list[TorchIndex]:
    """PyPI-like (2.10 on 12.8, 2.11–2.14 on 13.0, 2.15 on 13.2, an old 12.6 line; each platform's facts read, and
    like PyPI's, 2.10's aarch64 wheels are CPU builds) and a channel from release notes (no Pythons, no platform
    facts: its aarch64 cells are unknown)."""
    def rel(v: str, c: str, p: tuple[str, ...] = PYTHONS) -> Release:
        if not p:  # a release-notes row
            return Release(version=v, cuda=c, pythons=p, evidence="test", read_at="")
        arm = "cpu" if v == "2.10.0" else c
        return Release(version=v, cuda=c, pythons=p, evidence="test", read_at="",
                       platforms=(PlatformFacts("x86_64", c, p, "test"), PlatformFacts("aarch64", arm, p, "test")))

    pypi = Listing(name="pypi", url="https://pypi.org/simple", source="index", read_at="2026-12-02T00:00:00Z",
                   releases=(rel("2.7.1", "12.6"), rel("2.10.0", "12.8"), rel("2.11.0", "13.0"), rel("2.12.1", "13.0"),
                             rel("2.15.0", "13.2", ("3.11", "3.12"))))
    cu128 = Listing(name="pytorch-cu128", url="https://download.pytorch.org/whl/cu128", source="snapshot",
                    read_at="", releases=(rel("2.11.0", "12.8", ()), rel("2.10.0", "12.8", ())))
    return [TorchIndex("pypi", pypi.url, pypi), TorchIndex("pytorch-cu128", cu128.url, cu128)]


def causal_conv1d():
    settings = Settings.from_env({})
    return load_recipe(find_recipe("causal-conv1d", settings.recipes_dir))


def test_the_matrix_is_cuda_12_8_and_up_without_free_threaded_pythons() -> None:
    matrix, notes = users_matrix(fake_indexes())
    assert Cell("2.7", "12.6", "3.12") not in matrix  # below 12.8
    assert Cell("2.11", "13.0", "3.13") in matrix and not any(c.python.endswith("t") for c in matrix)
    assert Cell("2.11", "12.8", "3.12") in matrix  # the channel's release takes PyPI's Pythons of 2.11.0
    assert {c.python for c in matrix if c.torch == "2.15"} == {"3.11", "3.12"}
    # both platforms, each as its own wheels say: PyPI's 2.10 aarch64 wheels are CPU builds (no cell), the
    # channel's aarch64 wheels were not read (unknown, noted, not counted)
    assert {c.platform for c in matrix} == {"x86_64", "aarch64"} and Cell("2.11", "13.0", "3.13", "aarch64") in matrix
    assert not any(c.platform == "aarch64" and c.cuda == "12.8" for c in matrix)
    assert len(matrix) == (4 * 4 + 2) + (2 * 4 + 2)
    assert notes == ["pytorch-cu128 aarch64: the CUDA of torch 2.10.0, 2.11.0 was not read from its wheels "
                     "(unknown, not counted)"]
    assert len(matrix_facts(fake_indexes()).unknown) == 2 * 4
    assert len(users_matrix(fake_indexes(), platforms=["x86_64"])[0]) == 4 * 4 + 2
    assert compact_pythons(["3.10", "3.11", "3.12", "3.14"]) == "3.10–3.12, 3.14"


def test_the_recipes_newest_known_version_without_pypi() -> None:
    assert newest_known(causal_conv1d()) == "1.7.0"


def make_house(root: Path) -> Wheelhouse:
    house = Wheelhouse(root / "wh")
    checks = [check("2.11.0", how="gpu-kernel-tests"), check("2.12.1", status="failed"),
              check("2.15.0", cuda="13.2")]
    house.publish(stable_wheel(root / "work"), stable_record(checks))
    wheel = labelled_wheel(root / "work", "causal-conv1d", "1.7.0", "cu128torch2.10", pins=("torch==2.10.0",),
                           tag="cp312-cp312-linux_x86_64")
    record = per_torch_record("cu128torch2.10", "2.10.0+cu128").with_(cuda="12.8")
    house.publish(wheel, record)
    return house


def test_each_cell_gets_its_best_evidence_or_the_reason_it_is_missing(tmp_path: Path) -> None:
    house = make_house(tmp_path)
    matrix, _ = users_matrix(fake_indexes())
    farm = FarmView(frozenset({Cell("2.10", "12.8", "3.12"), Cell("2.11", "12.8", "3.12")}))
    report = package_coverage(causal_conv1d(), house, matrix, lambda version: farm)
    assert (report.version, report.version_from) == ("1.7.0", "wheelhouse")
    by = {c.cell: c for c in report.cells}
    kernel = by[Cell("2.11", "13.0", "3.12")]  # the checks ran on Python 3.12.1
    assert kernel.status == "kernel-tested" and "NVIDIA H200" in kernel.evidence and "sm_90" in kernel.evidence
    # the same abi3 file on another Python: inferred, shown apart, not served (issue 51)
    inferred = by[Cell("2.11", "13.0", "3.10")]
    assert inferred.status == "inferred" and not inferred.served
    assert inferred.evidence.startswith("inferred (same file; kernel-tested on Python 3.12 x86_64): kernel-tested")
    assert by[Cell("2.12", "13.0", "3.13")].status == "built"  # a failed check keeps it unverified
    assert by[Cell("2.15", "13.2", "3.12")].status == "import-verified"
    assert by[Cell("2.15", "13.2", "3.11")].status == "inferred"
    assert by[Cell("2.10", "12.8", "3.12")].status == "import-verified"  # the per-torch wheel, its own Python
    assert by[Cell("2.10", "12.8", "3.11")].reason == NOT_IN_FARM  # at the ports' floor (2.10): not a farm cell
    assert by[Cell("2.11", "12.8", "3.12")].reason == NOT_BUILT  # a farm target, nothing built
    assert by[Cell("2.11", "12.8", "3.11")].reason == NOT_IN_FARM  # at the floor, but CUDA 12: not a farm cell
    # the wheels are x86_64: the aarch64 cells are missing, and not in this farm view
    assert by[Cell("2.11", "13.0", "3.10", "aarch64")].reason == NOT_IN_FARM
    totals = report.totals()
    assert totals["cells"] == len(matrix) == 28
    assert totals["served"] == totals["kernel_tested"] + totals["import_verified"] == 1 + 1 + 1
    assert totals["inferred"] == 3 + 1 and totals["built_unverified"] == 4
    assert totals["missing"] == 28 - 3 - 4 - 4 == sum(totals["missing_by_reason"].values())
    assert totals["by_platform"] == {"x86_64": {"cells": 18, "served": 3}, "aarch64": {"cells": 10, "served": 0}}


def test_an_empty_wheelhouse_takes_the_recipes_version_and_misses_everything(tmp_path: Path) -> None:
    matrix, _ = users_matrix(fake_indexes())
    report = package_coverage(causal_conv1d(), Wheelhouse(tmp_path / "none"), matrix,
                              lambda version: FarmView(frozenset(), note="not in the farm"))
    assert (report.version, report.version_from) == ("1.7.0", "recipe")
    assert report.totals()["served"] == 0 and report.totals()["missing"] == len(matrix)
    assert report.notes == ("not in the farm",)


def test_the_command_json_and_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(cov, "known_indexes", fake_indexes)
    house = make_house(tmp_path)
    monkeypatch.chdir(tmp_path)  # no farm.toml here: every missing cell is "not in farm.toml", with a note
    assert main(["coverage", "causal-conv1d", "--wheelhouse", str(house.root),
                 "--cache-dir", str(tmp_path / "cache"), "--offline", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (package,) = data["packages"]
    assert package["package"] == "causal-conv1d" and package["totals"]["served"] == 3
    assert data["platforms"] == ["x86_64", "aarch64"] and data["matrix_cells"] == 28 and data["unknown_cells"] == 8
    assert {c["platform"] for c in package["cells"]} == {"x86_64", "aarch64"}
    assert main(["coverage", "causal-conv1d", "--wheelhouse", str(house.root),
                 "--cache-dir", str(tmp_path / "cache"), "--offline"]) == 0
    text = capsys.readouterr().out
    assert "3 served with evidence" in text and "served per platform: x86_64 3/18; aarch64 0/10" in text
    assert "4 inferred (the same file checked on another Python or platform: not counted as served)" in text
    assert "not served: no aarch64 platform axis" not in text


def test_a_record_without_tests_is_built_not_verified(tmp_path: Path) -> None:
    house = Wheelhouse(tmp_path / "wh")
    wheel = labelled_wheel(tmp_path / "work", "causal-conv1d", "1.7.0", "cu130torch2.11", pins=("torch==2.11.0",),
                           tag="cp311-cp311-linux_x86_64")
    house.publish(wheel, BuildRecord.from_json({"package": "causal-conv1d", "version": "1.7.0", "cuda": "13.0"}))
    matrix, _ = users_matrix(fake_indexes())
    report = package_coverage(causal_conv1d(), house, matrix, lambda version: FarmView(frozenset()))
    built = [c for c in report.cells if c.status == "built"]
    assert [c.cell for c in built] == [Cell("2.11", "13.0", "3.11")]


def test_a_wheel_serves_the_cells_of_its_platform_tag(tmp_path: Path) -> None:
    """An aarch64 wheel serves aarch64 cells only; a py3-none-any wheel serves both platforms."""
    house = Wheelhouse(tmp_path / "wh")
    record = per_torch_record("cu130torch2.11", "2.11.0+cu130").with_(cuda="13.0")
    arm = labelled_wheel(tmp_path / "work", "causal-conv1d", "1.7.0", "cu130torch2.11", pins=("torch==2.11.0",),
                         tag="cp311-cp311-manylinux_2_28_aarch64")
    house.publish(arm, record)
    matrix, _ = users_matrix(fake_indexes())
    report = package_coverage(causal_conv1d(), house, matrix, lambda version: FarmView(frozenset()))
    served = {c.cell for c in report.cells if c.status != "missing"}
    assert served == {Cell("2.11", "13.0", "3.11", "aarch64")}
    assert report.totals()["by_platform"]["aarch64"]["served"] == len([c for c in report.cells if c.served]) == 1
    assert cov.wheel_platforms("x-1.0-py3-none-any.whl") is None
    assert cov.wheel_platforms("x-1.0-cp312-cp312-win_amd64.whl") == set()
    assert cov.wheel_platforms("x-1.0-cp312-cp312-manylinux_2_28_x86_64.whl") == {"x86_64"}


def _kernel_tested_house(root: Path, tests: dict) -> Wheelhouse:
    house = Wheelhouse(root / "wh")
    wheel = labelled_wheel(root / "work", "causal-conv1d", "1.7.0", "cu130torch2.11", pins=("torch==2.11.0",),
                           tag="cp311-cp311-linux_x86_64")
    house.publish(wheel, BuildRecord.from_json({"package": "causal-conv1d", "version": "1.7.0", "cuda": "13.0",
                                                "archs": ["90", "120"], "tests": {"import_status": "passed",
                                                                                  "kernel_status": "passed", **tests}}))
    return house


@pytest.mark.parametrize(("tests", "evidenced"), [
    # the record's capability decides: 9.0 is sm_90 evidence, never the wheel's sm_120
    ({"gpu": "NVIDIA H100 80GB HBM3", "capability": "9.0"}, {"sm_90": 1, "sm_120": 0}),
    ({"gpu": "NVIDIA GeForce RTX 5090", "capability": "12.0"}, {"sm_90": 0, "sm_120": 1}),
    # a record from before the capability: the GPU's name where it maps to one arch, else "unknown arch"
    ({"gpu": "NVIDIA H200"}, {"sm_90": 1, "sm_120": 0}),
    ({"gpu": "NVIDIA RTX PRO 6000 Blackwell Server Edition"}, {"sm_90": 0, "sm_120": 1}),
    ({"gpu": "NVIDIA Some Future GPU"}, {"sm_90": 0, "sm_120": 0, "unknown arch": 1}),
])
def test_gpu_evidence_counts_the_arch_the_kernel_tests_ran_on(tmp_path: Path, tests: dict,
                                                               evidenced: dict) -> None:
    house = _kernel_tested_house(tmp_path, tests)
    matrix, _ = users_matrix(fake_indexes())
    report = package_coverage(causal_conv1d(), house, matrix, lambda version: FarmView(frozenset()))
    (cell,) = [c for c in report.cells if c.status == "kernel-tested"]
    assert report.totals()["gpu_evidenced"] == evidenced
    if "capability" in tests and tests["capability"] == "9.0":
        assert cell.tested_arch == "sm_90" and cell.evidence == (
            "kernel-tested on sm_90 (GPU NVIDIA H100 80GB HBM3); sm_120 kernel-untested")


def test_gpu_evidence_counts_each_arch_whose_test_job_reported(tmp_path: Path) -> None:
    """Issue 39: the nightly's sm_90 and sm_120 jobs test one wheel; the record keeps a report per arch and
    coverage counts both, not only the job that wrote last."""
    house = _kernel_tested_house(tmp_path, {"gpu": "NVIDIA H100 80GB HBM3", "capability": "9.0"})
    (wheel,) = house.wheel_files()
    record = house.record_of(wheel.name)
    assert record is not None
    rtx = TestReport(import_status="passed", kernel_status="passed", gpu="NVIDIA GeForce RTX 5090",
                     capability=parse_capability("12.0"))
    house.write_record(wheel.name, record.with_tests(rtx))
    matrix, _ = users_matrix(fake_indexes())
    report = package_coverage(causal_conv1d(), house, matrix, lambda version: FarmView(frozenset()))
    (cell,) = [c for c in report.cells if c.status == "kernel-tested"]
    assert report.totals()["gpu_evidenced"] == {"sm_90": 1, "sm_120": 1}
    assert cell.tested_arch == "sm_90,sm_120"
    assert cell.evidence == "kernel-tested on sm_90,sm_120 (GPU NVIDIA H100 80GB HBM3, NVIDIA GeForce RTX 5090)"
