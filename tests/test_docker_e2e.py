"""End to end through the docker toolchain on podman: a real CUDA extension compiled inside a container.

The test starts its own ``podman system service`` on a private socket (with the settings that work on this
machine: runc, no default ulimits, cgroupfs) and stops it afterwards. No registry is reachable here, so the
nvidia/cuda base is replaced by a local stand-in: a debootstrap'ed Debian bookworm (Python 3.11) with this
machine's CUDA 13.0 toolkit at /usr/local/cuda, made once per machine and cached as
/var/tmp/cuda-wheel-builder-base.tar. Our Dockerfile is built FROM it with ``builder images build --base-image``,
then ``builder build tinyext --toolchain docker`` compiles in the container and the host checks and tests the wheel.
Where podman, debootstrap or the CUDA toolkit is missing, or the engine does not start, the test is skipped
with the reason. Measured times are in docs/DOCKER.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, LOCAL_TORCH_INDEX, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

CONTAINERS_CONF = '[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\n'
BASE_TAR = Path(os.environ.get("BUILDER_TEST_BASE_TAR", "/var/tmp/cuda-wheel-builder-base.tar"))
BASE_IMAGE = "localhost/cuda-wheel-builder-base:cuda13.0-standin"
HOST_CUDA = Path("/usr/local/cuda-13.0")
WHEEL = "tinyext-0.1.0+cu130torch2.14-cp311-cp311-linux_x86_64.whl"


def _podman_env(conf: Path) -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def _podman(conf: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "--runtime", "runc", *args], env=_podman_env(conf), capture_output=True,
                          text=True, timeout=timeout)


# what the module writes: the container build venv with a CUDA torch and its nvidia-* libraries (about 5.2 GiB,
# hard-linked from uv's cache), the stand-in base image (0.5 GiB tar + about 2 GiB of podman storage)
DISK_NEEDED_GIB = 8.0


@pytest.fixture(scope="module")
def podman_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A podman Docker-API service on a private socket, stopped after the module; skip where none can start."""
    free = shutil.disk_usage(tmp_path_factory.getbasetemp()).free / 1024**3
    if free < DISK_NEEDED_GIB:
        pytest.skip(f"not enough disk for the container build: {free:.1f} GiB free, about {DISK_NEEDED_GIB:.0f} GiB "
                    "needed (a CUDA torch venv in the container plus the stand-in image)")
    if shutil.which("podman") is None:
        pytest.skip("no container engine can start here: podman is not installed (apt-get install podman)")
    if shutil.which("runc") is None:
        pytest.skip("no container engine can start here: runc is not installed")
    # a short path: unix socket paths are limited to 108 bytes
    root = Path(tempfile.mkdtemp(prefix="cwb-podman-", dir="/tmp"))
    conf = root / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    sock = root / "podman.sock"
    log = (root / "service.log").open("w")
    proc = subprocess.Popen(["podman", "--runtime", "runc", "system", "service", "--time=0", f"unix://{sock}"],
                            env=_podman_env(conf), stdout=log, stderr=subprocess.STDOUT)
    env = {"DOCKER_HOST": f"unix://{sock}", "CONTAINERS_CONF": str(conf)}
    try:
        import docker

        deadline = time.monotonic() + 30
        while True:
            try:
                docker.DockerClient(base_url=env["DOCKER_HOST"], timeout=3).ping()
                break
            except Exception as e:  # noqa: BLE001
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.skip(f"no container engine can start here: podman system service did not answer ({e}; "
                                f"{(root / 'service.log').read_text()[-300:]})")
                time.sleep(0.5)
        yield {**env, "_conf": str(conf)}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        shutil.rmtree(root, ignore_errors=True)


def make_base_tar(target: Path = BASE_TAR) -> None:
    """debootstrap bookworm (minbase) + this machine's CUDA 13.0 at /usr/local/cuda + its CA certificates."""
    if shutil.which("debootstrap") is None:
        pytest.skip("cannot make the stand-in base image: debootstrap is not installed (apt-get install debootstrap)")
    if not (HOST_CUDA / "bin" / "nvcc").exists():
        pytest.skip(f"cannot make the stand-in base image: no CUDA 13.0 toolkit at {HOST_CUDA}")
    work = Path(tempfile.mkdtemp(prefix="cwb-base-", dir="/var/tmp"))
    try:
        rootfs = work / "rootfs"
        result = subprocess.run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs),
                                 "http://deb.debian.org/debian"], capture_output=True, text=True, timeout=1200)
        if result.returncode != 0:
            pytest.skip(f"cannot make the stand-in base image: debootstrap failed: {result.stdout[-300:]}")
        shutil.copytree(HOST_CUDA, rootfs / "usr/local/cuda-13.0", symlinks=True)
        (rootfs / "usr/local/cuda").symlink_to("cuda-13.0")
        # this machine reaches PyPI through a TLS proxy with its own CA: the container must trust it too
        cas = rootfs / "usr/local/share/ca-certificates"
        cas.mkdir(parents=True, exist_ok=True)
        for crt in Path("/usr/local/share/ca-certificates").glob("*.crt"):
            shutil.copy2(crt, cas / crt.name)
        partial = target.with_suffix(".tar.partial")
        subprocess.run(["tar", "-C", str(rootfs), "-cf", str(partial), "."], check=True, timeout=600)
        partial.replace(target)
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def standin_base(podman_service: dict[str, str]) -> str:
    """The stand-in for nvidia/cuda:13.0.x-devel on the engine (made once per machine, then imported)."""
    conf = Path(podman_service["_conf"])
    if _podman(conf, "image", "exists", BASE_IMAGE).returncode == 0:
        return BASE_IMAGE
    if not BASE_TAR.exists():
        make_base_tar()
    result = _podman(conf, "import", str(BASE_TAR), BASE_IMAGE)
    assert result.returncode == 0, result.stderr[-2000:]
    return BASE_IMAGE


@pytest.fixture(scope="module")
def docker_build(podman_service: dict[str, str], standin_base: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not LOCAL_TORCH_INDEX.is_dir():
        pytest.skip(f"no local torch index at {LOCAL_TORCH_INDEX}")
    base = tmp_path_factory.mktemp("docker-e2e")
    env = {"DOCKER_HOST": podman_service["DOCKER_HOST"], "BUILDER_CACHE_DIR": str(base / "cache"),
           "BUILDER_WHEELHOUSE": str(base / "wheelhouse")}
    times: dict[str, float] = {}
    start = time.monotonic()
    images = run_cli("images", "build", "--cuda", "13.0", "--base-image", standin_base, env=env)
    times["images build"] = time.monotonic() - start
    args = ["build", "tinyext", "--recipes", str(FIXTURES / "recipes"), "--cuda", "13.0", "--arch", "90",
            "--python", "3.11", "--torch", "2.14.1", "--torch-index", str(LOCAL_TORCH_INDEX)]
    start = time.monotonic()
    build = run_cli(*args, "--toolchain", "docker", env=env)
    times["build --toolchain docker"] = time.monotonic() - start
    print(f"\n[docker e2e] images build: {times['images build']:.0f}s; build: {times['build --toolchain docker']:.0f}s")
    return {"base": base, "env": env, "args": args, "images": images, "build": build, "times": times}


def test_images_build_tags_by_dockerfile_hash(docker_build: dict) -> None:
    images = docker_build["images"]
    assert images.code == 0, images.stderr[-3000:]
    assert "cuda-wheel-builder:cuda13.0-" in images.stdout
    again = run_cli("images", "build", "--cuda", "13.0", "--base-image", BASE_IMAGE, env=docker_build["env"])
    assert again.code == 0 and "up to date: cuda-wheel-builder:cuda13.0-" in again.stdout, again.stderr[-2000:]
    listing = run_cli("images", "list", env=docker_build["env"])
    assert BASE_IMAGE in listing.stdout and "CUDA 13.0" in listing.stdout


def test_wheel_built_in_a_container_is_verified_and_published(docker_build: dict) -> None:
    build = docker_build["build"]
    assert build.code == 0, build.stderr[-4000:]
    print(build.stderr[-6000:])
    print(build.stdout)
    assert "toolchain: docker (nvcc 13.0" in build.stderr and "network none" in build.stderr
    assert "GPU code check passed: sm_90" in build.stderr
    house = docker_build["base"] / "wheelhouse"
    wheel = house / "wheels" / WHEEL
    assert wheel.is_file()
    with zipfile.ZipFile(wheel) as zf:
        assert "PATCHED = True" in zf.read("tinyext/__init__.py").decode()
        record = json.loads(zf.read("tinyext-0.1.0+cu130torch2.14.dist-info/cuda_wheel_builder.json"))
    toolchain = record["toolchain"]
    assert toolchain["kind"] == "docker" and toolchain["nvcc"].startswith("13.0")
    assert toolchain["image"].startswith("cuda-wheel-builder:cuda13.0-") and toolchain["image_id"].startswith("sha256:")
    published = json.loads((house / "records" / f"{WHEEL}.json").read_text())
    assert published["tests"]["import_status"] == "passed"
    inspect = run_cli("inspect", str(wheel), env=docker_build["env"])
    assert inspect.code == 0 and "SASS: sm_90" in inspect.stdout, inspect.stdout
    # files made in the container come back owned by the invoking user
    for path in [*house.rglob("*"), *(docker_build["base"] / "cache").rglob("*")]:
        if not path.is_symlink():
            assert path.stat().st_uid == os.getuid(), path


def test_auto_picks_the_engine_when_it_has_an_image(docker_build: dict) -> None:
    assert docker_build["build"].code == 0
    auto = run_cli(*docker_build["args"], "--force", env=docker_build["env"])
    assert auto.code == 0, auto.stderr[-3000:]
    assert "toolchain: docker (nvcc 13.0" in auto.stderr
    assert "auto: a container engine answers at" in auto.stderr


def test_docker_without_engine_is_one_line_suggesting_pip(tmp_path: Path) -> None:
    env = {"DOCKER_HOST": f"unix://{tmp_path}/nothing.sock", "BUILDER_CACHE_DIR": str(tmp_path / "cache")}
    result = run_cli("build", "tinyext", "--recipes", str(FIXTURES / "recipes"), "--cuda", "13.0", "--arch", "90",
                     "--python", "3.11", "--toolchain", "docker", env=env)
    from tests.conftest import assert_one_line_error

    assert_one_line_error(result, "--toolchain docker: no container engine answers", "--toolchain pip")
