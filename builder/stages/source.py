"""The source stage: fetch an sdist / git checkout / local path (a SourceRef from stages/resolve.py) into a cache,
verify its sha256, and extract it so that no member can land outside the target directory."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import urllib.error
from pathlib import Path

from builder.core import net, netfault
from builder.core.errors import ChecksumError, SourceError
from builder.core.fsutil import atomic_write, sha256_file, tree_digest
from builder.core.log import log
from builder.core.safetar import safe_extract_tar
from builder.core.safezip import safe_extract_zip
from builder.core.settings import Settings
from builder.core.statefile import StateFileError, read_bytes
from builder.stages.resolve import SourceRef

# ---------------------------------------------------------------- fetching


def fetch(ref: SourceRef, settings: Settings) -> tuple[Path, str]:
    """Bring the source into the cache; returns (archive file or directory, sha256 or commit)."""
    if ref.kind == "path":
        return _fetch_path(ref)
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
        _drop_altered(ref, cached, digest, expected, against, settings.offline)
    if settings.offline:
        raise SourceError(f"{ref.filename} is not in the cache and --offline forbids downloading", "run once online")
    log.info(f"downloading {ref.location}")
    tmp = cached.with_name(f".{cached.name}.part")
    _download(ref, tmp)
    digest = sha256_file(tmp)
    _check_download(ref, digest, tmp, first)
    if ref.sha256 is None and first is None:
        atomic_write(_first_fetch_file(cached), digest + "\n")
        log.warning(f"source {ref.filename}: sha256 {digest} recorded at its first fetch, not verified (the recipe "
                    "records none; add it to source.sha256 to pin it)")
    else:
        log.info(f"source {ref.filename}: sha256 {digest[:12]}… matches {against}")
    tmp.replace(cached)
    return cached, digest


def _fetch_path(ref: SourceRef) -> tuple[Path, str]:
    """A local folder (its tree digest) or file (its sha256, checked against the recipe's)."""
    path = Path(ref.location)
    if path.is_dir():
        return path, tree_digest(path)
    digest = sha256_file(path)
    _check_digest(ref, digest, path)
    return path, digest


def _drop_altered(ref: SourceRef, cached: Path, digest: str, expected: str | None, against: str,
                  offline: bool) -> None:
    """Remove a cached archive whose sha256 is not the one expected (or that has none to check against), so it is
    downloaded again; offline, an altered one is a ChecksumError instead."""
    if expected is not None:
        log.warning(f"cached {ref.filename} has sha256 {digest[:12]}…, expected {expected[:12]}… ({against})")
        if offline:
            raise ChecksumError(
                f"checksum mismatch for the cached {ref.filename}: sha256 is {digest}, expected {expected} "
                f"({against})", "the cache was altered: run once online to fetch it again",
            )
    cached.unlink()


def _download(ref: SourceRef, tmp: Path) -> None:
    """``ref.location`` into ``tmp`` (removed on failure); a failure is a SourceError naming its cause."""
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


def _check_download(ref: SourceRef, digest: str, tmp: Path, first: str | None) -> None:
    """The download's sha256 against the recipe's, or (none recorded) its first fetch's; ``tmp`` removed on a
    mismatch."""
    try:
        if ref.sha256 is None and first is not None and digest != first:
            raise ChecksumError(
                f"{ref.location} changed since its first fetch: sha256 is {digest}, it was {first}",
                f"check the file; then record its sha256 in the recipe (source.sha256) or remove {tmp.parent}",
            )
        _check_digest(ref, digest, tmp)
    except ChecksumError:
        tmp.unlink(missing_ok=True)
        raise


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
    try:  # a fifo or folder put there is never opened for reading (it would block): no recorded hash
        text = read_bytes(_first_fetch_file(cached), limit=1024).decode("ascii", "replace").strip()
    except (OSError, StateFileError):
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

