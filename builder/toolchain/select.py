"""Choosing the toolchain for a target: explicit ``--toolchain`` or ``auto`` with a printed reason."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

import builder.toolchain.container as docker_toolchain
import builder.toolchain.pip as pip_toolchain
from builder.core.cachedir import memo_dir
from builder.core.errors import ToolchainError, UsageError
from builder.core.log import log
from builder.core.settings import Settings
from builder.discovery.compat import resolve_index
from builder.model.cuda import CudaVersion
from builder.model.platform import Platform, this_machine
from builder.toolchain.base import CudaToolkit, ToolchainChoice, nvcc_version
from builder.toolchain.host import candidate_homes, find_host_toolkit
from builder.toolchain.images import (
    TEMPLATE,
    ImageSpec,
    available_cudas,
    base_present,
    build_image,
    default_base_image,
    find_image,
    image_spec,
)
from builder.toolchain.local import LocalRunner

TOOLCHAINS = ("auto", "pip", "host", "docker")

def docker_image_for(cuda: CudaVersion, platform: Platform | None = None) -> str:
    """What the docker toolchain builds CUDA ``cuda`` in for ``platform`` (default: this machine's; a container
    builds for the machine it runs on), in words: the base image plus that CUDA, from the Dockerfile template (the
    built image's tag hashes the template and its arguments: ``builder images build`` names it)."""
    key, machine = cuda.line, platform or this_machine()
    if key not in available_cudas(machine):
        return f"no manylinux image for CUDA {key} (dockerfiles/{TEMPLATE} is built for " \
               f"{', '.join(available_cudas(machine)) or 'none'})"
    return f"{default_base_image(machine)} + CUDA {key} (dockerfiles/{TEMPLATE})"


def container_engine_answers(env: Mapping[str, str]) -> str | None:
    """The engine's address if a Docker-API engine (docker or podman service) answers a ping, else None."""
    client = docker_toolchain.connect(env)
    if client is None:
        return None
    address = str(client.api.base_url)
    client.close()
    return address


def select_toolkit(requested: str, cuda: CudaVersion, settings: Settings, env: Mapping[str, str], *,
                   components: tuple[str, ...] = (), here_only: bool = False) -> ToolchainChoice:
    """Resolve ``requested`` (auto/pip/host/docker) into a toolkit that also holds ``components`` (the recipe's
    ``[build] cuda-components``: ``plan.recipe.cuda_components``), or raise one clear ToolchainError.

    The choice carries the BuildHost the build runs on (``choice.host``: this machine, or the open
    ContainerToolchain for docker); the caller closes it. ``here_only`` (a cross build, toolchain/cross.py): auto
    leaves containers out, since a container's compiler is not this machine's.
    """
    image = docker_image_for(cuda)
    if requested == "pip":
        return _here("pip", pip_toolchain.provision(cuda, settings, components), settings)
    if requested == "host":
        return _here("host", find_host_toolkit(cuda, env, memo_dir(settings), components), settings)
    if requested == "docker":
        return _docker(cuda, settings, env, image, components)
    return _auto(cuda, settings, env, image, components, containers=not here_only)


def _here(requested: str, toolkit: CudaToolkit, settings: Settings, notes: tuple[str, ...] = ()) -> ToolchainChoice:
    return ToolchainChoice(requested, toolkit, None, notes, host=LocalRunner(toolkit, memo=memo_dir(settings)))


def may_use_container(requested: str, env: Mapping[str, str]) -> bool:
    """Whether ``select_toolkit(requested, …)`` may pick the docker toolchain here: docker always, auto when a
    container engine answers (then the toolkit and Python live in an image). Cheap: one engine ping."""
    return requested == "docker" or (requested == "auto" and container_engine_answers(env) is not None)


def _container_host(client: Any, spec: ImageSpec, cuda: CudaVersion, reason: str, settings: Settings,
                    env: Mapping[str, str]) -> docker_toolchain.ContainerToolchain:
    return docker_toolchain.ContainerToolchain.open(client, spec, cuda, reason, cache=settings.cache("docker"),
                                                    engine_env=env)


def _docker(cuda: CudaVersion, settings: Settings, env: Mapping[str, str], image: str,
            components: tuple[str, ...] = ()) -> ToolchainChoice:
    spec = image_spec(cuda, components=components, platform=this_machine())
    client = docker_toolchain.connect(env)
    if client is None:
        raise ToolchainError(
            f"--toolchain docker: no container engine answers (DOCKER_HOST={env.get('DOCKER_HOST', 'unset')}) to "
            f"build in {spec.tag} (dockerfiles/{spec.dockerfile.name} on {spec.base_image})",
            "start Docker or `podman system service`, or use --toolchain pip (CUDA >= 13)",
        )
    try:
        if find_image(client, spec) is None:
            log.info(f"toolchain docker: {spec.tag} is not built yet; building it from {spec.dockerfile.name} "
                     f"on {spec.base_image}")
            build_image(client, spec, log_line=lambda line: log.info(f"  {line}"))
        container = _container_host(
            client, spec, cuda, f"--toolchain docker: engine at {env.get('DOCKER_HOST') or client.api.base_url}",
            settings, env)
    except BaseException:
        client.close()
        raise
    return ToolchainChoice("docker", container.toolkit, image, host=container)


def _auto(cuda: CudaVersion, settings: Settings, env: Mapping[str, str], image: str,
          components: tuple[str, ...] = (), *, containers: bool = True) -> ToolchainChoice:
    """A container engine with an image for ``cuda`` (present, or buildable from a base image present locally),
    else a host toolkit of ``cuda``, else PyPI for CUDA >= 13, else one line naming what is missing.
    Never pulls: a base image that is not on the engine already makes auto fall through."""
    notes: list[str] = []
    engine_note = (_auto_container(cuda, settings, env, components) if containers else
                   "a cross build compiles with this machine's own toolkit, not a container's")
    if isinstance(engine_note, ToolchainChoice):
        return engine_note
    notes.append(engine_note)
    try:
        toolkit = find_host_toolkit(cuda, env, memo_dir(settings), components)
        return _here("auto", toolkit.with_reason(f"auto: {engine_note}; host nvcc is CUDA {toolkit.version}"),
                     settings, tuple(notes))
    except ToolchainError as e:
        notes.append(e.message.removeprefix("--toolchain host: "))
    if cuda.major >= 13:
        toolkit = pip_toolchain.provision(cuda, settings, components)
        return _here("auto", toolkit.with_reason(f"auto: {engine_note}; {notes[1]}; CUDA {cuda} comes from PyPI"),
                     settings, tuple(notes))
    ways = [*_ways_to(cuda, image), *alternatives_here(cuda, settings, env)]  # the target's CUDA first
    raise ToolchainError(  # one error line; each way forward on a line of its own
        f"no CUDA {cuda} compiler here: {notes[1]}; PyPI has no CUDA 12 compiler; {engine_note}",
        None, extra=tuple(f"hint: {w}" for w in ways),
    )


def _ways_to(cuda: CudaVersion, image: str) -> list[str]:
    """How to get a compiler for ``cuda`` onto this machine, the ways that keep the target's torch: a container
    engine (the container toolchain), or a CUDA ``cuda`` toolkit installed here."""
    return [f"for CUDA {cuda} wheels (what a CUDA {cuda} torch loads): install Docker or podman and use --toolchain "
            f"docker (`builder images build --cuda {cuda}` pulls {image})",
            f"or install a CUDA {cuda} toolkit (NVIDIA's CUDA {cuda} installer or its cuda-toolkit-"
            f"{cuda.major}-{cuda.minor} package), set CUDA_HOME to it and use --toolchain host"]


def _switch(cuda: CudaVersion, other: str) -> str:
    """How a way forward that builds CUDA ``other`` instead of ``cuda`` is labelled: across CUDA majors it serves
    another torch, so it is a torch switch and says so."""
    major = CudaVersion.parse(other).major
    if major == cuda.major:
        return ""
    return f"needs a torch switch (a CUDA {major} wheel loads beside a CUDA {major} torch only, not a CUDA {cuda} one): "


def alternatives_here(cuda: CudaVersion, settings: Settings, env: Mapping[str, str]) -> list[str]:
    """What this machine CAN build instead of ``cuda``, found cheaply (nvcc --version, the toolkit cache): host
    toolkits of another CUDA, and CUDA 13.x from PyPI with the torch builds PyPI has for it."""
    ways: list[str] = []
    for home in candidate_homes(env):
        try:
            version = nvcc_version(home / "bin" / "nvcc", memo_dir(settings))
        except ToolchainError:
            continue
        key = CudaVersion.of(version).line
        if key != cuda.line:
            ways.append(f"{_switch(cuda, key)}this machine can build CUDA {key} wheels (host CUDA at {home}): use "
                        f"--cuda {key} with a CUDA {key} torch{_torch_on_pypi(key, settings)}")
    pip_cuda = _pip_cuda(settings)
    if pip_cuda is not None and pip_cuda != cuda.line and not any(f"--cuda {pip_cuda} " in w for w in ways):
        cached = pip_toolchain.cached_home(CudaVersion.parse(pip_cuda), settings) is not None
        if cached or not settings.offline:
            ways.append(f"{_switch(cuda, pip_cuda)}this machine can build CUDA {pip_cuda} wheels (pip toolchain): "
                        f"use --cuda {pip_cuda} with a CUDA {pip_cuda} torch{_torch_on_pypi(pip_cuda, settings)}")
    return ways


def _pip_cuda(settings: Settings | None = None) -> str | None:
    """The CUDA >= 13 the pip toolchain is best used for: the newest one PyPI has torch builds for."""
    keys = [k for k in resolve_index("pypi", settings).torch_by_cuda if Version(k).major >= 13]
    return max(keys, key=Version) if keys else None


def _torch_on_pypi(key: str, settings: Settings | None = None) -> str:
    versions = sorted(resolve_index("pypi", settings).torch_by_cuda.get(key, ()), key=Version)
    span = versions[0] if len(versions) == 1 else f"{versions[0]}–{versions[-1]}"
    return f" (torch {span} on PyPI)" if versions else " (none on PyPI: see `builder torch-table`)"


@dataclass(frozen=True)
class BuildHere:
    """Whether and how this machine can compile for a CUDA version, found without provisioning, pulling or
    building anything (for ``builder plan``)."""

    possible: bool
    how: str
    ways_forward: tuple[str, ...] = ()

    def text(self) -> str:
        if self.possible:
            return f"yes: {self.how}"
        return f"no: {self.how}" + (f"; ways forward: {'; '.join(self.ways_forward)}" if self.ways_forward else "")


def probe_build_here(requested: str, cuda: CudaVersion, settings: Settings, env: Mapping[str, str], *,
                     components: tuple[str, ...] = ()) -> BuildHere:
    """The answer ``select_toolkit(requested, …)`` would give, cheaply: an engine ping and image lookup, nvcc
    --version of host toolkits, the pip toolkit cache. Nothing is downloaded, provisioned or built."""
    image = docker_image_for(cuda)
    reasons: list[str] = []
    if requested in ("auto", "docker"):
        found, note = _probe_container(cuda, env, components)
        if found:
            return BuildHere(True, note)
        reasons.append(note)
    if requested in ("auto", "host"):
        try:
            toolkit = find_host_toolkit(cuda, env, memo_dir(settings), components)
            return BuildHere(True, f"host CUDA {toolkit.version} at {toolkit.cuda_home}")
        except ToolchainError as e:
            reasons.append(e.message.removeprefix("--toolchain host: "))
    if requested in ("auto", "pip"):
        if cuda.major < 13:
            reasons.append("PyPI has no CUDA 12 compiler")
        else:
            home = pip_toolchain.cached_home(cuda, settings, components)
            if home is not None:
                return BuildHere(True, f"pip toolchain (CUDA {cuda} from PyPI, cached at {home})")
            if not settings.offline:
                return BuildHere(True, f"pip toolchain (CUDA {cuda} from PyPI, not yet provisioned: about 100 MB "
                                       "on the first build)")
            reasons.append(f"CUDA {cuda} is not in the toolkit cache and --offline forbids downloading")
    ways: list[str] = []
    other = probe_build_here("auto", cuda, settings, env, components=components) if requested != "auto" else None
    if other is not None and other.possible:
        ways.append(f"--toolchain auto would build it here with the {other.how}")
    elsewhere = alternatives_here(cuda, settings, env)
    if not (ways or elsewhere) or cuda.major < 13 or requested != "pip":
        ways += _ways_to(cuda, image)  # the target's own CUDA first, then what builds for another torch
    ways += elsewhere
    where = f" with --toolchain {requested}" if requested != "auto" else ""
    return BuildHere(False, f"no CUDA {cuda} compiler here{where} ({'; '.join(reasons)})", tuple(ways))


def _probe_container(cuda: CudaVersion, env: Mapping[str, str], components: tuple[str, ...] = ()) -> tuple[bool, str]:
    client = docker_toolchain.connect(env)
    if client is None:
        return False, f"no container engine answers for {docker_image_for(cuda)}"
    address = env.get("DOCKER_HOST") or client.api.base_url
    try:
        spec = image_spec(cuda, components=components, platform=this_machine())
        if find_image(client, spec) is not None:
            return True, f"docker toolchain ({spec.tag} on the engine at {address})"
        if base_present(client, spec):
            return True, f"docker toolchain ({spec.tag} will be built on the local base {spec.base_image})"
        return False, (f"a container engine answers at {address} but neither {spec.tag} nor its base "
                       f"{spec.base_image} is present (`builder images build --cuda {cuda}` pulls it)")
    except (UsageError, ToolchainError) as e:
        return False, f"a container engine answers at {address} but has no usable image for CUDA {cuda} ({e.message})"
    finally:
        client.close()


def _auto_container(cuda: CudaVersion, settings: Settings, env: Mapping[str, str],
                    components: tuple[str, ...] = ()) -> ToolchainChoice | str:
    """The docker choice when an engine answers and has (or can build without a registry) an image for ``cuda``;
    otherwise the reason why not, for the printed/recorded choice."""
    client = docker_toolchain.connect(env)
    if client is None:
        return f"no container engine answers for {docker_image_for(cuda)}"
    address = env.get("DOCKER_HOST") or client.api.base_url
    try:
        spec = image_spec(cuda, components=components, platform=this_machine())
    except UsageError:
        client.close()
        return f"a container engine answers at {address} but there is no image for CUDA {cuda}"
    try:
        found = find_image(client, spec)
        if found is None:
            if not base_present(client, spec):
                client.close()
                return (f"a container engine answers at {address} but neither {spec.tag} nor its base "
                        f"{spec.base_image} is present (auto never pulls; `builder images build --cuda {cuda}`)")
            log.info(f"toolchain auto: building {spec.tag} on the local base {spec.base_image}")
            build_image(client, spec, log_line=lambda line: log.info(f"  {line}"))
        reason = f"auto: a container engine answers at {address} with an image for CUDA {cuda}"
        container = _container_host(client, spec, cuda, reason, settings, env)
    except ToolchainError as e:
        client.close()
        return f"a container engine answers at {address} but its image is unusable ({e.message})"
    return ToolchainChoice("auto", container.toolkit, docker_image_for(cuda), host=container)
