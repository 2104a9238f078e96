"""Which torch releases an index serves, for which CUDA and Python: read from the index itself.

The release list comes from the index's simple API (PEP 691 JSON where served, PEP 503 HTML otherwise). A
release's CUDA comes, in this order, from

- a ``+cu128`` local label (PyTorch's channel indexes): no request at all;
- the METADATA of one of its Linux wheels, read through PEP 658 (``<wheel-url>.metadata``, a few KB);
- where an index (or a proxy in front of it) does not serve that file, the METADATA member of the same wheel read
  with HTTP range requests (the zip's central directory and one member: well under 1% of the wheel, as pip's
  lazy-wheel does); a ``file://`` wheel is opened directly.

``nvidia-cuda-runtime-cu12==12.8.90`` → 12.8, ``cuda-toolkit[...]==13.2.2`` → 13.2, ``nvidia-cuda-runtime==13.x``
→ 13.x; no CUDA requirement at all → cpu. Releases before torch 2.0 are not classified (their CUDA was bundled
inside the wheel, so "no CUDA requirement" did not mean cpu).

A wheel file never changes once published, so a release classified once is never fetched again: the cache
(``<cache>/index/torch-<index>.json``) keeps every classification and re-reads only the release list after its
time-to-live (24 h; ``BUILDER_INDEX_TTL`` seconds, ``BUILDER_INDEX_REFRESH=1`` or ``--refresh`` to re-read now).
With ``--offline``, or when the index cannot be reached, the cache answers (however old); with no cache, the
snapshot shipped in the package (builder/data/torch-snapshot.json, written only by
``builder torch-table --write-snapshot``) answers, and every row says so.
"""

from __future__ import annotations

import calendar
import io
import json
import os
import re
import time
import urllib.error
import urllib.parse
import zipfile
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, replace
from email.parser import HeaderParser
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from builder.core import net
from builder.core.fsutil import atomic_write
from builder.core.log import log
from builder.core.settings import Settings
from builder.model.cuda import CudaVersion

PYPI_SIMPLE = "https://pypi.org/simple"
PYTORCH_INDEX = "https://download.pytorch.org/whl/{flavour}"
# PyTorch's CUDA channels we know by name; what they hold is discovered like any index when it is reachable.
PYTORCH_CHANNELS = ("cu126", "cu128", "cu129", "cu130", "cu132")
SNAPSHOT = Path(__file__).resolve().parent / "data" / "torch-snapshot.json"
DEFAULT_TTL_S = 24 * 3600
UNREACHABLE_RETRY_S = 3600
MIN_TORCH = Version("2.0")
WORKERS = 4
ACCEPT = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
# Requirements that name the CUDA runtime a torch wheel was built with.
_CUDA_PINS = ("cuda-toolkit", "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu11", "nvidia-cuda-runtime-cu12",
              "nvidia-cuda-runtime-cu13")


@dataclass(frozen=True)
class Release:
    """One torch release on one index: its CUDA ("13.2", "cpu", or None when it could not be read)."""

    version: str  # public version: 2.11.0 (also for 2.11.0+cu128 on a channel)
    cuda: str | None
    pythons: tuple[str, ...]  # 3.11, 3.12, 3.13t ... from the wheel names
    evidence: str  # how the CUDA was read: "METADATA: cuda-toolkit==13.2.2", "+cu128 label", ...
    read_at: str  # when the CUDA was read (ISO time, UTC)
    uploaded: str = ""  # its first wheel's upload time (PEP 700 ``upload-time``, ISO UTC); "" where not served


@dataclass(frozen=True)
class Listing:
    """What one index serves; ``source`` is where this answer came from: index, cache or snapshot."""

    name: str
    url: str
    releases: tuple[Release, ...]
    source: str
    read_at: str  # when the release list was read from the index
    note: str = ""

    def torch_by_cuda(self) -> dict[str, tuple[str, ...]]:
        table: dict[str, list[str]] = {}
        for release in self.releases:
            if release.cuda is not None:
                table.setdefault(release.cuda, []).append(release.version)
        return {cuda: tuple(sorted(v, key=Version)) for cuda, v in sorted(table.items(), key=lambda kv: _cuda_sort(kv[0]))}

    def release(self, version: str) -> Release | None:
        public = Version(version).public
        return next((r for r in self.releases if Version(r.version) == Version(public)), None)


@dataclass(frozen=True)
class WheelFile:
    filename: str
    url: str
    metadata: bool | None  # PEP 658/714: True served, False not, None the index did not say
    uploaded: str = ""  # PEP 700 upload-time (JSON pages only)


# ---------------------------------------------------------------- classification (pure functions)


def cuda_from_label(version: str) -> str | None:
    """``2.11.0+cu128`` → ``12.8``; ``+cpu`` → ``cpu``; no label → None."""
    local = Version(version).local
    if local is None:
        return None
    if local == "cpu":
        return "cpu"
    cuda = CudaVersion.from_flavour(local)
    return cuda.line if cuda else None


def cuda_from_requirements(requires: Iterable[str]) -> tuple[str, str]:
    """(cuda, evidence) from a wheel's Requires-Dist lines; no CUDA pin → ("cpu", ...)."""
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) not in _CUDA_PINS:
            continue
        for spec in req.specifier:
            if spec.operator in ("==", "===", "~="):
                try:
                    v = Version(spec.version.rstrip(".*"))
                except InvalidVersion:
                    continue
                extras = f"[{','.join(sorted(req.extras))}]" if req.extras and len(req.extras) < 3 else (
                    "[...]" if req.extras else "")
                return CudaVersion.of(v).line, f"METADATA: {req.name}{extras}{spec}"
    return "cpu", "METADATA: no CUDA requirement"


def requires_dist(metadata: str) -> list[str]:
    return HeaderParser().parsestr(metadata).get_all("Requires-Dist") or []


def python_of(filename: str) -> tuple[str, ...]:
    """``torch-2.15.0-cp312-cp312-manylinux...whl`` → ("3.12",); free-threaded cp313t → ("3.13t",)."""
    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return ()
    out = set()
    for tag in tags:
        match = re.fullmatch(r"cp(\d)(\d+)", tag.interpreter)
        if match:
            out.add(f"{match.group(1)}.{match.group(2)}" + ("t" if tag.abi.endswith("t") else ""))
    return tuple(sorted(out))


def _linux_order(wheel: WheelFile) -> tuple[int, int, str]:
    """Linux x86_64 wheels first (the ones with CUDA requirements), cp312 first among them."""
    name = wheel.filename
    platform = 0 if "linux" in name and "x86_64" in name else 1 if "linux" in name else 2
    return platform, 0 if "-cp312-" in name else 1, name


# ---------------------------------------------------------------- reading an index


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.files: list[dict[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.files.append(dict(attrs))


def _get(url: str, accept: str | None = None, byte_range: str | None = None) -> tuple[bytes, str]:
    """The body and Content-Type at ``url``, under the network policy (core/net.py)."""
    headers = {}
    if accept:
        headers["Accept"] = accept
    if byte_range:
        headers["Range"] = byte_range

    def read(response: net.Body) -> tuple[bytes, str]:
        if byte_range and response.status != 206:  # a server that ignores Range would send the whole wheel
            raise OSError(f"{url}: the server ignored the range request")
        return response.read(), response.headers.get("Content-Type", "") or ""

    return net.open_url(url, read, headers=headers)


def project_files(index_url: str, project: str = "torch") -> list[WheelFile]:
    """The wheel files of ``project`` on a simple index (PEP 691 JSON, else PEP 503 HTML; yanked left out)."""
    page = f"{index_url.rstrip('/')}/{canonicalize_name(project)}/"
    if page.startswith("file://"):
        local = Path(urllib.parse.unquote(urllib.parse.urlparse(page).path))
        json_page = local / "index.json"
        body, kind = (json_page.read_bytes(), "json") if json_page.exists() else ((local / "index.html").read_bytes(), "html")
    else:
        body, kind = _get(page, ACCEPT)
    files: list[WheelFile] = []
    if "json" in kind:
        for f in json.loads(body).get("files", []):
            if f.get("yanked") or not f["filename"].endswith(".whl"):
                continue
            meta = f.get("core-metadata", f.get("dist-info-metadata"))
            files.append(WheelFile(f["filename"], urllib.parse.urljoin(page, f["url"]),
                                   None if meta is None else bool(meta), str(f.get("upload-time") or "")))
        return files
    parser = _Anchors()
    parser.feed(body.decode(errors="replace"))
    for attrs in parser.files:
        href = attrs.get("href") or ""
        url = urllib.parse.urljoin(page, href).split("#", 1)[0]
        name = urllib.parse.unquote(url.rsplit("/", 1)[-1])
        if not name.endswith(".whl") or "data-yanked" in attrs:
            continue
        # PEP 714/658: the attribute's presence (any value but "false") says a .metadata file is served
        said = "data-core-metadata" in attrs or "data-dist-info-metadata" in attrs
        meta = attrs.get("data-core-metadata", attrs.get("data-dist-info-metadata"))
        files.append(WheelFile(name, url, meta != "false" if said else None))
    return files


class _Seekable(io.RawIOBase):
    """A read-only file of ``size`` bytes whose position is tracked here (subclasses implement read)."""

    size: int
    pos: int

    def seekable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else self.size + offset
        return self.pos


class _RangeReader(_Seekable):
    """A seekable read-only view of a remote file through HTTP range requests (for zipfile)."""

    def __init__(self, url: str, size: int) -> None:
        self.url, self.size, self.pos, self.requests = url, size, 0, 0

    def read(self, n: int = -1) -> bytes:
        end = self.size if n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        self.requests += 1
        if self.requests > 16:
            raise OSError(f"{self.url}: too many range requests")
        body, _ = _get(self.url, byte_range=f"bytes={self.pos}-{end - 1}")
        self.pos += len(body)
        return body


def _remote_size(url: str) -> int:
    def size(response: net.Body) -> int:
        if response.headers.get("Accept-Ranges", "").lower() != "bytes":
            raise OSError(f"{url}: no range requests")
        return int(response.headers["Content-Length"])

    return net.open_url(url, size, method="HEAD")


def _metadata_from_zip(file: Any, filename: str) -> str:
    with zipfile.ZipFile(file) as archive:
        name = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1), None)
        if name is None:
            raise zipfile.BadZipFile("no .dist-info/METADATA member")
        return archive.read(name).decode()


def wheel_metadata(wheel: WheelFile) -> tuple[str, str]:
    """(METADATA text, how it was read) of one wheel, never downloading the wheel."""
    if wheel.url.startswith("file://"):
        path = Path(urllib.parse.unquote(urllib.parse.urlparse(wheel.url).path))
        sidecar = path.with_name(path.name + ".metadata")
        if sidecar.exists():
            return sidecar.read_text(), "PEP 658"
        return _metadata_from_zip(path, wheel.filename), "local wheel"
    if wheel.metadata is not False:
        try:
            return _get(wheel.url + ".metadata")[0].decode(), "PEP 658"
        except urllib.error.HTTPError as e:
            if e.code != 404:
                raise
    reader = _RangeReader(wheel.url, _remote_size(wheel.url))
    # The last 64 KB hold the end-of-central-directory record; it says where the central directory starts, which
    # is then read in one request (a torch wheel's is about 1-2 MB); zipfile then reads the one member.
    tail_size = min(reader.size, 64 * 1024)
    reader.seek(reader.size - tail_size)
    tail = reader.read(tail_size)
    start = reader.size - tail_size
    at = tail.rfind(b"PK\x05\x06")
    if at >= 0 and len(tail) >= at + 22:
        cd_offset = int.from_bytes(tail[at + 16:at + 20], "little")
        if cd_offset != 0xFFFFFFFF and cd_offset < start:  # (zip64: read on demand instead)
            reader.seek(cd_offset)
            tail = reader.read(start - cd_offset) + tail
            start = cd_offset
    buffered = _TailBuffer(reader, tail, start)
    return _metadata_from_zip(buffered, wheel.filename), "range read of the wheel's METADATA"


class _TailBuffer(_Seekable):
    """The last bytes of a remote file held in memory; reads before them go to the range reader."""

    def __init__(self, reader: _RangeReader, tail: bytes, start: int) -> None:
        self.reader, self.tail, self.start, self.pos, self.size = reader, tail, start, 0, reader.size

    def read(self, n: int = -1) -> bytes:
        end = self.reader.size if n < 0 else min(self.reader.size, self.pos + n)
        if self.pos >= self.start:
            data = self.tail[self.pos - self.start:end - self.start]
        else:
            self.reader.seek(self.pos)
            data = self.reader.read(end - self.pos)
        self.pos += len(data)
        return data


def classify(version: str, wheels: list[WheelFile], now: str) -> Release:
    """One release's CUDA: from its label, else from the METADATA of its first readable Linux wheel."""
    pythons = tuple(sorted({p for w in wheels for p in python_of(w.filename)}, key=_python_sort))
    public = str(Version(version).public)
    labelled = cuda_from_label(version)
    if labelled is not None:
        return Release(public, labelled, pythons, f"+{Version(version).local} label", now)
    errors: list[str] = []
    for wheel in sorted(wheels, key=_linux_order)[:3]:
        if "linux" not in wheel.filename:
            break
        try:
            text, how = wheel_metadata(wheel)
        except (OSError, urllib.error.URLError, zipfile.BadZipFile, StopIteration, UnicodeDecodeError) as e:
            errors.append(f"{wheel.filename}: {e}")
            continue
        cuda, evidence = cuda_from_requirements(requires_dist(text))
        return Release(public, cuda, pythons, f"{evidence} ({how}, {wheel.filename})", now)
    if not any("linux" in w.filename for w in wheels):
        return Release(public, None, pythons, "no Linux wheel", now)
    return Release(public, None, pythons, "METADATA unreadable: " + "; ".join(errors)[:300], now)


# ---------------------------------------------------------------- discovery with cache and snapshot


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _age_s(stamp: str) -> float:
    try:
        return time.time() - calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return float("inf")


def cache_file(settings: Settings, url: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "_", url.split("://", 1)[-1]).strip("_")[:120]
    return settings.cache("index") / f"torch-{slug}.json"


def _to_json(listing: Listing) -> dict[str, Any]:
    return {"name": listing.name, "url": listing.url, "read_at": listing.read_at, "note": listing.note,
            "releases": [asdict(r) for r in listing.releases]}


def _from_json(data: Mapping[str, Any], source: str) -> Listing:
    releases = tuple(Release(r["version"], r.get("cuda"), tuple(r.get("pythons", ())), r.get("evidence", ""),
                             r.get("read_at", ""), r.get("uploaded", "")) for r in data.get("releases", []))
    return Listing(str(data["name"]), str(data["url"]), releases, source, str(data.get("read_at", "")),
                   str(data.get("note", "")))


def load_snapshot(path: Path = SNAPSHOT) -> dict[str, Listing]:
    """The shipped snapshot, by index URL (empty when the file is missing)."""
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {entry["url"]: _from_json(entry, "snapshot") for entry in data.get("indexes", [])}


def ttl_s(env: Mapping[str, str] = os.environ) -> float:
    try:
        return float(env.get("BUILDER_INDEX_TTL", DEFAULT_TTL_S))
    except ValueError:
        return DEFAULT_TTL_S


def discover(name: str, url: str, settings: Settings | None, *, refresh: bool = False,
             env: Mapping[str, str] = os.environ, pre: bool = False) -> Listing:
    """What ``url`` serves: the fresh cache, else the index (classifying only new releases), else the stale
    cache, else the snapshot. ``settings=None``: the snapshot only (no cache, no network). ``pre``: pre-releases
    (2.16.0rc1) too, in a cache of their own (the snapshot has none)."""
    url = url.rstrip("/")
    snapshot = load_snapshot().get(url)
    if settings is None:
        return snapshot or Listing(name, url, (), "snapshot", "", "not in the snapshot")
    path = cache_file(settings, url)
    if pre:
        path = path.with_name(path.stem + "-pre.json")
    cached: Listing | None = None
    if path.exists():
        try:
            cached = _from_json(json.loads(path.read_text()), "cache")
        except (OSError, json.JSONDecodeError, KeyError, TypeError):
            cached = None
    refresh = refresh or env.get("BUILDER_INDEX_REFRESH") == "1"
    if cached is not None and not refresh and (settings.offline or _age_s(cached.read_at) < ttl_s(env)):
        return replace(cached, name=name)
    # an index that could not be read is not asked again for an hour (a timeout each plan would be slow) while a
    # cached or shipped list can answer; with nothing else it is asked again. A local folder is read offline too.
    unreachable = path.with_name(path.name + ".unreachable")
    failed_at, why = _unreachable_note(unreachable)
    recently_failed = _age_s(failed_at) < UNREACHABLE_RETRY_S and (cached or snapshot) is not None
    if (not settings.offline or url.startswith("file://")) and (refresh or not recently_failed):
        try:
            listing = read_index(name, url, known=_known(cached, snapshot), pre=pre)
        except (OSError, urllib.error.URLError, ValueError) as e:
            why = str(e)[:300]
            atomic_write(unreachable, f"{_now()}\n{why}\n")
            log.warning(f"torch index {url} not readable ({why}); using "
                        + ("the cached list" if cached else "the shipped snapshot" if snapshot else "nothing"))
        else:
            atomic_write(path, json.dumps(_to_json(listing), indent=1))
            unreachable.unlink(missing_ok=True)
            return listing
    if cached is not None:
        return replace(cached, name=name)
    if snapshot is not None:
        return replace(snapshot, name=name)
    reason = "offline" if settings.offline and not url.startswith("file://") else f"not reachable: {why}" if why \
        else "not reachable"
    return Listing(name, url, (), "none", "", f"{reason}; not cached, not in the snapshot")


def _unreachable_note(marker: Path) -> tuple[str, str]:
    """(when, why) an index was last found unreadable: the marker's two lines; ("", "") when there is none."""
    try:
        lines = marker.read_text().splitlines()
    except OSError:
        return "", ""
    return (lines[0].strip() if lines else ""), (lines[1].strip() if len(lines) > 1 else "")


def _known(cached: Listing | None, snapshot: Listing | None) -> dict[str, Release]:
    """Classifications already read from this index's wheels (immutable files: never read twice)."""
    known: dict[str, Release] = {}
    for listing in (snapshot, cached):
        for release in listing.releases if listing else ():
            if release.cuda is not None and not release.evidence.startswith("release notes"):
                known[release.version] = release
    return known


def read_index(name: str, url: str, *, known: Mapping[str, Release] = {}, project: str = "torch",
               pre: bool = False) -> Listing:
    """Read the release list of ``url`` now; classify the releases not in ``known`` (a few at a time). Final
    releases only, unless ``pre`` (release candidates, alphas, betas: never dev builds)."""
    now = _now()
    by_version: dict[str, list[WheelFile]] = {}
    for wheel in project_files(url, project):
        try:
            _, parsed, _, _ = parse_wheel_filename(wheel.filename)
        except InvalidWheelFilename:
            continue
        if (parsed.is_prerelease and not pre) or parsed.is_devrelease or Version(parsed.public) < MIN_TORCH:
            continue
        by_version.setdefault(str(parsed), []).append(wheel)
    todo = {v: w for v, w in by_version.items()
            if str(Version(v).public) not in known or cuda_from_label(v) is not None}
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        fresh = dict(zip(todo, pool.map(lambda item: classify(item[0], item[1], now), todo.items()), strict=True))
    releases: dict[str, Release] = {}
    for version, wheels in by_version.items():
        public = str(Version(version).public)
        release = fresh.get(version) or known[public]
        uploaded = min((w.uploaded for w in wheels if w.uploaded), default="")
        if uploaded and (not release.uploaded or uploaded < release.uploaded):
            release = replace(release, uploaded=uploaded)
        if public in known and version not in fresh:  # keep the old classification, with today's wheel names
            pythons = tuple(sorted({p for w in wheels for p in python_of(w.filename)}, key=_python_sort))
            release = replace(release, pythons=tuple(sorted(set(release.pythons) | set(pythons), key=_python_sort)))
        if public in releases and releases[public].cuda is not None:
            continue
        releases[public] = release
    ordered = tuple(sorted(releases.values(), key=lambda r: Version(r.version)))
    return Listing(name, url, ordered, "index", now)


def _cuda_sort(cuda: str) -> tuple[int, Version]:
    return (1, Version(cuda)) if cuda[:1].isdigit() else (0, Version("0"))


def _python_sort(python: str) -> tuple[Version, str]:
    return Version(python.rstrip("t")), python


# ---------------------------------------------------------------- the CUDA compilers PyPI carries


TOOLKIT_PROJECT = "cuda-toolkit"


def toolkit_versions(settings: Settings | None, *, refresh: bool = False,
                     env: Mapping[str, str] = os.environ) -> tuple[tuple[str, ...], str]:
    """The CUDA 13+ major.minor versions of ``cuda-toolkit`` on PyPI (the pip toolchain's compilers) and where the
    answer came from. Cached like the torch listings; the snapshot answers with nothing else at hand."""
    snapshot = json.loads(SNAPSHOT.read_text()).get("cuda_toolkit", {}) if SNAPSHOT.exists() else {}
    fallback = (tuple(snapshot.get("versions", ())), f"snapshot of {snapshot.get('read_at', '?')}")
    if settings is None:
        return fallback
    path = settings.cache("index") / "cuda-toolkit-versions.json"
    try:
        cached = json.loads(path.read_text()) if path.exists() else None
        if cached is not None and not (isinstance(cached.get("versions"), list) and cached.get("read_at")):
            cached = None
    except (OSError, json.JSONDecodeError, AttributeError):
        cached = None
    refresh = refresh or env.get("BUILDER_INDEX_REFRESH") == "1"
    if cached and not refresh and (settings.offline or _age_s(cached["read_at"]) < ttl_s(env)):
        return tuple(cached["versions"]), f"cache of {cached['read_at']}"
    if not settings.offline:
        try:
            versions = read_toolkit_versions()
        except (OSError, urllib.error.URLError, ValueError) as e:
            log.warning(f"PyPI's {TOOLKIT_PROJECT} list not readable ({e}); using "
                        + ("the cached list" if cached else "the shipped snapshot"))
        else:
            now = _now()
            atomic_write(path, json.dumps({"versions": list(versions), "read_at": now}))
            return versions, f"{PYPI_SIMPLE}/{TOOLKIT_PROJECT} at {now}"
    if cached:
        return tuple(cached["versions"]), f"cache of {cached['read_at']}"
    return fallback


def read_toolkit_versions(index_url: str = PYPI_SIMPLE) -> tuple[str, ...]:
    """major.minor of every final ``cuda-toolkit`` release >= 13 that has a wheel."""
    found: set[CudaVersion] = set()
    for wheel in project_files(index_url, TOOLKIT_PROJECT):
        try:
            _, version, _, _ = parse_wheel_filename(wheel.filename)
        except InvalidWheelFilename:
            continue
        if version.major >= 13 and not (version.is_prerelease or version.is_devrelease):
            found.add(CudaVersion((version.major, version.minor)))  # the line: 13.2.1 and 13.2.0 are 13.2
    return tuple(str(v) for v in sorted(found))


# ---------------------------------------------------------------- the snapshot


# PyTorch's channels are not reachable from every machine (not from the one the first snapshot was written on).
# When a channel cannot be read, the snapshot carries these rows from PyTorch's release notes and RFCs, marked as
# such; a later --write-snapshot where the channel is reachable replaces them with what the channel serves.
RELEASE_NOTES: dict[str, tuple[str, ...]] = {
    "cu126": ("2.6.0", "2.7.0", "2.7.1", "2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.12.0", "2.12.1", "2.13.0", "2.14.0",
              "2.14.1"),
    "cu128": ("2.7.0", "2.7.1", "2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.11.0"),  # cu128 ends with 2.11
    "cu129": ("2.8.0", "2.9.0", "2.9.1", "2.10.0", "2.11.0"),
    "cu130": ("2.9.0", "2.9.1", "2.10.0", "2.11.0", "2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1", "2.15.0"),
    "cu132": ("2.12.0", "2.12.1", "2.13.0", "2.14.0", "2.14.1", "2.15.0"),
}
RELEASE_NOTES_READ = "2026-12-01"


def release_notes_listing(channel: str) -> Listing:
    parsed = CudaVersion.from_flavour(channel)
    assert parsed, channel
    cuda = parsed.line
    evidence = f"release notes, not read from the index ({RELEASE_NOTES_READ})"
    releases = tuple(Release(v, cuda, (), evidence, RELEASE_NOTES_READ) for v in RELEASE_NOTES[channel])
    return Listing(f"pytorch-{channel}", PYTORCH_INDEX.format(flavour=channel), releases, "snapshot",
                   RELEASE_NOTES_READ, "channel not reachable when the snapshot was written: rows from release notes")


def build_snapshot(settings: Settings) -> tuple[list[Listing], tuple[str, ...]]:
    """Read every known index now (falling back to release notes for an unreachable channel)."""
    listings = [discover("pypi", PYPI_SIMPLE, settings, refresh=True)]
    if listings[0].source != "index":
        raise OSError(f"{PYPI_SIMPLE} could not be read: the snapshot is written only from a live read")
    for channel in PYTORCH_CHANNELS:
        listing = discover(f"pytorch-{channel}", PYTORCH_INDEX.format(flavour=channel), settings, refresh=True)
        listings.append(listing if listing.source == "index" else release_notes_listing(channel))
    return listings, read_toolkit_versions()


def write_snapshot_file(listings: list[Listing], toolkits: tuple[str, ...], path: Path = SNAPSHOT) -> Path:
    data = {"comment": "written by `builder torch-table --write-snapshot`; never edit by hand",
            "written_at": _now(), "indexes": [_to_json(listing) for listing in listings],
            "cuda_toolkit": {"versions": list(toolkits), "read_at": _now(), "url": f"{PYPI_SIMPLE}/{TOOLKIT_PROJECT}"}}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data, indent=1) + "\n")
    return path
