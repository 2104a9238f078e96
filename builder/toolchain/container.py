"""The docker toolchain: the compiler and the build's Python come from a CUDA devel image (dockerfiles/).

Only two things happen inside containers: creating the build venv with the pinned torch (cached on the host,
in the tool cache) and the ``python -m build --wheel --no-isolation`` step. Plan, source, patch, finalize,
inspect, test and publish run on the host exactly as for the pip and host toolchains. Host folders are bind-mounted
at the same paths inside the container, so every path in logs and records means the same thing on both sides.
Containers run as the invoking uid:gid (files come back owned by the caller; under rootless podman container
root *is* the caller), the build step runs with ``network_mode="none"`` (sources are always fetched on the host
first), and GPUs are passed (``device_requests``) only where the host has one. Docker and podman's Docker-API
service are driven through the same SDK; no shell command is ever assembled from strings.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from packaging.version import Version

from builder.core.errors import BuildFailed, ToolchainError
from builder.core.log import log
from builder.core.uvtool import install_failure, warn_if_low_disk
from builder.stages.pyenv import _PROBE, PythonEnv
from builder.toolchain.base import CudaToolkit, same_minor
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
    """An engine connection plus one build image; runs commands in throwaway containers with bind mounts.

    Used as a context manager: containers it started are removed and the client closed on exit.
    """

    def __init__(self, client: Any, image: Any, spec: ImageSpec, cuda: Version, reason: str = "") -> None:
        self.client = client
        self.image = image
        self.spec = spec
        self.cuda = cuda
        self.reason = reason
        self._live: list[Any] = []
        self.toolkit = self._probe_toolkit()

    # -- lifecycle ---------------------------------------------------------------------------------------------
    @classmethod
    def open(cls, client: Any, spec: ImageSpec, cuda: Version, reason: str) -> ContainerToolchain:
        image = find_image(client, spec)
        if image is None:
            raise ToolchainError(f"--toolchain docker: no image for CUDA {spec.cuda} ({spec.tag} is not built)",
                                 f"run `builder images build --cuda {spec.cuda}` first")
        return cls(client, image, spec, cuda, reason)

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

    def run(self, command: Sequence[str], *, mounts: Mapping[Path, bool] = {}, env: Mapping[str, str] | None = None,
            network: bool = False, gpu: bool = False, workdir: Path | None = None,
            on_line: Callable[[str], None] | None = None) -> tuple[int, str]:
        """Run ``command`` (an argv list) in a fresh container; ``mounts`` maps host paths to read-only flags,
        each mounted at the same path. Returns (exit code, output); output lines also go to ``on_line``."""
        import docker
        import requests

        binds = {str(p): {"bind": str(p), "mode": "ro" if ro else "rw"} for p, ro in mounts.items()}
        container = None
        try:
            container = self.client.containers.create(
                self.image.id, command=list(command), environment=dict(env or {}), volumes=binds,
                network_mode="host" if network else "none", user=self.user(),
                working_dir=str(workdir) if workdir else None, device_requests=gpu_requests(gpu) or None,
                labels={"org.cuda-wheel-builder.run": "1"},
            )
            self._live.append(container)
            container.start()
            output: list[str] = []
            pending = ""
            for chunk in container.logs(stream=True, follow=True):
                pending += chunk.decode(errors="replace")
                *lines, pending = pending.split("\n")
                for line in lines:
                    output.append(line)
                    if on_line:
                        on_line(line)
            if pending:
                output.append(pending)
                if on_line:
                    on_line(pending)
            code = int(container.wait().get("StatusCode", 1))
            return code, "\n".join(output)
        except (docker.errors.DockerException, requests.exceptions.RequestException) as e:
            raise ToolchainError(f"container run of {command[0]} failed: {_one_line(e)}") from e
        finally:
            if container is not None:
                try:
                    container.remove(force=True)
                    self._live.remove(container)
                except Exception:  # noqa: BLE001
                    pass

    def _probe_toolkit(self) -> CudaToolkit:
        code, out = self.run([str(CONTAINER_CUDA_HOME / "bin" / "nvcc"), "--version"])
        from builder.toolchain.base import _RELEASE_RE

        match = _RELEASE_RE.search(out)
        if code != 0 or not match:
            raise ToolchainError(f"--toolchain docker: nvcc does not run in {self.spec.tag}: {out.strip()[-200:]}")
        version = Version(match.group(2))
        if not same_minor(version, self.cuda):
            raise ToolchainError(f"--toolchain docker: {self.spec.tag} has nvcc {version}, not CUDA {self.cuda}",
                                 f"rebuild it with `builder images build --cuda {self.cuda}` on a CUDA {self.cuda} base")
        ref = image_ref(self.image)
        return CudaToolkit("docker", CONTAINER_CUDA_HOME, version, self.reason,
                           image=ref["image"] or self.spec.tag, image_id=ref["image_id"], image_digest=ref["image_digest"])

    # -- the two jobs done inside the container ---------------------------------------------------------------------
    def base_env(self, cache: Path) -> dict[str, str]:
        """The environment a container starts from: none of the host's variables, a writable HOME and uv cache."""
        return {"PATH": CONTAINER_PATH, "HOME": str(cache / "home"), "UV_CACHE_DIR": str(cache / "uv"),
                "UV_NO_PROGRESS": "1", "LANG": "C.UTF-8", "CUDA_HOME": str(CONTAINER_CUDA_HOME)}

    def managed_env(self, python: str, torch: str, index_url: str, requirements: Sequence[str], root: Path,
                    cache: Path) -> PythonEnv:
        """A cached build venv made inside the image: torch==``torch`` and the build requirements."""
        import hashlib

        from filelock import FileLock

        reqs = sorted(set(requirements))
        key = hashlib.sha256(json.dumps([self.image.id, python, torch, index_url, reqs]).encode()).hexdigest()[:16]
        target = root / f"docker-{key}"
        marker = target / ".builder-env.json"
        (cache / "home").mkdir(parents=True, exist_ok=True)
        (cache / "uv").mkdir(parents=True, exist_ok=True)
        mounts = {**_shared_mount(root, cache), **_index_mount(index_url)}
        with FileLock(str(root / f"docker-{key}.lock")):
            if marker.exists():
                marker.touch()  # last use, for `builder cache clean --older-than`
                env = self._probe_python(target, mounts, cache)
                log.info(f"build env: cached container venv {target} (Python {env.version}, torch {env.torch})")
                return env
            shutil.rmtree(target, ignore_errors=True)
            index_args = [] if index_url.startswith("https://pypi.org") else ["--extra-index-url", index_url]
            steps = [
                ["uv", "venv", "--quiet", "--python", python, str(target)],
                ["uv", "pip", "install", "--quiet", "--python", str(target / "bin" / "python"), *index_args,
                 f"torch=={torch}", *reqs],
            ]
            warn_if_low_disk(root)
            try:
                with log.status(f"creating build venv {target.name} in {self.toolkit.image}: torch=={torch} (first time only)"):
                    for argv in steps:
                        log.command(argv)
                        code, out = self.run(argv, mounts=mounts, env=self.base_env(cache), network=True)
                        if code != 0:
                            raise install_failure(f"in the container, {' '.join(argv[:3])}", out, where=target)
                env = self._probe_python(target, mounts, cache)
                marker.write_text(json.dumps(env.record()))
            except BaseException:
                shutil.rmtree(target, ignore_errors=True)
                raise
        log.info(f"build env: container venv {target} (Python {env.version}, torch {env.torch}, CUDA {env.torch_cuda})")
        return env

    def _probe_python(self, venv: Path, mounts: Mapping[Path, bool], cache: Path) -> PythonEnv:
        code, out = self.run([str(venv / "bin" / "python"), "-c", _PROBE], mounts=mounts, env=self.base_env(cache))
        lines = [l for l in out.splitlines() if l.startswith("{")]
        if code != 0 or not lines:
            raise ToolchainError(f"the container venv {venv} does not start: {out.strip()[-200:]}")
        info = json.loads(lines[-1])
        if not info.get("torch"):
            raise ToolchainError(f"torch is not importable in the container venv {venv}: {info.get('torch_error')}")
        return PythonEnv(venv / "bin" / "python", info["version"], info["torch"], info["torch_cuda"],
                         Path(info["purelib"]), True)

    def build_wheel(self, source_root: Path, python: PythonEnv, env: Mapping[str, str], outdir: Path, log_file: Path,
                    *, mounts: Mapping[Path, bool]) -> Path:
        """``python -m build --wheel --no-isolation`` in the container, network off; output streams to ``log_file``."""
        from builder.stages.compile import CompileProgress, _summary, failure_tail

        outdir.mkdir(parents=True, exist_ok=True)
        log_file.parent.mkdir(parents=True, exist_ok=True)
        argv = [str(python.python), "-m", "build", "--wheel", "--no-isolation", "--outdir", str(outdir), str(source_root)]
        interesting = ("CUDA_HOME", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NVCC_THREADS")
        log.info(f"build env (container {self.toolkit.image}, network none): "
                 + " ".join(f"{k}={env[k]}" for k in interesting if k in env))
        log.command(argv)
        start = time.monotonic()
        log.info(f"build log: {log_file}")
        with log_file.open("w") as out, log.status("compiling in a container", each_change=True) as update:
            progress = CompileProgress(update)  # a short line per compile step; the log keeps every line
            out.write(f"# build of {source_root} in {self.toolkit.image} ({self.image.id})\n+ {' '.join(argv)}\n")

            def write(line: str) -> None:
                out.write(line + "\n")
                out.flush()
                progress(line)

            code, _ = self.run(argv, mounts=mounts, env=env, network=False, workdir=source_root, on_line=write)
        wheels = sorted(outdir.glob("*.whl"))
        if code != 0 or not wheels:
            text = log_file.read_text(errors="replace")
            log.error(failure_tail(text, log_file))
            raise BuildFailed(f"build failed in the container after {time.monotonic() - start:.0f}s: "
                              f"{_summary(text) or f'exit code {code}'}", f"full log: {log_file}")
        log.ok(f"built {wheels[-1].name} in a container in {time.monotonic() - start:.0f}s")
        return wheels[-1]


def _shared_mount(venvs: Path, uv_cache: Path) -> dict[Path, bool]:
    """One writable mount holding both the venvs and uv's cache: across two bind mounts uv cannot hard-link a
    package into the venv and copies it, which doubles the disk a CUDA torch takes (about 5 GiB more)."""
    common = Path(os.path.commonpath([venvs.resolve(), uv_cache.resolve()]))
    if common == Path(common.anchor):  # nothing shared but the root: mount the two folders
        return {venvs: False, uv_cache: False}
    return {common: False}


def _index_mount(index_url: str) -> dict[Path, bool]:
    """A local (file://) torch index is mounted read-only; its pages may link to files beside it, so its parent goes."""
    if not index_url.startswith("file://"):
        return {}
    path = Path(index_url.removeprefix("file://")).resolve()
    return {path.parent if path.name == "simple" else path: True}


def index_mounts(index_url: str) -> dict[Path, bool]:
    return _index_mount(index_url)
