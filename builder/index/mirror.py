"""`builder index pull URL`: restore a local wheelhouse from a published one (GitHub Pages, `builder serve`, a
folder), so that the published index, not a cache, is the farm's durable state.

What is read is what a resolver reads: ``simple/index.json`` and ``simple/<project>/index.json`` (PEP 691 files,
fetched by name, so a static host without content negotiation serves them), and the same pages of each channel
``channels/index.json`` names (a wheel built for one CUDA major that PyPI's torch of another major would break is
in its channels only: index/channelpolicy.py ``root_lists``), each wheel at its page's URL, its
PEP 658 ``.metadata`` sidecar (at the wheel's URL + ``.metadata``: on the same host, or beside a release asset
on another), and beside the pages ``records/<wheel>.json`` and ``logs/<wheel>.log`` (both optional) and the assets
setting ``assets.json`` (index/assets.py; optional), which the pulled wheelhouse keeps, so its pages link the same
asset URLs.
Only the index's own origin is read (core/origins.py: a page's URL that leaves it, ``file:///dev/zero`` or a
``file://`` path outside a local root, is refused), plus the folder its ``assets.json`` names and any
``--allow-origin``; every answer is capped (``MAX_*`` below: a page, a record, a sidecar, a log, assets.json), and a
wheel's download stops at the size its page declares. Everything is verified before it counts: the wheel's sha256 and size against its page (and the record's
``wheel_sha256``), the sidecar against the page's core-metadata hash. A mismatch is refused, naming the file, and
nothing changes. The files are written through the wheelhouse's own transaction (``Wheelhouse.restore``): a kill
leaves the old state; the pages are rendered from the restored state with the published upload times, so they say
what the published pages say. A wheel already present with the published sha256 is not downloaded again.

The wheel bytes are always pulled: the unchanged checks read them (``find_record`` hashes the wheel against its
record; ``matrix --changed`` needs the wheel beside its record), and a Pages deployment replaces the whole site, so
the publish job needs every wheel to deploy the index again. A records-only pull would make those checks see
nothing (everything rebuilt) or trust a page instead of bytes.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import time
import urllib.error
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

from packaging.utils import InvalidWheelFilename

from builder.core import net, netfault
from builder.core.errors import ChecksumError, PublishError, SourceError
from builder.core.log import log
from builder.core.origins import Origins
from builder.core.wheelfile import parse_wheel_name
from builder.index.assets import MAX_ASSETS_FILE, AssetStore
from builder.index.layout import (
    ASSETS,
    CHANNELS,
    CHANNELS_KEY,
    PAGE_JSON,
    log_path,
    project_path,
    record_path,
    simple_path,
)
from builder.index.pages import SIMPLE_JSON
from builder.index.store import Restored, RestoreResult, Wheelhouse
from builder.model.records import BuildRecord
from builder.model.variants import VARIANTS_SUFFIX

CHUNK = 1 << 20
# The most an answer may hold (bytes): pages and records are read whole, so each is capped.
MAX_PAGE = 64 << 20  # simple/index.json, a project's index.json
MAX_RECORD = 16 << 20  # records/<wheel>.json
MAX_METADATA = 16 << 20  # a wheel's .metadata sidecar
MAX_LOG = 64 << 20  # logs/<wheel>.log (optional: a larger one is left out, with a warning)
TOP = simple_path() + PAGE_JSON  # simple/index.json: the projects, what a resolver reads first
CHANNELS_TOP = f"{CHANNELS}/{PAGE_JSON}"  # channels/index.json: the channels (pages.py)


@dataclass(frozen=True)
class PullResult:
    root: str
    restore: RestoreResult
    fetched_bytes: int


class _Missing(Exception):
    """The URL answered 404 (or the file does not exist)."""


class Unreachable(SourceError):
    """The index stopped answering mid-pull: exit 4 with the network's cure (a NetError, an OSError too, read as
    the wheelhouse's disk failing: exit 11 "free space")."""


def normalize(location: str) -> str:
    """The wheelhouse root as a URL ending in ``/``: http(s)://…, file://…, or a local path."""
    if "://" not in location:
        return Path(location).expanduser().resolve().as_uri() + "/"
    return location.rstrip("/") + "/"


def pull(location: str, house: Wheelhouse, *, delete: bool = False, missing_ok: bool = False,
         timeout_s: float | None = None, policy: net.NetPolicy | None = None,
         allow: tuple[str, ...] = ()) -> PullResult | None:
    """Restore ``house`` from the wheelhouse published at ``location``. None when nothing is published there
    (``missing_ok``: the first run of a farm); else what was fetched, kept and removed. Every request follows
    the network policy (``policy``, else the process's), ``timeout_s`` being its wait for a byte; only URLs of
    the index's origin, its assets.json's and ``allow`` are fetched."""
    root = normalize(location)
    fetch = _Fetcher(root, net.with_read_timeout(policy or net.current(), timeout_s), Origins.of(root, allow))
    try:
        top = fetch.json(root + TOP)
    except _Missing:
        if missing_ok:
            return None
        raise SourceError(f"no published index at {root} ({root}{TOP} is missing)",
                          "point at the wheelhouse root (the folder holding simple/ and wheels/), or give --missing-ok "
                          "for a first run") from None
    assets = fetch.assets = _published_assets(fetch)
    if assets is not None:
        if not root.startswith("file:") and assets.prefix.startswith("file:"):
            raise SourceError(f"{root}{ASSETS} puts the wheels at {assets.prefix[:200]}, a folder of this machine, "
                              "though the index is remote; refused, nothing was changed",
                              "a published index links its wheels over http(s); pull from a folder (a path) to use "
                              "local assets")
        fetch.origins = fetch.origins.adding(assets.prefix)
    wheels, urls = _published_wheels(fetch, top)
    for label in _published_channels(fetch):
        try:
            channel_top = fetch.json(root + simple_path(label) + PAGE_JSON)
        except _Missing:
            raise SourceError(f"{root}{simple_path(label)}{PAGE_JSON} is missing, though {CHANNELS_TOP} lists "
                              f"{label}", "the published index is damaged: run `builder index rebuild` where it is "
                              "published") from None
        more, more_urls = _published_wheels(fetch, channel_top, label)
        for wheel in more:
            if wheel.filename not in urls:
                wheels.append(wheel)
                urls[wheel.filename] = more_urls[wheel.filename]
    wheels.sort(key=lambda w: w.filename)
    fetched: list[int] = []

    def download(wheel: Restored, out: BinaryIO) -> None:
        fetched.append(fetch.wheel(urls[wheel.filename], wheel, out))

    result = house.restore(wheels, download, delete=delete, assets=assets)
    return PullResult(root, result, sum(fetched))


def _published_channels(fetch: _Fetcher) -> list[str]:
    """The channels ``channels/index.json`` names ([] where there is none: a site rendered before it existed, whose
    combined index lists every wheel)."""
    data = fetch.optional(fetch.root + CHANNELS_TOP, MAX_PAGE)
    if data is None:
        return []
    top = _json_object(data, CHANNELS_TOP, "is not JSON", "is not a JSON object",
                       "the published index is damaged: run `builder index rebuild` where it is published")
    channels = top.get(CHANNELS_KEY, [])
    names = [c.get("name") if isinstance(c, dict) else None for c in channels] if isinstance(channels, list) else [None]
    odd = [n for n in names if not isinstance(n, str) or not _safe_segment(n)]
    if odd:
        raise SourceError(f"{fetch.root}{CHANNELS_TOP} names an odd channel {odd[0]!r}",
                          "the published index is damaged: run `builder index rebuild` where it is published")
    return [n for n in names if isinstance(n, str)]


def _published_wheels(fetch: _Fetcher, top: dict, label: str | None = None) -> tuple[list[Restored], dict[str, str]]:
    """Every wheel the published pages of one index (the combined one, or the channel ``label``) list, with its
    verified sidecar, record and log; and each wheel's URL."""
    wheels: dict[str, Restored] = {}
    urls: dict[str, str] = {}
    projects = top.get("projects", [])
    if not isinstance(projects, list):
        raise SourceError(f"{fetch.root}{TOP}: 'projects' is not a list",
                          "the published index is damaged: run `builder index rebuild` where it is published")
    for project in projects:
        name = project.get("name") if isinstance(project, dict) else None
        if not isinstance(name, str) or not _safe_segment(name):
            raise SourceError(f"{fetch.root}{TOP} names an odd project {name!r}",
                              "the published index is damaged: run `builder index rebuild` where it is published")
        page_url = fetch.root + project_path(name, label) + PAGE_JSON
        try:
            page = fetch.json(page_url)
        except _Missing:
            raise SourceError(f"{page_url} is missing, though {TOP} lists {name}",
                              "the published index is damaged: run `builder index rebuild` where it is published") \
                from None
        files = page.get("files", [])
        if not isinstance(files, list):
            raise SourceError(f"{page_url}: 'files' is not a list",
                              "the published index is damaged: run `builder index rebuild` where it is published")
        for entry in files:
            if isinstance(entry, dict) and str(entry.get("filename", "")).endswith(VARIANTS_SUFFIX):
                continue  # a PEP 825 variants table: rendered again from the restored wheels' records
            wheel, url = _published_wheel(fetch, page_url, entry)
            if wheel.filename not in wheels:
                wheels[wheel.filename], urls[wheel.filename] = wheel, url
    return [wheels[n] for n in sorted(wheels)], urls


def _published_assets(fetch: _Fetcher) -> AssetStore | None:
    """The published assets setting (``assets.json``, at most MAX_ASSETS_FILE bytes), or None."""
    url = fetch.root + ASSETS
    data = fetch.optional(url, MAX_ASSETS_FILE)
    if data is None:
        return None
    try:
        return AssetStore.from_bytes(data, url)
    except PublishError as e:
        raise SourceError(e.message, "the published index is damaged: fix assets.json where it is published") from e


def _published_wheel(fetch: _Fetcher, page_url: str, entry: dict) -> tuple[Restored, str]:
    try:
        filename = _text(entry["filename"])
        sha256 = _text(entry["hashes"]["sha256"])
        size = entry["size"]
        if type(size) is not int or size < 0:
            raise ValueError(f"size {size!r:.40} is not a whole number of bytes")
        metadata_sha256 = _text(entry["core-metadata"]["sha256"])
        url = urllib.parse.urljoin(page_url, _text(entry["url"]))
    except (KeyError, TypeError, ValueError) as e:
        raise SourceError(f"{page_url}: an entry without a usable {e} ({entry!r:.120})",
                          "the published index is damaged: run `builder index rebuild` where it is published") from e
    if not _safe_segment(filename) or not _is_wheel_name(filename):
        raise SourceError(f"{page_url} lists {filename!r}, which is not a wheel file name",
                          "the published index is damaged: run `builder index rebuild` where it is published")
    _check_asset_url(fetch, filename, url)
    fetch.origins.check(url, page_url)
    metadata = fetch.optional(url + ".metadata", MAX_METADATA, hashed=True)
    if metadata is None or hashlib.sha256(metadata).hexdigest() != metadata_sha256:
        raise ChecksumError(f"{url}.metadata: the published sidecar of {filename} does not match its page's "
                            f"core-metadata sha256 {metadata_sha256}; nothing was changed",
                            "run `builder index rebuild` where it is published and deploy it again")
    record = _record(fetch, filename, sha256)
    log_bytes = _log(fetch, filename)
    mtime = _mtime_ns(entry.get("upload-time"))
    return Restored(filename, sha256, size, mtime, metadata, record, log_bytes), url


def _check_asset_url(fetch: _Fetcher, filename: str, linked: str) -> None:
    """With an assets.json, a wheel's page URL must be the one it gives, or the pulled wheelhouse's pages would link
    other URLs than the published ones."""
    if fetch.assets is not None and linked != fetch.assets.url_of(filename):
        raise SourceError(f"{fetch.root}{ASSETS} puts {filename} at {fetch.assets.url_of(filename)}, its page links "
                          f"{linked}; nothing was changed",
                          "run `builder index rebuild` where it is published and deploy it again")


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r:.40} is not a string")
    return value


def _log(fetch: _Fetcher, filename: str) -> bytes | None:
    url = fetch.root + log_path(urllib.parse.quote(filename))
    try:
        return fetch.optional(url, MAX_LOG)
    except net.TooLarge:
        log.warning(f"{url} holds more than {MAX_LOG} bytes: {filename} restored without its build log")
        return None


def _record(fetch: _Fetcher, filename: str, sha256: str) -> BuildRecord | None:
    url = fetch.root + record_path(urllib.parse.quote(filename))
    data = fetch.optional(url, MAX_RECORD)
    if data is None:
        log.warning(f"{filename} has no published record ({url}): restored without one")
        return None
    record = _json_object(data, f"{url}: the published record of {filename}", "is not JSON", "is not a JSON object",
                          "republish the wheel, or run `builder index rebuild` where it is published")
    recorded = record.get("wheel_sha256")
    if recorded is not None and recorded != sha256:
        raise ChecksumError(f"{url}: the published record of {filename} says sha256 {recorded}, its page says "
                            f"{sha256}; nothing was changed",
                            "run `builder index rebuild` where it is published and deploy it again")
    try:
        return BuildRecord.from_json(record)
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise SourceError(f"{url}: the published record of {filename} has a field of the wrong type ({e})",
                          "republish the wheel, or run `builder index rebuild` where it is published") from e


def _safe_segment(name: str) -> bool:
    return bool(name) and "/" not in name and "\\" not in name and "\0" not in name and not name.startswith(".")


def _is_wheel_name(name: str) -> bool:
    try:
        return bool(parse_wheel_name(name))
    except InvalidWheelFilename:
        return False


def _mtime_ns(stamp: object) -> int | None:
    """PEP 700 upload-time (``2026-12-01T02:17:00.123456Z``) as nanoseconds; None if absent or odd."""
    if not isinstance(stamp, str):
        return None
    try:
        whole, _, fraction = stamp.rstrip("Z").partition(".")
        seconds = calendar.timegm(time.strptime(whole, "%Y-%m-%dT%H:%M:%S"))
        micros = int(fraction.ljust(6, "0")[:6]) if fraction else 0
    except ValueError:
        return None
    return seconds * 1_000_000_000 + micros * 1000


_T = TypeVar("_T")


class _Fetcher:
    """GET over http(s):// or file:// under the network policy (core/net.py: timeouts, a deadline per file,
    retries); 404 raises _Missing."""

    def __init__(self, root: str, policy: net.NetPolicy, origins: Origins) -> None:
        self.root = root
        self.policy = policy
        self.origins = origins
        self.assets: AssetStore | None = None  # the published assets.json, once read

    def json(self, url: str) -> dict:
        data = self._get(url, self._same_origin(url, lambda r: r.read()), accept=SIMPLE_JSON, max_bytes=MAX_PAGE)
        return _json_object(data, url, "is not a PEP 691 JSON page", "is not a PEP 691 JSON page (not an object)",
                            "point at the wheelhouse root (the folder holding simple/ and wheels/)")

    def optional(self, url: str, max_bytes: int, *, hashed: bool = False) -> bytes | None:
        """The file at ``url``, None where it is missing. Unless ``hashed`` (a sidecar, checked against its page's
        hash: it may live beside an asset whose host redirects), it is read from the origin it was asked at."""
        read = (lambda r: r.read()) if hashed else self._same_origin(url, lambda r: r.read())
        try:
            return self._get(url, read, max_bytes=max_bytes)
        except _Missing:
            return None

    def _same_origin(self, url: str, read: Callable[[net.Body], _T]) -> Callable[[net.Body], _T]:
        """``read``, refusing an answer a redirect brought from outside the allowed origins: a second host's pages
        would stand in for the index (its wheels checked only against that host's pages)."""

        def checked(body: net.Body) -> _T:
            if body.url != url and not self.origins.allows(body.url):
                raise SourceError(f"{url}: redirected to {body.url[:200]}, outside the index's origin; refused, "
                                  "nothing was changed", "pull from the URL the index is served at, or give "
                                  "--allow-origin URL to trust the other host")
            return read(body)

        return checked

    def wheel(self, url: str, wheel: Restored, out: BinaryIO) -> int:
        """Stream the wheel into ``out``, hashing as it comes; refuse it (naming it) unless it is the published one."""

        def copy(response: net.Body) -> tuple[str, int]:
            digest, size = hashlib.sha256(), 0
            out.seek(0)
            out.truncate()
            for chunk in response.chunks(CHUNK):  # at most the declared size (+1: past it is refused)
                digest.update(chunk)
                out.write(chunk)
                size += len(chunk)
            return digest.hexdigest(), size

        try:
            sha256, size = self._get(url, copy, max_bytes=wheel.size)
        except net.NetError as e:  # inside the restore's transaction: an OSError there reads as the disk failing
            raise Unreachable(f"{e.message}; nothing was changed", e.hint) from None
        except net.TooLarge as e:
            raise ChecksumError(f"{url}: the published {wheel.filename} is larger than the {wheel.size} bytes its "
                                f"page says; refused after {wheel.size + 1} bytes, nothing was changed",
                                "republish that wheel (or run `builder index rebuild` where it is published)") from e
        except _Missing:
            raise SourceError(f"{url} is missing, though the published pages list {wheel.filename}; nothing was "
                              "changed", "run `builder index rebuild` where it is published and deploy it again") \
                from None
        if (sha256, size) != (wheel.sha256, wheel.size):
            raise ChecksumError(f"{url}: the published {wheel.filename} has sha256 {sha256} ({size} bytes), its page "
                                f"says {wheel.sha256} ({wheel.size} bytes); refused, nothing was changed",
                                "republish that wheel (or run `builder index rebuild` where it is published)")
        return size

    def _get(self, url: str, read: Callable[[net.Body], _T], accept: str = "*/*", *, max_bytes: int) -> _T:
        """``read`` of the answer at ``url`` (called again from the start on a retry), at most ``max_bytes``;
        giving up is a NetError, a URL outside the allowed origins a SourceError."""
        self.origins.check(url, self.root)
        try:
            return net.open_url(url, read, headers={"Accept": accept}, policy=self.policy, max_bytes=max_bytes)
        except urllib.error.HTTPError as e:
            if e.code in (404, 410):
                raise _Missing(url) from None
            cause, cure = netfault.explain(e)
            raise SourceError(f"{url} {cause}; nothing was changed", cure) from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, (FileNotFoundError, NotADirectoryError)):
                raise _Missing(url) from None
            cause, cure = netfault.explain(e)
            raise Unreachable(f"{url} {cause}; nothing was changed", cure) from None


def _json_object(data: bytes, what: str, not_json: str, not_object: str, cure: str) -> dict:
    """``data`` as a JSON object, or a SourceError that says ``what`` it was (a page, a record) and what is wrong."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise SourceError(f"{what} {not_json} ({e})", cure) from e
    if not isinstance(value, dict):
        raise SourceError(f"{what} {not_object}")
    return value
