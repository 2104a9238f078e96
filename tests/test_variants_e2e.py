"""Wheel variants end to end (issue 29) on the tiny CUDA extension: one real compile for sm_90 + sm_120 with
``--variants``; the wheelhouse then holds the plain wheel and one thin wheel per arch, and its project page links
``{name}-{version}-variants.json``. uv with the preview flag, told a GPU through the NVIDIA provider's FORCE
variables (no GPU here), installs the variant for that GPU; uv without the flag and pip install the plain wheel;
the env's torch is the same after each install.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from builder.core import fatbin
from builder.core.uvtool import uv_bin
from builder.model import variants
from tests.helpers import FIXTURES, LOCAL_TORCH_INDEX, local_cuda_path_missing, run_cli

pytestmark = pytest.mark.e2e
missing = local_cuda_path_missing()
if missing:
    pytestmark = [pytest.mark.e2e, pytest.mark.skip(reason=f"skipped: {missing}")]

PLAIN = "tinyext-0.1.0+cu13torch2.14-cp311-cp311-linux_x86_64.whl"
BUILD = ("build", "tinyext", "--recipes", str(FIXTURES / "recipes"), "--cuda", "13.0", "--arch", "90,120",
         "--python", "3.11", "--torch", "2.14.1", "--torch-index", str(LOCAL_TORCH_INDEX), "--toolchain", "host",
         "--variants")


@pytest.fixture(scope="module")
def house(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("variants")
    env = {"BUILDER_CACHE_DIR": str(base / "cache"), "BUILDER_WHEELHOUSE": str(base / "wheelhouse")}
    done = run_cli(*BUILD, env=env)
    assert done.code == 0, done.stderr[-3000:]
    assert "variant sm90:" in done.stderr and "variant sm120:" in done.stderr
    return base / "wheelhouse"


def _sass(python: Path) -> set[str]:
    """The arches of the SASS the installed tinyext's .so carries."""
    site = next(python.parent.parent.glob("lib/python3.11/site-packages"))
    so = next(site.glob("tinyext/_C*.so")).read_bytes()
    return {f"sm_{e.arch}" for c in fatbin.shared_object_code(so) for e in c.entries if e.kind == "sass"}


def test_the_wheelhouse_lists_the_plain_wheel_its_variants_and_their_table(house: Path) -> None:
    names = sorted(p.name for p in (house / "wheels").glob("*.whl"))
    assert names == sorted([PLAIN, PLAIN[:-4] + "-sm120.whl", PLAIN[:-4] + "-sm90.whl"])
    page = house / "simple" / "tinyext"
    files = {f["filename"]: f for f in json.loads((page / "index.json").read_text())["files"]}
    table_name = "tinyext-0.1.0+cu13torch2.14-variants.json"
    assert table_name in files and table_name in (page / "index.html").read_text()
    table = variants.read_metadata((page / table_name).read_bytes(), table_name)
    assert table == {f"sm{a}": {"nvidia": {"cuda_version_lower_bound": ["13.0"], "sm_arch": [f"{a}_real"]}}
                     for a in (90, 120)}
    channel = house / "channels" / "cu130torch2.14" / "simple" / "tinyext"
    assert table_name in (channel / "index.html").read_text()


def test_uv_picks_the_variant_for_the_gpu_and_pip_the_plain_wheel(house: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([uv_bin(), "venv", "--quiet", "--seed", "--python", "3.11", str(venv)], check=True)
    python = venv / "bin" / "python"
    local = ["--index-url", (house / "simple").as_uri(), "--extra-index-url", LOCAL_TORCH_INDEX.as_uri()]
    subprocess.run([uv_bin(), "pip", "install", "--quiet", "--python", str(python), *local[2:], "torch==2.14.1"],
                   check=True)

    def torch_now() -> str:
        return subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('torch'))"],
                              capture_output=True, text=True, check=True).stdout.strip()

    torch = torch_now()

    def uv_install(sm: str | None, flag: bool = True) -> set[str]:
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
        if sm is not None:
            env |= {variants.FORCE_SM_ARCH: sm, variants.FORCE_DRIVER: "13.0"}
        preview = ["--preview-features", variants.UV_PREVIEW_FEATURE] if flag else []
        subprocess.run([uv_bin(), "pip", "install", "--quiet", *preview, "--python", str(python), *local,
                        "--reinstall-package", "tinyext", "tinyext"], env=env, check=True)
        assert torch_now() == torch
        return _sass(python)

    assert uv_install("12.0") == {"sm_120"}
    assert uv_install("9.0") == {"sm_90"}
    assert uv_install("7.5") == {"sm_90", "sm_120"}  # no variant runs there: the plain wheel
    assert uv_install("12.0", flag=False) == {"sm_90", "sm_120"}
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--force-reinstall", "--index-url",
                    (house / "simple").as_uri(), "tinyext"], check=True)
    assert _sass(python) == {"sm_90", "sm_120"} and torch_now() == torch


def test_builder_variants_stages_the_variants_of_a_published_wheel(house: Path, tmp_path: Path) -> None:
    """`builder variants`: a wheel published without them gets them staged, without a compile; an arch the wheel
    was not built for is refused, naming the archs it has."""
    from builder.index.store import Wheelhouse
    from builder.model.records import BuildRecord

    plain = house / "wheels" / PLAIN
    record = BuildRecord.from_json(json.loads((house / "records" / f"{PLAIN}.json").read_text()))
    target = Wheelhouse(tmp_path / "house")
    target.publish(plain, record.with_(variant=None))
    env = {"BUILDER_CACHE_DIR": str(house.parent / "cache"), "BUILDER_WHEELHOUSE": str(target.root)}
    done = run_cli("variants", "tinyext", "--recipes", str(FIXTURES / "recipes"), env=env)
    assert done.code == 0, done.stderr[-2000:]
    staged = sorted(p.name for p in (target.root / "staging" / "wheels").glob("*.whl"))
    assert staged == sorted([PLAIN[:-4] + "-sm120.whl", PLAIN[:-4] + "-sm90.whl"])
    assert "tinyext-0.1.0+cu13torch2.14-variants.json" in \
        (target.root / "staging" / "simple" / "tinyext" / "index.html").read_text()
    refused = run_cli("variants", "tinyext", "--arch", "100", "--recipes", str(FIXTURES / "recipes"), env=env)
    assert refused.code != 0 and "was built for 90, 120, not 100" in refused.stderr


def test_the_same_build_again_is_the_plain_wheel_unchanged(house: Path) -> None:
    """The variants share their plain wheel's inputs: the unchanged check names the plain wheel."""
    env = {"BUILDER_CACHE_DIR": str(house.parent / "cache"), "BUILDER_WHEELHOUSE": str(house)}
    again = run_cli(*BUILD, env=env)
    assert again.code == 0 and f"unchanged: {PLAIN} was built from the same inputs" in again.stderr, again.stderr[-1500:]
    assert "published without its variants" not in again.stderr
