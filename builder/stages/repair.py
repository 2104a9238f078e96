"""The repair check: what a wheel's platform tag promises, the glibc its objects really need, what it vendors.

auditwheel (run by cibuildwheel in the container toolchain) decides the manylinux tag from the symbol versions of
the wheel's shared objects; this stage reads the result back on the host: the platform tag, the glibc symbol
floor (the highest ``GLIBC_x.y`` any object needs, from its version-needs section), and the libraries grafted into
``<pkg>.libs/``. A wheel that vendors libtorch, libc10 or the CUDA runtime is refused: it would load a second copy
of torch's or CUDA's runtime beside the installed torch's (two CUDA contexts, two allocators, ABI mismatch).
"""

from __future__ import annotations

import fnmatch
import re
import struct
from dataclasses import dataclass
from pathlib import Path

from builder.core.elf import elf_sections
from builder.core.errors import InspectError, PortabilityError
from builder.core.wheelfile import parse_wheel_name, read_entries

# never inside a wheel: torch's own libraries and CUDA's runtime (they come with the installed torch / the driver)
FORBIDDEN_VENDORED = ("libtorch*", "libc10*", "libcudart*", "libcuda.so*", "libnvrtc*", "libcublas*", "libcudnn*",
                      "libnccl*")
_GLIBC_RE = re.compile(r"\bGLIBC_(\d+)\.(\d+)(?:\.\d+)?\b")
_MANYLINUX_RE = re.compile(r"^manylinux_(\d+)_(\d+)_")
_LEGACY = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


@dataclass(frozen=True)
class PortabilityReport:
    wheel: str
    platforms: tuple[str, ...]  # e.g. ("manylinux_2_28_x86_64",) or ("linux_x86_64",)
    glibc_floor: tuple[int, int] | None  # the highest GLIBC_x.y symbol version needed; None for a pure wheel
    vendored: tuple[str, ...]  # files under <pkg>.libs/ (what auditwheel grafted in)

    @property
    def tagged_glibc(self) -> tuple[int, int] | None:
        """The glibc a manylinux tag promises is enough (the lowest over the tags); None for linux_* tags."""
        found = [v for v in (platform_glibc(p) for p in self.platforms) if v]
        return min(found) if found else None

    @property
    def forbidden(self) -> tuple[str, ...]:
        return tuple(v for v in self.vendored
                     if any(fnmatch.fnmatch(Path(v).name, pat) for pat in FORBIDDEN_VENDORED))

    def render(self) -> str:
        floor = "none (no compiled objects)" if self.glibc_floor is None else "glibc {}.{}".format(*self.glibc_floor)
        return "\n".join([f"  platform: {' '.join(self.platforms)}", f"  glibc floor: {floor}",
                          f"  vendored: {' '.join(self.vendored) or 'nothing'}"])


def platform_glibc(platform: str) -> tuple[int, int] | None:
    match = _MANYLINUX_RE.match(platform)
    if match:
        return int(match.group(1)), int(match.group(2))
    return next((v for k, v in _LEGACY.items() if platform.startswith(k + "_")), None)


def glibc_floor(path: Path) -> tuple[int, int] | None:
    """The highest GLIBC_x.y version the ELF file at ``path`` needs (``glibc_floor_of``)."""
    return glibc_floor_of(path.read_bytes(), path.name)


def glibc_floor_of(data: bytes, name: str = "the object") -> tuple[int, int] | None:
    """The highest GLIBC_x.y version an ELF object needs: the names of its version-needs entries
    (``.gnu.version_r``, the entries ``readelf -V`` lists under "Version needs section", names in ``.dynstr``).
    Read from the bytes: no temp file to leak when a build is killed, no binutils."""
    try:
        sections = elf_sections(data)
    except (ValueError, struct.error) as e:
        raise InspectError(f"cannot read {name} as a 64-bit ELF object: {e}") from e
    needs, strings = sections.get(".gnu.version_r", b""), sections.get(".dynstr", b"")
    versions = []
    at = 0
    while needs and at + 16 <= len(needs):
        _, count, _, aux, following = struct.unpack_from("<HHIII", needs, at)
        entry = at + aux
        for _ in range(count):
            _, _, _, name_at, next_aux = struct.unpack_from("<IHHII", needs, entry)
            match = _GLIBC_RE.fullmatch(strings[name_at:strings.index(b"\0", name_at)].decode("ascii", "replace"))
            if match:
                versions.append((int(match.group(1)), int(match.group(2))))
            if not next_aux:
                break
            entry += next_aux
        if not following:
            break
        at += following
    return max(versions) if versions else None


def portability_report(wheel: Path) -> PortabilityReport:
    _, _, _, tags = parse_wheel_name(wheel.name)
    platforms = tuple(sorted({t.platform for t in tags}))
    entries = read_entries(wheel)
    objects = [n for n in entries if n.endswith(".so") or ".so." in Path(n).name]
    vendored = tuple(sorted(n for n in objects if n.split("/", 1)[0].endswith(".libs")))
    floors = [floor for name in objects if (floor := glibc_floor_of(entries[name], name)) is not None]
    return PortabilityReport(wheel.name, platforms, max(floors) if floors else None, vendored)


def check_portability(report: PortabilityReport) -> None:
    """Refuse a wheel that vendors torch/CUDA runtimes, or whose objects need a newer glibc than its tag says."""
    if report.forbidden:
        raise PortabilityError(f"{report.wheel} vendors {', '.join(Path(f).name for f in report.forbidden)}: "
                               "it would load a second torch/CUDA runtime beside the installed torch's",
                               "repair it with auditwheel's --exclude for libtorch*.so, libc10*.so, libcudart.so.* "
                               "(builder.toolchain.cibw.EXCLUDED_LIBS)")
    tagged = report.tagged_glibc
    if tagged and report.glibc_floor and report.glibc_floor > tagged:
        raise PortabilityError(f"{report.wheel} is tagged for glibc {tagged[0]}.{tagged[1]} but needs "
                               f"GLIBC_{report.glibc_floor[0]}.{report.glibc_floor[1]}",
                               "let auditwheel choose the tag (--plat auto) or build in an older manylinux image")
