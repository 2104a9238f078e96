"""The sections of a 64-bit ELF file by name: enough to compare cubins section by section (a cubin is an ELF)."""

from __future__ import annotations

import struct
from pathlib import Path

# ELF e_machine values of the platforms the builder knows
ELF_MACHINES = {0x3E: "x86_64", 0xB7: "aarch64"}


def _section_heads(data: bytes) -> tuple[list[tuple[int, ...]], bytes]:
    """The section headers of a 64-bit little-endian ELF file and its section-name table. ValueError if it is not
    one."""
    if data[:5] != b"\x7fELF\x02":
        raise ValueError("not a 64-bit ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    return heads, data[heads[shstrndx][4]:heads[shstrndx][4] + heads[shstrndx][5]]


def _name(names: bytes, head: tuple[int, ...]) -> bytes:
    return names[head[0]:names.index(b"\0", head[0])]


def elf_sections(data: bytes) -> dict[str, bytes]:
    """A 64-bit little-endian ELF's sections by name (NOBITS sections are empty). ValueError if it is not one."""
    heads, names = _section_heads(data)
    return {_name(names, h).decode(): b"" if h[1] == 8 else data[h[4]:h[4] + h[5]] for h in heads}


def elf_section_span(data: bytes, name: str) -> tuple[int, int] | None:
    """Where a 64-bit little-endian ELF file holds the section ``name``: (file offset, size); None if it has none
    (or it is a NOBITS section). ValueError if the data is not such an ELF file."""
    heads, names = _section_heads(data)
    return next(((h[4], h[5]) for h in heads if _name(names, h) == name.encode() and h[1] != 8), None)


def elf_machine(path: Path) -> str | None:
    """The CPU an ELF file is for (``x86_64``, ``aarch64``, ``em-N`` for others); None if it is not an ELF file."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    (machine,) = struct.unpack_from("<H" if head[5] == 1 else ">H", head, 18)
    return ELF_MACHINES.get(machine, f"em-{machine}")
