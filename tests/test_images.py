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


def test_an_aarch64_dockerfile_per_cuda_from_nvidias_sbsa_repository() -> None:
    """aarch64 images: the manylinux_2_28_aarch64 base and NVIDIA's rhel8 sbsa packages, one per x86_64 CUDA; their
    tags name the platform, x86_64 tags stay as they were."""
    from builder.model.platform import AARCH64

    assert available_cudas(platform=AARCH64) == available_cudas() == ["12.8", "12.9", "13.0", "13.2"]
    for cuda in available_cudas(platform=AARCH64):
        spec = image_spec(cuda, platform=AARCH64)
        assert spec.dockerfile == DOCKERFILES / f"manylinux-aarch64-cuda-{cuda}.Dockerfile"
        assert spec.base_image == "quay.io/pypa/manylinux_2_28_aarch64:latest"
        text = spec.dockerfile.read_text()
        assert "/compute/cuda/repos/rhel8/sbsa/cuda-rhel8.repo" in text and "x86_64" not in text.split("FROM")[1]
        dashed = cuda.replace(".", "-")
        # the same packages as the x86_64 image (extra_packages compares against the Dockerfile's words)
        x86_packages = {w for w in image_spec(cuda).dockerfile.read_text().split() if w.endswith(dashed)}
        assert x86_packages and x86_packages == {w for w in text.split() if w.endswith(dashed)}
        assert spec.tag.startswith(f"cuda-wheel-builder:cuda{cuda}-aarch64-") and spec.tag != image_spec(cuda).tag
        assert spec.labels()["org.cuda-wheel-builder.platform"] == "aarch64"
    assert image_spec("13.0", platform=AARCH64, components=("nvjitlink",)).buildargs == {
        "EXTRA_PACKAGES": "libnvjitlink-devel-13-0"}
    with pytest.raises(UsageError) as e:
        image_spec("11.8", platform=AARCH64)
    assert "no Dockerfile for CUDA 11.8 on aarch64" in e.value.one_line()
    assert "available on aarch64: 12.8, 12.9, 13.0, 13.2" in e.value.one_line()
