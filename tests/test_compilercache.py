"""Compiler cache selection (the real ccache round trip is in tests/test_e2e.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from builder.core.errors import UsageError
from builder.core.settings import Settings
from builder.stages.compilercache import CompilerCache, find_compiler_cache
from tests.helpers import ROOT


def _settings(tmp_path: Path, offline: bool = False) -> Settings:
    return Settings(cache_dir=tmp_path / "cache", wheelhouse=tmp_path / "wh", recipes_dir=ROOT / "recipes",
                    patches_dir=ROOT / "patches", offline=offline)


def test_off_means_none_and_unknown_modes_are_refused(tmp_path: Path) -> None:
    assert find_compiler_cache("off", _settings(tmp_path)) is None
    with pytest.raises(UsageError, match="not one of auto, ccache, off"):
        find_compiler_cache("sccache", _settings(tmp_path))


def test_offline_without_ccache_builds_uncached_in_auto_and_fails_when_asked(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no ccache on PATH
    assert find_compiler_cache("auto", _settings(tmp_path, offline=True)) is None
    from builder.core.errors import ToolchainError

    with pytest.raises(ToolchainError, match="--offline forbids downloading"):
        find_compiler_cache("ccache", _settings(tmp_path, offline=True))


def test_build_env_routes_nvcc_and_cxx_through_ccache(tmp_path: Path) -> None:
    cache = CompilerCache(Path("/opt/ccache"), tmp_path / "objs")
    env = cache.build_env(Path("/usr/local/cuda"), tmp_path / "stats.log", {"PATH": "/usr/bin:/bin"})
    assert env["PYTORCH_NVCC"] == "/opt/ccache /usr/local/cuda/bin/nvcc" and "CXX" not in env
    first, rest = env["PATH"].split(":", 1)
    assert rest == "/usr/bin:/bin" and os.readlink(Path(first) / "c++") == "/opt/ccache"
    assert "CCACHE_BASEDIR" not in env  # absolute paths reach the compiler, where -ffile-prefix-map rewrites them
    assert env["TORCH_NO_COMPILER_WRAPPER"] == "1"
    # a new hard link to a header (uv installing torch elsewhere) moves its ctime: no reason to compile twice
    assert env["CCACHE_SLOPPINESS"] == "include_file_ctime"
    assert cache.stats(tmp_path / "missing.log") == {"hits": 0, "misses": 0, "uncacheable": 0}


def test_stats_name_a_compile_that_ccache_ran_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ccache's own counters (4.14's --print-log-stats names): a unit it compiled again after "Input file modified
    during compilation" is named apart from the uncacheable calls."""
    import json
    import subprocess

    from builder.stages import compilercache

    counters = {"direct_cache_hit": 2, "preprocessed_cache_hit": 1, "cache_miss": 3, "called_for_link": 1,
                "modified_input_file": 1, "compile_failed": 0}
    monkeypatch.setattr(compilercache.subprocess, "run", lambda argv, **kw: subprocess.CompletedProcess(
        argv, 0, stdout=json.dumps(counters), stderr=""))
    (tmp_path / "stats.log").write_text("")
    stats = CompilerCache(Path("/opt/ccache"), tmp_path / "objs").stats(tmp_path / "stats.log")
    assert stats == {"hits": 3, "misses": 3, "uncacheable": 1, "called_for_link": 1, "modified_input_file": 1}


@pytest.mark.e2e  # the real ccache (PATH, else PyPI) and a one-line C compile
@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc")
def test_a_hard_link_made_during_a_compile_does_not_make_ccache_compile_twice(tmp_path: Path) -> None:
    """Issue 26 6(h) with the real ccache: an included header gets a new hard link (what a uv install elsewhere
    does to the torch headers of a build venv) while the compiler runs. With ccache's default the ctime counts as
    a modification: "Input file modified during compilation", the compiler runs a second time and nothing is
    stored. With the builder's settings it compiles once and stores the object."""
    cache = find_compiler_cache("ccache", _settings(tmp_path))
    assert cache is not None
    wrapper = tmp_path / "bin" / "gcc"  # a slow compiler: the link lands while it runs (ccache's -E call is not slowed)
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path}/calls.log\ncase " $* " in *" -E "*) ;; *) sleep 1;; esac\n'
                       f'exec {shutil.which("gcc")} "$@"\n')
    wrapper.chmod(0o755)
    (tmp_path / "h.h").write_text("#define X 1\n")
    (tmp_path / "t.c").write_text('#include "h.h"\nint f(void) { return X; }\n')
    stats_log = tmp_path / "stats.log"

    def compile_once(env: dict[str, str]) -> tuple[int, dict[str, int]]:
        for name in ("calls.log", "stats.log", "t.o", "h2.h"):
            (tmp_path / name).unlink(missing_ok=True)
        shutil.rmtree(cache.directory, ignore_errors=True)
        linker = threading.Timer(0.5, os.link, (tmp_path / "h.h", tmp_path / "h2.h"))
        linker.start()
        subprocess.run([str(cache.ccache), str(wrapper), "-c", "t.c", "-o", "t.o"], cwd=tmp_path, env=env, check=True)
        linker.join()
        calls = (tmp_path / "calls.log").read_text().splitlines()
        return sum(" -E " not in f" {call} " for call in calls), cache.stats(stats_log)

    ours = {**os.environ, **cache.build_env(Path("/cuda"), stats_log, {"PATH": os.environ["PATH"]})}
    ccache_default = {k: v for k, v in ours.items() if k != "CCACHE_SLOPPINESS"}
    assert compile_once(ccache_default) == (2, {"hits": 0, "misses": 0, "uncacheable": 0, "modified_input_file": 1})
    assert compile_once(ours) == (1, {"hits": 0, "misses": 1, "uncacheable": 0})


def test_flags_nvcc_reads_from_the_environment_separate_cache_entries(tmp_path: Path) -> None:
    """Found by bench/causal_rebuild.py: a recipe adding NVCC_APPEND_FLAGS=--compress-mode=size got the objects
    of the build without it, because ccache only hashes the command line. They now select a ccache namespace."""
    cache = CompilerCache(Path("/opt/ccache"), tmp_path / "objs")

    def namespace(**env: str) -> str:
        return cache.build_env(Path("/cuda"), tmp_path / "s.log", {"PATH": "/bin", **env})["CCACHE_NAMESPACE"]

    plain = namespace()
    assert namespace() == plain and namespace(HOME="/x") == plain
    assert namespace(NVCC_APPEND_FLAGS="--compress-mode=size") != plain
    assert namespace(NVCC_PREPEND_FLAGS="-G") != plain != namespace(NVCC_CCBIN="g++-12")


def test_build_env_drops_variables_that_would_change_output_behind_the_cache_key() -> None:
    from builder.stages.compile import base_env

    env = base_env({"PATH": "/usr/bin", "NVCC_APPEND_FLAGS": "--compress-mode=size", "NVCC_PREPEND_FLAGS": "-G",
                    "PYTORCH_NVCC": "sccache nvcc", "TORCH_CUDA_ARCH_LIST": "8.0", "HOME": "/root"})
    assert env == {"PATH": "/usr/bin", "HOME": "/root"}


def test_prefix_maps_reach_the_cxx_and_the_nvcc_host_compile_after_the_recipes_flags() -> None:
    from builder.stages.compile import prefix_map_env

    env = {"CFLAGS": "-O2", "NVCC_APPEND_FLAGS": "--compress-mode=size"}
    out = prefix_map_env(env, [(Path("/cache/builds/x-1/src/pkg"), "/build/pkg"), (Path("/venv/site"), "/site-packages")])
    assert out["CFLAGS"] == "-O2 -ffile-prefix-map=/cache/builds/x-1/src/pkg=/build/pkg -ffile-prefix-map=/venv/site=/site-packages"
    assert out["NVCC_APPEND_FLAGS"] == ("--compress-mode=size -Xcompiler=-ffile-prefix-map=/cache/builds/x-1/src/pkg=/build/pkg "
                                        "-Xcompiler=-ffile-prefix-map=/venv/site=/site-packages")
    # CFLAGS splits on whitespace, -Xcompiler on commas: such paths are left unmapped rather than breaking the build
    assert prefix_map_env({}, [(Path("/my cache/src"), "/build"), (Path("/a,b"), "/x")]) == {}
