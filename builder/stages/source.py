"""The source stage: fetch an sdist / git checkout / local path (a SourceRef from stages/resolve.py) into a cache,
verify its sha256, and extract it so that no member can land outside the target directory."""

from __future__ import annotations

import bz2
import gzip
import hashlib
import io
import lzma
import os
import re
import shutil
import stat
import struct
import subprocess
import tarfile
import tempfile
import urllib.error
import zipfile
import zlib
from collections import deque
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from builder.core import net, netfault
from builder.core.errors import ChecksumError, SourceError
from builder.core.fsutil import atomic_write, sha256_file, tree_digest
from builder.core.log import log
from builder.core.settings import Settings
from builder.stages.resolve import SourceRef

# ---------------------------------------------------------------- fetching


def fetch(ref: SourceRef, settings: Settings) -> tuple[Path, str]:
    """Bring the source into the cache; returns (archive file or directory, sha256 or commit)."""
    if ref.kind == "path":
        path = Path(ref.location)
        if path.is_dir():
            return path, tree_digest(path)
        digest = sha256_file(path)
        _check_digest(ref, digest, path)
        return path, digest
    if ref.kind == "git":
        return _fetch_git(ref, settings)
    cached = _cache_path(ref, settings)
    first = _first_fetch_hash(cached)  # a URL source with no recorded sha256: what its first fetch hashed to
    expected, against = (ref.sha256, "the recorded sha256") if ref.sha256 else (first, "the sha256 of its first fetch")
    if cached.exists():
        digest = sha256_file(cached)
        if expected is not None and digest == expected:
            log.info(f"source {ref.filename}: cached, sha256 {digest[:12]}… matches {against}")
            return cached, digest
        if expected is not None:
            log.warning(f"cached {ref.filename} has sha256 {digest[:12]}…, expected {expected[:12]}… ({against})")
            if settings.offline:
                raise ChecksumError(
                    f"checksum mismatch for the cached {ref.filename}: sha256 is {digest}, expected {expected} "
                    f"({against})", "the cache was altered: run once online to fetch it again",
                )
        cached.unlink()
    if settings.offline:
        raise SourceError(f"{ref.filename} is not in the cache and --offline forbids downloading", "run once online")
    log.info(f"downloading {ref.location}")
    tmp = cached.with_name(f".{cached.name}.part")
    try:
        net.download(ref.location, tmp)  # the network policy: timeouts, a deadline, retries (core/net.py)
    except net.NetError:
        tmp.unlink(missing_ok=True)
        raise
    except (urllib.error.URLError, OSError) as e:
        tmp.unlink(missing_ok=True)
        cause, cure = netfault.explain(e)
        raise SourceError(f"{ref.location} {cause}; not downloaded", cure) from e
    except ValueError as e:
        tmp.unlink(missing_ok=True)
        raise SourceError(f"download of {ref.location} failed: {e}", "check the URL") from e
    digest = sha256_file(tmp)
    try:
        if ref.sha256 is None and first is not None and digest != first:
            raise ChecksumError(
                f"{ref.location} changed since its first fetch: sha256 is {digest}, it was {first}",
                f"check the file; then record its sha256 in the recipe (source.sha256) or remove {cached.parent}",
            )
        _check_digest(ref, digest, tmp)
    except ChecksumError:
        tmp.unlink(missing_ok=True)
        raise
    if ref.sha256 is None and first is None:
        atomic_write(_first_fetch_file(cached), digest + "\n")
        log.warning(f"source {ref.filename}: sha256 {digest} recorded at its first fetch, not verified (the recipe "
                    "records none; add it to source.sha256 to pin it)")
    else:
        log.info(f"source {ref.filename}: sha256 {digest[:12]}… matches {against}")
    tmp.replace(cached)
    return cached, digest


def _cache_path(ref: SourceRef, settings: Settings) -> Path:
    """PyPI sdists by file name (PyPI never reuses one, and its hash is always checked); URL sources by URL, so
    two URLs with the same file name are two sources."""
    if ref.kind == "url":
        key = hashlib.sha256(ref.location.encode()).hexdigest()[:16]
        return settings.cache("sources", "url", key) / ref.filename
    return settings.cache("sources") / ref.filename


def _first_fetch_file(cached: Path) -> Path:
    return cached.with_name(f"{cached.name}.first-fetch.sha256")


def _first_fetch_hash(cached: Path) -> str | None:
    try:
        text = _first_fetch_file(cached).read_text().strip()
    except OSError:
        return None
    return text if len(text) == 64 else None


def _check_digest(ref: SourceRef, digest: str, path: Path) -> None:
    if ref.sha256 is not None and digest != ref.sha256:
        raise ChecksumError(
            f"checksum mismatch for {ref.filename}: sha256 is {digest}, expected {ref.sha256}",
            "the file was altered or the recorded hash is wrong; nothing was built",
        )


def describe_source_digest(kind: str, digest: str) -> str:
    """The fetched source's digest as the build log names it: a git checkout's is its commit, others' a sha256."""
    return f"commit {digest}" if kind == "git" else f"sha256 {digest}"


def _fetch_git(ref: SourceRef, settings: Settings) -> tuple[Path, str]:
    """A shallow clone of ``ref.git_ref``, cached per URL and ref (and pin); its HEAD must be the pinned commit."""
    pin = f"#{ref.commit}" if ref.commit else ""  # a changed pin is another clone: an unpinned one keeps its key
    key = hashlib.sha256(f"{ref.location}@{ref.git_ref}{pin}".encode()).hexdigest()[:16]
    dest = settings.cache("git") / key
    if dest.exists():
        commit = _git_head(dest)
        _check_commit(ref, commit, f"remove {dest} to clone it again")
    else:
        if settings.offline:
            raise SourceError(f"{ref.location}@{ref.git_ref} is not in the cache and --offline forbids cloning")
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{key}."))
        cmd = ["git", "clone", "--quiet", "--depth", "1", "--branch", str(ref.git_ref), ref.location, str(tmp)]
        log.command(cmd)
        policy = net.current()
        # git has no per-read timeout: a transfer below 1 KB/s is cut (git_env), the whole clone at the deadline
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, check=False,
                                    env={**policy.git_env(), **os.environ}, timeout=policy.deadline_s)
        except subprocess.TimeoutExpired:
            shutil.rmtree(tmp, ignore_errors=True)
            raise net.NetError(f"git clone of {ref.location}@{ref.git_ref}: gave up at the {policy.deadline_s:g} s "
                               "network deadline", f"check that it answers, or {net.DEADLINE_CURE}") from None
        if result.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise SourceError(f"git clone of {ref.location}@{ref.git_ref} failed: {result.stderr.strip()[-300:]}")
        commit = _git_head(tmp)
        try:
            _check_commit(ref, commit, "the tag moved upstream: check what changed, then update source.commits "
                                       "in the recipe; nothing was built")
        except ChecksumError:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        tmp.rename(dest)
    if ref.commit is None:
        log.warning(f"source {ref.location} at {ref.git_ref}: commit {commit}, not pinned (a recipe pins it in "
                    "[source.commits])")
    return dest, commit


def _git_head(checkout: Path) -> str:
    return subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def _check_commit(ref: SourceRef, found: str, hint: str) -> None:
    if ref.commit is not None and found != ref.commit:
        raise ChecksumError(f"git {ref.git_ref} of {ref.location} is at commit {found}, the recipe pins {ref.commit}",
                            hint)


# ---------------------------------------------------------------- extraction
#
# Every bound below holds for the whole archive and is checked while it is read, before anything is written: a
# hostile archive is refused in seconds and in tens of MB however it is built (issue 30 measured 3000 GNU long-name
# headers at 3 GB RSS and 600 s, 100 000 members at 429 s).

MAX_UNPACKED_BYTES = 2 * 1024**3  # a decompression bomb stops here
MAX_MEMBERS = 100_000
MAX_HEADER_BYTES = 1024 * 1024  # one GNU long-name / long-link or pax header
MAX_HEADER_TOTAL = 16 * 1024 * 1024  # all of them together
MAX_HEADER_CHAIN = 16  # extended headers in a row before one member (tarfile recurses once for each)
MAX_PAX_RECORDS = 1000  # records in one pax header
MAX_GLOBAL_PAX_RECORDS = 64  # tarfile applies and copies every global record to each member that follows
MAX_DIGIT_RUN = 64  # a longer run of digits in a pax header costs tarfile <= 3.11.9 quadratic time (CVE-2024-6232)
MAX_NAME_BYTES = 2048  # a member's path; the work folder's path must fit beside it in PATH_MAX (4096)
MAX_NAME_DEPTH = 256  # folders in one member's path (os.makedirs recurses once for each)
MAX_COMPONENT_BYTES = 255  # one file name (NAME_MAX)
MAX_LINK_STEPS = 4_000_000  # path components followed through the archive's own symlinks, in all
_PAX_LENGTH = re.compile(rb"(\d{1,20}) ")  # a pax record's length field and the space after it
_HEADER_KINDS = {b"L": "GNU long-name", b"K": "GNU long-link", b"x": "pax", b"X": "pax", b"g": "pax global"}


def unpack(source: Path, workdir: Path) -> Path:
    """Extract an archive (or copy a directory) into ``workdir``; returns the project root inside it."""
    workdir.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        dest = workdir / source.name
        shutil.copytree(source, dest, symlinks=True, ignore=shutil.ignore_patterns(".git", "__pycache__"))
        return dest
    name = source.name
    if name.endswith((".tar.gz", ".tgz", ".tar.bz2", ".tar.xz", ".tar")):
        safe_extract_tar(source, workdir)
    elif name.endswith(".zip"):
        safe_extract_zip(source, workdir)
    else:
        raise SourceError(f"{name}: unknown archive type", "sources must be .tar.gz, .tar.bz2, .tar.xz or .zip")
    entries = [p for p in workdir.iterdir() if not p.name.startswith(".")]
    if len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return workdir


def _short(text: str, limit: int = 80) -> str:
    """A member name as an error line quotes it: a 1 MiB name is not printed whole."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + f"… ({len(text.encode(errors='replace'))} bytes)"


def _parts(path: str) -> tuple[str, ...]:
    """A member's path as extraction lays it out (empty and ``.`` parts dropped, as PurePosixPath does)."""
    return tuple(p for p in path.split("/") if p and p != ".")


def _check_member_name(archive: Path, name: str, *, is_dir: bool = False) -> tuple[str, ...]:
    """Refuse names that are empty, too long or deep, absolute or climbing out; returns the name's parts."""
    if not name.strip() or "\0" in name:
        raise SourceError(f"{archive.name}: a member has an empty name ({_short(name)}); archive refused")
    _check_path_shape(archive, name, "member")
    parts = _parts(name)
    if name.startswith(("/", "\\")) or (parts and ":" in parts[0]):
        raise SourceError(f"{archive.name}: member {_short(name)} has an absolute path; archive refused")
    if ".." in parts:
        raise SourceError(f"{archive.name}: member {_short(name)} climbs out with '..'; archive refused")
    if not parts and not is_dir:  # "." or "./": only a directory may be the top itself
        raise SourceError(f"{archive.name}: member {_short(name)} is not a directory but names the top folder; "
                          "refused")
    return parts


def _check_path_shape(archive: Path, path: str, what: str) -> None:
    """Paths the file system takes: bounded length and depth (a 5000-folder name overflows os.makedirs' recursion),
    no file name over NAME_MAX."""
    if len(path) < 64:
        return  # the common case: at most 252 bytes, 32 folders
    size = len(path.encode(errors="surrogateescape"))
    if size > MAX_NAME_BYTES:
        raise SourceError(f"{archive.name}: {what} {_short(path)} is longer than {MAX_NAME_BYTES} bytes; "
                          "archive refused")
    parts = path.split("/")
    if len(parts) > MAX_NAME_DEPTH:
        raise SourceError(f"{archive.name}: {what} {_short(path)} is {len(parts)} folders deep (more than "
                          f"{MAX_NAME_DEPTH}); archive refused")
    longest = max(parts, key=lambda p: len(p.encode(errors="surrogateescape")))
    if len(longest.encode(errors="surrogateescape")) > MAX_COMPONENT_BYTES:
        raise SourceError(f"{archive.name}: {what} {_short(path)} has a file name of "
                          f"{len(longest.encode(errors='surrogateescape'))} bytes (more than {MAX_COMPONENT_BYTES}); "
                          "archive refused")


def _check_tree_shape(archive: Path, kinds: dict[tuple[str, ...], str]) -> None:
    """A file that is also a folder (``a`` a file, then ``a/b`` or a folder ``a``) fails half-way through the
    extraction; refuse it first. Sorted, a path's descendants follow it directly, so one pass finds every clash."""
    ordered = sorted(kinds)
    for path, after in zip(ordered, ordered[1:], strict=False):
        if kinds[path] == "file" and after[: len(path)] == path:
            raise SourceError(f"{archive.name}: {_short('/'.join(path))} is a file, yet the archive also puts "
                              f"{_short('/'.join(after))} under it; archive refused")


def _add_kind(archive: Path, kinds: dict[tuple[str, ...], str], parts: tuple[str, ...], kind: str) -> None:
    """Record a member's path and kind ("dir", "file" or "link"); the same path as a file and as a folder clashes."""
    before = kinds.setdefault(parts, kind)
    if {before, kind} == {"dir", "file"}:
        raise SourceError(f"{archive.name}: {_short('/'.join(parts))} is both a file and a folder; archive refused")


# ---------------------------------------------------------------- tar


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
            raise SourceError(f"{name}: member {_short(info.name)} is a GNU sparse file; archive refused")
        return
    stream.chain += 1
    if stream.chain > MAX_HEADER_CHAIN:
        raise SourceError(f"{name}: more than {MAX_HEADER_CHAIN} pax or GNU long-name headers in a row; "
                          "archive refused")
    if info.size > MAX_HEADER_BYTES:
        raise SourceError(f"{name}: a {kind} header of {info.size} bytes (more than {MAX_HEADER_BYTES // 1024} KiB); "
                          "archive refused")
    stream.header_bytes += info.size
    if stream.header_bytes > MAX_HEADER_TOTAL:
        raise SourceError(f"{name}: its pax and GNU long-name headers hold more than {MAX_HEADER_TOTAL // 1024**2} "
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
        if count > MAX_MEMBERS:
            raise SourceError(f"{archive.name}: more than {MAX_MEMBERS} members; archive refused")
        member.pax_headers = {}  # extraction does not read them; each member held a copy of the global ones
        parts = _check_member_name(archive, member.name, is_dir=member.isdir())
        if member.ischr() or member.isblk() or member.isfifo() or member.isdev():
            raise SourceError(f"{archive.name}: member {_short(member.name)} is a device or fifo; archive refused")
        if member.issym() or member.islnk():
            _check_link(archive, member.name, member.linkname, hard=member.islnk())
        if member.islnk() and kinds.get(_parts(member.linkname)) != "file":
            raise SourceError(f"{archive.name}: hard link {_short(member.name)} -> {_short(member.linkname)} names "
                              "no file before it; archive refused")  # tarfile would search every member for it
        if not (member.isdir() or member.issym() or member.islnk()):
            total += member.size
        if total > MAX_UNPACKED_BYTES:
            raise SourceError(f"{archive.name}: unpacks to more than {MAX_UNPACKED_BYTES // 1024**2} MiB "
                              "(a decompression bomb?); archive refused")
        if parts:  # the top folder itself ("./") is not extracted
            _add_kind(archive, kinds, parts, "dir" if member.isdir() else "link" if member.issym() else "file")
            members.append(member)
    _check_tree_shape(archive, kinds)
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
    links = {"/".join(_parts(m.name)): m.linkname for m in members if m.issym()}
    if not links:
        return  # nothing to follow: '..' and absolute names and hard links were refused already
    budget = [MAX_LINK_STEPS]
    parents: dict[str, bool] = {}  # a folder's path -> whether it resolves inside (members share folders)
    for member in members:
        parts = list(_parts(member.name))
        parent = "/".join(parts[:-1])
        if parent not in parents:
            parents[parent] = _resolve(archive, parts[:-1], links, budget) is not None
        if not parents[parent]:
            raise SourceError(f"{archive.name}: member {_short(member.name)} lies outside the archive through a "
                              "link; refused")
        if member.issym():
            target = _resolve(archive, parts[:-1] + member.linkname.split("/"), links, budget)
        elif member.islnk():
            target = _resolve(archive, member.linkname.split("/"), links, budget)
        else:
            continue
        if target is None:
            raise SourceError(f"{archive.name}: link {_short(member.name)} -> {_short(member.linkname)} points "
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
            raise SourceError(f"{archive.name}: its symlinks take more than {MAX_LINK_STEPS} steps to follow; "
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
    _check_path_shape(archive, target, "link target of " + _short(name))
    pure_target = PurePosixPath(target)
    if pure_target.is_absolute():
        raise SourceError(f"{archive.name}: link {_short(name)} points to absolute path {_short(target)}; "
                          "archive refused")
    base = PurePosixPath() if hard else PurePosixPath(name).parent
    depth = 0
    for part in (base / pure_target).parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            raise SourceError(f"{archive.name}: link {_short(name)} points outside the archive ({_short(target)}); "
                              "refused")


# ---------------------------------------------------------------- zip


def safe_extract_zip(archive: Path, dest: Path) -> None:
    """Bounded like a tar: the central directory is walked (count, name bytes) before zipfile reads it whole."""
    prescan_zip(archive)
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            if len(infos) > MAX_MEMBERS:
                raise SourceError(f"{archive.name}: more than {MAX_MEMBERS} members; archive refused")
            kinds: dict[tuple[str, ...], str] = {}
            total = 0
            for info in infos:
                is_dir = info.filename.endswith("/")  # ZipInfo.is_dir() fails on an empty name
                parts = _check_member_name(archive, info.filename, is_dir=is_dir)
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode):
                    raise SourceError(f"{archive.name}: member {_short(info.filename)} is a link or device; refused")
                total += info.file_size
                if total > MAX_UNPACKED_BYTES:
                    raise SourceError(f"{archive.name}: unpacks to too much data (a decompression bomb?); refused")
                if parts:
                    _add_kind(archive, kinds, parts, "dir" if is_dir else "file")
            _check_tree_shape(archive, kinds)
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
            limit = _ZIP_ENTRY.size * MAX_MEMBERS + MAX_HEADER_TOTAL
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
        if count > MAX_MEMBERS:
            raise SourceError(f"{archive.name}: more than {MAX_MEMBERS} members; archive refused")
        if header_bytes > MAX_HEADER_TOTAL:
            raise SourceError(f"{archive.name}: its member names and extra fields hold more than "
                              f"{MAX_HEADER_TOTAL // 1024**2} MiB in all; archive refused")
        pos += _ZIP_ENTRY.size + variable
