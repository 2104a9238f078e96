"""uv failures: the error keeps uv's root cause and says when the disk is full.

The full-disk case is real: a 2 MiB tmpfs (mounted by the test; skipped with the reason where mounting is not
allowed) receives a venv and then a wheel bigger than the space left.
"""

from __future__ import annotations

import os
import subprocess
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.core.errors import ToolchainError
from builder.core.uvtool import LOW_DISK_BYTES, install_failure, run_uv


def make_big_wheel(where: Path, size: int) -> Path:
    """A valid pure-Python wheel holding ``size`` bytes of incompressible data."""
    wheel = where / "bigpkg-1.0-py3-none-any.whl"
    info = "bigpkg-1.0.dist-info"
    files = {
        "bigpkg/__init__.py": b"",
        "bigpkg/blob.bin": os.urandom(size),
        f"{info}/METADATA": b"Metadata-Version: 2.1\nName: bigpkg\nVersion: 1.0\n",
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in files.items():
            zf.writestr(name, data)
        zf.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n")
    return wheel


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "tiny"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill (needs root): {result.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_named_with_the_fix(tiny_disk: Path, tmp_path: Path) -> None:
    env = {**os.environ, "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    venv = tiny_disk / "venv"
    run_uv(["venv", "--quiet", str(venv)], what="venv creation", env=env)
    wheel = make_big_wheel(tmp_path, 3 * 1024 * 1024)
    with pytest.raises(ToolchainError) as info:
        run_uv(["pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), str(wheel)],
               what="installing bigpkg", env=env)
    err = info.value
    assert err.message.startswith("installing bigpkg failed: ")
    assert "No space left on device" in err.message or "os error 28" in err.message, err.message
    assert err.hint is not None and str(venv) in err.hint and "BUILDER_CACHE_DIR" in err.hint, err.hint
    assert "GiB free" in err.hint


def test_the_root_cause_survives_a_long_message() -> None:
    """uv prints its causes from the outside in: the last line is the one a user needs."""
    output = "\n".join(["error: Failed to install: triton-3.8.0-…whl", *(f"  cause: layer {i} " + "x" * 200 for i in range(5)),
                        "  cause: Permission denied (os error 13)"])
    err = install_failure("installing torch", output, where=None)
    assert err.message.endswith("cause: Permission denied (os error 13)"), err.message
    assert len(err.message) < 700 and "…" in err.message
    assert err.hint is None  # not a disk problem


def test_low_free_space_adds_the_disk_hint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("builder.core.uvtool.free_bytes", lambda path: LOW_DISK_BYTES // 4)
    err = install_failure("installing torch", "error: failed to copy file", where=tmp_path / "venv")
    assert err.hint is not None and "1.5 GiB free" in err.hint and str(tmp_path / "venv") in err.hint
    # a failure that is not about writing files gets no disk hint, however little is free
    unrelated = install_failure("installing torch", "error: No solution found when resolving dependencies",
                                where=tmp_path / "venv")
    assert unrelated.hint is None


def test_the_free_space_is_checked_where_the_venv_goes() -> None:
    from builder.core.uvtool import _install_target

    assert _install_target(["venv", "--quiet", "--python", "/opt/py/bin/python3.12", "/c/venvs/b-1"]) == Path("/c/venvs/b-1")
    assert _install_target(["pip", "install", "--python", "/c/venvs/b-1/bin/python", "torch"]) == Path("/c/venvs/b-1")
