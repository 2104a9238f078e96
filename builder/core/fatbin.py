"""Slicing the GPU code of a shared object down to one architecture, without recompiling or relinking.

nvcc puts each translation unit's GPU code into the ``.nv_fatbin`` section as one fatbin container: a 16-byte
header (magic ``0xBA55ED50``, version, header size, size of the entries) followed by entries, each a header
(kind: 1 PTX, 2 SASS cubin; its own header size and padded payload size; the arch number at byte 28) and its
payload. The CUDA runtime registers each container through a ``__fatBinC_Wrapper_t`` pointing at its start and
walks the entries up to the size in its header.

A slice keeps, in every container, the entries of the wanted arch, moves them to the container's front, writes the
smaller size into its header and zeroes the rest. Nothing moves in the file (no offset or relocation changes), so
the shared object stays valid; the zeroed bytes cost almost nothing once deflated in a wheel (the installed file
keeps its size). The result is checked by the same inspection as any wheel (cuobjdump lists only the kept arch).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from builder.core.elf import elf_section_span

MAGIC = 0xBA55ED50
SECTION = ".nv_fatbin"
_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries after the header
_ENTRY = struct.Struct("<HHIQ")  # kind, version, header size, padded payload size
_ARCH_AT = 28  # the entry header's arch number (90, 120, ...)
KINDS = {1: "ptx", 2: "sass"}


class FatbinError(ValueError):
    """The section is not the fatbin layout this module knows: nothing is written."""


@dataclass(frozen=True)
class Entry:
    kind: str  # "sass" | "ptx" | "kind-N"
    arch: int
    start: int  # offset in the section of the entry's header
    length: int  # header and payload


@dataclass(frozen=True)
class Container:
    start: int  # offset in the section of the container's header
    header_size: int
    entries: tuple[Entry, ...]

    @property
    def end(self) -> int:
        return self.start + self.header_size + sum(e.length for e in self.entries)


def containers(section: bytes) -> list[Container]:
    """Every fatbin container of a ``.nv_fatbin`` section, in order (zero padding between them skipped)."""
    found: list[Container] = []
    pos = 0
    while pos < len(section):
        if section[pos] == 0:  # padding between containers, or what a slice zeroed
            nonzero = len(section) - len(section[pos:].lstrip(b"\0"))
            pos = nonzero
            continue
        if pos + _HEADER.size > len(section):
            raise FatbinError(f"{len(section) - pos} stray bytes at the end of {SECTION}")
        magic, _version, header_size, size = _HEADER.unpack_from(section, pos)
        if magic != MAGIC:
            raise FatbinError(f"no fatbin container at offset {pos} of {SECTION} (found 0x{magic:08x})")
        end = pos + header_size + size
        if end > len(section):
            raise FatbinError(f"the fatbin container at offset {pos} runs past the end of {SECTION}")
        found.append(Container(pos, header_size, tuple(_entries(section, pos + header_size, end))))
        pos = end
    return found


def _entries(section: bytes, pos: int, end: int) -> list[Entry]:
    out = []
    while pos < end:
        kind, _version, header_size, size = _ENTRY.unpack_from(section, pos)
        (arch,) = struct.unpack_from("<I", section, pos + _ARCH_AT)
        length = header_size + size
        if header_size < _ARCH_AT + 4 or pos + length > end:
            raise FatbinError(f"a fatbin entry at offset {pos} of {SECTION} does not fit its container")
        out.append(Entry(KINDS.get(kind, f"kind-{kind}"), arch, pos, length))
        pos += length
    return out


def shared_object_code(data: bytes) -> list[Container]:
    """The fatbin containers of a shared object; [] when it carries no GPU code (or is no 64-bit ELF file)."""
    try:
        span = elf_section_span(data, SECTION)
    except ValueError:
        return []
    if span is None:
        return []
    offset, size = span
    return containers(data[offset:offset + size])


def keep_only(data: bytes, keep: Callable[[Entry], bool]) -> bytes:
    """``data`` (a shared object) with only the fatbin entries ``keep`` accepts. FatbinError when a container
    would be left with none: a translation unit whose kernels the slice cannot run is no slice."""
    span = elf_section_span(data, SECTION)
    if span is None:
        return data
    offset, size = span
    section = bytearray(data[offset:offset + size])
    for container in containers(bytes(section)):
        kept = [e for e in container.entries if keep(e)]
        if not kept:
            have = ", ".join(f"{e.kind} {e.arch}" for e in container.entries)
            raise FatbinError(f"the fatbin container at offset {container.start} of {SECTION} keeps no entry "
                              f"(it carries {have})")
        body = b"".join(bytes(section[e.start:e.start + e.length]) for e in kept)
        first = container.start + container.header_size
        section[first:container.end] = body + bytes(container.end - first - len(body))
        struct.pack_into("<Q", section, container.start + 8, len(body))
    return data[:offset] + bytes(section) + data[offset + size:]


def sass_only(arch: int) -> Callable[[Entry], bool]:
    """The cubins of one arch, no PTX: what a thin variant for that GPU carries."""
    return lambda entry: entry.kind == "sass" and entry.arch == arch
