"""End to end through real cibuildwheel and real auditwheel on podman: tinyext built, repaired, tagged, imported.

No registry is reachable here, so the manylinux CUDA image is a local stand-in in manylinux layout
(tests/fixtures/cibw/standin.Dockerfile): the debootstrap'ed Debian bookworm base of tests/test_docker_e2e.py
(glibc 2.36, gcc 12, this machine's CUDA 13.0 at /usr/local/cuda) plus /opt/python/cp311-cp311, auditwheel,
patchelf and uv. Its glibc is 2.36, not manylinux_2_28's 2.28, so the tag auditwheel gives is the one that glibc
and gcc allow, not manylinux_2_28. The image is cached on the engine under a tag hashing its Dockerfile and base.
cibuildwheel drives the podman CLI itself (no API service needed). Two builds run with the same torch cache; the
second must not fetch or unpack torch again. Skipped with the reason where podman, runc, the base or disk is missing.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from builder.core.errors import PortabilityError
from builder.stages.repair import check_portability, portability_report
from builder.toolchain.cibw import CibwRequest, build_with_cibuildwheel
from tests.conftest import FIXTURES, LOCAL_TORCH_INDEX

pytestmark = [pytest.mark.e2e, pytest.mark.docker]

CONTAINERS_CONF = '[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n'
BASE_IMAGE = "localhost/cuda-wheel-builder-base:cuda13.0-standin"  # made by tests/test_docker_e2e.py's make_base_tar
STANDIN = FIXTURES / "cibw" / "standin.Dockerfile"
NOTE = "a b $(echo x) 'q'"  # the recipe env must arrive literally
# the prefetched wheels (2.9 GiB), uv's unpacked cache (5.2 GiB), torch in the container (5.2 GiB), the image
DISK_NEEDED_GIB = 16.0


def _podman(conf: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], env={**os.environ, "CONTAINERS_CONF": str(conf)}, capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def engine_conf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    free = shutil.disk_usage(tmp_path_factory.getbasetemp()).free / 1024**3
    if free < DISK_NEEDED_GIB:
        pytest.skip(f"not enough disk for the cibuildwheel build: {free:.1f} GiB free, about {DISK_NEEDED_GIB:.0f} "
                    "GiB needed (torch's wheels, uv's cache and the container's torch)")
    for tool in ("podman", "runc"):
        if shutil.which(tool) is None:
            pytest.skip(f"no container engine can start here: {tool} is not installed")
    if not LOCAL_TORCH_INDEX.is_dir():
        pytest.skip(f"no local torch index at {LOCAL_TORCH_INDEX}")
    conf = tmp_path_factory.mktemp("cibw-engine") / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    return conf


@pytest.fixture(scope="module")
def standin_image(engine_conf: Path) -> str:
    """The manylinux-layout stand-in, built once per Dockerfile/base (cached on the engine)."""
    if _podman(engine_conf, "image", "exists", BASE_IMAGE).returncode != 0:
        from tests.test_docker_e2e import BASE_TAR, make_base_tar

        if not BASE_TAR.exists():
            make_base_tar()
        imported = _podman(engine_conf, "import", str(BASE_TAR), BASE_IMAGE)
        assert imported.returncode == 0, imported.stderr[-2000:]
    key = hashlib.sha256(STANDIN.read_bytes() + BASE_IMAGE.encode()).hexdigest()[:12]
    tag = f"localhost/cuda-wheel-builder-cibw-standin:{key}"
    if _podman(engine_conf, "image", "exists", tag).returncode != 0:
        start = time.monotonic()
        built = _podman(engine_conf, "build", "--network", "host", "--build-arg", f"BASE_IMAGE={BASE_IMAGE}",
                        "-f", str(STANDIN), "-t", tag, str(STANDIN.parent))
        assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
        print(f"\n[cibw e2e] stand-in image built in {time.monotonic() - start:.0f}s")
    return tag


def _request(base: Path, image: str, conf: Path, run: str) -> CibwRequest:
    source = base / f"src-{run}"
    shutil.copytree(FIXTURES / "tinyext", source)
    return CibwRequest(source_dir=source, python="3.11", image=image, engine="podman", torch="2.14.1",
                       torch_index=LOCAL_TORCH_INDEX.as_uri(), cache_dir=base / "torch-cache",
                       out_dir=base / f"out-{run}", log_file=base / f"cibw-{run}.log",
                       build_env={"TORCH_CUDA_ARCH_LIST": "9.0", "MAX_JOBS": "2", "TINYEXT_NOTE": NOTE},
                       engine_env={"CONTAINERS_CONF": str(conf)})


@pytest.fixture(scope="module")
def two_builds(engine_conf: Path, standin_image: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("cibw-e2e")
    results = {}
    for run in ("first", "second"):
        req = _request(base, standin_image, engine_conf, run)
        start = time.monotonic()
        results[run] = (req, build_with_cibuildwheel(req), time.monotonic() - start)
        print(f"\n[cibw e2e] {run} build: {results[run][2]:.0f}s (prefetch {results[run][1].prefetch_seconds:.0f}s, "
              f"cibuildwheel {results[run][1].build_seconds:.0f}s): {results[run][1].wheel.name}")
        steps = [line.strip() for line in req.log_file.read_text().splitlines()
                 if line.lstrip().startswith(("Prepared ", "Installed ", "✓ ", "+ sh -c", "+ python -m build"))]
        print("\n".join(f"[cibw e2e]   {line[:160]}" for line in steps))
    print(f"[cibw e2e] command line: {results['first'][1].command_line}")
    return {"base": base, **results}


def test_wheel_is_repaired_and_tagged_manylinux(two_builds: dict) -> None:
    req, result, _ = two_builds["first"]
    wheel = result.wheel
    assert wheel.name.startswith("tinyext-0.1.0-cp311-cp311-manylinux_2_"), wheel.name
    assert wheel.name.endswith("_x86_64.whl")
    log = req.log_file.read_text()
    assert "Excluding libtorch_cpu.so" in log and "Excluding libcudart.so.13" in log
    assert "--network=none" in result.command_line and "--no-isolation" in result.command_line
    report = portability_report(wheel)
    print(report.render())
    check_portability(report)  # nothing vendored, tag covers the glibc floor
    assert report.vendored == () and report.tagged_glibc is not None
    assert report.glibc_floor is not None and report.glibc_floor <= report.tagged_glibc
    show = subprocess.run([str(Path(sys.executable).with_name("auditwheel")), "show", str(wheel)],
                          capture_output=True, text=True)
    print(show.stdout)
    assert show.returncode == 0 and "libcudart.so.13" in show.stdout
    with zipfile.ZipFile(wheel) as zf:
        assert zf.read("tinyext/_build_note.txt").decode() == NOTE
        assert not [n for n in zf.namelist() if ".libs/" in n]


def test_repaired_wheel_imports_with_the_pinned_torch(two_builds: dict) -> None:
    wheel = two_builds["first"][1].wheel
    venv = two_builds["base"] / "import-venv"
    uv = str(Path(sys.executable).with_name("uv"))
    subprocess.run([uv, "venv", "--quiet", "--python", "3.11", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    subprocess.run([uv, "pip", "install", "--quiet", "--python", py, "--extra-index-url", LOCAL_TORCH_INDEX.as_uri(),
                    str(wheel), "torch==2.14.1"], check=True, timeout=900)
    out = subprocess.run([py, "-c", "import torch, tinyext, tinyext._C; print('imported', tinyext._C.__file__)"],
                         capture_output=True, text=True, cwd=two_builds["base"])
    assert out.returncode == 0, out.stderr[-2000:]
    print(out.stdout)


def test_second_build_reuses_the_torch_cache(two_builds: dict) -> None:
    first_req, first, first_s = two_builds["first"]
    second_req, second, second_s = two_builds["second"]
    assert second.wheel.name == first.wheel.name
    # uv prints "Prepared N packages" only for what it had to unpack into its cache
    assert "Prepared" in first_req.log_file.read_text()
    assert "Prepared" not in second_req.log_file.read_text()
    assert second.prefetch_seconds < first.prefetch_seconds
    print(f"[cibw e2e] first {first_s:.0f}s, second {second_s:.0f}s")


def test_wheel_vendoring_libtorch_is_refused(tmp_path: Path) -> None:
    """A stand-in for a repair without --exclude: a real ELF object grafted in as tinyext.libs/libtorch_cpu-….so."""
    elf = Path(sys.executable).resolve()
    wheel = tmp_path / "tinyext-0.1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("tinyext/__init__.py", "")
        zf.write(elf, "tinyext.libs/libtorch_cpu-1a2b3c4d.so")
        zf.writestr("tinyext-0.1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nTag: cp311-cp311-manylinux_2_28_x86_64\n")
    report = portability_report(wheel)
    assert report.forbidden == ("tinyext.libs/libtorch_cpu-1a2b3c4d.so",)
    with pytest.raises(PortabilityError) as err:
        check_portability(report)
    assert err.value.exit_code == 13 and "vendors libtorch_cpu-1a2b3c4d.so" in str(err.value)
