"""The docker toolchain: the compiler and the build's Python come from a CUDA devel image (dockerfiles/).

``ContainerToolchain`` is a ``BuildHost`` (toolchain/base.py) whose commands run in throwaway containers of the
build image: the pyenv stage makes the build venv with the pinned torch through it (cached on the host, in the
tool cache), and the compile stage builds the wheel through it (``build_wheel``: the same ProjectBuilder frontend as
on this machine, each PEP 517 hook run in a container with the network off). Plan, source, patch, finalize,
inspect, test and publish run on the host exactly as for the pip and host toolchains. Host folders are
bind-mounted at the same paths inside the container, so every path in logs and records means the same thing on
both sides. Containers run as the invoking uid:gid (files come back owned by the caller; under rootless podman
container root *is* the caller), and GPUs are passed (``device_requests``) only where the host has one. Docker
and podman's Docker-API service are driven through the same SDK; no shell command is ever assembled from strings.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from packaging.version import Version

from builder.core.errors import ToolchainError
from builder.core.log import log
from builder.toolchain.base import NO_MOUNTS, RELEASE_RE, CudaToolkit, Mounts, RunResult, WheelRequest, same_minor
from builder.toolchain.frontend import pep517_wheel
from builder.toolchain.images import ImageSpec, find_image, image_ref

CONTAINER_CUDA_HOME = Path("/usr/local/cuda")
CONTAINER_PATH = "/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def connect(env: Mapping[str, str], timeout: int = 3) -> Any | None:
    """A docker SDK client for the engine DOCKER_HOST (or the default socket) names, if it answers a ping."""
    try:
        import docker

        client = docker.from_env(environment=dict(env), timeout=timeout)
        client.ping()
        client.api.timeout = None  # the short timeout is for the ping only: logs stream for the whole build
        return client
    except Exception:  # noqa: BLE001 - any failure means "no engine answers"
        return None


def gpu_present() -> bool:
    return any(Path("/dev").glob("nvidia[0-9]*")) or bool(shutil.which("nvidia-smi") and Path("/proc/driver/nvidia").exists())


def gpu_requests(want_gpu: bool) -> list[Any]:
    """``--gpus all`` as SDK device requests, only when asked for and a GPU is present here."""
    if not (want_gpu and gpu_present()):
        return []
    import docker

    return [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]


def _one_line(e: Exception) -> str:
    text = str(getattr(e, "explanation", None) or e).strip().splitlines()
    return (text[-1] if text else type(e).__name__)[:300]


class ContainerToolchain:
    """An engine connection plus one build image; a ``BuildHost`` whose commands run in throwaway containers with
    bind mounts. Used as a context manager: containers it started are removed and the client closed on exit."""

    uv = "uv"  # the image's (dockerfiles/ install it on PATH)
    venv_prefix = "docker"

    def __init__(self, client: Any, image: Any, spec: ImageSpec, cuda: Version, reason: str = "", *,
                 cache: Path, venvs: Path) -> None:
        self.client = client
        self.image = image
        self.spec = spec
        self.cuda = cuda
        self.reason = reason
        self.cache = cache  # the containers' HOME and uv cache (writable in every run)
        self.venvs = venvs  # the build venvs' folder: where it is mounted writable, uv's cache goes with it
        self._live: list[Any] = []
        self.toolkit: CudaToolkit = self._probe_toolkit()
        self.where = f" in {self.toolkit.image}"
        self.venv_key: tuple[str, ...] = (self.image.id,)

    # -- lifecycle ---------------------------------------------------------------------------------------------
    @classmethod
    def open(cls, client: Any, spec: ImageSpec, cuda: Version, reason: str, *, cache: Path,
             venvs: Path) -> ContainerToolchain:
        image = find_image(client, spec)
        if image is None:
            raise ToolchainError(f"--toolchain docker: no image for CUDA {spec.cuda} ({spec.tag} is not built)",
                                 f"run `builder images build --cuda {spec.cuda}` first")
        return cls(client, image, spec, cuda, reason, cache=cache, venvs=venvs)

    def __enter__(self) -> ContainerToolchain:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for container in self._live:
            try:
                container.remove(force=True)
            except Exception:  # noqa: BLE001 - best effort cleanup
                pass
        self._live.clear()
        try:
            self.client.close()
        except Exception:  # noqa: BLE001
            pass

    # -- running ----------------------------------------------------------------------------------------------
    def user(self) -> str:
        """Who the container runs as: the caller, or container root under rootless podman (which maps to the caller)."""
        try:
            rootless = bool(self.client.info().get("host", {}).get("security", {}).get("rootless"))
        except Exception:  # noqa: BLE001
            rootless = False
        return "0:0" if rootless else f"{os.getuid()}:{os.getgid()}"

    def run(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: Path | None = None,
            mounts: Mounts = NO_MOUNTS, network: bool = True, out: TextIO | None = None,
            on_line: Callable[[str], None] | None = None, timeout_s: float | None = None,
            gpu: bool = False) -> RunResult:
        """Run ``argv`` in a fresh container; ``mounts`` (host path -> read-only) are mounted at the same paths,
        the toolchain's cache folder always (writable). ``timeout_s`` is not enforced in containers."""
        import docker
        import requests

        binds = {str(p): {"bind": str(p), "mode": "ro" if ro else "rw"} for p, ro in self._mounts(mounts).items()}
        container = None
        try:
            container = self.client.containers.create(
                self.image.id, command=list(argv), environment=dict(env or {}), volumes=binds,
                network_mode="host" if network else "none", user=self.user(),
                working_dir=str(cwd) if cwd else None, device_requests=gpu_requests(gpu) or None,
                labels={"org.cuda-wheel-builder.run": "1"},
            )
            self._live.append(container)
            container.start()
            output = self._follow(container, out, on_line)
            code = int(container.wait().get("StatusCode", 1))
            return RunResult(code, "" if out is not None else "\n".join(output))
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise ToolchainError(f"container run of {argv[0]} failed: {_one_line(e)}") from e
        finally:
            if container is not None:
                try:
                    container.remove(force=True)
                    self._live.remove(container)
                except Exception:  # noqa: BLE001
                    pass

    @staticmethod
    def _follow(container: Any, out: TextIO | None, on_line: Callable[[str], None] | None) -> list[str]:
        """The container's output lines as they come: into ``out`` and to ``on_line`` (non-empty, stripped)."""
        output: list[str] = []
        pending = ""

        def emit(line: str) -> None:
            output.append(line)
            if out is not None:
                out.write(line + "\n")
                out.flush()
            if on_line is not None and line.strip():
                on_line(line.strip())

        for chunk in container.logs(stream=True, follow=True):
            pending += chunk.decode(errors="replace")
            *lines, pending = pending.split("\n")
            for line in lines:
                emit(line)
        if pending:
            emit(pending)
        return output

    def _mounts(self, mounts: Mounts) -> dict[Path, bool]:
        """``mounts`` plus the cache folder; a writable venvs folder shares one mount with uv's cache (below)."""
        found = {**mounts, self.cache: False}
        if found.get(self.venvs) is False:
            del found[self.venvs], found[self.cache]
            found.update(_shared_mount(self.venvs, self.cache))
        return found

    def _probe_toolkit(self) -> CudaToolkit:
        result = self.run([str(CONTAINER_CUDA_HOME / "bin" / "nvcc"), "--version"], network=False)
        match = RELEASE_RE.search(result.output)
        if result.code != 0 or not match:
            raise ToolchainError(f"--toolchain docker: nvcc does not run in {self.spec.tag}: "
                                 f"{result.output.strip()[-200:]}")
        version = Version(match.group(2))
        if not same_minor(version, self.cuda):
            raise ToolchainError(f"--toolchain docker: {self.spec.tag} has nvcc {version}, not CUDA {self.cuda}",
                                 f"rebuild it with `builder images build --cuda {self.cuda}` on a CUDA {self.cuda} "
                                 "base")
        ref = image_ref(self.image)
        return CudaToolkit("docker", CONTAINER_CUDA_HOME, version, self.reason, image=ref["image"] or self.spec.tag,
                           image_id=ref["image_id"], image_digest=ref["image_digest"])

    # -- the BuildHost answers ----------------------------------------------------------------------------------
    def path(self, host_path: Path) -> Path:
        return host_path  # mounted at the same path

    def base_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """None of the host's variables: the image's PATH, a writable HOME and uv cache."""
        return {"PATH": CONTAINER_PATH, "HOME": str(self.cache / "home"), "UV_CACHE_DIR": str(self.cache / "uv"),
                "UV_NO_PROGRESS": "1", "LANG": "C.UTF-8", "CUDA_HOME": str(CONTAINER_CUDA_HOME)}

    def base_python(self, version: str) -> str:
        (self.cache / "home").mkdir(parents=True, exist_ok=True)
        (self.cache / "uv").mkdir(parents=True, exist_ok=True)
        return version  # uv in the image finds the image's Python of that version

    def given_python(self, python: Path) -> Path:
        raise ToolchainError(f"--python {python}: with --toolchain docker the build's Python comes from the image",
                             "give a version instead, e.g. --python 3.12")

    def host_compiler(self, env: Mapping[str, str]) -> dict[str, str] | None:
        return None  # the image's compiler: the image's tag (a hash of its Dockerfile and base) is in the key

    def describe(self) -> str:
        return self.toolkit.describe()

    def record(self) -> dict[str, str]:
        return self.toolkit.record()

    def build_wheel(self, request: WheelRequest, on_line: Callable[[str], None]) -> Path:
        """The build step (issue 16 replaces this one method with cibuildwheel): the shared PEP 517 frontend, each
        hook in a container with the network off; the sources and the output folder writable, the venv read-only."""
        log.info(f"build step in containers of {self.toolkit.image} ({self.image.id[:19]}), network none")
        mounts = {request.source_dir: False, request.out_dir: False, request.python.parent.parent: True}
        return pep517_wheel(request, self, on_line, mounts=mounts)


def _shared_mount(venvs: Path, uv_cache: Path) -> dict[Path, bool]:
    """One writable mount holding both the venvs and uv's cache: across two bind mounts uv cannot hard-link a
    package into the venv and copies it, which doubles the disk a CUDA torch takes (about 5 GiB more)."""
    common = Path(os.path.commonpath([venvs.resolve(), uv_cache.resolve()]))
    if common == Path(common.anchor):  # nothing shared but the root: mount the two folders
        return {venvs: False, uv_cache: False}
    return {common: False}
