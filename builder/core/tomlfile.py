"""Reading the project's small TOML files (recipes, recipes/aliases.toml, farm.toml) safely.

A path that should name a TOML file may name a folder, a fifo (opening it waits for a writer forever), a device
(/dev/zero never ends), a huge file, text that is not UTF-8 or tables nested a thousand deep (tomllib recurses).
Each is refused here with one error naming the file, before anything is read that could hang or fill memory.
"""

from __future__ import annotations

import os
import stat
import tomllib
from pathlib import Path
from typing import Any

from builder.core.errors import BuilderError

MAX_TOML_BYTES = 1024 * 1024  # the largest recipe is about 5 KB, a farm file a few KB
MAX_TOML_DEPTH = 32  # tables and lists inside each other; a recipe needs 4, a farm file 4


def _kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a fifo (named pipe)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def read_small_file(path: Path, error: type[BuilderError], *, what: str, missing_hint: str | None = None,
                    limit: int = MAX_TOML_BYTES) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes; anything else is one ``error`` naming it.

    The file's type is read with stat() before it is opened, so a fifo is never opened (which would block); the
    open is non-blocking and checked again with fstat() in case the path was swapped in between."""
    try:
        mode = os.stat(path).st_mode
    except (FileNotFoundError, NotADirectoryError) as e:
        raise error(f"{path}: {what} not found", missing_hint) from e
    except OSError as e:
        raise error(f"{path}: {what} cannot be read ({e.strerror or e})") from e
    a_what = f"{'an' if what[:1] in 'aeiou' else 'a'} {what}"
    if not stat.S_ISREG(mode):
        raise error(f"{path}: is {_kind(mode)}, not {a_what}", f"{a_what} is a regular TOML file")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as e:
        raise error(f"{path}: {what} cannot be read ({e.strerror or e})") from e
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{path}: is {_kind(mode)}, not {a_what}", f"{a_what} is a regular TOML file")
        data = f.read(limit + 1)
    if len(data) > limit:
        raise error(f"{path}: is larger than {limit // 1024} KiB, too large for {a_what}",
                    "check that the path names the right file")
    return data


def read_toml(path: Path, error: type[BuilderError], *, what: str, missing_hint: str | None = None,
              limit: int = MAX_TOML_BYTES) -> dict[str, Any]:
    """The TOML of a small regular UTF-8 file, nested at most MAX_TOML_DEPTH deep; every way it can fail is one
    ``error`` (a BuilderError subclass) naming the file and the cure."""
    data = read_small_file(path, error, what=what, missing_hint=missing_hint, limit=limit)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})",
                    "TOML files are UTF-8: re-save it as UTF-8") from e
    try:
        parsed = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise error(f"{path}: not valid TOML: {e}") from e
    except RecursionError as e:  # tomllib recurses once per nested array or inline table
        raise error(f"{path}: tables and lists nested too deep to read",
                    f"the builder reads at most {MAX_TOML_DEPTH} levels") from e
    if nesting_depth(parsed) > MAX_TOML_DEPTH:  # dotted headers ([a.b.c...]) nest without recursion in tomllib
        raise error(f"{path}: tables and lists nested more than {MAX_TOML_DEPTH} deep",
                    f"the builder reads at most {MAX_TOML_DEPTH} levels")
    return parsed


def nesting_depth(value: object) -> int:
    """How many tables and lists are inside each other in ``value`` (a scalar: 0), without recursion; counting
    stops past MAX_TOML_DEPTH."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth + 1)
        if deepest > MAX_TOML_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest
