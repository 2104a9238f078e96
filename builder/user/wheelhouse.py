"""The wheelhouse reader: a published wheelhouse (local folder or URL) read as a client would, through its own pages
(PEP 691 JSON, PEP 658 ``.metadata`` sidecars, the per-wheel records), each answer bounded and its origin checked;
user/fit.py judges the IndexedWheels it yields."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import replace
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.core import net, netfault
from builder.core.datafiles import CHECKOUT, PACKAGED
from builder.core.errors import PublishError, SourceError
from builder.core.origins import Origins
from builder.core.wheelfile import parse_wheel_name, split_label
from builder.index.assets import MAX_ASSETS_FILE, AssetStore
from builder.index.channelpolicy import wheel_channels
from builder.index.layout import ASSETS, CHANNELS, CHANNELS_KEY, PAGE_JSON, Layout, record_path, simple_path
from builder.index.pages import SIMPLE_JSON
from builder.model.records import BuildRecord, RecordShapeError
from builder.model.wheelfacts import requires_dist
from builder.stages.torchrange import built_once as is_built_once
from builder.user.fit import IndexedWheel

MAX_ANSWER = 64 << 20  # bytes: the most a page or record of a remote wheelhouse may hold (read whole)


def project_wheelhouse(checkout: Path = CHECKOUT, packaged: Path = PACKAGED) -> Path | None:
    """The wheelhouse of the project folder this builder runs from (a checkout, or an editable install of one),
    where `builder build` run there publishes: None for a packaged builder (``uv tool install .``: it knows no
    project folder) or a checkout whose wheelhouse holds no index yet."""
    if packaged.is_dir():
        return None
    house = checkout / "wheelhouse"
    return house if Layout(house).simple.is_dir() else None


class WheelhouseReader:
    """A wheelhouse (its root: the folder holding ``simple/``, ``channels/``, ``records/``), local or remote."""

    def __init__(self, location: str | Path, timeout_s: float | None = None, allow: tuple[str, ...] = ()) -> None:
        text = str(location)
        if "://" not in text:
            path = Path(text).expanduser().resolve()
            text = path.as_uri()
        self.root = text.rstrip("/") + "/"
        self.timeout_s = timeout_s  # the wait for a byte; the rest of the network policy is the process's
        self.allow = allow  # --allow-origin
        self._origins: Origins | None = None
        self._channels: dict[str, frozenset[str]] | None = None  # channel → its projects

    def origins(self) -> Origins:
        """Where this wheelhouse's pages may send this reader and uv (the rule ``index pull`` follows,
        core/origins.py): under its root, under its assets.json's prefix, and ``allow`` (--allow-origin)."""
        if self._origins is None:
            origins = Origins.of(self.root, self.allow)
            data = self._fetch(self.root + ASSETS, accept="*/*", required=False, max_bytes=MAX_ASSETS_FILE)
            if data is not None:
                try:
                    origins = origins.adding(AssetStore.from_bytes(data, self.root + ASSETS).prefix)
                except PublishError as e:
                    raise SourceError(e.message, "the wheelhouse is damaged: fix assets.json where it is published") \
                        from e
            self._origins = origins
        return self._origins

    def check_channel(self, index_url: str) -> None:
        """Every file the page at ``index_url`` links (what uv will read there) is within ``origins``: checked
        before its URL is handed to uv, which would fetch whatever the page names."""
        page = self._json(index_url, required=False) or {}
        files = page.get("files", [])
        for entry in files if isinstance(files, list) else []:
            link = entry.get("url") if isinstance(entry, dict) else None
            if isinstance(link, str):
                self.origins().check(urllib.parse.urljoin(index_url, link), index_url)

    @property
    def is_local(self) -> bool:
        return self.root.startswith("file:")

    @property
    def local_path(self) -> Path | None:
        """The folder of a ``file://`` wheelhouse (None for a remote one)."""
        return Path(urllib.request.url2pathname(urllib.parse.urlparse(self.root).path)) if self.is_local else None

    def simple_url(self) -> str:
        return self.root + simple_path()

    def channel_url(self, label: str) -> str:
        return self.root + simple_path(label)

    def check(self) -> None:
        """Fail with one clear message when the wheelhouse cannot be read at all."""
        self._json(self.simple_url(), required=True)

    def projects(self) -> list[str]:
        page = self._json(self.simple_url(), required=True) or {}
        names = {str(p["name"]) for p in page.get("projects", []) if isinstance(p, dict) and "name" in p}
        return sorted(names.union(*self.channel_projects().values()))

    def channel_projects(self) -> dict[str, frozenset[str]]:
        """Each channel ``channels/index.json`` names, with the projects its index lists ({} where that file is
        missing: a wheelhouse rendered before it, whose combined index lists every wheel). A wheel built for one
        CUDA major that PyPI's torch of another would break is in its channels only (index/channelpolicy.py
        ``root_lists``), so the reader looks there too."""
        if self._channels is None:
            top = self._json(f"{self.root}{CHANNELS}/{PAGE_JSON}", required=False) or {}
            listed = top.get(CHANNELS_KEY, [])
            names = [str(c["name"]) for c in listed if isinstance(c, dict) and isinstance(c.get("name"), str)
                     and "/" not in c["name"] and c["name"] not in (".", "..")] if isinstance(listed, list) else []
            channels = {}
            for label in names:
                page = self._json(self.channel_url(label), required=False) or {}
                channels[label] = frozenset(str(p["name"]) for p in page.get("projects", [])
                                            if isinstance(p, dict) and "name" in p)
            self._channels = channels
        return self._channels

    def wheels(self, project: str) -> list[IndexedWheel]:
        """The wheels listed for ``project`` by the combined index or any channel (empty when none lists it)."""
        name = canonicalize_name(project)
        pages = [f"{self.simple_url()}{name}/"] + [f"{self.channel_url(label)}{name}/" for label, projects
                                                   in self.channel_projects().items() if name in projects]
        entries: dict[str, tuple[str, dict]] = {}  # filename → (its page, its entry): the first page that lists it
        for page_url in pages:
            page = self._json(page_url, required=False) or {}
            for entry in page.get("files", []):
                if isinstance(entry, dict):
                    entries.setdefault(str(entry.get("filename", "")), (page_url, entry))
        found = []
        labels: dict[str, list[str]] = {}  # plain wheel → its variants' labels: judged as the plain wheel
        for filename in entries:
            plain, label = split_label(filename)
            if label is not None:
                labels.setdefault(plain, []).append(label)
        for filename, (page_url, entry) in entries.items():
            if not filename.endswith(".whl") or split_label(filename)[1] is not None:
                continue
            try:
                _, version, _, _ = parse_wheel_name(filename)
            except Exception:  # noqa: BLE001 (a foreign, oddly named file in an index: not ours to judge)
                continue
            url = urllib.parse.urljoin(page_url, str(entry.get("url", filename)))
            self.origins().check(url, page_url)
            wheel = self._indexed(filename, name, version, url, entry)
            found.append(replace(wheel, variants=tuple(sorted(labels.get(filename, ())))))
        return found

    def _indexed(self, filename: str, project: str, version: Version, url: str, entry: dict) -> IndexedWheel:
        metadata = self._text(url + ".metadata") if entry.get("core-metadata") or entry.get("dist-info-metadata") else None
        requires = requires_dist(metadata) if metadata else ()  # model/wheelfacts.py: the one reader
        record = self._json(self.root + record_path(filename), required=False)
        sass = ptx = None
        kernel = None
        try:
            built = BuildRecord.from_json(record) if isinstance(record, dict) else None
        except RecordShapeError as e:
            raise SourceError(f"wheelhouse {self.root}: {self.root + record_path(filename)}: {e}",
                              "the wheelhouse is damaged: fix or delete that record where it is published, then run "
                              "`builder index rebuild` there") from e
        if isinstance(record, dict):
            inspect = record.get("inspect") if isinstance(record.get("inspect"), dict) else {}
            objects = inspect.get("objects") if isinstance(inspect, dict) else None
            if isinstance(objects, list):
                sass = tuple(sorted({a for o in objects if isinstance(o, dict) for a in o.get("sass", [])}))
                ptx = tuple(sorted({a for o in objects if isinstance(o, dict) for a in o.get("ptx", [])}))
            tests = record.get("tests")
            if isinstance(tests, dict):
                kernel = str(tests.get("kernel_status")) if tests.get("kernel_status") else None
        return IndexedWheel(
            filename=filename, project=project, version=version, label=version.local, url=url, wheelhouse=self.root,
            requires_python=str(entry["requires-python"]) if entry.get("requires-python") else None,
            requires=requires, sass=sass, ptx=ptx, kernel_tests=kernel,
            abi=built.abi if built else None, cuda=built.cuda if built else "",
            torch_checks=tuple(built.torch_checks or ()) if built else (),
            channels=wheel_channels(filename, built), built_once=built is not None and is_built_once(filename),
        )

    # ---------------------------------------------------------------- transport: file:// and http(s):// alike

    def _json(self, url: str, *, required: bool) -> dict | None:
        if url.startswith("file:") and url.endswith("/"):
            url += "index.json"
        data = self._fetch(url, accept=SIMPLE_JSON, required=required)
        if data is None:
            return None
        try:
            value = json.loads(data)
        except ValueError as e:
            if required:
                raise SourceError(f"wheelhouse {self.root}: {url} is not a PEP 691 JSON page ({e})",
                                  "point at the wheelhouse root (the folder that holds simple/ and channels/)") from e
            return None
        return value if isinstance(value, dict) else None

    def _text(self, url: str) -> str | None:
        data = self._fetch(url, accept="*/*", required=False)
        return data.decode("utf-8", "replace") if data is not None else None

    def _fetch(self, url: str, *, accept: str, required: bool, max_bytes: int | None = None) -> bytes | None:
        """The bytes at ``url`` under the network policy (core/net.py), at most ``max_bytes`` (default MAX_ANSWER,
        read when called) of them (a page or a record; more is a TooLarge, one line); None for a page that does not
        exist (unless ``required``)."""
        policy = net.with_read_timeout(net.current(), self.timeout_s)
        try:
            return net.fetch_bytes(url, headers={"Accept": accept}, policy=policy,
                                   max_bytes=MAX_ANSWER if max_bytes is None else max_bytes)
        except net.NetError as e:
            raise net.NetError(f"wheelhouse {self.root}: {e.message}", e.hint) from None
        except urllib.error.HTTPError as e:
            missing, (cause, cure) = e.code == 404, netfault.explain(e)
        except urllib.error.URLError as e:  # file:// misses arrive as URLError(FileNotFoundError)
            missing = isinstance(e.reason, (FileNotFoundError, NotADirectoryError, IsADirectoryError))
            cause, cure = netfault.explain(e)
        except (TimeoutError, OSError) as e:
            missing, (cause, cure) = False, netfault.explain(e)
        if missing and not required:
            return None
        if missing:
            raise SourceError(f"wheelhouse {self.root} has no index pages ({url} is missing)",
                              "point --from at a wheelhouse root (e.g. ./wheelhouse or http://host:8000/); "
                              "`builder index rebuild` regenerates missing pages")
        raise SourceError(f"wheelhouse {self.root}: {url} {cause}", cure)
