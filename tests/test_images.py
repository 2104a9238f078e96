"""Build images for the docker toolchain: tags follow the Dockerfile and its build arguments; Dockerfiles lint."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from builder.core.errors import UsageError
from builder.toolchain.images import DOCKERFILES, available_cudas, default_base_image, image_spec, short_tag
from tests.helpers import hadolint


def test_a_manylinux_dockerfile_per_cuda_with_the_base_image_as_a_build_argument() -> None:
    assert available_cudas() == ["12.8", "12.9", "13.0", "13.2"]  # the farm's cu128/cu130/cu132 among them
    for cuda in available_cudas():
        dockerfile = DOCKERFILES / f"manylinux-cuda-{cuda}.Dockerfile"
        assert image_spec(cuda).dockerfile == dockerfile
        assert default_base_image(dockerfile) == "quay.io/pypa/manylinux_2_28_x86_64:latest"
        text = dockerfile.read_text()
        assert "FROM ${BASE_IMAGE}" in text
        # a base that already holds this CUDA (the e2e test's stand-in) skips the install from NVIDIA's repository
        assert f"if [ ! -x /usr/local/cuda-{cuda}/bin/nvcc ]; then" in text
        assert f"ln -sfn /usr/local/cuda-{cuda} /usr/local/cuda" in text


def test_tag_encodes_cuda_and_a_hash_of_dockerfile_and_build_args(tmp_path: Path) -> None:
    spec = image_spec("12.8")
    assert spec.tag.startswith("cuda-wheel-builder:cuda12.8-") and len(spec.tag.rsplit("-", 1)[1]) == 12
    assert spec.base_image == "quay.io/pypa/manylinux_2_28_x86_64:latest"
    other_base = image_spec("12.8", "localhost/stand-in")
    assert other_base.tag != spec.tag and other_base.base_image == "localhost/stand-in"
    assert image_spec("12.8").tag == spec.tag  # stable
    # an edited Dockerfile gives another tag: a stale image is never reused
    copy = tmp_path / "dockerfiles"
    shutil.copytree(DOCKERFILES, copy)
    assert image_spec("12.8", dockerfiles=copy).tag == spec.tag
    edited = copy / "manylinux-cuda-12.8.Dockerfile"
    edited.write_text(edited.read_text() + "# edited\n")
    assert image_spec("12.8", dockerfiles=copy).tag != spec.tag
    labels = spec.labels()
    assert labels["org.cuda-wheel-builder.cuda"] == "12.8" and labels["org.cuda-wheel-builder.key"] == spec.key


def test_unknown_cuda_names_the_available_ones() -> None:
    with pytest.raises(UsageError) as e:
        image_spec("11.8")
    line = e.value.one_line()
    assert "no Dockerfile for CUDA 11.8" in line and "available: 12.8, 12.9, 13.0, 13.2" in line


def test_podman_tag_spellings_are_normalized() -> None:
    assert short_tag("docker.io/library/cuda-wheel-builder:cuda13.0-abc") == "cuda-wheel-builder:cuda13.0-abc"
    assert short_tag("localhost/cuda-wheel-builder:x") == "cuda-wheel-builder:x"


def test_dockerfiles_pass_hadolint() -> None:
    hadolint_bin = hadolint()
    for dockerfile in sorted(DOCKERFILES.glob("*.Dockerfile")):
        result = subprocess.run([hadolint_bin, str(dockerfile)], capture_output=True, text=True)
        assert result.returncode == 0, f"{dockerfile.name}:\n{result.stdout}{result.stderr}"
