"""Build images for the docker toolchain: one per CUDA line and platform, all from one template,
``dockerfiles/manylinux-cuda.Dockerfile``, filled by build arguments: a manylinux_2_28 image plus CUDA X.Y from
NVIDIA's rhel8 repository (``x86_64``, or ``sbsa`` for aarch64, built natively on an arm64 machine such as GitHub's
ubuntu-24.04-arm), what cibuildwheel builds in (toolchain/cibw.py).

The arguments are ``BASE_IMAGE`` (the platform's ``quay.io/pypa/manylinux_2_28_<platform>:latest``, or a local
stand-in: ``--base-image``), ``CUDA_VERSION``, ``CUDA_REPO`` (the platform's repository file), ``CUDA_PACKAGES`` (the
compiler's and ``BASE_COMPONENTS``' rpms for that CUDA) and, only when a recipe's ``[build] cuda-components`` names a
library the image lacks, ``EXTRA_PACKAGES``. The CUDA lines with an image are ``IMAGE_CUDAS``: a new line is one entry.

The tag encodes the CUDA version, the platform where it is not x86_64, and a hash of the template plus its build
arguments (``cuda-wheel-builder:cuda12.8-<12 hex>``, ``cuda-wheel-builder:cuda13.0-aarch64-<12 hex>``), so an
edited template, another package list or another base image gives another tag and a stale image is never reused.
Images carry labels naming their CUDA, recipe hash (template and arguments but the base), platform, base image and
extra packages, so the toolchain can also find an image built from the current recipe on a substitute base
(``--base-image``). Everything goes through the docker SDK (Docker, or podman's Docker-API service).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core.datafiles import data_dir
from builder.core.errors import ToolchainError, UsageError
from builder.model.cuda import IMAGE_CUDAS, CudaVersion
from builder.model.cudacomponents import components_of
from builder.model.platform import X86_64, Platform

# `import docker` stands in the functions that talk to an engine, on purpose: it is slow to import (~170 ms) and
# only the docker toolchain and `builder images` need it (toolchain/container.py does the same).

REPOSITORY = "cuda-wheel-builder"
DOCKERFILES = data_dir("dockerfiles")  # packaged copy in an installed wheel, else the checkout
TEMPLATE = "manylinux-cuda.Dockerfile"
# The CUDA lines the template builds an image for: model/cuda.py IMAGE_CUDAS (discovery's known lines read it too).
# What every image holds besides the compiler: the development libraries torch's headers include
# (model/cudacomponents.py names their rpms), so a recipe asking for them gets the plain image.
COMPILER_RPMS = ("cuda-nvcc", "cuda-cudart-devel", "cuda-cccl")
BASE_COMPONENTS = ("nvrtc", "nvtx", "profiler", "cublas", "cusparse", "cusolver", "curand", "cufft")
NVIDIA_REPO = "https://developer.download.nvidia.com/compute/cuda/repos/rhel8/{}/cuda-rhel8.repo"
REPO_ARCH = {"x86_64": "x86_64", "aarch64": "sbsa"}  # NVIDIA's repository folder per platform
LABEL_CUDA = "org.cuda-wheel-builder.cuda"
LABEL_DOCKERFILE = "org.cuda-wheel-builder.dockerfile-sha256"  # the recipe: template + arguments but the base
LABEL_BASE = "org.cuda-wheel-builder.base-image"
LABEL_KEY = "org.cuda-wheel-builder.key"
LABEL_PACKAGES = "org.cuda-wheel-builder.extra-packages"  # only on images with EXTRA_PACKAGES
LABEL_PLATFORM = "org.cuda-wheel-builder.platform"


@dataclass(frozen=True)
class ImageSpec:
    """What one image is built from: the template and its build arguments; ``tag`` follows from both."""

    cuda: str
    dockerfile: Path  # the template
    buildargs: dict[str, str]
    platform: Platform = X86_64  # the CPU of the image (and of the wheels built in it)

    def dockerfile_text(self) -> bytes:
        return self.dockerfile.read_bytes()

    @property
    def extra_packages(self) -> str:
        return self.buildargs.get("EXTRA_PACKAGES", "")

    @property
    def dockerfile_sha256(self) -> str:
        """The image's recipe, whatever its base: the template and every build argument but ``BASE_IMAGE``."""
        args = {k: v for k, v in self.buildargs.items() if k != "BASE_IMAGE"}
        return hashlib.sha256(self.dockerfile_text() + json.dumps(args, sort_keys=True).encode()).hexdigest()

    @property
    def key(self) -> str:
        text = self.dockerfile_text() + json.dumps(self.buildargs, sort_keys=True).encode()
        return hashlib.sha256(text).hexdigest()[:12]

    @property
    def tag(self) -> str:
        arch = "" if self.platform == X86_64 else f"{self.platform}-"  # x86_64 tags name no platform
        return f"{REPOSITORY}:cuda{self.cuda}-{arch}{self.key}"

    @property
    def base_image(self) -> str:
        return self.buildargs["BASE_IMAGE"]

    def labels(self) -> dict[str, str]:
        labels = {LABEL_CUDA: self.cuda, LABEL_DOCKERFILE: self.dockerfile_sha256, LABEL_BASE: self.base_image,
                  LABEL_KEY: self.key, LABEL_PLATFORM: self.platform.name}
        return labels | {LABEL_PACKAGES: self.extra_packages} if self.extra_packages else labels


def template_path(dockerfiles: Path = DOCKERFILES) -> Path:
    return dockerfiles / TEMPLATE


def available_cudas(platform: Platform = X86_64) -> list[str]:
    """The CUDA lines with an image on ``platform`` (the same on both today)."""
    return list(IMAGE_CUDAS) if platform.name in REPO_ARCH else []


def default_base_image(platform: Platform = X86_64) -> str:
    """PyPA's manylinux_2_28 image of ``platform``: what PyPI's CUDA torch wheels are tagged for."""
    return f"quay.io/pypa/{platform.manylinux_tag}:latest"


def cuda_packages(cuda: str) -> list[str]:
    """The rhel8 rpms every image of CUDA ``cuda`` ("12.8") installs: the compiler and ``BASE_COMPONENTS``."""
    dashed = cuda.replace(".", "-")
    return [f"{rpm}-{dashed}" for rpm in COMPILER_RPMS] + [c.rpm(cuda) for c in components_of(BASE_COMPONENTS)]


def image_spec(cuda: CudaVersion | str, base_image: str | None = None, dockerfiles: Path = DOCKERFILES,
               components: tuple[str, ...] = (), platform: Platform = X86_64) -> ImageSpec:
    """The image for ``cuda`` (a CUDA's line, or the key as given to ``builder images build --cuda``) on
    ``platform``: an aarch64 image is built and run on an arm64 machine (its base is a manylinux_2_28_aarch64
    image; emulating a whole compile under qemu is not an option worth its hours)."""
    key = cuda if isinstance(cuda, str) else cuda.line
    template = template_path(dockerfiles)
    if key not in available_cudas(platform):
        where = "" if platform == X86_64 else f" on {platform}"
        raise UsageError(f"no image for CUDA {key}{where} (dockerfiles/{TEMPLATE} is built for "
                         f"{', '.join(available_cudas(platform)) or 'none'})",
                         f"available{where}: {', '.join(available_cudas(platform)) or 'none'}; a new CUDA line is one "
                         "entry in IMAGE_CUDAS (builder/model/cuda.py)")
    if not template.is_file():
        raise UsageError(f"the image template {template} is missing", "reinstall the builder or use a checkout")
    packages = cuda_packages(key)
    buildargs = {"BASE_IMAGE": base_image or default_base_image(platform), "CUDA_VERSION": key,
                 "CUDA_REPO": NVIDIA_REPO.format(REPO_ARCH[platform.name]), "CUDA_PACKAGES": " ".join(packages)}
    extra = extra_packages(key, components)  # components: a recipe's cuda-components
    if extra:
        buildargs["EXTRA_PACKAGES"] = " ".join(extra)
    return ImageSpec(key, template, buildargs, platform=platform)


def extra_packages(cuda: str, components: tuple[str, ...]) -> list[str]:
    """The rhel8 rpms of ``components`` for CUDA ``cuda`` ("12.8") that every image lacks, sorted."""
    return sorted({c.rpm(cuda) for c in components_of(components)} - set(cuda_packages(cuda)))


def _sdk_error(what: str, e: Exception) -> str:
    text = str(getattr(e, "explanation", None) or e).strip().splitlines()
    return f"{what}: {text[-1] if text else type(e).__name__}"[:400]


def find_image(client: Any, spec: ImageSpec, *, any_base: bool = True) -> Any | None:
    """The image for ``spec``: its exact tag, else (``any_base``) the newest one built from the same template and
    arguments for the same CUDA on another base image (a local stand-in); None if there is none."""
    import docker

    try:
        return client.images.get(spec.tag)
    except docker.errors.ImageNotFound:
        pass
    except docker.errors.DockerException as e:
        raise ToolchainError(_sdk_error("cannot query images on the container engine", e)) from e
    if not any_base:
        return None
    candidates = [i for i in list_images(client)
                  if i.labels.get(LABEL_CUDA) == spec.cuda and i.labels.get(LABEL_DOCKERFILE) == spec.dockerfile_sha256
                  and i.labels.get(LABEL_PACKAGES, "") == spec.extra_packages
                  and i.labels.get(LABEL_PLATFORM, X86_64.name) == spec.platform.name]
    candidates.sort(key=lambda i: i.attrs.get("Created", ""), reverse=True)
    return candidates[0] if candidates else None


def base_present(client: Any, spec: ImageSpec) -> bool:
    """Whether the base image is already on the engine (so building needs no registry)."""
    import docker

    try:
        client.images.get(spec.base_image)
        return True
    except docker.errors.DockerException:
        return False


def list_images(client: Any) -> list[Any]:
    import docker

    try:
        images = client.images.list(filters={"label": LABEL_CUDA})
    except docker.errors.DockerException as e:
        raise ToolchainError(_sdk_error("cannot list images on the container engine", e)) from e
    return [i for i in images if any(short_tag(t).startswith(f"{REPOSITORY}:") for t in i.tags)]


def short_tag(tag: str) -> str:
    """``docker.io/library/x:t`` and ``localhost/x:t`` (podman's spellings) as ``x:t``."""
    for prefix in ("docker.io/library/", "localhost/"):
        if tag.startswith(prefix):
            return tag[len(prefix):]
    return tag


def build_image(client: Any, spec: ImageSpec, log_line: Any = None) -> Any:
    """Build and tag ``spec`` through the SDK; build output goes to ``log_line``; a one-line ToolchainError on failure.
    The template COPYs nothing: its folder is the (small) context."""
    import docker

    try:
        stream = client.api.build(
            path=str(spec.dockerfile.parent), dockerfile=spec.dockerfile.name, tag=spec.tag, buildargs=spec.buildargs,
            labels=spec.labels(), rm=True, forcerm=True, decode=True, network_mode="host",
        )
        for chunk in stream:
            if "error" in chunk:
                raise ToolchainError(f"building {spec.tag} from {spec.dockerfile.name} failed: "
                                     f"{str(chunk['error']).strip().splitlines()[-1][:300]}",
                                     f"is the base image {spec.base_image} present or pullable?")
            text = str(chunk.get("stream") or chunk.get("status") or "").rstrip()
            if text and log_line is not None:
                log_line(text)
        image = client.images.get(spec.tag)
    except docker.errors.DockerException as e:
        raise ToolchainError(_sdk_error(f"building {spec.tag} failed", e),
                             f"is the base image {spec.base_image} present or pullable?") from e
    return image


def image_ref(image: Any) -> dict[str, str]:
    """Tag and content ID (and registry digest when there is one) of an image, for build records."""
    tags = [short_tag(t) for t in image.tags]
    digests = list(image.attrs.get("RepoDigests") or [])
    return {"image": tags[0] if tags else "", "image_id": str(image.id), "image_digest": digests[0] if digests else ""}
