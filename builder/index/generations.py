"""The generations of the index pages (``.generations/<N>/simple``, ``…/channels``) and the file-system moves they
take: the live one switched by one symlink rename, ``simple``/``channels`` as fixed links through it, old ones
pruned, a pre-generation folder adopted; the builder's temp names and the fsyncs the transaction (txn.py) relies on."""

from __future__ import annotations

import ctypes
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from builder.index.layout import (
    CURRENT,
    GENERATIONS,
    PAGE_TREES,
    TEMP_SUFFIX,
)

KEEP_GENERATIONS = 2  # the live one and the one before it


def is_builder_temp(path: Path) -> bool:
    """Only files of this naming are ever swept: a user's .nojekyll or .htaccess is theirs."""
    return path.name.startswith(".") and path.name.endswith(TEMP_SUFFIX)


def generation_numbers(root: Path) -> list[int]:
    folder = root / GENERATIONS
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit() and not p.is_symlink())


def current_generation(root: Path) -> int | None:
    try:
        target = os.readlink(root / GENERATIONS / CURRENT)
    except OSError:
        return None
    return int(target) if target.isdigit() else None


def switch_generation(root: Path, number: int) -> None:
    """Make generation ``number`` the live one: a new symlink renamed over ``.generations/current`` (rename(2)
    replaces it atomically, so a reader resolves the old generation or the new one)."""
    folder = root / GENERATIONS
    if current_generation(root) == number:
        return
    link, current = temp_path(folder / CURRENT), folder / CURRENT
    os.symlink(str(number), link)
    if current.is_dir() and not current.is_symlink():  # a copy that dereferenced the link (the Pages artifact)
        exchange(link, current)
        shutil.rmtree(link)
    else:
        os.replace(link, current)
    fsync_dirs({folder})


def link_page_trees(root: Path) -> None:
    """``simple`` and ``channels`` as the fixed links ``.generations/current/<name>``. A real folder there (a
    wheelhouse from before generations, or a copy whose links were dereferenced) is exchanged with the new link
    in one renameat2(RENAME_EXCHANGE), so its readers see the folder or the link, never nothing."""
    for name in PAGE_TREES:
        path, target = root / name, f"{GENERATIONS}/{CURRENT}/{name}"
        if path.is_symlink() and os.readlink(path) == target:
            continue
        link = temp_path(path)
        os.symlink(target, link)
        if path.is_dir() and not path.is_symlink():
            exchange(link, path)
            shutil.rmtree(link)  # the old folder, now under the temp name
        else:
            os.replace(link, path)
        fsync_dirs({root})


def prune_generations(root: Path, previous: int | None = None) -> None:
    """Keep the live generation and the one before it (``previous``: the one live before the last transaction,
    rather than the interim one it was live for an instant); the others (older ones, and ones an uncommitted
    transaction wrote) go, with the temp links of a switch a kill interrupted. Call with no journal pending."""
    numbers = generation_numbers(root)
    live = current_generation(root)
    before = [previous] if previous is not None else [n for n in numbers if live is not None and n < live][-1:]
    keep = set() if live is None else {live, *before[:KEEP_GENERATIONS - 1]}
    for number in numbers:
        if number not in keep:
            shutil.rmtree(root / GENERATIONS / str(number), ignore_errors=True)
    folder = root / GENERATIONS
    for stray in folder.iterdir() if folder.is_dir() else []:
        if is_builder_temp(stray) and stray.is_symlink():
            stray.unlink(missing_ok=True)


def adopt_page_folders(root: Path) -> None:
    """Real ``simple``/``channels`` folders become a generation: copied (pages are small), switched to, linked."""
    if not any((root / n).is_dir() and not (root / n).is_symlink() for n in PAGE_TREES):
        return
    number = max([*generation_numbers(root), 0]) + 1
    folder = root / GENERATIONS / str(number)
    for name in PAGE_TREES:
        if (root / name).is_dir():  # a real folder, or a link to the live generation's
            shutil.copytree(root / name, folder / name, symlinks=True,
                            ignore=lambda _d, names: [n for n in names if n.endswith(TEMP_SUFFIX)])
        else:
            (folder / name).mkdir(parents=True)
    fsync_tree(folder)
    switch_generation(root, number)
    link_page_trees(root)
    prune_generations(root)


def exchange(a: Path, b: Path) -> None:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); where the call or the file system lacks it,
    move ``b`` to ``a``'s name and ``a`` to ``b``'s (a moment without ``b``: once, when a wheelhouse adopts
    generations)."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        renameat2 = None
    if renameat2 is not None:
        at_fdcwd, rename_exchange = -100, 2
        if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
            return
        err = ctypes.get_errno()
        if err not in (22, 38, 95):  # EINVAL, ENOSYS, EOPNOTSUPP: not supported here, fall back
            raise OSError(err, os.strerror(err), str(b))
    aside = temp_path(b)
    os.replace(b, aside)
    os.replace(a, b)
    os.replace(aside, a)


def fsync_tree(folder: Path) -> None:
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dirs({Path(dirpath)})
    fsync_dirs({folder.parent})


def temp_path(final: Path) -> Path:
    return final.parent / f".{final.name}.{os.urandom(4).hex()}{TEMP_SUFFIX}"


def fsync_dirs(dirs: Iterable[Path]) -> None:
    for d in dirs:
        try:
            fd = os.open(d, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)
