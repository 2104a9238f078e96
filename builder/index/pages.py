"""The page writers: the simple index (PEP 503 HTML, PEP 691 JSON, PEP 658/714 metadata attributes), its channels
and the dashboard, written into a ``Transaction`` (the pages as a new generation, the dashboard as a staged file)
from the state it is about to commit, so the pages cannot drift from the wheels. Each wheel is linked relatively
(``../../wheels/X.whl``), or by absolute URL where the wheelhouse publishes its wheels as release assets
(index/assets.py); either way with its sha256."""

from __future__ import annotations

import hashlib
import html
import json
import time
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.core.fsutil import sha256_file
from builder.core.wheelfile import build_number, parse_wheel_name, superseded
from builder.index.assets import AssetStore, read_assets
from builder.index.channelpolicy import root_lists, wheel_channels
from builder.index.dashboard import render_dashboard
from builder.index.dashrows import WheelFacts, rows_from, rows_of
from builder.index.layout import (
    CHANNELS_KEY,
    PAGE_HTML,
    PAGE_JSON,
    SIMPLE,
    Layout,
    staging_href,
    wheels_href,
)
from builder.index.trust import check_wheel
from builder.index.txn import Transaction, is_builder_temp
from builder.index.variantfiles import VariantsFile, variants_files
from builder.model.records import BuildRecord, VariantInfo

API_VERSION = "1.1"  # PEP 691 + PEP 700 (size, upload-time, versions)
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"
SIMPLE_HTML = "application/vnd.pypi.simple.v1+html"


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
class WheelInfo:
    """What the index says about one wheel; cached per (size, mtime) so big wheels are hashed once."""

    filename: str
    project: str
    version: str
    channels: tuple[str, ...]  # the channels that list it (checks.wheel_channels); every wheel is in simple/ too
    size: int
    mtime_ns: int
    sha256: str
    metadata_sha256: str
    requires_python: str | None
    variant: VariantInfo | None = None  # a variant wheel's (its record's): the label → properties table lists it
    build_why: str = ""  # what its build number brought (BuildRecord.build), for the superseded builds' notes
    on_root: bool = True  # the combined simple/ lists it (checks.root_lists: no PyPI torch of another CUDA major)


def stage_pages(txn: Transaction, paths: Layout, entries: list[Entry], *, staging_area: bool,
                rehash: bool = False, assets: AssetStore | None = None) -> None:
    """Every page of ``entries`` into a new generation (``Transaction.new_generation``): the combined index (the
    wheels ``checks.root_lists`` admits), one per channel (``checks.wheel_channels`` says which wheels each lists)
    and the channel list; and the dashboard.
    With ``assets`` (the setting being committed) every wheel is linked at its asset URL.

    A wheel the live pages list with other bytes (or another sidecar) is replaced under its name, which no single
    rename can do together with the pages: an interim generation that does not list it goes live first
    (``txn.replay``), so no page ever names a file with a hash it does not have."""
    live = _previous_entries(paths)
    infos = _infos(txn, paths, entries, {} if rehash else live)
    statuses = {e.filename: _tests_summary(e.record) for e in entries}
    replaced = {i.filename for i in infos if i.filename in live and _listed_as(live[i.filename]) != _listed_as(i)}
    if replaced:
        _write_generation(txn, paths, [i for i in infos if i.filename not in replaced], statuses, assets)
    _write_generation(txn, paths, infos, statuses, assets)
    stage_dashboard(txn, paths, entries, staging_area=staging_area, assets=assets)


def _listed_as(info: WheelInfo | dict) -> tuple[object, object]:
    """What a reader checks a file against: the wheel's sha256 and its sidecar's."""
    if isinstance(info, WheelInfo):
        return info.sha256, info.metadata_sha256
    try:
        return info["hashes"]["sha256"], info["core-metadata"]["sha256"]
    except (KeyError, TypeError):
        return None, None


def _write_generation(txn: Transaction, paths: Layout, infos: list[WheelInfo], statuses: dict[str, str],
                      assets: AssetStore | None) -> None:
    """One whole generation of the pages; the user's dot-files in the live pages (a ``.nojekyll``) come along."""
    gen = Layout(txn.new_generation())
    _write_simple(txn, gen, None, [i for i in infos if i.on_root], statuses, assets)
    labels = sorted({label for i in infos for label in i.channels})
    for label in labels:
        _write_simple(txn, gen, label, [i for i in infos if label in i.channels], statuses, assets)
    gen.channels.mkdir(parents=True, exist_ok=True)
    if labels:
        items = [f'    <a href="{html.escape(lab)}/{SIMPLE}/">{html.escape(lab)}</a><br/>' for lab in labels]
        txn.put_page(gen.channels / PAGE_HTML, _page("Channels", items).encode())
        # the same list for programs: `builder index pull` reads every channel, since a wheel the combined index
        # leaves out (checks.root_lists) is listed in its channels only
        txn.put_page(gen.channels / PAGE_JSON, _json({"meta": {"api-version": API_VERSION},
                                                      CHANNELS_KEY: [{"name": lab} for lab in labels]}).encode())
    _carry_dot_files(txn, paths, gen)


def _carry_dot_files(txn: Transaction, paths: Layout, gen: Layout) -> None:
    for live, new in [(paths.simple, gen.simple), (paths.channels, gen.channels)]:
        for path in live.rglob(".*") if live.is_dir() else []:
            target = new / path.relative_to(live)
            if path.is_file() and not path.is_symlink() and not is_builder_temp(path) \
                    and target.parent.is_dir() and not target.exists():
                txn.put_page(target, path.read_bytes())


def stage_dashboard(txn: Transaction, paths: Layout, entries: list[Entry], *, staging_area: bool,
                    assets: AssetStore | None = None) -> None:
    """The dashboard of ``entries``; the main one shows the staged wheels too. With ``assets`` its wheel links
    are the asset URLs (the Pages tree holds no wheel)."""
    facts = [WheelFacts(e.filename, e.data.stat().st_size, e.record, e.has_log) for e in entries]
    rows = rows_from(facts, area="staged" if staging_area else "published")
    if assets is not None:
        for row in rows:
            row.links["wheel"] = assets.url_of(row.filename)
    staging = paths.staging_paths()
    if not staging_area and staging.wheels.is_dir():
        rows += rows_of(staging, staging.wheel_files(), area="staged", prefix=staging_href())
    labels = sorted({label for e in entries for label in wheel_channels(e.filename, e.record)})
    txn.put_bytes(paths.dashboard, render_dashboard(rows, labels, staging_area=staging_area).encode())


def listed(paths: Layout, wheel_name: str, digest: str, record: BuildRecord | None) -> bool:
    """Whether the pages (combined and each of its channels, JSON and HTML) list ``wheel_name`` with this sha256;
    ``record`` is the wheel's, which names a stable-ABI wheel's channels; at the URL the wheelhouse's assets
    setting gives it (its own ``wheels/`` folder without one)."""
    project = canonicalize_name(parse_wheel_name(wheel_name)[0])
    try:
        on_root = root_lists(wheel_name, record, paths.sidecar_file(wheel_name).read_bytes())
    except OSError:
        return False
    channels: list[str | None] = [*([None] if on_root else []), *wheel_channels(wheel_name, record)]
    assets = read_assets(paths)
    for label in channels:
        page = paths.project_page(project, label, json=True)
        href = wheel_href(wheel_name, label, assets)
        try:
            files = json.loads(page.read_text()).get("files", [])
            if not any(f.get("filename") == wheel_name and f.get("url") == href
                       and f.get("hashes", {}).get("sha256") == digest for f in files):
                return False
            html_page = (page.parent / PAGE_HTML).read_text()
        except (OSError, ValueError, AttributeError):
            return False
        if f'href="{html.escape(href)}#sha256={digest}"' not in html_page:
            return False
    return True


def wheel_href(filename: str, label: str | None, assets: AssetStore | None) -> str:
    """The link to a wheel from a project page of that index: its asset URL, else its file in ``wheels/``."""
    return assets.url_of(filename) if assets is not None else f"{wheels_href(label)}{filename}"


def _infos(txn: Transaction, paths: Layout, entries: list[Entry], previous: dict[str, dict]) -> list[WheelInfo]:
    """Index facts per wheel; hashes are reused from the previous JSON pages while size and mtime match."""
    infos = []
    for entry in entries:
        st = entry.data.stat()
        name, version, _, _ = parse_wheel_name(entry.filename)
        old = previous.get(entry.filename)
        sidecar = entry.metadata
        if entry.sha256 is None and old and old.get("size") == st.st_size \
                and old.get("upload-time") == _stamp(st.st_mtime_ns) and sidecar.exists():
            sha256, metadata_sha256 = old["hashes"]["sha256"], old["core-metadata"]["sha256"]
            requires_python = old.get("requires-python")
            metadata = sidecar.read_bytes()  # a few kB: its torch requirement decides the combined index
        else:
            if sidecar.exists():
                metadata = sidecar.read_bytes()
            else:  # a wheel published before sidecars existed
                metadata = check_wheel(entry.data)
                txn.put_bytes(paths.sidecar_file(entry.filename), metadata)
            sha256 = entry.sha256 or sha256_file(entry.data)
            metadata_sha256 = hashlib.sha256(metadata).hexdigest()
            requires_python = HeaderParser().parsestr(metadata.decode("utf-8", "replace")).get("Requires-Python")
            requires_python = requires_python.strip() if requires_python else None
        infos.append(WheelInfo(
            filename=entry.filename, project=str(canonicalize_name(name)), version=str(version),
            channels=wheel_channels(entry.filename, entry.record), size=st.st_size, mtime_ns=st.st_mtime_ns, sha256=sha256,
            metadata_sha256=metadata_sha256, requires_python=requires_python,
            on_root=root_lists(entry.filename, entry.record, metadata),
            variant=entry.record.variant if entry.record is not None else None,
            build_why=entry.record.build.describe() if entry.record is not None and entry.record.build else "",
        ))
    return infos


def _previous_entries(paths: Layout) -> dict[str, dict]:
    entries: dict[str, dict] = {}
    for page in paths.simple.glob(f"*/{PAGE_JSON}") if paths.simple.is_dir() else []:
        try:
            for entry in json.loads(page.read_text()).get("files", []):
                entries[entry["filename"]] = entry
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
    return entries


def _write_simple(txn: Transaction, paths: Layout, label: str | None, infos: list[WheelInfo],
                  statuses: dict[str, str], assets: AssetStore | None) -> None:
    """One simple index (combined or a channel) of a new generation: root + one folder per project, HTML and
    JSON each."""
    simple = paths.index(label)
    projects: dict[str, list[WheelInfo]] = {}
    for info in infos:
        projects.setdefault(info.project, []).append(info)
    for name, files in projects.items():
        hrefs = {info.filename: wheel_href(info.filename, label, assets) for info in files}
        yanked = superseded_notes(files)
        links = [_link(info, hrefs[info.filename], statuses.get(info.filename), yanked.get(info.filename))
                 for info in files]
        versions: list[str] = sorted({i.version for i in files}, key=Version)
        tables = variants_files((i.filename, i.variant) for i in files)  # PEP 825: beside the page, not an asset
        for table in tables:
            txn.put_page(paths.project_page(name, label).parent / table.filename, table.data)
        links += [_variants_link(table) for table in tables]
        txn.put_page(paths.project_page(name, label), _page(f"Links for {name}", links).encode())
        txn.put_page(paths.project_page(name, label, json=True), _json({
            "meta": {"api-version": API_VERSION},
            "name": name,
            "versions": versions,
            "files": [_json_file(info, hrefs[info.filename], yanked.get(info.filename)) for info in files]
            + [_variants_json(t) for t in tables],
        }).encode())
    root_links = [f'    <a href="{n}/">{n}</a><br/>' for n in sorted(projects)]
    txn.put_page(simple / PAGE_HTML, _page("Simple index", root_links).encode())
    txn.put_page(simple / PAGE_JSON, _json({
        "meta": {"api-version": API_VERSION},
        "projects": [{"name": n} for n in sorted(projects)],
    }).encode())


def superseded_notes(files: list[WheelInfo]) -> dict[str, str]:
    """The files of one page that a newer build of the same wheel on the same page supersedes (docs/INDEX.md
    "Superseded builds"), each with its PEP 592 yank reason: ``superseded by build 1 (X.whl; 0005: …)``. Only
    where the page lists the newer build: a page never offers a wheel only as a yanked file."""
    notes = {}
    by_name = {info.filename: info for info in files}
    for old, new in superseded([info.filename for info in files]).items():
        why = by_name[new].build_why
        notes[old] = f"superseded by build {build_number(new)} ({new}{'; ' + why if why else ''})"
    return notes


def _link(info: WheelInfo, href: str, status: str | None, yanked: str | None = None) -> str:
    attrs = f'href="{html.escape(href)}#sha256={info.sha256}"'
    if info.requires_python:
        attrs += f' data-requires-python="{html.escape(info.requires_python)}"'
    attrs += f' data-core-metadata="sha256={info.metadata_sha256}"'
    attrs += f' data-dist-info-metadata="sha256={info.metadata_sha256}"'
    if yanked is not None:
        attrs += f' data-yanked="{html.escape(yanked)}"'
    note = f' <span class="tests">{html.escape(status)}</span>' if status else ""
    return f"    <a {attrs}>{html.escape(info.filename)}</a>{note}<br/>"


def _variants_link(table: VariantsFile) -> str:
    return f'    <a href="{html.escape(table.filename)}#sha256={table.sha256}">{html.escape(table.filename)}</a><br/>'


def _variants_json(table: VariantsFile) -> dict[str, str | int | bool | dict[str, str]]:
    return {"filename": table.filename, "url": table.filename, "hashes": {"sha256": table.sha256},
            "size": len(table.data), "yanked": False}


def _json_file(info: WheelInfo, href: str, yanked: str | None = None) -> dict[str, str | int | bool | dict[str, str]]:
    entry: dict[str, str | int | bool | dict[str, str]] = {
        "filename": info.filename,
        "url": href,
        "hashes": {"sha256": info.sha256},
        "core-metadata": {"sha256": info.metadata_sha256},
        "dist-info-metadata": {"sha256": info.metadata_sha256},
        "size": info.size,
        "upload-time": _stamp(info.mtime_ns),
        "yanked": yanked if yanked is not None else False,
    }
    if info.requires_python:
        entry["requires-python"] = info.requires_python
    return entry


def _tests_summary(record: BuildRecord | None) -> str:
    tests = record.tests if record else None
    return tests.summary() if tests is not None else ""


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
