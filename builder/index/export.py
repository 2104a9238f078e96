"""`builder index export`: a wheelhouse whose wheels are release assets (index/assets.py), laid out as the two
things a host publishes: the assets (each wheel and its ``.metadata`` sidecar, in the folder of its release:
``<dir>/<project>-<version>/<file>`` for a URL naming them, else flat) and the Pages tree (every page, sidecar,
record, log, the dashboard and ``assets.json``, and no wheel).

The assets folder stands in for the release: an asset already there is kept when its bytes are the same and the
export is refused, naming it, when they differ (a URL's bytes never change); nothing is written before every asset
has been checked, and each file lands by a link from a temp name (``link(2)`` never replaces a file), so a file
under an asset's name is whole. Files are copied, never hard-linked to the wheelhouse's (``builder serve`` refuses
a file with a second link). The Pages tree goes into a new or empty folder; ``simple/`` and ``channels/`` are
copied through their links (the live generation), and no dot-file (lock, journal, generations, temps) is copied.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from builder.core.errors import PublishError, UsageError
from builder.core.fsutil import sha256_file
from builder.index.assets import AssetStore
from builder.index.layout import PAGE_JSON, STAGING, TEMP_SUFFIX, WHEELS
from builder.index.store import Wheelhouse
from builder.index.txn import recover_root


@dataclass(frozen=True)
class AssetsExport:
    written: tuple[str, ...]  # paths under the folder, laid out now
    present: tuple[str, ...]  # already there with the same bytes


@dataclass(frozen=True)
class PagesExport:
    files: int
    size: int


def export_assets(house: Wheelhouse, dest: Path) -> AssetsExport:
    """Every wheel and sidecar of ``house`` into ``dest`` as its release lays them out (``AssetStore.folder_of``).
    Refuses (PublishError) an asset there with other bytes, before anything is written."""
    assets = _required(house)
    with house.lock():
        recover_root(house.root)
        pairs = [(source, _inside(dest, assets.folder_of(wheel.name), source.name))
                 for wheel in house.wheel_files() for source in (wheel, _sidecar(house, wheel.name))]
        for _, target in pairs:
            _check_target(dest, target)
        present = {target for source, target in pairs if _same_asset(source, target)}
        written = [target for _, target in pairs if target not in present]
        for source, target in pairs:
            if target not in present:
                _place(source, target)
    return AssetsExport(tuple(_rel(p, dest) for p in written), tuple(sorted(_rel(p, dest) for p in present)))


def export_pages(house: Wheelhouse, dest: Path) -> PagesExport:
    """The Pages tree of ``house`` into ``dest`` (new or empty): everything a resolver and a reader of the site
    need but the wheels, which the pages link at their asset URLs (checked here: pages rendered before the setting
    changed are refused)."""
    assets = _required(house)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(f"{dest} is not an empty folder", "give a new folder for the Pages tree")
    with house.lock():
        recover_root(house.root)
        _check_pages_link(house, assets)
        dest.mkdir(parents=True, exist_ok=True)
        for entry in sorted(house.root.iterdir()):
            if entry.name.startswith(".") or entry.name == STAGING:
                continue
            if entry.is_dir():
                shutil.copytree(entry, dest / entry.name, ignore=_pages_only(entry.name == WHEELS))
            elif entry.is_file():
                shutil.copy2(entry, dest / entry.name)
    files = [p for p in dest.rglob("*") if p.is_file()]
    return PagesExport(len(files), sum(p.stat().st_size for p in files))


def _required(house: Wheelhouse) -> AssetStore:
    """The wheelhouse's asset store; a wheelhouse with nothing to export, or whose wheels are not release assets,
    is refused (PublishError, exit 11: the wheelhouse's state, not the command line, is what to change)."""
    if not house.wheel_files():
        raise PublishError(f"nothing published in {house.root}: no wheel to export",
                           "build one first (`builder build …`), or give --wheelhouse (BUILDER_WHEELHOUSE) the wheelhouse "
                           "that holds them")
    assets = house.assets()
    if assets is None:
        raise PublishError(f"{house.root} links its wheels in wheels/ (it has no {house.assets_file.name})",
                         "set where the wheels are published first: `builder index rebuild --assets-url URL`")
    return assets


def _inside(dest: Path, folder: str, name: str) -> Path:
    """``dest/folder/name``, refused (PublishError) unless it stays inside ``dest`` (AssetStore.parse refuses a
    climbing URL; this holds for any folder a wheel's name could fill in)."""
    target = dest / folder / name
    parts = Path(folder, name).parts
    if Path(folder).is_absolute() or any(p in (".", "..") for p in parts):
        raise PublishError(f"the assets URL puts {name} at {folder}{name}, outside {dest}; nothing was written",
                           "fix the URL: `builder index rebuild --assets-url URL`")
    return target


def _check_target(dest: Path, target: Path) -> None:
    """Refuse (PublishError, before anything is written) a release folder or asset under ``dest`` that is a symbolic
    link (the export would write through it, wherever it points), a release folder that is a file, an asset that
    is a folder or other non-file."""
    for path in (target, *target.relative_to(dest).parents):
        at = dest / path if path != target else target
        if at != dest and at.is_symlink():
            raise PublishError(f"{at} is a symbolic link (to {os.readlink(at)}); an export writes only into real "
                               f"folders under {dest}, nothing was written",
                               "remove the link, or export into another folder")
        if at != dest and at.exists() and not (at.is_file() if at == target else at.is_dir()):
            raise PublishError(f"{at} is {'not a plain file' if at == target else 'a file'}, where the export puts "
                               f"{'an asset' if at == target else 'a release folder'}; nothing was written",
                               "move it away, or export into another folder")


def _sidecar(house: Wheelhouse, filename: str) -> Path:
    sidecar = house.sidecar_file(filename)
    if not sidecar.is_file():
        raise PublishError(f"{filename} has no .metadata sidecar in {house.wheels}",
                           "run `builder index rebuild`, which writes it")
    return sidecar


def _same_asset(source: Path, target: Path) -> bool:
    """Whether ``target`` is already this asset; an asset with other bytes is refused."""
    if not target.exists():
        return False
    theirs, ours = sha256_file(target), sha256_file(source)
    if theirs != ours:
        raise PublishError(f"refusing to overwrite the asset {target}: it holds sha256 {theirs}, {source} is "
                           f"{ours}; a URL's bytes never change, nothing was written",
                           "publish the new build under a new file name (a new version or build tag)")
    return True


def _place(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}{TEMP_SUFFIX}")
    try:
        shutil.copyfile(source, tmp)
        os.chmod(tmp, 0o644)
        os.link(tmp, target)  # never replaces: an asset that appeared meanwhile fails here
    except FileExistsError as e:
        raise PublishError(f"{target} appeared while exporting", "run the export again") from e
    except OSError as e:  # a read-only folder, a full disk
        raise PublishError(f"exporting {source.name} to {target} failed ({e.strerror or e}); the assets written "
                           "before it stay (each is whole)", "free space or fix the folder's permissions, then run "
                           "the export again (what is there with the same bytes is kept)") from e
    finally:
        tmp.unlink(missing_ok=True)


def _check_pages_link(house: Wheelhouse, assets: AssetStore) -> None:
    """Every wheel on the live combined pages is linked at its asset URL."""
    for page in sorted(house.simple.glob(f"*/{PAGE_JSON}")):
        for entry in json.loads(page.read_text()).get("files", []):
            name, url = entry.get("filename"), entry.get("url")
            if not str(name).endswith(".whl"):
                continue  # a PEP 825 variants table: in the pages tree, beside the page, not an asset
            if url != assets.url_of(name):
                raise PublishError(f"{page} links {name} at {url}, not at its asset URL {assets.url_of(name)}",
                                   "run `builder index rebuild`, which renders the pages with assets.json")


def _pages_only(in_wheels: bool) -> Callable[[str, list[str]], set[str]]:
    def ignore(_folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n.startswith(".") or in_wheels and n.endswith(".whl")}

    return ignore


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()
