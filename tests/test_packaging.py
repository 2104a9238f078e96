"""The tool installed as a tool: the project's sdist and wheel, built for real with uv, carry recipes/, patches/
and dockerfiles/, and a `builder` installed from the wheel (into a fresh venv, not editable, and with
`uv tool install`) finds them from a folder outside the checkout. --recipes still overrides the packaged copy."""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from builder.core.uvtool import uv_bin
from tests.helpers import FIXTURES, ROOT

RECIPES = ("causal-conv1d", "fla-core", "flash-linear-attention")


def _run(argv: list[str], *, cwd: Path, env: dict[str, str] | None = None,
         timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env={**os.environ, **(env or {}), "COLUMNS": "200"},
                          capture_output=True, text=True, timeout=timeout, check=False)


# uv builds the project (setuptools from PyPI) and installs it with its dependencies; `recipes show` and `plan`
# read causal-conv1d's release list from PyPI
pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The project's sdist and wheel (`uv build` makes the sdist, then the wheel from the sdist, as a user
    installing from PyPI would) and a fresh venv with the wheel installed (no torch: these commands need none)."""
    tmp = tmp_path_factory.mktemp("packaging")
    dist = tmp / "dist"
    build = _run([uv_bin(), "build", "--out-dir", str(dist), str(ROOT)], cwd=tmp)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = dist.glob("cuda_wheel_builder-*.whl")
    (sdist,) = dist.glob("cuda_wheel_builder-*.tar.gz")
    venv = tmp / "venv"
    made = _run([uv_bin(), "venv", "--quiet", "--python", sys.executable, str(venv)], cwd=tmp)
    assert made.returncode == 0, made.stderr
    installed = _run([uv_bin(), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(wheel)],
                     cwd=tmp)
    assert installed.returncode == 0, installed.stderr[-3000:]
    elsewhere = tmp / "elsewhere"  # a cwd outside the checkout, with nothing in it
    elsewhere.mkdir()
    return {"wheel": wheel, "sdist": sdist, "venv": venv, "cwd": elsewhere, "cache": tmp / "cache"}


def _env(built: dict[str, Path]) -> dict[str, str]:
    return {"BUILDER_CACHE_DIR": str(built["cache"]), "BUILDER_WHEELHOUSE": str(built["cwd"] / "wheelhouse")}


def _builder(built: dict[str, Path], *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("BUILDER_RECIPES", "PYTHONPATH", "VIRTUAL_ENV")}
    env.update(_env(built), COLUMNS="200")
    return subprocess.run([str(built["venv"] / "bin" / "builder"), *args], cwd=built["cwd"], env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_sdist_and_wheel_carry_the_data_folders(built: dict[str, Path]) -> None:
    with tarfile.open(built["sdist"]) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for name in ("recipes/causal-conv1d/recipe.toml", "recipes/aliases.toml", "dockerfiles/manylinux-cuda.Dockerfile",
                 "evidence/gpu-runs.json", "setup.py", "MANIFEST.in"):
        assert name in names, name
    assert any(n.startswith("patches/causal-conv1d/") and n.endswith(".patch") for n in names)
    with zipfile.ZipFile(built["wheel"]) as wheel:
        inside = set(wheel.namelist())
    for name in ("builder/_data/recipes/causal-conv1d/recipe.toml", "builder/_data/recipes/causal-conv1d/kernel_tests.py",
                 "builder/_data/dockerfiles/manylinux-cuda.Dockerfile", "builder/_data/evidence/gpu-runs.json"):
        assert name in inside, name
    assert any(n.startswith("builder/_data/patches/causal-conv1d/") for n in inside)
    assert not any("__pycache__" in n for n in inside)


def test_installed_builder_lists_and_shows_recipes_outside_the_checkout(built: dict[str, Path]) -> None:
    listing = _builder(built, "recipes")
    assert listing.returncode == 0, listing.stderr
    for name in RECIPES:
        assert name in listing.stdout, listing.stdout
    shown = _builder(built, "recipes", "show", "causal-conv1d", "--version", "1.7.0")
    assert shown.returncode == 0, shown.stderr
    site = str(built["venv"] / "lib")
    # the recipe and its patches come from the installed package, not from this checkout
    assert f"{site}" in shown.stdout and "builder/_data/recipes/causal-conv1d/recipe.toml" in shown.stdout, shown.stdout
    assert str(ROOT / "recipes") not in shown.stdout
    assert ".patch" in shown.stdout


def test_installed_builder_plans(built: dict[str, Path]) -> None:
    plan = _builder(built, "plan", "causal-conv1d", "--cuda", "13.0", "--arch", "120")
    assert plan.returncode == 0, plan.stderr
    assert "causal-conv1d" in plan.stdout and "TORCH_CUDA_ARCH_LIST=12.0" in plan.stdout, plan.stdout


def test_recipes_flag_overrides_the_packaged_copy(built: dict[str, Path]) -> None:
    listing = _builder(built, "recipes", "--recipes", str(FIXTURES / "recipes"))
    assert listing.returncode == 0, listing.stderr
    assert "tinyext" in listing.stdout and "causal-conv1d" not in listing.stdout, listing.stdout


def test_uv_tool_install_gives_a_working_builder(built: dict[str, Path], tmp_path: Path) -> None:
    tools, bin_dir = tmp_path / "tools", tmp_path / "bin"
    env = {"UV_TOOL_DIR": str(tools), "UV_TOOL_BIN_DIR": str(bin_dir)}
    installed = _run([uv_bin(), "tool", "install", "--quiet", "--python", sys.executable, str(built["wheel"])],
                     cwd=built["cwd"], env=env)
    assert installed.returncode == 0, installed.stderr[-3000:]
    listing = _run([str(bin_dir / "builder"), "recipes"], cwd=built["cwd"],
                   env={**_env(built), "BUILDER_RECIPES": ""})
    assert listing.returncode == 0, listing.stderr
    for name in RECIPES:
        assert name in listing.stdout, listing.stdout
