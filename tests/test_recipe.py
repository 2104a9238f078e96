"""Recipe loading: strict validation naming the file and the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.core.errors import RecipeError
from builder.model.recipe import find_recipe, list_recipes, load_recipe
from tests.helpers import ROOT

GOOD = """
name = "demo"
kind = "cuda-extension"
versions = ">=1.0,<2"
[source]
pypi = "demo"
[build]
env = { FOO = "1" }
requires = ["ninja"]
[[patch]]
file = "fix.patch"
versions = ">=1.0,<1.5"
[test]
imports = ["demo"]
"""


def write(tmp_path: Path, text: str) -> Path:
    recipe = tmp_path / "recipes" / "demo" / "recipe.toml"
    recipe.parent.mkdir(parents=True, exist_ok=True)
    recipe.write_text(text)
    patch = tmp_path / "patches" / "demo" / "fix.patch"
    patch.parent.mkdir(parents=True, exist_ok=True)
    patch.write_text("--- a/x\n+++ b/x\n")
    return recipe


def test_good_recipe_loads(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path, GOOD))
    assert recipe.name == "demo" and recipe.build_env == {"FOO": "1"}
    assert [p.name for p in recipe.patches_for("1.2")] == ["fix.patch"]
    assert recipe.patches_for("1.6") == ()
    assert recipe.kernel_tests_timeout_s == 3600  # the default
    assert load_recipe(write(tmp_path, GOOD + "kernel-tests-timeout = 900\n")).kernel_tests_timeout_s == 900


@pytest.mark.parametrize(
    ("old", "new", "needle"),  # GOOD with old replaced by new (old None: new appended)
    [
        ('kind = "cuda-extension"', 'kindd = "cuda-extension"', "unknown field 'kindd'"),
        ('requires = ["ninja"]', 'requirez = ["ninja"]', "unknown field 'build.requirez'"),
        ('versions = ">=1.0,<2"', "versions = 3", "field 'versions' must be a str"),
        ('versions = ">=1.0,<2"', 'versions = ">>1.0"', "field 'versions' is not a version range"),
        ('versions = ">=1.0,<1.5"', 'versions = "1.0-1.5"', "field 'patch[0].versions'"),
        ('file = "fix.patch"', 'file = "missing.patch"', "field 'patch[0].file'"),
        ('FOO = "1"', "FOO = 1", "field 'build.env.FOO' must be a string"),
        ('imports = ["demo"]', "imports = [1]", "field 'test.imports[0]'"),
        (None, "kernel-tests-timeout = 0\n", "field 'test.kernel-tests-timeout' must be a positive"),
        (None, '[runtime]\ndrop = ["ninja"]\n', "field 'runtime.drop-reason' is required"),
        (None, '[runtime]\ndrop = ["ninja>=1"]\ndrop-reason = "x"\n', "field 'runtime.drop[0]' must be a bare"),
        (None, '[runtime]\ndrop = ["Torch"]\ndrop-reason = "x"\n', "field 'runtime.drop[0]' cannot drop torch"),
        (None, '[runtime]\nrequires = ["einops>=0.7"]\ndrop = ["einops"]\ndrop-reason = "x"\n',
         "field 'runtime.drop' names einops, which runtime.requires"),
        (None, '[runtime]\ndrop = ["ninja"]\ndrop-reasons = "x"\n', "unknown field 'runtime.drop-reasons'"),
        (None, "kernel-tests-timeout = '1h'\n", "field 'test.kernel-tests-timeout' must be an int"),
        ('kind = "cuda-extension"', 'kind = "rust"', "field 'kind'"),
        (None, "\n[source.sha256]\n'1.0' = 'nothex'\n", "field 'source.sha256.1.0'"),
        ('name = "demo"', "", "field 'name' is required"),
        (None, "\n[[[", "not valid TOML"),
    ],
)
def test_bad_recipes_name_file_and_field(tmp_path: Path, old: str | None, new: str, needle: str) -> None:
    assert old is None or old in GOOD, old
    path = write(tmp_path, GOOD + new if old is None else GOOD.replace(old, new))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(path) in info.value.message
    assert needle in info.value.message


def test_unknown_key_suggests_the_intended_one(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe(write(tmp_path, GOOD.replace("imports =", "imprts =")))
    assert info.value.hint == "did you mean 'imports'?"


def test_find_recipe_suggests_close_name() -> None:
    with pytest.raises(RecipeError) as info:
        find_recipe("causal-conv", ROOT / "recipes")
    assert "causal-conv1d" in (info.value.hint or "")


def test_project_recipes_all_load() -> None:
    paths = list_recipes(ROOT / "recipes")
    assert any(p.parent.name == "causal-conv1d" for p in paths)
    for path in paths:
        recipe = load_recipe(path)
        assert recipe.imports, path
    conv = load_recipe(ROOT / "recipes" / "causal-conv1d" / "recipe.toml")
    for version in ("1.5.2", "1.5.3.post1", "1.6.0", "1.6.1", "1.6.2.post1", "1.7.0"):
        assert conv.versions.contains(version)
        assert conv.patches_for(version), f"no patch applies to causal-conv1d {version}"
        assert version in conv.source.sha256
    # build-time tools upstream declares as install_requires, kept out of users' venvs, with the reason
    assert conv.runtime_drop == ("ninja", "packaging") and "build-time only" in conv.runtime_drop_reason


@pytest.mark.parametrize(
    ("ref", "needle"),
    [
        ("v{versoin}", "field 'source.git-ref' is 'v{versoin}'"),
        ("v{0}", "field 'source.git-ref' is 'v{0}'"),
        ("v{version.x}", "field 'source.git-ref'"),
    ],
)
def test_bad_git_ref_names_file_and_field(tmp_path: Path, ref: str, needle: str) -> None:
    path = write(tmp_path, GOOD.replace('pypi = "demo"', f'git = "https://example.invalid/demo.git"\ngit-ref = "{ref}"'))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(path) in info.value.message and needle in info.value.message, info.value.message


def test_unreadable_recipe_files_are_one_line_errors(tmp_path: Path) -> None:
    from tests.helpers import assert_one_line_error, run_cli

    path = write(tmp_path, GOOD.replace('name = "demo"', 'name = "demo" # caf\xe9'))
    path.write_bytes(path.read_bytes().replace("\xe9".encode(), b"\xe9"))  # latin-1, not UTF-8
    with pytest.raises(RecipeError, match=r"not UTF-8 text \(byte 0xe9 at offset \d+\)") as info:
        load_recipe(path)
    assert str(path) in info.value.message
    recipes = tmp_path / "recipes"
    path.unlink()
    path.mkdir()  # recipes/demo/recipe.toml is a folder
    with pytest.raises(RecipeError, match="is a folder, not a recipe file"):
        load_recipe(path)
    result = run_cli("plan", "demo", "--recipes", str(recipes), "--version", "1.0", "--cuda", "13.0", "--arch", "90")
    assert_one_line_error(result, str(path), "is a folder")


def test_missing_source_path_names_recipe_and_field(tmp_path: Path) -> None:
    from tests.helpers import assert_one_line_error, run_cli

    path = write(tmp_path, GOOD.replace('pypi = "demo"', 'path = "../../nowhere"'))
    for extra in ([], ["--version", "1.0"]):
        result = run_cli("plan", "demo", "--recipes", str(path.parent.parent), "--cuda", "13.0", "--arch", "90", *extra)
        assert_one_line_error(result, str(path), "field 'source.path'", "does not exist")
        assert result.code == 3


@pytest.mark.network
def test_mamba_ssm_patches_apply_to_the_real_sdist_and_leave_the_cxx_standard_to_torch(tmp_path: Path) -> None:
    """mamba-ssm 2.3.2.post1 from PyPI (the recipe's sha256), its per-torch patches (0001-0003, 0005) applied by the
    patch stage: the CUDA build names no -std, so torch's cpp_extension adds the standard its headers need (C++20
    from torch 2.14, whose ATen.h stops with #error below it; torch adds none where setup.py names one, as
    upstream's -std=c++17 did). The HIP branch keeps upstream's flags."""
    from builder.stages.patch import apply_patches
    from tests.helpers import real_sdist

    version = "2.3.2.post1"
    recipe, root = real_sdist("mamba-ssm", version, tmp_path)
    before = (root / "setup.py").read_text()
    patches = recipe.patches_for(version)
    assert [p.name[:4] for p in patches] == ["0001", "0002", "0003", "0005", "0006"]  # 0005: per-torch abi3 port
    apply_patches(root, patches, "mamba-ssm", version)
    setup = (root / "setup.py").read_text()
    hip, cuda = (part.split("\n        }\n", 1)[0] for part in setup.split("extra_compile_args = {")[1:3])
    assert "--offload-arch" in hip and "--offload-arch" not in cuda  # upstream's HIP branch first, then CUDA's
    assert '"-O3"' in cuda and "--expt-relaxed-constexpr" in cuda  # the CUDA branch's flag lists
    assert '"-std=' not in cuda, cuda
    assert hip.count('"-std=c++17"') == 2  # cxx and hipcc, as upstream has them
    assert before.count('"-std=c++17"') == 4


GIT = GOOD.replace('pypi = "demo"', 'git = "https://example.invalid/demo.git"')
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.mark.parametrize(
    ("text", "needle", "hint"),
    [
        (GIT + f'\n[source.sha256]\n"1.0" = "{"a" * 64}"\n',
         "field 'source.sha256' pins nothing for a git source", "[source.commits]"),
        (GOOD + f'\n[source.commits]\n"1.0" = "{COMMIT}"\n', "field 'source.commits' is only for a git source",
         "[source.sha256]"),
        (GIT + '\n[source.commits]\n"1.0" = "v1.0"\n', "field 'source.commits.1.0' must be a full commit id",
         "git ls-remote"),
        (GIT + f'\n[source.commits]\n"one" = "{COMMIT}"\n', "field 'source.commits.one' is not a version", None),
    ],
)
def test_git_sources_are_pinned_by_commit_not_sha256(tmp_path: Path, text: str, needle: str, hint: str | None) -> None:
    """Issue 26 6(b): a sha256 would pin nothing for a clone (it was silently accepted); commits pin git only."""
    path = write(tmp_path, text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(path) in info.value.message and needle in info.value.message, info.value.message
    assert hint is None or hint in (info.value.hint or ""), info.value.hint


@pytest.mark.parametrize(
    ("versions", "commits", "default"),
    [
        (">=1.0,<2", {"1.0": COMMIT}, "1.0"),  # the one pinned version
        (">=1.0,<2", {"1.0": COMMIT, "1.1": COMMIT}, None),  # several: default-version or --version says which
        (">=1.0,<2", {"1.0": COMMIT, "3.0": COMMIT}, "1.0"),  # the one pinned inside the range
        ("==1.2", {}, "1.2"),  # the one version the range allows
        (">=1.0,<2", {}, None),
    ],
)
def test_a_git_recipe_with_one_possible_version_needs_no_default_version(
        tmp_path: Path, versions: str, commits: dict[str, str], default: str | None) -> None:
    table = "".join(f'"{v}" = "{c}"\n' for v, c in commits.items())
    text = GIT.replace('versions = ">=1.0,<2"', f'versions = "{versions}"') + f"\n[source.commits]\n{table}"
    recipe = load_recipe(write(tmp_path, text))
    assert recipe.default_version == default and recipe.source.commits == commits
    explicit = load_recipe(write(tmp_path, text.replace("[source]", 'default-version = "1.1"\n[source]', 1)))
    assert explicit.default_version == "1.1"  # an explicit default-version wins
    pypi = load_recipe(write(tmp_path, GOOD.replace('versions = ">=1.0,<2"', 'versions = "==1.2"')))
    assert pypi.default_version is None  # PyPI sources pick from PyPI's releases, as before


def test_a_missing_kernel_tests_file_does_not_stop_loading(tmp_path: Path) -> None:
    """Issue 26 6(d): the walk-through plans and builds before the suite is written; the test stage checks it
    (tests/test_kernel_test_runner.py)."""
    recipe = load_recipe(write(tmp_path, GOOD + 'kernel-tests = "kernel_tests.py"\n'))
    assert recipe.kernel_tests == recipe.directory / "kernel_tests.py" and not recipe.kernel_tests.exists()


def test_the_content_digest_ignores_comments_and_formatting(tmp_path: Path) -> None:
    """Issue 26 6(e): the cache key covers the parsed recipe, so a comment edit does not rebuild; the file's
    sha256 (kept for the record's provenance) changes with every byte."""
    path = write(tmp_path, GOOD)
    digest, sha = load_recipe(path).content_digest(), load_recipe(path).sha256()
    reformatted = "# why versions below 1.0 are out\n" + GOOD.replace('name = "demo"', "name = 'demo'  # the name")
    path.write_text(reformatted.replace("[build]\n", "\n[build]  # comment\n"))
    recipe = load_recipe(path)
    assert recipe.content_digest() == digest and recipe.sha256() != sha
    path.write_text(GOOD.replace('FOO = "1"', 'FOO = "2"'))
    assert load_recipe(path).content_digest() != digest
    path.write_text(GOOD.replace('requires = ["ninja"]', 'requires = ["ninja", "wheel"]'))
    assert load_recipe(path).content_digest() != digest


def test_a_comment_edit_keeps_the_cache_key_and_a_value_edit_changes_it(tmp_path: Path) -> None:
    """The key itself (stages/inputs.py), for a copy of the tinyext fixture recipe."""
    import shutil

    from builder.core.settings import Settings
    from builder.model.arch import parse_arch_list
    from builder.model.cuda import CudaVersion
    from builder.model.python import PythonSpec
    from builder.stages.inputs import target_inputs
    from builder.stages.plan import Target, make_plan
    from builder.stages.pyenv import PythonEnv
    from tests.helpers import FIXTURES, LOCAL_TORCH_INDEX

    shutil.copytree(FIXTURES / "recipes" / "tinyext", tmp_path / "recipes" / "tinyext")
    shutil.copytree(FIXTURES / "patches", tmp_path / "patches")
    path = tmp_path / "recipes" / "tinyext" / "recipe.toml"
    original = path.read_text().replace('path = "../../tinyext"', f'path = "{FIXTURES / "tinyext"}"')
    settings = Settings.from_env({}, recipes_dir=tmp_path / "recipes", cache_dir=tmp_path / "cache")
    target = Target(package="tinyext", version="0.1.0", cuda=CudaVersion.parse("13.0"), archs=parse_arch_list("90"),
                    python=PythonSpec("3.11"), torch="2.14.1", torch_index=str(LOCAL_TORCH_INDEX), toolchain="host")

    def key(text: str) -> str:
        path.write_text(text)
        venv = PythonEnv(python=Path("/venv/bin/python"), version="3.11.7", torch="2.14.1+cu130", torch_cuda="13.0",
                         purelib=Path("/venv/lib/python3.11/site-packages"), managed=True)
        return target_inputs(make_plan(target, settings), source_digest="0" * 64, toolkit={"kind": "host"},
                             python=venv).cache_key()

    before = key(original)
    assert key(original + "\n# a comment at the end\n") == before
    assert key(original.replace("# Test fixture", "# Test fixture (edited)")) == before
    assert key(original.replace('requires = ["ninja", ', 'requires = ["ninja>=1.11", ')) != before

