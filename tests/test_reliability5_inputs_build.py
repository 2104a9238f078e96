"""Bad `build` inputs found before anything is made (issue 54 item 5, round 4's D16): a wheelhouse that is a file or
cannot be written, a recipe whose kernel tests are a folder, and an ``--offline`` build with no cached release list,
which asked nvcc and the interpreters (and wrote their answers to identity/) before it was refused."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from builder.core.errors import UsageError
from builder.pipeline.resolveinputs import check_wheelhouse_writable
from tests.helpers import ROOT, assert_one_line_error, run_cli

BUILD = ("build", "causal-conv1d", "--version", "1.6.0", "--cuda", "13.0", "--arch", "90", "--offline")


def _build(tmp_path: Path, *extra: str):
    return run_cli(*BUILD, "--cache-dir", str(tmp_path / "cache"), *extra)


@pytest.mark.parametrize(("where", "needle"), [("file", "is a file, not a folder"),
                                               ("file/sub", "cannot be made, ")])
def test_a_wheelhouse_that_is_a_file_is_refused_first(tmp_path: Path, where: str, needle: str) -> None:
    (tmp_path / "file").write_text("x")
    result = _build(tmp_path, "--wheelhouse", str(tmp_path / where))
    assert_one_line_error(result, f"--wheelhouse {tmp_path / where}", needle)
    assert "==> " not in result.stdout + result.stderr
    assert not (tmp_path / "cache" / "identity").exists()


def test_kernel_tests_that_are_a_folder_are_refused_first(tmp_path: Path) -> None:
    recipes = tmp_path / "recipes"
    shutil.copytree(ROOT / "recipes", recipes)
    (recipes / "causal-conv1d" / "kernel_tests.py").unlink()
    (recipes / "causal-conv1d" / "kernel_tests.py").mkdir()
    result = _build(tmp_path, "--wheelhouse", str(tmp_path / "wh"), "--recipes", str(recipes),
                    "--patches", str(ROOT / "patches"))
    assert_one_line_error(result, "field 'test.kernel-tests'", "which is a folder")
    assert not (tmp_path / "cache" / "identity").exists()


def test_an_offline_build_without_a_release_list_asks_nothing_first(tmp_path: Path) -> None:
    """Before: identity/python-….json, pyenv-shim-….json and nvcc-….json, and index/nvcc-archs.json were written,
    then `==> toolchain`, then the refusal."""
    result = _build(tmp_path, "--wheelhouse", str(tmp_path / "wh"))
    assert_one_line_error(result, "no cached release list for 'causal-conv1d'")
    assert not (tmp_path / "cache" / "identity").exists()
    assert not (tmp_path / "wh").exists()


def test_a_read_only_wheelhouse_is_refused(tmp_path: Path) -> None:
    """A read-only mount refuses even root (whom a mode of 555 does not stop); the check writes a temp file."""
    mount = tmp_path / "ro"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "none", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("no read-only mount can be made here (not root)")
    try:
        for where in (mount, mount / "wh"):
            with pytest.raises(UsageError, match="cannot be written.*Read-only file system"):
                check_wheelhouse_writable(where)
    finally:
        subprocess.run(["umount", str(mount)], check=True)
    check_wheelhouse_writable(tmp_path / "new" / "wh")  # a folder that can be made
    assert not list(tmp_path.rglob("*.builder-tmp"))
