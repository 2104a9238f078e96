"""Wheels as immutable release assets: the setting that says where they live, and the URL of each.

A GitHub Pages site holds at most 1 GB (100 MB a file); a full farm's wheels do not fit. With an ``AssetStore`` set
(``builder index rebuild --assets-url URL``, kept in ``<wheelhouse>/assets.json``) the pages link every wheel by
absolute URL, ``{url}{file}#sha256=…``, and the wheels (with their PEP 658 ``.metadata`` sidecars, which a
resolver fetches at the wheel's URL + ``.metadata``) are uploaded there: GitHub Release assets, an S3-compatible
bucket, any static host. The pages, records, logs and dashboard stay on the Pages site (index/export.py lays out
both). ``assets.json`` is published with the pages, so ``builder index pull`` restores it and a rebuild of the pulled
wheelhouse links the same URLs.

The URL may name the wheel's project and public version, ``{project}`` and ``{version}`` (one release per package
version: GitHub allows 1,000 assets per release), only after its last fixed ``/``:
``https://github.com/OWNER/REPO/releases/download/{project}-{version}/`` puts
``causal_conv1d-1.7.0+cu130torch2.14-….whl`` at ``…/download/causal-conv1d-1.7.0/causal_conv1d-1.7.0%2Bcu130….whl``.
The file name is percent-encoded (``+`` as ``%2B``: S3 reads a bare ``+`` in a path as a space).

A URL's bytes never change: with a store set, a wheelhouse refuses to publish other bytes under a file name it
holds (store.py), and an export refuses to overwrite an asset whose bytes differ (export.py).
"""

from __future__ import annotations

import json
import string
import urllib.parse
from dataclasses import dataclass

from packaging.utils import canonicalize_name

from builder.core.errors import PublishError, UsageError
from builder.core.wheelfile import parse_wheel_name
from builder.index.layout import Layout

FIELDS = ("project", "version")
SCHEMES = ("http", "https", "file")


@dataclass(frozen=True)
class AssetStore:
    """Where the wheels are published: a URL ending in ``/``, maybe naming ``{project}`` and ``{version}``."""

    url: str

    @classmethod
    def parse(cls, url: str, *, source: str = "--assets-url") -> AssetStore:
        """The store of a URL, or a UsageError naming what is wrong with it."""
        cure = ("give the folder URL the wheels are uploaded to, ending in /, e.g. "
                "https://github.com/OWNER/REPO/releases/download/{project}-{version}/")
        odd = next((c for c in url if not c.isascii() or not c.isprintable() or c.isspace()), None)
        if odd is not None:  # a space, newline or tab would be written into every page's links as it is
            raise UsageError(f"{source} {url[:200]!r}: holds {odd!r}, which a URL cannot hold unquoted", cure)
        try:
            parts = urllib.parse.urlsplit(url)
            parts.port  # noqa: B018  (a port that is not a number raises here)
        except ValueError as e:
            raise UsageError(f"{source} {url[:200]!r}: not a URL ({e})", cure) from None
        if parts.scheme not in SCHEMES or not parts.netloc and parts.scheme != "file":
            raise UsageError(f"{source} {url!r}: not an http(s):// or file:// URL", cure)
        if parts.scheme == "file" and (parts.netloc not in ("", "localhost") or not url.startswith("file://")
                                       or not parts.path.startswith("/")):
            raise UsageError(f"{source} {url!r}: a file URL names an absolute folder of this machine, "
                             "file:///path/", cure)
        if parts.query or parts.fragment or not url.endswith("/"):
            raise UsageError(f"{source} {url!r}: must end in / (the wheel's file name is appended), with no "
                             "query or fragment", cure)
        try:
            fields = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(url)
                      if name is not None]
        except ValueError as e:
            raise UsageError(f"{source} {url!r}: {e}", cure) from e
        names = {name for name, _, _ in fields}
        if any(spec or conversion for _, spec, conversion in fields):
            raise UsageError(f"{source} {url[:200]!r}: a field with a format spec or conversion ({{name:…}}, "
                             "{name!r}); only plain {project} and {version} can be filled in", cure)
        segments = urllib.parse.unquote(parts.path).split("/")
        if any(seg in (".", "..") for seg in segments) or "\\" in parts.path:
            raise UsageError(f"{source} {url[:200]!r}: a '.' or '..' segment (or a backslash); an export lays "
                             "the assets out by this path, so it must not climb", cure)
        if names - set(FIELDS):
            raise UsageError(f"{source} {url!r}: names {', '.join(sorted(names - set(FIELDS)))}; only {{project}} "
                             "and {version} can be filled in", cure)
        store = cls(url)
        if parts.scheme != "file" and not urllib.parse.urlsplit(store.prefix).netloc:
            raise UsageError(f"{source} {url!r}: {{project}} and {{version}} may appear only after the host", cure)
        return store

    @property
    def prefix(self) -> str:
        """The fixed part: everything up to the last ``/`` before the first field (all of it without fields)."""
        first = self.url.find("{")
        return self.url if first < 0 else self.url[:self.url.rfind("/", 0, first) + 1]

    def folder_of(self, filename: str) -> str:
        """The part of the wheel's URL between the prefix and its file name (``causal-conv1d-1.7.0/``, a GitHub
        release's tag; ``""`` for a URL without fields): the folder an export lays the asset into."""
        if self.url == self.prefix:
            return ""
        name, version, _, _ = parse_wheel_name(filename)
        return self.url[len(self.prefix):].format(project=canonicalize_name(name), version=version.public)

    def url_of(self, filename: str) -> str:
        return self.prefix + self.folder_of(filename) + urllib.parse.quote(filename)

    def file_bytes(self) -> bytes:
        return (json.dumps({"url": self.url}, indent=1, sort_keys=True) + "\n").encode()

    @classmethod
    def from_bytes(cls, data: bytes, source: str) -> AssetStore:
        """The store an ``assets.json`` names; a damaged one is a PublishError naming ``source``."""
        try:
            if len(data) > MAX_ASSETS_FILE:
                raise ValueError(f"{len(data)} bytes, more than the {MAX_ASSETS_FILE} it may have")
            loaded = json.loads(data)
            if not isinstance(loaded, dict):
                raise TypeError(f"the file holds a JSON {type(loaded).__name__}, not an object")
            url = loaded["url"]
            if not isinstance(url, str):
                raise TypeError(f"field 'url' is a JSON {type(url).__name__}, not a string")
            return cls.parse(url, source=source)
        except (ValueError, KeyError, TypeError, RecursionError, UsageError) as e:
            detail = e.one_line() if isinstance(e, UsageError) else f"{type(e).__name__}: {e}"
            raise PublishError(f"{source} is not an assets setting ({detail})",
                               'write {"url": "https://…/"} into it, or set it with `builder index rebuild '
                               '--assets-url URL`') from e


MAX_ASSETS_FILE = 64 << 10  # one URL; `index pull` and `builder install` read a published one with this cap


def read_assets(paths: Layout) -> AssetStore | None:
    """The wheelhouse's assets setting, or None: its pages link its own ``wheels/`` folder."""
    path = paths.assets_file
    if not path.exists() and not path.is_symlink():
        return None
    cure = 'write {"url": "https://…/"} into it, or set it with `builder index rebuild --assets-url URL`'
    if not path.is_file():  # a folder, or a fifo that would hang the read
        raise PublishError(f"{path} is not a plain file (the wheelhouse's assets setting)", cure)
    try:
        with path.open("rb") as f:
            data = f.read(MAX_ASSETS_FILE + 1)
    except OSError as e:
        raise PublishError(f"{path} cannot be read ({e.strerror or e})", cure) from e
    return AssetStore.from_bytes(data, str(path))
