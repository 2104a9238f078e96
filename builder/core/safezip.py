"""A zip archive extracted safely: its central directory walked in bounded memory before zipfile reads it, every
member checked against core/archivelimits.py's bounds before anything is written."""

from __future__ import annotations

import stat
import struct
import zipfile
import zlib
from pathlib import Path
from typing import BinaryIO

from builder.core import archivelimits as limits  # the bounds, read at call time (tests lower them)
from builder.core.errors import SourceError


def safe_extract_zip(archive: Path, dest: Path) -> None:
    """Bounded like a tar: the central directory is walked (count, name bytes) before zipfile reads it whole."""
    prescan_zip(archive)
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            if len(infos) > limits.MAX_MEMBERS:
                raise SourceError(f"{archive.name}: more than {limits.MAX_MEMBERS} members; archive refused")
            kinds: dict[tuple[str, ...], str] = {}
            total = 0
            for info in infos:
                is_dir = info.filename.endswith("/")  # ZipInfo.is_dir() fails on an empty name
                parts = limits.check_member_name(archive, info.filename, is_dir=is_dir)
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode):
                    raise SourceError(f"{archive.name}: member {limits.short(info.filename)} is a link or device; refused")
                total += info.file_size
                if total > limits.MAX_UNPACKED_BYTES:
                    raise SourceError(f"{archive.name}: unpacks to too much data (a decompression bomb?); refused")
                if parts:
                    limits.add_kind(archive, kinds, parts, "dir" if is_dir else "file")
            limits.check_tree_shape(archive, kinds)
            try:
                zf.extractall(dest)
            except OSError as e:
                raise SourceError(f"{archive.name}: extracting failed: {e}") from e
    except (zipfile.BadZipFile, zipfile.LargeZipFile, NotImplementedError, ValueError, EOFError, zlib.error) as e:
        raise SourceError(f"{archive.name}: not a readable zip archive: {e}") from e


_ZIP_END = struct.Struct("<4s4H2LH")  # end of central directory record
_ZIP64_END = struct.Struct("<4sQ2H2L4Q")
_ZIP_ENTRY = struct.Struct("<4s4B4HL2L5H2L")  # central directory file header (46 bytes)


def prescan_zip(archive: Path) -> None:
    """Count the central directory's entries and their name/extra/comment bytes, in bounded memory, where zipfile
    would find them (its end-record search, mirrored); zipfile then reads a directory known to be bounded."""
    try:
        with archive.open("rb") as f:
            found = _zip_directory(f)
            if found is None:
                return  # not a zip: zipfile says so
            start, size = found
            limit = _ZIP_ENTRY.size * limits.MAX_MEMBERS + limits.MAX_HEADER_TOTAL
            if size > limit:
                raise SourceError(f"{archive.name}: a central directory of {size} bytes (more than {limit}); "
                                  "archive refused")
            f.seek(start)
            _walk_zip_directory(archive, f.read(size))
    except (OSError, struct.error, ValueError) as e:
        raise SourceError(f"{archive.name}: not a readable zip archive: {e}") from e


def _zip_directory(f: BinaryIO) -> tuple[int, int] | None:
    """(start, size) of the central directory as zipfile computes it: the end record is last, or within the last
    64 KiB (after a comment); a zip64 end record sits right before its locator, before the end record."""
    f.seek(0, 2)
    filesize = f.tell()
    tail_start = max(filesize - (1 << 16) - _ZIP_END.size, 0)
    f.seek(tail_start)
    tail = f.read()
    last = len(tail) - _ZIP_END.size
    if last >= 0 and tail[last:last + 4] == b"PK\x05\x06" and tail[-2:] == b"\0\0":
        at = last
    else:
        at = tail.rfind(b"PK\x05\x06")
        if at < 0 or at + _ZIP_END.size > len(tail):
            return None
    end = _ZIP_END.unpack_from(tail, at)
    size, location = end[5], tail_start + at
    if location >= 20 + _ZIP64_END.size:
        f.seek(location - 20)
        locator = f.read(20)
        if locator[:4] == b"PK\x06\x07":
            f.seek(location - 20 - _ZIP64_END.size)
            record = f.read(_ZIP64_END.size)
            if record[:4] == b"PK\x06\x06":
                size, location = _ZIP64_END.unpack(record)[8], location - 20 - _ZIP64_END.size
    return max(location - size, 0), size


def _walk_zip_directory(archive: Path, data: bytes) -> None:
    pos = count = header_bytes = 0
    while pos + _ZIP_ENTRY.size <= len(data) and data[pos:pos + 4] == b"PK\x01\x02":
        entry = _ZIP_ENTRY.unpack_from(data, pos)
        variable = entry[12] + entry[13] + entry[14]  # name, extra field, comment
        count += 1
        header_bytes += variable
        if count > limits.MAX_MEMBERS:
            raise SourceError(f"{archive.name}: more than {limits.MAX_MEMBERS} members; archive refused")
        if header_bytes > limits.MAX_HEADER_TOTAL:
            raise SourceError(f"{archive.name}: its member names and extra fields hold more than "
                              f"{limits.MAX_HEADER_TOTAL // 1024**2} MiB in all; archive refused")
        pos += _ZIP_ENTRY.size + variable
