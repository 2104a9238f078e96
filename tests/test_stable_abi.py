"""Stable-ABI builds (model/abi.py): the recipe's [stable-abi], the plan's ABI choice, label and torch requirement,
the torch-range check's choice of torches and its verdicts, and the record's verified channels."""

from __future__ import annotations

import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from packaging.version import Version

from builder.core.errors import RecipeError, UsageError
from builder.core.settings import Settings
from builder.discovery.compat import TorchIndex, resolve_index
from builder.discovery.torchindex import Listing, Release
from builder.model.abi import Abi, channel_label, stable_label
from builder.model.arch import parse_arch_list
from builder.model.cuda import CudaVersion
from builder.model.label import Label
from builder.model.python import PythonSpec
from builder.model.recipe import load_recipe
from builder.model.records import BuildRecord, TorchCheck
from builder.stages.abichoice import default_build_torch
from builder.stages.plan import Target, make_plan
from builder.stages.torchrange import judge_probe, other_index_torches, torches_to_check
from tests.helpers import FIXTURES, LOCAL_TORCH_INDEX

STABLE = """
[stable-abi]
versions = ">=0.1,<1"
torch-floor = "2.11"
namespaces = ["tinyext"]
"""

PORT = """
[[patch]]
file = "0003-stable-port.patch"
versions = ">=0.1,<1"
summary = "the stable-ABI port"
abi = "torch-stable"
"""


def stable_recipes(tmp_path: Path, extra: str = STABLE + PORT) -> Settings:
    """A copy of the tinyext fixture recipe (and its patches) with a stable-ABI port added."""
    recipes, patches = tmp_path / "recipes", tmp_path / "patches"
    shutil.copytree(FIXTURES / "recipes", recipes)
    shutil.copytree(FIXTURES / "patches", patches)
    (patches / "tinyext" / "0003-stable-port.patch").write_text("--- a/x\n+++ b/x\n")
    recipe = recipes / "tinyext" / "recipe.toml"
    text = recipe.read_text().replace('path = "../../tinyext"', f'path = "{FIXTURES / "tinyext"}"')
    recipe.write_text(text + extra)
    return Settings.from_env({}, recipes_dir=recipes, cache_dir=tmp_path / "cache")


def target(**changes: object) -> Target:
    fields: dict[str, object] = dict(package="tinyext", version="0.1.0", cuda=CudaVersion.parse("13.0"),
                                     archs=parse_arch_list("90"), python=PythonSpec("3.11"), torch="2.14.1",
                                     torch_index=str(LOCAL_TORCH_INDEX), toolchain="host")
    fields.update(changes)
    return Target(**fields)  # type: ignore[arg-type]


needs_local_index = pytest.mark.skipif(not LOCAL_TORCH_INDEX.is_dir(),
                                       reason=f"skipped: no local torch index at {LOCAL_TORCH_INDEX}")


@needs_local_index
def test_a_port_makes_a_stable_plan_labelled_by_cuda_major_and_pinned_to_the_floor(tmp_path: Path) -> None:
    plan = make_plan(target(), stable_recipes(tmp_path))
    assert plan.abi is Abi.TORCH_STABLE
    assert plan.label("2.14.1") == "cu13"
    assert plan.torch_requirement("2.14.1") == "torch>=2.11"
    assert "0003-stable-port.patch" in [p.name for p in plan.patches]
    assert plan.env["BUILDER_TORCH_FLOOR"] == "2.11"
    assert dict(plan.describe())["abi"].startswith("torch-stable (one cp310-abi3 wheel for CUDA 13 torches >= 2.11")


@needs_local_index
def test_a_stable_wheel_requires_the_python_of_its_abi3_tag_and_of_its_torch_floor(tmp_path: Path) -> None:
    """Upstream's setup.py says >=3.9; a cp310-abi3 wheel serves 3.10 on, and its floor torch may start later."""
    settings = stable_recipes(tmp_path)
    plan = make_plan(target(), settings)
    assert plan.requires_python == ">=3.10"  # the local index has no 2.11: the abi3 tag's Python decides
    assert dict(plan.describe())["abi"].endswith("each verified; Requires-Python >=3.10)")
    assert make_plan(target(abi="per-torch"), settings).requires_python is None  # its cp311 tag says it
    pypi = resolve_index("pypi")  # the shipped snapshot: PyPI's torch 2.15.0 has no wheel for Python 3.10
    assert (pypi.oldest_python(Version("2.11")), pypi.oldest_python(Version("2.15"))) == (Version("3.10"),
                                                                                         Version("3.11"))
    assert plan.recipe.stable_abi is not None
    floor_2_15 = replace(plan.recipe, stable_abi=replace(plan.recipe.stable_abi, torch_floor=Version("2.15")))
    assert replace(plan, index=pypi, recipe=floor_2_15).requires_python == ">=3.11"


@needs_local_index
def test_per_torch_keeps_the_old_plan_and_leaves_the_port_out(tmp_path: Path) -> None:
    plan = make_plan(target(abi="per-torch"), stable_recipes(tmp_path))
    assert plan.abi is Abi.PER_TORCH
    assert plan.label("2.14.1") == "cu13torch2.14"
    assert plan.torch_requirement("2.14.1") == "torch>=2.14.0,<2.15"  # every patch of the minor
    assert "0003-stable-port.patch" not in [p.name for p in plan.patches]
    assert "BUILDER_TORCH_FLOOR" not in plan.env


@needs_local_index
def test_a_torch_below_the_floor_is_per_torch_with_auto_and_refused_when_stable_is_asked(tmp_path: Path) -> None:
    settings = stable_recipes(tmp_path, STABLE.replace('"2.11"', '"2.15"') + PORT)
    assert make_plan(target(), settings).abi is Abi.PER_TORCH
    with pytest.raises(UsageError, match=r"torch 2.14.1 is below the port's floor 2.15"):
        make_plan(target(abi="torch-stable"), settings)


@needs_local_index
def test_stable_asked_for_a_recipe_without_a_port_says_why(tmp_path: Path) -> None:
    settings = Settings.from_env({}, recipes_dir=FIXTURES / "recipes", cache_dir=tmp_path / "cache")
    with pytest.raises(UsageError, match=r"has no stable-ABI port \(\[stable-abi\] in its recipe\)"):
        make_plan(target(abi="torch-stable"), settings)


def fake_interpreter(tmp_path: Path, python: str, torch: str | None) -> str:
    """An executable that answers the interpreter probe as a Python ``python`` holding ``torch`` would."""
    import json

    path = tmp_path / f"python{python}"
    facts = {"version": python, "full": f"{python}.1", "executable": str(path), "purelib": str(tmp_path),
             "torch": torch, "torch_cuda": "13.0" if torch else None}
    path.write_text(f"#!/bin/sh\necho '{json.dumps(facts)}'\n")
    path.chmod(0o755)
    return str(path)


@needs_local_index
def test_auto_picks_the_stable_wheel_for_a_given_interpreter_and_says_why(tmp_path: Path) -> None:
    """Issue 39: `--python python3` (an interpreter with its own torch, the GPU machine's) got a per-torch wheel
    under --abi auto, silently. Its torch and Python are asked now, and the plan says what it picked and why."""
    settings = stable_recipes(tmp_path)
    given = fake_interpreter(tmp_path, "3.12", "2.11.0+cu130")
    plan = make_plan(target(python=PythonSpec(given), torch=None), settings)
    assert plan.abi is Abi.TORCH_STABLE and plan.label("2.11.0") == "cu13"
    assert "0003-stable-port.patch" in [p.name for p in plan.patches]
    rows = dict(plan.describe())
    assert rows["abi choice"] == (f"torch-stable (--abi auto): tinyext 0.1.0 is covered by its stable-ABI port (<1,>=0.1), "
                                  f"torch 2.11.0+cu130 (in --python {given}) is at or above its floor 2.11, Python "
                                  f"3.12 (in --python {given}) at or above the abi3 wheel's 3.10")
    assert rows["torch"].startswith(f"from {given} (2.11.0+cu130) from") and rows["label"] == "cu13"


@needs_local_index
@pytest.mark.parametrize(("python", "torch", "why"), [
    ("3.12", "2.10.0+cu128", "torch 2.10.0+cu128 (in --python {given}) is below the port's floor 2.11"),
    ("3.9", "2.11.0+cu130", "Python 3.9 (in --python {given}) is below the abi3 wheel's 3.10"),
    ("3.12", None, "no torch is importable (in --python {given})"),
])
def test_auto_says_why_a_given_interpreter_gets_a_per_torch_wheel(tmp_path: Path, python: str, torch: str | None,
                                                                  why: str) -> None:
    settings = stable_recipes(tmp_path)
    given = fake_interpreter(tmp_path, python, torch)
    plan = make_plan(target(python=PythonSpec(given), torch=None), settings)
    assert plan.abi is Abi.PER_TORCH
    assert dict(plan.describe())["abi choice"].startswith("per-torch (--abi auto): " + why.format(given=given))
    with pytest.raises(UsageError, match=r"cannot be built against the stable ABI: " + re.escape(why.format(given=given))):
        make_plan(target(python=PythonSpec(given), torch=None, abi="torch-stable"), settings)


@needs_local_index
def test_a_python_below_the_abi3_floor_is_per_torch_with_auto(tmp_path: Path) -> None:
    """The leftover "plan.choose_abi ignores python-floor": a cp310-abi3 wheel cannot be built on 3.9."""
    settings = stable_recipes(tmp_path, STABLE + 'python-floor = "3.12"\n' + PORT)
    plan = make_plan(target(), settings)  # Python 3.11
    assert plan.abi is Abi.PER_TORCH
    assert dict(plan.describe())["abi choice"] == "per-torch (--abi auto): Python 3.11 is below the abi3 wheel's 3.12"
    stable = make_plan(target(), stable_recipes(tmp_path / "b"))
    assert dict(stable.describe())["abi choice"].startswith("torch-stable (--abi auto): ")
    assert "torch 2.14.1 is at or above its floor 2.11" in dict(stable.describe())["abi choice"]


@pytest.mark.parametrize(("extra", "message"), [
    ('[stable-abi]\nversions = "==0.1"\ntorch-floor = "2"\nnamespaces = ["x"]\n', "must be a torch minor"),
    ('[stable-abi]\nversions = "==0.1"\ntorch-floor = "2.9"\nnamespaces = ["x"]\n', "shims start at 2.10"),
    ('[stable-abi]\nversions = "==0.1"\ntorch-floor = "2.11"\n', "namespaces' is required"),
    ('[stable-abi]\nversions = "==0.1"\ntorch-floor = "2.11"\nnamespace = ["x"]\n', "unknown field 'stable-abi.namespace'"),
    (STABLE + PORT.replace('"torch-stable"', '"stable"'), r"patch\[2\].abi' is 'stable'"),
])
def test_bad_stable_abi_fields_name_the_field(tmp_path: Path, extra: str, message: str) -> None:
    settings = stable_recipes(tmp_path, extra)
    with pytest.raises(RecipeError, match=message):
        load_recipe(settings.recipes_dir / "tinyext" / "recipe.toml", settings.patches_dir)


def pypi_like() -> TorchIndex:
    releases = [("2.10.0", "12.8"), ("2.11.0", "13.0"), ("2.12.0", "13.0"), ("2.12.1", "13.0"), ("2.13.0", "13.0"),
                ("2.14.0", "13.0"), ("2.14.1", "13.0"), ("2.15.0", "13.2")]
    listing = Listing(name="pypi", url="https://pypi.org/simple", source="index", read_at="2026-12-02T00:00:00Z",
                      releases=tuple(Release(version=v, cuda=c, pythons=("3.12",), evidence="test", read_at="")
                                     for v, c in releases))
    return TorchIndex("pypi", "https://pypi.org/simple", listing)


def test_the_range_is_the_newest_release_of_each_minor_of_the_cuda_major_from_the_floor(tmp_path: Path) -> None:
    stable = load_recipe(stable_recipes(tmp_path).recipes_dir / "tinyext" / "recipe.toml",
                         tmp_path / "patches").stable_abi
    assert stable is not None
    assert torches_to_check(pypi_like(), CudaVersion.parse("13.0"), stable) == [
        ("2.11.0", "13.0"), ("2.12.1", "13.0"), ("2.13.0", "13.0"), ("2.14.1", "13.0"), ("2.15.0", "13.2")]
    assert torches_to_check(pypi_like(), CudaVersion.parse("12.8"), stable) == []  # 2.10 is below the floor


def test_the_range_takes_the_other_indexes_torches_the_wheel_claims(tmp_path: Path) -> None:
    """A +cu13 wheel built from PyPI is for PyTorch's cu130 channel's 2.15 (a 13.0 build; PyPI's is 13.2) and the
    cu132 channel's 2.12-2.14 too (the users' matrix, farm/coverage.py): those are tried from those channels; a
    +cu12 wheel built from the cu128 channel takes cu129's 2.11. From the shipped snapshots (offline, no cache)."""
    from builder.discovery.compat import resolve_index

    settings = Settings.from_env({}, cache_dir=tmp_path / "cache", offline=True)
    stable = load_recipe(stable_recipes(tmp_path).recipes_dir / "tinyext" / "recipe.toml",
                         tmp_path / "patches").stable_abi
    assert stable is not None and stable.floor_text == "2.11"
    pypi = resolve_index(None, settings)
    cuda13 = CudaVersion.parse("13.0")
    found = other_index_torches(pypi, cuda13, stable, torches_to_check(pypi, cuda13, stable), settings)
    assert [(i.name, t) for i, t in found] == [
        ("pytorch-cu130", [("2.15.0", "13.0")]),
        ("pytorch-cu132", [("2.12.1", "13.2"), ("2.13.0", "13.2"), ("2.14.1", "13.2")])]
    cu128, cuda12 = resolve_index("cu128", settings), CudaVersion.parse("12.8")
    found = other_index_torches(cu128, cuda12, stable, torches_to_check(cu128, cuda12, stable), settings)
    assert [(i.name, t) for i, t in found] == [("pytorch-cu129", [("2.11.0", "12.9")])]  # cu126's 12.6 is older
    local = resolve_index(str(LOCAL_TORCH_INDEX), settings)  # a mirror or a local folder: its own torches only
    assert other_index_torches(local, cuda13, stable, torches_to_check(pypi, cuda13, stable), settings) == []


def test_a_stable_build_defaults_to_the_floor_minor(tmp_path: Path) -> None:
    recipe = load_recipe(stable_recipes(tmp_path).recipes_dir / "tinyext" / "recipe.toml", tmp_path / "patches")
    assert default_build_torch(pypi_like(), CudaVersion.parse("13.0"), recipe, Abi.TORCH_STABLE) == "2.11.0"
    assert default_build_torch(pypi_like(), CudaVersion.parse("13.0"), recipe, Abi.PER_TORCH) == "2.14.1"
    assert default_build_torch(pypi_like(), CudaVersion.parse("13.2"), recipe, Abi.TORCH_STABLE) == "2.15.0"


def test_the_probe_verdicts(tmp_path: Path) -> None:
    stable = load_recipe(stable_recipes(tmp_path).recipes_dir / "tinyext" / "recipe.toml",
                         tmp_path / "patches").stable_abi
    assert stable is not None
    good = {"python": "3.12.1", "torch": "2.12.1+cu130", "cuda": "13.0", "ops": ["tinyext::axpy"],
            "without_cuda_kernel": []}
    check = judge_probe(good, "2.12.1", "13.0", stable)
    assert check.passed and check.channel == "cu130torch2.12" and "1 op registered" in check.detail
    assert judge_probe({**good, "without_cuda_kernel": ["tinyext::axpy"]}, "2.12.1", "13.0", stable).detail == (
        "no CUDA kernel for tinyext::axpy")
    assert "no ops registered in namespace tinyext" in judge_probe({**good, "ops": []}, "2.12.1", "13.0", stable).detail
    broken = judge_probe({"python": "3.12.1", "error": "OSError: undefined symbol: _ZN3c10"}, "2.13.0", "13.0", stable)
    assert broken.status == "failed" and "undefined symbol" in broken.detail


def test_a_records_torch_checks_round_trip_and_name_their_channels() -> None:
    """Which channels list a wheel is index/channelpolicy.wheel_channels' rule (tests/test_index_stable_abi.py); the record
    keeps the checks as JSON and each names its channel."""
    checks = (TorchCheck(torch="2.11.0", cuda="13.0", python="3.12", how="import+registration", status="passed"),
              TorchCheck(torch="2.15.0", cuda="13.2", python="3.12", how="import+registration", status="failed"))
    record = BuildRecord(abi="torch-stable", torch_floor="2.11", torch_checks=checks)
    again = BuildRecord.from_json(record.to_json())
    assert again.torch_checks == checks and again.is_stable_abi and again.torch_floor == "2.11"
    assert [c.channel for c in checks] == ["cu130torch2.11", "cu132torch2.15"] and not checks[1].passed
    assert "abi" not in BuildRecord().to_json()  # per-torch records (and the wheels holding them) as before


def test_labels() -> None:
    assert stable_label(CudaVersion.parse("13.0")) == "cu13"
    assert Label.parse("cu13") == Label(13) and Label.parse("cu130torch2.11") == Label(13, 0, (2, 11))
    assert channel_label("13.2", "2.15.0+cu132") == "cu132torch2.15"


def test_a_patch_that_builds_on_the_one_before_it_is_checked_on_that_tree(tmp_path: Path) -> None:
    """A port stacked on the build-script fixes (mamba-ssm 0004 edits lines 0001-0003 wrote): each patch is
    dry-run on the tree the patches before it made, in the early drift check and when applied."""
    from packaging.specifiers import SpecifierSet

    from builder.model.recipeparts import PatchSpec
    from builder.stages.patch import apply_patches, check_patches

    src = tmp_path / "demo-1.0"
    src.mkdir()
    (src / "setup.py").write_text("flags = []\n")
    first, second = tmp_path / "0001.patch", tmp_path / "0002.patch"
    first.write_text("--- a/setup.py\n+++ b/setup.py\n@@ -1 +1 @@\n-flags = []\n+flags = ['-O3']\n")
    second.write_text("--- a/setup.py\n+++ b/setup.py\n@@ -1 +1 @@\n-flags = ['-O3']\n+flags = ['-O3', '-DSTABLE']\n")
    specs = tuple(PatchSpec(path=p, versions=SpecifierSet(">=1"), summary="") for p in (first, second))
    (tmp_path / "scratch").mkdir()
    check_patches(src, specs, "demo", "1.0", tmp_path / "scratch")
    assert (src / "setup.py").read_text() == "flags = []\n"  # the check works on a copy
    apply_patches(src, specs, "demo", "1.0")
    assert (src / "setup.py").read_text() == "flags = ['-O3', '-DSTABLE']\n"
