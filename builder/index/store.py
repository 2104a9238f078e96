"""The publish stage: ``Wheelhouse``, the wheels and a simple index over them (PEP 503/691/658/714), changed
atomically.

Three rooms: index/layout.py names every folder and file of a wheelhouse (callers ask a ``Wheelhouse`` for its
paths, they never spell one); index/txn.py is the one way to change it (a ``Transaction`` under the lock, committed
by a journal rename, replayed after a kill); index/pages.py renders the pages and the dashboard from the state
being committed, so they cannot drift from the wheels. This module is the API: publish, remove, write a record,
restore a published index, rebuild, find the wheel of a cache key. Records carry ``wheel_sha256``, which the
unchanged check (``find_record``) verifies against the published bytes.
Over 400 lines on purpose: it is the wheelhouse's whole public API (the three rooms above hold the mechanics), and
splitting the methods of ``Wheelhouse`` would only move callers' imports around.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from builder.core.errors import PublishError
from builder.core.fsutil import sha256_file
from builder.core.log import log
from builder.core.statefile import StateFileError, read_json
from builder.core.wheelfile import split_label
from builder.index.assets import AssetStore, read_assets
from builder.index.channelpolicy import wheel_channels
from builder.index.layout import Layout, recorded_wheel
from builder.index.merge import MergePlan, plan_merge
from builder.index.pages import Entry, listed, stage_dashboard, stage_pages
from builder.index.trust import check_wheel, log_source, own_log, record_mismatch
from builder.index.txn import Transaction, WheelhouseLock, lock_for, recover_root
from builder.model.records import BuildRecord, RecordShapeError, check_record_json
from builder.stages.repair import (
    PortabilityReport,
    check_portability,
    portability_report,
)

MAX_RECORD_FILE = 16 << 20  # records/<wheel>.json: the cap `index pull` reads a published one with (MAX_RECORD)
class DamagedRecord(PublishError):
    """records/<wheel>.json that is no JSON file at all (a folder, a fifo, not UTF-8 or not JSON, over the cap): one
    line naming it, as for a record with a wrong-typed field (the command stops; nothing was changed)."""


_RECORD_CURE = ("fix or delete that record (a wheel without one is still listed), or publish the wheel again, "
                "then run `builder index rebuild`")


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


class Wheelhouse(Layout):
    """One wheelhouse: its paths (``Layout``) and every change to it, each one transaction under its lock."""

    def __init__(self, root: Path, parent: Wheelhouse | None = None) -> None:
        super().__init__(root)
        self.parent = parent

    # ------------------------------------------------------------------ the API the pipeline and gate use

    def staging(self) -> Wheelhouse:
        """The staging area: built and import-tested wheels waiting for kernel tests on a GPU machine."""
        return Wheelhouse(self.staging_paths().root, parent=self)

    def contains(self, wheel: Path) -> bool:
        return wheel.resolve().parent == self.wheels.resolve()

    def record_of(self, wheel_name: str) -> BuildRecord | None:
        """The wheel's record (records/<wheel>.json), also one written by an older builder; None if it has none.
        A record with a field of the wrong type is a PublishError naming the file and the field."""
        data = self.record_json(wheel_name)
        return BuildRecord.from_json(data) if data is not None else None

    def record_json(self, wheel_name: str) -> dict[str, Any] | None:
        """records/<wheel>.json as JSON, its known fields checked (``check_record_json``); None without one (or one
        that is not a JSON object). Too large or wrong-typed: a PublishError naming the file (and the field)."""
        path = self.record_file(wheel_name)
        try:  # a folder, fifo or device there is refused unopened; over the cap, not UTF-8, not JSON: one line
            data = read_json(path, limit=MAX_RECORD_FILE)
        except FileNotFoundError:
            return None
        except StateFileError as e:
            raise DamagedRecord(f"{e} (a build record); nothing was changed", _RECORD_CURE) from e
        if not isinstance(data, dict):
            return None
        try:
            check_record_json(data)
        except RecordShapeError as e:
            raise PublishError(f"{path}: {e}; nothing was changed", _RECORD_CURE) from e
        return data

    def lock(self) -> WheelhouseLock:
        return lock_for(self.root)

    def index_url(self) -> str:
        return _uri(self.root, self.simple)

    def channel_url(self, label: str) -> str:
        return _uri(self.root, self.index(label))

    def channel_url_template(self) -> str:
        """``file:///…/channels/<channel>/simple``: a channel's URL with its label left open (for messages)."""
        return self.channel_url("LABEL").replace("/LABEL/", "/<channel>/")

    def labels(self) -> list[str]:
        """The channels of the published wheels (the labels of ``channels/<label>/simple/``): each per-torch
        wheel's label, each torch a stable-ABI wheel was verified on (``checks.wheel_channels``)."""
        return sorted({label for w in self.listed_wheels() for label in self.channels_of(w.name)})

    def channels_of(self, wheel_name: str) -> tuple[str, ...]:
        """The channels that list this wheel, from its file name and record (``checks.wheel_channels``): its own
        label for a per-torch wheel; for a stable-ABI wheel one per verified torch, () before any check passed."""
        return wheel_channels(wheel_name, self._read_record(wheel_name))

    def assets(self) -> AssetStore | None:
        """Where this wheelhouse publishes its wheels as release assets (``assets.json``), or None."""
        return read_assets(self)

    def recover(self) -> None:
        """Finish or drop a transaction a killed publisher left behind (every other method does this first)."""
        if self.root.is_dir():
            with self.lock():
                recover_root(self.root)

    def publish(self, wheel: Path, record: BuildRecord, *, replace: bool = False,
                portability: PortabilityReport | None = None) -> Path:
        """Copy ``wheel`` in with its metadata sidecar, record and build log, and regenerate every page, as one
        transaction (see ``Transaction``): afterwards the wheelhouse is either as it was or holds the wheel,
        listed everywhere with its hash. The record gains ``wheel_sha256``, what the unchanged check verifies.

        Refuses (PublishError) a wheel whose METADATA Name/Version differ from its file name, one that would
        replace a published wheel of the same file name built for another arch set, unless ``replace``, and, where
        the wheels are release assets (``assets()``), any other bytes under a published file name; refuses
        (PortabilityError, exit 13) one that vendors libtorch/libc10/libcudart or whose objects need a newer glibc
        than its manylinux tag promises (stages/repair.py). ``portability`` is the report inspection already made
        of this file (a build and a promotion give it); without one it is made here.
        Returns the published path.
        """
        metadata = check_wheel(wheel)  # first: a file that is not a well-formed wheel is a PublishError
        if record.subset is not None:
            raise PublishError(f"refusing to publish {wheel.name}: it is a [[subset]] build ({record.subset}) of "
                               f"{record.package}, made for tests only; nothing was changed",
                               "build it without --subset to publish it")
        if portability is None or portability.wheel != wheel.name:
            portability = portability_report(wheel)
        check_portability(portability)
        source = log_source(wheel, record)
        digest = sha256_file(wheel)
        record = record.with_(wheel_sha256=digest)
        txn = Transaction(self.root)
        try:
            with self.lock():
                recover_root(self.root)
                assets = self.assets()
                if assets is not None:
                    self._check_immutable(wheel.name, digest, assets)
                self._check_plain_beside(wheel.name)
                if not replace and not self.staging().contains(wheel):  # a promotion was checked when staged
                    self._check_arch_set(wheel.name, record)
                    if self.parent is not None:
                        self.parent._check_arch_set(wheel.name, record)
                entry = self._stage_wheel(txn, wheel, metadata, record, source, digest)
                entries = [e for e in self._entries() if e.filename != wheel.name] + [entry]
                self._commit(txn, sorted(entries, key=lambda e: e.filename), f"publishing {wheel.name} into",
                             assets=assets)
        except OSError as e:  # while staging the wheel, sidecar, record or log (_commit raises PublishError)
            txn.abort()
            raise PublishError(f"publishing {wheel.name} into {self.root} failed: {e}; nothing was changed",
                               "free space (or fix the permissions) and run the build again") from e
        self._refresh_parent()
        return self.wheel_file(wheel.name)

    def remove(self, wheel_name: str) -> None:
        """Take a wheel, its sidecar, record and log out (after promotion), in one transaction with the pages."""
        with self.lock():
            recover_root(self.root)
            entries = [e for e in self._entries() if e.filename != wheel_name]
            txn = Transaction(self.root)
            txn.deletes += self._files_of(wheel_name)
            self._commit(txn, entries, f"removing {wheel_name} from", assets=self.assets())
        self._refresh_parent()

    def write_record(self, wheel_name: str, record: BuildRecord) -> None:
        """Replace a wheel's record (new test results) and the pages that show it, in one transaction."""
        with self.lock():
            recover_root(self.root)
            txn = Transaction(self.root)
            entries = []
            for entry in self._entries():
                if entry.filename == wheel_name:
                    if entry.record and entry.record.wheel_sha256 and not record.wheel_sha256:
                        record = record.with_(wheel_sha256=entry.record.wheel_sha256)
                    txn.put_bytes(self.record_file(wheel_name), record.file_bytes())
                    entry = Entry(entry.filename, entry.data, entry.metadata, record, entry.has_log)
                entries.append(entry)
            self._commit(txn, entries, f"writing the record of {wheel_name} into", assets=self.assets())
        self._refresh_parent()

    def restore(self, wheels: list[Restored], download: Callable[[Restored, BinaryIO], None], *,
                delete: bool = False, assets: AssetStore | None = None) -> RestoreResult:
        """Make this wheelhouse hold ``wheels`` (a published index, ``builder index pull``) in one transaction,
        with the published assets setting (``assets``: None where the published pages link their own wheels/).

        A wheel already here with the published sha256 is kept; any other is written by ``download`` (which
        verifies what it writes) into a temp file of the transaction, so a kill or a refused download leaves the
        old state. Sidecars, records and logs are written likewise; the pages are rendered from the new state.
        Local wheels the published index does not hold are removed with ``delete``, else kept."""
        published = {w.filename for w in wheels}
        txn = Transaction(self.root)
        fetched: list[str] = []
        kept: list[str] = []
        with txn.guarded("restoring the published index into", "free space (or fix the permissions) and pull again"), \
                self.lock():
            recover_root(self.root)
            present = {e.filename: e for e in self._entries()}
            entries = [self._restored_entry(txn, wheel, present.get(wheel.filename), download, fetched, kept)
                       for wheel in wheels]
            extra = sorted(set(present) - published)
            if delete:
                for name in extra:
                    txn.deletes += self._files_of(name)
            else:
                entries += [present[name] for name in extra]
            self._stage_small_file(txn, self.assets_file, assets.file_bytes() if assets is not None else None)
            self._commit(txn, sorted(entries, key=lambda e: e.filename), "restoring the published index into",
                         assets=assets)
        return RestoreResult(tuple(fetched), tuple(kept), tuple(extra) if delete else (),
                             () if delete else tuple(extra))

    def merge_from(self, sources: Sequence[Wheelhouse]) -> MergePlan:
        """Copy in the wheels of ``sources`` (the nightly's promoted folder of each GPU test job: ``builder index
        merge``) and merge their records with this wheelhouse's, in order, by the one rule (model/recordmerge.py),
        in one transaction with the pages. A refusal (index/merge.py ``plan_merge``: other bytes under one file
        name, a record of another wheel) is raised before anything is staged: nothing changes."""
        txn = Transaction(self.root)
        with txn.guarded("merging wheels and records into", "free space (or fix the permissions) and merge again"), \
                self.lock():
            recover_root(self.root)
            plan = plan_merge(self, sources)
            entries = [Entry(e.filename, e.data, e.metadata, plan.records.get(e.filename, e.record), e.has_log)
                       for e in self._entries()]
            for name, wheel in plan.new_wheels.items():
                metadata = check_wheel(wheel)
                entries.append(Entry(name, txn.put_copy(self.wheel_file(name), wheel),
                                     txn.put_bytes(self.sidecar_file(name), metadata),
                                     plan.records.get(name) or self._read_record(name), False, plan.digests[name]))
            for name, record in plan.records.items():
                txn.put_bytes(self.record_file(name), record.file_bytes())
            self._commit(txn, sorted(entries, key=lambda e: e.filename), "merging wheels and records into",
                         assets=self.assets())
        self._refresh_parent()
        return plan

    def find_record(self, cache_key: str) -> tuple[Path, BuildRecord] | None:
        """A published wheel built from exactly these inputs (the "unchanged, skip" check), verified: its bytes
        match the record's ``wheel_sha256`` (or, for records older than that field, the wheel's own embedded
        cache key), and the pages list it with its hash, else the pages are rebuilt. A record whose wheel does
        not match is not trusted (None: the target is rebuilt and republished)."""
        if not self.records.is_dir():
            return None
        with self.lock():
            recover_root(self.root)
            for path in self.record_files():
                wheel = self.wheel_file(recorded_wheel(path))
                if split_label(wheel.name)[1] is not None:
                    continue  # a variant shares its plain wheel's inputs: the build is the plain wheel
                try:
                    record = self.record_of(wheel.name)
                except OSError:
                    continue
                if record is None or record.cache_key != cache_key or not wheel.exists():
                    continue
                digest = sha256_file(wheel)
                problem = record_mismatch(wheel, record, digest)
                if problem:
                    log.warning(f"not trusting {path}: {problem}; rebuilding the target")
                    return None
                if not listed(self, wheel.name, digest, record):
                    log.warning(f"{wheel.name} is not listed in the pages with its sha256; rebuilding the pages")
                    self._rebuild_locked(Transaction(self.root), self.assets())
                return wheel, record
        return None

    def rebuild_index(self) -> None:
        """Regenerate everything from the wheels and records: sidecars, logs, pages, channels, dashboard."""
        with self.lock():
            recover_root(self.root)
            self._rebuild_locked(Transaction(self.root), self.assets())
        self._refresh_parent()

    def set_assets(self, assets: AssetStore | None) -> None:
        """Publish the wheels as release assets at ``assets`` (None: link them in ``wheels/`` again): the setting
        and every page regenerated with it, in one transaction (``rebuild_index`` with a new ``assets.json``)."""
        with self.lock():
            recover_root(self.root)
            txn = Transaction(self.root)
            self._stage_small_file(txn, self.assets_file, assets.file_bytes() if assets is not None else None)
            self._rebuild_locked(txn, assets)
        self._refresh_parent()

    def refresh_dashboard(self) -> None:
        with self.lock():
            recover_root(self.root)
            txn = Transaction(self.root)
            try:
                stage_dashboard(txn, self, self._entries(), staging_area=self.parent is not None,
                                assets=self.assets())
                txn.commit()
            except OSError as e:
                if txn.committed():
                    raise PublishError(f"refreshing the dashboard of {self.root} failed after its commit: {e}",
                                       "run `builder index rebuild`") from e
                txn.abort()  # the dashboard is a view, not the index: a stale one is rewritten by the next publish

    # ------------------------------------------------------------------ the parts (caller holds the lock)

    def _check_immutable(self, wheel_name: str, digest: str, assets: AssetStore) -> None:
        """A published asset's URL keeps its bytes: other bytes under a file name held here are refused."""
        held = self.wheel_file(wheel_name)
        if held.exists() and sha256_file(held) != digest:
            raise PublishError(
                f"refusing to publish {wheel_name}: its release asset {assets.url_of(wheel_name)} already holds "
                f"other bytes (sha256 {sha256_file(held)}, this file {digest}); a URL's bytes never change",
                "publish it under a new file name (a new version or build tag), or keep the published wheel",
            )

    def _check_plain_beside(self, wheel_name: str) -> None:
        """A variant (PEP 825) is published only beside its plain wheel: a tool that knows no variants skips every
        variant file, and must still find the release."""
        plain, label = split_label(wheel_name)
        areas = [self, *([self.parent] if self.parent is not None else [])]  # staged beside a published one too
        if label is not None and not any(area.wheel_file(plain).is_file() for area in areas):
            raise PublishError(f"refusing to publish the {label} variant {wheel_name} into {self.root}: its plain "
                               f"wheel {plain} is not there (pip, and uv without --preview-features wheel-variants, "
                               "would find no file of this release)",
                               "publish (or promote) the plain wheel first")

    def _check_arch_set(self, wheel_name: str, record: BuildRecord) -> None:
        old = self._read_record(wheel_name) if self.wheel_file(wheel_name).exists() else None
        if not old or not old.archs or not record.archs:  # pure Python, or a record without archs
            return
        before, after = sorted(old.archs), sorted(record.archs)
        if before != after:
            raise PublishError(
                f"refusing to replace {self.wheel_file(wheel_name)}: it was built for "
                f"{', '.join(before) or 'no arch'}, this build is for {', '.join(after) or 'no arch'}; users of the "
                "published wheel would lose its archs",
                "build the union of both arch lists, or give --replace to replace it anyway",
            )

    def _stage_wheel(self, txn: Transaction, wheel: Path, metadata: bytes, record: BuildRecord,
                     source: Path | None, digest: str) -> Entry:
        """Stage the wheel (unless it is the published file itself), its sidecar, record and build log."""
        dest, log_file = self.wheel_file(wheel.name), self.log_file(wheel.name)
        same_file = dest.exists() and wheel.resolve() == dest.resolve()
        data = dest if same_file else txn.put_copy(dest, wheel)
        sidecar = txn.put_bytes(self.sidecar_file(wheel.name), metadata)
        txn.put_bytes(self.record_file(wheel.name), record.file_bytes())
        has_log = log_file.exists()
        if source is not None and source.resolve() != log_file.resolve():
            txn.put_copy(log_file, source)
            has_log = True
        return Entry(wheel.name, data, sidecar, record, has_log, digest)

    def _restored_entry(self, txn: Transaction, wheel: Restored, old: Entry | None,
                        download: Callable[[Restored, BinaryIO], None], fetched: list[str], kept: list[str]) -> Entry:
        """Keep a restored wheel that is here with its published bytes, else stage its download; then stage its
        sidecar, record and log where they differ from what is here."""
        if old and old.data.stat().st_size == wheel.size and sha256_file(old.data) == wheel.sha256:
            data = old.data
            kept.append(wheel.filename)
        else:
            data = txn.put_stream(self.wheel_file(wheel.filename), lambda f: download(wheel, f))
            fetched.append(wheel.filename)
        if wheel.mtime_ns is not None:
            os.utime(data, ns=(wheel.mtime_ns, wheel.mtime_ns))
        if check_wheel(data, wheel.filename) != wheel.metadata:
            raise PublishError(f"refusing to restore {wheel.filename}: its .metadata sidecar is not "
                               "the wheel's METADATA", "run `builder index rebuild` where it is published")
        sidecar = self.sidecar_file(wheel.filename)
        if not sidecar.is_file() or sidecar.read_bytes() != wheel.metadata:
            sidecar = txn.put_bytes(sidecar, wheel.metadata)
        self._stage_small_file(txn, self.record_file(wheel.filename),
                               wheel.record.file_bytes() if wheel.record is not None else None)
        self._stage_small_file(txn, self.log_file(wheel.filename), wheel.log)
        return Entry(wheel.filename, data, sidecar, wheel.record, wheel.log is not None, wheel.sha256)

    @staticmethod
    def _stage_small_file(txn: Transaction, path: Path, data: bytes | None) -> None:
        """``path`` holds ``data`` after the commit (staged only where it differs), or is gone when None."""
        if data is None:
            txn.deletes.append(path)
        elif not path.is_file() or path.read_bytes() != data:
            txn.put_bytes(path, data)

    def _rebuild_locked(self, txn: Transaction, assets: AssetStore | None) -> None:
        """Every sidecar, log and page regenerated from the wheels into ``txn`` (which may hold more: a new
        ``assets.json``), committed; nothing changes if any step fails."""
        try:
            entries = []
            for entry in self._entries():
                wheel = entry.data
                metadata = check_wheel(wheel)
                sidecar = entry.metadata
                if not sidecar.exists() or sidecar.read_bytes() != metadata:
                    sidecar = txn.put_bytes(entry.metadata, metadata)
                has_log = entry.has_log
                source = log_source(wheel, entry.record)
                if not has_log and source is not None and own_log(source, self, entry.record):
                    txn.put_copy(self.log_file(entry.filename), source)
                    has_log = True
                entries.append(Entry(entry.filename, wheel, sidecar, entry.record, has_log))
            self._commit(txn, entries, "rebuilding the index of", rehash=True, assets=assets)
        except BaseException:
            if not txn.committed():
                txn.abort()
            raise

    def _commit(self, txn: Transaction, entries: list[Entry], doing: str, *, assets: AssetStore | None,
                rehash: bool = False) -> None:
        """Stage every page for ``entries`` into ``txn`` (linking the wheels at ``assets``, the setting this
        transaction leaves) and commit it (``Transaction.finish``)."""
        txn.finish(lambda: stage_pages(txn, self, entries, staging_area=self.parent is not None, rehash=rehash,
                                       assets=assets), doing)

    def listed_wheels(self, *, warn: bool = False) -> list[Path]:
        """The wheels the pages list: every one but a variant whose plain wheel is gone (``warn``: one warning each),
        since pip and uv without the variants preview skip every variant file and would find nothing."""
        wheels = self.wheel_files()
        names = {w.name for w in wheels} | ({w.name for w in self.parent.wheel_files()} if self.parent else set())
        kept = []
        for w in wheels:
            plain, label = split_label(w.name)
            if label is not None and plain not in names:
                if warn:
                    log.warning(f"{w}: the {label} variant of {plain}, which is not in {self.wheels}; left out of "
                                "the pages (publish the plain wheel again, or delete the variant)")
                continue
            kept.append(w)
        return kept

    def _entries(self) -> list[Entry]:
        """The committed state, as the pages should show it (``listed_wheels``)."""
        return [Entry(w.name, w, self.sidecar_file(w.name), self._read_record(w.name), self.log_file(w.name).is_file())
                for w in self.listed_wheels(warn=True)]

    def _read_record(self, wheel_name: str) -> BuildRecord | None:
        try:
            return self.record_of(wheel_name)
        except OSError:
            return None

    def _files_of(self, wheel_name: str) -> list[Path]:
        """Every file a wheel has here: the wheel, its sidecar, record and log."""
        return [self.wheel_file(wheel_name), self.sidecar_file(wheel_name), self.record_file(wheel_name),
                self.log_file(wheel_name)]

    def _refresh_parent(self) -> None:
        if self.parent is not None and self.parent.root.is_dir():
            self.parent.refresh_dashboard()



def _uri(root: Path, folder: Path) -> str:
    """A file:// URL of an index folder through the wheelhouse's own ``simple``/``channels`` links, never the
    generation they point at now (that one is pruned two publishes later); the wheelhouse's own path is resolved."""
    return (root.resolve() / folder.relative_to(root)).as_uri()
