"""Toolchain selection and the pip-provisioned CUDA 13 toolkit (real download from PyPI, cached by uv)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from packaging.version import Version

from builder.errors import ToolchainError
from builder.settings import Settings
from builder.toolchain import pip as pip_toolchain
from builder.toolchain.host import find_host_toolkit
from builder.toolchain.select import select_toolkit


def settings(tmp_path: Path, offline: bool = False) -> Settings:
    return Settings(cache_dir=tmp_path / "cache", wheelhouse=tmp_path / "wh", recipes_dir=tmp_path,
                    patches_dir=tmp_path, offline=offline)


def test_pip_refuses_cuda12_with_alternatives(tmp_path: Path) -> None:
    with pytest.raises(ToolchainError) as info:
        pip_toolchain.provision(Version("12.8"), settings(tmp_path))
    assert "PyPI has no CUDA 12 compiler" in info.value.message
    assert "--toolchain docker" in (info.value.hint or "") and "--toolchain host" in (info.value.hint or "")


def test_host_toolkit_must_match_requested_version(tmp_path: Path) -> None:
    with pytest.raises(ToolchainError, match="no CUDA 12.9 toolkit"):
        find_host_toolkit(Version("12.9"), {"PATH": "/usr/bin:/bin", "CUDA_HOME": str(tmp_path)})


def test_host_toolkit_none_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("builder.toolchain.host.Path.glob", lambda self, pattern: iter(()))
    monkeypatch.setattr("builder.toolchain.host.candidate_homes", lambda env: [])
    with pytest.raises(ToolchainError, match="no nvcc found"):
        find_host_toolkit(Version("13.0"), {"PATH": "/nonexistent"})


@pytest.mark.network
def test_pip_toolkit_provisioned_cached_and_repaired(tmp_path: Path) -> None:
    cfg = settings(tmp_path)
    first = pip_toolchain.provision(Version("13.0"), cfg)
    assert first.kind == "pip" and (first.version.major, first.version.minor) == (13, 0)
    assert (first.cuda_home / "lib" / "libcudart.so").exists(), "the unversioned cudart link is made"
    again = pip_toolchain.provision(Version("13.0"), cfg)
    assert again.cuda_home == first.cuda_home and "cached" in again.reason
    (first.cuda_home / "nvvm" / "bin" / "cicc").unlink()  # damage the cached toolkit
    with pytest.raises(ToolchainError, match="--offline forbids"):
        pip_toolchain.provision(Version("13.0"), settings(tmp_path, offline=True))
    repaired = pip_toolchain.provision(Version("13.0"), cfg)
    assert (repaired.cuda_home / "nvvm" / "bin" / "cicc").exists() and "cached" not in repaired.reason


@pytest.mark.skipif(not shutil.which("nvcc"), reason="skipped: no nvcc on PATH")
def test_auto_prefers_matching_host_toolkit(tmp_path: Path) -> None:
    import os

    choice = select_toolkit("auto", Version("13.0"), settings(tmp_path), dict(os.environ))
    assert choice.toolkit is not None and choice.toolkit.kind == "host"
    assert choice.toolkit.reason.startswith("auto:") and "host nvcc is CUDA 13.0" in choice.toolkit.reason
