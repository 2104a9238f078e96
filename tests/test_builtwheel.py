"""BuiltWheel (model/builtwheel.py) and the check chain's first and last stages (pipeline/checks.py read_wheel,
publish): a wheel's facts read once from its file name and record, typed; the wheelhouse's record preferred to the
one inside the wheel."""

from __future__ import annotations

from pathlib import Path

from packaging.version import Version

from builder.index.store import Wheelhouse
from builder.model.abi import Abi
from builder.model.arch import parse_arch_list
from builder.model.builtwheel import BuiltWheel
from builder.model.cuda import CudaVersion
from builder.model.platform import parse_platform
from builder.model.records import BuildRecord, TestReport
from builder.pipeline import checks
from builder.stages.inspection import inspect_wheel
from tests.test_index import labelled_wheel, raw_wheel

STABLE = BuildRecord(package="x", version="1.0", cuda="13.0", archs=("90", "120+ptx"), abi="torch-stable",
                     torch_floor="2.11", platform="aarch64", python={"torch": "2.14.1+cu130", "version": "3.12.1"})


def test_a_wheel_is_typed_once_from_its_name_and_record() -> None:
    wheel = BuiltWheel.made(Path("x-1.0+cu13-cp310-abi3-manylinux_2_28_aarch64-sm120.whl"), STABLE)
    assert (wheel.name, wheel.version, wheel.label, wheel.variant) == ("x", Version("1.0+cu13"), "cu13", "sm120")
    assert wheel.cuda == CudaVersion.parse("13.0") and wheel.archs == parse_arch_list("90,120+ptx")
    assert wheel.abi is Abi.TORCH_STABLE and wheel.stable and wheel.ranged and not wheel.built_once
    assert (wheel.torch, wheel.torch_floor) == (Version("2.14.1+cu130"), Version("2.11"))
    assert wheel.platform == parse_platform("aarch64") and wheel.build_python == "3.12"
    assert {t.abi for t in wheel.tags} == {"abi3"}


def test_a_wheel_without_a_record_has_no_facts_but_its_name() -> None:
    wheel = BuiltWheel.made(Path("y-2.0-py3-none-any.whl"), None)
    assert not wheel.built_once and not wheel.ranged  # nobody's build: no record, no checks to offer it by
    assert (wheel.cuda, wheel.archs, wheel.abi, wheel.torch, wheel.platform.name) == (None, (), None, None, "x86_64")
    per_torch = BuiltWheel.made(Path("y-2.0+cu130torch2.11-cp312-cp312-linux_x86_64.whl"),
                                BuildRecord(cuda="garbage", archs=("not-an-arch",)))
    assert (per_torch.cuda, per_torch.archs, per_torch.ranged) == (None, (), False)


def test_read_wheel_prefers_the_wheelhouse_record_and_publish_writes_it(tmp_path: Path) -> None:
    house = Wheelhouse(tmp_path / "wh")
    path = labelled_wheel(tmp_path / "work", "x", "1.0", "cu130torch2.11", pins=("torch==2.11.0",),
                          tag="cp312-cp312-linux_x86_64")
    inside = checks.read_wheel(path, house)  # finalize's record inside the wheel
    assert inside.record is not None and inside.record.tests is None
    tested = BuildRecord(package="x", version="1.0", cuda="13.0", tests=TestReport(import_status="passed"))
    report = inspect_wheel(path, None)
    published = checks.publish(house, BuiltWheel.made(path, tested), report)
    again = checks.read_wheel(published, house)
    assert again.record == house.record_of(published.name) and again.record is not None
    assert again.record.tests == TestReport(import_status="passed") and again.cuda == CudaVersion.parse("13.0")
    plain = raw_wheel(tmp_path / "plain", "z", "1.0")
    assert checks.read_wheel(plain, house).record is None  # not built here: no record anywhere
