"""The user's side of stable-ABI wheels (issue 25): one ``cp310-abi3`` wheel per CUDA major (``+cu13``,
``torch>=2.11``) fits every env whose torch is of that CUDA major and verified (per torch minor and CUDA line, from
the record's torch checks), is installed from that env's own channel pinned ``==1.7.0+cu13`` with torch held, and
is refused with the reason where it does not fit. The wheelhouse is a real one (pages, sidecars, records), read as a
client reads it; the last tests run doctor and install against venvs holding a stand-in torch, with real uv."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging import tags as ptags
from packaging.version import Version

from builder.index.store import Wheelhouse
from builder.model.cuda import CudaVersion
from builder.model.records import BuildRecord, TorchCheck
from builder.user.choice import Choice, torch_for_this_machine, ways_forward
from builder.user.fit import EnvFacts, IndexedWheel, Verdict, best, judge
from builder.user.install import InstallOutcome
from builder.user.installer import install_argv
from builder.user.machine import Driver
from builder.user.wheelhouse import WheelhouseReader
from tests.test_index import labelled_wheel
from tests.test_user_install import World, installed, make_venv, user_world

STABLE = "causal_conv1d-1.7.0+cu13-cp310-abi3-linux_x86_64.whl"
ABI3 = "cp310-abi3-linux_x86_64"


def env_tags(python: str) -> frozenset[str]:
    """What packaging.tags gives a CPython of that version on x86_64 Linux (abi3 tags included)."""
    major, minor = (int(x) for x in python.split(".")[:2])
    platforms = ["linux_x86_64"]
    return frozenset(str(t) for t in (*ptags.cpython_tags((major, minor), platforms=platforms),
                                      *ptags.compatible_tags((major, minor), platforms=platforms)))


def env(torch: str, cuda: str | None, python: str = "3.12.1") -> EnvFacts:
    return EnvFacts(python=python, tags=env_tags(python), torch=torch, torch_cuda=cuda, gpus=(120,))


def check(torch: str, cuda: str, status: str = "passed", how: str = "import+registration",
          detail: str = "") -> dict[str, str]:
    return {"torch": torch, "cuda": cuda, "python": "3.12.1", "how": how, "status": status, "detail": detail}


def stable_record(checks: list[dict[str, str]]) -> BuildRecord:
    """A stable-ABI wheel's record as the farm writes it: abi, floor, torch checks, and the inspection's objects."""
    return BuildRecord.from_json({
        "package": "causal-conv1d", "version": "1.7.0", "cuda": "13.0", "archs": ["120"], "abi": "torch-stable",
        "torch_floor": "2.11", "torch_checks": checks,
        "inspect": {"objects": [{"path": "c.so", "sass": ["sm_120"], "ptx": [], "needed": ["libcudart.so.13"]}]},
        "tests": {"import_status": "passed", "kernel_status": "skipped"},
    })


ALL_PASS = [check("2.11.0", "13.0"), check("2.12.1", "13.0"), check("2.13.0", "13.0"), check("2.14.1", "13.0"),
            check("2.15.0", "13.2")]
UNDEFINED = "ImportError: undefined symbol: aoti_torch_get_current_cuda_stream"
FAILED_213 = [check("2.11.0", "13.0"), check("2.12.1", "13.0"), check("2.13.0", "13.0", "failed", detail=UNDEFINED)]


def publish_stable(house: Wheelhouse, tmp: Path, name: str, checks: list[dict[str, str]], version: str = "1.7.0") -> None:
    wheel = labelled_wheel(tmp / name / version, name, version, "cu13", pins=("torch>=2.11",), tag=ABI3)
    house.publish(wheel, stable_record(checks))


@pytest.fixture(scope="module")
def house(tmp_path_factory: pytest.TempPathFactory) -> Wheelhouse:
    tmp = tmp_path_factory.mktemp("stable")
    house = Wheelhouse(tmp / "wh")
    publish_stable(house, tmp, "causal-conv1d", ALL_PASS)
    publish_stable(house, tmp, "flaky-ext", FAILED_213)
    return house


def verdict(house: Wheelhouse, project: str, facts: EnvFacts) -> Verdict:
    wheels = WheelhouseReader(house.root).wheels(project)
    assert len(wheels) == 1, wheels
    return judge(wheels[0], facts)


def channel_lists(house: Wheelhouse, project: str, label: str, filename: str) -> bool:
    page = house.project_page(project, label, json=True)
    return page.is_file() and any(f["filename"] == filename for f in json.loads(page.read_text())["files"])


@pytest.mark.parametrize(("torch", "cuda", "python", "channel"), [
    ("2.12.1", "13.0", "3.12.1", "cu130torch2.12"),
    ("2.12.0", "13.0", "3.11.9", "cu130torch2.12"),  # a check on 2.12.1 covers 2.12.x of the same CUDA line
    ("2.15.0", "13.2", "3.13.1", "cu132torch2.15"),
    ("2.11.0", "13.0", "3.10.14", "cu130torch2.11"),  # the floor, on the abi3 floor
])
def test_the_stable_wheel_fits_each_verified_torch_from_that_torchs_channel(
        house: Wheelhouse, torch: str, cuda: str, python: str, channel: str) -> None:
    facts = env(torch, cuda, python)
    found = verdict(house, "causal-conv1d", facts)
    assert found.wheel.filename == STABLE and found.wheel.is_stable_abi
    assert found.fits, found.reasons
    assert found.channel == channel
    assert found.why.startswith(f"the stable-ABI wheel verified on this env's torch {torch[:4]} with CUDA {cuda}")
    assert found.wheel.index_url_for(facts) == f"{house.root.as_uri()}/channels/{channel}/simple/"
    assert channel_lists(house, "causal-conv1d", channel, STABLE)  # where the index lists it: the same rule


@pytest.mark.parametrize(("torch", "cuda", "reasons"), [
    ("2.10.0+cu128", "12.8", ["needs torch>=2.11 (its stable-ABI floor), the env has torch 2.10.0+cu128",
                              "built for CUDA 13 torches; this env's torch 2.10.0+cu128 is CUDA 12"]),
    ("2.12.1+cu126", "12.6", ["built for CUDA 13 torches; this env's torch 2.12.1+cu126 is CUDA 12"]),
    ("2.12.1+cpu", None, ["built for CUDA 13 torches; this env's torch 2.12.1+cpu is a CPU build"]),
    ("2.16.0", "13.2", ["not verified on torch 2.16 (verified: 2.11, 2.12, 2.13, 2.14, 2.15)"]),
    ("2.15.0+cu130", "13.0",  # PyTorch's cu130 index: the 2.15 check was of PyPI's CUDA 13.2 build
     ["not verified on torch 2.15 with CUDA 13.0 (verified: 2.11, 2.12, 2.13, 2.14, 2.15 with CUDA 13.2)"]),
])
def test_refused_with_the_reason_where_cuda_major_or_verification_fails(
        house: Wheelhouse, torch: str, cuda: str | None, reasons: list[str]) -> None:
    found = verdict(house, "causal-conv1d", env(torch, cuda))
    assert list(found.reasons) == reasons
    assert found.channel is None and found.why == ""


def test_abi3_fits_cpython_from_310_on_and_not_39(house: Wheelhouse) -> None:
    old = verdict(house, "causal-conv1d", env("2.12.1", "13.0", python="3.9.18"))
    assert list(old.reasons) == ["a cp310-abi3 wheel (CPython >= 3.10), not Python 3.9.18"]
    for python in ("3.10.14", "3.13.1", "3.14.0"):
        assert verdict(house, "causal-conv1d", env("2.12.1", "13.0", python=python)).fits, python
    no_torch = verdict(house, "causal-conv1d", EnvFacts(python="3.12.1", tags=env_tags("3.12.1"), torch=None,
                                                        torch_cuda=None))
    assert list(no_torch.reasons) == ["needs torch>=2.11; no torch is installed"]


def test_a_failed_check_refuses_that_torch_with_its_reason(house: Wheelhouse) -> None:
    refused = verdict(house, "flaky-ext", env("2.13.0", "13.0"))
    assert list(refused.reasons) == [f"failed its import+registration check on torch 2.13.0 (CUDA 13.0): {UNDEFINED}"]
    name = refused.wheel.filename
    assert not channel_lists(house, "flaky-ext", "cu130torch2.13", name)
    assert verdict(house, "flaky-ext", env("2.12.1", "13.0")).fits and channel_lists(house, "flaky-ext",
                                                                                      "cu130torch2.12", name)
    newer = verdict(house, "flaky-ext", env("2.14.1", "13.0"))
    assert list(newer.reasons) == ["not verified on torch 2.14 (verified: 2.11, 2.12)"]


def test_a_passed_and_a_failed_check_on_one_minor_refuse_it_as_the_index_does(tmp_path: Path) -> None:
    house = Wheelhouse(tmp_path / "wh")
    publish_stable(house, tmp_path, "mixed", [check("2.13.0", "13.0"), check("2.13.1", "13.0", "failed", detail="x")])
    refused = verdict(house, "mixed", env("2.13.0", "13.0"))
    assert list(refused.reasons) == ["failed its import+registration check on torch 2.13.1 (CUDA 13.0): x"]
    assert not channel_lists(house, "mixed", "cu130torch2.13", refused.wheel.filename)
    unchecked = Wheelhouse(tmp_path / "none")
    publish_stable(unchecked, tmp_path / "none-wheels", "mixed", [])
    assert list(verdict(unchecked, "mixed", env("2.13.0", "13.0")).reasons) == [
        "not verified on torch 2.13: no torch check of it passed"]


def test_install_pins_the_stable_wheel_from_the_envs_channel_and_holds_torch(house: Wheelhouse) -> None:
    facts = env("2.12.1", "13.0")
    picked = best([judge(w, facts) for w in WheelhouseReader(house.root).wheels("causal-conv1d")])
    assert picked is not None
    python = Path("/envs/a/bin/python")
    channel = f"{house.root.as_uri()}/channels/cu130torch2.12/simple/"
    assert install_argv(python, [picked.wheel], facts) == [
        "uv", "pip", "install", "--python", str(python), "--extra-index-url", channel, "causal-conv1d==1.7.0+cu13",
        "torch==2.12.1"]
    assert install_argv(python, [picked.wheel], facts, tool="pip")[-2:] == ["causal-conv1d==1.7.0+cu13",
                                                                             "torch==2.12.1"]
    outcome = InstallOutcome(python, (picked.wheel,), (), "uv ...", "2.12.1", {STABLE: picked.why})
    assert outcome.summary()[0] == (f"installed: {STABLE} (the stable-ABI wheel verified on this env's torch 2.12 "
                                    "with CUDA 13.0: import+registration passed on torch 2.12.1)")


def stable_wheel(version: str, checks: tuple[TorchCheck, ...] = (), kernel: str | None = "skipped") -> IndexedWheel:
    return IndexedWheel(filename=f"ext-{version}+cu13-{ABI3}.whl", project="ext", version=Version(f"{version}+cu13"),
                        label="cu13", url="", wheelhouse="file:///wh/", requires_python=None,
                        requires=("torch>=2.11",), sass=None, ptx=None, kernel_tests=kernel, abi="torch-stable",
                        cuda="13.0", torch_checks=checks,
                        channels=tuple(sorted({c.channel for c in checks if c.passed})))


def per_torch_wheel(version: str, kernel: str | None = "skipped") -> IndexedWheel:
    return IndexedWheel(filename=f"ext-{version}+cu130torch2.12-cp312-cp312-linux_x86_64.whl", project="ext",
                        version=Version(f"{version}+cu130torch2.12"), label="cu130torch2.12", url="",
                        wheelhouse="file:///wh/", requires_python=None, requires=("torch==2.12.1",), sass=None,
                        ptx=None, kernel_tests=kernel)


def test_best_prefers_newer_then_kernel_tested_on_this_torch_then_per_torch() -> None:
    facts = env("2.12.1", "13.0")
    imported = (TorchCheck(torch="2.12.1", cuda="13.0", python="3.12.1", how="import+registration", status="passed"),)
    gpu = (*imported, TorchCheck(torch="2.12.1", cuda="13.0", python="3.12.1", how="gpu-kernel-tests",
                                 status="passed"))
    gpu_elsewhere = (*imported, TorchCheck(torch="2.14.1", cuda="13.0", python="3.12.1", how="gpu-kernel-tests",
                                           status="passed"))

    def pick(*wheels: IndexedWheel) -> str:
        chosen = best([judge(w, facts) for w in wheels])
        assert chosen is not None
        return chosen.wheel.filename

    per_torch = per_torch_wheel("1.7.0")
    assert pick(per_torch, stable_wheel("1.7.0", imported)) == per_torch.filename  # same version: built for it
    assert pick(per_torch, stable_wheel("1.7.0", gpu_elsewhere)) == per_torch.filename  # tested on another torch
    assert pick(per_torch, stable_wheel("1.7.0", gpu)).startswith("ext-1.7.0+cu13-")  # kernel-tested on this one
    assert pick(per_torch, stable_wheel("1.8.0", imported)).startswith("ext-1.8.0+cu13-")  # newer wins
    assert pick(per_torch_wheel("1.7.0", kernel="passed"), stable_wheel("1.7.0", gpu)) == per_torch.filename


def test_the_way_forward_names_a_verified_torch_and_a_skipped_build(house: Wheelhouse) -> None:
    class Builds13:
        driver = Driver(version="580.65", cuda="13.0")

        def can_build(self, cuda: CudaVersion, platform: object = None) -> tuple[bool, str]:
            return cuda.major == 13, f"nvcc {cuda}" if cuda.major == 13 else f"no CUDA {cuda} compiler here"

    machine = Builds13()
    checks = (TorchCheck(torch="2.14.1", cuda="13.0", python="3.12.1", how="import+registration", status="passed"),
              TorchCheck(torch="2.15.0", cuda="13.2", python="3.12.1", how="import+registration", status="failed"))
    old = env("2.10.0+cu128", "12.8")
    choice = Choice("ext", (judge(stable_wheel("1.7.0", checks), old),), None)
    assert choice.verdicts[0].reasons  # refused: CUDA 12 and below the floor
    found = torch_for_this_machine([choice], machine, old)  # type: ignore[arg-type]
    assert found is not None and found[0] == "2.14.1" and str(found[1]) == "13.0"  # the failed 2.15 is no way
    reader, python = WheelhouseReader(house.root), Path("/envs/a/bin/python")
    refusal = ways_forward([choice], [choice], old, machine, reader, python, (), skipped="--no-build")  # type: ignore[arg-type]
    assert refusal.message.endswith("and this machine cannot build one: no CUDA 12.8 compiler here")
    assert any("or use torch 2.14.1 (a CUDA 13.0 build" in line for line in refusal.extra), refusal.extra
    new = env("2.16.0", "13.2")
    unverified = Choice("ext", (judge(stable_wheel("1.7.0", checks), new),), None)
    refusal = ways_forward([unverified], [unverified], new, machine, reader, python, (), skipped="--no-build")  # type: ignore[arg-type]
    assert refusal.message.endswith("and --no-build keeps this command from building one (this machine could, "
                                    "with nvcc 13.2)"), refusal.message
    assert any(line.endswith("not verified on torch 2.16 (verified: 2.14)") for line in refusal.extra), refusal.extra


# ---------------------------------------------------------------- doctor and install, run as a user runs them


@pytest.fixture(scope="module")
def user(house: Wheelhouse, tmp_path_factory: pytest.TempPathFactory) -> World:
    """Stand-in torches on a stand-in PyPI (so a resolver that wanted to swap torch could), the project folder
    with the builder's venv; the wheelhouse is ``house`` (given with --from)."""
    tmp = tmp_path_factory.mktemp("stable-user")
    return user_world(tmp, {"2.12.1": "13.0", "2.14.1": "13.0", "2.16.0": "13.2"}, columns="2000")


def builder(world: World, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(world.project / ".venv" / "bin" / "builder"), *args], cwd=world.project,
                          env=world.env, capture_output=True, text=True, timeout=300, check=False)


def test_doctor_and_install_take_the_stable_wheel_from_the_envs_channel(user: World, house: Wheelhouse) -> None:
    venv = make_venv(user, "t212", "2.12.1")
    python = str(venv / "bin" / "python")
    channel = f"{house.root.as_uri()}/channels/cu130torch2.12/simple/"
    doctor = builder(user, "doctor", "--python", python, "--from", str(house.root), "--json")
    assert doctor.returncode == 0, doctor.stderr
    report = json.loads(doctor.stdout)
    offer = {o["package"]: o for o in report["offers"]}["causal-conv1d"]
    assert offer["chosen"]["wheel"]["filename"] == STABLE and offer["index_url"] == channel
    assert offer["why"].startswith("the stable-ABI wheel verified on this env's torch 2.12 with CUDA 13.0")
    # issue 42: the checks ran on Python 3.12 (the record says), this env is the builder's own Python 3.11
    here = "{}.{}".format(*sys.version_info[:2])
    other = "" if here == "3.12" else (f" with Python 3.12; this env runs Python {here} (the same abi3 wheel, not run on "
                                       "that Python by the checks)")
    assert offer["why"].endswith(f"import+registration passed on torch 2.12.1{other}"), offer["why"]
    assert any(a.startswith(f"causal-conv1d: {STABLE} fits: the stable-ABI wheel verified on this env's torch 2.12")
               and a.endswith(channel) for a in report["advice"]), report["advice"]
    # issue 55 item 8: the uv line runs as printed (uv on PATH, else the uv that came with builder, by its path)
    uv_line = next(c for c in report["commands"] if " pip install " in c and c.split()[0].endswith("uv"))
    assert shutil.which(uv_line.split()[0]), uv_line
    assert f"--extra-index-url {channel}" in uv_line and "causal-conv1d==1.7.0+cu13" in uv_line
    assert "torch==2.12.1" in uv_line
    text = builder(user, "doctor", "--python", python, "--from", str(house.root))
    assert f"causal-conv1d: fits: {STABLE}" in text.stdout and channel in text.stdout, text.stdout

    done = builder(user, "install", "causal-conv1d", "--python", python, "--from", str(house.root), "--no-build")
    assert done.returncode == 0, done.stdout + done.stderr
    assert installed(venv, "causal-conv1d") == "1.7.0+cu13" and installed(venv, "torch") == "2.12.1"
    assert f"installed: {STABLE} (the stable-ABI wheel verified on this env's torch 2.12" in done.stdout, done.stdout
    assert "torch 2.12.1 in" in done.stdout and "unchanged" in done.stdout


def test_install_refuses_a_torch_the_stable_wheel_was_not_verified_on(user: World, house: Wheelhouse) -> None:
    venv = make_venv(user, "t216", "2.16.0")
    refused = builder(user, "install", "causal-conv1d", "--python", str(venv / "bin" / "python"), "--from",
                      str(house.root), "--no-build")
    assert refused.returncode == 12, refused.stdout + refused.stderr
    assert f"{STABLE}: not verified on torch 2.16 (verified: 2.11, 2.12, 2.13, 2.14, 2.15)" in refused.stderr
    assert installed(venv, "causal-conv1d") is None and installed(venv, "torch") == "2.16.0"
