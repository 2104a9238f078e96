"""The CPU platform a wheel is built for (``--platform x86_64|aarch64``), and the GPU archs each one's machines carry.

NVIDIA's Arm machines are servers with the SBSA CUDA toolkit: GH200 (sm_90), GB200 (sm_100), GB300 (sm_103), Jetson
Thor (sm_110, SBSA from CUDA 13) and DGX Spark / GB10 (sm_121); no x86_64 machine carries sm_110 or sm_121. Jetson
boards before Thor (sm_53, 62, 72, 87) run JetPack's own CUDA and torch, not PyPI's aarch64 wheels, so neither
platform's wheels serve them. PyPI's aarch64 torch wheels are ``manylinux_2_28_aarch64`` (docs/BUILDS.md "aarch64").
"""

from __future__ import annotations

import platform as _platform
from dataclasses import dataclass

from builder.core.errors import UsageError
from builder.model.arch import Arch

ELF_NAMES = {"x86_64": "x86-64", "aarch64": "AArch64"}  # readelf's names of each platform's ELF machine
# GPUs only NVIDIA's Arm machines carry, and why: the refusal names the machine
ARM_ONLY_ARCHS: dict[int, str] = {110: "Jetson Thor", 121: "DGX Spark / GB10"}
# Jetson boards before Thor: JetPack's own CUDA and torch, not PyPI's (neither platform's wheels serve them)
JETPACK_ARCHS: dict[int, str] = {53: "Jetson Nano", 62: "Jetson TX2", 72: "Jetson Xavier", 87: "Jetson Orin"}


@dataclass(frozen=True)
class Platform:
    """One CPU platform: its name (``uname -m``), the wheel platform tags and the archs its machines carry."""

    name: str  # x86_64 | aarch64
    default_archs: tuple[int, ...]  # the farm's and docs' arch list for this platform (datacenter + Blackwell)
    never: tuple[int, ...]  # SASS archs no machine of this platform carries
    cross_prefix: str  # the GNU triplet's prefix of its cross compilers (``aarch64-linux-gnu-``)
    qemu: str  # the qemu-user binary that runs its programs on another machine ("" where none is needed)
    runner: str  # the GitHub Actions runner label that builds natively for it

    @property
    def manylinux_tag(self) -> str:
        """What PyPI's CUDA torch wheels are tagged (and what auditwheel repairs our wheels to)."""
        return f"manylinux_2_28_{self.name}"

    @property
    def uv_platform(self) -> str:
        """uv's ``--python-platform`` for this platform's manylinux_2_28 wheels."""
        return f"{self.name}-manylinux_2_28"

    @property
    def elf_machine(self) -> str:
        """What ``readelf -h`` and ``file`` call its CPU."""
        return ELF_NAMES[self.name]

    def carries(self, arch: Arch) -> str | None:
        """None if some machine of this platform has a GPU of ``arch``, else why none does."""
        if arch.number in self.never:
            other = "x86_64" if self.name == "aarch64" else "aarch64"
            machine = ARM_ONLY_ARCHS.get(arch.number) or JETPACK_ARCHS.get(arch.number, "")
            if arch.number in JETPACK_ARCHS:
                return (f"sm_{arch.number} is a {machine} GPU, which runs JetPack's own CUDA and torch, not PyPI's "
                        "wheels")
            return f"no {self.name} machine carries sm_{arch.number} ({machine} is {other})"
        return None

    def __str__(self) -> str:
        return self.name


X86_64 = Platform("x86_64", (90, 100, 103, 120), (53, 62, 72, 87, 110, 121), "x86_64-linux-gnu-", "qemu-x86_64",
                  "ubuntu-24.04")
AARCH64 = Platform("aarch64", (90, 100, 103, 110, 121), (53, 62, 72, 87), "aarch64-linux-gnu-", "qemu-aarch64",
                   "ubuntu-24.04-arm")
PLATFORMS: dict[str, Platform] = {p.name: p for p in (X86_64, AARCH64)}
_ALIASES = {"amd64": "x86_64", "x64": "x86_64", "arm64": "aarch64", "sbsa": "aarch64"}


def parse_platform(text: str, flag: str = "--platform") -> Platform:
    """``x86_64``/``amd64`` or ``aarch64``/``arm64``/``sbsa`` (a wheel tag's ``linux_aarch64`` too)."""
    name = text.strip().lower().removeprefix("linux_").removeprefix("manylinux_2_28_")
    name = _ALIASES.get(name, name)
    if name not in PLATFORMS:
        raise UsageError(f"{flag}: {text!r} is not a platform the builder knows",
                         f"use one of {', '.join(PLATFORMS)}")
    return PLATFORMS[name]


def this_machine() -> Platform:
    """The platform of the machine the builder runs on (x86_64 where ``uname -m`` names neither)."""
    return PLATFORMS.get(_platform.machine(), X86_64)


def of_wheel_platform(tag: str) -> Platform | None:
    """The platform of a wheel platform tag (``manylinux_2_28_aarch64`` → aarch64); None for ``any`` and others."""
    for p in PLATFORMS.values():
        if tag.endswith("_" + p.name) or tag == p.name:
            return p
    return None


def check_archs_for_platform(archs: tuple[Arch, ...], target: Platform) -> None:
    """Refuse an arch no machine of ``target`` carries, with the reason and the way forward."""
    for arch in archs:
        why = target.carries(arch)
        if why is None:
            continue
        cure = ("leave it out" if arch.number in JETPACK_ARCHS
                else f"build it with --platform {'aarch64' if target.name == 'x86_64' else 'x86_64'}, or leave it out")
        raise UsageError(f"--arch {arch} for --platform {target}: {why}",
                         f"{cure}; {target} defaults to --arch {','.join(map(str, target.default_archs))}")
