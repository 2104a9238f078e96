"""Which torch releases an index serves, for which CUDA and Python: read from the index itself (each release's
wheels classified by discovery/classify.py into the facts of discovery/torchfacts.py).

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
import functools
import json
import math
import os
import re
import time
import urllib.error
import urllib.parse
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from packaging.utils import (
    InvalidWheelFilename,
    parse_wheel_filename,
)
from packaging.version import Version

from builder.core import netfault
from builder.core.errors import SourceError, UsageError
from builder.core.fsutil import atomic_write
from builder.core.log import log
from builder.core.settings import Settings
from builder.core.statefile import StateFileError, read_json, read_json_or_none
from builder.discovery.classify import (
    classify,
    cuda_from_label,
    linux_platform,
    python_of,
    python_sort,
)
from builder.discovery.simpleindex import PageError, WheelFile, project_files, reading
from builder.discovery.torchfacts import Listing, PlatformFacts, Release
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


# ---------------------------------------------------------------- discovery with cache and snapshot


def now_stamp() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _age_s(stamp: str) -> float:
    try:
        return time.time() - calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return float("inf")


def cache_file(settings: Settings, url: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9]+", "_", url.split("://", 1)[-1]).strip("_")[:120]
    return settings.cache("index") / f"torch-{slug}.json"


def listing_json(listing: Listing) -> dict[str, Any]:
    return {"name": listing.name, "url": listing.url, "read_at": listing.read_at, "note": listing.note,
            "releases": [asdict(r) for r in listing.releases]}


def _facts_from_json(data: Mapping[str, Any]) -> PlatformFacts:
    return PlatformFacts(str(data["platform"]), data.get("cuda"), tuple(data.get("pythons", ())),
                         str(data.get("evidence", "")), str(data.get("wheel", "")), str(data.get("url", "")),
                         str(data.get("sha256", "")), str(data.get("read_at", "")), data.get("triton"))


def _from_json(data: Mapping[str, Any], source: str) -> Listing:
    releases = tuple(Release(r["version"], r.get("cuda"), tuple(r.get("pythons", ())), r.get("evidence", ""),
                             r.get("read_at", ""), r.get("uploaded", ""),
                             tuple(_facts_from_json(f) for f in r.get("platforms", ())))
                     for r in data.get("releases", []))
    return Listing(str(data["name"]), str(data["url"]), releases, source, str(data.get("read_at", "")),
                   str(data.get("note", "")))


def load_snapshot(path: Path = SNAPSHOT) -> dict[str, Listing]:
    """The shipped snapshot, by index URL (empty when the file is missing); read once per process and file
    version."""
    try:
        stat = path.stat()
    except OSError:
        return {}
    return dict(_snapshot(path, stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=4)
def _snapshot(path: Path, mtime_ns: int, size: int) -> tuple[tuple[str, Listing], ...]:
    data = json.loads(path.read_text())
    return tuple((entry["url"], _from_json(entry, "snapshot")) for entry in data.get("indexes", []))


_WARNED: set[str] = set()


def _said(error: BaseException, url: str) -> str:
    """A read's failure in words: urllib's ``<urlopen error [Errno 111] …>`` as core/netfault.py says it."""
    if isinstance(error, urllib.error.URLError) and not isinstance(error, urllib.error.HTTPError):
        return f"{url}: {netfault.explain(error)[0]}"
    return str(error)


def warn_once(text: str) -> None:
    """A warning said once per process: a command that reads the same unreachable index at each step says so once
    (the network is not asked again either: core/netbudget.py)."""
    if text not in _WARNED:
        _WARNED.add(text)
        log.warning(text)


def cache_age_s(path: Path) -> float:
    """Seconds since ``path`` was written (infinite where it cannot be read)."""
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return float("inf")


def ttl_s(env: Mapping[str, str] = os.environ) -> float:
    """``BUILDER_INDEX_TTL`` (seconds a cached list answers; 0: always read again), else 24 h. A value that is not
    a finite number of seconds >= 0 (``-1``, ``nan``, ``abc``) is a UsageError naming the variable, not silently
    the default (before, -1 and nan meant "always stale" and "never stale" without a word)."""
    text = env.get("BUILDER_INDEX_TTL", "").strip()
    if not text:
        return DEFAULT_TTL_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not (math.isfinite(value) and value >= 0):
        raise UsageError(f"BUILDER_INDEX_TTL={text[:40]!r} is not a number of seconds >= 0",
                         f"set it to e.g. {DEFAULT_TTL_S} (24 h; 0 reads the indexes every time), or unset it")
    return value


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
            stat = path.stat()
            cached = _cached_listing(path, stat.st_mtime_ns, stat.st_size)
        except (OSError, json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError, StateFileError):
            cached = None  # damaged (a fifo, a folder, bad JSON or shape): read the index again
    if cached is not None and snapshot is not None:
        cached = _facts_from(cached, snapshot)
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
        except (OSError, urllib.error.URLError, ValueError, SourceError) as e:  # SourceError: a refused redirect
            why = ("not readable: " if isinstance(e, PageError) else "not reachable: ") + _said(e, url)[:300]
            atomic_write(unreachable, f"{now_stamp()}\n{why}\n")
            warn_once(f"torch index {url} {why}; using "
                      + ("the cached list" if cached else "the shipped snapshot" if snapshot else "nothing"))
        else:
            atomic_write(path, json.dumps(listing_json(listing), indent=1))
            unreachable.unlink(missing_ok=True)
            return listing
    if cached is not None:
        return replace(cached, name=name)
    if snapshot is not None:
        return replace(snapshot, name=name)
    reason = "offline" if settings.offline and not url.startswith("file://") else why or "not reachable"
    return Listing(name, url, (), "none", "", f"{reason}; not cached, not in the snapshot")


@functools.lru_cache(maxsize=32)
def _cached_listing(path: Path, mtime_ns: int, size: int) -> Listing:
    """A cache file's listing, parsed once per process and file version (core/statefile: no fifo or device is
    opened, the size is capped)."""
    return _from_json(read_json(path, limit=256 << 20), "cache")


def _facts_from(cached: Listing, snapshot: Listing) -> Listing:
    """``cached`` (perhaps written before the platform facts were read) with the snapshot's platform facts for each
    release that has none and agrees with it on x86_64: a wheel never changes, so the snapshot's reading of it
    holds for the cache too."""
    if all(r.platforms for r in cached.releases):
        return cached
    read = {r.version: r for r in snapshot.releases if r.platforms}
    return replace(cached, releases=tuple(
        replace(r, platforms=read[r.version].platforms)
        if not r.platforms and r.version in read and read[r.version].cuda_on("x86_64") == r.cuda else r
        for r in cached.releases))


def unreadable_why(settings: Settings, url: str, pre: bool = False) -> str:
    """Why ``url``'s torch list could not be read the last time it was tried ("" if it was read)."""
    path = cache_file(settings, url.rstrip("/"))
    if pre:
        path = path.with_name(path.stem + "-pre.json")
    return _unreachable_note(path.with_name(path.name + ".unreachable"))[1]


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
            read = release.platforms and all(f.cuda is not None for f in release.platforms)
            if read and not release.evidence.startswith("release notes"):
                known[release.version] = release
    return known


def read_index(name: str, url: str, *, known: Mapping[str, Release] = {}, project: str = "torch",
               pre: bool = False) -> Listing:
    """Read the release list of ``url`` now; classify the releases not in ``known`` (a few at a time). Final
    releases only, unless ``pre`` (release candidates, alphas, betas: never dev builds). All of it within one
    network deadline (simpleindex.reading), shared with any reads around it."""
    with reading():
        return _read_index(name, url, known=known, project=project, pre=pre)


def _read_index(name: str, url: str, *, known: Mapping[str, Release], project: str, pre: bool) -> Listing:
    now = now_stamp()
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
            release = _with_pythons(release, wheels)
        if public in releases and releases[public].cuda is not None:
            continue
        releases[public] = release
    ordered = tuple(sorted(releases.values(), key=lambda r: Version(r.version)))
    return Listing(name, url, ordered, "index", now)


def _with_pythons(release: Release, wheels: list[WheelFile]) -> Release:
    """``release`` with the Pythons of today's wheel names added (a release gains wheels for a new Python)."""
    def more(old: tuple[str, ...], platform: str | None) -> tuple[str, ...]:
        new = {p for w in wheels if platform is None or linux_platform(w.filename) == platform
               for p in python_of(w.filename)}
        return tuple(sorted(set(old) | new, key=python_sort))

    return replace(release, pythons=more(release.pythons, None),
                   platforms=tuple(replace(f, pythons=more(f.pythons, f.platform)) for f in release.platforms))


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
    cached = read_json_or_none(path)  # absent or damaged (a fifo, a folder, bad JSON): asked again
    if not (isinstance(cached, dict) and isinstance(cached.get("versions"), list) and cached.get("read_at")):
        cached = None
    refresh = refresh or env.get("BUILDER_INDEX_REFRESH") == "1"
    if cached and not refresh and (settings.offline or _age_s(cached["read_at"]) < ttl_s(env)):
        return tuple(cached["versions"]), f"cache of {cached['read_at']}"
    if not settings.offline:
        try:
            versions = read_toolkit_versions()
        except (OSError, urllib.error.URLError, ValueError) as e:
            warn_once(f"PyPI's {TOOLKIT_PROJECT} list not readable ({_said(e, PYPI_SIMPLE)}); using "
                      + ("the cached list" if cached else "the shipped snapshot"))
        else:
            now = now_stamp()
            atomic_write(path, json.dumps({"versions": list(versions), "read_at": now}))
            return versions, f"{PYPI_SIMPLE}/{TOOLKIT_PROJECT} at {now}"
    if cached:
        return tuple(cached["versions"]), f"cache of {cached['read_at']}"
    return fallback


def read_toolkit_versions(index_url: str = PYPI_SIMPLE) -> tuple[str, ...]:
    """major.minor of every final ``cuda-toolkit`` release >= 13 that has a wheel."""
    found: set[CudaVersion] = set()
    with reading():
        wheels = project_files(index_url, TOOLKIT_PROJECT)
    for wheel in wheels:
        try:
            _, version, _, _ = parse_wheel_filename(wheel.filename)
        except InvalidWheelFilename:
            continue
        if version.major >= 13 and not (version.is_prerelease or version.is_devrelease):
            found.add(CudaVersion((version.major, version.minor)))  # the line: 13.2.1 and 13.2.0 are 13.2
    return tuple(str(v) for v in sorted(found))
