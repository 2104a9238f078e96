"""Reading the small JSON files the builder keeps for itself (cache entries, markers, a wheelhouse's records and
journal) without trusting them: a damaged one is one line naming the file (and the field), never a traceback, and
a fifo or device put where a file belongs is never opened for reading (it would block).

``read_json`` opens the file non-blocking and refuses, from ``fstat`` of what was opened, anything but a regular
file, or one larger than the caller's limit; then bytes → UTF-8 → JSON, each failure a ``StateFileError`` whose
message names the file. ``want`` checks a field's type the same way. Callers decide what a damaged file means:
a cache entry is asked again (``read_json_or_none``), a wheelhouse's journal or record stops the command with the
cure.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any


class StateFileError(ValueError):
    """A state file that cannot be read as what it should be; the message names the file (and the field)."""


def read_json(path: Path, *, limit: int = 1 << 20) -> Any:
    """The JSON value in ``path``; FileNotFoundError when there is none (nothing at the path, or a dangling link);
    StateFileError when it is not a regular file, is over ``limit`` bytes, unreadable, not UTF-8 or not JSON."""
    data = read_bytes(path, limit=limit)
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise StateFileError(f"{path}: not UTF-8 text (byte {e.start})") from e
    except RecursionError as e:
        raise StateFileError(f"{path}: JSON nested too deeply") from e
    except ValueError as e:
        raise StateFileError(f"{path}: not JSON ({e})") from e


def read_bytes(path: Path, *, limit: int = 1 << 20) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit``; FileNotFoundError when there is none;
    StateFileError when it is a folder, fifo or device (never opened for reading), over ``limit`` or unreadable."""
    try:
        before = os.stat(path)  # a device is not even opened (opening some has effects)
        if not stat.S_ISREG(before.st_mode):
            raise StateFileError(f"{path}: is {_kind(before.st_mode)}, not a file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except NotADirectoryError as e:  # a file where a folder above it belongs: nothing at the path either
        raise FileNotFoundError(e.errno, e.strerror, str(path)) from e
    except StateFileError:
        raise
    except OSError as e:
        raise StateFileError(f"{path}: cannot be opened ({e.strerror or e})") from e
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StateFileError(f"{path}: is {_kind(st.st_mode)}, not a file")
        if st.st_size > limit:
            raise StateFileError(f"{path}: {st.st_size} bytes, more than the {limit} it may have")
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise StateFileError(f"{path}: cannot be read ({e.strerror or e})") from e
    if len(data) > limit:
        raise StateFileError(f"{path}: more than the {limit} bytes it may have")
    return data


def read_json_or_none(path: Path, *, limit: int = 1 << 20) -> Any:
    """``read_json``, or None when the file is absent or damaged in any way (a cache entry that is made again)."""
    try:
        return read_json(path, limit=limit)
    except (OSError, StateFileError):
        return None


_TYPES: dict[str, tuple[type, ...]] = {"a string": (str,), "a number": (int, float), "an object": (dict,),
                                       "a list": (list,), "a boolean": (bool,)}


def want(path: Path, data: Any, field: str, kind: str, *, optional: bool = False) -> Any:
    """``data[field]`` when it is of ``kind`` ("a string", "a number", "an object", "a list", "a boolean"), else a
    StateFileError naming the file and field (``data`` not an object, too). ``optional``: absent or null is None."""
    if not isinstance(data, dict):
        raise StateFileError(f"{path}: holds {describe(data)}, not a JSON object")
    value = data.get(field)
    if value is None and optional:
        return None
    types = _TYPES[kind]
    if not isinstance(value, types) or (kind == "a number" and isinstance(value, bool)):
        raise StateFileError(f"{path}: field {field!r} is {describe(value) if field in data else 'missing'}, "
                             f"not {kind}")
    return value


def describe(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a fifo"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"
