"""The wheelhouse's transaction: every change is staged, then committed by one journal rename, under one lock;
readers see the pages switch from one generation to the next in one rename.

Every change (publish, remove, a new record, an index rebuild, a restore) is one ``Transaction`` under the
wheelhouse's lock (``.publish.lock``): every data file of the new state (wheel, sidecar, record, log, dashboard) is
staged under a temp name of the builder's own naming (``.NAME.RANDOM.builder-tmp``) and fsynced, and the pages are
written whole into a new generation (``.generations/<N>/simple``, ``…/channels``) and fsynced; then one journal
rename (``.publish-journal.json``) commits it and the renames follow: the new data files land first, then
``.generations/current`` is switched to the new generation by renaming a new symlink over it (``simple`` and
``channels`` are fixed links through it), then the files the old generation listed and the new one does not are
deleted. So at every instant the pages a reader sees list only files that exist with the listed hashes. A kill or a
full disk before the commit leaves the old state (the temps and the unswitched generation are swept by the next
operation: ``recover_root``); after it, the next operation replays the journal (the new state).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

from filelock import FileLock

from builder.core.errors import PublishError
from builder.core.statefile import StateFileError, describe, read_json, want
from builder.index.generations import (
    adopt_page_folders,
    current_generation,
    fsync_dirs,
    generation_numbers,
    is_builder_temp,
    link_page_trees,
    prune_generations,
    switch_generation,
    temp_path,
)
from builder.index.layout import (
    GENERATIONS,
    JOURNAL,
    LOCK,
    STAGING,
    TEMP_SUFFIX,
)


class Transaction:
    """Files staged under temp names of the builder's own naming, pages written into new generations, then
    committed by one journal rename.

    Stage every data file (wheel, sidecar, record, log, the dashboard) as ``.<name>.<random>.builder-tmp`` beside
    its final path and fsync it, and write every page into a generation (``new_generation``, ``put_page``): this
    is where a full disk fails, and then nothing has changed. ``commit`` writes the journal (the renames, the
    generations to switch to, the deletions) under a temp name, fsyncs it and renames it to
    ``.publish-journal.json``: that rename is the commit point. ``replay`` then does the renames in the order that
    keeps what readers see true (``replay``) and removes the journal. A process killed before the journal rename
    leaves only temps and an unswitched generation (swept on the next open: the old state); killed after it, the
    next open of the wheelhouse replays the journal (the new state)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.moves: list[tuple[Path, Path]] = []
        self.deletes: list[Path] = []
        self.trees: list[Path] = []
        self.generations: list[int] = []  # page generations to switch to, in order: [final] or [interim, final]
        self._page_dirs: set[Path] = set()

    def put_bytes(self, final: Path, data: bytes) -> Path:
        return self.put_stream(final, lambda f: f.write(data))

    def put_copy(self, final: Path, source: Path) -> Path:
        def copy(dst: BinaryIO) -> None:
            with open(source, "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 20)

        return self.put_stream(final, copy)

    def put_stream(self, final: Path, write: Callable[[BinaryIO], object]) -> Path:
        """A temp file for ``final`` filled by ``write`` (bytes, a copy, a download): fsynced, committed later."""
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path(final)
        self.moves.append((tmp, final))  # before the write: abort() removes a half-written temp too
        with open(tmp, "xb") as dst:
            write(dst)
            dst.flush()
            os.fsync(dst.fileno())
        os.chmod(tmp, 0o644)
        return tmp

    def new_generation(self) -> Path:
        """A new, empty generation of the pages (``.generations/<N>/``), switched to in order at the commit."""
        number = max([*generation_numbers(self.root), *self.generations, 0]) + 1
        folder = self.root / GENERATIONS / str(number)
        self.generations.append(number)  # before mkdir: abort() removes a half-written generation too
        folder.mkdir(parents=True)
        return folder

    def put_page(self, path: Path, data: bytes) -> None:
        """A page inside a generation of this transaction: no reader sees it before the switch, so it is written
        in place (and fsynced, with its folder at the commit)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(path, 0o644)
        self._page_dirs.add(path.parent)

    def abort(self) -> None:
        for tmp, _ in self.moves:
            tmp.unlink(missing_ok=True)
        for number in self.generations:
            shutil.rmtree(self.root / GENERATIONS / str(number), ignore_errors=True)

    def committed(self) -> bool:
        """Whether a journal is in place: past the commit point, the new state is what the next open finishes."""
        return (self.root / JOURNAL).exists()

    def commit(self) -> None:
        """Write the journal and rename it into place (the commit point), then replay it. Moves onto a file that
        exists now (a wheel republished under its name, a rewritten record, the dashboard) are the journal's
        ``replacing``: they happen while the interim generation, which lists none of those wheels, is live."""
        rel = self._relative
        journal = {
            "moves": [[rel(t), rel(f)] for t, f in self.moves if not _exists(f)],
            "replacing": [[rel(t), rel(f)] for t, f in self.moves if _exists(f)],
            "generations": [str(n) for n in self.generations],
            "previous": current_generation(self.root),  # kept after the switch, with the new one
            "deletes": [rel(p) for p in self.deletes],
            "trees": [rel(p) for p in self.trees],
        }
        tmp = temp_path(self.root / JOURNAL)
        try:
            with open(tmp, "x") as f:
                json.dump(journal, f)
                f.flush()
                os.fsync(f.fileno())
            pages = {folder for page_dir in self._page_dirs for folder in [page_dir, *page_dir.parents]
                     if folder.is_relative_to(self.root / GENERATIONS)}
            fsync_dirs({t.parent for t, _ in self.moves} | pages)  # temps and pages are durable before the commit
            os.replace(tmp, self.root / JOURNAL)  # the commit point
            fsync_dirs({self.root})
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        replay(self.root)

    def _relative(self, path: Path) -> str:
        return str(path.relative_to(self.root))

    def finish(self, stage: Callable[[], None], doing: str) -> None:
        """Stage the rest (``stage``: the pages) and commit (``guarded``)."""
        with self.guarded(doing, "free space (or fix the permissions) and run it again"):
            stage()
            self.commit()

    @contextmanager
    def guarded(self, doing: str, cure: str) -> Iterator[None]:
        """Any failure before the commit point removes the temps and leaves everything as it was; a disk error is
        one PublishError saying so (with ``cure``), and one after the commit point says what was committed."""
        try:
            yield
        except OSError as e:
            if self.committed():
                raise PublishError(
                    f"{doing} {self.root}: committed, but finishing it failed ({e}); the wheelhouse is complete "
                    "after the next builder command on it replays the journal",
                    "free space and run `builder index rebuild`",
                ) from e
            self.abort()
            raise PublishError(f"{doing} {self.root} failed: {e}; nothing was changed", cure) from e
        except BaseException:
            if not self.committed():
                self.abort()
            raise


class WheelhouseLock:
    """The wheelhouse's ``.publish.lock``; a wheelhouse this process cannot write (a read-only mount, another
    user's folder) is one PublishError naming it, not an OSError from the lock file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock: FileLock | None = None

    def __enter__(self) -> WheelhouseLock:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self._lock = FileLock(str(self.root / LOCK))
            self._lock.acquire()
        except OSError as e:
            raise PublishError(
                f"cannot change the wheelhouse {self.root}: its lock {self.root / LOCK} cannot be written "
                f"({e.strerror or e})",
                "give a writable --wheelhouse, such as a copy of this one, or make this one writable",
            ) from e
        return self

    def __exit__(self, *exc: object) -> None:
        if self._lock is not None:
            self._lock.release()


def lock_for(root: Path) -> WheelhouseLock:
    return WheelhouseLock(root)


def recover_root(root: Path) -> None:
    """With the lock held: finish a committed transaction, drop the temps and generations of uncommitted ones,
    and turn page folders of an older layout (or a copy whose links were dereferenced) into a generation."""
    if not root.is_dir():
        return
    replay(root)
    prune_generations(root)
    adopt_page_folders(root)
    _sweep_stale_temps(root)


def replay(root: Path) -> bool:
    """Finish a committed transaction (roll forward); idempotent, so a kill while replaying is replayed again.
    Returns whether there was one.

    The order keeps the live pages true at every instant: new files land (no live page lists them yet); if any
    file a live page lists is replaced under its name, the interim generation (which lists none of those
    wheels) goes live first, then they are replaced; then the final generation goes live, and only then are the
    files it no longer lists deleted."""
    path = root / JOURNAL
    try:
        journal = _read_journal(path)
    except FileNotFoundError:
        return False
    touched: set[Path] = set()
    _rename(root, journal.get("moves", []), touched)
    generations = [int(n) for n in journal.get("generations", [])]
    pending = [pair for pair in journal.get("replacing", []) if _inside(root, pair[0]).exists()]
    if pending and len(generations) > 1:
        fsync_dirs(touched)
        switch_generation(root, generations[0])
    _rename(root, pending, touched)
    fsync_dirs(touched)
    if generations:
        switch_generation(root, generations[-1])
        link_page_trees(root)
    for rel in journal.get("deletes", []):
        _inside(root, rel).unlink(missing_ok=True)
    for rel in journal.get("trees", []):
        shutil.rmtree(_inside(root, rel), ignore_errors=True)
    fsync_dirs({_inside(root, rel).parent for rel in journal.get("deletes", [])})
    path.unlink()
    fsync_dirs({root})
    if generations:
        previous = journal.get("previous")
        prune_generations(root, previous if isinstance(previous, int) else None)
    return True


_DAMAGED = "the journal is damaged: remove it and run `builder index rebuild`"


def _read_journal(path: Path) -> dict[str, Any]:
    """The journal, its shape checked (``commit`` writes it): one line naming the file and field when it is
    damaged, and a fifo or folder in its place is never opened for reading. FileNotFoundError without one."""
    try:
        journal = read_json(path, limit=256 << 20)
        for field in ("moves", "replacing"):
            pairs = want(path, journal, field, "a list", optional=True) or []
            if not all(isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in pairs):
                raise StateFileError(f"{path}: field {field!r} is not a list of [temp, final] path pairs")
        for field in ("generations", "deletes", "trees"):
            items = want(path, journal, field, "a list", optional=True) or []
            if not all(isinstance(x, str) for x in items):
                raise StateFileError(f"{path}: field {field!r} is not a list of strings")
        if not all(x.isdigit() and x.isascii() and len(x) < 20 for x in journal.get("generations") or []):
            raise StateFileError(f"{path}: field 'generations' names something other than generation numbers")
        previous = journal.get("previous")
        if previous is not None and (not isinstance(previous, int) or isinstance(previous, bool)):
            raise StateFileError(f"{path}: field 'previous' is {describe(previous)}, not a generation number")
    except StateFileError as e:
        raise PublishError(str(e), _DAMAGED) from e
    return journal


def _rename(root: Path, pairs: list[list[str]], touched: set[Path]) -> None:
    for tmp_rel, final_rel in pairs:
        tmp, final = _inside(root, tmp_rel), _inside(root, final_rel)
        if tmp.exists():  # else renamed already, before a kill
            os.replace(tmp, final)
            touched.add(final.parent)


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _sweep_stale_temps(root: Path) -> None:
    """Temp files of the builder's own naming left by a publisher that was killed (SIGKILL, full disk) before
    its commit, and the old page folder an interrupted adoption left under such a name: with the lock held and
    no journal, no live writer owns any. Nothing else is touched, and nothing in the staging area (a wheelhouse
    of its own, under its own lock)."""
    for path in list(root.rglob(f".*{TEMP_SUFFIX}")):
        if STAGING in path.relative_to(root).parts[:1] or not is_builder_temp(path):
            continue
        if path.is_symlink() or path.is_file():
            path.unlink(missing_ok=True)
        elif path.is_dir() and path.parent == root:
            shutil.rmtree(path, ignore_errors=True)


def _inside(root: Path, rel: str) -> Path:
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()):
        raise PublishError(f"{root / JOURNAL} names {rel}, outside the wheelhouse", _DAMAGED)
    return root / rel
