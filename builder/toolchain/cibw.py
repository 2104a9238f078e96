"""The compile step through cibuildwheel: one CPython, one manylinux CUDA image, auditwheel repair, torch from a cache.

``build_with_cibuildwheel(CibwRequest)`` runs the real ``cibuildwheel --platform linux`` on a patched source tree:

- ``CIBW_BUILD=cp3XX-manylinux_x86_64`` in ``CIBW_MANYLINUX_X86_64_IMAGE`` (a manylinux-layout image with a CUDA
  toolkit, dockerfiles/manylinux-cuda.Dockerfile) with docker or podman (``CIBW_CONTAINER_ENGINE``); for an
  aarch64 wheel ``cp3XX-manylinux_aarch64`` in ``CIBW_MANYLINUX_AARCH64_IMAGE`` (the same template with the
  aarch64 build arguments: toolchain/images.py), on an arm64 machine: cibuildwheel runs a foreign image only
  under emulation, which the request refuses rather than compile for hours under qemu.
- The container has no network (``create_args: --network=none``): cibuildwheel passes create_args to
  ``<engine> create`` as they are, and the setting holds for the container's whole life, so the pinned torch and
  the build requirements are fetched first, on the host, into ``<cache>/downloads`` (``pip download``; files already
  there are not fetched again). The cache folder is bind-mounted at the same path; ``CIBW_BEFORE_BUILD`` installs
  from it with ``uv pip install --offline --no-index --find-links`` and keeps uv's unpacked copies in
  ``<cache>/uv``, so a second build neither downloads nor unzips torch again.
- ``CIBW_BUILD_FRONTEND="build; args: --no-isolation"``: the build sees the pinned torch, never a random one.
- The build env (TORCH_CUDA_ARCH_LIST, MAX_JOBS, the recipe's variables) goes through
  ``CIBW_ENVIRONMENT_PASS_LINUX``, which copies values verbatim; ``CIBW_ENVIRONMENT`` is evaluated by a bash
  parser (``$(...)`` would run), so it only holds our own fixed settings (CUDA_HOME, PATH, uv's).
- ``CIBW_REPAIR_WHEEL_COMMAND`` runs ``auditwheel repair`` with torch's, CUDA's and the driver's libraries
  excluded (never vendored), so the tag states the glibc the wheel really needs.
- The host's root is not mounted (``disable_host_mount: true``); none of the host's variables leak in.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from filelock import FileLock
from packaging.utils import parse_wheel_filename
from packaging.version import Version

from builder.core.cachedir import PREFETCH_LOCK
from builder.core.errors import BuildFailed, ToolchainError, UsageError
from builder.core.log import log
from builder.core.streaming import stream
from builder.model.platform import X86_64, Platform, this_machine

# Sonames auditwheel must leave out: they come from the installed torch, its CUDA wheels, or the NVIDIA driver.
EXCLUDED_LIBS = (
    "libtorch*.so", "libc10*.so", "libtorch_python*.so", "libshm*.so",
    "libcuda.so.*", "libcudart.so.*", "libnvrtc*.so.*", "libnvJitLink*.so.*", "libnvToolsExt*.so.*",
    "libcublas*.so.*", "libcufft*.so.*", "libcurand*.so.*", "libcusolver*.so.*", "libcusparse*.so.*",
    "libcudnn*.so.*", "libnccl*.so.*", "libnvshmem*.so.*", "libcupti*.so.*", "libcufile*.so.*",
)
BUILD_REQUIREMENTS = ("build", "setuptools>=64", "wheel", "ninja", "packaging")
CONTAINER_CUDA_HOME = "/usr/local/cuda"
CONTAINER_PROJECT = "/project"  # where cibuildwheel copies the source tree in its container
PYPI = "https://pypi.org/simple"
# host variables cibuildwheel itself needs (to find and run the engine); nothing else of the host's env is passed
_HOST_VARS = ("PATH", "HOME", "TMPDIR", "XDG_RUNTIME_DIR", "LANG")


@dataclass(frozen=True, kw_only=True)
class TorchCache:
    """The pinned torch and the build requirements for one CPython, fetched into ``cache_dir`` before a build."""

    python: str
    torch: str
    torch_index: str
    cache_dir: Path
    requirements: tuple[str, ...] = BUILD_REQUIREMENTS
    platform: Platform = X86_64  # the wheel's CPU: the torch fetched, the image's, and (checked) this machine's

    @property
    def tag(self) -> str:
        major, minor = self.python.split(".")[:2]
        return f"cp{major}{minor}"

    @property
    def wheels_dir(self) -> Path:
        return self.cache_dir / "downloads"

    @property
    def uv_cache(self) -> Path:
        return self.cache_dir / "uv"


@dataclass(frozen=True, kw_only=True)
class CibwRequest(TorchCache):
    """Everything one cibuildwheel build needs (the TorchCache's fields: python "3.11", the exact torch pin, its
    index URL, the host folder for downloads/ and uv/, mounted read-write); paths are host paths."""

    source_dir: Path  # the patched source tree (cibuildwheel copies it into the container's /project)
    image: str  # a manylinux-layout CUDA image already on the engine (cibuildwheel pulls only a missing one)
    engine: Literal["docker", "podman"]
    out_dir: Path
    log_file: Path
    build_env: Mapping[str, str] = field(default_factory=dict)  # TORCH_CUDA_ARCH_LIST, MAX_JOBS, recipe env
    engine_env: Mapping[str, str] = field(default_factory=dict)  # for the engine CLI: CONTAINERS_CONF, DOCKER_HOST
    plat: str = "auto"  # auditwheel --plat; "auto" = the most compatible tag the symbols allow
    network: bool = False  # True only to debug an image: the build then may reach the network


@dataclass(frozen=True)
class TorchWheel:
    """The fetched torch wheel; what its ``torch/version.py`` says (``torch.__version__``, ``torch.version.cuda``)."""

    path: Path
    version: str
    cuda: str | None


@dataclass(frozen=True)
class CibwResult:
    wheel: Path | None  # the repaired wheel in out_dir; None: cibuildwheel failed (exit_code), its log says why
    exit_code: int
    command_line: str  # the cibuildwheel command line with its CIBW_* settings, as echoed
    prefetch_seconds: float
    build_seconds: float


def check_request(req: CibwRequest) -> None:
    if req.engine not in ("docker", "podman"):
        raise UsageError(f"unknown container engine {req.engine!r}", "use docker or podman")
    if req.platform != this_machine():
        raise UsageError(f"an {req.platform} wheel through cibuildwheel needs an {req.platform} machine, and this one "
                         f"is {this_machine()}: the {req.platform} image would run every compile under emulation",
                         f"build it on a {req.platform} machine (the nightly's {req.platform.runner} runners), or "
                         "cross-compile it here with --toolchain pip or host")
    if not req.python.count(".") or not all(p.isdigit() for p in req.python.split(".")[:2]):
        raise UsageError(f"--python {req.python!r} is not a CPython version like 3.11", "pass e.g. --python 3.12")
    if not (req.source_dir / "setup.py").exists() and not (req.source_dir / "pyproject.toml").exists():
        raise BuildFailed(f"{req.source_dir} has no setup.py or pyproject.toml", "point the build at the source tree")
    for key in req.build_env:
        if key.startswith("CIBW_") or not key.replace("_", "a").isalnum():
            raise UsageError(f"build env variable {key!r} cannot be passed to cibuildwheel",
                             "rename it in the recipe's [build.env]")


def _torch_index_args(req: CibwRequest | TorchCache) -> list[str]:
    extra = [] if req.torch_index.rstrip("/") == PYPI else ["--extra-index-url", req.torch_index]
    return ["--index-url", PYPI, *extra]


def prefetch_argv(req: CibwRequest | TorchCache) -> list[str]:
    """``pip download`` of torch and the build requirements for the image's CPython into ``<cache>/downloads``."""
    major, minor = req.python.split(".")[:2]
    return [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
            "--dest", str(req.wheels_dir), "--only-binary=:all:", "--implementation", "cp",
            "--python-version", f"{major}.{minor}", "--abi", f"cp{major}{minor}", "--abi", "abi3", "--abi", "none",
            *_platform_args(28, req.platform), *_torch_index_args(req), f"torch=={req.torch}", *req.requirements]


def _platform_args(floor: int = 28, platform: Platform = X86_64) -> list[str]:
    """pip download takes only the platforms named: manylinux_2_28 and every older manylinux (and its aliases;
    aarch64 wheels start at manylinux2014, glibc 2.17)."""
    arch = platform.name
    tags = [f"manylinux_2_{m}_{arch}" for m in range(floor, 4 if arch == "x86_64" else 16, -1)] + [
        f"manylinux2014_{arch}", *((f"manylinux2010_{arch}", f"manylinux1_{arch}") if arch == "x86_64" else ())]
    return [a for t in tags for a in ("--platform", t)]


def before_build(req: CibwRequest) -> str:
    """The in-container install: offline, from the prefetched wheels, through uv's cache on the mount."""
    reqs = " ".join(shlex.quote(r) for r in (f"torch=={req.torch}", *req.requirements))
    return (f"uv pip install --python \"$(command -v python)\" --offline --no-index "
            f"--find-links {shlex.quote(str(req.wheels_dir))} {reqs}")


def repair_command(req: CibwRequest) -> str:
    excludes = " ".join(f"--exclude {shlex.quote(p)}" for p in EXCLUDED_LIBS)
    return f"auditwheel repair --plat {shlex.quote(req.plat)} {excludes} -w {{dest_dir}} {{wheel}}"


def engine_setting(req: CibwRequest) -> str:
    args = [f"--volume={req.cache_dir}:{req.cache_dir}:rw"]
    if not req.network:
        args.insert(0, "--network=none")
    return f"{req.engine}; create_args: {' '.join(shlex.quote(a) for a in args)}; disable_host_mount: true"


def cibw_settings(req: CibwRequest) -> dict[str, str]:
    """The CIBW_* variables of one build (pure: unit tests read them)."""
    environment = {
        "CUDA_HOME": CONTAINER_CUDA_HOME,
        "PATH": f"{CONTAINER_CUDA_HOME}/bin:$PATH",
        "UV_CACHE_DIR": str(req.uv_cache),
        # the cache is a bind mount (uv cannot hard-link across it) and the container is thrown away after one
        # build, so torch's 5 GiB are linked into the interpreter, not copied; the cache must outlive the build only
        "UV_LINK_MODE": "symlink",
        "UV_NO_PROGRESS": "1",
    }
    arch = req.platform.name
    return {
        "CIBW_PLATFORM": "linux",
        "CIBW_BUILD": f"{req.tag}-manylinux_{arch}",
        "CIBW_ARCHS_LINUX": arch,
        f"CIBW_MANYLINUX_{arch.upper()}_IMAGE": req.image,
        "CIBW_CONTAINER_ENGINE": engine_setting(req),
        "CIBW_BUILD_FRONTEND": "build; args: --no-isolation",
        "CIBW_BUILD_VERBOSITY": "1",
        "CIBW_BEFORE_BUILD": before_build(req),
        "CIBW_ENVIRONMENT_LINUX": " ".join(f"{k}={shlex.quote(v) if k != 'PATH' else v}"
                                           for k, v in environment.items()),
        "CIBW_ENVIRONMENT_PASS_LINUX": " ".join(sorted(req.build_env)),
        "CIBW_REPAIR_WHEEL_COMMAND_LINUX": repair_command(req),
        "CIBW_TEST_SKIP": "*",  # the import and kernel tests run on the host, against the installed torch
    }


def cibuildwheel_argv(req: CibwRequest) -> list[str]:
    exe = shutil.which("cibuildwheel") or str(Path(sys.executable).with_name("cibuildwheel"))
    return [exe, "--platform", "linux", "--output-dir", str(req.out_dir), "."]


def process_env(req: CibwRequest) -> dict[str, str]:
    """cibuildwheel's own environment: what it needs to run the engine, the settings, the passed build env."""
    host = {k: os.environ[k] for k in _HOST_VARS if k in os.environ}
    return {**host, "PYTHONUNBUFFERED": "1", **req.engine_env, **req.build_env, **cibw_settings(req)}


def command_line(req: CibwRequest) -> str:
    settings = cibw_settings(req)
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in settings.items()), shlex.join(cibuildwheel_argv(req))])


def prefetch(req: CibwRequest | TorchCache) -> float:
    """Fetch torch and the build requirements on the host (network on); cheap when they are already there."""
    req.wheels_dir.mkdir(parents=True, exist_ok=True)
    req.uv_cache.mkdir(parents=True, exist_ok=True)
    argv = prefetch_argv(req)
    # one marker per set of pins: the same request later reuses what was fetched (no index is asked again)
    key = hashlib.sha256(json.dumps(argv[1:]).encode()).hexdigest()[:16]
    marker = req.wheels_dir / f".fetched-{key}"
    if marker.exists():
        log.info(f"torch=={req.torch} and the build requirements: already in {req.wheels_dir}")
        return 0.0
    log.command(argv)
    start = time.monotonic()
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode == 0:
        marker.write_text(shlex.join(argv) + "\n")
    else:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1][:300]
        raise ToolchainError(f"fetching torch=={req.torch} for CPython {req.python} failed: {tail}",
                             f"is torch {req.torch} for cp{req.tag[2:]} manylinux {req.platform} on "
                             f"{req.torch_index}?")
    return time.monotonic() - start


def fetched_torch(req: CibwRequest | TorchCache) -> TorchWheel:
    """The torch wheel ``prefetch`` put into the cache for ``req``'s pin and CPython, read without installing it."""
    pin = Version(req.torch)
    found = []
    for path in sorted(req.wheels_dir.glob("torch-*.whl")):
        name, version, _, tags = parse_wheel_filename(path.name)
        if name == "torch" and (version == pin or version.public == str(pin)) and any(
                t.interpreter == req.tag for t in tags):
            found.append(path)
    if len(found) != 1:
        raise ToolchainError(f"{len(found)} torch=={req.torch} wheels for {req.tag} in {req.wheels_dir}, not one",
                             f"remove {req.wheels_dir} and build again")
    with zipfile.ZipFile(found[0]) as zf:
        text = zf.read("torch/version.py").decode()
    said = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)", text, re.M)
    cuda = re.search(r"^cuda(?:\s*:[^=]*)?=\s*['\"]([^'\"]+)", text, re.M)
    return TorchWheel(found[0], said.group(1) if said else str(pin), cuda.group(1) if cuda else None)


def fetch_locked(req: CibwRequest | TorchCache) -> float:
    """``prefetch`` under the cache's lock: builds sharing the cache fetch one at a time."""
    req.cache_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(req.cache_dir / PREFETCH_LOCK)):
        return prefetch(req)


def build_with_cibuildwheel(req: CibwRequest, on_line: Callable[[str], None]) -> CibwResult:
    """Prefetch, then cibuildwheel in the image; its output is followed into ``req.log_file`` (appended) and
    ``on_line`` by the loop every build shares (core/streaming.py). The result names the repaired wheel, or none
    when cibuildwheel failed: the caller raises, and the compile stage summarises the log as for every toolchain."""
    check_request(req)
    if shutil.which(req.engine, path=req.engine_env.get("PATH") or os.environ.get("PATH")) is None:
        raise ToolchainError(f"cibuildwheel needs the {req.engine} command, which is not on PATH",
                             f"install {req.engine}, or build with --toolchain pip/host")
    fetched = fetch_locked(req)
    req.out_dir.mkdir(parents=True, exist_ok=True)
    req.log_file.parent.mkdir(parents=True, exist_ok=True)
    before = set(req.out_dir.glob("*.whl"))
    line = command_line(req)
    log.info("+ " + line)
    start = time.monotonic()
    with req.log_file.open("a") as out:
        out.write(f"+ {line}\n")
        out.flush()
        code, _ = stream(cibuildwheel_argv(req), out=out, on_line=on_line, cwd=req.source_dir, env=process_env(req))
    seconds = time.monotonic() - start
    wheels = sorted(set(req.out_dir.glob("*.whl")) - before)
    if code != 0 or not wheels:
        return CibwResult(None, -1 if code is None else code, line, fetched, seconds)
    log.ok(f"cibuildwheel built {wheels[-1].name} in {seconds:.0f}s")
    return CibwResult(wheels[-1], code, line, fetched, seconds)
