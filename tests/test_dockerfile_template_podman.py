"""The Dockerfile template built for real on podman (integration tier, marked ``docker``): ``builder images build
--cuda 13.0 --base-image <stand-in>`` fills the template's arguments, the image runs the stand-in's nvcc through
``/usr/local/cuda`` and carries the labels the toolchain finds it by; a second call says "up to date". The stand-in
base (a debootstrap'ed Debian with CUDA 13.0, tests/test_docker_e2e.py) already holds the CUDA, so no registry or
NVIDIA repository is needed; installing from NVIDIA's repository is the part only a networked engine can check."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.toolchain.images import LABEL_DOCKERFILE, LABEL_PLATFORM, TEMPLATE, image_spec
from tests.helpers import run_cli
from tests.test_docker_e2e import _podman, podman_service, standin_base, standin_image  # noqa: F401 (fixtures)

pytestmark = [pytest.mark.docker]


def test_the_template_builds_a_cuda_13_0_image_on_the_stand_in(podman_service: dict[str, str],  # noqa: F811
                                                               standin_image: str) -> None:  # noqa: F811
    env = {"DOCKER_HOST": podman_service["DOCKER_HOST"], "CONTAINERS_CONF": podman_service["_conf"]}
    built = run_cli("images", "build", "--cuda", "13.0", "--base-image", standin_image, "--force", env=env)
    assert built.code == 0, built.stderr[-3000:]
    spec = image_spec("13.0", standin_image)
    assert f"built: {spec.tag}" in built.stdout and f"from {TEMPLATE}" in built.stderr, built.stdout + built.stderr
    again = run_cli("images", "build", "--cuda", "13.0", "--base-image", standin_image, env=env)
    assert again.code == 0 and f"up to date: {spec.tag}" in again.stdout, again.stderr[-2000:]
    conf = Path(podman_service["_conf"])
    run = _podman(conf, "run", "--rm", "--network", "none", spec.tag, "sh", "-c",
                  'readlink /usr/local/cuda && echo "$CUDA_HOME" && nvcc --version | tail -n 2')
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.splitlines()[:2] == ["/usr/local/cuda-13.0", "/usr/local/cuda"], run.stdout
    assert "release 13.0" in run.stdout
    labels = _podman(conf, "image", "inspect", "--format", "{{json .Labels}}", spec.tag)
    assert spec.dockerfile_sha256 in labels.stdout and LABEL_DOCKERFILE in labels.stdout
    assert f'"{LABEL_PLATFORM}":"x86_64"' in labels.stdout, labels.stdout
