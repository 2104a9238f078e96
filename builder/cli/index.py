"""Commands about the wheelhouse index: `builder index rebuild`, `builder index pull`, `builder index export`,
`builder index merge` and `builder serve`.

The index modules (index/store, assets, export, mirror, serve) are imported in the handlers, not at the top: together
they add about 26 modules and 70 ms to every `builder` start (``python -X importtime -c 'import builder.cli.main'``),
which the commands that never touch a wheelhouse need not pay (issue 19)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from builder.cli import numbers
from builder.cli.common import out, settings_from_args
from builder.core.errors import UsageError
from builder.core.log import log, plural
from builder.core.net import seconds

if TYPE_CHECKING:
    from builder.index.assets import AssetStore


def register(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> dict:
    """`builder index` (rebuild, pull, export, merge) and `builder serve`; their handlers by name."""
    p = sub.add_parser("index", help="wheelhouse index maintenance")
    isub = p.add_subparsers(dest="index_command", required=True)
    _register_rebuild(isub, add_common)
    _register_pull(isub, add_common)
    _register_export_merge(isub, add_common)
    serve = sub.add_parser("serve", help="serve the wheelhouse over HTTP (PEP 503/691 with content negotiation)")
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to bind (default 127.0.0.1; 0.0.0.0 exposes it to the network)")
    serve.add_argument("--port", type=numbers.port, default=8000, help="port (default 8000; 0 picks a free one)")
    add_common(serve, "wheelhouse")
    return {"index": cmd_index, "serve": cmd_serve}


def _register_rebuild(isub: argparse._SubParsersAction, add_common: Callable[..., None]) -> None:
    rebuild = isub.add_parser(
        "rebuild", help="regenerate every page (simple/, channels/, .metadata sidecars, dashboard) from the wheels"
    )
    rebuild.add_argument(
        "--assets-url", metavar="URL",
        help="publish the wheels as release assets at URL (kept in the wheelhouse's assets.json; the pages link "
             "each wheel there by absolute URL): a folder URL ending in /, which may name {project} and {version}, "
             "e.g. https://github.com/OWNER/REPO/releases/download/{project}-{version}/; '' links wheels/ again")
    add_common(rebuild, "wheelhouse")


def _register_pull(isub: argparse._SubParsersAction, add_common: Callable[..., None]) -> None:
    pull = isub.add_parser(
        "pull", help="restore the wheelhouse from a published one (wheels verified by sha256, one transaction)",
        description="Restore --wheelhouse from the wheelhouse published at URL (GitHub Pages, `builder serve`, a "
                    "folder): wheels, sidecars, records, logs; pages re-rendered. Every wheel's sha256 is checked "
                    "against its page and record; a wheel already here with that sha256 is not downloaded again.",
    )
    pull.add_argument("url", metavar="URL", help="the published wheelhouse's root (the folder holding simple/)")
    pull.add_argument("--delete", action="store_true",
                      help="remove local wheels the published index does not hold (an exact mirror)")
    pull.add_argument("--missing-ok", action="store_true",
                      help="nothing published there yet (HTTP 404 for simple/index.json) is not an error: a first run")
    pull.add_argument("--timeout", type=seconds, metavar="SECONDS",
                      help="the longest wait for a byte (default 30: the network policy's, BUILDER_NET_TIMEOUT)")
    pull.add_argument("--allow-origin", action="append", default=[], metavar="URL",
                      help="also fetch from this origin (http(s)://host[:port]) or folder (file://…), where the "
                           "published pages link files there; by default only the index's own origin and the one "
                           "its assets.json names are read")
    add_common(pull, "wheelhouse", "net-deadline")


def _register_export_merge(isub: argparse._SubParsersAction, add_common: Callable[..., None]) -> None:
    export = isub.add_parser(
        "export", help="lay out the release assets (wheels + .metadata, immutable) and the Pages tree (no wheel)",
        description="For a wheelhouse with an assets URL (`index rebuild --assets-url`): --assets DIR copies each "
                    "wheel and its .metadata sidecar into DIR/<its release>/ (flat for a URL without fields), "
                    "keeping assets already there with the same bytes and refusing one with other bytes; --pages "
                    "DIR (new or empty) gets the site: pages, sidecars, records, logs, dashboard, assets.json, "
                    "no .whl.",
    )
    export.add_argument("--assets", metavar="DIR", help="the folder standing in for the releases")
    export.add_argument("--pages", metavar="DIR", help="a new or empty folder for the Pages tree")
    add_common(export, "wheelhouse")

    merge = isub.add_parser(
        "merge", help="add other wheelhouses' wheels (same bytes only) and merge their records into this one",
        description="Copy the wheels of each SRC (a wheelhouse folder, or any folder with wheels/ and records/: "
                    "the nightly's promoted folder of one GPU test job) into --wheelhouse and merge each wheel's "
                    "records, this wheelhouse's first, then each SRC's in the order given: a record keeps one test "
                    "report per (GPU arch, GPU model, torch) and one torch check per (torch, CUDA line, how, GPU), "
                    "a later one of the same key winning (docs/INDEX.md \"Merging test evidence\"). Other bytes "
                    "under a file name already there, or a record of another wheel, is refused and nothing is "
                    "changed; otherwise one transaction with the pages.",
    )
    merge.add_argument("sources", nargs="+", metavar="SRC", type=Path,
                       help="a folder holding wheels/ and records/ (merged in the order given)")
    add_common(merge, "wheelhouse")


def cmd_index(args: argparse.Namespace) -> int:
    # deferred on purpose: `builder` starts without builder.index (about 50 ms; issue 19)
    from builder.index.store import Wheelhouse

    if args.index_command == "pull":
        return cmd_pull(args)
    if args.index_command == "export":
        return cmd_export(args)
    if args.index_command == "merge":
        return cmd_merge(args)
    house = Wheelhouse(settings_from_args(args).wheelhouse)
    if args.assets_url is not None:
        house.set_assets(_assets_of(args.assets_url))
    areas = [house]
    if house.staging().wheels.is_dir():
        areas.insert(0, house.staging())
    for area in areas:
        area.rebuild_index()
        count = len(area.listed_wheels())
        out.print(f"index rebuilt: {area.index_url()} ({plural(count, 'wheel')})")
    for label in house.labels():
        out.print(f"  channel {label}: {house.channel_url(label)}")
    out.print(f"dashboard: {house.dashboard.resolve().as_uri()}")
    assets = house.assets()
    if assets is not None:
        out.print(f"wheels linked as release assets at {assets.url} (`builder index export` lays them out)",
                  markup=False)
    return 0


def _assets_of(url: str) -> AssetStore | None:
    # deferred on purpose: `builder` starts without builder.index (about 50 ms; issue 19)
    from builder.index.assets import AssetStore

    return AssetStore.parse(url) if url else None


def cmd_export(args: argparse.Namespace) -> int:
    # deferred on purpose: `builder` starts without builder.index (about 50 ms; issue 19)
    from builder.index.export import export_assets, export_pages
    from builder.index.store import Wheelhouse

    if not args.assets and not args.pages:
        raise UsageError("nothing to export", "give --assets DIR, --pages DIR, or both")
    house = Wheelhouse(settings_from_args(args).wheelhouse)
    if args.assets:
        done = export_assets(house, Path(args.assets))
        out.print(f"assets: {len(done.written)} file(s) written to {args.assets}, {len(done.present)} already there "
                  "(same bytes)", markup=False)
    if args.pages:
        tree = export_pages(house, Path(args.pages))
        out.print(f"pages: {tree.files} file(s), {tree.size / 1e6:.1f} MB, in {args.pages} (no wheel)", markup=False)
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    # deferred on purpose: `builder` starts without builder.index (about 50 ms; issue 19)
    from builder.index.store import Wheelhouse

    house = Wheelhouse(settings_from_args(args).wheelhouse)
    for source in args.sources:
        if not source.is_dir():
            raise UsageError(f"{source}: no such folder", "name a folder holding wheels/ and records/")
    plan = house.merge_from([Wheelhouse(source) for source in args.sources])
    out.print(f"merged {plural(len(args.sources), 'folder')} into {house.root}: "
              f"{plural(len(plan.new_wheels), 'wheel')} added, {len(plan.kept_wheels)} already there (same bytes), "
              f"{plural(len(plan.records), 'record')} written", markup=False)
    for name in sorted(plan.merged_from):
        record = house.record_of(name)
        reports = record.gpu_reports if record is not None else ()
        checks = (record.torch_checks or ()) if record is not None else ()
        out.print(f"  {name}: {plural(len(reports), 'GPU test report')}, {plural(len(checks), 'torch check')} "
                  f"(merged in: {plural(len(plan.merged_from[name]), 'record')} of the sources)", markup=False)
        for report in reports:
            arch = report.capability.sm if report.capability is not None else "no arch"
            out.print(f"    {arch} {report.gpu or 'unknown GPU'}, torch {report.torch or '?'}: {report.summary()}",
                      markup=False)
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    # deferred on purpose: `builder` starts without builder.index (about 50 ms; issue 19)
    from builder.index.mirror import pull
    from builder.index.store import Wheelhouse

    house = Wheelhouse(settings_from_args(args).wheelhouse)
    result = pull(args.url, house, delete=args.delete, missing_ok=args.missing_ok, timeout_s=args.timeout,
                  allow=tuple(args.allow_origin))
    if result is None:
        out.print(f"nothing published at {args.url} yet (no simple/index.json): {house.root} left as it was",
                  markup=False)
        return 0
    done = result.restore
    line = (f"pulled {result.root} into {house.root}: {len(done.fetched)} wheel(s) fetched "
            f"({result.fetched_bytes / 1e6:.1f} MB), {len(done.kept)} kept (sha256 already right)")
    if done.removed:
        line += f", {len(done.removed)} removed (not published)"
    out.print(line, markup=False)
    for name in done.extra:
        out.print(f"  kept {name}: here but not published (--delete removes it)", markup=False)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    # deferred on purpose: `builder` starts without builder.index (about 50 ms; issue 19)
    from builder.index.layout import simple_path
    from builder.index.serve import base_url, make_server
    from builder.index.store import Wheelhouse

    house = Wheelhouse(settings_from_args(args).wheelhouse)
    if not house.has_index():
        raise UsageError(f"no index in {house.root}",
                         "build a wheel first, or run `builder index rebuild` (give --wheelhouse for another folder)")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port {args.port}: must be 0-65535")
    try:
        server = make_server(house.root, args.host, args.port)
    except OSError as e:
        raise UsageError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}",
                         "pick another --port (0 picks a free one) or --host") from e
    url = base_url(server)
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning(f"listening on {args.host}: anyone who can reach this machine can read the wheelhouse")
    out.print(f"serving {house.root} at {url} (dashboard: {url}) — Ctrl-C stops", markup=False)
    # the URLs to give a resolver (the combined simple/ can swap an env's torch: README); a Pages tree holds no
    # wheel to read labels from (`index export --pages`), its channel folders name them
    labels = house.labels() or sorted(p.name for p in house.channels.glob("*") if (p / simple_path()).is_dir())
    for label in labels:
        out.print(f"  channel {label}: {url}{simple_path(label)}", markup=False)
    out.file.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
