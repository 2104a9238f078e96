"""The env probe's answer remembered, keyed by a fingerprint of the env: a repeat ``builder doctor`` (or
``builder install``) on an unchanged env reads it instead of importing torch and transformers again (3+ s).

The fingerprint is what the answer depends on and what an install, a removal or a GPU change alters, read without
importing anything in that env: its interpreter's file identity, every entry of every folder on its ``sys.path``
(name, inode, size, mtime: an installer writes a new ``.dist-info`` folder and a changed ``.pth``, a reinstall of
the same version replaces them), the probe script's own text and the packages asked about, the environment
variables the probe reads (PYTHONPATH, CUDA_VISIBLE_DEVICES, HF_*, …), the NVIDIA device files and driver version
of this machine; and an answer is kept for at most ``MAX_AGE_S``. ``sys.path`` is asked with one interpreter
start (``-c``, ~30 ms; no torch); its first entry there is the current folder, which the probe (a script) does not
search, so it is left out: where doctor runs, and what it writes there, changes nothing. What the fingerprint does not see: a file edited in place deeper
than a ``sys.path`` folder's own entries (a hand-patched modeling file): ``--refresh`` probes again.

One entry per interpreter and package list (``envprobe-<hash>.json`` in the identity memo folder, beside what
compilers and interpreters said about themselves), rewritten when the fingerprint changes; a damaged entry is
probed again and written over (core/statefile.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core.cachedir import memo_dir
from builder.core.errors import BuilderError
from builder.core.filememo import file_stamp
from builder.core.fsutil import atomic_write
from builder.core.settings import Settings
from builder.core.smallrun import run_small
from builder.core.statefile import read_json_or_none

MAX_AGE_S = 24 * 3600.0  # an answer older than this is asked again whatever the fingerprint says
# The variables whose value the probe's answer depends on (by prefix): where Python looks, which GPUs torch sees,
# what transformers and kernels do when imported.
ENV_PREFIXES = ("PYTHON", "CUDA", "NVIDIA", "LD_", "TORCH", "PYTORCH", "HF_", "HUGGINGFACE", "TRANSFORMERS",
                "USE_HUB_KERNELS", "KERNELS", "QEMU", "HIP", "ROCR", "XLA")
_SYS_PATH = "import sys, json; print(json.dumps([sys.executable, sys.prefix, sys.path]))"
_LIMIT = 1 << 20  # a probe answer is some KiB; a cache entry bigger than this is not one of ours


@dataclass(frozen=True)
class Slot:
    """Where one env's answer is kept, and the fingerprint it must carry to be read back."""

    entry: Path
    fingerprint: str

    def recall(self, *, now: float | None = None) -> tuple[str, float] | None:
        """(the probe's remembered JSON text, when it was probed) for this fingerprint, else None."""
        data = read_json_or_none(self.entry, limit=16 << 20)
        if not isinstance(data, dict) or data.get("fingerprint") != self.fingerprint:
            return None
        output, at = data.get("output"), data.get("at")
        if not isinstance(output, str) or not isinstance(at, (int, float)):
            return None
        age = (time.time() if now is None else now) - float(at)
        return (output, float(at)) if 0 <= age <= MAX_AGE_S else None

    def remember(self, output: str) -> None:
        """Keep the probe's answer under this fingerprint (atomically; a memo not written is no error)."""
        try:
            self.entry.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(self.entry, json.dumps({"fingerprint": self.fingerprint, "at": time.time(),
                                                 "output": output}))
        except OSError:
            pass


def probe_memo(settings: Settings) -> Path | None:
    """Where env probe answers are remembered (the identity memo folder); None where the cache cannot be made (a
    read-only cache: then every run probes)."""
    try:
        return memo_dir(settings)
    except BuilderError:
        return None


def slot(memo: Path, runner: Sequence[str], interpreter: Path, spec: Mapping[str, Any], script: Path,
         env: Mapping[str, str]) -> Slot | None:
    """The memo slot of this interpreter and package list with the env's fingerprint as it is now; None where
    the fingerprint cannot be read (then the probe runs and nothing is remembered)."""
    try:
        script_text = script.read_bytes()
    except OSError:
        return None
    found = fingerprint(runner, interpreter, spec, script_text, env)
    if found is None:
        return None
    key = hashlib.sha256(json.dumps([str(interpreter), spec], sort_keys=True).encode()).hexdigest()[:24]
    return Slot(memo / f"envprobe-{key}.json", found)


def fingerprint(runner: Sequence[str], interpreter: Path, spec: Mapping[str, Any], script_text: bytes,
                env: Mapping[str, str]) -> str | None:
    """The env's fingerprint (a hex digest), or None where it cannot be read (the interpreter does not answer
    ``sys.path``): then the probe runs and nothing is remembered."""
    try:
        asked = run_small([*runner, "-c", _SYS_PATH], limit=_LIMIT, timeout_s=60.0, env=dict(env), merge=False)
    except OSError:
        return None
    if asked.code != 0:
        return None
    try:
        executable, prefix, path = json.loads(asked.output)
        entries = [str(p) for p in path]
        parts: list[Any] = [file_stamp(interpreter), str(executable), str(prefix)]
    except (ValueError, TypeError, OSError):
        return None
    for entry in entries[1:] if entries[:1] == [""] else entries:  # "": the current folder, under -c only
        parts.append([entry, _folder_stamp(entry)])
    parts.append(sorted((k, v) for k, v in env.items() if k.startswith(ENV_PREFIXES)))
    parts.append(_gpu_stamp())
    parts.append([hashlib.sha256(script_text).hexdigest(), json.dumps(spec, sort_keys=True)])
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()


def _folder_stamp(path: str) -> Any:
    """A ``sys.path`` entry's identity: a folder's own and each of its entries' (name, inode, size, mtime); a file's
    (a zip) identity; None where it does not exist (finders' hook names, missing folders)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    if not os.path.isdir(path):
        return [st.st_ino, st.st_size, st.st_mtime_ns]
    found: list[tuple[str, int, int, int]] = []
    try:
        with os.scandir(path) as it:
            for e in it:
                try:
                    s = e.stat(follow_symlinks=False)
                except OSError:
                    continue
                found.append((e.name, s.st_ino, s.st_size, s.st_mtime_ns))
    except OSError:
        pass
    return [st.st_ino, st.st_mtime_ns, sorted(found)]


def _gpu_stamp() -> list[Any]:
    """What torch's device list hangs on besides the env: the NVIDIA device files and the loaded driver's version."""
    try:
        devices = sorted(n for n in os.listdir("/dev") if n.startswith("nvidia"))
    except OSError:
        devices = []
    try:
        with open("/proc/driver/nvidia/version", "rb") as f:
            driver = f.read(4096).decode("utf-8", "replace")
    except OSError:
        driver = None
    return [devices, driver]
