"""What running a program says about itself (nvcc's version, a compiler's ``--version`` line, an interpreter's
version), remembered on disk keyed by the program's file identity.

A no-op build asks these questions every time; the answers only change when the file does. The identity of a file
is its resolved path, device, inode, size and mtime: an upgrade, a reinstall or a replaced symlink target gives
another identity, and the program is asked again. Nothing else expires an entry. Without a memo folder (``None``)
every question is asked. A damaged entry (not JSON, a folder, a fifo: core/statefile.py never opens one to read) is
asked again and written over.

A script (``#!``) is not the program that answers: a pyenv shim picks an interpreter by PYENV_VERSION and
.python-version files, /usr/local/bin/nvcc may ``exec`` whatever CUDA install it names. Its own identity does not
change when the answer does, so a script's answer is kept for this process only (one build, one farm check),
unless the caller names everything the script reads to answer (``complete``): toolchain/local.py does for a pyenv
shim (the files and variables that select its version), so a shim resolved once to its real interpreter stays
resolved until one of them changes.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from builder.core.fsutil import atomic_write
from builder.core.statefile import read_json_or_none

Stamp = list[Any]
_THIS_PROCESS: dict[str, Any] = {}  # the answers of scripts, by entry name


def file_stamp(path: Path | str) -> Stamp:
    """The identity of the file ``path`` names (symlinks followed): [real path, dev, inode, size, mtime_ns]."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return [real, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def remembered(memo: Path | None, kind: str, files: Sequence[Path | str], question: Sequence[str],
               ask: Callable[[], Any], *, complete: bool = False) -> Any:
    """``ask()`` (a JSON value), or what it answered before for the same ``question`` about the same ``files``.
    ``complete``: ``files`` and ``question`` cover every input of the answer, so a script's answer is kept on disk
    too (see the module)."""
    if memo is None:
        return ask()
    try:
        stamps = [file_stamp(f) for f in files]
    except OSError:
        return ask()  # a missing file: the question fails the way it always did
    name = hashlib.sha256(json.dumps([kind, [str(f) for f in files], list(question)]).encode()).hexdigest()[:24]
    if not complete and any(_is_script(s[0]) for s in stamps):
        here = f"{name}:{json.dumps(stamps)}"
        if here not in _THIS_PROCESS:
            _THIS_PROCESS[here] = ask()
        return _THIS_PROCESS[here]
    entry = memo / f"{kind}-{name}.json"
    data = read_json_or_none(entry)  # damaged (a fifo, a folder, not JSON): asked again and written over
    if isinstance(data, dict) and data.get("stamps") == stamps and "value" in data:
        return data["value"]
    value = ask()
    _write(entry, {"kind": kind, "files": [str(f) for f in files], "question": list(question), "stamps": stamps,
                   "value": value})
    return value


def _is_script(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"#!"
    except OSError:
        return True  # unreadable: do not keep its answer on disk


def _write(entry: Path, data: dict[str, Any]) -> None:
    """Atomically (a reader sees the old entry or the new one); a memo that cannot be written is no error."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(entry, json.dumps(data))
    except OSError:
        pass
