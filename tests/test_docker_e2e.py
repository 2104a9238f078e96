"""End to end through the docker toolchain on podman: real cibuildwheel and real auditwheel build, repair and tag
a real CUDA extension in a manylinux-layout image; the host checks, import-tests and publishes it.

The test starts its own ``podman system service`` on a private socket (with the settings that work on this
machine: runc, no default ulimits, cgroupfs) and stops it afterwards; the builder's SDK calls (image build, the
nvcc probe) go through it, cibuildwheel drives the podman CLI on the same storage. No registry is reachable here,
so quay.io/pypa/manylinux_2_28_x86_64 is replaced by a local stand-in in manylinux layout: a debootstrap'ed
Debian bookworm with this machine's CUDA 13.0 toolkit at /usr/local/cuda-13.0 (made once per machine, cached as
/var/tmp/cuda-wheel-builder-base.tar), plus tests/fixtures/cibw/standin.Dockerfile (/opt/python/cp311-cp311,
auditwheel, patchelf, uv). Its glibc is 2.36, not 2.28, so auditwheel's tag is the one that glibc allows
(manylinux_2_34 for tinyext), not manylinux_2_28. The real dockerfiles/manylinux-cuda.Dockerfile is built for
CUDA 13.0 FROM it with ``builder images build --base-image`` (the stand-in holds CUDA 13.0, so the install from NVIDIA's
repository is skipped). Then ``builder build tinyext --toolchain docker``, and again with ``--toolchain auto
--force`` on the same torch cache: auto picks the engine, and nothing is fetched or unpacked again. Images are
cached on the engine between runs (tags hash the template and its build arguments). Where podman, runc, debootstrap, the CUDA
toolkit, the local torch index or the disk is missing, or the engine does not start, it is skipped with the
reason. Measured times are in docs/DOCKER.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.toolchain.images import image_spec
from tests.helpers import FIXTURES, LOCAL_TORCH_INDEX, run_cli

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

CONTAINERS_CONF = '[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n'
BASE_TAR = Path(os.environ.get("BUILDER_TEST_BASE_TAR", "/var/tmp/cuda-wheel-builder-base.tar"))
BASE_IMAGE = "localhost/cuda-wheel-builder-base:cuda13.0-standin"
HOST_CUDA = Path("/usr/local/cuda-13.0")
STANDIN = FIXTURES / "cibw" / "standin.Dockerfile"
WHEEL_RE = re.compile(r"tinyext-0\.1\.0\+cu13torch2\.14-cp311-cp311-manylinux_2_(\d+)_x86_64\.whl")
NOTE = "value with spaces, 'quotes' and $(not a command)"  # the recipe's env value: it must arrive literally


def _podman_env(conf: Path) -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def _podman(conf: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "--runtime", "runc", *args], env=_podman_env(conf), capture_output=True,
                          text=True, timeout=timeout)


# what the module writes: the prefetched wheels (2.9 GiB), uv's unpacked cache (5.2 GiB), torch in the build
# container (linked from that cache), the stand-in images (0.5 GiB tar + about 2.5 GiB of podman storage)
DISK_NEEDED_GIB = 14.0


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
    """The debootstrap base with CUDA 13.0 on the engine (made once per machine, then imported)."""
    conf = Path(podman_service["_conf"])
    if _podman(conf, "image", "exists", BASE_IMAGE).returncode == 0:
        return BASE_IMAGE
    if not BASE_TAR.exists():
        make_base_tar()
    result = _podman(conf, "import", str(BASE_TAR), BASE_IMAGE)
    assert result.returncode == 0, result.stderr[-2000:]
    return BASE_IMAGE


@pytest.fixture(scope="module")
def standin_image(podman_service: dict[str, str], standin_base: str) -> str:
    """The manylinux-layout stand-in for quay.io/pypa/manylinux_2_28_x86_64, built once per Dockerfile and base."""
    conf = Path(podman_service["_conf"])
    key = hashlib.sha256(STANDIN.read_bytes() + standin_base.encode()).hexdigest()[:12]
    tag = f"localhost/cuda-wheel-builder-cibw-standin:{key}"
    if _podman(conf, "image", "exists", tag).returncode != 0:
        built = _podman(conf, "build", "--network", "host", "--build-arg", f"BASE_IMAGE={standin_base}",
                        "-f", str(STANDIN), "-t", tag, str(STANDIN.parent), timeout=900)
        assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return tag


def _build_log(base: Path) -> str:
    (log,) = (base / "cache" / "logs").glob("tinyext-0.1.0-*.log")
    return log.read_text()


@pytest.fixture(scope="module")
def docker_build(podman_service: dict[str, str], standin_image: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    if not LOCAL_TORCH_INDEX.is_dir():
        pytest.skip(f"no local torch index at {LOCAL_TORCH_INDEX}")
    base = tmp_path_factory.mktemp("docker-e2e")
    recipes = FIXTURES / "recipes"
    env = {"DOCKER_HOST": podman_service["DOCKER_HOST"], "CONTAINERS_CONF": podman_service["_conf"],
           "BUILDER_CACHE_DIR": str(base / "cache"), "BUILDER_WHEELHOUSE": str(base / "wheelhouse")}
    times: dict[str, float] = {}
    start = time.monotonic()
    images = run_cli("images", "build", "--cuda", "13.0", "--base-image", standin_image, env=env)
    times["images build"] = time.monotonic() - start
    args = ["build", "tinyext", "--recipes", str(recipes), "--cuda", "13.0", "--arch", "90",
            "--python", "3.11", "--torch", "2.14.1", "--torch-index", str(LOCAL_TORCH_INDEX)]
    start = time.monotonic()
    first = run_cli(*args, "--toolchain", "docker", env=env)
    times["first build (--toolchain docker)"] = time.monotonic() - start
    first_log = _build_log(base) if first.code == 0 else ""
    start = time.monotonic()
    second = run_cli(*args, "--toolchain", "auto", "--force", env=env)
    times["second build (--toolchain auto --force)"] = time.monotonic() - start
    print("\n[docker e2e] " + "; ".join(f"{k}: {v:.0f}s" for k, v in times.items()))
    return {"base": base, "env": env, "images": images, "first": first, "first_log": first_log, "second": second,
            "second_log": _build_log(base) if second.code == 0 else "", "standin": standin_image, "times": times}


def _wheel(docker_build: dict) -> Path:
    wheels = [w for w in (docker_build["base"] / "wheelhouse" / "wheels").glob("*.whl") if WHEEL_RE.fullmatch(w.name)]
    assert len(wheels) == 1, list((docker_build["base"] / "wheelhouse" / "wheels").glob("*"))
    return wheels[0]


def test_images_build_the_manylinux_dockerfile_tagged_by_its_hash(docker_build: dict) -> None:
    images = docker_build["images"]
    assert images.code == 0, images.stderr[-3000:]
    # the tag hashes dockerfiles/manylinux-cuda.Dockerfile, CUDA 13.0's arguments and the stand-in base (cached)
    spec = image_spec("13.0", docker_build["standin"])
    assert spec.dockerfile.name == "manylinux-cuda.Dockerfile" and spec.tag in images.stdout, images.stdout
    again = run_cli("images", "build", "--cuda", "13.0", "--base-image", docker_build["standin"],
                    env=docker_build["env"])
    assert again.code == 0 and "up to date: cuda-wheel-builder:cuda13.0-" in again.stdout, again.stderr[-2000:]
    listing = run_cli("images", "list", env=docker_build["env"])
    assert docker_build["standin"] in listing.stdout and "CUDA 13.0" in listing.stdout


def test_cibuildwheel_builds_a_repaired_manylinux_wheel_that_is_published(docker_build: dict) -> None:
    first = docker_build["first"]
    assert first.code == 0, first.stderr[-5000:]
    print(first.stderr[-8000:])
    print(first.stdout)
    err = first.stderr
    line = next(t for t in err.splitlines() if "+ CIBW_PLATFORM=linux" in t)
    print("[docker e2e] cibuildwheel command line:", line)
    for part in ("CIBW_BUILD=cp311-manylinux_x86_64", "--network=none", "disable_host_mount: true",
                 "CIBW_BUILD_FRONTEND='build; args: --no-isolation'", "--offline --no-index", "torch==2.14.1",
                 "auditwheel repair --plat auto", "cibuildwheel --platform linux"):
        assert part in line, part
    assert "CIBW_CONTAINER_ENGINE='podman;" in line
    passed = line.split("CIBW_ENVIRONMENT_PASS_LINUX=", 1)[1].split("'")[1].split()
    assert {"MAX_JOBS", "TINYEXT_NOTE", "TORCH_CUDA_ARCH_LIST", "SOURCE_DATE_EPOCH"} <= set(passed)
    assert "PATH" not in passed and "HOME" not in passed
    assert "toolchain: docker (nvcc 13.0" in err and "GPU code check passed: sm_90" in err
    # no build venv was made, in a container or here: the image's CPython gets torch from the fetched cache
    venvs = docker_build["base"] / "cache" / "venvs"
    assert not venvs.exists() or not [v for v in venvs.iterdir() if v.is_dir()], "a build venv was made"
    assert "Excluding libtorch_cpu.so" in docker_build["first_log"] and "Prepared" in docker_build["first_log"]
    wheel = _wheel(docker_build)
    print("[docker e2e] wheel:", wheel.name)
    with zipfile.ZipFile(wheel) as zf:
        assert "PATCHED = True" in zf.read("tinyext/__init__.py").decode()
        assert zf.read("tinyext/_build_note.txt").decode() == NOTE
        assert not [n for n in zf.namelist() if ".libs/" in n]
        record = json.loads(zf.read("tinyext-0.1.0+cu13torch2.14.dist-info/cuda_wheel_builder.json"))
    toolchain = record["toolchain"]
    assert toolchain["kind"] == "docker" and toolchain["nvcc"].startswith("13.0")
    assert toolchain["image"].startswith("cuda-wheel-builder:cuda13.0-") and toolchain["image_id"].startswith("sha256:")
    assert record["python"] == {"python": "/opt/python/cp311-cp311/bin/python", "version": "3.11",
                                "torch": "2.14.1+cu130", "torch_cuda": "13.0"}
    published = json.loads((docker_build["base"] / "wheelhouse" / "records" / f"{wheel.name}.json").read_text())
    assert published["tests"]["import_status"] == "passed"
    show = subprocess.run([str(Path(sys.executable).with_name("auditwheel")), "show", str(wheel)],
                          capture_output=True, text=True)
    print(show.stdout)
    assert show.returncode == 0 and "This constrains the platform tag to" in show.stdout


def test_inspect_shows_sass_the_platform_tag_the_glibc_floor_and_nothing_vendored(docker_build: dict) -> None:
    assert docker_build["first"].code == 0
    wheel = _wheel(docker_build)
    inspect = run_cli("inspect", str(wheel), env=docker_build["env"])
    print(inspect.stdout)
    assert inspect.code == 0 and "SASS: sm_90" in inspect.stdout, inspect.stdout
    tag = WHEEL_RE.fullmatch(wheel.name).group(1)  # type: ignore[union-attr]
    assert f"platform: manylinux_2_{tag}_x86_64" in inspect.stdout and "vendored: nothing" in inspect.stdout
    floor = re.search(r"glibc floor: glibc 2\.(\d+)", inspect.stdout)
    assert floor and int(floor.group(1)) <= int(tag)
    for path in [*(docker_build["base"] / "wheelhouse").rglob("*"), *(docker_build["base"] / "cache").rglob("*")]:
        if not path.is_symlink():  # files made in containers come back owned by the invoking user
            assert path.stat().st_uid == os.getuid(), path


def test_auto_picks_the_engine_and_the_second_build_reuses_the_torch_cache(docker_build: dict) -> None:
    second = docker_build["second"]
    assert docker_build["first"].code == 0 and second.code == 0, second.stderr[-3000:]
    assert "toolchain: docker (nvcc 13.0" in second.stderr
    assert "auto: a container engine answers at" in second.stderr
    assert "torch==2.14.1 and the build requirements: already in" in second.stderr  # nothing fetched
    # uv prints "Prepared N packages" only for what it had to unpack into its cache
    assert "Installed" in docker_build["second_log"] and "Prepared" not in docker_build["second_log"]
    assert _wheel(docker_build).name  # the same single wheel name, replaced
    for run in ("first", "second"):
        timings = [t for t in docker_build[run].stdout.splitlines() if t.startswith("time per step:")]
        steps = [t.strip() for t in docker_build[f"{run}_log"].splitlines()
                 if t.lstrip().startswith(("Prepared ", "Installed ", "Repairing wheel", "cibuildwheel: "))]
        seconds = next(v for k, v in docker_build["times"].items() if k.startswith(run))
        print(f"[docker e2e] {run} build {seconds:.0f}s: " + " | ".join([*timings, *steps])[:1500])
def test_docker_without_engine_is_one_line_suggesting_pip(tmp_path: Path) -> None:
    env = {"DOCKER_HOST": f"unix://{tmp_path}/nothing.sock", "BUILDER_CACHE_DIR": str(tmp_path / "cache")}
    result = run_cli("build", "tinyext", "--recipes", str(FIXTURES / "recipes"), "--cuda", "13.0", "--arch", "90",
                     "--python", "3.11", "--toolchain", "docker", env=env)
    from tests.helpers import assert_one_line_error

    assert_one_line_error(result, "--toolchain docker: no container engine answers", "--toolchain pip")
