"""Farm files: strict validation, matrix expansion with exclusions, the GitHub matrix, change detection, watch.

No compiling and no network here: recipes are local fixtures, PyPI release lists are injected.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from builder import __version__
from builder.core.errors import RecipeError, UsageError
from builder.core.settings import Settings
from builder.farm.expand import expand
from builder.farm.ghmatrix import github_matrix
from builder.farm.spec import FarmError, load_farm
from builder.farm.unchanged import changed_targets, known_inputs, record_matches
from builder.farm.watch import watch
from builder.model.arch import format_arch_list, parse_arch_list
from builder.model.cuda import CudaVersion
from builder.model.python import PythonSpec
from builder.model.recipe import load_recipe
from builder.model.records import BuildRecord
from builder.stages.testing import runnable_on
from tests.helpers import DEMO_RECIPE, FIXTURES, PURE_RECIPE, ROOT, run_cli, write_recipes

RECIPE = DEMO_RECIPE + '[[patch]]\nfile = "fix.patch"\nversions = ">=1.0,<1.5"\n'

RELEASES = {"demo": ["0.9", "1.0", "1.1", "1.2rc1", "1.4", "2.0"], "puredemo": ["0.1", "0.2", "1.0"]}


def fake_releases(name: str, settings: Settings) -> list[str]:
    return RELEASES[name]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """recipes/demo (PyPI, with a patch for <1.5), recipes/puredemo (pure Python); returns the folder."""
    write_recipes(tmp_path, {"demo": RECIPE, "puredemo": PURE_RECIPE})
    (tmp_path / "patches" / "demo").mkdir(parents=True)
    (tmp_path / "patches" / "demo" / "fix.patch").write_text("--- a/x\n+++ b/x\n")
    return tmp_path


def settings_for(tree: Path) -> Settings:
    return Settings.from_env({}, cache_dir=tree / "cache", wheelhouse=tree / "wheelhouse", recipes_dir=tree / "recipes")


def write_farm(tree: Path, text: str) -> Path:
    path = tree / "farm.toml"
    path.write_text(text)
    return path


GOOD = """
[defaults]
recipes = "recipes"
cuda = ["12.8", "13.0"]
archs = ["120", "90,120+ptx"]
python = "3.12"

[[package]]
name = "demo"
newest = 2

[[package]]
name = "puredemo"
versions = ["0.2"]

[[exclude]]
package = "demo"
version = "<1.4"
cuda = "12.8"

[[exclude]]
arch = "120+ptx,90"
cuda = "13.0"
package = "demo"

[[exclude]]
arch = "120"
cuda = "12.8"
package = "demo"
"""


# ---------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("mutation", "needle", "hint"),
    [
        (lambda t: t.replace("newest = 2", "newst = 2"), "unknown field 'package[0].newst'", "did you mean 'newest'?"),
        (lambda t: t.replace("[defaults]", "[default]"), "unknown field 'default'", "did you mean 'defaults'?"),
        (lambda t: t.replace('python = "3.12"', 'pyton = "3.12"'), "unknown field 'defaults.pyton'",
         "did you mean 'python'?"),
        (lambda t: t.replace('cuda = "12.8"', 'cdua = "12.8"'), "unknown field 'exclude[0].cdua'",
         "did you mean 'cuda'?"),
        (lambda t: t.replace('versions = ["0.2"]', 'version = ["0.2"]'), "unknown field 'package[1].version'",
         "did you mean 'versions'?"),
        (lambda t: t + "\n[runners]\nsm120 = 'x'\n", "field 'runners.sm120' must be an arch number", None),
        (lambda t: t.replace("newest = 2", "newest = 0"), "field 'package[0].newest' must be at least 1", None),
        (lambda t: t.replace("newest = 2", 'newest = "2"'), "field 'package[0].newest' must be an integer, not str",
         None),
        (lambda t: t.replace("newest = 2", "newest = 2\nversions = ['1.0']"), "gives both 'versions' and 'newest'",
         None),
        (lambda t: t.replace("newest = 2", "newest = 2\nprevious = 1"), "gives 'previous' with 'versions' or 'newest'",
         "give it alone"),
        (lambda t: t.replace("newest = 2", "previous = 0"), "field 'package[0].previous' must be at least 1", None),
        (lambda t: t.replace('cuda = ["12.8", "13.0"]', 'cuda = ["12.8", "99.1"]'),
         "field 'defaults.cuda[1]' is not a known CUDA version", "use one of"),
        (lambda t: t.replace('archs = ["120", "90,120+ptx"]', 'archs = ["120", "sm_abc"]'),
         "field 'defaults.archs[1]' is not an arch list", None),
        (lambda t: t.replace('archs = ["120", "90,120+ptx"]', 'archs = ["120", "sm_120"]'),
         "field 'defaults.archs' names one arch list twice", None),
        (lambda t: t.replace('python = "3.12"', 'python = "3.x"'), "field 'defaults.python[0]' is neither", None),
        (lambda t: t.replace('python = "3.12"', 'python = "3.12"\ntoolchain = "dokcer"'),
         "field 'defaults.toolchain' is 'dokcer'", "did you mean 'docker'?"),
        (lambda t: t.replace('python = "3.12"', 'python = "3.12"\ntorch = ["2.x"]'),
         "field 'defaults.torch[0]' is not a version", None),
        (lambda t: t.replace('recipes = "recipes"', 'recipes = "nowhere"'), "field 'defaults.recipes' folder", None),
        (lambda t: t.replace('name = "puredemo"', ""), "field 'package[1].name' is required", None),
        (lambda t: t.replace('cuda = ["12.8", "13.0"]', ""), "field 'package[0].cuda' is required", None),
        (lambda t: t.replace('version = "<1.4"', 'version = "1.x"'), "field 'exclude[0].version'", None),
        (lambda t: t.replace('versions = ["0.2"]', 'versions = ["0.2"]\nsource = { "0.3" = "x" }'),
         "field 'package[1].source.0.3' names a version that is not in package[1].versions", None),
        (lambda t: t.replace('python = "3.12"', 'python = "3.12"\njobs = true'),
         "field 'defaults.jobs' must be an integer, not bool", None),
        (lambda t: t.replace("[[exclude]]\narch", "[[exclude]]\n[[exclude]]\narch", 1), "field 'exclude[1]' is empty",
         None),
        (lambda t: "[defaults]\ncuda = '13.0'\n", "field 'package' is required", None),
        (lambda t: t + "\n[[package]\n", "not valid TOML", None),
    ],
)
def test_schema_errors_name_file_and_field(tree: Path, mutation, needle: str, hint: str | None) -> None:
    path = write_farm(tree, mutation(GOOD))
    with pytest.raises(FarmError) as info:
        load_farm(path)
    assert str(path) in info.value.message and needle in info.value.message, info.value.one_line()
    if hint:
        assert hint in (info.value.hint or ""), info.value.one_line()
    assert isinstance(info.value, RecipeError) and info.value.exit_code == 3


def test_good_farm_loads_with_defaults_and_overrides(tree: Path) -> None:
    farm = load_farm(write_farm(tree, GOOD))
    demo, pure = farm.entries
    assert demo.newest == 2 and demo.python == (PythonSpec("3.12"),) and demo.recipes == tree / "recipes"
    assert demo.archs == (parse_arch_list("120"), parse_arch_list("90,120+ptx"))  # typed, sorted
    assert [str(c) for c in demo.cuda] == ["12.8", "13.0"] and demo.cuda[0] == CudaVersion((12, 8))
    assert pure.python == (PythonSpec("3.12"),) and pure.versions == ("0.2",)
    assert farm.excludes[1].arch == parse_arch_list("90,120+ptx")  # "120+ptx,90" normalised the same way
    with pytest.raises(dataclasses.FrozenInstanceError):
        demo.name = "x"  # type: ignore[misc]  (frozen)


# ---------------------------------------------------------------- expansion


def test_expansion_newest_n_defaults_torch_and_exclusions(tree: Path) -> None:
    farm = load_farm(write_farm(tree, GOOD))
    targets = expand(farm, settings_for(tree), releases=fake_releases)
    cells = [(t.package, t.version, str(t.cuda), format_arch_list(t.archs), str(t.python), t.torch) for t in targets]
    assert cells == [
        # newest 2 in range >=1.0,<2 (1.2rc1 is a pre-release, 2.0 outside): 1.4 and 1.1, newest first;
        # exclude[2] drops arch 120 on 12.8, exclude[1] arch 90,120+ptx on 13.0, exclude[0] 1.1 on 12.8
        ("demo", "1.4", "12.8", "90,120+ptx", "3.12", "2.10.0"),
        ("demo", "1.4", "13.0", "120", "3.12", "2.14.1"),
        ("demo", "1.1", "13.0", "120", "3.12", "2.14.1"),
        # pure Python: one py3-none-any wheel per version, built with the entry's first cell (CUDA 12.8, its
        # newest torch, the first Python); no arch dimension (the first arch list only picks the test runner)
        ("puredemo", "0.2", "12.8", "120", "3.12", "2.10.0"),
    ]
    assert [t.id for t in targets][:2] == ["demo-1.4-cu128-sm90_120ptx-x86_64-py3.12-torch2.10.0",
                                           "demo-1.4-cu130-sm120-x86_64-py3.12-torch2.14.1"]
    assert targets[-1].id == "puredemo-0.2-cu128-py3.12-torch2.10.0"
    assert len({t.id for t in targets}) == len(targets)
    only = expand(farm, settings_for(tree), only=["PureDemo"], releases=fake_releases)
    assert {t.package for t in only} == {"puredemo"}
    with pytest.raises(UsageError) as info:
        expand(farm, settings_for(tree), only=["puredem"], releases=fake_releases)
    assert "--only puredem" in info.value.message and info.value.hint == "did you mean 'puredemo'?"


def test_a_pure_python_recipe_is_one_build_per_version_whatever_its_cuda_torch_and_python_lists(
        tree: Path) -> None:
    """py3-none-any: one file per version, so one build, however many CUDA lines, torches and Pythons the entry
    names; the first Python its torch has builds it."""
    text = GOOD.replace('versions = ["0.2"]', 'versions = ["0.2"]\npython = ["3.8", "3.13", "3.12"]\ntorch-newest = 3')
    targets = expand(load_farm(write_farm(tree, text)), settings_for(tree), releases=fake_releases)
    (pure,) = [t for t in targets if t.package == "puredemo"]
    assert (str(pure.cuda), str(pure.python), pure.torch) == ("12.8", "3.13", "2.10.0")


@pytest.mark.parametrize(
    ("edit", "needle", "hint"),
    [
        # torch 2.14.1 is a CUDA 13.0 build: naming it for 12.8 too needs an explicit exclusion
        (lambda t: t.replace('python = "3.12"', 'python = "3.12"\ntorch = "2.14.1"'),
         "package[0] combines CUDA 12.8 with torch 2.14.1", "add [[exclude]] package = 'demo', cuda = '12.8', torch"),
        (lambda t: t.replace('archs = ["120", "90,120+ptx"]', 'archs = ["120", "70"]'),
         "package[0] combines CUDA 13.0 with archs 70", "arch = '70'"),
        (lambda t: t.replace("newest = 2", 'versions = ["2.0"]'), "field 'package[0].versions[0]' demo 2.0 is outside",
         None),
        (lambda t: t.replace("newest = 2", 'versions = ["1.3"]'), "demo 1.3 has no sdist on PyPI", None),
        (lambda t: t.replace('[[package]]\nname = "puredemo"', '[[package]]\nname = "demo"\nnewest = 1\n'
                                                                '[[package]]\nname = "puredemo"'),
         "package[1] repeats target demo-1.4-cu128-sm90_120ptx-x86_64-py3.12-torch2.10.0 of package[0]", None),
        # two arch lists for one CUDA × torch × Python would publish the same wheel file name
        (lambda t: t.replace('[[exclude]]\narch = "120"\ncuda = "12.8"\npackage = "demo"\n', ""),
         "target demo-1.4-cu128-sm90_120ptx-x86_64-py3.12-torch2.10.0 would publish the same wheel file as "
         "demo-1.4-cu128-sm120-x86_64-py3.12-torch2.10.0", "one arch list such as archs = ['90,120']"),
    ],
)
def test_expansion_refuses_what_cannot_be_built(tree: Path, edit, needle: str, hint: str | None) -> None:
    farm = load_farm(write_farm(tree, edit(GOOD)))
    with pytest.raises(FarmError) as info:
        expand(farm, settings_for(tree), releases=fake_releases)
    assert needle in info.value.message, info.value.one_line()
    if hint:
        assert hint in (info.value.hint or ""), info.value.one_line()


def test_unknown_recipe_names_close_match(tree: Path) -> None:
    farm = load_farm(write_farm(tree, GOOD.replace('name = "demo"', 'name = "dmeo"')))
    with pytest.raises(RecipeError, match="no recipe for package 'dmeo'"):
        expand(farm, settings_for(tree), releases=fake_releases)


def test_demo_farm_expands_to_two_packages_two_versions_two_targets(farm_demo: Path) -> None:
    farm = load_farm(farm_demo)
    targets = expand(farm, Settings.from_env({}))
    assert len(targets) == 8
    assert {(t.package, t.version) for t in targets} == {
        ("tinyext", "0.1.0"), ("tinyext", "0.2.0"), ("tinyscale", "0.1.0"), ("tinyscale", "0.2.0")}
    assert {format_arch_list(t.archs) for t in targets} == {"90,120"} and {str(t.python) for t in targets} == {"3.11", "3.12"}
    by_id, demo = {t.id: t for t in targets}, farm_demo.parent
    assert by_id["tinyext-0.2.0-cu130-sm90_120-x86_64-py3.11-torch2.14.1"].source == str(demo / "farm" / "tinyext-0.2.0")
    assert by_id["tinyext-0.1.0-cu130-sm90_120-x86_64-py3.12-torch2.14.1"].source is None  # the recipe's own
    assert by_id["tinyscale-0.1.0-cu130-sm90_120-x86_64-py3.11-torch2.14.1"].recipes == demo / "farm" / "recipes"
    assert all(t.toolchain == "host" and t.torch == "2.14.1" for t in targets)


def test_local_source_must_hold_the_pinned_version(farm_demo: Path) -> None:
    text = farm_demo.read_text().replace('"0.2.0" = "farm/tinyext-0.2.0"', '"0.2.0" = "tinyext"')  # 0.1.0's tree
    farm = load_farm(write_farm(farm_demo.parent, text))
    with pytest.raises(FarmError, match=r"field 'package\[0\].source' .*tinyext holds version 0.1.0, not 0.2.0"):
        expand(farm, Settings.from_env({}))


def test_root_farm_file_is_valid() -> None:
    farm = load_farm(ROOT / "farm.toml")
    assert {e.name for e in farm.entries} >= {"causal-conv1d", "mamba-ssm"}
    fixed = {"causal-conv1d": ["1.5.2", "1.6.2.post1", "1.7.0"], "fla-core": ["0.5.2", "0.6.0"],
             "flash-linear-attention": ["0.5.2", "0.6.0"], "flash-attn": ["2.8.3.post2"], "mamba-ssm": ["2.2.6.post3", "2.3.1", "2.3.2.post1"]}
    targets = expand(farm, Settings.from_env({}), releases=lambda name, s: fixed[name])
    assert targets and all(t.torch for t in targets)
    mamba = {(t.version, str(t.cuda)) for t in targets if t.package == "mamba-ssm"}
    assert ("2.3.2.post1", "12.8") in mamba and ("2.3.1", "13.0") in mamba and ("2.3.1", "12.8") not in mamba


# ---------------------------------------------------------------- GitHub matrix


def test_github_matrix_shape_through_the_cli(tmp_path: Path, farm_demo: Path) -> None:
    env = {"BUILDER_CACHE_DIR": str(tmp_path / "cache"), "BUILDER_WHEELHOUSE": str(tmp_path / "wheelhouse")}
    result = run_cli("matrix", "--file", str(farm_demo), "--format", "github", env=env)
    assert result.code == 0, result.stderr
    assert len(result.stdout.strip().splitlines()) == 1  # one line, for $GITHUB_OUTPUT
    matrix = json.loads(result.stdout)
    assert list(matrix) == ["include"] and len(matrix["include"]) == 8
    keys = {"id", "package", "version", "kind", "platform", "build_runner", "cuda", "arch", "python", "torch",
            "torch_index", "recipes", "source", "runner", "untested", "abi", "variants", "runners", "test_archs",
            "untested_archs"}
    for entry in matrix["include"]:
        assert set(entry) == keys and all(isinstance(v, str) for v in entry.values())
    first = matrix["include"][0]
    assert first == {
        "id": "tinyext-0.1.0-cu130-sm90_120-x86_64-py3.11-torch2.14.1", "package": "tinyext", "version": "0.1.0",
        "kind": "cuda-extension", "platform": "x86_64", "build_runner": "ubuntu-24.04", "cuda": "13.0",
        "arch": "90,120", "python": "3.11", "torch": "2.14.1", "torch_index": "", "recipes": "recipes", "source": "",
        "runner": "gpu-rtx5090", "untested": "", "abi": "auto", "variants": "", "runners": "gpu-rtx5090 gpu-sm90-x86_64",
        "test_archs": "120 90", "untested_archs": "",
    }
    assert {e["runner"] for e in matrix["include"]} == {"gpu-rtx5090"}  # [runners] "120" over the default template
    assert {e["source"] for e in matrix["include"]} == {"", "farm/tinyext-0.2.0", "farm/tinyscale-0.2.0"}
    only = json.loads(run_cli("matrix", "--file", str(farm_demo), "--format", "github", "--only", "tinyscale",
                              env=env).stdout)
    assert {e["package"] for e in only["include"]} == {"tinyscale"}
    table = run_cli("matrix", "--file", str(farm_demo), "--details", env=env)
    assert table.code == 0 and "8 targets" in table.stdout and "gpu-rtx5090" in table.stdout


def test_matrix_and_farm_cli_errors_are_one_line(tmp_path: Path, farm_demo: Path) -> None:
    env = {"BUILDER_CACHE_DIR": str(tmp_path / "cache"), "BUILDER_WHEELHOUSE": str(tmp_path / "wheelhouse")}
    bad = tmp_path / "farm.toml"
    bad.write_text(farm_demo.read_text().replace("archs =", "arches ="))
    for command in ("matrix", "farm", "watch"):
        result = run_cli(command, "--file", str(bad), env=env)
        assert result.code == 3 and "Traceback" not in result.stderr, result.stderr
        (line,) = result.error_lines
        assert "unknown field 'defaults.arches'" in line and "did you mean 'archs'?" in line
    result = run_cli("farm", "--file", str(farm_demo), "--parallel", "0", env=env)
    assert result.code == 2 and "argument --parallel: '0'" in result.error_lines[0]
    result = run_cli("matrix", "--file", str(tmp_path / "missing.toml"), env=env)
    assert result.code == 3 and "farm file not found" in result.error_lines[0]


def test_github_matrix_of_pure_python_targets_uses_first_arch_runner(tree: Path) -> None:
    farm = load_farm(write_farm(tree, GOOD))
    targets = expand(farm, settings_for(tree), releases=fake_releases)
    matrix = github_matrix(farm, targets)
    pure = [e for e in matrix["include"] if e["package"] == "puredemo"]
    assert {e["runner"] for e in pure} == {"gpu-sm120-x86_64"} and {e["kind"] for e in pure} == {"pure-python"}
    # a wheel with SASS for 90 and 120 is tested on the newest arch's runner, unless [runners] names another
    assert {e["runner"] for e in matrix["include"] if e["arch"] == "90,120+ptx"} == {"gpu-sm120-x86_64"}
    farm = load_farm(write_farm(tree, GOOD + '\n[runners]\n"90" = "h200"\ndefault = "gpu-{arch}"\n'))
    matrix = github_matrix(farm, expand(farm, settings_for(tree), releases=fake_releases))
    # without `available` every label exists: the 90,120+ptx wheel gets a test job on each arch's runner
    assert {e["arch"]: e["runners"] for e in matrix["include"]} == {"90,120+ptx": "gpu-120 h200", "120": "gpu-120"}


# ---------------------------------------------------------------- what the wheelhouse holds: matrix --changed


def _record_for(target, ident, **over) -> BuildRecord:
    record = {
        "builder_version": __version__, "cache_key": "k" * 64, "package": target.package, "version": target.version,
        "recipe": {"file": "recipe.toml", "sha256": "f" * 64, "content_sha256": ident.recipe},
        "source": {"kind": "path", "location": "x", "sha256": ident.source},
        "patches": [{"file": n, "sha256": s, "versions": ">=0.1,<1"} for n, s in ident.patches],
        "cuda": str(target.cuda), "archs": [str(a) for a in target.archs], "toolchain": {"kind": "host", "nvcc": "13.0.88"},
        "python": {"python": "/x/bin/python", "version": "3.11", "torch": "2.14.1+cu130", "torch_cuda": "13.0"},
        "torch_index": ident.index,
    }
    record.update(over)
    return BuildRecord.from_json(record)


def _publish_fake(house: Path, wheel_name: str, record: BuildRecord | dict) -> None:
    (house / "wheels").mkdir(parents=True, exist_ok=True)
    (house / "records").mkdir(parents=True, exist_ok=True)
    (house / "wheels" / wheel_name).write_bytes(b"not really a wheel")
    (house / "records" / f"{wheel_name}.json").write_bytes(record.file_bytes() if isinstance(record, BuildRecord)
                                                          else json.dumps(record).encode())


def test_changed_targets_compare_inputs_with_wheelhouse_records(tmp_path: Path, farm_demo: Path) -> None:
    settings = Settings.from_env({}, cache_dir=tmp_path / "cache", wheelhouse=tmp_path / "wheelhouse")
    targets = expand(load_farm(farm_demo), settings)
    assert changed_targets(targets, settings) == targets  # empty wheelhouse: everything
    first, second = targets[0], targets[1]
    ident = known_inputs(first, settings)
    assert ident.source and len(ident.patches) == 1 and ident.index == "https://pypi.org/simple"
    _publish_fake(tmp_path / "wheelhouse", "tinyext-0.1.0+cu130torch2.14-cp311-cp311-linux_x86_64.whl",
                  _record_for(first, ident))
    changed = changed_targets(targets, settings)
    assert first not in changed and len(changed) == 7
    # any changed input makes it a target again
    for over in ({"builder_version": "0.0.1"}, {"recipe": {"content_sha256": "0" * 64}}, {"patches": []},
                 {"source": {"sha256": "1" * 64}}, {"python": {"version": "3.12.1", "torch": "2.14.1"}},
                 {"archs": ["120"]}, {"torch_index": "file:///opt/pypi-more/simple"}, {"cuda": "12.8"},
                 {"platform": "aarch64"}):
        assert not record_matches(_record_for(first, ident, **over), first, ident), over
    assert not record_matches(_record_for(first, ident), second, known_inputs(second, settings))  # Python 3.12


# ---------------------------------------------------------------- builder watch


def test_watch_reports_newer_and_out_of_range_versions(tree: Path) -> None:
    farm = load_farm(write_farm(tree, GOOD))
    settings = settings_for(tree)
    rows = {r.package: r for r in watch(farm, settings, releases=fake_releases)}
    assert rows["demo"].built == () and rows["demo"].newer == ("1.0", "1.1", "1.4")
    assert rows["demo"].beyond == ("2.0",) and "above the recipe's range" in rows["demo"].note
    _publish_fake(tree / "wheelhouse", "demo-1.1+cu130torch2.14-cp312-cp312-linux_x86_64.whl",
                  {"package": "demo", "version": "1.1"})
    _publish_fake(tree / "wheelhouse" / "staging", "puredemo-0.2+cu130torch2.14-py3-none-any.whl",
                  {"package": "puredemo", "version": "0.2"})
    rows = {r.package: r for r in watch(farm, settings, releases=fake_releases)}
    assert rows["demo"].built == ("1.1",) and rows["demo"].newer == ("1.4",)
    assert rows["puredemo"].built == ("0.2",) and rows["puredemo"].newer == () and rows["puredemo"].beyond == ("1.0",)


def test_watch_cli_on_local_sources_needs_no_network(tmp_path: Path, farm_demo: Path) -> None:
    env = {"BUILDER_CACHE_DIR": str(tmp_path / "cache"), "BUILDER_WHEELHOUSE": str(tmp_path / "wheelhouse"),
           "BUILDER_OFFLINE": "1"}
    result = run_cli("watch", "--file", str(farm_demo), "--format", "json", env=env)
    assert result.code == 0, result.stderr
    rows = json.loads(result.stdout)
    assert [r["package"] for r in rows] == ["tinyext", "tinyscale"]
    assert all(r["note"] == "not built from PyPI: nothing to watch" for r in rows)
    markdown = run_cli("watch", "--file", str(farm_demo), "--format", "markdown", env=env).stdout
    assert markdown.splitlines()[0].startswith("| package | recipe range |")
    only = run_cli("watch", "--file", str(farm_demo), "--format", "json", "--only", "TinyScale", env=env)
    assert [r["package"] for r in json.loads(only.stdout)] == ["tinyscale"]


def test_fixture_tree_is_clean() -> None:
    """The farm fixtures are source trees the builder copies; nothing built may land in them."""
    root = FIXTURES / "tinyext"
    assert not any(p.name in {"build", "dist"} or p.suffix == ".so" for p in root.rglob("*"))


def test_the_twin_tinyscale_is_tinyext_renamed(tmp_path: Path) -> None:
    """tests/fixtures/farm_demo.py writes tinyscale from tinyext's fixtures: every file of its recipe, patches and
    source is there under the new name, with tinyext's text renamed, and its recipe loads and finds its source."""
    from tests.fixtures.farm_demo import TWIN, write_twin

    recipes = write_twin(tmp_path)
    for source, rel in TWIN.items():
        old = sorted(str(p.relative_to(FIXTURES / source)) for p in (FIXTURES / source).rglob("*")
                     if p.is_file() and "__pycache__" not in p.parts)
        new = sorted(str(p.relative_to(tmp_path / rel)) for p in (tmp_path / rel).rglob("*") if p.is_file())
        assert new == [name.replace("tinyext", "tinyscale") for name in old], rel
        for name in old:
            text = (tmp_path / rel / name.replace("tinyext", "tinyscale")).read_text()
            assert "tinyext" not in text.lower(), name
            assert text == (FIXTURES / source / name).read_text().replace("tinyext", "tinyscale").replace(
                "TINYEXT", "TINYSCALE")
    recipe = load_recipe(recipes / "tinyscale" / "recipe.toml")
    assert recipe.name == "tinyscale" and recipe.imports == ("tinyscale", "tinyscale._C")
    assert recipe.source.path == tmp_path / "farm" / "tinyscale"
    assert (recipe.source.path / "tinyscale" / "__init__.py").is_file()
    assert [p.path.parent for p in recipe.patches] == [tmp_path / "farm" / "patches" / "tinyscale"] * 2


def test_the_demos_020_sources_are_the_010_ones_with_the_version_bumped(tmp_path: Path, farm_demo: Path) -> None:
    """tests/fixtures/farm_demo.py: each 0.2.0 tree differs from its 0.1.0 tree in setup.py's VERSION line alone,
    and a tree without that line is refused, naming the file."""
    import filecmp

    from tests.fixtures.farm_demo import bumped_copy

    demo = farm_demo.parent
    for new, old in (("farm/tinyext-0.2.0", "tinyext"), ("farm/tinyscale-0.2.0", "farm/tinyscale")):
        setup = (demo / new / "setup.py").read_text()
        assert setup == (demo / old / "setup.py").read_text().replace('VERSION = "0.1.0"', 'VERSION = "0.2.0"')
        assert 'VERSION = "0.2.0"' in setup
        compared = filecmp.dircmp(demo / new, demo / old)
        assert compared.diff_files == ["setup.py"] and not compared.left_only and not compared.right_only
        assert not compared.subdirs["csrc"].diff_files
    (tmp_path / "noversion").mkdir()
    (tmp_path / "noversion" / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    with pytest.raises(ValueError, match=r"noversion/setup.py has no line VERSION"):
        bumped_copy(tmp_path / "noversion", tmp_path / "out", "0.2.0")


def test_pool_progress_counts_starts_and_finishes_for_the_live_display_and_the_log(tmp_path: Path) -> None:
    """The farm pool's progress: a target has started once its log exists, finished once its outcome is in; the
    live display's head counts them (plus the targets found unchanged before the pool), a log gets plain lines."""
    from types import SimpleNamespace

    from rich.console import Console

    from builder.cli.farm import _PoolProgress
    from builder.model.records import FarmOutcome

    todo = [SimpleNamespace(id=name) for name in ("a", "b", "c")]
    (tmp_path / "a.log").write_text("stale, from an earlier run\n")
    progress = _PoolProgress(todo, tmp_path, already=2, total=5, live_display=False)
    assert not (tmp_path / "a.log").exists()  # an earlier run's log never counts as started
    log = Console(record=True, width=120)
    (tmp_path / "a.log").write_text("==> build\n")
    (tmp_path / "b.log").write_text("==> test\n")
    progress.poll_started(log)
    progress.poll_started(log)  # once per target
    progress.finished(todo[1], FarmOutcome(id="b", status="failed", error="boom", seconds=3.0), log, None)
    lines = log.export_text().splitlines()
    assert lines == ["start    a", "start    b", "failed   b  3.0s  boom"]
    screen = Console(record=True, width=120)
    screen.print(progress.render())
    text = screen.export_text()
    assert "[3/5] 0 built, 2 unchanged, 1 failed" in text
    rows = [line.split() for line in text.splitlines()[2:-1]]  # under the "building stage time" header
    assert [row[:2] for row in rows] == [["a", "build"]]  # the stage from its log; b is done, c not started
    assert text.splitlines()[-1] == "1 queued"


def test_watch_names_what_a_cuda_no_toolchain_provides_needs(tree: Path) -> None:
    """Issue 31 item 4: a torch index serving a CUDA that no toolchain provides (13.9: no PyPI toolkit, no
    Dockerfile) is not met with 'add it to cuda = [...]', which farm.toml would then refuse."""
    from builder.farm.watch import watch_torch

    index = tree / "idx" / "torch"
    index.mkdir(parents=True)
    names = ["torch-2.16.0+cu139-cp312-cp312-manylinux_2_28_x86_64.whl",
             "torch-2.15.0+cu130-cp312-cp312-manylinux_2_28_x86_64.whl"]
    (index / "index.html").write_text("".join(f'<a href="{n}">{n}</a>\n' for n in names))
    farm = load_farm(write_farm(tree, GOOD.replace('python = "3.12"', f'python = "3.12"\ntorch-index = "{tree / "idx"}"')))
    notes = {r.cuda: r.note for r in watch_torch(farm, settings_for(tree)) if r.index == "custom"}
    assert notes["13.9"].startswith("not in the farm, and no toolchain provides CUDA 13.9 yet: add "
                                    "13.9 to IMAGE_CUDAS in builder/model/cuda.py")


# ---------------------------------------------------------------- the platform axis (issue 27)

PLATFORMS = """
[defaults]
recipes = "recipes"
cuda = "13.0"
python = "3.12"
torch = "2.14.1"
platforms = ["x86_64", "aarch64"]

[[package]]
name = "demo"
versions = ["1.4"]

[[package]]
name = "puredemo"
versions = ["0.2"]
"""


def test_platforms_are_parsed_and_checked(tree: Path) -> None:
    from builder.model.platform import AARCH64, X86_64

    farm = load_farm(write_farm(tree, PLATFORMS.replace('["x86_64", "aarch64"]', '["amd64", "arm64"]')))
    assert farm.entries[0].platforms == (X86_64, AARCH64)
    assert load_farm(write_farm(tree, GOOD)).entries[0].platforms == (X86_64,)  # no key: x86_64, as before
    own = load_farm(write_farm(tree, PLATFORMS + 'platforms = "aarch64"\n'))
    assert [e.platforms for e in own.entries] == [(X86_64, AARCH64), (AARCH64,)]  # per package
    for text, needle in (('["x86_64", "risc-v"]', "field 'defaults.platforms[1]' is not a platform: 'risc-v'"),
                         ('["aarch64", "arm64"]', "field 'defaults.platforms' names one platform twice")):
        with pytest.raises(FarmError) as info:
            load_farm(write_farm(tree, PLATFORMS.replace('["x86_64", "aarch64"]', text)))
        assert needle in info.value.message, info.value.one_line()


def test_each_platform_takes_its_own_default_archs(tree: Path) -> None:
    farm = load_farm(write_farm(tree, PLATFORMS))
    targets = expand(farm, settings_for(tree), releases=fake_releases)
    rows = [(t.package, "+".join(p.name for p in t.platforms), format_arch_list(t.archs)) for t in targets]
    assert rows == [("demo", "x86_64", "90,100,103,120"), ("demo", "aarch64", "90,100,103,110,121"),
                    ("puredemo", "x86_64+aarch64", "90,100,103,120")]  # pure Python: one build for both
    demo_x86, demo_arm, pure = targets
    assert demo_x86.id == "demo-1.4-cu130-sm90_100_103_120-x86_64-py3.12-torch2.14.1"
    assert demo_arm.id == "demo-1.4-cu130-sm90_100_103_110_121-aarch64-py3.12-torch2.14.1"
    assert pure.id == "puredemo-0.2-cu130-py3.12-torch2.14.1"  # no platform: py3-none-any serves both
    assert demo_arm.to_target(4).platform.name == "aarch64" and demo_x86.to_target(4).platform.name == "x86_64"
    assert demo_x86.wheel_identity != demo_arm.wheel_identity
    # no x86_64 wheel carries SASS no x86_64 machine can run
    assert not any(a.number in (110, 121) for t in targets if t.platform.name == "x86_64" for a in t.archs)


def test_an_arch_a_platform_never_carries_is_dropped_or_refused(tree: Path) -> None:
    text = PLATFORMS.replace('torch = "2.14.1"', 'torch = "2.14.1"\narchs = "90,120,121"')
    with pytest.raises(FarmError) as info:
        expand(load_farm(write_farm(tree, text)), settings_for(tree), releases=fake_releases)
    message = info.value.message
    assert "package[0] builds archs 90,120,121 for platform x86_64" in message and "sm_121" in message
    assert "DGX Spark" in message and "archs-where-supported = true" in (info.value.hint or "")
    trimmed = text.replace('python = "3.12"', 'python = "3.12"\narchs-where-supported = true')
    targets = expand(load_farm(write_farm(tree, trimmed)), settings_for(tree), releases=fake_releases)
    demo = [(t.platform.name, format_arch_list(t.archs)) for t in targets if t.package == "demo"]
    assert demo == [("x86_64", "90,120"), ("aarch64", "90,120,121")]  # x86_64 without 121
    # a list left with nothing for a platform is refused for a CUDA extension (no silent empty platform)
    with pytest.raises(FarmError, match="none of its arch lists has an arch a x86_64 machine carries"):
        expand(load_farm(write_farm(tree, trimmed.replace('archs = "90,120,121"', 'archs = "110"'))),
               settings_for(tree), releases=fake_releases)


def test_exclude_by_platform(tree: Path) -> None:
    text = PLATFORMS + '\n[[exclude]]\npackage = "demo"\nplatform = "arm64"\n'
    targets = expand(load_farm(write_farm(tree, text)), settings_for(tree), releases=fake_releases)
    assert [(t.package, t.platform.name) for t in targets] == [("demo", "x86_64"), ("puredemo", "x86_64")]
    assert len(targets[-1].platforms) == 2  # a pure-Python wheel is not split by platform, nor excluded by one


def test_runners_route_by_platform_and_arch_and_name_what_cannot_be_tested(tree: Path) -> None:
    from builder.discovery.compat import resolve_index
    from builder.farm.ghmatrix import route, tested_matrix
    from builder.farm.served import Cell, served_cells

    text = PLATFORMS + '\n[runners]\n"121-aarch64" = "spark"\navailable = ["gpu-sm120-x86_64", "spark"]\n'
    farm = load_farm(write_farm(tree, text))
    targets = expand(farm, settings_for(tree), releases=fake_releases)
    matrix = github_matrix(farm, targets)
    rows = {(e["package"], e["platform"]): e for e in matrix["include"]}
    assert rows["demo", "x86_64"]["runner"] == "gpu-sm120-x86_64" and rows["demo", "x86_64"]["untested"] == ""
    assert rows["demo", "aarch64"]["runner"] == "spark"  # "121-aarch64" over the template
    assert rows["demo", "aarch64"]["build_runner"] == "ubuntu-24.04-arm"
    assert rows["demo", "x86_64"]["build_runner"] == "ubuntu-24.04"
    assert rows["puredemo", "x86_64"]["runner"] == "gpu-sm120-x86_64"
    # without the Spark runner the aarch64 target is untested, with the reason, and left out of the test matrix
    farm = load_farm(write_farm(tree, text.replace(', "spark"]', "]")))
    matrix = github_matrix(farm, expand(farm, settings_for(tree), releases=fake_releases))
    arm = next(e for e in matrix["include"] if e["platform"] == "aarch64")
    assert arm["runner"] == "" and arm["untested"].startswith("untested: no runner for aarch64 sm_121,110,103,100,90")
    assert "spark" in arm["untested"] and "gpu-sm90-aarch64" in arm["untested"]
    assert [e["platform"] for e in tested_matrix(matrix)["include"]] == ["x86_64", "x86_64"]
    assert route(farm, targets[0]).runner == "gpu-sm120-x86_64"
    # the pure-Python wheel's cells count for both platforms
    index = resolve_index(None, settings_for(tree))
    universe = frozenset(Cell(t, c, "3.12", p) for t, c in (("2.14", "13.0"), ("2.10", "12.8"))
                         for p in ("x86_64", "aarch64"))
    assert served_cells(targets[-1], index, universe) == universe
    assert served_cells(targets[1], index, universe) == {Cell("2.14", "13.0", "3.12", "aarch64")}


def test_a_runner_template_without_platform_is_refused_for_two_platforms(tree: Path) -> None:
    with pytest.raises(FarmError) as info:
        load_farm(write_farm(tree, PLATFORMS + '\n[runners]\ndefault = "gpu-sm{arch}"\n'))
    assert "field 'runners.default' is 'gpu-sm{arch}', without {platform}" in info.value.message
    assert "gpu-sm{arch}-{platform}" in (info.value.hint or "")
    for key, needle in (('"121-riscv" = "x"', "field 'runners.121-riscv' must be an arch number"),
                        ("available = 3", "field 'runners.available' must be a list of runner labels")):
        with pytest.raises(FarmError, match=re.escape(needle)):
            load_farm(write_farm(tree, PLATFORMS + f"\n[runners]\n{key}\n"))


def test_matrix_cli_platform_filter_tested_matrix_and_untested_lines(tree: Path) -> None:
    text = PLATFORMS + '\n[runners]\navailable = ["gpu-sm120-x86_64"]\n'
    path = write_farm(tree, text.replace('versions = ["1.4"]', 'versions = ["1.4"]\nsource = "src"'))
    (tree / "src").mkdir()
    (tree / "src" / "setup.py").write_text("from setuptools import setup\nsetup(name='demo', version='1.4')\n")
    env = {"BUILDER_CACHE_DIR": str(tree / "cache"), "BUILDER_WHEELHOUSE": str(tree / "wheelhouse"),
           "BUILDER_OFFLINE": "1"}
    table = run_cli("matrix", "--file", str(path), "--only", "demo", "--details", env=env)
    assert table.code == 0, table.stderr
    assert "untested: 1 of 2 targets" in table.stdout
    assert "demo-1.4-cu130-sm90_100_103_110_121-aarch64-py3.12-torch2.14.1: untested: no runner for aarch64" \
        in table.stdout
    github = json.loads(run_cli("matrix", "--file", str(path), "--only", "demo", "--format", "github", env=env).stdout)
    assert [e["platform"] for e in github["include"]] == ["x86_64", "aarch64"]
    tested = run_cli("matrix", "--file", str(path), "--only", "demo", "--format", "github", "--tested", env=env)
    assert [e["platform"] for e in json.loads(tested.stdout)["include"]] == ["x86_64"]
    arm = run_cli("matrix", "--file", str(path), "--only", "demo", "--platform", "arm64", "--format", "json", env=env)
    data = json.loads(arm.stdout)
    assert [t["platform"] for t in data["targets"]] == ["aarch64"] and data["summary"]["untested"] == 1
    bad = run_cli("matrix", "--file", str(path), "--platform", "sparc", env=env)
    assert bad.code == 2 and "--platform: 'sparc' is not a platform" in bad.error_lines[0]


def test_root_farm_builds_both_platforms_with_their_own_archs() -> None:
    farm = load_farm(ROOT / "farm.toml")
    fixed = {"causal-conv1d": ["1.6.2.post1", "1.7.0"], "fla-core": ["0.6.0"], "flash-linear-attention": ["0.6.0"],
             "mamba-ssm": ["2.3.1", "2.3.2.post1"], "flash-attn": ["2.8.3.post2"]}
    targets = expand(farm, Settings.from_env({}), releases=lambda name, s: fixed[name])
    cuda = [t for t in targets if t.kind.is_cuda]
    assert {t.platform.name for t in cuda} == {"x86_64", "aarch64"}
    assert not [t.id for t in cuda if t.platform.name == "x86_64" and {a.number for a in t.archs} & {110, 121}]
    aarch64 = {(t.package, str(t.cuda)): format_arch_list(t.archs) for t in cuda if t.platform.name == "aarch64"}
    # each CUDA's own list: 12.8 has no sm_103, sm_110 or sm_121 (sm_120 SASS serves DGX Spark's sm_121 there); 12.9
    # no sm_110 (Thor is sm_110 from CUDA 13); causal-conv1d's known-bad sm_103 from CUDA 13 is 100+ptx there;
    # no 13.2 target: both releases' CUDA 13 cells are one +cu13 stable wheel each, built with 13.0; no 12.9 one:
    # cu129's per-torch cells are the +cu12torch2.X wheels' built with 12.8 (sm_100 SASS runs on sm_103, sm_120 on
    # sm_121, as the loop below checks)
    assert aarch64 == {("causal-conv1d", "12.8"): "90,100,120", ("causal-conv1d", "13.0"): "90,100+ptx,110,120,121",
                       ("mamba-ssm", "12.8"): "90,100,120", ("mamba-ssm", "13.0"): "90,100,103,110,120,121",
                       # flash-attn's own aarch64 list (GH200, GB200, Thor, DGX Spark through sm_120 SASS), per torch
                       ("flash-attn", "13.0"): "90,100,110,120", ("flash-attn", "13.2"): "90,100,110,120"}
    # every aarch64 wheel runs on GH200 (sm_90), GB200 (sm_100), GB300 (sm_103) and DGX Spark (sm_121); Thor
    # (sm_110) from CUDA 13
    for t in cuda:
        sass = {a.sm for a in t.archs}
        ptx = {a.compute for a in t.archs if a.ptx}
        machines = (90, 100, 103, 120) if t.platform.name == "x86_64" else (
            (90, 100, 103, 110, 121) if t.cuda.major >= 13 else (90, 100, 103, 121))
        assert [m for m in machines if not runnable_on(m, sass, ptx)] == [], t.id
    pure = [t for t in targets if not t.kind.is_cuda]
    assert pure and all({p.name for p in t.platforms} == {"x86_64", "aarch64"} for t in pure)
    matrix = github_matrix(farm, targets)["include"]
    assert {e["build_runner"] for e in matrix if e["platform"] == "aarch64"} == {"ubuntu-24.04-arm"}
    assert all(e["runner"] or e["untested"].startswith("untested: no runner for aarch64") for e in matrix)
