"""The publish stage: wheels into the wheelhouse and a simple index over them (PEP 503/691/658/714), atomically.

Layout::

    wheelhouse/wheels/<file>.whl             the wheels
    wheelhouse/wheels/<file>.whl.metadata    PEP 658 sidecar: the wheel's METADATA, byte for byte
    wheelhouse/records/<file>.whl.json       build record + inspect + test results per wheel
    wheelhouse/logs/<file>.whl.log           the build log, copied in at publish time when it exists
    wheelhouse/simple/                       the combined index: index.html (PEP 503) + index.json (PEP 691)
    wheelhouse/simple/<project>/             per project: index.html + index.json
    wheelhouse/channels/<label>/simple/...   the same, holding only wheels whose local label is <label>
    wheelhouse/index.html                    the dashboard (builder/dashboard.py)
    wheelhouse/staging/                      a wheelhouse of its own: built, import-tested, awaiting GPU tests

Every change (publish, remove, a new record, an index rebuild) is one ``Transaction`` under one lock
(``.publish.lock``): every file of the new state, pages and dashboard included, is staged under a temp name of the
builder's own naming (``.NAME.RANDOM.builder-tmp``) and fsynced, then one journal rename (``.publish-journal.json``)
commits it and the renames follow. A kill or a full disk before the commit leaves the old state (the temps are
swept by the next operation); after it, the next operation replays the journal (the new state). The pages are
rendered from the state being committed, so they cannot drift from the wheels; records carry ``wheel_sha256``,
which the unchanged check (``find_record``) verifies against the published bytes.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import time
import zipfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path
from typing import BinaryIO

from filelock import FileLock
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from builder.core.errors import BuilderError, PublishError
from builder.core.fsutil import sha256_file
from builder.core.log import log
from builder.core.wheelfile import dist_info_dir
from builder.model.records import BuildRecord
from builder.stages.repair import check_portability, portability_report

API_VERSION = "1.1"  # PEP 691 + PEP 700 (size, upload-time, versions)
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
SIMPLE_HTML = "application/vnd.pypi.simple.v1+html"


@dataclass(frozen=True)
class WheelInfo:
    """What the index says about one wheel; cached per (size, mtime) so big wheels are hashed once."""

    filename: str
    project: str
    version: str
    label: str | None
    size: int
    mtime_ns: int
    sha256: str
    metadata_sha256: str
    requires_python: str | None


def wheel_label(filename: str) -> str | None:
    """The local version label of a wheel file name: ``x-1.7.0+cu130torch2.14-…`` → ``cu130torch2.14``."""
    return parse_wheel_filename(filename)[1].local


def check_wheel(wheel: Path, filename: str | None = None) -> bytes:
    """The wheel's METADATA bytes, after checking that its Name and Version agree with the file name (``filename``
    when the bytes are in a temp file)."""
    shown = filename or wheel.name
    try:
        name, version, _, _ = parse_wheel_filename(shown)
    except InvalidWheelFilename as e:
        raise PublishError(f"refusing to publish {shown}: not a valid wheel file name ({e})") from e
    try:
        with zipfile.ZipFile(wheel) as zf:  # read METADATA alone: wheels can be hundreds of MB
            names = {info.filename: b"" for info in zf.infolist() if not info.is_dir()}
            data = zf.read(f"{dist_info_dir(names, shown)}/METADATA")
    except KeyError:
        raise PublishError(f"refusing to publish {shown}: it has no .dist-info/METADATA") from None
    except BuilderError as e:
        raise PublishError(f"refusing to publish {shown}: {e.message}") from e
    except (zipfile.BadZipFile, OSError) as e:
        raise PublishError(f"refusing to publish {shown}: not a readable wheel ({e})") from e
    headers = HeaderParser().parsestr(data.decode("utf-8", "replace"))
    meta_name, meta_version = headers.get("Name"), headers.get("Version")
    try:
        parsed = Version(meta_version or "")
    except InvalidVersion:
        parsed = None
    if parsed != version:
        raise PublishError(
            f"refusing to publish {shown}: its METADATA says Version: {meta_version} "
            f"but the file name says {version}",
            "rebuild it so that both agree (finalize_wheel rewrites the name and METADATA together)",
        )
    if canonicalize_name(meta_name or "") != canonicalize_name(name):
        raise PublishError(
            f"refusing to publish {shown}: its METADATA says Name: {meta_name} but the file name says {name}",
            "rebuild it so that both agree",
        )
    return data


@dataclass(frozen=True)
class Entry:
    """One wheel of a wheelhouse state (committed, or the one a transaction is about to commit)."""

    filename: str
    data: Path  # where the wheel's bytes are now: its published path, or a staged temp file
    metadata: Path  # its METADATA sidecar (likewise)
    record: BuildRecord | None
    has_log: bool
    sha256: str | None = None  # known already (a wheel being published); else hashed or read from the pages


@dataclass(frozen=True)
class Restored:
    """One wheel of a published wheelhouse as ``builder index pull`` restores it: what its pages say (sha256,
    size, upload time) and the small files beside it, already fetched and verified (builder/index/mirror.py)."""

    filename: str
    sha256: str
    size: int
    mtime_ns: int | None  # the page's upload-time: kept, so the re-rendered pages say what the published ones say
    metadata: bytes
    record: BuildRecord | None
    log: bytes | None


@dataclass(frozen=True)
class RestoreResult:
    fetched: tuple[str, ...]
    kept: tuple[str, ...]
    removed: tuple[str, ...]
    extra: tuple[str, ...]  # local wheels the published index does not hold, left in place (delete=False)


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
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temp_path(final)
        self.moves.append((tmp, final))  # before the write: abort() removes a half-written temp too
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        return tmp

    def put_copy(self, final: Path, source: Path) -> Path:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temp_path(final)
        self.moves.append((tmp, final))
        with open(source, "rb") as src, open(tmp, "xb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
            dst.flush()
            os.fsync(dst.fileno())
        os.chmod(tmp, 0o644)
        return tmp

    def put_stream(self, final: Path, write: Callable[[BinaryIO], None]) -> Path:
        """A temp file for ``final`` filled by ``write`` (a download): fsynced, committed like the others."""
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temp_path(final)
        self.moves.append((tmp, final))
        with open(tmp, "xb") as dst:
            write(dst)
            dst.flush()
            os.fsync(dst.fileno())
        os.chmod(tmp, 0o644)
        return tmp

    def abort(self) -> None:
        for tmp, _ in self.moves:
            tmp.unlink(missing_ok=True)

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


JOURNAL = ".publish-journal.json"
TEMP_SUFFIX = ".builder-tmp"


def _temp_path(final: Path) -> Path:
    return final.parent / f".{final.name}.{os.urandom(4).hex()}{TEMP_SUFFIX}"


def is_builder_temp(path: Path) -> bool:
    """Only files of this naming are ever swept: a user's .nojekyll or .htaccess is theirs."""
    return path.name.startswith(".") and path.name.endswith(TEMP_SUFFIX)


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


class Wheelhouse:
    def __init__(self, root: Path, parent: Wheelhouse | None = None) -> None:
        self.root = root
        self.parent = parent
        self.wheels = root / "wheels"
        self.records = root / "records"
        self.logs = root / "logs"
        self.simple = root / "simple"
        self.channels = root / "channels"
        self.dashboard = root / "index.html"

    # ------------------------------------------------------------------ the API the pipeline and gate use

    def staging(self) -> Wheelhouse:
        """The staging area: built and import-tested wheels waiting for kernel tests on a GPU machine."""
        return Wheelhouse(self.root / "staging", parent=self)

    def contains(self, wheel: Path) -> bool:
        return wheel.resolve().parent == self.wheels.resolve()

    def record_of(self, wheel_name: str) -> BuildRecord | None:
        """The wheel's record (records/<wheel>.json), also one written by an older builder; None if it has none."""
        path = self.records / f"{wheel_name}.json"
        data = json.loads(path.read_text()) if path.exists() else None
        return BuildRecord.from_json(data) if isinstance(data, dict) else None

    def remove(self, wheel_name: str) -> None:
        """Take a wheel, its sidecar, record and log out (after promotion), in one transaction with the pages."""
        with self.lock():
            self._recover()
            entries = [e for e in self._entries() if e.filename != wheel_name]
            txn = Transaction(self.root)
            txn.deletes += [self.wheels / wheel_name, self.wheels / f"{wheel_name}.metadata",
                            self.records / f"{wheel_name}.json", self.logs / f"{wheel_name}.log"]
            self._commit(txn, entries, f"removing {wheel_name} from")
        self._refresh_parent()

    def write_record(self, wheel_name: str, record: BuildRecord) -> None:
        """Replace a wheel's record (new test results) and the pages that show it, in one transaction."""
        with self.lock():
            self._recover()
            txn = Transaction(self.root)
            entries = []
            for entry in self._entries():
                if entry.filename == wheel_name:
                    if entry.record and entry.record.wheel_sha256 and not record.wheel_sha256:
                        record = record.with_(wheel_sha256=entry.record.wheel_sha256)
                    txn.put_bytes(self.records / f"{wheel_name}.json", record.file_bytes())
                    entry = Entry(entry.filename, entry.data, entry.metadata, record, entry.has_log)
                entries.append(entry)
            self._commit(txn, entries, f"writing the record of {wheel_name} into")
        self._refresh_parent()

    def lock(self) -> FileLock:
        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / ".publish.lock"))

    def index_url(self) -> str:
        return self.simple.resolve().as_uri()

    def channel_url(self, label: str) -> str:
        return (self.channels / label / "simple").resolve().as_uri()

    def publish(self, wheel: Path, record: BuildRecord, *, replace: bool = False) -> Path:
        """Copy ``wheel`` in with its metadata sidecar, record and build log, and regenerate every page, as one
        transaction (see ``Transaction``): afterwards the wheelhouse is either as it was or holds the wheel,
        listed everywhere with its hash. The record gains ``wheel_sha256``, what the unchanged check verifies.

        Refuses (PublishError) a wheel whose METADATA Name/Version differ from its file name, and one that would
        replace a published wheel of the same file name built for another arch set, unless ``replace``; refuses
        (PortabilityError, exit 13) one that vendors libtorch/libc10/libcudart or whose objects need a newer glibc
        than its manylinux tag promises (stages/repair.py). Returns the published path.
        """
        metadata = check_wheel(wheel)  # first: a file that is not a well-formed wheel is a PublishError
        check_portability(portability_report(wheel))
        log_source = _log_source(wheel, record)
        digest = sha256_file(wheel)
        record = record.with_(wheel_sha256=digest)
        dest = self.wheels / wheel.name
        txn = Transaction(self.root)
        try:
            with self.lock():
                self._recover()
                if not replace and not self.staging().contains(wheel):  # a promotion was checked when staged
                    self._check_arch_set(wheel.name, record)
                    if self.parent is not None:
                        self.parent._check_arch_set(wheel.name, record)
                same_file = dest.exists() and wheel.resolve() == dest.resolve()
                data = dest if same_file else txn.put_copy(dest, wheel)
                sidecar = txn.put_bytes(self.wheels / f"{wheel.name}.metadata", metadata)
                txn.put_bytes(self.records / f"{wheel.name}.json", record.file_bytes())
                has_log = (self.logs / f"{wheel.name}.log").exists()
                if log_source is not None and log_source.resolve() != (self.logs / f"{wheel.name}.log").resolve():
                    txn.put_copy(self.logs / f"{wheel.name}.log", log_source)
                    has_log = True
                entries = [e for e in self._entries() if e.filename != wheel.name]
                entries.append(Entry(wheel.name, data, sidecar, record, has_log, digest))
                self._commit(txn, sorted(entries, key=lambda e: e.filename), f"publishing {wheel.name} into")
        except OSError as e:  # while staging the wheel, sidecar, record or log (_commit raises PublishError)
            txn.abort()
            raise PublishError(f"publishing {wheel.name} into {self.root} failed: {e}; nothing was changed",
                               "free space (or fix the permissions) and run the build again") from e
        self._refresh_parent()
        return dest

    def _check_arch_set(self, wheel_name: str, record: BuildRecord) -> None:
        old = self._read_record(wheel_name) if (self.wheels / wheel_name).exists() else None
        if not old or not old.archs or not record.archs:  # pure Python, or a record without archs
            return
        before, after = sorted(old.archs), sorted(record.archs)
        if before != after:
            raise PublishError(
                f"refusing to replace {self.wheels / wheel_name}: it was built for {', '.join(before) or 'no arch'}, "
                f"this build is for {', '.join(after) or 'no arch'}; users of the published wheel would lose its archs",
                "build the union of both arch lists, or give --replace to replace it anyway",
            )

    def _commit(self, txn: Transaction, entries: list[Entry], doing: str, rehash: bool = False) -> None:
        """Stage every page for ``entries`` into ``txn`` and commit it. A failure before the commit point leaves
        everything as it was and says so; one after it says what was committed."""
        try:
            self._stage_pages(txn, entries, rehash)
            txn.commit()
        except OSError as e:
            if (self.root / JOURNAL).exists():
                raise PublishError(
                    f"{doing} {self.root}: committed, but finishing it failed ({e}); the wheelhouse is complete "
                    "after the next builder command on it replays the journal",
                    "free space and run `builder index rebuild`",
                ) from e
            txn.abort()
            raise PublishError(f"{doing} {self.root} failed: {e}; nothing was changed",
                               "free space (or fix the permissions) and run it again") from e
        except BaseException:
            if not (self.root / JOURNAL).exists():
                txn.abort()
            raise

    def restore(self, wheels: list[Restored], download: Callable[[Restored, BinaryIO], None], *,
                delete: bool = False) -> RestoreResult:
        """Make this wheelhouse hold ``wheels`` (a published index, ``builder index pull``) in one transaction.

        A wheel already here with the published sha256 is kept; any other is written by ``download`` (which
        verifies what it writes) into a temp file of the transaction, so a kill or a refused download leaves the
        old state. Sidecars, records and logs are written likewise; the pages are rendered from the new state.
        Local wheels the published index does not hold are removed with ``delete``, else kept."""
        published = {w.filename for w in wheels}
        txn = Transaction(self.root)
        fetched, kept = [], []
        try:
            with self.lock():
                self._recover()
                present = {e.filename: e for e in self._entries()}
                entries = []
                for wheel in wheels:
                    final = self.wheels / wheel.filename
                    old = present.get(wheel.filename)
                    if old and old.data.stat().st_size == wheel.size and sha256_file(old.data) == wheel.sha256:
                        data = old.data
                        kept.append(wheel.filename)
                    else:
                        data = txn.put_stream(final, lambda f, w=wheel: download(w, f))
                        fetched.append(wheel.filename)
                    if wheel.mtime_ns is not None:
                        os.utime(data, ns=(wheel.mtime_ns, wheel.mtime_ns))
                    if check_wheel(data, wheel.filename) != wheel.metadata:
                        raise PublishError(f"refusing to restore {wheel.filename}: its .metadata sidecar is not "
                                           "the wheel's METADATA", "run `builder index rebuild` where it is published")
                    entries.append(self._restored_entry(txn, wheel, data))
                extra = sorted(set(present) - published)
                if delete:
                    for name in extra:
                        txn.deletes += [self.wheels / name, self.wheels / f"{name}.metadata",
                                        self.records / f"{name}.json", self.logs / f"{name}.log"]
                else:
                    entries += [present[name] for name in extra]
                self._commit(txn, sorted(entries, key=lambda e: e.filename), "restoring the published index into")
        except OSError as e:
            txn.abort()
            raise PublishError(f"restoring the published index into {self.root} failed: {e}; nothing was changed",
                               "free space (or fix the permissions) and pull again") from e
        except BaseException:
            if not (self.root / JOURNAL).exists():
                txn.abort()
            raise
        return RestoreResult(tuple(fetched), tuple(kept), tuple(extra) if delete else (),
                             () if delete else tuple(extra))

    def _restored_entry(self, txn: Transaction, wheel: Restored, data: Path) -> Entry:
        """Stage the sidecar, record and log of a restored wheel where they differ from what is here."""
        sidecar = self.wheels / f"{wheel.filename}.metadata"
        if not sidecar.is_file() or sidecar.read_bytes() != wheel.metadata:
            sidecar = txn.put_bytes(sidecar, wheel.metadata)
        record_path = self.records / f"{wheel.filename}.json"
        if wheel.record is not None:
            record_bytes = wheel.record.file_bytes()
            if not record_path.is_file() or record_path.read_bytes() != record_bytes:
                txn.put_bytes(record_path, record_bytes)
        else:
            txn.deletes.append(record_path)
        log_path = self.logs / f"{wheel.filename}.log"
        if wheel.log is None:
            txn.deletes.append(log_path)
        elif not log_path.is_file() or log_path.read_bytes() != wheel.log:
            txn.put_bytes(log_path, wheel.log)
        return Entry(wheel.filename, data, sidecar, wheel.record, wheel.log is not None, wheel.sha256)

    def find_record(self, cache_key: str) -> tuple[Path, BuildRecord] | None:
        """A published wheel built from exactly these inputs (the "unchanged, skip" check), verified: its bytes
        match the record's ``wheel_sha256`` (or, for records older than that field, the wheel's own embedded
        cache key), and the pages list it with its hash, else the pages are rebuilt. A record whose wheel does
        not match is not trusted (None: the target is rebuilt and republished)."""
        if not self.records.is_dir():
            return None
        with self.lock():
            self._recover()
            for path in sorted(self.records.glob("*.whl.json")):
                wheel = self.wheels / path.name.removesuffix(".json")
                try:
                    record = self.record_of(wheel.name)
                except (OSError, json.JSONDecodeError):
                    continue
                if record is None or record.cache_key != cache_key or not wheel.exists():
                    continue
                digest = sha256_file(wheel)
                problem = _mismatch(wheel, record, digest)
                if problem:
                    log.warning(f"not trusting {path}: {problem}; rebuilding the target")
                    return None
                if not self._listed(wheel.name, digest):
                    log.warning(f"{wheel.name} is not listed in the pages with its sha256; rebuilding the pages")
                    self._rebuild_locked()
                return wheel, record
        return None

    def _listed(self, wheel_name: str, digest: str) -> bool:
        label = wheel_label(wheel_name)
        project = canonicalize_name(parse_wheel_filename(wheel_name)[0])
        pages = [self.simple / project / "index.json"]
        if label:
            pages.append(self.channels / label / "simple" / project / "index.json")
        for page in pages:
            try:
                files = json.loads(page.read_text()).get("files", [])
                if not any(f.get("filename") == wheel_name and f.get("hashes", {}).get("sha256") == digest
                           for f in files):
                    return False
                html_page = (page.parent / "index.html").read_text()
            except (OSError, ValueError, AttributeError):
                return False
            if f"{wheel_name}#sha256={digest}" not in html_page:
                return False
        return True

    def recover(self) -> None:
        """Finish or drop a transaction a killed publisher left behind (every other method does this first)."""
        if self.root.is_dir():
            with self.lock():
                self._recover()

    def _recover(self) -> None:
        """With the lock held: finish a committed transaction, then drop the temps of uncommitted ones."""
        if not self.root.is_dir():
            return
        replay(self.root)
        self._sweep_stale_temps()

    def _sweep_stale_temps(self) -> None:
        """Temp files of the builder's own naming left by a publisher that was killed (SIGKILL, full disk) before
        its commit: with the lock held and no journal, no live writer owns any. Nothing else is touched."""
        for path in self.root.rglob(f".*{TEMP_SUFFIX}"):
            if "staging" in path.relative_to(self.root).parts[:1] or not is_builder_temp(path):
                continue
            if path.is_file() and not path.is_symlink():
                path.unlink(missing_ok=True)

    def rebuild_index(self) -> None:
        """Regenerate everything from the wheels and records: sidecars, logs, pages, channels, dashboard."""
        with self.lock():
            self._recover()
            self._rebuild_locked()
        self._refresh_parent()

    def _rebuild_locked(self) -> None:
        txn = Transaction(self.root)
        entries = []
        for entry in self._entries():
            wheel = entry.data
            metadata = check_wheel(wheel)
            sidecar = entry.metadata
            if not sidecar.exists() or sidecar.read_bytes() != metadata:
                sidecar = txn.put_bytes(entry.metadata, metadata)
            has_log = entry.has_log
            source = _log_source(wheel, entry.record)
            if not has_log and source is not None and _own_log(source, self.root, entry.record):
                txn.put_copy(self.logs / f"{entry.filename}.log", source)
                has_log = True
            entries.append(Entry(entry.filename, wheel, sidecar, entry.record, has_log))
        try:
            self._commit(txn, entries, "rebuilding the index of", rehash=True)
        except BaseException:
            txn.abort()
            raise

    def labels(self) -> list[str]:
        """The channels (local version labels) of the published wheels."""
        return sorted({lab for w in self._wheel_files() if (lab := wheel_label(w.name))})

    def refresh_dashboard(self) -> None:
        with self.lock():
            self._recover()
            txn = Transaction(self.root)
            try:
                self._stage_dashboard(txn, self._entries())
                txn.commit()
            except OSError as e:
                if (self.root / JOURNAL).exists():
                    raise PublishError(f"refreshing the dashboard of {self.root} failed after its commit: {e}",
                                       "run `builder index rebuild`") from e
                txn.abort()  # the dashboard is a view, not the index: a stale one is rewritten by the next publish

    # ------------------------------------------------------------------ page generation (caller holds the lock)

    def _wheel_files(self, exclude: Iterable[str] = ()) -> list[Path]:
        if not self.wheels.is_dir():
            return []
        skip = set(exclude)
        return sorted(w for w in self.wheels.glob("*.whl") if not w.name.startswith(".") and w.name not in skip
                      and w.is_file())

    def _entries(self) -> list[Entry]:
        """The committed state, as the pages should show it."""
        return [Entry(w.name, w, self.wheels / f"{w.name}.metadata", self._read_record(w.name),
                      (self.logs / f"{w.name}.log").is_file()) for w in self._wheel_files()]

    def _read_record(self, wheel_name: str) -> BuildRecord | None:
        try:
            return self.record_of(wheel_name)
        except (OSError, json.JSONDecodeError):
            return None

    def _infos(self, entries: list[Entry], txn: Transaction, rehash: bool = False) -> list[WheelInfo]:
        """Index facts per wheel; hashes are reused from the previous JSON pages while size and mtime match."""
        previous = {} if rehash else self._previous_entries()
        infos = []
        for entry in entries:
            st = entry.data.stat()
            name, version, _, _ = parse_wheel_filename(entry.filename)
            old = previous.get(entry.filename)
            sidecar = entry.metadata
            if entry.sha256 is None and old and old.get("size") == st.st_size \
                    and old.get("upload-time") == _stamp(st.st_mtime_ns) and sidecar.exists():
                sha256, metadata_sha256 = old["hashes"]["sha256"], old["core-metadata"]["sha256"]
                requires_python = old.get("requires-python")
            else:
                if sidecar.exists():
                    metadata = sidecar.read_bytes()
                else:  # a wheel published before sidecars existed
                    metadata = check_wheel(entry.data)
                    txn.put_bytes(self.wheels / f"{entry.filename}.metadata", metadata)
                sha256 = entry.sha256 or sha256_file(entry.data)
                metadata_sha256 = _sha256_bytes(metadata)
                requires_python = HeaderParser().parsestr(metadata.decode("utf-8", "replace")).get("Requires-Python")
                requires_python = requires_python.strip() if requires_python else None
            infos.append(WheelInfo(
                filename=entry.filename, project=str(canonicalize_name(name)), version=str(version),
                label=version.local, size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=sha256,
                metadata_sha256=metadata_sha256, requires_python=requires_python,
            ))
        return infos

    def _previous_entries(self) -> dict[str, dict]:
        entries: dict[str, dict] = {}
        for page in self.simple.glob("*/index.json") if self.simple.is_dir() else []:
            try:
                for entry in json.loads(page.read_text()).get("files", []):
                    entries[entry["filename"]] = entry
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue
        return entries

    def _stage_pages(self, txn: Transaction, entries: list[Entry], rehash: bool = False) -> None:
        infos = self._infos(entries, txn, rehash)
        statuses = {e.filename: _tests_summary(e.record) for e in entries}
        _stage_simple(txn, self.simple, infos, "../../wheels/", statuses)
        labels = sorted({i.label for i in infos if i.label})
        for label in labels:
            chosen = [i for i in infos if i.label == label]
            _stage_simple(txn, self.channels / label / "simple", chosen, "../../../../wheels/", statuses)
        if self.channels.is_dir():
            txn.trees += [d for d in self.channels.iterdir() if d.is_dir() and d.name not in labels]
        if labels:
            items = [f'    <a href="{html.escape(lab)}/simple/">{html.escape(lab)}</a><br/>' for lab in labels]
            txn.put_bytes(self.channels / "index.html", _page("Channels", items).encode())
        self._stage_dashboard(txn, entries)

    def _stage_dashboard(self, txn: Transaction, entries: list[Entry]) -> None:
        from builder.index.dashboard import WheelFacts, render_dashboard, rows_from, rows_of

        facts = [WheelFacts(e.filename, e.data.stat().st_size, e.record, e.has_log) for e in entries]
        rows = rows_from(facts, area="staged" if self.parent else "published")
        staging = self.root / "staging"
        if self.parent is None and (staging / "wheels").is_dir():
            rows += rows_of(staging, Wheelhouse(staging, parent=self)._wheel_files(), area="staged",
                            prefix="staging/")
        labels = sorted({lab for e in entries if (lab := wheel_label(e.filename))})
        txn.put_bytes(self.dashboard, render_dashboard(rows, labels, staging_area=self.parent is not None).encode())

    def _refresh_parent(self) -> None:
        if self.parent is not None and self.parent.root.is_dir():
            self.parent.refresh_dashboard()


def _mismatch(wheel: Path, record: BuildRecord, digest: str) -> str | None:
    """Why ``record`` does not describe the bytes of ``wheel`` (None when it does)."""
    expected = record.wheel_sha256
    if expected is not None:
        return None if expected == digest else f"the wheel's sha256 is {digest}, the record says {expected}"
    try:  # a record from before wheel_sha256: the cache key finalize wrote into the wheel itself
        with zipfile.ZipFile(wheel) as zf:
            inner = next((n for n in zf.namelist() if n.endswith(".dist-info/cuda_wheel_builder.json")), None)
            embedded = json.loads(zf.read(inner)) if inner else None
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        return f"the wheel is unreadable ({e})"
    if isinstance(embedded, dict) and embedded.get("cache_key") not in (None, record.cache_key):
        return "the wheel was built from other inputs than its record says"
    return None


def _own_log(source: Path, root: Path, record: BuildRecord | None) -> bool:
    """Only a log of the builder's own naming is copied in: ``<package>-<version>-<key[:12]>.log`` in a folder
    named logs (the cache's), or the copy in a wheelhouse's logs/. A record naming /etc/passwd as its build_log,
    or a symlink out of the folder, gets no copy."""
    try:
        resolved = source.resolve(strict=True)
    except OSError:
        return False
    if not resolved.is_file():
        return False
    if source.parent.resolve() == (root / "logs").resolve() == resolved.parent:
        return True
    if record is None:
        return False
    key = record.cache_key
    expected = f"{record.package}-{record.version}-{key[:12]}.log"
    return bool(key) and resolved.parent.name == "logs" and resolved.name == expected == source.name


# ---------------------------------------------------------------------------------------- page writers


def _stage_simple(txn: Transaction, simple: Path, infos: list[WheelInfo], wheels_href: str,
                  statuses: dict[str, str]) -> None:
    """One simple index (combined or a channel): root + one folder per project, HTML and JSON each."""
    projects: dict[str, list[WheelInfo]] = {}
    for info in infos:
        projects.setdefault(info.project, []).append(info)
    for name, files in projects.items():
        links = []
        for info in files:
            href = html.escape(f"{wheels_href}{info.filename}")
            attrs = f'href="{href}#sha256={info.sha256}"'
            if info.requires_python:
                attrs += f' data-requires-python="{html.escape(info.requires_python)}"'
            attrs += f' data-core-metadata="sha256={info.metadata_sha256}"'
            attrs += f' data-dist-info-metadata="sha256={info.metadata_sha256}"'
            status = statuses.get(info.filename)
            note = f' <span class="tests">{html.escape(status)}</span>' if status else ""
            links.append(f"    <a {attrs}>{html.escape(info.filename)}</a>{note}<br/>")
        txn.put_bytes(simple / name / "index.html", _page(f"Links for {name}", links).encode())
        txn.put_bytes(simple / name / "index.json", _json({
            "meta": {"api-version": API_VERSION},
            "name": name,
            "versions": sorted({i.version for i in files}, key=Version),
            "files": [_json_file(info, wheels_href) for info in files],
        }).encode())
    root_links = [f'    <a href="{n}/">{n}</a><br/>' for n in sorted(projects)]
    txn.put_bytes(simple / "index.html", _page("Simple index", root_links).encode())
    txn.put_bytes(simple / "index.json", _json({
        "meta": {"api-version": API_VERSION},
        "projects": [{"name": n} for n in sorted(projects)],
    }).encode())
    if simple.is_dir():
        txn.trees += [d for d in simple.iterdir() if d.is_dir() and d.name not in projects]


def _json_file(info: WheelInfo, wheels_href: str) -> dict[str, str | int | bool | dict[str, str]]:
    entry: dict[str, str | int | bool | dict[str, str]] = {
        "filename": info.filename,
        "url": f"{wheels_href}{info.filename}",
        "hashes": {"sha256": info.sha256},
        "core-metadata": {"sha256": info.metadata_sha256},
        "dist-info-metadata": {"sha256": info.metadata_sha256},
        "size": info.size,
        "upload-time": _stamp(info.mtime_ns),
        "yanked": False,
    }
    if info.requires_python:
        entry["requires-python"] = info.requires_python
    return entry


def _tests_summary(record: BuildRecord | None) -> str:
    tests = record.tests if record else None
    return tests.summary() if tests is not None else ""


def _log_source(wheel: Path, record: BuildRecord | None) -> Path | None:
    """The build log to copy in: the record's build_log, else the copy in the wheelhouse the wheel comes from."""
    build_log = record.build_log if record is not None else ""
    if build_log and Path(build_log).is_file():
        return Path(build_log)
    beside = wheel.parent.parent / "logs" / f"{wheel.name}.log"
    return beside if beside.is_file() else None


def _page(title: str, links: list[str]) -> str:
    body = "\n".join(links)
    return (
        f'<!DOCTYPE html>\n<html>\n  <head><meta name="pypi:repository-version" content="{API_VERSION}">'
        f"<title>{html.escape(title)}</title></head>\n  <body>\n    <h1>{html.escape(title)}</h1>\n{body}\n  </body>\n</html>\n"
    )


def _json(data: object) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def _stamp(mtime_ns: int) -> str:
    """PEP 700 upload-time (ISO 8601, UTC, microseconds) from a file's mtime."""
    seconds, ns = divmod(mtime_ns, 1_000_000_000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ns // 1000:06d}Z"


def _sha256_bytes(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()
