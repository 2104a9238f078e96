"""`builder cache` / `builder cache clean`: sizes that count hard links right, locks respected, ages honoured."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from builder.core.cachedir import clean, disk_bytes, freed_bytes, usage
from builder.core.settings import Settings
from tests.helpers import assert_one_line_error, run_cli

MiB = 1024 * 1024


def settings_for(tmp_path: Path) -> Settings:
    return Settings.from_env({}, cache_dir=tmp_path / "cache", wheelhouse=tmp_path / "wh")


def write(path: Path, size: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path


def make_venv(cache: Path, name: str, uv_cache: Path) -> Path:
    """A build venv whose big file is a hard link into uv's cache, as uv makes them, plus a small own file."""
    venv = cache / "venvs" / name
    blob = write(uv_cache / name / "libtorch.so", 2 * MiB)
    (venv / "lib").mkdir(parents=True)
    os.link(blob, venv / "lib" / "libtorch.so")
    write(venv / "bin" / "python-stub", MiB // 4)
    (venv / ".builder-env.json").write_text("{}")
    return venv


def test_hard_links_into_uvs_cache_are_not_counted_as_freed(tmp_path: Path) -> None:
    s = settings_for(tmp_path)
    venv = make_venv(s.cache_dir, "build-aaaa", tmp_path / "uv")
    freed = freed_bytes([venv])
    assert MiB // 4 <= freed < MiB  # the venv's own file, not the 2 MiB shared with uv's cache
    assert disk_bytes([venv]) >= 2 * MiB + MiB // 4  # what lies under it, each file once
    # both links inside what is removed: then the file is freed too
    assert freed_bytes([venv, tmp_path / "uv"]) >= 2 * MiB + MiB // 4
    (row,) = [r for r in usage(s) if r.name == "venvs"]
    assert row.entries == 1 and row.bytes == freed


def test_clean_skips_a_venv_in_use_and_removes_the_rest(tmp_path: Path) -> None:
    s = settings_for(tmp_path)
    busy = make_venv(s.cache_dir, "build-busy", tmp_path / "uv")
    idle = make_venv(s.cache_dir, "build-idle", tmp_path / "uv")
    lock = s.cache_dir / "venvs" / "build-busy.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time\nfrom filelock import FileLock\n"
                               "with FileLock(sys.argv[1]):\n    print('held', flush=True); time.sleep(60)", str(lock)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        done = {r.entry.name: r for r in clean(s, ["venvs"])}
    finally:
        holder.kill()
        holder.wait()
    assert done["build-busy"].skipped == "in use by a running build or test" and busy.is_dir()
    assert done["build-idle"].skipped is None and not idle.exists()
    assert (tmp_path / "uv" / "build-idle" / "libtorch.so").is_file()  # uv's own cache is not ours to remove


def test_older_than_keeps_what_was_used_recently(tmp_path: Path) -> None:
    s = settings_for(tmp_path)
    old = write(s.cache_dir / "sources" / "old-1.0.tar.gz", 1000)
    new = write(s.cache_dir / "sources" / "new-2.0.tar.gz", 1000)
    stale = time.time() - 10 * 86400
    os.utime(old, (stale, stale))
    venv = make_venv(s.cache_dir, "build-reused", tmp_path / "uv")
    os.utime(venv, (stale, stale))  # the folder is old, but its marker was touched by a reuse today
    dry = clean(s, ["sources", "venvs"], older_than_days=7, dry_run=True)
    assert [r.entry.name for r in dry] == ["old-1.0.tar.gz"] and old.exists()
    clean(s, ["sources", "venvs"], older_than_days=7)
    assert not old.exists() and new.exists() and venv.is_dir()


def test_cli_errors_name_the_parts(tmp_path: Path) -> None:
    env = {"BUILDER_CACHE_DIR": str(tmp_path / "cache")}
    none = run_cli("cache", "clean", env=env)
    assert_one_line_error(none, "name the parts to clean, or --all", "venvs")
    assert none.code == 2
    bad = run_cli("cache", "clean", "wheels", env=env)
    assert_one_line_error(bad, "unknown cache section wheels", "choose from venvs")
    negative = run_cli("cache", "clean", "logs", "--older-than", "-1", env=env)
    assert_one_line_error(negative, "argument --older-than: '-1' is not a number of days")


def test_cli_shows_and_cleans(tmp_path: Path) -> None:
    env = {"BUILDER_CACHE_DIR": str(tmp_path / "cache")}
    write(tmp_path / "cache" / "logs" / "a.log", 3 * MiB)
    shown = run_cli("cache", env={**env, "COLUMNS": "200"})
    assert shown.code == 0, shown.stderr
    logs = next(line for line in shown.stdout.splitlines() if line.startswith("│ logs"))
    assert [cell.strip() for cell in logs.strip("│ ").split("│")][:3] == ["logs", "1", "3.0 MiB"], logs
    cleaned = run_cli("cache", "clean", "--all", env=env)
    assert cleaned.code == 0 and "removed 1 entry, 3.0 MiB freed" in cleaned.stdout, cleaned.stdout
    assert not (tmp_path / "cache" / "logs" / "a.log").exists()


@pytest.mark.parametrize("flag", ["--dry-run", ""])
def test_clean_of_an_empty_cache_is_fine(tmp_path: Path, flag: str) -> None:
    result = run_cli("cache", "clean", "--all", *([flag] if flag else []), env={"BUILDER_CACHE_DIR": str(tmp_path / "c")})
    assert result.code == 0 and "0 entries, 0 B" in result.stdout, result.stdout + result.stderr
