"""The builder's cache folder: what each part holds, how much disk it takes, and cleaning it safely.

A CUDA torch build venv is about 5 GiB and a farm makes one per (Python, torch, index); build folders keep each
target's wheel, logs and reports. `builder cache` shows where the disk goes; `builder cache clean` removes what
can be made again, skipping anything a running build or test holds (its file lock is tried, never waited for).
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from builder.core.errors import UsageError
from builder.core.settings import Settings, check_cache_dir

PREFETCH_LOCK = "prefetch.lock"  # held in docker/<index>/ while torch and the build requirements are fetched
VENV_MARKER = ".builder-env.json"  # written last when a build venv is complete; touched when it is reused

# name -> what it holds (the order is the order shown)
SECTIONS: dict[str, str] = {
    "venvs": "build venvs with torch and the build requirements (pip and host toolchains)",
    "docker": "the docker toolchain's torch and build requirements, per torch index (wheels/, uv's cache uv/)",
    "builds": "one folder per built target: wheel before/after finalize, logs, test reports",
    "tests": "`builder test` work folders",
    "sources": "downloaded sdists and archives (checked by sha256 on use)",
    "git": "git checkouts of git sources",
    "ccache": "the compiler cache (objects reused by rebuilds)",
    "toolkits": "CUDA toolkits provisioned from PyPI",
    "tools": "helper tools provisioned from PyPI (ccache)",
    "logs": "build logs",
    "farm-logs": "per-run logs of `builder farm`",
    "index": "cached PyPI metadata of upstream versions",
    "identity": "what nvcc, host compilers and interpreters said about themselves, keyed by their files",
}


@dataclass(frozen=True)
class Usage:
    name: str
    path: Path
    entries: int
    bytes: int  # freed by cleaning this section alone
    newest: float | None  # mtime of the most recently used entry


def _inodes(paths: list[Path]) -> dict[tuple[int, int], tuple[int, int, int]]:
    """(dev, inode) -> (blocks in bytes, link count, links seen under ``paths``), not following symlinks."""
    found: dict[tuple[int, int], tuple[int, int, int]] = {}
    stack = list(paths)
    while stack:
        current = stack.pop()
        try:
            st = current.lstat()
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        is_dir = current.is_dir() and not current.is_symlink()
        if key in found:
            size, links, seen = found[key]
            found[key] = (size, links, seen + 1)
            continue
        # a folder goes with its parent whatever its link count says
        found[key] = (st.st_blocks * 512, 1 if is_dir else st.st_nlink, 1)
        if is_dir:
            try:
                stack.extend(current.iterdir())
            except OSError:
                continue
    return found


def freed_bytes(paths: list[Path]) -> int:
    """Bytes that removing ``paths`` gives back: files hard-linked from elsewhere (a venv's torch shares uv's
    cache) stay on disk, so a 5 GiB venv may free only megabytes."""
    return sum(size for size, links, seen in _inodes(paths).values() if seen >= links)


def disk_bytes(paths: list[Path]) -> int:
    """Bytes allocated under ``paths``, each file once however many links it has there."""
    return sum(size for size, _, _ in _inodes(paths).values())


def _entries(section: Path) -> list[Path]:
    if not section.is_dir():
        return []
    return sorted(p for p in section.iterdir() if not p.name.endswith(".lock"))


def last_used(entry: Path) -> float:
    """When an entry was last used: its own mtime, or a venv's marker (touched on every reuse)."""
    marker = entry / VENV_MARKER
    return max(entry.lstat().st_mtime, marker.stat().st_mtime if marker.is_file() else 0.0)


def memo_dir(settings: Settings) -> Path:
    """Where the answers of nvcc, compilers and interpreters about themselves are remembered (core/filememo.py)."""
    return settings.cache("identity")


def entry_lock_path(entry: Path) -> Path:
    """The lock held while a cache entry (a build venv, a provisioned toolkit) is made or used: ENTRY.lock beside it."""
    return entry.with_name(entry.name + ".lock")


def entry_lock(entry: Path) -> FileLock:
    return FileLock(str(entry_lock_path(entry)))


def target_lock(settings: Settings, key: str) -> FileLock:
    """The lock one target's build holds from its unchanged check to its publish (builds/NAME-VERSION-KEY12 too)."""
    return FileLock(str(settings.cache("locks") / f"{key[:32]}.lock"))


def _locks_for(entry: Path, settings: Settings) -> list[Path]:
    """The lock files a running build or test holds while it uses ``entry``."""
    section = entry.parent.name
    if section == "venvs":
        return [entry_lock_path(entry)]
    if section == "builds":  # builds/NAME-VERSION-KEY12 is used under locks/KEY32.lock
        key12 = entry.name.rsplit("-", 1)[-1]
        return sorted((settings.cache_dir / "locks").glob(f"{key12}*.lock"))
    if section == "docker":  # docker/<index>: fetched under its prefetch lock (toolchain/cibw.py)
        return [entry / PREFETCH_LOCK]
    return []


def usage(settings: Settings) -> list[Usage]:
    """Per section: entries, bytes that cleaning it alone frees, and when it was last used."""
    check_cache_dir(settings.cache_dir)
    rows = []
    for name in SECTIONS:
        path = settings.cache_dir / name
        entries = _entries(path)
        newest = max((last_used(e) for e in entries), default=None)
        rows.append(Usage(name, path, len(entries), freed_bytes(entries), newest))
    return rows


@dataclass(frozen=True)
class Removal:
    entry: Path
    bytes: int
    skipped: str | None = None  # why it was left, when it was


@contextmanager
def _held(locks: list[Path]) -> Iterator[bool]:
    """Hold every lock without waiting; yields False when one is taken (the entry is in use)."""
    with ExitStack() as stack:
        for lock in locks:
            try:
                stack.enter_context(FileLock(str(lock), timeout=0))
            except Timeout:
                yield False
                return
        yield True


def clean(settings: Settings, sections: list[str], *, older_than_days: float | None = None,
          dry_run: bool = False) -> list[Removal]:
    """Remove the entries of ``sections`` (not used for ``older_than_days``, when given); entries in use are
    skipped with the reason. Returns what was (or, with ``dry_run``, would be) removed."""
    unknown = [s for s in sections if s not in SECTIONS]
    if unknown:
        raise UsageError(f"unknown cache section {', '.join(unknown)}", f"choose from {', '.join(SECTIONS)}")
    check_cache_dir(settings.cache_dir)
    cutoff = time.time() - older_than_days * 86400 if older_than_days is not None else None
    done = []
    for name in sections:
        for entry in _entries(settings.cache_dir / name):
            if cutoff is not None and last_used(entry) > cutoff:
                continue
            with _held(_locks_for(entry, settings)) as free:
                if not free:
                    done.append(Removal(entry, 0, "in use by a running build or test"))
                    continue
                size = freed_bytes([entry])
                if not dry_run:
                    _remove(entry)
                done.append(Removal(entry, size))
    return done


def _remove(entry: Path) -> None:
    """Remove an entry; a venv loses its completeness marker first, so a crash midway leaves one that is
    recreated, never one that looks complete."""
    marker = entry / VENV_MARKER
    if marker.is_dir() and not marker.is_symlink():  # a damaged marker: a folder in its place
        shutil.rmtree(marker)
    elif marker.exists() or marker.is_symlink():
        marker.unlink()
    if entry.is_dir() and not entry.is_symlink():
        shutil.rmtree(entry)
    else:
        entry.unlink()
