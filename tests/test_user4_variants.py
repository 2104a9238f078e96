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
from builder.core.uvtool import uv_bin
from builder.index.store import Wheelhouse
from builder.model import variants
from builder.model.arch import Arch
from builder.model.cuda import CudaVersion
from builder.model.records import BuildRecord, VariantInfo
from builder.stages.finalize import finalize_wheel
from builder.stages.variants import make_variant
from builder.user.fit import IndexedWheel
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


def user_env(tmp: Path) -> tuple[Path, dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "VIRTUAL_ENV", "CONDA", "NV_"))}
    env.update(UV_CACHE_DIR=str(tmp / "uv-cache"), UV_NO_PROGRESS="1", BUILDER_CACHE_DIR=str(tmp / "cache"),
               DOCKER_HOST="unix:///nonexistent.sock", COLUMNS="200")
    venv = tmp / "venv"
    subprocess.run([uv_bin(), "venv", "-q", "--python", sys.executable, str(venv)], check=True, env=env)
    subprocess.run([uv_bin(), "pip", "install", "-q", "--offline", "--python", str(venv / "bin" / "python"),
                    str(stand_in_torch(tmp / "torch", "2.14.1", "13.0"))], check=True, env=env)
    return venv / "bin" / "python", env


def test_install_swaps_the_installed_plain_wheel_for_the_thin_one(house: Path, tmp_path: Path) -> None:
    python, env = user_env(tmp_path)
    plain_channel = (house / "channels" / LABEL / "simple").as_uri()
    subprocess.run([uv_bin(), "pip", "install", "-q", "--offline", "--python", str(python), "--extra-index-url",
                    plain_channel, "demo==1.0+cu130torch2.14", "torch==2.14.1"], check=True, env=env)  # no flag: plain
    assert installed_states(python, ["demo"])["demo"].label is None
    forced = {**env, variants.FORCE_SM_ARCH: "12.0", variants.FORCE_DRIVER: "13.0"}
    done = subprocess.run([sys.executable, "-m", "builder", "install", "demo", "--python", str(python), "--from",
                           str(house), "--offline", "--no-build"], env=forced, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert ("demo 1.0+cu130torch2.14 is installed as the plain wheel: --reinstall-package demo, so uv can take the "
            "sm120 variant (NV_VARIANT_PROVIDER_FORCE_SM_ARCH=12.0)") in done.stderr
    assert installed_states(python, ["demo"])["demo"].label == "sm120"
    assert f"installed: demo-1.0+{LABEL}-py3-none-any-sm120.whl" in done.stdout.splitlines()


def test_install_warns_when_no_thin_wheel_matches_the_gpu(house: Path, tmp_path: Path) -> None:
    python, env = user_env(tmp_path)
    forced = {**env, variants.FORCE_SM_ARCH: "10.0", variants.FORCE_DRIVER: "13.0"}
    done = subprocess.run([sys.executable, "-m", "builder", "install", "demo", "--python", str(python), "--from",
                           str(house), "--offline", "--no-build"], env=forced, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert "warning: no thin wheel of demo matches sm_100" in done.stderr
    assert installed_states(python, ["demo"])["demo"].label is None
    assert f"installed: demo-1.0+{LABEL}-py3-none-any.whl" in done.stdout.splitlines()
