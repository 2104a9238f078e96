"""--arch parsing, CUDA arch tables and the torch/CUDA table."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.core.errors import UsageError
from builder.discovery.compat import check_torch_matches_cuda, default_torch, resolve_index
from builder.model.arch import Arch, check_archs_for_cuda, parse_arch_list, torch_arch_list
from builder.model.cuda import CudaVersion


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("120", "12.0"),
        ("90,120", "9.0;12.0"),
        ("120+ptx", "12.0+PTX"),
        ("sm_90, 12.0+PTX", "9.0;12.0+PTX"),
        ("90a", "9.0a"),
        ("120;90;120", "9.0;12.0"),
    ],
)
def test_parse_arch_list(text: str, expected: str) -> None:
    assert torch_arch_list(parse_arch_list(text)) == expected


@pytest.mark.parametrize("bad", ["abc", "", "1", "12.0.1", "sm_x", "120+sass"])
def test_parse_arch_list_rejects(bad: str) -> None:
    with pytest.raises(UsageError, match="--arch"):
        parse_arch_list(bad)


def test_arch_names() -> None:
    arch = Arch(120, ptx=True)
    assert (arch.sm, arch.compute, str(arch)) == ("sm_120", "compute_120", "120+ptx")


def test_cuda_arch_support() -> None:
    check_archs_for_cuda(parse_arch_list("120"), CudaVersion.parse("12.8"))
    check_archs_for_cuda(parse_arch_list("121"), CudaVersion.parse("12.9"))
    with pytest.raises(UsageError, match="CUDA 12.8 cannot compile sm_121"):
        check_archs_for_cuda(parse_arch_list("121"), CudaVersion.parse("12.8"))
    with pytest.raises(UsageError, match="cannot compile sm_53"):
        check_archs_for_cuda(parse_arch_list("53"), CudaVersion.parse("13.0"))


def test_default_torch_per_cuda() -> None:
    pypi = resolve_index(None)
    assert default_torch(pypi, CudaVersion.parse("12.8")) == "2.10.0"
    assert default_torch(pypi, CudaVersion.parse("13.0")) == "2.14.1"
    assert default_torch(resolve_index("cu128"), CudaVersion.parse("12.8")) == "2.11.0"
    with pytest.raises(UsageError, match="no torch build for CUDA 12.9"):
        default_torch(pypi, CudaVersion.parse("12.9"))


def test_torch_cuda_mismatch_suggests_index() -> None:
    with pytest.raises(UsageError) as info:
        check_torch_matches_cuda(resolve_index(None), "2.11.0", CudaVersion.parse("12.8"))
    assert "CUDA 13.0 build, not CUDA 12.8" in info.value.message
    assert "pytorch-cu128" in (info.value.hint or "")
    check_torch_matches_cuda(resolve_index("cu128"), "2.11.0", CudaVersion.parse("12.8"))


def test_custom_index_url(tmp_path: Path) -> None:
    (tmp_path / "simple" / "torch").mkdir(parents=True)
    (tmp_path / "simple" / "torch" / "index.html").write_text("")
    index = resolve_index(f"{tmp_path}/simple")
    assert index.url == f"file://{tmp_path}/simple" and index.name == "custom"
    with pytest.raises(UsageError, match="neither a URL"):
        resolve_index("not-an-index")
    with pytest.raises(UsageError, match="no such folder"):  # a local index is checked without settings too
        resolve_index(f"{tmp_path}/missing")


# ---------------------------------------------------------------- what a toolkit compiles, read from its nvcc


def test_parse_gpu_list() -> None:
    from builder.model.arch import parse_gpu_list

    assert parse_gpu_list("sm_90\nsm_100\nsm_100a\nsm_121\ncompute_90\n") == ((90, 100, 121), (90,))


def test_arch_support_from_a_real_nvcc(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The nvcc on PATH (CUDA 13.0 here) is asked, and the answer is cached; no nvcc: the table answers."""
    import shutil

    from builder.core.settings import Settings
    from builder.model.arch import arch_support

    settings = Settings.from_env({}, cache_dir=tmp_path / "cache", wheelhouse=tmp_path / "wh")
    if not shutil.which("nvcc"):
        pytest.skip("no nvcc on PATH")
    import subprocess

    from builder.model.arch import parse_nvcc_version

    version = parse_nvcc_version(subprocess.run(["nvcc", "--version"], capture_output=True, check=False, text=True).stdout)
    assert version is not None
    support = arch_support(CudaVersion.parse(f"{version.major}.{version.minor}"), settings)
    assert support is not None and "--list-gpu-code" in support.source
    assert 90 in support.sass and 90 in support.ptx
    assert (tmp_path / "cache" / "index" / "nvcc-archs.json").exists()
    assert arch_support(CudaVersion.parse("12.8"), settings).source == "builder/arch.py table"  # type: ignore[union-attr]


def test_cuda_13_minors_accept_sm_103_and_sm_121() -> None:
    for cuda in ("13.0", "13.1", "13.2"):
        assert check_archs_for_cuda(parse_arch_list("103,121"), CudaVersion.parse(cuda)) is None  # raises when refused
    with pytest.raises(UsageError, match="cannot compile sm_121"):  # and the check does refuse: 12.8 predates sm_121
        check_archs_for_cuda(parse_arch_list("121"), CudaVersion.parse("12.8"))


def test_label_follows_the_torch_cuda() -> None:
    from builder.discovery.compat import torch_cuda

    pypi = resolve_index(None)  # the shipped snapshot: read from PyPI when it was written
    assert str(torch_cuda(pypi, "2.15.0", CudaVersion.parse("13.0"))) == "13.2"
    assert default_torch(pypi, CudaVersion.parse("13.2")) == "2.15.0"
    with pytest.raises(UsageError, match="torch 2.15.0 on pypi is a CUDA 13.2 build, not CUDA 13.0"):
        check_torch_matches_cuda(pypi, "2.15.0", CudaVersion.parse("13.0"))
