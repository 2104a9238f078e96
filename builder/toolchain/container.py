"""The docker toolchain: the wheel is built by cibuildwheel in a manylinux CUDA image (dockerfiles/manylinux-cuda.Dockerfile).

``ContainerToolchain`` is a ``BuildHost`` (toolchain/base.py) for one image on one engine (docker, or podman).
It brings the build's Python itself (``prepare_python``): the image's ``/opt/python/cp3XX-cp3XX`` interpreter,
and the pinned torch and build requirements, which it fetches now on the host into a cache (one per torch
index) and which cibuildwheel's before-build step installs offline; its answer (``PreparedPython``, with what
was fetched) comes back to ``build_wheel`` in the request, so the toolchain keeps no state between the two. Its
``build_wheel`` is ``cibw.build_with_cibuildwheel``: the recipe's build env, TORCH_CUDA_ARCH_LIST and MAX_JOBS
passed through verbatim, the network off, ``auditwheel repair`` with torch's and CUDA's libraries excluded, so
the wheel comes back tagged ``manylinux_2_XX`` (the only place a wheel is repaired: stages/repair.py reads the
result back). Plan, source, patch, finalize, inspect, test and publish run on the host exactly
as for the pip and host toolchains. The toolkit probe (``nvcc --version``) runs in a throwaway container through
the docker SDK (Docker, or podman's Docker-API service); cibuildwheel drives the engine's own CLI, which sees the
same images (the same user and CONTAINERS_CONF). No shell command is ever assembled from strings.
"""

from __future__ import annotations

import codecs
import hashlib
import os
import shutil
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TextIO

import builder.toolchain.cibw as cibw
from builder.core.errors import ToolchainError
from builder.core.log import log
from builder.core.streaming import follow
from builder.model.arch import parse_nvcc_version
from builder.model.cuda import CudaVersion
from builder.toolchain.base import (
    NO_MOUNTS,
    CudaToolkit,
    Mounts,
    PreparedPython,
    RunResult,
    WheelBuildFailed,
    WheelRequest,
    same_minor,
)
from builder.toolchain.images import ImageSpec, find_image, image_ref

# `import docker` (the SDK, ~170 ms with requests under it) stands in the functions that talk to an engine, on
# purpose: a pip or host build, and every command that only names the docker toolchain, never load it.

CONTAINER_CUDA_HOME = Path(cibw.CONTAINER_CUDA_HOME)
# the engine CLI's own settings, passed to cibuildwheel (none of the other host variables are)
ENGINE_VARS = ("DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "CONTAINER_HOST", "CONTAINERS_CONF",
               "CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF", "XDG_RUNTIME_DIR")
# what cibuildwheel sets in its container itself (cibw.cibw_settings): never passed from the build env
CIBW_OWN = ("PATH", "HOME", "CUDA_HOME", "CUDA_PATH", "UV_CACHE_DIR", "UV_NO_PROGRESS", "LANG")


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
    """An engine connection plus one build image. Used as a context manager: containers it started are removed
    and the client closed on exit."""

    def __init__(self, client: Any, image: Any, spec: ImageSpec, cuda: CudaVersion, reason: str = "", *,
                 cache: Path, engine_env: Mapping[str, str] | None = None) -> None:
        self.client = client
        self.image = image
        self.spec = spec
        self.cuda = cuda
        self.reason = reason
        self.cache = cache  # torch and the build requirements, per torch index (cibw.TorchCache)
        self.engine_env = {k: v for k, v in (engine_env or {}).items() if k in ENGINE_VARS}
        self.engine = engine_name(client)
        self._live: list[Any] = []
        self.toolkit: CudaToolkit = self._probe_toolkit()
        self.where = f" in {self.toolkit.image}"

    # -- lifecycle ---------------------------------------------------------------------------------------------
    @classmethod
    def open(cls, client: Any, spec: ImageSpec, cuda: CudaVersion, reason: str, *, cache: Path,
             engine_env: Mapping[str, str] | None = None) -> ContainerToolchain:
        image = find_image(client, spec)
        if image is None:
            raise ToolchainError(f"--toolchain docker: no image for CUDA {spec.cuda} ({spec.tag} is not built)",
                                 f"run `builder images build --cuda {spec.cuda} --platform {spec.platform}` first")
        return cls(client, image, spec, cuda, reason, cache=cache, engine_env=engine_env)

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
        """Run ``argv`` in a fresh container; ``mounts`` (host path -> read-only) are mounted at the same paths.
        ``timeout_s`` is not enforced in containers."""
        import docker
        import requests

        binds = {str(p): {"bind": str(p), "mode": "ro" if ro else "rw"} for p, ro in mounts.items()}
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
        """The container's output lines as they come: into ``out`` and to ``on_line`` (core/streaming.follow)."""
        output: list[str] = []

        def kept(lines: Iterable[str]) -> Iterator[str]:
            for line in lines:
                output.append(line.rstrip("\n"))
                yield line

        follow(kept(_lines(container.logs(stream=True, follow=True))), out=out, on_line=on_line or _ignore)
        return output

    def _probe_toolkit(self) -> CudaToolkit:
        result = self.run([str(CONTAINER_CUDA_HOME / "bin" / "nvcc"), "--version"], network=False)
        version = parse_nvcc_version(result.output)
        if result.code != 0 or version is None:
            raise ToolchainError(f"--toolchain docker: nvcc does not run in {self.spec.tag}: "
                                 f"{result.output.strip()[-200:]}")
        if not same_minor(version, self.cuda):
            raise ToolchainError(f"--toolchain docker: {self.spec.tag} has nvcc {version}, not CUDA {self.cuda}",
                                 f"rebuild it with `builder images build --cuda {self.cuda}` on a CUDA {self.cuda} "
                                 "base")
        ref = image_ref(self.image)
        return CudaToolkit("docker", CONTAINER_CUDA_HOME, version, self.reason, image=ref["image"] or self.spec.tag,
                           image_id=ref["image_id"], image_digest=ref["image_digest"])

    # -- the BuildHost answers ----------------------------------------------------------------------------------
    def path(self, host_path: Path) -> Path:
        return host_path  # run() mounts at the same path; cibuildwheel's copy of the source is /project (passed_env)

    def base_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """None of the host's variables: cibuildwheel sets the container's own (PATH, CUDA_HOME, uv's)."""
        return {}

    def prepare_python(self, version: str, torch: str, index_url: str,
                       requirements: Sequence[str]) -> PreparedPython:
        """The image's CPython ``version`` and torch==``torch``: fetched now into the cache (network on, on the
        host; nothing is fetched when it is there), installed offline by cibuildwheel's before-build step. The
        torch version named is what that wheel's torch/version.py says, as a probe of the installed torch would."""
        folder = self.cache / hashlib.sha256(index_url.encode()).hexdigest()[:12]  # one torch per pin and index
        fetch = cibw.TorchCache(python=version, torch=torch, torch_index=index_url, cache_dir=folder,
                                requirements=tuple(requirements), platform=self.spec.platform)
        cibw.fetch_locked(fetch)
        wheel = cibw.fetched_torch(fetch)
        tag = fetch.tag
        root = Path(f"/opt/python/{tag}-{tag}")
        return PreparedPython(root / "bin" / "python", version, wheel.version, wheel.cuda,
                              root / "lib" / f"python{version}" / "site-packages", fetch)

    def given_python(self, python: Path) -> Path:
        raise ToolchainError(f"--python {python}: with --toolchain docker the build's Python comes from the image",
                             "give a version instead, e.g. --python 3.12")

    def host_compiler(self, env: Mapping[str, str]) -> dict[str, str] | None:
        return None  # the image's compiler: the image's tag (a hash of its template and build args) is in the key

    def build_wheel(self, request: WheelRequest, on_line: Callable[[str], None]) -> Path:
        """cibuildwheel on the patched source in this image, with the torch ``prepare_python`` fetched (carried
        in ``request.prepared``); WheelBuildFailed when no wheel came out."""
        if request.prepared is None:
            raise ToolchainError("the docker toolchain builds with the Python its prepare_python answered",
                                 "pass that answer as WheelRequest.prepared")
        req = cibuildwheel_request(request, request.prepared, image=self.image.id, engine=self.engine,
                                   engine_env=self.engine_env)
        log.info(f"build step: cibuildwheel in {self.toolkit.image} ({self.image.id[:19]}) with {self.engine}, "
                 "network none")
        result = cibw.build_with_cibuildwheel(req, on_line)
        if result.wheel is None:
            raise WheelBuildFailed(f"cibuildwheel exited with code {result.exit_code} after "
                                   f"{result.build_seconds:.0f}s without a wheel")
        return result.wheel


def cibuildwheel_request(request: WheelRequest, prepared: PreparedPython, *, image: str,
                         engine: Literal["docker", "podman"], engine_env: Mapping[str, str]) -> cibw.CibwRequest:
    """The cibuildwheel build of ``request`` in ``image``, installing what ``prepared`` fetched."""
    fetch = prepared.fetched
    return cibw.CibwRequest(
        source_dir=request.source_dir, python=prepared.version, image=image, engine=engine, torch=fetch.torch,
        torch_index=fetch.torch_index, cache_dir=fetch.cache_dir, out_dir=request.out_dir,
        log_file=request.log_file, build_env=passed_env(request), requirements=fetch.requirements,
        engine_env=engine_env, platform=fetch.platform)


def _ignore(line: str) -> None:
    pass


def _lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """The engine's log stream (byte chunks cut anywhere, a character too) as text lines, each with its newline
    but the last."""
    decoder, pending = codecs.getincrementaldecoder("utf-8")(errors="replace"), ""
    for chunk in chunks:
        pending += decoder.decode(chunk)
        *lines, pending = pending.split("\n")
        yield from (line + "\n" for line in lines)
    if pending:
        yield pending


def passed_env(request: WheelRequest) -> dict[str, str]:
    """The build env cibuildwheel passes into its container: the request's, less what the container sets itself,
    with the prefix maps naming the copy of the source that cibuildwheel builds (``/project``), not the host's."""
    env = {k: v for k, v in request.env.items() if k not in CIBW_OWN}
    host_root = f"{request.source_dir}="
    for key in ("CFLAGS", "NVCC_APPEND_FLAGS"):
        if key in env:
            env[key] = env[key].replace(host_root, f"{cibw.CONTAINER_PROJECT}=")
    return env


def engine_name(client: Any) -> Literal["docker", "podman"]:
    """Which engine answers: podman's Docker-API service names itself in the version's components."""
    try:
        components = client.version().get("Components") or []
    except Exception:  # noqa: BLE001 - an engine that cannot say is taken to be Docker
        return "docker"
    return "podman" if any("podman" in str(c.get("Name", "")).lower() for c in components) else "docker"
