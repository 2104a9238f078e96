"""Build images for the docker toolchain: one per CUDA version and platform, from
``dockerfiles/manylinux-cuda-X.Y.Dockerfile`` (x86_64) and ``dockerfiles/manylinux-aarch64-cuda-X.Y.Dockerfile``
(aarch64: NVIDIA's sbsa packages, built natively on an arm64 machine such as GitHub's ubuntu-24.04-arm): a
manylinux_2_28 image plus CUDA X.Y, what cibuildwheel builds in (toolchain/cibw.py).

The tag encodes the CUDA version, the platform where it is not x86_64, and a hash of the Dockerfile plus its build
arguments (``cuda-wheel-builder:cuda12.8-<12 hex>``, ``cuda-wheel-builder:cuda13.0-aarch64-<12 hex>``), so an
edited Dockerfile or another base image gives another tag and a stale image is never reused. Images carry labels
naming their CUDA, Dockerfile hash, platform and base image, so the
toolchain can also find an image built from the current Dockerfile on a substitute base (``--base-image``).
Everything goes through the docker SDK (Docker, or podman's Docker-API service).

A recipe's ``[build] cuda-components`` that the Dockerfile does not install already (it has cublas, cusparse,
cusolver, curand, cufft, nvrtc, nvtx and the profiler API) make another image: the Dockerfile with
``cuda-components.Dockerfile.part`` appended and the rpms in the ``EXTRA_PACKAGES`` build argument, both hashed
into its tag. Without such components the spec, its tag and its build are exactly what they were before.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from builder.core.datafiles import data_dir
from builder.core.errors import ToolchainError, UsageError
from builder.model.cuda import CudaVersion
from builder.model.cudacomponents import components_of
from builder.model.platform import X86_64, Platform

# `import docker` stands in the functions that talk to an engine, on purpose: it is slow to import (~170 ms) and
# only the docker toolchain and `builder images` need it (toolchain/container.py does the same).

REPOSITORY = "cuda-wheel-builder"
DOCKERFILES = data_dir("dockerfiles")  # packaged copy in an installed wheel, else the checkout
LABEL_CUDA = "org.cuda-wheel-builder.cuda"
LABEL_DOCKERFILE = "org.cuda-wheel-builder.dockerfile-sha256"
LABEL_BASE = "org.cuda-wheel-builder.base-image"
LABEL_KEY = "org.cuda-wheel-builder.key"
LABEL_PACKAGES = "org.cuda-wheel-builder.extra-packages"  # only on images with EXTRA_PACKAGES
LABEL_PLATFORM = "org.cuda-wheel-builder.platform"
EXTRAS_PART = "cuda-components.Dockerfile.part"


@dataclass(frozen=True)
class ImageSpec:
    """What one image is built from: a Dockerfile and its build arguments; ``tag`` follows from both."""

    cuda: str
    dockerfile: Path
    buildargs: dict[str, str]
    extras_part: Path | None = None  # appended to the Dockerfile when buildargs has EXTRA_PACKAGES
    platform: Platform = X86_64  # the CPU of the image (and of the wheels built in it)

    def dockerfile_text(self) -> bytes:
        """What the image is built from: the Dockerfile, with the extra components' part appended if any."""
        text = self.dockerfile.read_bytes()
        if self.extras_part is None:
            return text
        return text + (b"" if text.endswith(b"\n") else b"\n") + self.extras_part.read_bytes()

    @property
    def extra_packages(self) -> str:
        return self.buildargs.get("EXTRA_PACKAGES", "")

    @property
    def dockerfile_sha256(self) -> str:
        return hashlib.sha256(self.dockerfile_text()).hexdigest()

    @property
    def key(self) -> str:
        text = self.dockerfile_text() + json.dumps(self.buildargs, sort_keys=True).encode()
        return hashlib.sha256(text).hexdigest()[:12]

    @property
    def tag(self) -> str:
        arch = "" if self.platform == X86_64 else f"{self.platform}-"  # x86_64 tags stay as they were
        return f"{REPOSITORY}:cuda{self.cuda}-{arch}{self.key}"

    @property
    def base_image(self) -> str:
        return self.buildargs.get("BASE_IMAGE") or default_base_image(self.dockerfile)

    def labels(self) -> dict[str, str]:
        labels = {LABEL_CUDA: self.cuda, LABEL_DOCKERFILE: self.dockerfile_sha256, LABEL_BASE: self.base_image,
                  LABEL_KEY: self.key, LABEL_PLATFORM: self.platform.name}
        return labels | {LABEL_PACKAGES: self.extra_packages} if self.extra_packages else labels


DOCKERFILE_PREFIX = "manylinux-cuda-"


def dockerfile_prefix(platform: Platform = X86_64) -> str:
    """``manylinux-cuda-`` (x86_64, the names from before the platform axis), ``manylinux-aarch64-cuda-``."""
    return DOCKERFILE_PREFIX if platform == X86_64 else f"manylinux-{platform}-cuda-"


def dockerfile_for(key: str, dockerfiles: Path = DOCKERFILES, platform: Platform = X86_64) -> Path:
    return dockerfiles / f"{dockerfile_prefix(platform)}{key}.Dockerfile"


def available_cudas(dockerfiles: Path = DOCKERFILES, platform: Platform = X86_64) -> list[str]:
    prefix = dockerfile_prefix(platform)
    return sorted((p.name.removeprefix(prefix).removesuffix(".Dockerfile")
                   for p in dockerfiles.glob(f"{prefix}*.Dockerfile")), key=Version)


def default_base_image(dockerfile: Path) -> str:
    for line in dockerfile.read_text().splitlines():
        if line.startswith("ARG BASE_IMAGE="):
            return line.split("=", 1)[1].strip()
    return ""


def image_spec(cuda: CudaVersion | str, base_image: str | None = None, dockerfiles: Path = DOCKERFILES,
               components: tuple[str, ...] = (), platform: Platform = X86_64) -> ImageSpec:
    """The image for ``cuda`` (a CUDA's line, or the key as given to ``builder images build --cuda``) on
    ``platform``: an aarch64 image is built and run on an arm64 machine (its base is a manylinux_2_28_aarch64
    image; emulating a whole compile under qemu is not an option worth its hours)."""
    key = cuda if isinstance(cuda, str) else cuda.line
    dockerfile = dockerfile_for(key, dockerfiles, platform)
    if not dockerfile.is_file():
        where = "" if platform == X86_64 else f" on {platform}"
        raise UsageError(f"no Dockerfile for CUDA {key}{where} ({dockerfile} missing)",
                         f"available{where}: {', '.join(available_cudas(dockerfiles, platform)) or 'none'}")
    buildargs = {"BASE_IMAGE": base_image} if base_image else {}
    extra = extra_packages(dockerfile, key, components)  # components: a recipe's cuda-components
    if not extra:
        return ImageSpec(key, dockerfile, buildargs, platform=platform)
    return ImageSpec(key, dockerfile, buildargs | {"EXTRA_PACKAGES": " ".join(extra)}, dockerfiles / EXTRAS_PART,
                     platform=platform)


def extra_packages(dockerfile: Path, cuda: str, components: tuple[str, ...]) -> list[str]:
    """The rhel8 rpms of ``components`` for CUDA ``cuda`` ("12.8") that ``dockerfile`` does not install, sorted."""
    installed = set(dockerfile.read_text().split())
    return sorted({c.rpm(cuda) for c in components_of(components)} - installed)


def _sdk_error(what: str, e: Exception) -> str:
    text = str(getattr(e, "explanation", None) or e).strip().splitlines()
    return f"{what}: {text[-1] if text else type(e).__name__}"[:400]


def find_image(client: Any, spec: ImageSpec, *, any_base: bool = True) -> Any | None:
    """The image for ``spec``: its exact tag, else (``any_base``) the newest one built from the same Dockerfile
    for the same CUDA on another base image (a local stand-in); None if there is none."""
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
    """Build and tag ``spec`` through the SDK; build output goes to ``log_line``; a one-line ToolchainError on failure."""
    if spec.extras_part is None:
        return _build(client, spec, spec.dockerfile.parent, spec.dockerfile.name, log_line)
    with tempfile.TemporaryDirectory(prefix="cwb-dockerfile-") as tmp:  # the Dockerfiles COPY nothing: a folder
        (Path(tmp) / "Dockerfile").write_bytes(spec.dockerfile_text())  # with the combined text is the context
        return _build(client, spec, Path(tmp), "Dockerfile", log_line)


def _build(client: Any, spec: ImageSpec, context: Path, dockerfile: str, log_line: Any) -> Any:
    import docker

    try:
        stream = client.api.build(
            path=str(context), dockerfile=dockerfile, tag=spec.tag, buildargs=spec.buildargs,
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
