"""The one Dockerfile template and the build arguments toolchain/images.py fills it with agree (issue 53 item 5)."""

from __future__ import annotations

import re

from builder.model.platform import PLATFORMS
from builder.toolchain.images import DOCKERFILES, TEMPLATE, available_cudas, image_spec

DECLARED = re.compile(r"^ARG\s+([A-Z_]+)(=.*)?$", re.MULTILINE)


def _declared() -> dict[str, bool]:
    """The template's ARGs, each with whether it has a default."""
    text = (DOCKERFILES / TEMPLATE).read_text()
    return {m.group(1): m.group(2) is not None for m in DECLARED.finditer(text)}


def test_every_argument_passed_is_declared_and_every_argument_without_a_default_is_passed() -> None:
    declared = _declared()
    assert set(declared) == {"BASE_IMAGE", "CUDA_VERSION", "CUDA_REPO", "CUDA_PACKAGES", "EXTRA_PACKAGES"}
    for platform in PLATFORMS.values():
        for cuda in available_cudas(platform):
            for components in ((), ("nvjitlink",)):
                args = image_spec(cuda, components=components, platform=platform).buildargs
                assert set(args) <= set(declared), set(args) - set(declared)  # docker warns and ignores others
                required = {name for name, has_default in declared.items() if not has_default}
                assert required <= set(args), (cuda, platform, required - set(args))
                assert all(v.strip() for v in args.values()), args


def test_the_template_uses_only_what_it_declares() -> None:
    text = (DOCKERFILES / TEMPLATE).read_text()
    used = set(re.findall(r"\$\{([A-Z_]+)\}", text)) - {"PATH"}
    assert used <= set(_declared()), used - set(_declared())


def test_each_cuda_and_platform_is_its_own_image() -> None:
    specs = [image_spec(cuda, platform=p) for p in PLATFORMS.values() for cuda in available_cudas(p)]
    assert len(specs) == 8  # what eight Dockerfiles were before
    assert len({s.tag for s in specs}) == len({s.dockerfile_sha256 for s in specs}) == len(specs)
    assert len({s.dockerfile for s in specs}) == 1
