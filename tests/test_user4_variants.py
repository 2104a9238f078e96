"""Issue 55 item 9: ``builder install`` and wheel variants. With the plain wheel installed already it swaps in the
thin one (uv alone keeps the installed file of the pinned version), its ``installed:`` line names the file uv
really installed, and a GPU no thin wheel matches (sm_100 on a 90+120 build), or the provider's override half set,
is warned about. Real uv, a real wheelhouse of a plain wheel and its variants, a stand-in torch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from builder.core import fatbin
from builder.core.settings import Settings
from builder.core.uvtool import uv_bin
from builder.index.store import Wheelhouse
from builder.model import variants
from builder.model.arch import Arch
from builder.model.cuda import CudaVersion
from builder.model.records import BuildRecord, VariantInfo
from builder.stages.finalize import finalize_wheel
from builder.stages.slicing import make_variant
from builder.user.fit import IndexedWheel
from builder.user.install import InstallRequest, install
from builder.user.installer import ProviderView, installed_states, matching_variant, variant_notes
from tests.test_user_install import stand_in_torch
from tests.test_variants import TWO_TUS, _elf, _plain_wheel

LABEL = "cu130torch2.14"


def house_with_variants(tmp: Path) -> Path:
    """A wheelhouse holding demo 1.0 as a plain wheel (SASS sm_90 + sm_120) and its sm90 and sm120 variants."""
    (tmp / "raw").mkdir()
    raw = _plain_wheel(tmp / "raw", _elf({fatbin.SECTION: TWO_TUS}))
    plain = finalize_wheel(raw, tmp / "final", label=LABEL, pins=["torch==2.14.1"],
                           build_record=BuildRecord(package="demo", version="1.0", archs=("90", "120")))
    house = Wheelhouse(tmp / "house")
    house.publish(plain, BuildRecord.from_json({"inspect": {"objects": [
        {"path": "demo/_C.so", "sass": ["sm_120", "sm_90"], "ptx": [], "needed": []}]}}))
    for arch in (90, 120):
        v = variants.Variant.for_build(Arch(arch), CudaVersion.parse("13.0"))
        house.publish(make_variant(plain, v, tmp / "variants"),
                      BuildRecord(package="demo", version="1.0", variant=VariantInfo(v.label, ("90", "120"),
                                                                                      v.properties())))
    return house.root


def wheel(labels: tuple[str, ...] = ("sm120", "sm90")) -> IndexedWheel:
    name = f"demo-1.0+{LABEL}-py3-none-any.whl"
    return IndexedWheel(filename=name, project="demo", version=Version(f"1.0+{LABEL}"), label=LABEL,
                        url=f"file:///w/{name}", wheelhouse="file:///w/", requires_python=None, requires=(),
                        sass=("sm_120", "sm_90"), ptx=(), kernel_tests="passed", variants=labels)


def test_the_provider_reads_the_force_variables_before_this_machine() -> None:
    forced = ProviderView.of({variants.FORCE_SM_ARCH: "10.0", variants.FORCE_DRIVER: "13.0"}, (120,), None)
    assert forced.gpus == (100,) and forced.driver_cuda == "13.0" and not forced.forced_arch_only
    assert ProviderView.of({}, (121,), "13.0").gpus == (121,)
    assert ProviderView.of({variants.FORCE_SM_ARCH: "12.0"}, (), None).forced_arch_only
    assert not ProviderView.of({variants.FORCE_SM_ARCH: "12.0"}, (), "13.0").forced_arch_only  # a driver to read


def test_the_variant_uv_picks_runs_on_the_gpu() -> None:
    assert matching_variant(wheel(), (120,)) == "sm120"
    assert matching_variant(wheel(), (121,)) == "sm120"  # SASS of 12.0 runs on 12.1
    assert matching_variant(wheel(), (90,)) == "sm90"
    assert matching_variant(wheel(), (100,)) is None


def test_a_gpu_no_thin_wheel_matches_is_warned_about() -> None:
    view = ProviderView.of({variants.FORCE_SM_ARCH: "10.0", variants.FORCE_DRIVER: "13.0"}, (), None)
    assert variant_notes([wheel()], view) == [
        "no thin wheel of demo matches sm_100 (NV_VARIANT_PROVIDER_FORCE_SM_ARCH=10.0; its variants: sm120, sm90): "
        "uv installs the plain wheel, whose code (sm_120, sm_90) does not run on sm_100"]
    assert variant_notes([wheel()], ProviderView.of({}, (120,), "13.0")) == []
    assert variant_notes([wheel(())], view) == []  # no variants: nothing for uv to pick
    half = variant_notes([wheel()], ProviderView.of({variants.FORCE_SM_ARCH: "12.0"}, (), None))
    assert len(half) == 1 and "NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION is not" in half[0]


@pytest.fixture(scope="module")
def house(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return house_with_variants(tmp_path_factory.mktemp("variants"))


def user_env(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A venv holding the stand-in torch 2.14.1; this process's environment reaches no index and no engine."""
    for name in [k for k in os.environ if k.startswith(("PIP_", "UV_", "VIRTUAL_ENV", "CONDA", "NV_"))]:
        monkeypatch.delenv(name)
    for name, value in {"UV_CACHE_DIR": str(tmp / "uv-cache"), "UV_NO_PROGRESS": "1",
                        "DOCKER_HOST": "unix:///nonexistent.sock"}.items():
        monkeypatch.setenv(name, value)
    venv = tmp / "venv"
    subprocess.run([uv_bin(), "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    subprocess.run([uv_bin(), "pip", "install", "-q", "--offline", "--python", str(venv / "bin" / "python"),
                    str(stand_in_torch(tmp / "torch", "2.14.1", "13.0"))], check=True)
    return venv / "bin" / "python"


def install_demo(house: Path, python: Path, tmp: Path, gpu: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """``builder install demo --from HOUSE --offline --no-build`` in this process, uv's provider told ``gpu``."""
    monkeypatch.setenv(variants.FORCE_SM_ARCH, gpu)
    monkeypatch.setenv(variants.FORCE_DRIVER, "13.0")
    settings = Settings.from_env({}, cache_dir=tmp / "cache", wheelhouse=house, offline=True)
    request = InstallRequest(packages=("demo",), python=python, source=str(house), build=False)
    return install(request, settings).summary()


def test_install_swaps_the_installed_plain_wheel_for_the_thin_one(
        house: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    python = user_env(tmp_path, monkeypatch)
    plain_channel = (house / "channels" / LABEL / "simple").as_uri()
    subprocess.run([uv_bin(), "pip", "install", "-q", "--offline", "--python", str(python), "--extra-index-url",
                    plain_channel, "demo==1.0+cu130torch2.14", "torch==2.14.1"], check=True)  # no flag: plain
    assert installed_states(python, ["demo"])["demo"].label is None
    lines = install_demo(house, python, tmp_path, "12.0", monkeypatch)
    said = capsys.readouterr()
    assert ("demo 1.0+cu130torch2.14 is installed as the plain wheel: --reinstall-package demo, so uv can take the "
            "sm120 variant (NV_VARIANT_PROVIDER_FORCE_SM_ARCH=12.0)") in said.out + said.err
    assert installed_states(python, ["demo"])["demo"].label == "sm120"
    assert f"installed: demo-1.0+{LABEL}-py3-none-any-sm120.whl" in lines


def test_install_warns_when_no_thin_wheel_matches_the_gpu(
        house: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    python = user_env(tmp_path, monkeypatch)
    lines = install_demo(house, python, tmp_path, "10.0", monkeypatch)
    said = capsys.readouterr()
    assert "warning: no thin wheel of demo matches sm_100" in said.out + said.err
    assert installed_states(python, ["demo"])["demo"].label is None
    assert f"installed: demo-1.0+{LABEL}-py3-none-any.whl" in lines
