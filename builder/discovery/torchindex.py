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
import functools
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
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import (
    InvalidWheelFilename,
    canonicalize_name,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from builder.core.fsutil import atomic_write
from builder.core.log import log
from builder.core.settings import Settings
from builder.discovery.simpleindex import WheelFile, project_files, wheel_member, wheel_metadata
from builder.model.cuda import CudaVersion
from builder.model.platform import of_wheel_platform

PYPI_SIMPLE = "https://pypi.org/simple"
PYTORCH_INDEX = "https://download.pytorch.org/whl/{flavour}"
# PyTorch's CUDA channels we know by name; what they hold is discovered like any index when it is reachable.
PYTORCH_CHANNELS = ("cu126", "cu128", "cu129", "cu130", "cu132")
SNAPSHOT = Path(__file__).resolve().parent / "data" / "torch-snapshot.json"
DEFAULT_TTL_S = 24 * 3600
UNREACHABLE_RETRY_S = 3600
MIN_TORCH = Version("2.0")
WORKERS = 4
# Requirements that name the CUDA runtime a torch wheel was built with.
_CUDA_PINS = ("cuda-toolkit", "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu11", "nvidia-cuda-runtime-cu12",
              "nvidia-cuda-runtime-cu13")


@dataclass(frozen=True)
class PlatformFacts:
    """What one torch release's wheels for one CPU platform are, read from one of them: its CUDA ("13.0", "cpu",
    None where it could not be read), the Pythons of that platform's wheel names, the triton it pins (``triton==X``
    in its METADATA for that platform), and where the facts came from (the wheel's name, URL and sha256 as the page
    gave them, and when they were read). A wheel file never changes, so these never go stale."""

    platform: str  # x86_64 | aarch64
    cuda: str | None
    pythons: tuple[str, ...]
    evidence: str  # "METADATA: cuda-toolkit[...]==13.0.2 (PEP 658)", "+cu128 label", ...
    wheel: str = ""
    url: str = ""
    sha256: str = ""
    read_at: str = ""
    triton: str | None = None


@dataclass(frozen=True)
class Release:
    """One torch release on one index: its CUDA ("13.2", "cpu", or None when it could not be read), as its x86_64
    wheels have it, and what each platform's wheels have (``platforms``; absent in listings written before the
    platform facts were read, and in release-notes rows: the other platforms are then unknown)."""

    version: str  # public version: 2.11.0 (also for 2.11.0+cu128 on a channel)
    cuda: str | None
    pythons: tuple[str, ...]  # 3.11, 3.12, 3.13t ... from the wheel names
    evidence: str  # how the CUDA was read: "METADATA: cuda-toolkit==13.2.2", "+cu128 label", ...
    read_at: str  # when the CUDA was read (ISO time, UTC)
    uploaded: str = ""  # its first wheel's upload time (PEP 700 ``upload-time``, ISO UTC); "" where not served
    platforms: tuple[PlatformFacts, ...] = ()

    def on(self, platform: str) -> PlatformFacts | None:
        """The facts read from this release's wheels for ``platform``; None where none were read."""
        return next((f for f in self.platforms if f.platform == platform), None)

    def cuda_on(self, platform: str) -> str | None:
        """The CUDA ("12.8", "cpu") of this release's ``platform`` wheels; None where unknown. A release without
        platform facts answers for x86_64 alone (its ``cuda`` was read from an x86_64 wheel or release notes)."""
        facts = self.on(platform)
        if facts is not None:
            return facts.cuda
        return self.cuda if platform == "x86_64" and not self.platforms else None

    def pythons_on(self, platform: str) -> tuple[str, ...]:
        """The Pythons of this release's ``platform`` wheels (the release's where no platform facts were read)."""
        facts = self.on(platform)
        return facts.pythons if facts is not None else self.pythons


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
        return self._by_version.get(Version(Version(version).public))

    @functools.cached_property
    def _by_version(self) -> dict[Version, Release]:
        found: dict[Version, Release] = {}
        for r in self.releases:
            found.setdefault(Version(r.version), r)
        return found




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


def linux_platform(filename: str) -> str | None:
    """The Linux platform of a wheel (``manylinux_2_28_aarch64`` → aarch64); None for other systems."""
    try:
        _, _, _, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename:
        return None
    for tag in tags:
        found = of_wheel_platform(tag.platform) if "linux" in tag.platform else None
        if found is not None:
            return found.name
    return None


_LINUX = {"platform_system": "Linux", "sys_platform": "linux", "os_name": "posix", "implementation_name": "cpython",
          "platform_python_implementation": "CPython"}


def requirements_on(requires: Iterable[str], platform: str, python: str = "3.12") -> list[Requirement]:
    """The Requires-Dist lines that apply on Linux ``platform`` with CPython ``python`` and no extra: torch 2.9's
    ``nvidia-cuda-runtime-cu12==12.8.90; platform_machine == "x86_64"`` applies on x86_64, not on aarch64."""
    env = {**_LINUX, "platform_machine": platform, "python_version": python, "python_full_version": f"{python}.0",
           "extra": ""}
    out = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            continue
        if req.marker is None or req.marker.evaluate(env):
            out.append(req)
    return out


def triton_pin(requires: Iterable[Requirement]) -> str | None:
    """``3.6.0`` from ``triton==3.6.0`` (``~=3.9.0`` → 3.9.0: the lowest release the pin admits)."""
    for req in requires:
        if canonicalize_name(req.name) != "triton":
            continue
        for spec in req.specifier:
            if spec.operator in ("==", "~=", "==="):
                return spec.version.rstrip(".*")
    return None


_VERSION_PY_CUDA = re.compile(r"""^cuda\s*(?::[^=]*)?=\s*(None|'([^']*)'|"([^"]*)")""", re.MULTILINE)


def cuda_of_version_py(text: str) -> str | None:
    """``cpu`` for ``cuda = None``, ``12.8`` for ``cuda: Optional[str] = '12.8'``; None where the file says neither."""
    match = _VERSION_PY_CUDA.search(text)
    if match is None:
        return None
    value = match.group(2) or match.group(3)
    if match.group(1) == "None" or not value:
        return "cpu"
    try:
        return CudaVersion.parse(value).line
    except (InvalidVersion, ValueError):
        return None


_READ_ERRORS = (OSError, urllib.error.URLError, zipfile.BadZipFile, StopIteration, UnicodeDecodeError, KeyError)


def read_platform(platform: str, wheels: list[WheelFile], now: str) -> PlatformFacts:
    """One platform's facts from the METADATA of one of its wheels (cp312 first): the CUDA its requirements pin on
    that platform; where they pin none, ``torch/version.py`` of the same wheel says whether it is a CPU build or one
    with its CUDA inside (read by range requests)."""
    pythons = tuple(sorted({p for w in wheels for p in python_of(w.filename)}, key=_python_sort))
    errors: list[str] = []
    for wheel in sorted(wheels, key=_linux_order)[:3]:
        try:
            text, how = wheel_metadata(wheel)
        except _READ_ERRORS as e:
            errors.append(f"{wheel.filename}: {e}")
            continue
        python = next(iter(python_of(wheel.filename)), "3.12").rstrip("t")
        applies = requirements_on(requires_dist(text), platform, python)
        cuda, evidence = cuda_from_requirements(str(r) for r in applies)
        if cuda == "cpu":
            cuda, evidence = _confirm_cpu(wheel, platform)
        return PlatformFacts(platform, cuda, pythons, f"{evidence} ({how}, {wheel.filename})", wheel.filename,
                             wheel.url, wheel.sha256, now, triton_pin(applies))
    return PlatformFacts(platform, None, pythons, "METADATA unreadable: " + "; ".join(errors)[:300], read_at=now)


def _confirm_cpu(wheel: WheelFile, platform: str) -> tuple[str, str]:
    """(cuda, evidence) of a wheel whose METADATA pins no CUDA on ``platform``: its ``torch/version.py`` decides."""
    said = f"METADATA: no CUDA requirement on {platform}"
    try:
        found = cuda_of_version_py(wheel_member(wheel, "torch/version.py"))
    except _READ_ERRORS as e:
        return "cpu", f"{said}; torch/version.py not read ({str(e)[:120]})"
    if found is None:
        return "cpu", f"{said}; torch/version.py names no cuda"
    return found, f"{said}; torch/version.py: cuda = {'None' if found == 'cpu' else repr(found)}"


def classify(version: str, wheels: list[WheelFile], now: str) -> Release:
    """One release's CUDA on each Linux platform it has wheels for: from its label, else from the METADATA of one
    wheel per platform (``read_platform``). The release's own ``cuda`` is its x86_64 wheels'."""
    pythons = tuple(sorted({p for w in wheels for p in python_of(w.filename)}, key=_python_sort))
    public = str(Version(version).public)
    by_platform: dict[str, list[WheelFile]] = {}
    for wheel in wheels:
        platform = linux_platform(wheel.filename)
        if platform is not None:
            by_platform.setdefault(platform, []).append(wheel)
    labelled = cuda_from_label(version)
    if labelled is not None:
        label = f"+{Version(version).local} label"
        facts = tuple(_labelled(p, ws, labelled, label, now) for p, ws in sorted(by_platform.items()))
        return Release(public, labelled, pythons, label, now, platforms=facts)
    if not by_platform:
        return Release(public, None, pythons, "no Linux wheel", now)
    facts = tuple(read_platform(p, ws, now) for p, ws in sorted(by_platform.items()))
    main = next((f for f in facts if f.platform == "x86_64"), facts[0])
    return Release(public, main.cuda, pythons, main.evidence, now, platforms=facts)


def _labelled(platform: str, wheels: list[WheelFile], cuda: str, label: str, now: str) -> PlatformFacts:
    first = sorted(wheels, key=_linux_order)[0]
    pythons = tuple(sorted({p for w in wheels for p in python_of(w.filename)}, key=_python_sort))
    return PlatformFacts(platform, cuda, pythons, f"{label} ({first.filename})", first.filename, first.url,
                         first.sha256, now)


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


def cache_age_s(path: Path) -> float:
    """Seconds since ``path`` was written (infinite where it cannot be read)."""
    try:
        return time.time() - path.stat().st_mtime
    except OSError:
        return float("inf")


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
            stat = path.stat()
            cached = _cached_listing(path, stat.st_mtime_ns, stat.st_size)
        except (OSError, json.JSONDecodeError, KeyError, TypeError):
            cached = None
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
        except (OSError, urllib.error.URLError, ValueError) as e:
            why = str(e)[:300]
            atomic_write(unreachable, f"{now_stamp()}\n{why}\n")
            log.warning(f"torch index {url} not readable ({why}); using "
                        + ("the cached list" if cached else "the shipped snapshot" if snapshot else "nothing"))
        else:
            atomic_write(path, json.dumps(listing_json(listing), indent=1))
            unreachable.unlink(missing_ok=True)
            return listing
    if cached is not None:
        return replace(cached, name=name)
    if snapshot is not None:
        return replace(snapshot, name=name)
    reason = "offline" if settings.offline and not url.startswith("file://") else f"not reachable: {why}" if why \
        else "not reachable"
    return Listing(name, url, (), "none", "", f"{reason}; not cached, not in the snapshot")


@functools.lru_cache(maxsize=32)
def _cached_listing(path: Path, mtime_ns: int, size: int) -> Listing:
    """A cache file's listing, parsed once per process and file version."""
    return _from_json(json.loads(path.read_text()), "cache")


def _facts_from(cached: Listing, snapshot: Listing) -> Listing:
    """``cached`` (perhaps written before the platform facts were read) with the snapshot's platform facts for each
    release that has none: a wheel never changes, so the snapshot's reading of it holds for the cache too."""
    if all(r.platforms for r in cached.releases):
        return cached
    read = {r.version: r for r in snapshot.releases if r.platforms}
    return replace(cached, releases=tuple(
        replace(r, platforms=read[r.version].platforms) if not r.platforms and r.version in read else r
        for r in cached.releases))


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
    releases only, unless ``pre`` (release candidates, alphas, betas: never dev builds)."""
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
        return tuple(sorted(set(old) | new, key=_python_sort))

    return replace(release, pythons=more(release.pythons, None),
                   platforms=tuple(replace(f, pythons=more(f.pythons, f.platform)) for f in release.platforms))


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
            now = now_stamp()
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
