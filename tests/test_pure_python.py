"""Pure-Python recipes built once (issue 28 item 2): fla-core's wheel is built unlabelled, keeps upstream's own torch
requirement, and carries torch checks like a stable-ABI wheel: the build's import test for its own torch and an
import beside the newest release of every torch minor (and CUDA line from 12.8 on) its requirement admits, on each
known torch index; a failed check keeps it out of that torch's channel. ``builder test`` on a GPU adds a GPU check
per GPU, ``builder verify`` tries torches released since, and a user's env takes it from its own torch's channel.
No network, no compile: the torch tables are the shipped snapshots, and the venvs are stood in for."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from builder.core.errors import UsageError
from builder.core.settings import Settings
from builder.discovery.compat import known_indexes, resolve_index
from builder.farm.coverage import MIN_CUDA, users_matrix
from builder.index.channelpolicy import wheel_channels
from builder.index.store import Wheelhouse
from builder.model.arch import parse_arch_list
from builder.model.builtwheel import BuiltWheel
from builder.model.cuda import CudaVersion
from builder.model.python import PythonSpec
from builder.model.recipe import find_recipe, load_recipe
from builder.model.records import BuildRecord, TestReport, TorchCheck
from builder.pipeline import checks as chain
from builder.pipeline import promote, run, verify
from builder.stages.finalize import finalize_wheel, read_metadata
from builder.stages.plan import Plan, Target
from builder.stages.pyenv import PythonEnv
from builder.stages.resolve import SourceRef
from builder.stages.testing import TestStageFailed
from builder.stages.torchrange import (
    IMPORT_REGISTRATION,
    NOT_CHECKED,
    PURE_PYTHON_MIN_CUDA,
    PurePython,
    built_once,
    judge_probe,
    other_index_torches,
    split_unchecked,
    torches_to_check,
)
from builder.user.fit import EnvFacts, judge
from builder.user.installer import install_argv
from builder.user.wheelhouse import WheelhouseReader
from tests.helpers import ROOT
from tests.test_index import labelled_wheel, raw_wheel
from tests.test_stable_abi import pypi_like
from tests.test_user_stable_abi import env_tags

WHEEL = "fla_core-0.6.0-py3-none-any.whl"
# fla-core 0.6.0's Requires-Dist on PyPI, shortened: torch only under extras (cuda, rocm, cpu: >=2.7.0; npu: ==2.10.0)
UPSTREAM = ("einops", 'torch>=2.7.0; extra == "cuda"', 'triton>=3.3; extra == "cuda"', 'torch==2.10.0; extra == "npu"')


def offline(tmp_path: Path, **changes: object) -> Settings:
    return Settings.from_env({}, cache_dir=tmp_path / "cache", offline=True, **changes)  # type: ignore[arg-type]


def fla_plan(tmp_path: Path, torch: str = "2.14.1") -> Plan:
    """The plan of fla-core 0.6.0 (the real recipe) for CUDA 13.0 and PyPI's torch, as make_plan would make it
    (built here without asking PyPI for its releases)."""
    recipe = load_recipe(find_recipe("fla-core", ROOT / "recipes"), ROOT / "patches")
    target = Target(package="fla-core", version="0.6.0", cuda=CudaVersion.parse("13.0"), archs=parse_arch_list("120"),
                    python=PythonSpec("3.12"), torch=torch)
    source = SourceRef(kind="pypi", location="fla-core", filename="fla_core-0.6.0.tar.gz", sha256=None)
    return Plan(target=target, recipe=recipe, version="0.6.0", source=source, patches=(), torch=torch,
                index=resolve_index(None, offline(tmp_path)), image="none")


def build_env(torch: str = "2.14.1", cuda: str | None = "13.0") -> PythonEnv:
    return PythonEnv(python=Path(sys.executable), version="3.12.1", torch=torch, torch_cuda=cuda,
                     purelib=Path("/nonexistent"), managed=True)


PASSED_IMPORT = TestReport(import_status="passed", kernel_status="skipped", torch="2.14.1+cu130")


# ---------------------------------------------------------------- plan and finalize: unlabelled, upstream's torch


def test_a_pure_python_plan_has_no_label_and_pins_no_torch(tmp_path: Path) -> None:
    plan = fla_plan(tmp_path)
    assert plan.pure_python and not plan.stable
    assert plan.label("2.14.1") is None
    assert plan.torch_requirement("2.14.1") is None
    label, pins = run.label_and_pins(plan, "2.14.1")
    assert label is None
    assert pins == ["triton>=3.3", "packaging"]  # the recipe's runtime requires only: no torch==
    rows = dict(plan.describe())
    assert rows["label"].startswith("none (pure Python: built once")
    assert rows["abi"].startswith("none (pure Python: one py3-none-any wheel for every torch")


def test_finalize_keeps_the_wheel_unlabelled_with_upstreams_torch_requirement(tmp_path: Path) -> None:
    plan = fla_plan(tmp_path)
    label, pins = run.label_and_pins(plan, "2.14.1")
    raw = raw_wheel(tmp_path / "raw", "fla-core", "0.6.0", requires=(*UPSTREAM, "triton"))
    final = finalize_wheel(raw, tmp_path / "final", label=label, pins=pins, build_record=BuildRecord())
    assert final.name == WHEEL and built_once(final.name)
    requires = [line.split(":", 1)[1].strip() for line in read_metadata(final).splitlines()
                if line.startswith("Requires-Dist:")]
    assert requires == [*UPSTREAM, "triton>=3.3", "packaging"]  # unconditional triton replaced, torch's kept
    assert PurePython.of_requires(requires).requirement == SpecifierSet(">=2.7.0")  # the cuda extra's, not npu's
    assert PurePython.of_requires(["torch>=2.5", "einops"]).requirement == SpecifierSet(">=2.5")  # fla-core 0.4
    assert PurePython.of_requires(["fla-core==0.6.0", "transformers"]).requirement == SpecifierSet()  # every torch


def test_built_once_is_unlabelled_py3_none_any_only() -> None:
    assert built_once(WHEEL)
    assert not built_once("fla_core-0.6.0+cu130torch2.14-py3-none-any.whl")  # an older per-torch build
    assert not built_once("causal_conv1d-1.7.0-cp310-abi3-linux_x86_64.whl")


# ---------------------------------------------------------------- which torches it is tried with


def test_the_range_is_each_torch_minor_and_cuda_line_from_12_8_its_requirement_admits() -> None:
    claim = PurePython(SpecifierSet(">=2.7.0"))
    cuda = CudaVersion.parse("13.0")
    assert torches_to_check(pypi_like(), cuda, claim) == [  # 12.8's 2.10 too: any CUDA line from 12.8 on
        ("2.10.0", "12.8"), ("2.11.0", "13.0"), ("2.12.1", "13.0"), ("2.13.0", "13.0"), ("2.14.1", "13.0"),
        ("2.15.0", "13.2")]
    assert torches_to_check(pypi_like(), cuda, PurePython(SpecifierSet(">=2.13,<2.15"))) == [
        ("2.13.0", "13.0"), ("2.14.1", "13.0")]
    assert PURE_PYTHON_MIN_CUDA == MIN_CUDA  # the users' matrix of builder coverage starts where the checks do


def test_the_checks_cover_exactly_the_users_matrix_cells_the_requirement_admits(tmp_path: Path) -> None:
    """From the shipped snapshots: PyPI's torches, then every other index's (minor, line) PyPI lacks, older CUDA
    lines than the build's included; cu126 (12.6) left out. Those pairs are the users' matrix's (coverage credits a
    pure-Python wheel per torch minor and CUDA line), so nothing the farm counts goes unchecked."""
    settings = offline(tmp_path)
    pypi, claim, cuda = resolve_index(None, settings), PurePython(SpecifierSet(">=2.7.0")), CudaVersion.parse("13.0")
    own = torches_to_check(pypi, cuda, claim)
    assert own == [("2.8.0", "12.8"), ("2.9.1", "12.8"), ("2.10.0", "12.8"), ("2.11.0", "13.0"), ("2.12.1", "13.0"),
                   ("2.13.0", "13.0"), ("2.14.1", "13.0"), ("2.15.0", "13.2")]
    others = other_index_torches(pypi, cuda, claim, own, settings)
    assert [(i.name, t) for i, t in others] == [
        ("pytorch-cu128", [("2.7.1", "12.8"), ("2.11.0", "12.8")]),
        ("pytorch-cu129", [("2.8.0", "12.9"), ("2.9.1", "12.9"), ("2.10.0", "12.9"), ("2.11.0", "12.9")]),
        ("pytorch-cu130", [("2.9.1", "13.0"), ("2.10.0", "13.0"), ("2.15.0", "13.0")]),
        ("pytorch-cu132", [("2.12.1", "13.2"), ("2.13.0", "13.2"), ("2.14.1", "13.2")])]
    tried = {(t.rsplit(".", 1)[0], line) for t, line in [*own, *(p for _, these in others for p in these)]}
    cells, _ = users_matrix(known_indexes(settings))
    assert tried == {(c.torch, c.cuda) for c in cells if claim.admits(f"{c.torch}.0")}
    assert len(tried) == 20


def test_a_pure_python_probe_passes_on_imports_alone() -> None:
    claim = PurePython(SpecifierSet(">=2.7.0"))
    check = judge_probe({"python": "3.12.1", "torch": "2.13.0+cu130", "cuda": "13.0", "ops": [],
                         "without_cuda_kernel": []}, "2.13.0", "13.0", claim)
    assert check.passed and check.how == IMPORT_REGISTRATION
    assert check.detail == "imported (pure Python: no ops to register)"
    broken = judge_probe({"python": "3.12.1", "error": "ImportError: cannot import name 'X' from 'triton'"},
                         "2.9.1", "12.8", claim)
    assert not broken.passed and broken.detail == "import failed: ImportError: cannot import name 'X' from 'triton'"


# ---------------------------------------------------------------- the torch-range stage of a pure-Python build


class FakeRange:
    """Stands in for check_torch_range: records which torches of which index were asked for, fails ``failing``."""

    def __init__(self, failing: tuple[str, ...] = ()) -> None:
        self.asked: list[tuple[str, list[tuple[str, str]]]] = []
        self.failing = failing

    def __call__(self, wheel, claim, imports, torches, index, base_python, workdir, *, make_env=None):
        assert isinstance(claim, PurePython) and make_env is not None  # companions and test requires come along
        self.asked.append((index.name, list(torches)))
        return tuple(TorchCheck(torch=t, cuda=line, python="3.12.1", how=IMPORT_REGISTRATION,
                                status="failed" if t in self.failing else "passed") for t, line in torches)


def stage(tmp_path: Path, settings: Settings, fake: FakeRange, monkeypatch: pytest.MonkeyPatch,
          whole_range: bool = True, tests: TestReport = PASSED_IMPORT) -> tuple[TorchCheck, ...]:
    monkeypatch.setattr(chain, "check_torch_range", fake)
    return chain.torch_range(fla_plan(tmp_path), settings, build_env(), Path(sys.executable),
                             BuiltWheel.made(tmp_path / WHEEL, None), tmp_path / "work", tests, whole_range=whole_range,
                             requires=UPSTREAM, companions=tmp_path / "wheels")


def test_the_stage_counts_the_import_test_for_the_build_torch_and_tries_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot = known_indexes(offline(tmp_path))
    monkeypatch.setattr("builder.stages.torchrange.known_indexes", lambda settings: snapshot)
    monkeypatch.setattr("builder.pipeline.checks.read_here", lambda rounds: rounds)  # as if every index answered here
    fake = FakeRange(failing=("2.9.1",))
    checks = stage(tmp_path, Settings.from_env({}, cache_dir=tmp_path / "cache"), fake, monkeypatch)
    own = checks[0]
    assert (own.torch, own.cuda, own.how, own.status) == ("2.14.1", "13.0", IMPORT_REGISTRATION, "passed")
    assert own.detail == "the build's import test"
    pypi_asked = dict(fake.asked)["pypi"]
    assert ("2.14.1", "13.0") not in pypi_asked and ("2.13.0", "13.0") in pypi_asked  # not installed twice
    assert [name for name, _ in fake.asked] == ["pypi", "pytorch-cu128", "pytorch-cu129", "pytorch-cu130",
                                                "pytorch-cu132"]
    assert len(checks) == 20
    channels = wheel_channels(WHEEL, BuildRecord(torch_checks=checks))
    assert "cu130torch2.14" in channels and "cu130torch2.13" in channels and "cu128torch2.7" in channels
    # 2.9.1 failed on 12.8 (PyPI), 12.9 and 13.0: kept out of those channels, the others stay
    assert not {"cu128torch2.9", "cu129torch2.9", "cu130torch2.9"} & set(channels)
    assert len(channels) == 17


def test_no_torch_range_keeps_the_build_torch_alone_with_the_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeRange()
    monkeypatch.setattr("builder.stages.torchrange.known_indexes", lambda settings: pytest.fail("no other index"))
    checks = stage(tmp_path, Settings.from_env({}, cache_dir=tmp_path / "cache"), fake, monkeypatch, whole_range=False)
    assert fake.asked == []  # no venv made: the import test was the build torch's check
    assert [(c.torch, c.cuda, c.status) for c in checks] == [("2.14.1", "13.0", "passed")]
    assert wheel_channels(WHEEL, BuildRecord(torch_checks=checks)) == ("cu130torch2.14",)


def test_offline_tries_the_range_from_this_machines_caches_and_records_the_rest_as_not_checked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 39: --offline tried torches with downloads (and failed). Now every torch of the range is tried with
    an env made without the network (offline_maker: the build env's torch, cached build venvs', uv's cache); one
    none of them has is NOT_CHECKED, kept out of torch_checks (so no channel is decided by it) and named."""
    makers: list[str] = []

    def fake(wheel, claim, imports, torches, index, base_python, workdir, *, make_env=None):
        assert make_env is not None
        makers.append(make_env.__qualname__)
        return tuple(TorchCheck(torch=t, cuda=line, python="3.12.1", how=IMPORT_REGISTRATION, status=NOT_CHECKED,
                                detail=f"offline: torch {t} is not on this machine without the network")
                     for t, line in torches)

    monkeypatch.setattr(chain, "check_torch_range", fake)
    checks = chain.torch_range(fla_plan(tmp_path), offline(tmp_path), build_env(), Path(sys.executable),
                                   BuiltWheel.made(tmp_path / WHEEL, None), tmp_path / "work", PASSED_IMPORT, requires=UPSTREAM,
                                   companions=tmp_path / "wheels")
    assert set(makers) == {"offline_maker.<locals>.make"}  # never venv_maker's (a download)
    made, unchecked = split_unchecked(checks)
    assert [(c.torch, c.status) for c in made] == [("2.14.1", "passed")]  # the build's import test
    assert len(unchecked) == 19 and {c.status for c in unchecked} == {NOT_CHECKED}
    assert wheel_channels(WHEEL, BuildRecord(torch_checks=made)) == ("cu130torch2.14",)
    err = capsys.readouterr().err
    # each torch named with its CUDA, once (issue 39: "2.15.0, 2.15.0" named two torches alike)
    assert "torch range: --offline: not checked on torch 2.8.0+cu128, 2.9.1+cu128, " in err
    named = err.split("not checked on torch ")[1].split(" (not on")[0].split(", ")
    assert len(named) == len(set(named)) == len({c.named for c in unchecked}) == 19
    assert {"2.15.0+cu130", "2.15.0+cu132"} <= set(named)
    assert "recorded as not checked, not as failed" in err and "until `builder verify` checks the others" in err


def test_a_failed_import_test_publishes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failed = TestReport(import_status="failed", import_detail="ModuleNotFoundError: No module named 'packaging'")
    with pytest.raises(TestStageFailed, match="fails beside its own build torch 2.14.1: the build's import test: "
                                              "ModuleNotFoundError"):
        stage(tmp_path, offline(tmp_path), FakeRange(), monkeypatch, tests=failed)


# ---------------------------------------------------------------- builder test (promote) and builder verify


def pure_record(checks: tuple[TorchCheck, ...] = ()) -> BuildRecord:
    return BuildRecord(package="fla-core", version="0.6.0", cuda="13.0", torch_index="https://pypi.org/simple",
                       python={"version": "3.12.1", "torch": "2.14.1", "torch_cuda": "13.0"},
                       toolchain={"kind": "none (pure Python)"}, torch_checks=checks)


def test_promote_takes_the_build_torch_of_a_pure_wheel_not_a_pin() -> None:
    requires = (*UPSTREAM, "triton>=3.3")
    assert promote._torch_pin(requires, pure_record(), ranged=True) == "2.14.1"
    with pytest.raises(UsageError, match="pins no torch=="):
        promote._torch_pin(requires, pure_record())
    assert promote._torch_pin(("torch==2.13.0",), pure_record(), ranged=True) == "2.13.0"  # an older labelled build


def gpu_run(gpu: str, torch: str = "2.14.1") -> tuple[PythonEnv, TestReport]:
    return build_env(torch), TestReport(import_status="passed", kernel_status="passed", counts={"passed": 12},
                                        gpu=gpu)


def test_a_second_gpu_adds_its_check_and_the_same_gpu_replaces_its_own() -> None:
    record = pure_record((TorchCheck(torch="2.14.1", cuda="13.0", python="3.12.1", how=IMPORT_REGISTRATION,
                                     status="passed"),))
    first = record.with_(torch_checks=chain.with_gpu_check(record, *gpu_run("NVIDIA GeForce RTX 5090")))
    second = first.with_(torch_checks=chain.with_gpu_check(first, *gpu_run("NVIDIA H200")))
    gpus = [c.detail for c in second.torch_checks or () if c.how == "gpu-kernel-tests"]
    assert gpus == ["12 passed on NVIDIA GeForce RTX 5090", "12 passed on NVIDIA H200"]
    again = chain.with_gpu_check(second, *gpu_run("NVIDIA H200"))
    assert [c.detail for c in again if c.how == "gpu-kernel-tests"] == gpus  # replaced, not doubled
    assert len(again) == 3


def test_verify_tries_a_published_pure_wheel_on_the_torches_it_lacks(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    settings = offline(tmp_path, wheelhouse=tmp_path / "wh", recipes_dir=ROOT / "recipes")
    house = Wheelhouse(settings.wheelhouse)
    have = tuple(TorchCheck(torch=t, cuda=line, python="3.12.1", how=IMPORT_REGISTRATION, status="passed")
                 for t, line in torches_to_check(resolve_index(None, settings), CudaVersion.parse("13.0"),
                                                 PurePython(SpecifierSet(">=2.7.0"))) if t != "2.15.0")
    house.publish(raw_wheel(tmp_path / "raw", "fla-core", "0.6.0", requires=UPSTREAM), pure_record(have))
    assert verify.stable_packages(settings) == ["fla-core"]
    asked: list[tuple[str, list[tuple[str, str]]]] = []

    def fake(wheel, claim, imports, torches, index, base, workdir, *, make_env=None):
        assert isinstance(claim, PurePython) and claim.requirement == SpecifierSet(">=2.7.0") and make_env is not None
        asked.append((index.name, list(torches)))
        return tuple(TorchCheck(torch=t, cuda=line, python="3.12.1", how=IMPORT_REGISTRATION, status="passed")
                     for t, line in torches)

    monkeypatch.setattr(verify, "check_torch_range", fake)
    monkeypatch.setattr(verify, "find_interpreter", lambda version: Path(sys.executable))
    (result,) = verify.verify_package("fla-core", settings)
    assert asked[0] == ("pypi", [("2.15.0", "13.2")])  # PyPI's: only the one not checked yet
    assert len(result.checks) == 20 and len(result.new) == 13
    assert "cu132torch2.15" in house.channels_of(WHEEL) and "cu129torch2.8" in house.channels_of(WHEEL)


# ---------------------------------------------------------------- the user's side


@pytest.fixture
def house(tmp_path: Path) -> Wheelhouse:
    house = Wheelhouse(tmp_path / "wh")
    checks = (TorchCheck(torch="2.13.0", cuda="13.0", python="3.12.1", how=IMPORT_REGISTRATION, status="passed"),
              TorchCheck(torch="2.14.1", cuda="13.0", python="3.12.1", how=IMPORT_REGISTRATION, status="passed"),
              TorchCheck(torch="2.12.1", cuda="13.0", python="3.12.1", how=IMPORT_REGISTRATION, status="failed",
                         detail="import failed: ImportError: triton"))
    house.publish(raw_wheel(tmp_path / "raw", "fla-core", "0.6.0", requires=UPSTREAM), pure_record(checks))
    house.publish(raw_wheel(tmp_path / "old", "fla-older", "0.4.0", requires=("torch>=2.5", "einops")),
                  pure_record(checks))  # fla-core 0.4's shape: an unconditional torch requirement
    house.publish(labelled_wheel(tmp_path / "plain", "fla-other", "0.1.0", None, requires=("torch>=2.5",)),
                  BuildRecord(package="fla-other", version="0.1.0"))
    return house


def facts(torch: str | None, cuda: str | None) -> EnvFacts:
    return EnvFacts(python="3.12.1", tags=env_tags("3.12.1"), torch=torch, torch_cuda=cuda, gpus=(120,))


def test_a_torch_2_13_env_takes_it_from_its_own_channel_torch_held(house: Wheelhouse) -> None:
    (wheel,) = WheelhouseReader(house.root).wheels("fla-core")
    env = facts("2.13.0", "13.0")
    verdict = judge(wheel, env)
    assert wheel.built_once and wheel.ranged and not wheel.is_stable_abi
    assert verdict.fits, verdict.reasons
    assert verdict.channel == "cu130torch2.13"
    assert verdict.why == ("the pure-Python wheel verified on this env's torch 2.13 with CUDA 13.0: "
                           "import+registration passed on torch 2.13.0")
    channel = f"{house.root.as_uri()}/channels/cu130torch2.13/simple/"
    assert wheel.index_url_for(env) == channel
    argv = install_argv(Path("/env/bin/python"), [wheel], env)
    assert argv[argv.index("--extra-index-url") + 1] == channel
    assert argv[-2:] == ["fla-core==0.6.0", "torch==2.13.0"]  # torch held where it is


@pytest.mark.parametrize(("torch", "cuda", "reason"), [
    ("2.12.1", "13.0", "failed its import+registration check on torch 2.12.1 (CUDA 13.0): import failed: "
                       "ImportError: triton"),
    ("2.15.0", "13.2", "not verified on torch 2.15 (verified: 2.13, 2.14)"),
    # below the cuda extra's >=2.7, read by the one rule torchrange tries torches by (model/wheelfacts.py)
    ("2.6.0", "12.4", "needs torch>=2.7.0 (its own requirement), the env has torch 2.6.0"),
    ("2.13.0+cpu", None, "offered for the CUDA torches its checks passed on; this env's torch 2.13.0+cpu is a CPU "
                         "build"),
])
def test_where_no_check_passed_it_is_refused_with_the_reason(house: Wheelhouse, torch: str, cuda: str | None,
                                                             reason: str) -> None:
    (wheel,) = WheelhouseReader(house.root).wheels("fla-core")
    verdict = judge(wheel, facts(torch, cuda))
    assert list(verdict.reasons) == [reason]
    assert verdict.channel is None


def test_an_unconditional_torch_requirement_is_judged_first(house: Wheelhouse) -> None:
    (wheel,) = WheelhouseReader(house.root).wheels("fla-older")
    assert list(judge(wheel, facts("2.4.1", "12.4")).reasons) == [
        "needs torch>=2.5 (its own requirement), the env has torch 2.4.1"]
    assert judge(wheel, facts("2.14.1", "13.0")).fits


def test_an_unlabelled_wheel_without_checks_is_offered_in_no_channel(house: Wheelhouse) -> None:
    (wheel,) = WheelhouseReader(house.root).wheels("fla-other")
    assert wheel.built_once and wheel.channels == ()
    assert list(judge(wheel, facts("2.13.0", "13.0")).reasons) == [
        "not verified on torch 2.13: no torch check of it passed"]


def test_a_built_once_wheel_keys_the_same_whatever_torch_built_it() -> None:
    """The farm's pure target follows the newest torch; a new torch must not rebuild (and, with release assets,
    try to replace) the same py3-none-any file. A per-torch pure record of before keeps its own inputs."""
    from builder.model.records import BuildRecord
    from builder.stages.inputs import recorded_inputs

    def record(torch: str, cuda: str, checks: tuple | None) -> BuildRecord:
        return BuildRecord(package="fla-core", version="0.6.0", cuda=cuda, toolchain={"kind": "none (pure Python)"},
                           python={"version": "3.12.1", "torch": torch}, torch_index="https://pypi.org/simple",
                           torch_checks=checks)

    import dataclasses

    def key(torch: str, cuda: str, checks: tuple | None) -> str:  # env: the recipe's, which a record does not name
        return dataclasses.replace(recorded_inputs(record(torch, cuda, checks)), env=()).cache_key()

    once = [key(t, c, ()) for t, c in (("2.14.1", "13.0"), ("2.15.0", "13.2"))]
    assert once[0] == once[1]
    before = [key(t, c, None) for t, c in (("2.14.1", "13.0"), ("2.15.0", "13.2"))]
    assert before[0] != before[1] and once[0] not in before


def test_indexes_never_read_here_are_left_to_verify_elsewhere(tmp_path: Path) -> None:
    """An index whose release list is the shipped snapshot was unreachable from this machine: its torches are not
    tried (each would be a failed install keeping the wheel out of a channel), an index read here is."""
    import dataclasses

    from builder.stages.torchrange import read_here

    indexes = {i.name: i for i in known_indexes(offline(tmp_path))}
    channel, pypi = indexes["pytorch-cu130"], indexes["pypi"]
    assert channel.source == "snapshot" and pypi.listing is not None
    pypi = dataclasses.replace(pypi, listing=dataclasses.replace(pypi.listing, source="cache"))  # read here before
    kept = read_here([(channel, [("2.15.0", "13.0")]), (pypi, [("2.12.1", "13.0")])])
    assert [(i.name, t) for i, t in kept] == [("pypi", [("2.12.1", "13.0")])]
