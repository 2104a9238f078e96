"""One definition of a target's inputs (stages/inputs.py): the cache key's value, and its three users."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.version import Version

from builder.core.settings import Settings
from builder.model.arch import parse_arch_list
from builder.model.cuda import CudaVersion
from builder.model.python import PythonSpec
from builder.model.records import BuildRecord
from builder.stages.inputs import UNKNOWN, TargetInputs, recorded_inputs, target_inputs
from builder.stages.plan import Target, make_plan
from builder.stages.pyenv import PythonEnv
from tests.helpers import FIXTURES, LOCAL_TORCH_INDEX

# The same inputs must keep the same key, or every wheel in every wheelhouse would be rebuilt. They change only
# with builder.__version__, the tinyext fixture's recipe content or patches, or a change to what the key covers:
# computed on main (52c90c2) before the inputs were given their own type, and again once (issue 26) when the key
# began to cover the recipe's parsed content instead of its file's bytes (a comment no longer rebuilds).
PINNED = {
    "host": "52cbce45aea1e40d258d721ca8e3ea982fcdf537623cdde2cbb04f98657c9956",
    "host+compiler": "548043d837627145124d911f1a91f4d15f27589fd153bf429331aa5dddec1880",
    "no toolkit": "ab0438cc94184616ed10df3b85a33201f02bf66893270067d75475d591d2905a",
}


def tinyext_plan(tmp_path: Path):
    settings = Settings.from_env({}, recipes_dir=FIXTURES / "recipes", cache_dir=tmp_path / "cache")
    archs = parse_arch_list("90,120+ptx")
    return make_plan(Target(package="tinyext", version="0.1.0", cuda=CudaVersion.parse("13.0"), archs=archs,
                            python=PythonSpec("3.11"), torch="2.14.1", torch_index=str(LOCAL_TORCH_INDEX),
                            toolchain="host"),
                     settings)


def build_venv(version: str, torch: str | None) -> PythonEnv:
    """A build venv's identity as the probe reports it (no interpreter is run: only version and torch count)."""
    return PythonEnv(python=Path("/venv/bin/python"), version=version, torch=torch, torch_cuda="13.0",
                     purelib=Path("/venv/lib/python3.11/site-packages"), managed=True)


def test_cache_key_values_are_the_ones_main_computed(tmp_path: Path) -> None:
    plan = tinyext_plan(tmp_path)
    toolkit = {"kind": "host", "nvcc": "13.0.88", "cuda_home": "/x"}
    args = dict(source_digest="0" * 64, toolkit=toolkit, python=build_venv("3.11.7", "2.14.1+cu130"))
    assert target_inputs(plan, **args).cache_key() == PINNED["host"]
    compiler = {"cxx": "/usr/bin/c++: g++ 12.2.0"}
    assert target_inputs(plan, **args, compiler=compiler).cache_key() == PINNED["host+compiler"]
    pure = target_inputs(plan, source_digest="1" * 64, toolkit=None, python=build_venv("3.11.7", "2.14.1"))
    assert pure.cache_key() == PINNED["no toolkit"]


@dataclass(frozen=True, kw_only=True)
class WithNewInput(TargetInputs):
    """TargetInputs with one more input, as a future change would add one (its value set by the test)."""

    new_input: str = field(default_factory=lambda: NEW_INPUT["value"])


NEW_INPUT = {"value": "one"}


def add_new_input(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    import builder.stages.inputs

    NEW_INPUT["value"] = value
    monkeypatch.setattr(builder.stages.inputs, "TargetInputs", WithNewInput)


def test_recorded_inputs_of_a_record_give_back_its_cache_key(tmp_path: Path) -> None:
    """A record as the build writes it names every input but the recipe's env (which its recipe sha256 covers)."""
    import dataclasses

    plan = tinyext_plan(tmp_path)
    toolkit = {"kind": "host", "nvcc": "13.0.88", "cuda_home": "/x"}
    inputs = target_inputs(plan, source_digest="0" * 64, toolkit=toolkit, python=build_venv("3.11.7", "2.14.1+cu130"),
                           compiler={"cxx": "/usr/bin/c++: g++ 12.2.0"})
    recorded = recorded_inputs(BuildRecord.from_json(record_of(plan, inputs, toolkit)))
    assert recorded.env is UNKNOWN and inputs.agrees(recorded)
    assert dataclasses.replace(recorded, env=inputs.env).cache_key() == inputs.cache_key() == PINNED["host+compiler"]
    assert not inputs.agrees(dataclasses.replace(recorded, compiler=(("cxx", "/usr/bin/c++: g++ 13.1.0"),)))


def record_of(plan, inputs: TargetInputs, toolkit: dict[str, str]) -> dict:
    """The input fields of a build record as pipeline/run.py writes them."""
    return {
        "builder_version": inputs.builder, "cache_key": inputs.cache_key(), "package": plan.recipe.name,
        "version": plan.version, "recipe": {"file": plan.recipe.file.name, "sha256": plan.recipe.sha256(),
                                                  "content_sha256": plan.recipe.content_digest()},
        "source": {"kind": "path", "location": "x", "sha256": inputs.source},
        "patches": [{"file": p.name, "sha256": p.sha256(), "versions": str(p.versions)} for p in plan.patches],
        "cuda": str(plan.cuda), "archs": [str(a) for a in plan.target.archs], "toolchain": toolkit,
        "host_compiler": dict(inputs.compiler) if inputs.compiler else None,
        "python": {"python": "/venv/bin/python", "version": inputs.python, "torch": inputs.torch, "torch_cuda": "13.0"},
        "torch_index": plan.index.url,
    }


def test_a_new_input_changes_the_key_and_what_matrix_changed_compares(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a field to TargetInputs is all it takes: the key covers it, and a record without it disagrees.
    (tests/test_farm_e2e.py shows the build and the farm's up-front check react, against a real build.)"""
    plan = tinyext_plan(tmp_path)
    toolkit = {"kind": "host", "nvcc": "13.0.88"}
    parts = dict(source_digest="0" * 64, toolkit=toolkit, python=build_venv("3.11.7", "2.14.1+cu130"))
    before = target_inputs(plan, **parts)
    record = BuildRecord.from_json(record_of(plan, before, toolkit))
    partial = dict(source_digest="0" * 64, toolkit=UNKNOWN, python=UNKNOWN, compiler=UNKNOWN)  # a CPU runner's
    assert target_inputs(plan, **partial).agrees(recorded_inputs(record))
    add_new_input(monkeypatch, "one")
    after = target_inputs(plan, **parts)
    assert isinstance(after, WithNewInput) and after.cache_key() not in (before.cache_key(), PINNED["host"])
    assert not target_inputs(plan, **partial).agrees(recorded_inputs(record))  # an old record: built without it
    add_new_input(monkeypatch, "two")
    assert target_inputs(plan, **parts).cache_key() != after.cache_key()


def test_a_recipe_turning_ptxas_split_off_builds_without_it_and_gets_another_key(tmp_path: Path) -> None:
    from builder.stages.inputs import toolkit_record
    from builder.toolchain.base import CudaToolkit

    toolkit = CudaToolkit("host", Path("/cuda"), Version("13.0.88"))
    plan = tinyext_plan(tmp_path)
    assert plan.recipe.ptxas_split and "--split-compile=" in toolkit_record(plan, toolkit)["nvcc_flags"]
    recipes = tmp_path / "recipes"
    shutil.copytree(FIXTURES / "recipes", recipes)
    for name in ("patches", "tinyext"):  # the recipe's patches and source.path, relative to it
        shutil.copytree(FIXTURES / name, tmp_path / name)
    recipe = recipes / "tinyext" / "recipe.toml"
    text = recipe.read_text()
    assert "[build]" in text
    recipe.write_text(text.replace("[build]", "[build]\nptxas-split = false", 1))
    settings = Settings.from_env({}, recipes_dir=recipes, cache_dir=tmp_path / "cache")
    off = make_plan(plan.target, settings)
    record = toolkit_record(off, toolkit)
    assert not off.recipe.ptxas_split and "split-compile" not in record["nvcc_flags"]
    assert "--compress-mode=size" in record["nvcc_flags"]  # only that flag goes
    args = dict(source_digest="0" * 64, python=build_venv("3.11.7", "2.14.1+cu130"))
    assert (target_inputs(off, toolkit=record, **args).cache_key()
            != target_inputs(plan, toolkit=toolkit_record(plan, toolkit), **args).cache_key())
    recipe.write_text(text.replace("[build]", '[build]\nptxas-split = "no"', 1))
    from builder.model.recipe import RecipeError, load_recipe

    with pytest.raises(RecipeError, match=r"field 'build.ptxas-split' must be a boolean"):
        load_recipe(recipe, tmp_path / "patches")


# ---------------------------------------------------------------- one resolution for the build and the farm's check


@pytest.fixture
def resolving(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[object]]:
    """resolve_inputs with a stand-in toolkit and build venv (no CUDA or torch needed); each call is counted."""
    from builder.pipeline import resolveinputs as resolver
    from builder.stages.plan import Plan
    from builder.toolchain.base import BuildHost, CudaToolkit, ToolchainChoice
    from builder.toolchain.local import LocalRunner

    calls: dict[str, list[object]] = {"select": [], "python": [], "patches": [], "container": []}
    toolkit = CudaToolkit("host", Path("/cuda"), Version("13.0.88"), reason="stand-in")

    def select(requested: str, cuda: object, settings: Settings, env: object, *,
               components: tuple[str, ...] = (), here_only: bool = False) -> ToolchainChoice:
        calls["select"].append((requested, str(cuda)))
        return ToolchainChoice(requested, toolkit, host=LocalRunner(toolkit, memo=tmp_path / "memo"))

    def python_for(plan: Plan, settings: Settings, host: BuildHost) -> tuple[PythonEnv, Path]:
        calls["python"].append(plan.target.python)
        return build_venv("3.11.7", "2.14.1+cu130"), Path("/usr/bin/python3.11")

    check_patches = resolver.check_patches
    monkeypatch.setattr(resolver, "select_toolkit", select)
    monkeypatch.setattr(resolver, "python_for", python_for)
    monkeypatch.setattr(resolver, "check_patches", lambda *a: (calls["patches"].append(a), check_patches(*a)))
    monkeypatch.setattr(resolver, "may_use_container", lambda name, env: calls["container"].append(name) or False)
    return calls


@pytest.mark.skipif(not shutil.which("c++"), reason="no c++ on PATH: a host build's key names it")
def test_the_build_and_the_farms_check_resolve_the_same_key(tmp_path: Path, resolving: dict,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """run_build's key and find_unchanged's (offline, memoised, no patch dry run) come from one function; matrix
    --changed's inputs agree with them, differing only in what it cannot know."""
    import dataclasses

    from builder.pipeline import run
    from builder.pipeline.resolveinputs import InputsMemo, known_inputs, resolve_inputs
    from builder.pipeline.run import BuildOptions, run_build

    plan = tinyext_plan(tmp_path)
    settings = Settings.from_env({}, recipes_dir=FIXTURES / "recipes", cache_dir=tmp_path / "cache",
                                 wheelhouse=tmp_path / "wheelhouse")
    built: list[object] = []
    monkeypatch.setattr(run, "_build_in", lambda inputs, *a: built.append(inputs.resolved))  # no compile
    result = run_build(plan.target, settings, BuildOptions(), env={"PATH": "/usr/bin:/bin"})
    (resolved,) = built
    assert list(result.timings) == ["plan", "toolchain", "source", "python"]
    toolkit = resolved.toolkit
    assert toolkit is not None and resolved.compiler is not None  # this machine's c++, as the key names it
    assert resolved.inputs == target_inputs(plan, source_digest=resolved.source_digest, python=resolved.python,
                                            toolkit=toolkit.record(ptxas_split=True), compiler=resolved.compiler)
    assert len(resolving["patches"]) == 1 and resolving["container"] == []  # a build dry-runs the patches
    offline = dataclasses.replace(settings, offline=True)
    with InputsMemo.for_check() as memo:
        checked = [resolve_inputs(plan, offline, {"PATH": "/usr/bin:/bin"}, memo) for _ in range(3)]
    assert {c.key for c in checked} == {resolved.key} == {resolved.inputs.cache_key()}
    assert len(resolving["select"]) == 2 and len(resolving["python"]) == 2  # the check: once for three targets
    assert len(resolving["patches"]) == 1 and resolving["container"] == ["host"]  # no dry run, one engine question
    known = known_inputs(plan)
    assert known.toolkit is UNKNOWN and known.python is UNKNOWN and known.compiler is UNKNOWN
    assert known.agrees(resolved.inputs) and known.source == resolved.source_digest


def test_the_farms_check_leaves_a_possible_container_build_undecided(tmp_path: Path, resolving: dict,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from builder.pipeline import resolveinputs as resolver
    from builder.pipeline.resolveinputs import InputsMemo, Undecided, resolve_inputs

    monkeypatch.setattr(resolver, "may_use_container", lambda name, env: resolving["container"].append(name) or True)
    plan = tinyext_plan(tmp_path)
    offline = Settings.from_env({}, recipes_dir=FIXTURES / "recipes", cache_dir=tmp_path / "cache", offline=True)
    with InputsMemo.for_check() as memo:
        for _ in range(2):
            with pytest.raises(Undecided):
                resolve_inputs(plan, offline, {}, memo)
    assert resolving["container"] == ["host"] and resolving["select"] == [] and resolving["python"] == []
