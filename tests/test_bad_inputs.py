"""Issue 30, bad inputs: each through the real command line gives one error line naming the file or flag and the
cure, a non-zero exit and no traceback, in seconds (a fifo or device is never opened, /dev/zero never read)."""

from __future__ import annotations

import http.server
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.core.errors import RecipeError, UsageError
from builder.core.settings import check_cache_dir
from builder.core.tomlfile import MAX_TOML_BYTES, MAX_TOML_DEPTH, nesting_depth, read_toml
from tests.helpers import FIXTURES, assert_one_line_error, http_server, run_cli

CLI_TIMEOUT_S = 60  # a hang (a fifo opened for reading) fails the test instead of stalling the tier


def _plan(recipes: Path, *extra: str) -> list[str]:
    return ["plan", "tinyext", "--recipes", str(recipes), "--cuda", "13.0", "--arch", "120", "--python", "3.11",
            "--torch", "2.14.1", "--offline", *extra]


def _recipe(recipe_tree: Path) -> Path:
    return recipe_tree / "tinyext" / "recipe.toml"


# ---------------------------------------------------------------- --cache-dir


def test_cache_dir_that_is_a_file(tmp_path: Path, cli_env: dict[str, str]) -> None:
    a_file = tmp_path / "cache-file"
    a_file.write_text("not a folder")
    shown = run_cli("cache", "--cache-dir", str(a_file), env=cli_env, timeout=CLI_TIMEOUT_S)
    assert_one_line_error(shown, f"cache folder {a_file} is a file, not a folder", "--cache-dir")
    assert shown.code == UsageError.exit_code
    cleaned = run_cli("cache", "clean", "--all", "--cache-dir", str(a_file), env=cli_env, timeout=CLI_TIMEOUT_S)
    assert_one_line_error(cleaned, f"cache folder {a_file} is a file")
    assert a_file.read_text() == "not a folder"  # nothing removed


def test_cache_dir_that_is_a_file_stops_a_plan(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """Every command: the Settings refuse it (core/settings.py calls check_cache_dir)."""
    a_file = tmp_path / "cache-file"
    a_file.write_text("")
    for cache in (a_file, a_file / "below"):
        result = run_cli(*_plan(FIXTURES / "recipes", "--cache-dir", str(cache)), env=cli_env, timeout=CLI_TIMEOUT_S)
        assert_one_line_error(result, f"cache folder {cache}", "not a folder", "--cache-dir")
        assert result.code == UsageError.exit_code


def test_check_cache_dir(tmp_path: Path) -> None:
    check_cache_dir(tmp_path / "not" / "yet" / "made")  # made on first use
    check_cache_dir(tmp_path)
    (tmp_path / "f").write_text("")
    with pytest.raises(UsageError, match="is a file, not a folder"):
        check_cache_dir(tmp_path / "f")
    with pytest.raises(UsageError, match=f"lies under {tmp_path / 'f'}, which is a file"):
        check_cache_dir(tmp_path / "f" / "cache")


# ---------------------------------------------------------------- recipe files


def test_recipe_nested_a_thousand_deep(recipe_tree: Path, cli_env: dict[str, str]) -> None:
    recipe = _recipe(recipe_tree)
    base = recipe.read_text()
    recipe.write_text(base + "\n[x]\ny = " + "[" * 1000 + "]" * 1000 + "\n")  # tomllib recurses: RecursionError
    result = run_cli(*_plan(recipe_tree), env=cli_env, timeout=CLI_TIMEOUT_S)
    assert_one_line_error(result, f"{recipe}: tables and lists nested too deep to read")
    assert result.code == RecipeError.exit_code
    # dotted headers nest without recursion in tomllib; the depth is still refused before any code walks it
    recipe.write_text(base.replace("[build]", "[source.commits." + ".".join(["a"] * 1000) + "]\nb = 1\n\n[build]"))
    result = run_cli(*_plan(recipe_tree), env=cli_env, timeout=CLI_TIMEOUT_S)
    assert_one_line_error(result, f"{recipe}: tables and lists nested more than {MAX_TOML_DEPTH} deep")


@pytest.mark.parametrize("ref", ["v{version:999999999}", "v{version!r}", "v{version[0]}", "{0}", "v{version",
                                 "v{version:>{version}}"])
def test_git_ref_allows_only_a_bare_version_placeholder(recipe_tree: Path, cli_env: dict[str, str], ref: str) -> None:
    """``v{version:999999999}`` made a gigabyte string (MemoryError); a format spec is refused, never tried."""
    recipe = _recipe(recipe_tree)
    recipe.write_text(recipe.read_text().replace(
        'path = "../../tinyext"', f'git = "https://example.invalid/tinyext.git"\ngit-ref = "{ref}"'))
    result = run_cli(*_plan(recipe_tree, "--version", "0.1.0"), env=cli_env, timeout=CLI_TIMEOUT_S)
    assert_one_line_error(result, f"{recipe}: field 'source.git-ref' is {ref!r}")
    assert result.code == RecipeError.exit_code


def test_recipe_that_is_dev_zero_a_fifo_or_too_large(recipe_tree: Path, cli_env: dict[str, str]) -> None:
    recipe = _recipe(recipe_tree)
    recipe.unlink()
    recipe.symlink_to("/dev/zero")  # was read until memory ran out
    result = run_cli(*_plan(recipe_tree), env=cli_env, timeout=CLI_TIMEOUT_S)
    assert_one_line_error(result, f"{recipe}: is a device, not a recipe file", "regular TOML file")
    recipe.unlink()
    os.mkfifo(recipe)  # opening it for reading waited forever for a writer
    result = run_cli(*_plan(recipe_tree), env=cli_env, timeout=CLI_TIMEOUT_S)
    assert_one_line_error(result, f"{recipe}: is a fifo (named pipe), not a recipe file")
    assert result.code == RecipeError.exit_code
    recipe.unlink()
    recipe.write_text("# " + "x" * MAX_TOML_BYTES + "\n")
    result = run_cli(*_plan(recipe_tree), env=cli_env, timeout=CLI_TIMEOUT_S)
    assert_one_line_error(result, f"{recipe}: is larger than 1024 KiB, too large for a recipe file")


def test_read_toml_refuses_before_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with pytest.raises(RecipeError, match="is a fifo"):
        read_toml(fifo, RecipeError, what="recipe file")  # returns at once: never opened
    with pytest.raises(RecipeError, match="recipe file not found"):
        read_toml(tmp_path / "missing.toml", RecipeError, what="recipe file")
    (tmp_path / "ok.toml").write_text('a = {b = [1, [2]]}\n')
    assert read_toml(tmp_path / "ok.toml", RecipeError, what="recipe file") == {"a": {"b": [1, [2]]}}
    assert nesting_depth({"a": {"b": [1, [2]]}}) == 4 and nesting_depth(3) == 0


# ---------------------------------------------------------------- recipes/aliases.toml and farm.toml


def test_aliases_file_not_utf8_or_a_folder(recipe_tree: Path, cli_env: dict[str, str]) -> None:
    aliases = recipe_tree / "aliases.toml"
    aliases.write_bytes(b'fla = ["fla-core\xff"]\n')
    args = ["build", "tinyext", "--recipes", str(recipe_tree), "--cuda", "13.0", "--arch", "120", "--offline"]
    result = run_cli(*args, env=cli_env, timeout=CLI_TIMEOUT_S)
    assert_one_line_error(result, f"{aliases}: not UTF-8 text (byte 0xff at offset 16)", "re-save it as UTF-8")
    assert result.code == RecipeError.exit_code
    aliases.unlink()
    aliases.mkdir()
    result = run_cli(*args, env=cli_env, timeout=CLI_TIMEOUT_S)
    assert_one_line_error(result, f"{aliases}: is a folder, not an aliases file")
    assert "==> " not in result.stderr  # no stage started


def test_farm_file_not_utf8_a_folder_or_a_fifo(tmp_path: Path, cli_env: dict[str, str]) -> None:
    farm = tmp_path / "farm.toml"
    farm.write_bytes(b'[defaults]\ncuda = "13.0"\n\xfe\n')
    result = run_cli("matrix", "--file", str(farm), env=cli_env, timeout=CLI_TIMEOUT_S)
    assert_one_line_error(result, f"{farm}: not UTF-8 text (byte 0xfe at offset 25)")
    assert result.code == RecipeError.exit_code  # FarmError
    farm.unlink()
    farm.mkdir()
    assert_one_line_error(run_cli("matrix", "--file", str(farm), env=cli_env, timeout=CLI_TIMEOUT_S),
                          f"{farm}: is a folder, not a farm file")
    farm.rmdir()
    os.mkfifo(farm)
    assert_one_line_error(run_cli("matrix", "--file", str(farm), env=cli_env, timeout=CLI_TIMEOUT_S),
                          f"{farm}: is a fifo (named pipe), not a farm file")


def test_farm_runner_template_allows_only_a_bare_arch(tmp_path: Path, cli_env: dict[str, str]) -> None:
    farm = _small_farm(tmp_path, '[runners]\ndefault = "gpu-sm{arch:>999999999}"\n')
    result = run_cli("matrix", "--file", str(farm), env=cli_env, timeout=CLI_TIMEOUT_S)
    assert_one_line_error(result, "field 'runners.default' is 'gpu-sm{arch:>999999999}'", "{arch}")


def _small_farm(folder: Path, tail: str, defaults: str = "") -> Path:
    farm = folder / "farm.toml"
    farm.write_text(f'[defaults]\nrecipes = "{FIXTURES / "recipes"}"\ncuda = "13.0"\narchs = "120"\n{defaults}\n'
                    f'[[package]]\nname = "tinyext"\nversions = ["0.1.0"]\n\n{tail}')
    return farm


# ---------------------------------------------------------------- --torch-index


def _torch_folder(root: Path, *wheels: str) -> Path:
    """A PEP 503 folder whose torch/ page lists ``wheels`` (their names only: a +cuXYZ label needs no file)."""
    (root / "torch").mkdir(parents=True)
    (root / "torch" / "index.html").write_text("".join(f'<a href="{w}">{w}</a>\n' for w in wheels))
    return root


TORCH_CU130 = "torch-2.14.1+cu130-cp311-cp311-manylinux_2_28_x86_64.whl"


@pytest.fixture
def http_index(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A loopback HTTP server for ``tmp_path/served``: (its URL, the folder)."""
    folder = tmp_path / "served"
    folder.mkdir()

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, directory=str(folder), **kwargs)  # type: ignore[arg-type]

        def log_message(self, *args: object) -> None:
            pass

    with http_server(Quiet) as url:
        yield url.rstrip("/"), folder


@pytest.mark.parametrize(("index", "needle"), [
    ("ftp://127.0.0.1/simple", "--torch-index ftp://127.0.0.1/simple: the ftp:// scheme cannot be read"),
    ("/nonexistent/simple", "--torch-index /nonexistent/simple: no such folder"),
    ("file:///nonexistent/simple", "--torch-index file:///nonexistent/simple: no such folder"),
    ("file://otherhost/simple", "a file:// URL names a folder on this machine, not on otherhost"),
    ("https:///simple", "the URL names no host"),
])
def test_bad_torch_index_refused_before_any_work(recipe_tree: Path, cli_env: dict[str, str], index: str,
                                                 needle: str) -> None:
    """Both built before (exit 0), against a torch from somewhere else."""
    result = run_cli("build", "tinyext", "--recipes", str(recipe_tree), "--cuda", "13.0", "--arch", "120",
                     "--python", "3.11", "--torch", "2.14.1", "--torch-index", index, "--offline", env=cli_env,
                     timeout=CLI_TIMEOUT_S)
    assert_one_line_error(result, needle)
    assert result.code == UsageError.exit_code
    assert "==> " not in result.stderr
    assert not Path(cli_env["BUILDER_WHEELHOUSE"]).exists()


def test_local_torch_index_must_hold_torch(tmp_path: Path, cli_env: dict[str, str]) -> None:
    empty = tmp_path / "simple"
    (empty / "numpy").mkdir(parents=True)
    result = run_cli(*_plan(FIXTURES / "recipes", "--torch-index", str(empty)), env=cli_env, timeout=CLI_TIMEOUT_S)
    assert_one_line_error(result, f"--torch-index {empty}: the folder holds no torch project", "torch/index.html")
    a_file = tmp_path / "index.html"
    a_file.write_text("")
    result = run_cli(*_plan(FIXTURES / "recipes", "--torch-index", str(a_file)), env=cli_env, timeout=CLI_TIMEOUT_S)
    assert_one_line_error(result, f"--torch-index {a_file}: not a folder")
    # a torch/ page without one torch release
    shutil.rmtree(empty)
    _torch_folder(empty, "torch-1.13.1-cp311-cp311-manylinux1_x86_64.whl")
    result = run_cli(*_plan(FIXTURES / "recipes", "--torch-index", str(empty)), env=cli_env, timeout=CLI_TIMEOUT_S)
    assert_one_line_error(result, f"--torch-index {empty}: lists no torch release 2.0 or newer")


def test_local_torch_index_is_read_offline(tmp_path: Path, cli_env: dict[str, str]) -> None:
    """A folder is no network: --offline reads it (before, an uncached folder planned as "not reachable")."""
    index = _torch_folder(tmp_path / "simple", TORCH_CU130)
    result = run_cli(*_plan(FIXTURES / "recipes", "--torch-index", str(index)), env=cli_env, timeout=CLI_TIMEOUT_S)
    assert result.code == 0, result.stderr
    assert "NOT VERIFIED" not in result.stdout and "2.14.1 from custom" in result.stdout


def test_http_torch_index_unreachable_or_without_torch(http_index: tuple[str, Path], cli_env: dict[str, str]) -> None:
    url, folder = http_index
    dead = "http://127.0.0.1:9/simple"  # the discard port: nothing answers
    result = run_cli("torch-table", "--torch-index", dead, env=cli_env, timeout=CLI_TIMEOUT_S)
    assert_one_line_error(result, f"--torch-index {dead}: its torch list cannot be read (not reachable: ",
                          "check the URL")
    assert result.code == UsageError.exit_code
    (folder / "simple").mkdir()  # served, but no torch/ page: HTTP 404
    result = run_cli("torch-table", "--torch-index", f"{url}/simple", env=cli_env, timeout=CLI_TIMEOUT_S)
    assert_one_line_error(result, "its torch list cannot be read", "404")
    _torch_folder(folder / "simple")  # a torch/ page that lists nothing
    result = run_cli("torch-table", "--torch-index", f"{url}/simple", env=cli_env, timeout=CLI_TIMEOUT_S)
    assert_one_line_error(result, f"--torch-index {url}/simple: lists no torch release 2.0 or newer (read now)")


def test_http_torch_index_offline_needs_its_cache(http_index: tuple[str, Path], cli_env: dict[str, str]) -> None:
    url, folder = http_index
    _torch_folder(folder / "simple", TORCH_CU130)
    args = ("torch-table", "--torch-index", f"{url}/simple")
    uncached = run_cli(*args, "--offline", env=cli_env, timeout=CLI_TIMEOUT_S)
    assert_one_line_error(uncached, "its torch list is not cached, and --offline reads no index",
                          "run once without --offline")
    online = run_cli(*args, env=cli_env, timeout=CLI_TIMEOUT_S)
    assert online.code == 0 and "2.14.1" in online.stdout, online.stderr
    shutil.rmtree(folder / "simple")  # the server no longer serves it: the cached list answers offline
    cached = run_cli(*args, "--offline", env=cli_env, timeout=CLI_TIMEOUT_S)
    assert cached.code == 0 and "2.14.1" in cached.stdout, cached.stderr


def test_farm_torch_index_checked_like_the_flag(tmp_path: Path, cli_env: dict[str, str]) -> None:
    for index, needle in (("ftp://127.0.0.1/simple", "is 'ftp://127.0.0.1/simple': the ftp:// scheme cannot be read"),
                          (str(tmp_path / "none"), f"is '{tmp_path / 'none'}': no such folder")):
        farm = _small_farm(tmp_path, "", f'torch-index = "{index}"\n')
        result = run_cli("matrix", "--file", str(farm), env=cli_env, timeout=CLI_TIMEOUT_S)
        assert_one_line_error(result, f"{farm}: field 'defaults.torch-index' {needle}")
