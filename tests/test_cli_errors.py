"""Bad input through the real command line: one-line error naming the cause, non-zero exit, no traceback,
and nothing left in the wheelhouse."""

from __future__ import annotations

import hashlib
import tarfile
from pathlib import Path

import pytest

from tests.helpers import FIXTURES, assert_one_line_error, run_cli


def test_unknown_package(cli_env: dict[str, str]) -> None:
    result = run_cli("build", "causal-conv", "--cuda", "13.0", "--arch", "120", env=cli_env)
    assert_one_line_error(result, "no recipe for package 'causal-conv'", "did you mean 'causal-conv1d'")
    assert result.code == 3


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--arch", "abc"], "--arch: 'abc' is not a GPU architecture"),
        (["--arch", "121", "--cuda", "12.8"], "CUDA 12.8 cannot compile sm_121"),
        (["--arch", "120", "--cuda", "99.9"], "--cuda 99.9: no toolchain here can provide CUDA 99.9"),
        (["--arch", "120", "--cuda", "twelve"], "--cuda 'twelve' is not a version"),
        (["--cuda", "13.0"], "--arch is required"),
        (["--arch", "120", "--cuda", "13.0", "--jobs", "0"], "argument --jobs: '0' is not a number of jobs"),
        pytest.param(["--arch", "120", "--cuda", "12.8", "--torch", "2.11.0"], "torch 2.11.0 on pypi is a CUDA 13.0 build",
                     marks=pytest.mark.network),  # reads torch 2.11.0's METADATA from PyPI
    ],
)
def test_bad_flags(cli_env: dict[str, str], args: list[str], needle: str) -> None:
    if "--cuda" not in args:
        args = [*args, "--cuda", "13.0"]
    result = run_cli("build", "causal-conv1d", *args, env=cli_env)
    assert_one_line_error(result, needle)
    assert result.code == 2
    assert not Path(cli_env["BUILDER_WHEELHOUSE"]).exists()


@pytest.mark.network
def test_version_outside_range_and_unknown(cli_env: dict[str, str]) -> None:
    result = run_cli("build", "causal-conv1d", "--cuda", "13.0", "--arch", "120", "--version", "1.4.0", env=cli_env)
    assert_one_line_error(result, "causal-conv1d 1.4.0 is outside the recipe's supported range")
    assert result.code == 2  # the flag's fault (issue 55 item 8: was 4, the source code)
    result = run_cli("build", "causal-conv1d", "--cuda", "13.0", "--arch", "120", "--version", "1.6.9", env=cli_env)
    assert_one_line_error(result, "causal-conv1d 1.6.9 does not exist upstream", "1.7.0")


@pytest.mark.network
def test_cuda_12_8_without_compiler_says_what_is_missing(cli_env: dict[str, str]) -> None:
    """This machine has no Docker engine and only a CUDA 13.0 nvcc: the plan resolves, the build cannot."""
    result = run_cli("build", "causal-conv1d", "--cuda", "12.8", "--arch", "120", env=cli_env)
    assert "torch         2.10.0 from pypi" in result.stderr
    assert "quay.io/pypa/manylinux_2_28_x86_64:latest + CUDA 12.8 (dockerfiles/manylinux-cuda.Dockerfile)" in result.stderr
    assert_one_line_error(result, "no CUDA 12.8 compiler here", "PyPI has no CUDA 12 compiler")
    # ...and, a line each under it (at most a few), what would work here: CUDA 13.0 (this machine's nvcc) or the
    # newest CUDA 13.x from PyPI, and how to get a CUDA 12.8 compiler
    hints = [line.strip() for line in result.stderr.splitlines() if line.strip().startswith("hint: ")]
    assert 1 <= len(hints) <= 4, result.stderr
    assert any("this machine can build CUDA 13.0 wheels" in h and "use --cuda 13.0 with a CUDA 13.0 torch" in h
               and "torch 2.11.0–2.14.1 on PyPI" in h for h in hints), hints
    assert any("--toolchain docker" in h for h in hints), hints
    assert result.code == 7
    pip = run_cli("build", "causal-conv1d", "--cuda", "12.8", "--arch", "120", "--toolchain", "pip", env=cli_env)
    assert_one_line_error(pip, "--toolchain pip cannot provide CUDA 12.8", "--toolchain host")
    host = run_cli("build", "causal-conv1d", "--cuda", "12.8", "--arch", "120", "--toolchain", "host", env=cli_env)
    assert_one_line_error(host, "no CUDA 12.8 toolkit on this machine", "is CUDA 13.0")
    docker = run_cli("build", "causal-conv1d", "--cuda", "12.8", "--arch", "120", "--toolchain", "docker",
                     env={**cli_env, "DOCKER_HOST": "unix:///nonexistent.sock"})
    assert_one_line_error(docker, "--toolchain docker: no container engine answers", "--toolchain pip")


@pytest.mark.network  # the plan reads causal-conv1d's release list from PyPI
def test_plan_says_whether_this_machine_can_build(cli_env: dict[str, str]) -> None:
    """No Docker engine and only a CUDA 13.0 nvcc here: 12.8 is a plan this machine cannot carry out (still exit
    0, with the ways forward); 13.0 is buildable; the pip toolchain is reported without provisioning it."""
    no = run_cli("plan", "causal-conv1d", "--cuda", "12.8", "--arch", "120", env=cli_env)
    text = " ".join(no.stdout.split())
    assert no.code == 0, no.stderr
    assert "buildable here no: no CUDA 12.8 compiler here" in text and "PyPI has no CUDA 12 compiler" in text, text
    assert "this machine can build CUDA 13.0 wheels" in text and "use --cuda 13.0" in text, text
    yes = run_cli("plan", "causal-conv1d", "--cuda", "13.0", "--arch", "120", env=cli_env)
    assert yes.code == 0 and "buildable here yes: host CUDA 13.0" in " ".join(yes.stdout.split()), yes.stdout
    pip = run_cli("plan", "causal-conv1d", "--cuda", "13.0", "--arch", "120", "--toolchain", "pip", env=cli_env)
    assert "yes: pip toolchain (CUDA 13.0 from PyPI, not yet provisioned" in " ".join(pip.stdout.split()), pip.stdout
    assert not (Path(cli_env["BUILDER_CACHE_DIR"]) / "toolkits" / "cuda-13.0").exists()  # nothing provisioned
    python = run_cli("plan", "causal-conv1d", "--cuda", "13.0", "--arch", "120", "--python", "3.99", env=cli_env)
    assert python.code == 0 and "buildable here no: no Python 3.99 interpreter found" in " ".join(python.stdout.split())


def tiny(recipe_tree: Path, *extra: str) -> list[str]:
    return ["build", "tinyext", "--recipes", str(recipe_tree), "--cuda", "13.0", "--arch", "90",
            "--python", "3.11", "--toolchain", "host", *extra]


def test_no_matching_python(cli_env: dict[str, str], recipe_tree: Path) -> None:
    """A missing interpreter is a usage error found before any work: no plan (PyPI), toolchain or source."""
    result = run_cli(*tiny(recipe_tree, "--python", "3.99"), env=cli_env)
    assert_one_line_error(result, "no Python 3.99 interpreter found", "pyenv")
    assert result.code == 2
    assert "==> " not in result.stderr and not (Path(cli_env["BUILDER_CACHE_DIR"]) / "sources").exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--python", "3.99"], "no Python 3.99 interpreter found"),
        (["--python", "3.x"], "--python '3.x' is neither a Python version nor a path"),
        (["--python", "/nonexistent/bin/python"], "--python /nonexistent/bin/python: no such interpreter"),
        (["--torch-index", "nope"], "--torch-index: 'nope' is neither a URL nor a known index"),
        (["--torch", "2.x"], "--torch '2.x' is not a version"),
        (["--version", "latest"], "--version 'latest' is not a version"),
        (["--jobs", "-1"], "argument --jobs: '-1' is not a number of jobs (a whole number from 1 to"),
    ],
)
def test_flags_checked_before_any_work(cli_env: dict[str, str], args: list[str], needle: str) -> None:
    """The real causal-conv1d recipe, whose plan would read PyPI first: each bad flag stops before that."""
    result = run_cli("build", "causal-conv1d", "--cuda", "13.0", "--arch", "120", *args, env=cli_env)
    assert_one_line_error(result, needle)
    assert result.code == 2
    assert "==> " not in result.stderr  # no stage started
    assert not (Path(cli_env["BUILDER_CACHE_DIR"]) / "index").exists()  # PyPI's release list was not read


def test_unknown_toolchain_is_a_usage_error(cli_env: dict[str, str]) -> None:
    result = run_cli("build", "causal-conv1d", "--cuda", "13.0", "--arch", "120", "--toolchain", "nvcc", env=cli_env)
    assert result.code == 2 and "invalid choice: 'nvcc'" in result.stderr and "'pip', 'host', 'docker'" in result.stderr


def test_python_path_without_torch(cli_env: dict[str, str], recipe_tree: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    venv = tmp_path / "notorch"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    result = run_cli(*tiny(recipe_tree, "--python", str(venv / "bin" / "python")), env=cli_env)
    assert_one_line_error(result, "torch is not importable there")


def test_checksum_mismatch(cli_env: dict[str, str], recipe_tree: Path) -> None:
    archive = recipe_tree.parent / "tinyext-0.1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(FIXTURES / "tinyext", arcname="tinyext-0.1.0")
    real = hashlib.sha256(archive.read_bytes()).hexdigest()
    recipe = recipe_tree / "tinyext" / "recipe.toml"
    text = recipe.read_text().replace('path = "../../tinyext"', 'path = "../../tinyext-0.1.0.tar.gz"')
    recipe.write_text(text.replace("[build]", f'[source.sha256]\n"0.1.0" = "{"0" * 64}"\n\n[build]'))
    result = run_cli(*tiny(recipe_tree, "--version", "0.1.0"), env=cli_env)
    assert_one_line_error(result, "checksum mismatch for tinyext-0.1.0.tar.gz", real, "0" * 64)
    assert result.code == 5
    assert not Path(cli_env["BUILDER_WHEELHOUSE"]).exists()
    # the source is checked before the build venv is made: no gigabytes of torch for a bad checksum
    assert "==> python" not in result.stderr
    assert not list((Path(cli_env["BUILDER_CACHE_DIR"]) / "venvs").glob("build-*"))


def test_patch_that_no_longer_applies(cli_env: dict[str, str], recipe_tree: Path) -> None:
    patch = recipe_tree.parent / "patches" / "tinyext" / "0001-mark-patched.patch"
    patch.write_text(patch.read_text().replace("-PATCHED = False", "-PATCHED = None"))
    result = run_cli(*tiny(recipe_tree), env=cli_env)
    assert_one_line_error(result, "patch 0001-mark-patched.patch no longer applies to tinyext 0.1.0",
                          "tinyext/__init__.py: hunk #1 (line ", " of the patch) FAILED")
    assert result.code == 6
    assert "==> build" not in result.stderr  # stopped before compiling
    assert "==> python" not in result.stderr  # and before the build venv (gigabytes of torch) is made
    assert not Path(cli_env["BUILDER_WHEELHOUSE"]).exists()


def test_unknown_test_patch(cli_env: dict[str, str], recipe_tree: Path) -> None:
    result = run_cli(*tiny(recipe_tree, "--test-patch", "nope.patch"), env=cli_env)
    assert_one_line_error(result, "--test-patch nope.patch")


def test_inspect_missing_file(cli_env: dict[str, str]) -> None:
    assert_one_line_error(run_cli("inspect", "/nonexistent.whl", env=cli_env), "no such wheel file")


def test_recipes_list_and_show(cli_env: dict[str, str]) -> None:
    listing = run_cli("recipes", env=cli_env)
    assert listing.code == 0 and "causal-conv1d" in listing.stdout
    shown = run_cli("recipes", "show", "tinyext", "--recipes", str(FIXTURES / "recipes"), "--cuda", "13.0",
                    "--arch", "90,120+ptx", env=cli_env)
    assert shown.code == 0, shown.stderr
    assert "0001-mark-patched.patch" in shown.stdout and "(test only)" in shown.stdout
    assert "TORCH_CUDA_ARCH_LIST=9.0;12.0+PTX" in shown.stdout and "cu13torch2" in shown.stdout


def test_help_names_allowed_values_and_hides_test_only_flags(cli_env: dict[str, str]) -> None:
    from builder.discovery.compat import known_cuda

    for command in ("build", "plan"):
        shown = run_cli(command, "--help", env=cli_env)
        text = " ".join(shown.stdout.split())  # argparse wraps lines
        assert shown.code == 0
        assert ", ".join(map(str, known_cuda())) in text, text
        assert "required for CUDA extensions" in text and "not needed for pure-Python recipes" in text
        assert "--test-patch" not in text  # test-only: still accepted (test_unknown_test_patch uses it)
