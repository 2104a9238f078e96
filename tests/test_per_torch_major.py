"""Per-torch wheels labelled by CUDA major (issue 39 item 3): ``+cu12torch2.9`` built on CUDA 12.8 is one file for
the cu128 and cu129 builds of torch 2.9, offered in the channel of each line its torch checks passed on, as a stable
``+cu13`` wheel is for its torches. A wheel labelled by CUDA line (``+cu128torch2.9``, the older shape) stays in its
line's channel alone. The farm builds one such wheel where it built one per line (docs/FARM.md "Matrix")."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.core.errors import ToolchainError
from builder.core.settings import Settings
from builder.discovery.compat import resolve_index
from builder.farm.served import Cell
from builder.farm.wheelcells import IMPORT, KERNEL, wheel_cells
from builder.index.channelpolicy import wheel_channels
from builder.index.store import Wheelhouse
from builder.model.abi import per_torch_label
from builder.model.builtwheel import BuiltWheel
from builder.model.cuda import CudaVersion
from builder.model.label import Label, LabelKind
from builder.model.records import BuildRecord
from builder.pipeline.checks import claim
from builder.pipeline.promote import _check_per_torch_torch
from builder.stages.pyenv import PythonEnv
from builder.stages.torchrange import PerTorch, other_index_torches, torches_to_check
from builder.user.fit import EnvFacts, best, judge, label_cuda
from builder.user.wheelhouse import WheelhouseReader
from tests.helpers import repo_recipe
from tests.test_index import labelled_wheel

NAME = "ext-1.7.0+cu12torch2.9-cp312-cp312-linux_x86_64.whl"
PIN = "torch>=2.9.0,<2.10"
TAGS = frozenset({"cp312-cp312-linux_x86_64", "py3-none-any"})


def check(cuda: str, status: str = "passed", torch: str = "2.9.1", how: str = "import+registration") -> dict:
    return {"torch": torch, "cuda": cuda, "python": "3.12.1", "how": how, "status": status, "detail": ""}


def record(checks: list[dict], kernel: str = "skipped") -> BuildRecord:
    return BuildRecord.from_json({
        "package": "ext", "version": "1.7.0", "cuda": "12.8", "cache_key": "k", "archs": ["90"],
        "python": {"version": "3.12", "torch": "2.9.1+cu128"},
        "inspect": {"objects": [{"path": "x.so", "sass": ["sm_90"], "ptx": [], "needed": []}]},
        "tests": {"import_status": "passed", "kernel_status": kernel, "torch": "2.9.1+cu128"},
        "torch_checks": checks})


def env(cuda: str | None, torch: str = "2.9.1") -> EnvFacts:
    return EnvFacts(python="3.12.1", tags=TAGS, torch=torch, torch_cuda=cuda, gpus=(90,))


def test_the_label_names_the_cuda_major_and_torch_minor() -> None:
    assert per_torch_label(CudaVersion.parse("12.8"), "2.9.1") == "cu12torch2.9"
    assert per_torch_label(CudaVersion.parse("13.0"), "2.11.0+cu130") == "cu13torch2.11"
    assert Label.parse("cu12torch2.9") == Label(12, None, (2, 9))
    assert Label.parse("cu12torch2.9").kind == LabelKind.PER_TORCH_MAJOR  # type: ignore[union-attr]
    assert Label.parse("cu128torch2.9").kind == LabelKind.PER_TORCH_LINE  # type: ignore[union-attr]
    assert Label.parse("cu13").kind == LabelKind.STABLE  # type: ignore[union-attr]
    assert label_cuda("cu12torch2.9") is None  # not CUDA 1.2: a line's label has three digits
    assert label_cuda("cu128torch2.9") == CudaVersion.parse("12.8")


@pytest.mark.parametrize(("checks", "channels"), [
    ([check("12.8"), check("12.9")], ("cu128torch2.9", "cu129torch2.9")),
    ([check("12.8")], ("cu128torch2.9",)),  # cu129 not checked yet (offline, or its index unreachable)
    ([check("12.8"), check("12.9", "failed")], ("cu128torch2.9",)),
    ([check("12.8"), check("13.0"), check("12.9", torch="2.10.0")], ("cu128torch2.9",)),  # another major, minor
    ([], ()),
])
def test_the_channels_are_the_lines_its_checks_passed_on(checks: list[dict], channels: tuple[str, ...]) -> None:
    assert wheel_channels(NAME, record(checks)) == channels
    assert wheel_channels(NAME, None) == ()
    old = "ext-1.7.0+cu128torch2.9-cp312-cp312-linux_x86_64.whl"  # labelled by line: its label's channel, always
    assert wheel_channels(old, record(checks)) == ("cu128torch2.9",)


@pytest.fixture
def house(tmp_path: Path) -> Wheelhouse:
    house = Wheelhouse(tmp_path / "wh")
    wheel = labelled_wheel(tmp_path, "ext", "1.7.0", "cu12torch2.9", pins=(PIN,), tag="cp312-cp312-linux_x86_64")
    assert wheel.name == NAME
    house.publish(wheel, record([check("12.8"), check("12.9")]))
    return house


def test_published_it_is_listed_in_both_lines_channels_and_fits_their_envs(house: Wheelhouse) -> None:
    for channel in ("cu128torch2.9", "cu129torch2.9"):
        page = house.root / "channels" / channel / "simple" / "ext" / "index.html"
        assert NAME in page.read_text()
    assert not (house.root / "channels" / "cu12torch2.9").exists()
    (wheel,) = WheelhouseReader(house.root).wheels("ext")
    assert wheel.per_torch_major and wheel.ranged and not wheel.is_stable_abi and wheel.cuda_major == 12
    on_129 = judge(wheel, env("12.9"))
    assert on_129.fits and on_129.channel == "cu129torch2.9"
    assert on_129.why.startswith("the per-torch wheel verified on this env's torch 2.9 with CUDA 12.9")
    assert best([on_129]) is on_129
    assert judge(wheel, env("12.8", "2.9.0")).fits  # every patch release of its minor
    assert judge(wheel, env("12.6")).reasons == (
        "not verified on torch 2.9 with CUDA 12.6 (verified: 2.9 with CUDA 12.8, 2.9 with CUDA 12.9)",)
    assert "built for CUDA 12 torches; this env's torch 2.9.1 is CUDA 13" in judge(wheel, env("13.0")).reasons
    assert judge(wheel, env("12.8", "2.10.0")).reasons[0] == (
        "needs torch<2.10,>=2.9.0 (its torch minor), the env has torch 2.10.0")


def test_its_cells_are_its_minor_on_the_lines_of_its_major_not_older_than_its_build() -> None:
    matrix = frozenset(Cell(t, line, py) for t in ("2.9", "2.10") for line in ("12.6", "12.8", "12.9", "13.0")
                       for py in ("3.11", "3.12"))
    cells = wheel_cells(NAME, record([check("12.8"), check("12.9")], kernel="passed"), matrix, None)
    assert set(cells) == {Cell("2.9", "12.8", "3.12"), Cell("2.9", "12.9", "3.12")}  # cp312: one Python
    assert cells[Cell("2.9", "12.8", "3.12")][0] == KERNEL  # its own torch: the kernel tests ran there
    assert cells[Cell("2.9", "12.9", "3.12")][0] == IMPORT
    unverified = wheel_cells(NAME, record([check("12.8")]), matrix, None)
    assert unverified[Cell("2.9", "12.9", "3.12")][1] == "built, not verified on this torch"


def test_its_torch_checks_are_cu129s_build_of_its_torch(tmp_path: Path) -> None:
    """From the shipped snapshots: a 12.8 build of 2.9 (PyTorch's cu128 index) is tried beside cu129's 2.9.1; not
    beside cu126's (an older line) or cu130's (another major), and its own torch is the import test's check."""
    settings = Settings.from_env({}, cache_dir=tmp_path / "cache", offline=True)
    cu128, cuda, minor = resolve_index("cu128", settings), CudaVersion.parse("12.8"), PerTorch((2, 9))
    own = torches_to_check(cu128, cuda, minor)
    assert own == [("2.9.1", "12.8")]
    others = other_index_torches(cu128, cuda, minor, own, settings)
    assert [(i.name, t) for i, t in others] == [("pytorch-cu129", [("2.9.1", "12.9")])]


def test_a_built_wheel_so_labelled_claims_its_minor(tmp_path: Path) -> None:
    wheel = BuiltWheel.made(tmp_path / NAME.replace("ext-", "causal_conv1d-"), record([check("12.8")]))
    assert wheel.per_torch_major and wheel.ranged and not wheel.stable
    assert claim(wheel, repo_recipe("causal-conv1d")) == PerTorch((2, 9))
    old = BuiltWheel.made(tmp_path / "causal_conv1d-1.7.0+cu128torch2.9-cp312-cp312-linux_x86_64.whl", record([]))
    assert not old.ranged  # in its label's channel, checks or not


def _gpu_env(torch: str, cuda: str) -> PythonEnv:
    return PythonEnv(python=Path("/opt/torch/bin/python3"), version="3.12.3", torch=torch, torch_cuda=cuda,
                     purelib=Path("/opt/torch/site"), managed=False)


def test_builder_test_takes_a_gpu_machines_torch_of_the_same_minor_and_cuda_major(tmp_path: Path) -> None:
    """`builder test --python` on a GPU machine: a per-torch wheel runs with every patch release of its minor (its
    pin says so), built for its CUDA major (labelled by major) or line (an older line label); another minor or CUDA
    is one error naming what the wheel needs."""
    wheel = BuiltWheel.made(tmp_path / NAME, record([check("12.8")]))
    _check_per_torch_torch(_gpu_env("2.9.0+cu129", "12.9"), wheel, "2.9.1+cu128", "python3")  # another patch, line
    with pytest.raises(ToolchainError, match=r"its torch is 2\.10\.0, the wheel needs torch 2\.9 \(built against"):
        _check_per_torch_torch(_gpu_env("2.10.0", "12.8"), wheel, "2.9.1+cu128", "python3")
    with pytest.raises(ToolchainError, match="built for CUDA 13.0; the wheel is for CUDA 12 torches"):
        _check_per_torch_torch(_gpu_env("2.9.1+cu130", "13.0"), wheel, "2.9.1+cu128", "python3")
    old = BuiltWheel.made(tmp_path / "ext-1.7.0+cu128torch2.9-cp312-cp312-linux_x86_64.whl", record([]))
    with pytest.raises(ToolchainError, match="the wheel is for CUDA 12.8 torches"):
        _check_per_torch_torch(_gpu_env("2.9.1+cu129", "12.9"), old, "2.9.1+cu128", "python3")
