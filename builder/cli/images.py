"""Commands about the docker toolchain's build images: `builder images build` and `builder images list`."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

from builder.cli.common import out
from builder.core.errors import ToolchainError
from builder.core.log import log
from builder.model.platform import parse_platform, this_machine
from builder.toolchain.container import connect
from builder.toolchain.images import build_image, find_image, image_ref, image_spec, list_images, short_tag


def register(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> dict:
    p = sub.add_parser("images", help="build or list the docker toolchain's CUDA build images")
    isub = p.add_subparsers(dest="images_command", required=True)
    build = isub.add_parser("build", help="build (if stale or missing) the image for one or more CUDA versions")
    build.add_argument("--cuda", action="append", required=True,
                       help="CUDA line with an image (12.8, 12.9, 13.0, 13.2: IMAGE_CUDAS); repeatable")
    build.add_argument("--base-image", help="replace the template's BASE_IMAGE (a local stand-in for the manylinux image)")
    build.add_argument("--platform", help="x86_64 or aarch64 (NVIDIA's sbsa packages on a manylinux "
                       "aarch64 base, built on an arm64 machine); default: this machine's")
    build.add_argument("--force", action="store_true", help="rebuild even when the tagged image exists")
    isub.add_parser("list", help="list the build images on the container engine")
    return {"images": cmd_images}


def _client() -> Any:  # a docker SDK client (untyped), as container.connect returns it
    client = connect(os.environ)
    if client is None:
        raise ToolchainError(
            f"no container engine answers (DOCKER_HOST={os.environ.get('DOCKER_HOST', 'unset')})",
            "start Docker or `podman system service unix:///PATH.sock` and set DOCKER_HOST",
        )
    return client


def cmd_images(args: argparse.Namespace) -> int:
    client = _client()
    try:
        if args.images_command == "list":
            for image in list_images(client):
                labels = image.labels
                out.print(f"{', '.join(short_tag(t) for t in image.tags)}  id {image.short_id}  CUDA {labels.get('org.cuda-wheel-builder.cuda')}"
                          f"  platform {labels.get('org.cuda-wheel-builder.platform', 'x86_64')}"
                          f"  base {labels.get('org.cuda-wheel-builder.base-image')}", markup=False)
            return 0
        platform = parse_platform(args.platform) if args.platform else this_machine()
        for cuda in args.cuda:
            spec = image_spec(cuda, args.base_image, platform=platform)
            image = None if args.force else find_image(client, spec, any_base=False)
            if image is not None:
                out.print(f"up to date: {spec.tag} (id {image.short_id}, base {spec.base_image})", markup=False)
                continue
            start = time.monotonic()
            log.info(f"building {spec.tag} from {spec.dockerfile.name} on {spec.base_image}")
            image = build_image(client, spec, log_line=lambda line: log.info(f"  {line}"))
            ref = image_ref(image)
            out.print(f"built: {spec.tag} (id {ref['image_id']}) in {time.monotonic() - start:.0f}s", markup=False)
        return 0
    finally:
        client.close()
