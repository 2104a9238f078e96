"""The source stage: fetch an sdist / git checkout / local path (a SourceRef from stages/resolve.py) into a cache,
verify its sha256, and extract it so that no member can land outside the target directory."""

from __future__ import annotations

import hashlib
import shutil
import stat
import subprocess
import tarfile
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath

from builder.core.errors import ChecksumError, SourceError
from builder.core.fsutil import atomic_write, sha256_file, tree_digest
from builder.core.log import log
from builder.core.settings import Settings
from builder.stages.resolve import SourceRef

MAX_UNPACKED_BYTES = 2 * 1024**3  # a decompression bomb stops here
MAX_MEMBERS = 100_000


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
        with urllib.request.urlopen(ref.location, timeout=120) as response, tmp.open("wb") as out:
            shutil.copyfileobj(response, out)
    except (urllib.error.URLError, TimeoutError, OSError, ValueError) as e:
        tmp.unlink(missing_ok=True)
        raise SourceError(f"download of {ref.location} failed: {e}", "check the network or use --offline") from e
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
        result = subprocess.run(cmd, capture_output=True, text=True, check=False)
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


MAX_HEADER_BYTES = 1024 * 1024  # a GNU long name / long link or a pax header larger than this is refused
_HEADER_KINDS = {b"L": "GNU long-name", b"K": "GNU long-link", b"x": "pax", b"g": "pax global"}


def _check_member_name(archive: Path, name: str, *, is_dir: bool = False) -> None:
    pure = PurePosixPath(name)
    drive_like = bool(pure.parts) and ":" in pure.parts[0]
    if not name.strip() or "\0" in name:
        raise SourceError(f"{archive.name}: a member has an empty name ({name!r}); archive refused")
    if pure.is_absolute() or name.startswith(("/", "\\")) or drive_like:
        raise SourceError(f"{archive.name}: member {name!r} has an absolute path; archive refused")
    if ".." in pure.parts:
        raise SourceError(f"{archive.name}: member {name!r} climbs out with '..'; archive refused")
    if not pure.parts and not is_dir:  # "." or "./": only a directory may be the top itself
        raise SourceError(f"{archive.name}: member {name!r} is not a directory but names the top folder; refused")


def _tar_stream(archive: Path):  # a binary file object (gzip, bz2, lzma or plain)
    import bz2
    import gzip
    import lzma

    with archive.open("rb") as f:
        magic = f.read(6)
    if magic.startswith(b"\x1f\x8b"):
        return gzip.open(archive, "rb")
    if magic.startswith(b"BZh"):
        return bz2.open(archive, "rb")
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.open(archive, "rb")
    return archive.open("rb")


def _header_size(block: bytes) -> int:
    field = block[124:136]
    if field[0] & 0x80:  # GNU base-256
        return int.from_bytes(bytes([field[0] & 0x7F]) + field[1:], "big")
    text = field.split(b"\0", 1)[0].strip()
    return int(text, 8) if text else 0


def prescan_tar(archive: Path) -> None:
    """Walk the raw tar headers in bounded memory and time before tarfile reads any: tarfile reads a GNU
    long-name or pax header whole (a 9 MB archive can hold a 2 GiB one), before any member-size check runs."""
    total = 0
    try:
        with _tar_stream(archive) as f:
            next_size: int | None = None
            while True:
                block = f.read(512)
                if len(block) < 512 or block == bytes(512):
                    return  # the end (or a truncated archive: tarfile says so)
                try:
                    size = _header_size(block)
                except ValueError:
                    return  # not a header tarfile would accept either: it reports the error
                kind = block[156:157]
                if kind in _HEADER_KINDS:
                    if size > MAX_HEADER_BYTES:
                        raise SourceError(
                            f"{archive.name}: a {_HEADER_KINDS[kind]} header of {size} bytes "
                            f"(more than {MAX_HEADER_BYTES // 1024} KiB); archive refused")
                    data = f.read(-(-size // 512) * 512)[:size]
                    if kind == b"x":
                        next_size = _pax_size(data)
                    continue
                if kind in (b"1", b"2", b"3", b"4", b"5", b"6"):  # links, devices, dirs, fifos carry no data
                    size = 0 if next_size is None else next_size
                elif next_size is not None:
                    size = next_size
                next_size = None
                total += size
                if total > MAX_UNPACKED_BYTES:
                    raise SourceError(
                        f"{archive.name}: unpacks to more than {MAX_UNPACKED_BYTES // 1024**2} MiB "
                        "(a decompression bomb?); archive refused")
                remaining = -(-size // 512) * 512
                while remaining > 0:
                    chunk = f.read(min(remaining, 1 << 20))
                    if not chunk:
                        return
                    remaining -= len(chunk)
    except (OSError, EOFError, ValueError) as e:
        raise SourceError(f"{archive.name}: not a readable tar archive: {e}") from e


def _pax_size(data: bytes) -> int | None:
    """The ``size`` record of a pax header (it overrides the ustar size field of the next member)."""
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        if space < 0:
            return None
        try:
            length = int(data[pos:space])
        except ValueError:
            return None
        if length <= 0:
            return None
        record = data[space + 1:pos + length - 1]
        key, _, value = record.partition(b"=")
        if key == b"size":
            try:
                return int(value)
            except ValueError:
                return None
        pos += length
    return None


def safe_extract_tar(archive: Path, dest: Path) -> None:
    """Refuse path traversal, links leaving the tree (also through other links), device files, odd names,
    oversized headers and decompression bombs, all before anything is written; then extract."""
    prescan_tar(archive)
    try:
        with tarfile.open(archive) as tar:
            members = []
            total = 0
            for count, member in enumerate(tar, start=1):
                if count > MAX_MEMBERS:
                    raise SourceError(f"{archive.name}: more than {MAX_MEMBERS} members; archive refused")
                _check_member_name(archive, member.name, is_dir=member.isdir())
                if member.ischr() or member.isblk() or member.isfifo() or member.isdev():
                    raise SourceError(f"{archive.name}: member {member.name!r} is a device or fifo; archive refused")
                if member.issym() or member.islnk():
                    _check_link(archive, member.name, member.linkname, hard=member.islnk())
                total += member.size
                if total > MAX_UNPACKED_BYTES:
                    raise SourceError(
                        f"{archive.name}: unpacks to more than {MAX_UNPACKED_BYTES // 1024**2} MiB "
                        "(a decompression bomb?); archive refused"
                    )
                if PurePosixPath(member.name).parts:  # the top folder itself ("./") is not extracted
                    members.append(member)
            _check_paths_through_links(archive, members)
            tar.extractall(dest, members=members, filter="data")
    except tarfile.TarError as e:
        raise SourceError(f"{archive.name}: not a readable tar archive: {e}") from e


def _check_paths_through_links(archive: Path, members: list[tarfile.TarInfo]) -> None:
    """Follow the archive's own symlinks: ``l1 -> ..`` then ``l2 -> l1/..`` passes a check of each link alone,
    yet l2 points outside; so does a member named ``l1/x``. Every name and link target is resolved through the
    archive's symlinks here, before anything is written."""
    links = {"/".join(PurePosixPath(m.name).parts): m.linkname for m in members if m.issym()}
    for member in members:
        parts = list(PurePosixPath(member.name).parts)
        if _resolve(parts[:-1], links) is None:
            raise SourceError(f"{archive.name}: member {member.name!r} lies outside the archive through a link; "
                              "refused")
        if member.issym():
            target = _resolve(parts[:-1] + member.linkname.split("/"), links)
        elif member.islnk():
            target = _resolve(member.linkname.split("/"), links)
        else:
            continue
        if target is None:
            raise SourceError(f"{archive.name}: link {member.name!r} -> {member.linkname!r} points outside the "
                              "archive through another link (or loops); refused")


def _resolve(parts: list[str], links: dict[str, str]) -> list[str] | None:
    """A path inside the archive with its symlinks followed; None when it leaves the top or loops."""
    out: list[str] = []
    queue = list(parts)
    hops = 0
    while queue:
        part = queue.pop(0)
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
            queue = target.split("/") + queue
    return out


def _check_link(archive: Path, name: str, target: str, *, hard: bool) -> None:
    pure_target = PurePosixPath(target)
    if pure_target.is_absolute():
        raise SourceError(f"{archive.name}: link {name!r} points to absolute path {target!r}; archive refused")
    base = PurePosixPath() if hard else PurePosixPath(name).parent
    depth = 0
    for part in (base / pure_target).parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            raise SourceError(f"{archive.name}: link {name!r} points outside the archive ({target!r}); refused")


def safe_extract_zip(archive: Path, dest: Path) -> None:
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = zf.infolist()
            if len(infos) > MAX_MEMBERS:
                raise SourceError(f"{archive.name}: more than {MAX_MEMBERS} members; archive refused")
            total = 0
            for info in infos:
                _check_member_name(archive, info.filename, is_dir=info.is_dir())
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode) or stat.S_ISFIFO(mode):
                    raise SourceError(f"{archive.name}: member {info.filename!r} is a link or device; refused")
                total += info.file_size
                if total > MAX_UNPACKED_BYTES:
                    raise SourceError(f"{archive.name}: unpacks to too much data (a decompression bomb?); refused")
            zf.extractall(dest)
    except zipfile.BadZipFile as e:
        raise SourceError(f"{archive.name}: not a readable zip archive: {e}") from e
