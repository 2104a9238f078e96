"""Build images for the docker toolchain: tags follow the Dockerfile and its build arguments; Dockerfiles lint."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from builder.core.errors import UsageError
from builder.toolchain.images import DOCKERFILES, available_cudas, default_base_image, image_spec, short_tag
from tests.helpers import hadolint


def test_one_template_builds_every_cuda_with_the_base_image_as_a_build_argument() -> None:
    assert available_cudas() == ["12.8", "12.9", "13.0", "13.2"]  # the farm's cu128/cu130/cu132 among them
    assert sorted(p.name for p in DOCKERFILES.glob("*Dockerfile*")) == ["manylinux-cuda.Dockerfile"]
    text = (DOCKERFILES / "manylinux-cuda.Dockerfile").read_text()
    assert "FROM ${BASE_IMAGE}" in text
    # a base that already holds this CUDA (the e2e test's stand-in) skips the install from NVIDIA's repository
    assert 'if [ ! -x "/usr/local/cuda-${CUDA_VERSION}/bin/nvcc" ]; then' in text
    assert 'ln -sfn "/usr/local/cuda-${CUDA_VERSION}" /usr/local/cuda' in text
    for cuda in available_cudas():
        spec = image_spec(cuda)
        dashed = cuda.replace(".", "-")
        assert spec.dockerfile == DOCKERFILES / "manylinux-cuda.Dockerfile"
        assert spec.base_image == default_base_image() == "quay.io/pypa/manylinux_2_28_x86_64:latest"
        assert spec.buildargs == {
            "BASE_IMAGE": "quay.io/pypa/manylinux_2_28_x86_64:latest", "CUDA_VERSION": cuda,
            "CUDA_REPO": "https://developer.download.nvidia.com/compute/cuda/repos/rhel8/x86_64/cuda-rhel8.repo",
            "CUDA_PACKAGES": f"cuda-nvcc-{dashed} cuda-cudart-devel-{dashed} cuda-cccl-{dashed} "
                             f"cuda-nvrtc-devel-{dashed} cuda-nvtx-{dashed} cuda-profiler-api-{dashed} "
                             f"libcublas-devel-{dashed} libcusparse-devel-{dashed} libcusolver-devel-{dashed} "
                             f"libcurand-devel-{dashed} libcufft-devel-{dashed}"}


def test_tag_encodes_cuda_and_a_hash_of_template_and_build_args(tmp_path: Path) -> None:
    spec = image_spec("12.8")
    assert spec.tag.startswith("cuda-wheel-builder:cuda12.8-") and len(spec.tag.rsplit("-", 1)[1]) == 12
    assert spec.base_image == "quay.io/pypa/manylinux_2_28_x86_64:latest"
    other_base = image_spec("12.8", "localhost/stand-in")
    assert other_base.tag != spec.tag and other_base.base_image == "localhost/stand-in"
    # the recipe label leaves the base out: an image on a stand-in base is found for the same template and args
    assert other_base.dockerfile_sha256 == spec.dockerfile_sha256
    assert image_spec("12.8").tag == spec.tag  # stable
    # every CUDA gets its own tag and recipe from the same template
    tags = {image_spec(cuda).tag for cuda in available_cudas()}
    assert len(tags) == len(available_cudas())
    assert len({image_spec(cuda).dockerfile_sha256 for cuda in available_cudas()}) == len(available_cudas())
    # an edited template gives another tag: a stale image is never reused
    copy = tmp_path / "dockerfiles"
    shutil.copytree(DOCKERFILES, copy)
    assert image_spec("12.8", dockerfiles=copy).tag == spec.tag
    edited = copy / "manylinux-cuda.Dockerfile"
    edited.write_text(edited.read_text() + "# edited\n")
    assert image_spec("12.8", dockerfiles=copy).tag != spec.tag
    assert image_spec("12.8", dockerfiles=copy).dockerfile_sha256 != spec.dockerfile_sha256
    labels = spec.labels()
    assert labels["org.cuda-wheel-builder.cuda"] == "12.8" and labels["org.cuda-wheel-builder.key"] == spec.key


def test_unknown_cuda_names_the_available_ones() -> None:
    with pytest.raises(UsageError) as e:
        image_spec("11.8")
    line = e.value.one_line()
    assert "no image for CUDA 11.8" in line and "available: 12.8, 12.9, 13.0, 13.2" in line
    assert "IMAGE_CUDAS" in line


def test_podman_tag_spellings_are_normalized() -> None:
    assert short_tag("docker.io/library/cuda-wheel-builder:cuda13.0-abc") == "cuda-wheel-builder:cuda13.0-abc"
    assert short_tag("localhost/cuda-wheel-builder:x") == "cuda-wheel-builder:x"


def test_dockerfiles_pass_hadolint() -> None:
    hadolint_bin = hadolint()
    for dockerfile in sorted(DOCKERFILES.glob("*.Dockerfile")):
        result = subprocess.run([hadolint_bin, str(dockerfile)], capture_output=True, text=True)
        assert result.returncode == 0, f"{dockerfile.name}:\n{result.stdout}{result.stderr}"


def test_aarch64_images_come_from_the_same_template_with_nvidias_sbsa_repository() -> None:
    """aarch64 images: the manylinux_2_28_aarch64 base and NVIDIA's rhel8 sbsa packages, one per x86_64 CUDA; their
    tags name the platform, x86_64 tags name none."""
    from builder.model.platform import AARCH64

    assert available_cudas(platform=AARCH64) == available_cudas() == ["12.8", "12.9", "13.0", "13.2"]
    for cuda in available_cudas(platform=AARCH64):
        spec = image_spec(cuda, platform=AARCH64)
        x86 = image_spec(cuda)
        assert spec.dockerfile == x86.dockerfile == DOCKERFILES / "manylinux-cuda.Dockerfile"
        assert spec.base_image == default_base_image(AARCH64) == "quay.io/pypa/manylinux_2_28_aarch64:latest"
        assert spec.buildargs["CUDA_REPO"].endswith("/compute/cuda/repos/rhel8/sbsa/cuda-rhel8.repo")
        # the same packages as the x86_64 image
        assert spec.buildargs["CUDA_PACKAGES"] == x86.buildargs["CUDA_PACKAGES"]
        assert spec.tag.startswith(f"cuda-wheel-builder:cuda{cuda}-aarch64-") and spec.tag != x86.tag
        assert spec.dockerfile_sha256 != x86.dockerfile_sha256  # another repository: another recipe
        assert spec.labels()["org.cuda-wheel-builder.platform"] == "aarch64"
    assert image_spec("13.0", platform=AARCH64, components=("nvjitlink",)).buildargs["EXTRA_PACKAGES"] == \
        "libnvjitlink-devel-13-0"
    with pytest.raises(UsageError) as e:
        image_spec("11.8", platform=AARCH64)
    assert "no image for CUDA 11.8 on aarch64" in e.value.one_line()
    assert "available on aarch64: 12.8, 12.9, 13.0, 13.2" in e.value.one_line()
