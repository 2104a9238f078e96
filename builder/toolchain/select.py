"""Choosing the toolchain for a target: explicit ``--toolchain`` or ``auto`` with a printed reason."""

from __future__ import annotations

from collections.abc import Mapping

from packaging.version import Version

from ..errors import ToolchainError
from ..settings import Settings
from . import pip as pip_toolchain
from .base import CudaToolkit, ToolchainChoice
from .host import find_host_toolkit

TOOLCHAINS = ("auto", "pip", "host", "docker")

# The nvidia/cuda devel image each CUDA minor maps to (dockerfiles/ builds on these).
_IMAGE_PATCH = {"12.6": "12.6.3", "12.8": "12.8.1", "12.9": "12.9.1", "13.0": "13.0.2"}


def docker_image_for(cuda: Version) -> str:
    key = f"{cuda.major}.{cuda.minor}"
    full = _IMAGE_PATCH.get(key, f"{key}.0")
    return f"nvidia/cuda:{full}-devel-ubuntu24.04"


def container_engine_answers(env: Mapping[str, str]) -> str | None:
    """The engine's address if a Docker-API engine (docker or podman service) answers a ping, else None."""
    try:
        import docker  # the SDK; imported lazily so a missing engine costs nothing

        client = docker.from_env(environment=dict(env), timeout=3)
        client.ping()
        return str(client.api.base_url)
    except Exception:  # noqa: BLE001 - any failure means "no engine answers"
        return None


def select_toolkit(requested: str, cuda: Version, settings: Settings, env: Mapping[str, str]) -> ToolchainChoice:
    """Resolve ``requested`` (auto/pip/host/docker) into a toolkit, or raise one clear ToolchainError."""
    image = docker_image_for(cuda)
    if requested == "pip":
        return ToolchainChoice("pip", pip_toolchain.provision(cuda, settings), None)
    if requested == "host":
        return ToolchainChoice("host", find_host_toolkit(cuda, env), None)
    if requested == "docker":
        raise _docker_unavailable(cuda, image, env)
    return _auto(cuda, settings, env, image)


def _auto(cuda: Version, settings: Settings, env: Mapping[str, str], image: str) -> ToolchainChoice:
    notes: list[str] = []
    try:
        toolkit = find_host_toolkit(cuda, env)
        return ToolchainChoice("auto", _with_reason(toolkit, f"auto: host nvcc is CUDA {toolkit.version}"), None)
    except ToolchainError as e:
        notes.append(e.message.removeprefix("--toolchain host: "))
    if cuda.major >= 13:
        toolkit = pip_toolchain.provision(cuda, settings)
        return ToolchainChoice("auto", _with_reason(toolkit, f"auto: {notes[0]}; CUDA {cuda} comes from PyPI"), None)
    engine = container_engine_answers(env)
    raise ToolchainError(
        f"no CUDA {cuda} compiler here: {notes[0]}; PyPI has no CUDA 12 compiler; "
        + (f"a container engine answers at {engine} but the docker toolchain is not available in this version"
           if engine else f"no container engine answers for {image}"),
        f"install Docker or podman and use --toolchain docker, or set CUDA_HOME to a CUDA {cuda} install "
        "and use --toolchain host",
    )


def _docker_unavailable(cuda: Version, image: str, env: Mapping[str, str]) -> ToolchainError:
    engine = container_engine_answers(env)
    if engine is None:
        return ToolchainError(
            f"--toolchain docker: no container engine answers (DOCKER_HOST={env.get('DOCKER_HOST', 'unset')})",
            "start Docker or `podman system service`, or use --toolchain pip (CUDA >= 13)",
        )
    return ToolchainError(
        f"--toolchain docker: the container build path ({image}) is not implemented yet",
        "use --toolchain pip (CUDA >= 13) or --toolchain host",
    )


def _with_reason(toolkit: CudaToolkit, reason: str) -> CudaToolkit:
    return CudaToolkit(toolkit.kind, toolkit.cuda_home, toolkit.version, reason)
