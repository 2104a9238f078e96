"""Choosing the toolchain for a target: explicit ``--toolchain`` or ``auto`` with a printed reason."""

from __future__ import annotations

from collections.abc import Mapping

from packaging.version import Version

from ..errors import ToolchainError, UsageError
from ..images import base_present, build_image, find_image, image_spec
from ..log import log
from ..settings import Settings
from . import docker as docker_toolchain
from . import pip as pip_toolchain
from .base import ToolchainChoice
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
    client = docker_toolchain.connect(env)
    if client is None:
        return None
    address = str(client.api.base_url)
    client.close()
    return address


def select_toolkit(requested: str, cuda: Version, settings: Settings, env: Mapping[str, str]) -> ToolchainChoice:
    """Resolve ``requested`` (auto/pip/host/docker) into a toolkit, or raise one clear ToolchainError.

    For docker the choice carries the open ContainerToolchain (``choice.container``); the caller closes it.
    """
    image = docker_image_for(cuda)
    if requested == "pip":
        return ToolchainChoice("pip", pip_toolchain.provision(cuda, settings), None)
    if requested == "host":
        return ToolchainChoice("host", find_host_toolkit(cuda, env), None)
    if requested == "docker":
        return _docker(cuda, env, image)
    return _auto(cuda, settings, env, image)


def _docker(cuda: Version, env: Mapping[str, str], image: str) -> ToolchainChoice:
    client = docker_toolchain.connect(env)
    if client is None:
        raise ToolchainError(
            f"--toolchain docker: no container engine answers (DOCKER_HOST={env.get('DOCKER_HOST', 'unset')})",
            "start Docker or `podman system service`, or use --toolchain pip (CUDA >= 13)",
        )
    spec = image_spec(cuda)
    try:
        if find_image(client, spec) is None:
            log.info(f"toolchain docker: {spec.tag} is not built yet; building it from {spec.dockerfile.name} "
                     f"on {spec.base_image}")
            build_image(client, spec, log_line=lambda line: log.info(f"  {line}"))
        container = docker_toolchain.ContainerToolchain.open(
            client, spec, cuda, f"--toolchain docker: engine at {env.get('DOCKER_HOST') or client.api.base_url}")
    except BaseException:
        client.close()
        raise
    return ToolchainChoice("docker", container.toolkit, image, container=container)


def _auto(cuda: Version, settings: Settings, env: Mapping[str, str], image: str) -> ToolchainChoice:
    """A container engine with an image for ``cuda`` (present, or buildable from a base image present locally),
    else a host toolkit of ``cuda``, else PyPI for CUDA >= 13, else one line naming what is missing.
    Never pulls: a base image that is not on the engine already makes auto fall through."""
    notes: list[str] = []
    engine_note = _auto_container(cuda, env)
    if isinstance(engine_note, ToolchainChoice):
        return engine_note
    notes.append(engine_note)
    try:
        toolkit = find_host_toolkit(cuda, env)
        return ToolchainChoice("auto", toolkit.with_reason(f"auto: {engine_note}; host nvcc is CUDA {toolkit.version}"),
                               None, tuple(notes))
    except ToolchainError as e:
        notes.append(e.message.removeprefix("--toolchain host: "))
    if cuda.major >= 13:
        toolkit = pip_toolchain.provision(cuda, settings)
        return ToolchainChoice("auto", toolkit.with_reason(f"auto: {engine_note}; {notes[1]}; CUDA {cuda} comes from PyPI"),
                               None, tuple(notes))
    raise ToolchainError(
        f"no CUDA {cuda} compiler here: {notes[1]}; PyPI has no CUDA 12 compiler; {engine_note}",
        f"install Docker or podman and use --toolchain docker (`builder images build --cuda {cuda}` pulls {image}), "
        f"or set CUDA_HOME to a CUDA {cuda} install and use --toolchain host",
    )


def _auto_container(cuda: Version, env: Mapping[str, str]) -> ToolchainChoice | str:
    """The docker choice when an engine answers and has (or can build without a registry) an image for ``cuda``;
    otherwise the reason why not, for the printed/recorded choice."""
    client = docker_toolchain.connect(env)
    if client is None:
        return f"no container engine answers for {docker_image_for(cuda)}"
    address = env.get("DOCKER_HOST") or client.api.base_url
    try:
        spec = image_spec(cuda)
    except UsageError:
        client.close()
        return f"a container engine answers at {address} but there is no Dockerfile for CUDA {cuda}"
    try:
        found = find_image(client, spec)
        if found is None:
            if not base_present(client, spec):
                client.close()
                return (f"a container engine answers at {address} but neither {spec.tag} nor its base "
                        f"{spec.base_image} is present (auto never pulls; `builder images build --cuda {cuda}`)")
            log.info(f"toolchain auto: building {spec.tag} on the local base {spec.base_image}")
            build_image(client, spec, log_line=lambda line: log.info(f"  {line}"))
        container = docker_toolchain.ContainerToolchain.open(
            client, spec, cuda, f"auto: a container engine answers at {address} with an image for CUDA {cuda}")
    except ToolchainError as e:
        client.close()
        return f"a container engine answers at {address} but its image is unusable ({e.message})"
    return ToolchainChoice("auto", container.toolkit, docker_image_for(cuda), container=container)
