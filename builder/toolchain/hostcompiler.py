"""The host C/C++ compiler a build on this machine uses, named well enough to enter the cache key.

torch's extension builder compiles C++ with ``$CXX`` (default ``c++``), passes ``$CC`` to nvcc as ``-ccbin``, and
nvcc itself honours ``NVCC_CCBIN``; setuptools adds CFLAGS/CPPFLAGS/LDFLAGS. Any of them changes the objects, so
a wheel built with ``CXX=clang++`` must not count as "unchanged" for one built with g++. Container builds do not
see the host's variables and use the image's compiler; the image's tag (a hash of its Dockerfile template and build
arguments) is in the key instead.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

from builder.core.errors import ToolchainError
from builder.core.filememo import remembered

# variables that choose or steer the host compiler of a torch extension build
FLAG_VARS = ("CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS")


def host_compiler(env: Mapping[str, str], memo: Path | None = None) -> dict[str, str]:
    """``{"cxx": "<path>: <version line>", "cc": …, "nvcc_ccbin": …, "CFLAGS": …}`` for what ``env`` selects.
    With ``memo`` (a folder) each compiler's answer is remembered keyed by its files' identity (core/filememo.py)."""
    found = {"cxx": _identify(env.get("CXX") or "c++", "CXX", env, memo)}
    for var, key in (("CC", "cc"), ("NVCC_CCBIN", "nvcc_ccbin")):
        if env.get(var):
            found[key] = _identify(env[var], var, env, memo)
    found.update({var: env[var] for var in FLAG_VARS if env.get(var)})
    return found


def _identify(command: str, var: str, env: Mapping[str, str], memo: Path | None) -> str:
    """The compiler's resolved path and first ``--version`` line (what changes when the compiler does)."""
    words = command.split() or [command]
    first = words[0]
    path = shutil.which(first, path=env.get("PATH"))
    if path is None:
        source = f"${var}" if var in env else "the default"
        raise ToolchainError(f"the host C/C++ compiler {first!r} ({source}) is not on PATH",
                             "install it (apt-get install g++) or point CXX/CC at one")
    # "ccache c++": c++ answers through the launcher, so the key holds every word that names a file on PATH
    files = [path, *(found for w in words[1:] if (found := shutil.which(w, path=env.get("PATH"))))]
    return str(remembered(memo, "compiler", files, [path, *words[1:], "--version"],
                          lambda: _ask(path, words, var)))


def _ask(path: str, words: list[str], var: str) -> str:
    try:
        # "ccache c++" asks c++ through the launcher, so the version is the compiler's
        result = subprocess.run([path, *words[1:], "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise ToolchainError(f"the host C/C++ compiler {path} does not run: {e}", f"check ${var}") from e
    text = (result.stdout or result.stderr).strip()
    line = text.splitlines()[0] if text else f"(no version, exit {result.returncode})"
    shown = " ".join([path, *words[1:]])
    return f"{shown}: {line}"
