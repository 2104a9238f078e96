"""A tar archive extracted safely: tarfile's own parser, with every header, name and link checked against the
whole archive's bounds (core/archivelimits.py) before anything is written."""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import re
import tarfile
import zlib
from collections import deque
from pathlib import Path, PurePosixPath

from builder.core import archivelimits as limits  # the bounds, read at call time (tests lower them)
from builder.core.errors import SourceError

MAX_HEADER_CHAIN = 16  # extended headers in a row before one member (tarfile recurses once for each)
MAX_PAX_RECORDS = 1000  # records in one pax header
MAX_GLOBAL_PAX_RECORDS = 64  # tarfile applies and copies every global record to each member that follows
MAX_DIGIT_RUN = 64  # a longer run of digits in a pax header costs tarfile <= 3.11.9 quadratic time (CVE-2024-6232)
_PAX_LENGTH = re.compile(rb"(\d{1,20}) ")  # a pax record's length field and the space after it
_HEADER_KINDS = {b"L": "GNU long-name", b"K": "GNU long-link", b"x": "pax", b"X": "pax", b"g": "pax global"}


class _TarStream:
    """The decompressed tar stream that tarfile reads, carrying the archive-wide header budget. While members
    are listed tarfile reads only headers through it (member data is skipped with seek), and _CheckedTarInfo
    checks each header against the budget before tarfile reads its data or recurses into the next one."""

    def __init__(self, archive: Path) -> None:
        self.archive = archive
        self._raw = _open_decompressed(archive)
        self._ahead = b""  # bytes peeked at by a check, returned by the next read
        self.header_bytes = 0  # pax / GNU long-name / long-link data so far
        self.global_records = 0
        self.chain = 0  # extended headers since the last member's own header

    def peek(self, size: int) -> bytes:
        self._ahead = self.read(size)
        return self._ahead

    def read(self, size: int = -1) -> bytes:
        ahead, self._ahead = self._ahead, b""
        if 0 <= size <= len(ahead):
            self._ahead = ahead[size:]
            return ahead[:size]
        return ahead + self._call(self._raw.read, size if size < 0 else size - len(ahead))

    def seek(self, offset: int, whence: int = 0) -> int:
        if whence == 1:
            offset, whence = self.tell() + offset, 0
        self._ahead = b""
        return self._call(self._raw.seek, offset, whence)

    def tell(self) -> int:
        return self._raw.tell() - len(self._ahead)

    def close(self) -> None:
        self._raw.close()

    def _call(self, method, *args):  # read or seek of the gzip/bz2/lzma/plain file
        try:
            return method(*args)
        except (OSError, EOFError, zlib.error, lzma.LZMAError) as e:
            raise SourceError(f"{self.archive.name}: not a readable tar archive: {e}") from e


def _open_decompressed(archive: Path) -> io.BufferedIOBase:
    """The archive's tar stream, by its magic bytes (gzip, bzip2, xz or plain)."""
    try:
        with archive.open("rb") as f:
            magic = f.read(6)
        if magic.startswith(b"\x1f\x8b"):
            return gzip.open(archive, "rb")
        if magic.startswith(b"BZh"):
            return bz2.open(archive, "rb")
        if magic.startswith(b"\xfd7zXZ\x00"):
            return lzma.open(archive, "rb")
        return archive.open("rb")
    except OSError as e:
        raise SourceError(f"{archive.name}: cannot read it: {e}") from e


class _CheckedTarInfo(tarfile.TarInfo):
    """tarfile's own header parser (so nothing is parsed twice, or differently), with the archive's bounds
    checked before each step: tarfile's source names ``_proc_member`` as the hook a subclass overrides."""

    __slots__ = ()

    def _proc_member(self, tar):  # tar: the TarFile, whose fileobj is our _TarStream
        _check_header(tar.fileobj, self)
        return super()._proc_member(tar)


def _check_header(stream: _TarStream, info: tarfile.TarInfo) -> None:
    name = stream.archive.name
    if info.size < 0:  # GNU base-256 can say so; tarfile would seek backwards and read the same headers again
        raise SourceError(f"{name}: a header with a negative size ({info.size}); archive refused")
    kind = _HEADER_KINDS.get(info.type)
    if kind is None:  # the member's own header ends a run of extended ones
        stream.chain = 0
        if info.type == tarfile.GNUTYPE_SPARSE:
            raise SourceError(f"{name}: member {limits.short(info.name)} is a GNU sparse file; archive refused")
        return
    stream.chain += 1
    if stream.chain > MAX_HEADER_CHAIN:
        raise SourceError(f"{name}: more than {MAX_HEADER_CHAIN} pax or GNU long-name headers in a row; "
                          "archive refused")
    if info.size > limits.MAX_HEADER_BYTES:
        raise SourceError(f"{name}: a {kind} header of {info.size} bytes (more than {limits.MAX_HEADER_BYTES // 1024} KiB); "
                          "archive refused")
    stream.header_bytes += info.size
    if stream.header_bytes > limits.MAX_HEADER_TOTAL:
        raise SourceError(f"{name}: its pax and GNU long-name headers hold more than {limits.MAX_HEADER_TOTAL // 1024**2} "
                          "MiB in all; archive refused")
    if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE):
        records = _check_pax(name, stream.peek(-(-info.size // 512) * 512))
        if info.type == tarfile.XGLTYPE:
            stream.global_records += records
            if stream.global_records > MAX_GLOBAL_PAX_RECORDS:
                raise SourceError(f"{name}: more than {MAX_GLOBAL_PAX_RECORDS} global pax records; archive refused")


def _check_pax(name: str, data: bytes) -> int:
    """Check a pax header as tarfile will parse it (records ``LEN KEY=VALUE\\n`` from the start while one begins
    with a digit, the block's padding included); returns the number of records. tarfile <= 3.11.9 rescans to the
    next ``=`` for each record and searches for ``hdrcharset`` from every digit: both quadratic on crafted input."""
    run = max((len(m) for m in re.findall(rb"\d{%d,}" % (MAX_DIGIT_RUN + 1), data)), default=0)
    if run:
        raise SourceError(f"{name}: a pax header with a run of {run} digits; archive refused")
    pos = count = 0
    while pos < len(data) and data[pos:pos + 1].isdigit():
        record = _pax_record(data, pos)
        if record is None:
            raise SourceError(f"{name}: a malformed pax header (record at byte {pos}); archive refused")
        keyword, end = record
        if keyword.startswith(b"GNU.sparse."):
            raise SourceError(f"{name}: a pax header describes a GNU sparse file; archive refused")
        count += 1
        if count > MAX_PAX_RECORDS:
            raise SourceError(f"{name}: a pax header with more than {MAX_PAX_RECORDS} records; archive refused")
        pos = end
    return count


def _pax_record(data: bytes, pos: int) -> tuple[bytes, int] | None:
    """The keyword and the end of the pax record at ``pos``; None when it is malformed."""
    length = _PAX_LENGTH.match(data, pos)
    if length is None:
        return None
    end = pos + int(length[1])
    keyword, equals, _ = data[length.end():end].partition(b"=")
    if not length.end() < end <= len(data) or data[end - 1:end] != b"\n" or not equals or not keyword:
        return None
    return keyword, end


def safe_extract_tar(archive: Path, dest: Path) -> None:
    """Refuse path traversal, links leaving the tree (also through other links), device files, odd names, files
    that are also folders, oversized headers and decompression bombs, all before anything is written; then
    extract. tarfile itself parses the headers, through _TarStream and _CheckedTarInfo, which bound the whole
    archive's header bytes, records and nesting while it reads."""
    stream = _TarStream(archive)
    try:
        with tarfile.TarFile(fileobj=stream, mode="r", tarinfo=_CheckedTarInfo) as tar:  # type: ignore[arg-type]
            members = _list_tar(archive, tar)
            _check_end(archive, stream, tar.offset)
            _check_paths_through_links(archive, members)
            try:
                tar.extractall(dest, members=members, filter="data")
            except tarfile.FilterError as e:
                raise SourceError(f"{archive.name}: refused by tarfile's data filter: {e}") from e
            except OSError as e:
                raise SourceError(f"{archive.name}: extracting failed: {e}") from e
    except (tarfile.TarError, ValueError, OverflowError, UnicodeError, RecursionError) as e:
        raise SourceError(f"{archive.name}: not a readable tar archive: {e}") from e
    finally:
        stream.close()


def _list_tar(archive: Path, tar: tarfile.TarFile) -> list[tarfile.TarInfo]:
    """Every member, checked as tarfile yields it (so the count and the sizes stop the listing, not follow it)."""
    members: list[tarfile.TarInfo] = []
    kinds: dict[tuple[str, ...], str] = {}
    total = 0
    for count, member in enumerate(tar, start=1):
        if count > limits.MAX_MEMBERS:
            raise SourceError(f"{archive.name}: more than {limits.MAX_MEMBERS} members; archive refused")
        member.pax_headers = {}  # extraction does not read them; each member held a copy of the global ones
        parts = limits.check_member_name(archive, member.name, is_dir=member.isdir())
        if member.ischr() or member.isblk() or member.isfifo() or member.isdev():
            raise SourceError(f"{archive.name}: member {limits.short(member.name)} is a device or fifo; archive refused")
        if member.issym() or member.islnk():
            _check_link(archive, member.name, member.linkname, hard=member.islnk())
        if member.islnk() and kinds.get(limits.member_parts(member.linkname)) != "file":
            raise SourceError(f"{archive.name}: hard link {limits.short(member.name)} -> {limits.short(member.linkname)} names "
                              "no file before it; archive refused")  # tarfile would search every member for it
        if not (member.isdir() or member.issym() or member.islnk()):
            total += member.size
        if total > limits.MAX_UNPACKED_BYTES:
            raise SourceError(f"{archive.name}: unpacks to more than {limits.MAX_UNPACKED_BYTES // 1024**2} MiB "
                              "(a decompression bomb?); archive refused")
        if parts:  # the top folder itself ("./") is not extracted
            limits.add_kind(archive, kinds, parts, "dir" if member.isdir() else "link" if member.issym() else "file")
            members.append(member)
    limits.check_tree_shape(archive, kinds)
    return members


MAX_TRAILER_BYTES = 1024 * 1024  # zero padding after the end-of-archive blocks (GNU tar pads to 10 KiB records)


def _check_end(archive: Path, stream: _TarStream, end: int) -> None:
    """tarfile ends the listing quietly at a damaged header, as if the archive ended there: what follows must be
    zero padding. Reading it to the end also checks a compressed stream's CRC, before anything is written."""
    stream.seek(end)
    left = MAX_TRAILER_BYTES
    while chunk := stream.read(min(1 << 16, left + 1)):
        if chunk.strip(b"\0"):
            raise SourceError(f"{archive.name}: damaged at byte {end} (tarfile stops there, yet data follows); "
                              "archive refused")
        left -= len(chunk)
        if left < 0:
            raise SourceError(f"{archive.name}: more than {MAX_TRAILER_BYTES // 1024} KiB of padding after its end; "
                              "archive refused")


def _check_paths_through_links(archive: Path, members: list[tarfile.TarInfo]) -> None:
    """Follow the archive's own symlinks: ``l1 -> ..`` then ``l2 -> l1/..`` passes a check of each link alone,
    yet l2 points outside; so does a member named ``l1/x``. Every name and link target is resolved through the
    archive's symlinks here, before anything is written."""
    links = {"/".join(limits.member_parts(m.name)): m.linkname for m in members if m.issym()}
    if not links:
        return  # nothing to follow: '..' and absolute names and hard links were refused already
    budget = [limits.MAX_LINK_STEPS]
    parents: dict[str, bool] = {}  # a folder's path -> whether it resolves inside (members share folders)
    for member in members:
        parts = list(limits.member_parts(member.name))
        parent = "/".join(parts[:-1])
        if parent not in parents:
            parents[parent] = _resolve(archive, parts[:-1], links, budget) is not None
        if not parents[parent]:
            raise SourceError(f"{archive.name}: member {limits.short(member.name)} lies outside the archive through a "
                              "link; refused")
        if member.issym():
            target = _resolve(archive, parts[:-1] + member.linkname.split("/"), links, budget)
        elif member.islnk():
            target = _resolve(archive, member.linkname.split("/"), links, budget)
        else:
            continue
        if target is None:
            raise SourceError(f"{archive.name}: link {limits.short(member.name)} -> {limits.short(member.linkname)} points "
                              "outside the archive through another link (or loops); refused")


def _resolve(archive: Path, parts: list[str], links: dict[str, str], budget: list[int]) -> list[str] | None:
    """A path inside the archive with its symlinks followed; None when it leaves the top or loops. ``budget``
    counts the steps left for the whole archive: links that expand into links cannot take unbounded time."""
    out: list[str] = []
    queue = deque(parts)
    hops = 0
    while queue:
        budget[0] -= 1
        if budget[0] < 0:
            raise SourceError(f"{archive.name}: its symlinks take more than {limits.MAX_LINK_STEPS} steps to follow; "
                              "archive refused")
        part = queue.popleft()
        if part in ("", "."):
            continue
        if part == "..":
            if not out:
                return None
            out.pop()
            continue
        out.append(part)
        target = links.get("/".join(out))
        if target is not None:
            hops += 1
            if hops > 64 or target.startswith("/"):
                return None
            out.pop()
            queue.extendleft(reversed(target.split("/")))
    return out


def _check_link(archive: Path, name: str, target: str, *, hard: bool) -> None:
    limits.check_path_shape(archive, target, "link target of " + limits.short(name))
    pure_target = PurePosixPath(target)
    if pure_target.is_absolute():
        raise SourceError(f"{archive.name}: link {limits.short(name)} points to absolute path {limits.short(target)}; "
                          "archive refused")
    base = PurePosixPath() if hard else PurePosixPath(name).parent
    depth = 0
    for part in (base / pure_target).parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            raise SourceError(f"{archive.name}: link {limits.short(name)} points outside the archive ({limits.short(target)}); "
                              "refused")


# ---------------------------------------------------------------- zip

