"""The wheelhouse's transaction: every change is staged, then committed by one journal rename, under one lock.

Every change (publish, remove, a new record, an index rebuild, a restore) is one ``Transaction`` under the
wheelhouse's lock (``.publish.lock``): every file of the new state, pages and dashboard included, is staged under a
temp name of the builder's own naming (``.NAME.RANDOM.builder-tmp``) and fsynced, then one journal rename
(``.publish-journal.json``) commits it and the renames follow. A kill or a full disk before the commit leaves the
old state (the temps are swept by the next operation: ``recover_root``); after it, the next operation replays the journal
(the new state).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from filelock import FileLock

from builder.core.errors import PublishError
from builder.index.layout import JOURNAL, LOCK, STAGING, TEMP_SUFFIX


class Transaction:
    """Files staged under temp names of the builder's own naming, then committed by one journal rename.

    Stage every file (wheel, sidecar, record, log, every page, the dashboard) as ``.<name>.<random>.builder-tmp``
    beside its final path and fsync it: this is where a full disk fails, and then nothing has changed. ``commit``
    writes the journal (the list of renames and deletions) under a temp name, fsyncs it and renames it to
    ``.publish-journal.json``: that rename is the commit point. Then each temp is renamed over its final path and
    the journal removed. A process killed before the journal rename leaves only temps (swept on the next open: the
    old state); killed after it, the next open of the wheelhouse replays the journal (the new state)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.moves: list[tuple[Path, Path]] = []
        self.deletes: list[Path] = []
        self.trees: list[Path] = []

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
        tmp = _temp_path(final)
        self.moves.append((tmp, final))  # before the write: abort() removes a half-written temp too
        with open(tmp, "xb") as dst:
            write(dst)
            dst.flush()
            os.fsync(dst.fileno())
        os.chmod(tmp, 0o644)
        return tmp

    def abort(self) -> None:
        for tmp, _ in self.moves:
            tmp.unlink(missing_ok=True)

    def committed(self) -> bool:
        """Whether a journal is in place: past the commit point, the new state is what the next open finishes."""
        return (self.root / JOURNAL).exists()

    def commit(self) -> None:
        journal = {
            "moves": [[str(t.relative_to(self.root)), str(f.relative_to(self.root))] for t, f in self.moves],
            "deletes": [str(p.relative_to(self.root)) for p in self.deletes],
            "trees": [str(p.relative_to(self.root)) for p in self.trees],
        }
        tmp = _temp_path(self.root / JOURNAL)
        try:
            with open(tmp, "x") as f:
                json.dump(journal, f)
                f.flush()
                os.fsync(f.fileno())
            _fsync_dirs({t.parent for t, _ in self.moves})  # the temps' names are durable before the commit
            os.replace(tmp, self.root / JOURNAL)  # the commit point
            _fsync_dirs({self.root})
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        replay(self.root)

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


def lock_for(root: Path) -> FileLock:
    root.mkdir(parents=True, exist_ok=True)
    return FileLock(str(root / LOCK))


def recover_root(root: Path) -> None:
    """With the lock held: finish a committed transaction, then drop the temps of uncommitted ones."""
    if not root.is_dir():
        return
    replay(root)
    _sweep_stale_temps(root)


def is_builder_temp(path: Path) -> bool:
    """Only files of this naming are ever swept: a user's .nojekyll or .htaccess is theirs."""
    return path.name.startswith(".") and path.name.endswith(TEMP_SUFFIX)


def replay(root: Path) -> bool:
    """Finish a committed transaction (roll forward); idempotent, so a kill while replaying is replayed again.
    Returns whether there was one."""
    path = root / JOURNAL
    try:
        journal = json.loads(path.read_text())
    except FileNotFoundError:
        return False
    except (OSError, ValueError) as e:
        raise PublishError(f"{path} is unreadable ({e})",
                           "the journal is damaged: remove it and run `builder index rebuild`") from e
    touched = set()
    for tmp_rel, final_rel in journal.get("moves", []):
        tmp, final = _inside(root, tmp_rel), _inside(root, final_rel)
        if tmp.exists():  # else renamed already, before a kill
            os.replace(tmp, final)
            touched.add(final.parent)
    for rel in journal.get("deletes", []):
        _inside(root, rel).unlink(missing_ok=True)
    for rel in journal.get("trees", []):
        shutil.rmtree(_inside(root, rel), ignore_errors=True)
    _fsync_dirs(touched)
    path.unlink()
    _fsync_dirs({root})
    return True


def _sweep_stale_temps(root: Path) -> None:
    """Temp files of the builder's own naming left by a publisher that was killed (SIGKILL, full disk) before
    its commit: with the lock held and no journal, no live writer owns any. Nothing else is touched, and nothing
    in the staging area (a wheelhouse of its own, under its own lock)."""
    for path in root.rglob(f".*{TEMP_SUFFIX}"):
        if STAGING in path.relative_to(root).parts[:1] or not is_builder_temp(path):
            continue
        if path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)


def _temp_path(final: Path) -> Path:
    return final.parent / f".{final.name}.{os.urandom(4).hex()}{TEMP_SUFFIX}"


def _fsync_dirs(dirs: Iterable[Path]) -> None:
    for d in dirs:
        try:
            fd = os.open(d, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


def _inside(root: Path, rel: str) -> Path:
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()):
        raise PublishError(f"{root / JOURNAL} names {rel}, outside the wheelhouse",
                           "the journal is damaged: remove it and run `builder index rebuild`")
    return root / rel
