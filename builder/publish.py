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

Every file is written to a temp name in its folder and ``os.replace``d, under one lock (``.publish.lock``), and
every page is regenerated from the wheels and records each time: readers never see a half-written page or wheel,
concurrent publishers lose nothing, and the pages cannot drift from the wheels.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import tempfile
import time
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from filelock import FileLock
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from .errors import BuilderError, PublishError
from .source import sha256_file
from .wheelfile import dist_info_dir

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


def check_wheel(wheel: Path) -> bytes:
    """The wheel's METADATA bytes, after checking that its Name and Version agree with the file name."""
    try:
        name, version, _, _ = parse_wheel_filename(wheel.name)
    except InvalidWheelFilename as e:
        raise PublishError(f"refusing to publish {wheel.name}: not a valid wheel file name ({e})") from e
    try:
        with zipfile.ZipFile(wheel) as zf:  # read METADATA alone: wheels can be hundreds of MB
            names = {info.filename: b"" for info in zf.infolist() if not info.is_dir()}
            data = zf.read(f"{dist_info_dir(names, wheel.name)}/METADATA")
    except KeyError:
        raise PublishError(f"refusing to publish {wheel.name}: it has no .dist-info/METADATA") from None
    except BuilderError as e:
        raise PublishError(f"refusing to publish {wheel.name}: {e.message}") from e
    except (zipfile.BadZipFile, OSError) as e:
        raise PublishError(f"refusing to publish {wheel.name}: not a readable wheel ({e})") from e
    headers = HeaderParser().parsestr(data.decode("utf-8", "replace"))
    meta_name, meta_version = headers.get("Name"), headers.get("Version")
    try:
        parsed = Version(meta_version or "")
    except InvalidVersion:
        parsed = None
    if parsed != version:
        raise PublishError(
            f"refusing to publish {wheel.name}: its METADATA says Version: {meta_version} "
            f"but the file name says {version}",
            "rebuild it so that both agree (finalize_wheel rewrites the name and METADATA together)",
        )
    if canonicalize_name(meta_name or "") != canonicalize_name(name):
        raise PublishError(
            f"refusing to publish {wheel.name}: its METADATA says Name: {meta_name} but the file name says {name}",
            "rebuild it so that both agree",
        )
    return data


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

    def record_of(self, wheel_name: str) -> dict[str, object] | None:
        path = self.records / f"{wheel_name}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def remove(self, wheel_name: str) -> None:
        """Take a wheel, its sidecar, record and log out (after promotion); the pages stop naming it first."""
        with self.lock():
            self._write_index(exclude={wheel_name})
            for path in (self.wheels / wheel_name, self.wheels / f"{wheel_name}.metadata",
                         self.records / f"{wheel_name}.json", self.logs / f"{wheel_name}.log"):
                path.unlink(missing_ok=True)
        self._refresh_parent()

    def write_record(self, wheel_name: str, record: dict[str, object]) -> None:
        """Replace a wheel's record (new test results) and regenerate the pages that show it."""
        with self.lock():
            self.records.mkdir(parents=True, exist_ok=True)
            _atomic_write(self.records / f"{wheel_name}.json", json.dumps(record, indent=2, sort_keys=True))
            self._write_index()
        self._refresh_parent()

    def lock(self) -> FileLock:
        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / ".publish.lock"))

    def index_url(self) -> str:
        return self.simple.resolve().as_uri()

    def channel_url(self, label: str) -> str:
        return (self.channels / label / "simple").resolve().as_uri()

    def publish(self, wheel: Path, record: dict[str, object]) -> Path:
        """Copy ``wheel`` in with its metadata sidecar, record and build log, regenerate every page.

        Refuses (PublishError) a wheel whose METADATA Name/Version differ from its file name.
        Returns the published path.
        """
        metadata = check_wheel(wheel)
        log_source = _log_source(wheel, record)
        try:
            with self.lock():
                for folder in (self.wheels, self.records):
                    folder.mkdir(parents=True, exist_ok=True)
                self._sweep_stale_temps()
                dest = self.wheels / wheel.name
                # The wheel file is the commit point: everything it needs lands first, the pages last.
                _atomic_write(self.records / f"{wheel.name}.json", json.dumps(record, indent=2, sort_keys=True))
                _atomic_write_bytes(self.wheels / f"{wheel.name}.metadata", metadata)
                if log_source is not None:
                    self.logs.mkdir(parents=True, exist_ok=True)
                    _atomic_copy(log_source, self.logs / f"{wheel.name}.log")
                if wheel.resolve() != dest.resolve():
                    _atomic_copy(wheel, dest)
                self._write_index()
        except OSError as e:
            self._undo_uncommitted(wheel.name)
            raise PublishError(f"publishing {wheel.name} into {self.root} failed: {e}") from e
        self._refresh_parent()
        return dest

    def _undo_uncommitted(self, wheel_name: str) -> None:
        """After a failed publish of a new wheel, drop the files written ahead of it (record, sidecar, log)."""
        if (self.wheels / wheel_name).exists():
            return  # a republish: the previous wheel and its files stay as they were
        for path in (self.records / f"{wheel_name}.json", self.wheels / f"{wheel_name}.metadata",
                     self.logs / f"{wheel_name}.log"):
            path.unlink(missing_ok=True)
        self._sweep_stale_temps()

    def find_record(self, cache_key: str) -> tuple[Path, dict[str, object]] | None:
        """A published wheel built from exactly these inputs, if any (the "unchanged, skip" check)."""
        if not self.records.is_dir():
            return None
        for path in sorted(self.records.glob("*.whl.json")):
            try:
                record = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            wheel = self.wheels / path.name.removesuffix(".json")
            if record.get("cache_key") == cache_key and wheel.exists():
                return wheel, record
        return None

    def _sweep_stale_temps(self) -> None:
        """Temp files of a publisher that was killed (SIGKILL, full disk) before its rename: with the lock held,
        no live writer owns any, so they are removed."""
        for path in self.root.rglob(".*"):
            if path.is_file() and path.name != ".publish.lock" and "staging" not in path.relative_to(self.root).parts[:1]:
                path.unlink(missing_ok=True)

    def rebuild_index(self) -> None:
        """Regenerate everything from the wheels and records: sidecars, logs, pages, channels, dashboard."""
        with self.lock():
            self._sweep_stale_temps()
            for wheel in self._wheel_files():
                log_copy = self.logs / f"{wheel.name}.log"
                source = _log_source(wheel, self._read_record(wheel.name))
                if not log_copy.exists() and source is not None:
                    self.logs.mkdir(parents=True, exist_ok=True)
                    _atomic_copy(source, log_copy)
            self._write_index(rehash=True)  # re-reads every METADATA, rewrites sidecars, re-hashes
        self._refresh_parent()

    def labels(self) -> list[str]:
        """The channels (local version labels) of the published wheels."""
        return sorted({lab for w in self._wheel_files() if (lab := wheel_label(w.name))})

    def refresh_dashboard(self) -> None:
        with self.lock():
            self._write_dashboard()

    # ------------------------------------------------------------------ page generation (caller holds the lock)

    def _wheel_files(self, exclude: Iterable[str] = ()) -> list[Path]:
        if not self.wheels.is_dir():
            return []
        skip = set(exclude)
        return sorted(w for w in self.wheels.glob("*.whl") if not w.name.startswith(".") and w.name not in skip)

    def _read_record(self, wheel_name: str) -> dict[str, object] | None:
        try:
            return self.record_of(wheel_name)
        except (OSError, json.JSONDecodeError):
            return None

    def _infos(self, wheels: list[Path], rehash: bool = False) -> list[WheelInfo]:
        """Index facts per wheel; hashes are reused from the previous JSON pages while size and mtime match."""
        previous = {} if rehash else self._previous_entries()
        infos = []
        for wheel in wheels:
            st = wheel.stat()
            name, version, _, _ = parse_wheel_filename(wheel.name)
            sidecar = self.wheels / f"{wheel.name}.metadata"
            old = previous.get(wheel.name)
            if (old and old.get("size") == st.st_size and old.get("upload-time") == _stamp(st.st_mtime_ns)
                    and sidecar.exists()):
                sha256, metadata_sha256 = old["hashes"]["sha256"], old["core-metadata"]["sha256"]
                requires_python = old.get("requires-python")
            else:
                if sidecar.exists() and not rehash:
                    metadata = sidecar.read_bytes()
                else:  # a wheel published before sidecars existed, or a rebuild
                    metadata = check_wheel(wheel)
                    if not sidecar.exists() or sidecar.read_bytes() != metadata:
                        _atomic_write_bytes(sidecar, metadata)
                sha256, metadata_sha256 = sha256_file(wheel), _sha256_bytes(metadata)
                requires_python = HeaderParser().parsestr(metadata.decode("utf-8", "replace")).get("Requires-Python")
                requires_python = requires_python.strip() if requires_python else None
            infos.append(WheelInfo(
                filename=wheel.name, project=str(canonicalize_name(name)), version=str(version),
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

    def _write_index(self, exclude: Iterable[str] = (), rehash: bool = False) -> None:
        infos = self._infos(self._wheel_files(exclude), rehash)
        statuses = {i.filename: _tests_summary(self._read_record(i.filename)) for i in infos}
        _write_simple(self.simple, infos, "../../wheels/", statuses)
        labels = sorted({i.label for i in infos if i.label})
        for label in labels:
            chosen = [i for i in infos if i.label == label]
            _write_simple(self.channels / label / "simple", chosen, "../../../../wheels/", statuses)
        if self.channels.is_dir():
            for stale in self.channels.iterdir():
                if stale.is_dir() and stale.name not in labels:
                    shutil.rmtree(stale, ignore_errors=True)
        if labels:
            items = [f'    <a href="{html.escape(lab)}/simple/">{html.escape(lab)}</a><br/>' for lab in labels]
            _atomic_write(self.channels / "index.html", _page("Channels", items))
        self._write_dashboard(exclude)

    def _write_dashboard(self, exclude: Iterable[str] = ()) -> None:
        from .dashboard import render_dashboard, rows_of

        rows = rows_of(self.root, self._wheel_files(exclude), area="staged" if self.parent else "published")
        staging = self.root / "staging"
        if self.parent is None and (staging / "wheels").is_dir():
            rows += rows_of(staging, Wheelhouse(staging, parent=self)._wheel_files(), area="staged",
                            prefix="staging/")
        labels = sorted({lab for w in self._wheel_files(exclude) if (lab := wheel_label(w.name))})
        _atomic_write(self.dashboard, render_dashboard(rows, labels, staging_area=self.parent is not None))

    def _refresh_parent(self) -> None:
        if self.parent is not None and self.parent.root.is_dir():
            self.parent.refresh_dashboard()


# ---------------------------------------------------------------------------------------- page writers


def _write_simple(simple: Path, infos: list[WheelInfo], wheels_href: str, statuses: dict[str, str]) -> None:
    """One simple index (combined or a channel): root + one folder per project, HTML and JSON each."""
    projects: dict[str, list[WheelInfo]] = {}
    for info in infos:
        projects.setdefault(info.project, []).append(info)
    simple.mkdir(parents=True, exist_ok=True)
    for name, files in projects.items():
        (simple / name).mkdir(exist_ok=True)
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
        _atomic_write(simple / name / "index.html", _page(f"Links for {name}", links))
        _atomic_write(simple / name / "index.json", _json({
            "meta": {"api-version": API_VERSION},
            "name": name,
            "versions": sorted({i.version for i in files}, key=Version),
            "files": [_json_file(info, wheels_href) for info in files],
        }))
    root_links = [f'    <a href="{n}/">{n}</a><br/>' for n in sorted(projects)]
    _atomic_write(simple / "index.html", _page("Simple index", root_links))
    _atomic_write(simple / "index.json", _json({
        "meta": {"api-version": API_VERSION},
        "projects": [{"name": n} for n in sorted(projects)],
    }))
    for stale in simple.iterdir():
        if stale.is_dir() and stale.name not in projects:
            shutil.rmtree(stale, ignore_errors=True)


def _json_file(info: WheelInfo, wheels_href: str) -> dict[str, object]:
    entry: dict[str, object] = {
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


def _tests_summary(record: dict[str, object] | None) -> str:
    tests = record.get("tests") if record else None
    if not isinstance(tests, dict):
        return ""
    kernel = str(tests.get("kernel_status", "not run"))
    reason = tests.get("kernel_reason")
    return f"import {tests.get('import_status')}; kernel tests {kernel}" + (f" ({reason})" if reason else "")


def _log_source(wheel: Path, record: dict[str, object] | None) -> Path | None:
    """The build log to copy in: the record's build_log, else the copy in the wheelhouse the wheel comes from."""
    build_log = record.get("build_log") if isinstance(record, dict) else None
    if isinstance(build_log, str) and build_log and Path(build_log).is_file():
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


def _atomic_write(path: Path, text: str) -> None:
    _atomic_write_bytes(path, text.encode())


def _atomic_write_bytes(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _atomic_copy(src: Path, dest: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
