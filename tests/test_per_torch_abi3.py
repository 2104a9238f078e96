"""Issue 39 item 3: a per-torch build that can be Python-agnostic is. causal-conv1d 1.7.0's per-torch builds (torch
below the stable floor) apply 0003 (TORCH_LIBRARY ops, limited-API ``_C``): one ``cp310-abi3`` wheel per (torch
minor, CUDA line, platform), labelled and pinned per torch, serving every Python that torch has. The recipe says so
with ``[per-torch-abi3]``; the plan, the farm's expansion and coverage count it so."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from builder.core.errors import RecipeError, UsageError
from builder.farm.coverage import wheel_cells
from builder.farm.served import Cell, served_cells
from builder.model.abi import Abi
from builder.model.recipe import load_recipe
from builder.stages.abichoice import check_python_agnostic
from tests.helpers import repo_recipe
from tests.test_farm_coverage import root_farm, shipped

ROOT = Path(__file__).resolve().parents[1]
PATCHES = ROOT / "patches" / "causal-conv1d"


def test_the_recipe_makes_1_7_0_per_torch_builds_python_agnostic_only() -> None:
    recipe = repo_recipe("causal-conv1d")
    agnostic = recipe.python_agnostic("1.7.0")
    assert agnostic is not None and agnostic.tag == "cp310-abi3"
    assert recipe.python_agnostic("1.6.2.post1") is None  # 0003 does not apply there: cpXY pybind wheels


def test_0002_and_0003_never_both_apply() -> None:
    recipe = repo_recipe("causal-conv1d")
    per_torch = [p.name for p in recipe.patches_for("1.7.0", abi=Abi.PER_TORCH)]
    stable = [p.name for p in recipe.patches_for("1.7.0", abi=Abi.TORCH_STABLE)]
    assert "0003-per-torch-abi3-1.7.0.patch" in per_torch and "0002-stable-abi-1.7.0.patch" not in per_torch
    assert "0002-stable-abi-1.7.0.patch" in stable and "0003-per-torch-abi3-1.7.0.patch" not in stable
    assert [p.name for p in recipe.patches_for("1.6.2.post1", abi=Abi.PER_TORCH)] == [
        "0001-clear-error-arch-list-no-download-1.5.2-1.7.0.patch", "0005-bwd-silu-short-tail-history-1.5.2-1.7.0.patch",
        "0006-channellast-fwd-seq-idx-bound-1.5.2-1.6.2.post1.patch"]  # the build-script fix and the kernel fixes


def _schemas(patch: Path) -> list[str]:
    """The op schemas a port's ``m.def(...)`` lines register (C string pieces joined)."""
    added = "\n".join(line[1:] for line in patch.read_text().splitlines() if line.startswith("+"))
    blocks = re.findall(r"m\.def\(((?:\s*\"[^\"]*\")+)\s*\)", added)
    return ["".join(re.findall(r"\"([^\"]*)\"", block)) for block in blocks]


def test_the_per_torch_port_registers_the_stable_ports_schemas() -> None:
    """One Python layer (causal_conv1d/_ops.py, causal_conv1d_cuda.py) serves both wheels: same three schemas."""
    stable, per_torch = _schemas(PATCHES / "0002-stable-abi-1.7.0.patch"), _schemas(
        PATCHES / "0003-per-torch-abi3-1.7.0.patch")
    assert len(per_torch) == 3 and per_torch == stable
    text = (PATCHES / "0003-per-torch-abi3-1.7.0.patch").read_text()
    assert "+TORCH_LIBRARY(causal_conv1d_cuda, m)" in text and "+TORCH_LIBRARY_IMPL(causal_conv1d_cuda, CUDA, m)" in text
    assert "-PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)" in text and "-#include <torch/extension.h>" in text
    assert '+    options={"bdist_wheel": {"py_limited_api": "cp310"}},' in text
    assert "needs torch {built[0]}.{built[1]}" in text  # the import-time check names the minor it was built with


def _recipe(tmp_path: Path, extra: str, port: bool = True) -> Path:
    folder = tmp_path / "recipes" / "demo"
    folder.mkdir(parents=True)
    (tmp_path / "patches" / "demo").mkdir(parents=True)
    (tmp_path / "patches" / "demo" / "port.patch").write_text("")
    patch = '[[patch]]\nfile = "port.patch"\nversions = "==1.0"\nsummary = "port"\nabi = "per-torch"\n' if port else ""
    (folder / "recipe.toml").write_text(
        'name = "demo"\nsummary = "d"\nversions = ">=0.9"\n[source]\npypi = "demo"\n'
        '[source.sha256]\n"0.9" = "' + "0" * 64 + '"\n"1.0" = "' + "1" * 64 + '"\n' + patch + extra)
    return folder / "recipe.toml"


def test_a_per_torch_abi3_table_without_a_port_is_refused_naming_file_and_field(tmp_path: Path) -> None:
    path = _recipe(tmp_path, '[per-torch-abi3]\nversions = ">=0.9"\n')
    with pytest.raises(RecipeError) as err:
        load_recipe(path, tmp_path / "patches")
    assert f"{path}: field 'per-torch-abi3.versions'" in err.value.message
    assert "covers 0.9" in err.value.message and "pybind" in err.value.message
    ok = load_recipe(_recipe(tmp_path / "b", '[per-torch-abi3]\nversions = "==1.0"\n'), tmp_path / "b" / "patches")
    assert ok.python_agnostic("1.0") is not None and ok.python_agnostic("0.9") is None
    with pytest.raises(RecipeError, match="per-torch-abi3.pythn-floor|did you mean"):
        load_recipe(_recipe(tmp_path / "c", '[per-torch-abi3]\nversions = "==1.0"\npythn-floor = "3.10"\n'),
                    tmp_path / "c" / "patches")
    with pytest.raises(RecipeError, match="per-torch-abi3.python-floor"):
        load_recipe(_recipe(tmp_path / "d", '[per-torch-abi3]\nversions = "==1.0"\npython-floor = "3"\n'),
                    tmp_path / "d" / "patches")


def test_the_plan_refuses_a_python_below_the_abi3_floor() -> None:
    recipe = repo_recipe("causal-conv1d")
    with pytest.raises(UsageError, match="cp310-abi3 wheel for every Python from 3.10"):
        check_python_agnostic(recipe, "1.7.0", Abi.PER_TORCH, "3.9")
    check_python_agnostic(recipe, "1.7.0", Abi.PER_TORCH, "3.10")
    check_python_agnostic(recipe, "1.6.2.post1", Abi.PER_TORCH, "3.9")  # a cp39 pybind wheel: fine


def test_the_farm_compiles_one_per_torch_abi3_wheel_for_every_python(tmp_path: Path) -> None:
    """cu128 × torch 2.9.1 × x86_64: one target (5 Pythons, 3.10-3.14) where there were 5, serving cu129's torch 2.9
    too (its +cu12torch2.9 label names the CUDA major: the cu129 target folds into it)."""
    settings = shipped(tmp_path)
    targets, universe, _ = root_farm(settings)
    from builder.discovery.compat import resolve_index

    cc = [t for t in targets if t.package == "causal-conv1d" and t.version == "1.7.0" and not t.stable]
    group = [t for t in cc if str(t.cuda) == "12.8" and t.torch == "2.9.1" and t.platform.name == "x86_64"]
    (target,) = group
    assert [p.name for p in target.pythons] == ["3.12", "3.10", "3.11", "3.13", "3.14"]
    assert target.id.endswith("-x86_64-abi3-torch2.9.1") and "abi3" in target.wheel_identity
    cells = served_cells(target, resolve_index(target.torch_index, settings), universe)
    assert cells == {Cell("2.9", line, py) for py in ("3.10", "3.11", "3.12", "3.13", "3.14") for line in ("12.8", "12.9")}
    # 8, and 2 more once the +cu13 wheel's floor became 2.11 (issue 51): the cu130 channel's torch 2.10, per platform
    assert all(t.pythons for t in cc) and len(cc) == 10
    assert not [t for t in cc if str(t.cuda) == "12.9"]  # folded into the 12.8 ones (2.8, 2.9)
    # the previous release keeps one cpXY compile per Python
    assert not any(t.pythons for t in targets if t.package == "causal-conv1d" and t.version == "1.6.2.post1")


def test_coverage_counts_a_per_torch_abi3_wheel_for_every_python_from_its_tag() -> None:
    matrix = frozenset(Cell("2.9", "12.8", py) for py in ("3.9", "3.10", "3.12", "3.14")) | {Cell("2.10", "12.8", "3.12")}
    abi3 = wheel_cells("causal_conv1d-1.7.0+cu128torch2.9-cp310-abi3-manylinux_2_28_x86_64.whl", None, matrix, None)
    assert set(abi3) == {Cell("2.9", "12.8", py) for py in ("3.10", "3.12", "3.14")}
    cp312 = wheel_cells("causal_conv1d-1.7.0+cu128torch2.9-cp312-cp312-manylinux_2_28_x86_64.whl", None, matrix, None)
    assert set(cp312) == {Cell("2.9", "12.8", "3.12")}


@pytest.mark.network
@pytest.mark.parametrize(("package", "version", "series", "binding"), [
    # the port, then the kernel fixes every build of the version gets (causal-conv1d 0005/0006, mamba-ssm 0006)
    ("causal-conv1d", "1.6.2.post1", ["0001", "0004", "0005", "0006"], "csrc/causal_conv1d.cpp"),
    ("mamba-ssm", "2.3.1", ["0001", "0003", "0004", "0006"], "csrc/selective_scan/selective_scan.cpp"),
])
def test_the_previous_releases_stable_series_applies_to_their_real_sdists(
        tmp_path: Path, package: str, version: str, series: list[str], binding: str) -> None:
    """The farm's `previous = 1` entries are stable-ABI wheels now: causal-conv1d 1.6.2.post1 through its own port
    (0004, 0002 rebased), mamba-ssm 2.3.1 through 2.3.2.post1's 0004 as it is. The sdists from PyPI (the recipes'
    sha256), the stable series applied by the patch stage: the binding is on the stable ABI, no pybind left."""
    from builder.stages.patch import apply_patches
    from tests.helpers import real_sdist

    recipe, root = real_sdist(package, version, tmp_path)
    assert recipe.stable_abi is not None and recipe.stable_abi.covers(version)
    patches = recipe.patches_for(version, abi=Abi.TORCH_STABLE)
    assert [p.name[:4] for p in patches] == series
    assert "PYBIND11_MODULE" in (root / binding).read_text()  # upstream's pybind binding before the series
    apply_patches(root, patches, package, version)
    text = (root / binding).read_text()
    code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("//"))  # not the comments
    assert "STABLE_TORCH_LIBRARY(" in code and "PYBIND11_MODULE" not in code and "torch/extension.h" not in code
