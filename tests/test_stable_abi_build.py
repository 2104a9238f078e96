"""A stable-ABI build end to end, on tinyext ported to LibTorch's stable ABI (tests/fixtures/patches/tinyext/
0003-stable-abi.patch, recipe in tests/fixtures/recipes-stable): real nvcc compile against torch 2.14.1 with a 2.11
floor, a cp310-abi3 wheel labelled +cu13 that requires torch>=2.11, the stable-ABI inspection (nm, abi3audit), the
torch-range check (the local torch index holds 2.14.1 only: one check), the channel it lands in, and real pip and
uv installs from that channel into an env whose torch is not touched.

Same local parts as tests/test_e2e.py (host nvcc 13.0, torch 2.14.1 for Python 3.11 on disk); says why it skipped
without them. The range over PyPI's torches (2.11–2.15) is shown in docs/BUILDS.md with causal-conv1d.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from builder.core.uvtool import uv_bin
from tests.helpers import FIXTURES, LOCAL_TORCH_INDEX, local_cuda_path_missing, run_cli

pytestmark = pytest.mark.e2e
missing = local_cuda_path_missing()
if missing:
    pytestmark = [pytest.mark.e2e, pytest.mark.skip(reason=f"skipped: {missing}")]

WHEEL = "tinyext-0.1.0+cu13-cp310-abi3-linux_x86_64.whl"
ARGS = ["build", "tinyext", "--recipes", str(FIXTURES / "recipes-stable"), "--cuda", "13.0", "--arch", "90",
        "--python", "3.11", "--torch", "2.14.1", "--torch-index", str(LOCAL_TORCH_INDEX), "--toolchain", "host"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("stable")
    env = {"BUILDER_CACHE_DIR": str(base / "cache"), "BUILDER_WHEELHOUSE": str(base / "wheelhouse")}
    return {"base": base, "env": env, "result": run_cli(*ARGS, "--variants", env=env)}


def test_one_abi3_wheel_labelled_by_cuda_major_requiring_the_floor(built: dict) -> None:
    result, house = built["result"], built["base"] / "wheelhouse"
    assert result.code == 0, result.stderr[-3000:]
    wheel = house / "wheels" / WHEEL
    assert wheel.is_file(), sorted(p.name for p in (house / "wheels").iterdir())
    with zipfile.ZipFile(wheel) as zf:
        info = "tinyext-0.1.0+cu13.dist-info"
        metadata = zf.read(f"{info}/METADATA").decode()
        inside = json.loads(zf.read(f"{info}/cuda_wheel_builder.json"))
        assert "tinyext/_C.abi3.so" in zf.namelist()
    assert "Requires-Dist: torch>=2.11" in metadata and "torch==" not in metadata
    # the fixture's setup.py says >=3.9, as causal-conv1d's does; cp310-abi3 and torch 2.11 need 3.10
    assert "Requires-Python: >=3.10\n" in metadata and ">=3.9" not in metadata
    page = (house / "channels" / "cu130torch2.14" / "simple" / "tinyext" / "index.html").read_text()
    assert 'data-requires-python="&gt;=3.10"' in page
    assert '<p class="summary" id="summary">1 wheel of 1 package: ' in (house / "index.html").read_text()
    assert inside["abi"] == "torch-stable" and inside["torch_floor"] == "2.11"
    assert "0003-stable-abi.patch" in [p["file"] for p in inside["patches"]]
    assert "stable-ABI check passed: no torch C++ imports" in result.stderr and "abi3audit clean" in result.stderr


def test_a_one_arch_wheel_gets_no_variants_and_a_line_saying_so(built: dict) -> None:
    """Issue 42: `--variants` on a one-arch build, and `builder variants` on its wheel, made a thin wheel holding
    the same SASS as the plain one (a copy). Now neither makes one, and each says why in one line."""
    note = f"no variants of {WHEEL}: it holds one arch (sm_90), so its variant would be a copy of it"
    house = built["base"] / "wheelhouse"
    assert note in built["result"].stderr, built["result"].stderr[-2000:]
    assert [p.name for p in (house / "wheels").glob("*.whl")] == [WHEEL]
    again = run_cli(*ARGS, "--variants", env=built["env"])  # unchanged: no "build it again with --force" advice
    assert again.code == 0 and note in again.stderr and "published without its variants" not in again.stderr
    staged = run_cli("variants", "tinyext", "--recipes", str(FIXTURES / "recipes-stable"), env=built["env"])
    assert staged.code == 0 and note in staged.stderr, staged.stderr[-2000:]
    assert not list((house / "staging" / "wheels").glob("*.whl"))


def test_the_torch_range_check_lands_the_wheel_in_the_channel_of_the_torch_it_passed(built: dict) -> None:
    house = built["base"] / "wheelhouse"
    record = json.loads((house / "records" / f"{WHEEL}.json").read_text())
    (check,) = record["torch_checks"]  # the local index holds one torch
    assert (check["torch"], check["cuda"], check["how"], check["status"]) == ("2.14.1", "13.0",
                                                                              "import+registration", "passed")
    assert "1 op registered with CUDA kernels (axpy)" in check["detail"]
    channel = house / "channels" / "cu130torch2.14" / "simple" / "tinyext" / "index.html"
    assert f"{WHEEL}#sha256=" in channel.read_text()
    assert not (house / "channels" / "cu13").exists()  # the label is no channel: the torches are
    # the channel's URL names the fixed link, never the generation it points at (index/layout.py)
    assert f"(channel: {(house.resolve() / 'channels' / 'cu130torch2.14' / 'simple').as_uri()})" in built["result"].stderr


def test_the_nm_check_refuses_a_wheel_that_imports_torch_cxx(built: dict, tmp_path: Path) -> None:
    """The per-torch build of the same sources imports c10/at symbols: the stable report says so."""
    from builder.stages.inspection import stable_abi_report

    wheel = built["base"] / "wheelhouse" / "wheels" / WHEEL
    with zipfile.ZipFile(wheel) as zf:
        so = zf.read("tinyext/_C.abi3.so")
    good = stable_abi_report(wheel, {"tinyext/_C.abi3.so": so}, ("cp310-abi3-linux_x86_64",))
    assert good.problems() == [] and any(s.startswith("aoti_torch_") for s in good.shim_imports)
    per_torch = run_cli(*ARGS[:3], str(FIXTURES / "recipes"), *ARGS[4:], "--abi", "per-torch",
                        env={**built["env"], "BUILDER_WHEELHOUSE": str(tmp_path / "wh")})
    assert per_torch.code == 0, per_torch.stderr[-2000:]
    (plain,) = (tmp_path / "wh" / "wheels").glob("*.whl")
    with zipfile.ZipFile(plain) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".so"))
        report = stable_abi_report(plain, {name: zf.read(name)}, ("cp311-cp311-linux_x86_64",))
    problems = report.problems()
    assert any("torch C++ symbols" in p and "_ZN" in p for p in problems) and "its tag is not abi3" in problems


def test_pip_and_uv_install_it_from_the_channel_and_leave_torch_alone(built: dict, tmp_path: Path) -> None:
    house = built["base"] / "wheelhouse"
    channel = (house.resolve() / "channels" / "cu130torch2.14" / "simple").as_uri()  # through the link
    venv = tmp_path / "env"
    subprocess.run([uv_bin(), "venv", "-q", "--seed", "--python", "3.11", str(venv)], check=True)  # with pip
    py = str(venv / "bin" / "python")
    subprocess.run([uv_bin(), "pip", "install", "-q", "--python", py, "--extra-index-url", LOCAL_TORCH_INDEX.as_uri(),
                    "torch==2.14.1"], check=True)
    before = subprocess.run([uv_bin(), "pip", "list", "--python", py], capture_output=True, text=True).stdout
    subprocess.run([uv_bin(), "pip", "install", "-q", "--python", py, "--extra-index-url", LOCAL_TORCH_INDEX.as_uri(),
                    "--extra-index-url", channel, "tinyext==0.1.0+cu13"], check=True)
    pip = subprocess.run([py, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", "--index-url", channel,
                          "tinyext==0.1.0+cu13"], capture_output=True, text=True)
    assert pip.returncode == 0, pip.stderr[-1500:]
    after = subprocess.run([uv_bin(), "pip", "list", "--python", py], capture_output=True, text=True).stdout
    torch_line = [line for line in before.splitlines() if line.startswith("torch ")]
    assert torch_line and torch_line == [line for line in after.splitlines() if line.startswith("torch ")]
    probe = subprocess.run([py, "-c", "import torch, tinyext; print(torch.ops.tinyext.axpy)"], capture_output=True,
                           text=True)
    assert probe.returncode == 0 and "tinyext.axpy" in probe.stdout, probe.stderr[-1500:]


def test_builder_verify_checks_a_torch_the_record_lacks_and_the_channel_comes_back(built: dict) -> None:
    """A torch released after the build: its check is missing from the record (here: removed), so the wheel is
    in no channel for it; `builder verify` runs the check and the index lists the wheel there again."""
    from builder.index.store import Wheelhouse

    house = Wheelhouse(built["base"] / "wheelhouse")
    record = house.record_of(WHEEL)
    assert record is not None and record.torch_checks
    house.write_record(WHEEL, record.with_(torch_checks=()))
    assert house.channels_of(WHEEL) == ()
    result = run_cli("verify", "--recipes", str(FIXTURES / "recipes-stable"), "--python", "3.11", env=built["env"])
    assert result.code == 0, result.stderr[-2000:]
    assert "2.14.1" in result.stdout and "passed (new)" in result.stdout
    assert house.channels_of(WHEEL) == ("cu130torch2.14",)
    again = run_cli("verify", "tinyext", "--recipes", str(FIXTURES / "recipes-stable"), env=built["env"])
    assert again.code == 0 and "nothing new to verify" in again.stderr
