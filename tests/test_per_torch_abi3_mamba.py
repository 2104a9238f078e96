"""Issue 39 item 3 for mamba-ssm: its per-torch builds of 2.3.2.post1 (torch below the stable floor: 2.9 in the farm)
apply 0005 (TORCH_LIBRARY ops with 0004's schemas, limited-API ``mamba_ssm._C``): one ``cp310-abi3`` wheel per (torch
minor, CUDA line, platform) instead of one ``cpXY`` wheel per Python. 2.3.1 and older keep their pybind wheels."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.farm.served import Cell, served_cells
from builder.model.abi import Abi
from builder.stages.plan import make_plan
from tests.helpers import real_sdist, repo_recipe
from tests.test_farm_coverage import root_farm, shipped
from tests.test_farm_proof import planning_settings, root_targets
from tests.test_per_torch_abi3 import _schemas

ROOT = Path(__file__).resolve().parents[1]
PATCHES = ROOT / "patches" / "mamba-ssm"
STABLE = "0004-stable-abi-2.3.2.patch"
PER_TORCH = "0005-per-torch-abi3-2.3.2.patch"


def test_only_2_3_2_post1_per_torch_builds_are_python_agnostic() -> None:
    recipe = repo_recipe("mamba-ssm")
    agnostic = recipe.python_agnostic("2.3.2.post1")
    assert agnostic is not None and agnostic.tag == "cp310-abi3"
    for older in ("2.3.1", "2.3.0", "2.2.6.post3"):  # 0005 is not ported to them: cpXY pybind wheels
        assert recipe.python_agnostic(older) is None, older


def test_0004_and_0005_never_both_apply() -> None:
    recipe = repo_recipe("mamba-ssm")
    per_torch = [p.name for p in recipe.patches_for("2.3.2.post1", abi=Abi.PER_TORCH)]
    stable = [p.name for p in recipe.patches_for("2.3.2.post1", abi=Abi.TORCH_STABLE)]
    # 0006 (the constant-B last_state fix, Python only) applies to every build after the port
    assert [n[:4] for n in per_torch] == ["0001", "0002", "0003", "0005", "0006"] and per_torch[-2] == PER_TORCH
    assert [n[:4] for n in stable] == ["0001", "0002", "0003", "0004", "0006"] and stable[-2] == STABLE
    assert [p.name[:4] for p in recipe.patches_for("2.3.1", abi=Abi.PER_TORCH)] == ["0001", "0003", "0006"]


def test_the_per_torch_port_registers_the_stable_ports_schemas() -> None:
    """One Python layer (selective_scan_cuda.py) serves both wheels: the same two schemas, byte for byte; the ATen
    code stays, only the pybind module goes; the import check names the torch minor the wheel needs."""
    stable, per_torch = _schemas(PATCHES / STABLE), _schemas(PATCHES / PER_TORCH)
    assert len(per_torch) == 2 and per_torch == stable
    assert per_torch[0].startswith("fwd(Tensor u,") and per_torch[1].startswith("bwd(Tensor u,")
    text = (PATCHES / PER_TORCH).read_text()
    assert "+TORCH_LIBRARY(selective_scan_cuda, m)" in text
    assert "+TORCH_LIBRARY_IMPL(selective_scan_cuda, CUDA, m)" in text
    assert "-PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)" in text and "-#include <torch/python.h>" in text
    assert "STABLE_TORCH_LIBRARY" not in text and "+PyMODINIT_FUNC PyInit__C(void)" in text
    assert "+            py_limited_api=True," in text
    assert '+    options={"bdist_wheel": {"py_limited_api": "cp310"}},' in text
    assert "this wheel needs torch {_build_info.TORCH_MINOR}" in text


def test_the_python_layer_is_0004s_but_for_the_torch_minor_check() -> None:
    """selective_scan_cuda.py of 0005 = 0004's module plus the header and the torch-minor check: the wrapper code
    (allocations, op calls, return lists) is the same lines."""
    def new_module(patch: str) -> list[str]:
        text = (PATCHES / patch).read_text()
        body = text.split("+++ b/selective_scan_cuda.py\n", 1)[1].split("\n--- ", 1)[0]
        lines = [line[1:] for line in body.splitlines() if line.startswith("+")]
        return lines[lines.index("import mamba_ssm._C  # noqa: E402,F401  (loading the library registers the ops)"):]
    assert new_module(PER_TORCH) == new_module(STABLE)


def test_the_plan_says_abi3_for_the_farms_per_torch_targets(tmp_path: Path) -> None:
    settings = planning_settings(tmp_path)
    targets = [t for t in root_targets(settings) if t.package == "mamba-ssm" and not t.stable]
    newest = [t for t in targets if t.version == "2.3.2.post1"]
    assert newest and all(t.pythons for t in newest)
    for t in [t for t in newest if t.torch == "2.9.1"][:2]:
        plan = make_plan(t.to_target(jobs=1), t.settings(settings))
        assert plan.abi is Abi.PER_TORCH and plan.abi3 and plan.python_agnostic is not None
        assert PER_TORCH in [p.name for p in plan.patches] and STABLE not in [p.name for p in plan.patches]
        abi = dict(plan.describe())["abi"]
        assert abi.startswith("per-torch, Python-agnostic (one cp310-abi3 wheel pinned to torch 2.9, serving"), abi
    for t in [t for t in targets if t.version == "2.3.1"]:
        plan = make_plan(t.to_target(jobs=1), t.settings(settings))
        assert not plan.abi3 and PER_TORCH not in [p.name for p in plan.patches]


def test_the_farm_compiles_one_mamba_ssm_wheel_per_torch_cuda_major_and_platform(tmp_path: Path) -> None:
    """torch 2.9.1 × CUDA 12 (built on 12.8, serving cu128 and cu129: +cu12torch2.9) and 13 (cu130) × x86_64/aarch64:
    4 compiles where there were 30 (one per Python 3.10-3.14 and CUDA line), then 6 (one per CUDA line). Beside
    them, since the +cu13 wheel's floor is 2.11 (issue 51: the first torch whose PyPI build is CUDA 13), the cu130
    channel's torch 2.10.0 on each platform: 2 more."""
    settings = shipped(tmp_path)
    targets, universe, _ = root_farm(settings)
    from builder.discovery.compat import resolve_index

    every = [t for t in targets if t.package == "mamba-ssm" and t.version == "2.3.2.post1" and not t.stable]
    assert {(str(t.cuda), t.platform.name) for t in every if t.torch == "2.10.0"} == {
        ("13.0", "x86_64"), ("13.0", "aarch64")}
    per_torch = [t for t in every if t.torch != "2.10.0"]
    assert len(every) == 6 and len(per_torch) == 4 and all(t.torch == "2.9.1" for t in per_torch)
    assert {(str(t.cuda), t.platform.name) for t in per_torch} == {
        (c, p) for c in ("12.8", "13.0") for p in ("x86_64", "aarch64")}
    for target in per_torch:
        assert sorted(p.name for p in target.pythons) == ["3.10", "3.11", "3.12", "3.13", "3.14"]
        assert target.id.endswith("-abi3-torch2.9.1") and "abi3" in target.wheel_identity
    (x86_cu128,) = [t for t in per_torch if str(t.cuda) == "12.8" and t.platform.name == "x86_64"]
    cells = served_cells(x86_cu128, resolve_index(x86_cu128.torch_index, settings), universe)
    assert {(c.torch, c.cuda, c.python) for c in cells} == {
        ("2.9", line, py) for py in ("3.10", "3.11", "3.12", "3.13", "3.14") for line in ("12.8", "12.9")}
    assert all(isinstance(c, Cell) for c in cells)
    # the previous release has no per-torch target at all: 0004 covers it, so its cells are 2 +cu13 stable wheels
    previous = [t for t in targets if t.package == "mamba-ssm" and t.version == "2.3.1"]
    assert len(previous) == 2 and all(t.stable and not t.pythons for t in previous)


@pytest.mark.network
def test_the_per_torch_series_applies_to_the_real_sdist_and_0004_does_not_apply_on_top(tmp_path: Path) -> None:
    """The sdist from PyPI (the recipe's sha256), the per-torch series applied in order by the patch stage: the
    binding is TORCH_LIBRARY (no pybind), the kernels are upstream's; the stable port then stops with its name."""
    from builder.core.errors import PatchError
    from builder.stages.patch import apply_patches

    version = "2.3.2.post1"
    recipe, root = real_sdist("mamba-ssm", version, tmp_path)
    kernel = (root / "csrc" / "selective_scan" / "selective_scan_fwd_kernel.cuh").read_text()
    apply_patches(root, recipe.patches_for(version, abi=Abi.PER_TORCH), "mamba-ssm", version)
    binding = (root / "csrc" / "selective_scan" / "selective_scan.cpp").read_text()
    assert "TORCH_LIBRARY(selective_scan_cuda, m)" in binding and "PYBIND11_MODULE" not in binding
    assert "#include <torch/python.h>" not in binding and "at::cuda::CUDAGuard" in binding  # upstream's ATen code stays
    assert (root / "csrc" / "selective_scan" / "selective_scan_fwd_kernel.cuh").read_text() == kernel
    assert 'name="mamba_ssm._C"' in (root / "setup.py").read_text() and (root / "selective_scan_cuda.py").is_file()
    (stable,) = [p for p in recipe.patches_for(version, abi=Abi.TORCH_STABLE) if p.name == STABLE]
    with pytest.raises(PatchError, match=STABLE):
        apply_patches(root, (stable,), "mamba-ssm", version)
