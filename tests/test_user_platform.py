"""Issue 27: the user's side carries the CPU platform. An aarch64 env (GH200, DGX Spark) takes no x86_64 wheel and is
told so by platform; install's refusal and its build fallback (a cross build here) carry ``--platform``; doctor names
the env's platform; the probe runs another platform's interpreter under qemu-user.

No aarch64 Python is needed: the env is a probe result given by hand (an EnvReport for machine aarch64 with aarch64
tags), as ``builder.user.envprobe.probe_env`` would return it for one run under qemu-aarch64.
"""

from __future__ import annotations

import json
import os
import struct
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from builder.cli.main import main as cli_main
from builder.core.errors import InstallError, ToolchainError
from builder.core.settings import Settings
from builder.index.store import Wheelhouse
from builder.model.cuda import CudaVersion
from builder.model.platform import AARCH64, X86_64
from builder.model.records import BuildRecord
from builder.user.choice import Choice
from builder.user.envprobe import (
    EnvReport,
    GpuDevice,
    PackageReport,
    PythonInfo,
    TorchInfo,
    TransformersInfo,
    probe_env,
)
from builder.user.fit import EnvFacts, best, env_facts, judge
from builder.user.install import InstallRequest, install, planned_builds
from builder.user.interpreter import interpreter_argv, interpreter_platform
from builder.user.machine import Driver, MachineFacts
from builder.user.wheelhouse import WheelhouseReader
from tests.test_index import labelled_wheel

CC = "causal-conv1d"
PY = Path("/srv/arm-env/bin/python")  # the env's interpreter: never run (the probe result is given by hand)
X86_TAGS = frozenset({"cp312-cp312-manylinux_2_28_x86_64", "cp312-cp312-linux_x86_64", "cp312-abi3-linux_x86_64",
                      "cp312-none-any", "py3-none-any"})
ARM_TAGS = frozenset(t.replace("x86_64", "aarch64") for t in X86_TAGS)
ARM_ENV = EnvFacts(python="3.12.3", tags=ARM_TAGS, torch="2.14.1", torch_cuda="13.0", machine="aarch64")
X86_ENV = EnvFacts(python="3.12.3", tags=X86_TAGS, torch="2.14.1", torch_cuda="13.0", gpus=(90,))
H200 = Driver(gpus=(GpuDevice(0, "NVIDIA H200", (9, 0)),), version="580.65", cuda="13.0")


def aarch64_report(machine: str = "aarch64", devices: tuple[GpuDevice, ...] = (), packages: tuple[str, ...] = (CC,),
                   ) -> EnvReport:
    """What the probe says of an aarch64 venv with PyPI's CUDA 13.0 torch 2.14.1, run under qemu (no GPU seen)."""
    tags = ARM_TAGS if machine == "aarch64" else X86_TAGS
    python = PythonInfo(version="3.12.3", minor="3.12", executable=PY, implementation="cpython", is_venv=True,
                        prefix=PY.parent.parent, base_prefix=Path("/usr"), purelib=Path("/srv/arm-env/site"),
                        platlib=Path("/srv/arm-env/site"), machine=machine, glibc="2.39",
                        tags=tuple(sorted(tags)), tags_source="packaging")
    torch = TorchInfo(installed=True, version="2.14.1+cu130", distribution="2.14.1", cuda="13.0",
                      file=Path("/srv/arm-env/site/torch/__init__.py"), cuda_available=bool(devices),
                      device_count=len(devices), devices=devices, arch_list=(), error=None)
    reports = tuple(PackageReport(name, False, None, None, None, (), (), None, ()) for name in packages)
    transformers = TransformersInfo(False, None, "No module named 'transformers'", None, (), (), ())
    return EnvReport(python, torch, reports, transformers, ())


def probed(machine: str = "aarch64"):  # type: ignore[no-untyped-def]
    """A stand-in for probe_env: the hand-given report, with a (not installed) entry for each package asked."""
    return lambda python, packages=(), **kw: aarch64_report(machine, packages=tuple(p.distribution for p in packages))


def machine(tmp_path: Path, *, nvcc: bool = True, cross_gxx: bool = True, driver: Driver | None = None,
            engine: str | None = None) -> MachineFacts:
    """This (x86_64) machine: a CUDA 13.0 nvcc or none, and the cross tools (toolchain/cross.find_tools) on its
    PATH or not."""
    bin_dir = tmp_path / "machine-bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    if cross_gxx:
        for tool in ("aarch64-linux-gnu-gcc", "aarch64-linux-gnu-g++", "qemu-aarch64-static"):
            fake_executable(bin_dir / tool)
    host = (True, "host nvcc 13.0 (/usr/local/cuda-13.0)") if nvcc else (False, "no CUDA 13.0 nvcc here")
    answers = {"13.0": (True, "docker image cuda-13.0") if engine else host, "13.0 --toolchain host": host,
               "13.0 --toolchain pip": (False, "no pip toolkit cached")}
    return MachineFacts(driver or Driver(), (), engine, Settings.from_env({}, cache_dir=tmp_path / "cache"), {"PATH": str(bin_dir)},
                        answers)


def fake_executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def fake_elf(path: Path, e_machine: int) -> Path:
    """The first bytes of an ELF executable for ``e_machine`` (0xB7 AArch64), enough for the header to be read."""
    path.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack("<HH", 2, e_machine) + bytes(44))
    path.chmod(0o755)
    return path


def record(sass: list[str], platform: str | None = None) -> BuildRecord:
    return BuildRecord.from_json({"inspect": {"objects": [{"path": "c.so", "sass": sass, "ptx": [], "needed": []}]},
                                  "cuda": "13.0", **({"platform": platform} if platform else {})})


@pytest.fixture(scope="module")
def house(tmp_path_factory: pytest.TempPathFactory) -> Wheelhouse:
    """causal-conv1d for x86_64 only; fla-core pure Python; mamba-ssm for both platforms, in one channel."""
    tmp = tmp_path_factory.mktemp("platform")
    house = Wheelhouse(tmp / "wh")
    pin = ("torch==2.14.1",)
    house.publish(labelled_wheel(tmp, CC, "1.7.0", "cu130torch2.14", pins=pin, tag="cp312-cp312-linux_x86_64"),
                  record(["sm_90", "sm_120"]))
    house.publish(labelled_wheel(tmp, "fla-core", "0.6.0", "cu130torch2.14", pins=pin), BuildRecord.from_json({}))
    for tag, platform in (("cp312-cp312-manylinux_2_28_x86_64", None), ("cp312-cp312-manylinux_2_28_aarch64", "aarch64"),
                          ("cp311-cp311-manylinux_2_28_x86_64", None)):
        house.publish(labelled_wheel(tmp, "mamba-ssm", "2.3.2", "cu130torch2.14", pins=pin, tag=tag),
                      record(["sm_90", "sm_121"], platform))
    return house


# ---------------------------------------------------------------------------------------------------- fit


def test_an_x86_64_wheel_never_fits_an_aarch64_env_and_the_reason_names_the_platform(house: Wheelhouse) -> None:
    (verdict,) = [judge(w, ARM_ENV) for w in WheelhouseReader(house.root).wheels(CC)]
    assert not verdict.fits
    assert verdict.reasons == ("an x86_64 wheel (linux_x86_64); this env is aarch64",)  # not "not Python 3.12.3"


def test_each_platform_gets_its_own_wheel_from_one_channel(house: Wheelhouse) -> None:
    wheels = WheelhouseReader(house.root).wheels("mamba-ssm")
    assert {w.platforms for w in wheels} == {("x86_64",), ("aarch64",)}
    arm = best([judge(w, ARM_ENV) for w in wheels])
    assert arm is not None and arm.wheel.filename.endswith("-cp312-cp312-manylinux_2_28_aarch64.whl")
    x86 = [judge(w, X86_ENV) for w in wheels]
    chosen = best(x86)
    assert chosen is not None and chosen.wheel.filename.endswith("-cp312-cp312-manylinux_2_28_x86_64.whl")
    refused = {v.wheel.filename.rsplit("-", 3)[1] + "/" + v.wheel.platforms[0]: v.reasons for v in x86 if not v.fits}
    assert refused["cp312/aarch64"] == ("an aarch64 wheel (manylinux_2_28_aarch64); this env is x86_64",)
    # wrong Python and wrong platform at once: both are said
    (cp311,) = [judge(w, ARM_ENV).reasons for w in wheels if "cp311" in w.filename]
    assert cp311 == ("an x86_64 wheel (manylinux_2_28_x86_64); this env is aarch64", "built for cp311, not Python 3.12.3")
    # a channel holds both platforms' files (as PyPI does): the installer picks by tag
    assert {w.index_url_for(ARM_ENV) for w in wheels} == {house.root.as_uri() + "/channels/cu130torch2.14/simple/"}


def test_a_pure_python_wheel_fits_every_platform(house: Wheelhouse) -> None:
    (wheel,) = WheelhouseReader(house.root).wheels("fla-core")
    assert wheel.platforms == () and judge(wheel, ARM_ENV).fits and judge(wheel, X86_ENV).fits


def test_env_facts_take_the_platform_from_the_probe_and_not_this_machines_gpus(tmp_path: Path) -> None:
    arm = env_facts(aarch64_report(), machine(tmp_path, driver=H200))
    assert arm.machine == "aarch64" and arm.platform is AARCH64 and arm.cross
    assert arm.gpus == (), "nvidia-smi's H200 is this x86_64 machine's, not the GPU of an env run here under qemu"
    x86 = env_facts(aarch64_report("x86_64"), machine(tmp_path, driver=H200))
    assert x86.machine == "x86_64" and x86.platform is X86_64 and not x86.cross and x86.gpus == (90,)
    gh200 = aarch64_report(devices=(GpuDevice(0, "NVIDIA GH200 480GB", (9, 0)),))  # run on a GH200 itself
    assert env_facts(gh200, machine(tmp_path)).gpus == (90,)
    assert env_facts(aarch64_report("arm64"), machine(tmp_path)).machine == "aarch64"  # macOS spelling
    assert env_facts(aarch64_report("ppc64le"), machine(tmp_path)).platform is None


# ------------------------------------------------------------------------------------------------ machine


def test_a_cross_build_needs_nvcc_and_the_platforms_cross_gxx(tmp_path: Path) -> None:
    cuda = CudaVersion.parse("13.0")
    can, how = machine(tmp_path / "a").can_build(cuda, AARCH64)
    assert can and how == "host nvcc 13.0 (/usr/local/cuda-13.0), cross-compiled for aarch64 with aarch64-linux-gnu-g++"
    assert machine(tmp_path / "a").can_build(cuda, X86_64) == (True, "host nvcc 13.0 (/usr/local/cuda-13.0)")
    no_gxx = machine(tmp_path / "b", cross_gxx=False)
    assert no_gxx.can_build(cuda, AARCH64) == (
        False, "a cross build needs aarch64-linux-gnu-gcc, aarch64-linux-gnu-g++, qemu-aarch64 (or qemu-aarch64-static), not found on PATH "
               "(apt-get install g++-aarch64-linux-gnu, and qemu-user from bookworm-backports (10.0; Debian 12's 7.2 "
               "crashes in torch >= 2.13), as root; .ci/run does)")
    assert "13.0 aarch64" in no_gxx.answered(), "the doctor's JSON lists the cross answer beside the native one"
    assert machine(tmp_path / "c", nvcc=False).can_build(cuda, AARCH64) == (
        False, "no CUDA 13.0 nvcc here (a cross build runs on this machine's own toolkit: --toolchain host or pip)")
    # with a container engine, `auto` means docker here, which builds for x86_64 only: the cross build takes host
    docker = machine(tmp_path / "d", engine="unix:///run/docker.sock")
    assert docker.can_build(cuda) == (True, "docker image cuda-13.0") and docker.cross_toolchain(cuda) == "host"
    assert docker.can_build(cuda, AARCH64)[1].startswith("host nvcc 13.0 (/usr/local/cuda-13.0), cross-compiled")


# ------------------------------------------------------------------------------------------------ install


@pytest.fixture
def arm_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """install() and diagnose() get the hand-given aarch64 probe result instead of running PY."""
    monkeypatch.setattr("builder.user.install.probe_env", probed())
    monkeypatch.setattr("builder.user.doctor.probe_env", probed())


def settings(tmp_path: Path) -> Settings:
    return Settings.from_env({}, cache_dir=tmp_path / "cache", wheelhouse=tmp_path / "local-wh")


def test_install_refuses_an_x86_64_only_wheelhouse_for_an_aarch64_env(
        house: Wheelhouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arm_env: None) -> None:
    monkeypatch.setattr("builder.user.install.machine_facts", lambda env, s: machine(tmp_path))
    request = InstallRequest(packages=(CC,), python=PY, source=str(house.root), build=False)
    with pytest.raises(InstallError) as caught:
        install(request, settings(tmp_path))
    error = caught.value
    assert error.message.startswith(f"no {CC} wheel fits {PY}: the wheelhouse has {CC} only for x86_64; this env is "
                                    "aarch64 (torch 2.14.1, CUDA 13.0, Python 3.12.3, aarch64) and --no-build keeps "
                                    "this command from building one (this machine could, with host nvcc 13.0"), error
    hint = " ".join(error.extra)
    assert (f"hint: cross-build it on this machine: `builder build {CC} --platform aarch64 --cuda 13.0 --arch \"<your "
            "GPU's arch, e.g. 90 (GH200), 100 (GB200), 121 (DGX Spark / GB10)>\" --python 3.12 --torch 2.14.1`") in hint
    assert "an x86_64 wheel (linux_x86_64); this env is aarch64" in hint
    assert "or use torch" not in hint, "no x86_64 wheel's torch is a way forward for an aarch64 env"


def test_without_a_cross_compiler_the_way_forward_names_what_it_takes(
        house: Wheelhouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arm_env: None) -> None:
    monkeypatch.setattr("builder.user.install.machine_facts", lambda env, s: machine(tmp_path, cross_gxx=False))
    request = InstallRequest(packages=(CC,), python=PY, source=str(house.root), arch="121")
    with pytest.raises(InstallError) as caught:
        install(request, settings(tmp_path))
    assert "this machine cannot build one: a cross build needs aarch64-linux-gnu-gcc" in caught.value.message
    assert (f"hint: on a machine with a CUDA 13.0 toolkit and aarch64-linux-gnu-g++ (a cross build), or an aarch64 "
            f"one: `builder build {CC} --platform aarch64 --cuda 13.0 --arch 121 --python 3.12 --torch 2.14.1`"
            ) in " ".join(caught.value.extra)


def test_the_build_fallback_cross_builds_for_the_envs_platform(
        house: Wheelhouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arm_env: None) -> None:
    monkeypatch.setattr("builder.user.install.machine_facts", lambda env, s: machine(tmp_path))
    targets = []

    class Built:
        status, wheel = "built", "causal_conv1d-1.7.0+cu130torch2.14-cp312-cp312-manylinux_2_28_aarch64.whl"

    def run_build(target, settings, options):  # type: ignore[no-untyped-def]
        targets.append(target)
        return Built()

    monkeypatch.setattr("builder.user.install.run_build", run_build)
    request = InstallRequest(packages=(CC,), python=PY, source=str(house.root), arch="121")
    with pytest.raises(InstallError):  # the stand-in build published nothing, so nothing fits afterwards either
        install(request, settings(tmp_path))
    (target,) = targets
    assert target.platform is AARCH64 and [a.number for a in target.archs] == [121] and target.toolchain == "host"
    assert (str(target.cuda), str(target.python), target.torch) == ("13.0", "3.12", "2.14.1")


def test_the_build_fallback_asks_for_an_arm_machines_arch(
        house: Wheelhouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, arm_env: None) -> None:
    monkeypatch.setattr("builder.user.install.machine_facts", lambda env, s: machine(tmp_path, driver=H200))
    with pytest.raises(InstallError) as caught:
        install(InstallRequest(packages=(CC,), python=PY, source=str(house.root)), settings(tmp_path))
    assert caught.value.message == "no GPU here to take the aarch64 wheel's arch from (this env runs here under qemu)"
    assert "--arch 121 (DGX Spark / GB10)" in (caught.value.hint or "")


def test_dry_run_plans_carry_the_platform_for_gpu_code_only(tmp_path: Path) -> None:
    missing = [Choice(CC, (), None), Choice("fla-core", (), None)]
    request = InstallRequest(packages=(CC, "fla-core"), python=PY, source="wh", arch="90,121", dry_run=True)
    plans = planned_builds(missing, ARM_ENV, "3.12", machine(tmp_path), request, settings(tmp_path))
    only_own = " --no-torch-range"  # install checks a wheel it builds beside the env's torch only (issue 55 item 3)
    assert plans == (f"builder build {CC} --platform aarch64 --cuda 13.0 --arch 90,121 --python 3.12 --torch 2.14.1"
                     + only_own, "builder build fla-core --cuda 13.0 --python 3.12 --torch 2.14.1" + only_own)
    docker = machine(tmp_path / "docker", engine="unix:///run/docker.sock")
    assert planned_builds(missing[:1], ARM_ENV, "3.12", docker, request, settings(tmp_path)) == (
        f"builder build {CC} --platform aarch64 --toolchain host --cuda 13.0 --arch 90,121 --python 3.12 --torch 2.14.1"
        + only_own,)
    native = planned_builds(missing[:1], X86_ENV, "3.12", machine(tmp_path), request, settings(tmp_path))
    assert native == (f"builder build {CC} --cuda 13.0 --arch 90,121 --python 3.12 --torch 2.14.1{only_own}",)


def test_the_cli_refusal_is_one_line(house: Wheelhouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str], arm_env: None) -> None:
    monkeypatch.setattr("builder.user.install.machine_facts", lambda env, s: machine(tmp_path))
    venv = tmp_path / "arm-env"
    (venv / "bin").mkdir(parents=True)
    fake_elf(venv / "bin" / "python", 0xB7)  # --python must exist; what it holds is the hand-given probe result
    code = cli_main(["install", CC, "--python", str(venv), "--from", str(house.root), "--no-build",
                     "--cache-dir", str(tmp_path / "cache")])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 12 and len(errors) == 1 and "Traceback" not in err, err
    assert f"the wheelhouse has {CC} only for x86_64; this env is aarch64" in errors[0]
    assert f"builder build {CC} --platform aarch64 --cuda 13.0" in err


# ------------------------------------------------------------------------------------------------- doctor


def test_doctor_names_the_platform_in_text_and_json(house: Wheelhouse, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str], arm_env: None) -> None:
    monkeypatch.setattr("builder.user.doctor.machine_facts", lambda env, s: machine(tmp_path, driver=H200))
    venv = tmp_path / "arm-env"
    (venv / "bin").mkdir(parents=True)
    fake_elf(venv / "bin" / "python", 0xB7)
    args = ["doctor", "--python", str(venv), "--from", str(house.root), "--cache-dir", str(tmp_path / "cache")]
    assert cli_main(args) == 0
    text = " ".join(capsys.readouterr().out.split())  # the table wraps at the console's width
    assert ("platform aarch64 (run here under qemu; this machine is x86_64: its wheels are cross-built here, "
            "builder build … --platform aarch64)") in text, text
    assert "none visible to this env" in text and "NVIDIA H200" not in text
    assert "build here CUDA 13.0 aarch64 wheels: yes, with host nvcc 13.0" in text
    assert "not causal_conv1d-1.7.0+cu130torch2.14-cp312-cp312-linux_x86_64.whl: an x86_64 wheel (linux_x86_64); " \
           "this env is aarch64" in text
    assert (f"{CC}: no wheel for aarch64 and cu130torch2.14 in the wheelhouse; this machine can build one with host "
            "nvcc 13.0") in text and "(cross-builds it: builder build … --platform aarch64)" in text
    assert cli_main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["platform"] == {"env": "aarch64", "this_machine": "x86_64", "cross": True, "known": True}
    assert data["facts"]["machine"] == "aarch64" and data["env"]["python"]["machine"] == "aarch64"
    assert data["machine"]["builds"]["13.0 aarch64"]["possible"] is True


def test_doctor_on_this_machines_platform_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("builder.user.doctor.probe_env", probed("x86_64"))
    monkeypatch.setattr("builder.user.doctor.machine_facts", lambda env, s: machine(tmp_path, driver=H200))
    assert cli_main(["doctor", "--python", sys.executable, "--cache-dir", str(tmp_path / "cache"),
                     "--from", str(tmp_path / "none")]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "platform x86_64 (this machine's)" in text and "NVIDIA H200 (sm_90)" in text


# ------------------------------------------------------------------------------------------ the env probe


def test_another_platforms_interpreter_runs_under_qemu(tmp_path: Path) -> None:
    arm = fake_elf(tmp_path / "python3.12", 0xB7)
    assert interpreter_platform(arm) is AARCH64 and interpreter_platform(fake_elf(tmp_path / "x", 0x3E)) is X86_64
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    assert interpreter_argv(arm, {"PATH": str(bin_dir)}) == [str(arm)]  # no qemu: binfmt_misc may still run it
    qemu = fake_executable(bin_dir / "qemu-aarch64-static")
    assert interpreter_argv(arm, {"PATH": str(bin_dir)}) == [str(qemu), str(arm)]
    assert interpreter_argv(Path(sys.executable), {"PATH": str(bin_dir)}) == [sys.executable]


def test_an_aarch64_interpreter_without_qemu_says_what_runs_it(tmp_path: Path) -> None:
    arm = fake_elf(tmp_path / "python", 0xB7)
    with pytest.raises(ToolchainError) as caught:
        probe_env(arm, env={"PATH": str(tmp_path)})
    assert f"Python {arm} cannot run" in caught.value.message
    assert "it is an aarch64 interpreter and this machine is x86_64: install qemu-user-static (qemu-aarch64)" in (
        caught.value.hint or "")


def test_the_probe_runs_through_qemu_and_reports_its_machine(tmp_path: Path) -> None:
    """The probe's argv for an aarch64 interpreter starts with qemu: a stand-in qemu that runs this machine's Python
    instead, so the probe answers (the real qemu run is in the issue's closing note)."""
    arm = fake_elf(tmp_path / "python", 0xB7)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "qemu.log"
    fake_executable(bin_dir / "qemu-aarch64", f'#!/bin/sh\necho "$1" > {log}\nshift\nexec {sys.executable} "$@"\n')
    report = probe_env(arm, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert log.read_text().strip() == str(arm)
    assert replace(report.python, machine="aarch64").platform is AARCH64


def test_a_manylinux_tag_newer_than_the_envs_glibc_is_said_so(house: Wheelhouse) -> None:
    old_glibc = replace(X86_ENV, tags=frozenset({"cp312-cp312-manylinux_2_17_x86_64", "cp312-cp312-linux_x86_64",
                                                 "py3-none-any"}))
    reasons = {w.filename: judge(w, old_glibc).reasons for w in WheelhouseReader(house.root).wheels("mamba-ssm")}
    assert reasons["mamba_ssm-2.3.2+cu130torch2.14-cp312-cp312-manylinux_2_28_x86_64.whl"] == (
        "its platform tag (manylinux_2_28_x86_64) is none this env takes (an older glibc, or not glibc)",)


def test_a_failing_run_under_qemu_names_qemu_and_the_sysroot(tmp_path: Path) -> None:
    arm = fake_elf(tmp_path / "python", 0xB7)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    qemu = fake_executable(bin_dir / "qemu-aarch64", "#!/bin/sh\necho 'qemu-aarch64: Could not open /lib/ld-linux-"
                           "aarch64.so.1: No such file or directory' >&2\nexit 255\n")
    with pytest.raises(ToolchainError) as caught:
        probe_env(arm, env={"PATH": str(bin_dir)})
    assert caught.value.message == (f"Python {arm} failed the environment probe under qemu-aarch64 (exit 255): "
                                    "qemu-aarch64: Could not open /lib/ld-linux-aarch64.so.1: No such file or directory")
    assert caught.value.hint == (f"check that it starts: {qemu} {arm} -c pass; set QEMU_LD_PREFIX to that env's "
                                 "sysroot (the folder holding its lib/ld-linux-*.so.1)")


def test_an_unpacked_interpreter_runs_with_its_sysroot(tmp_path: Path) -> None:
    """The cross build's target Python (``sysroots/debian-12-aarch64-python3.11/usr/bin/python3.11``) and a venv
    made from it run under ``qemu -L SYSROOT``; QEMU_LD_PREFIX, where set, is left to decide."""
    root = tmp_path / "sysroots" / "debian-12-aarch64-python3.11"
    (root / "lib").mkdir(parents=True)
    (root / "lib" / "ld-linux-aarch64.so.1").write_bytes(b"")
    (root / "usr" / "bin").mkdir(parents=True)
    python = fake_elf(root / "usr" / "bin" / "python3.11", 0xB7)
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(python)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    qemu = str(fake_executable(bin_dir / "qemu-aarch64-static"))
    assert interpreter_argv(python, {"PATH": str(bin_dir)}) == [qemu, "-L", str(root), str(python)]
    assert interpreter_argv(venv / "python", {"PATH": str(bin_dir)}) == [qemu, "-L", str(root), str(venv / "python")]
    assert interpreter_argv(python, {"PATH": str(bin_dir), "QEMU_LD_PREFIX": "/x"}) == [qemu, str(python)]
