"""Test tiers, the unit tier's guard, and the fixtures tests share (plain helpers live in tests/helpers.py).

Tiers, chosen with ``--tier`` (markers in pyproject.toml):
- ``unit`` (plain ``pytest``): every test without an ``e2e``, ``docker``, ``network``, ``heavy`` or ``slow`` marker. It must not
  compile, start containers or reach the network: an autouse guard puts refusing stand-ins for nvcc (all but
  ``--version``), ninja, podman, docker and cibuildwheel first on PATH, points proxies at a closed port and refuses
  non-loopback connections in the test process, so an accidental build or download fails loudly and names the marker.
- ``integration``: the ``e2e``, ``docker``, ``network`` and ``heavy`` tests (real compiles, a podman container, PyPI,
  CPU-only checks that take over 10 s).
- ``all``: both. ``slow`` tests (full upstream builds) run only with ``--run-slow``.
An explicit ``-m EXPR`` replaces the tier's selection.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from builder.core import net
from tests.fixtures.farm_demo import write_farm_demo
from tests.helpers import FIXTURES

INTEGRATION_MARKERS = ("e2e", "docker", "network", "heavy")
# Per-test time limits (pytest-timeout); the ini's `timeout` is the unit tier's.
TIER_TIMEOUT_S = {"heavy": 600, "network": 900, "e2e": 1800, "docker": 1800, "slow": 7200}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", help="run slow tests (full upstream builds)")
    parser.addoption("--tier", choices=("unit", "integration", "all"), default="unit",
                     help="unit (default): no compiles, containers or network; integration: e2e, docker, network "
                          "and heavy tests; all: both")


def is_unit(item: pytest.Item) -> bool:
    return not any(m in item.keywords for m in (*INTEGRATION_MARKERS, "slow"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tier = config.getoption("--tier")
    if not config.getoption("markexpr"):
        wanted = {"unit": is_unit, "integration": lambda i: not is_unit(i), "all": lambda i: True}[tier]
        deselected = [i for i in items if not wanted(i)]
        if deselected:
            config.hook.pytest_deselected(items=deselected)
            items[:] = [i for i in items if wanted(i)]
    for item in items:
        limits = [s for m, s in TIER_TIMEOUT_S.items() if m in item.keywords]
        if limits and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(max(limits)))
    if not config.getoption("--run-slow"):
        skip = pytest.mark.skip(reason="slow test: full upstream build, run by hand with --run-slow")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip)


# ---------------------------------------------------------------- the unit tier's guard

_REFUSE = """#!/bin/sh
echo "unit-tier guard: a unit test ran '{name} $*'; mark the test e2e, docker or network (tests/conftest.py)" >&2
exit 97
"""
# nvcc --version (and the arch list) are facts the plan reads, not builds: those pass through to the real nvcc
_NVCC = """#!/bin/sh
case "$1" in --version|--list-gpu-arch|--list-gpu-code) [ -n "{real}" ] && exec "{real}" "$@";; esac
echo "unit-tier guard: a unit test ran 'nvcc $*'; mark the test e2e (tests/conftest.py)" >&2
exit 97
"""
_GUARDED = ("ninja", "podman", "docker", "cibuildwheel")


class NetworkRefused(OSError):
    pass


class BuildRefused(RuntimeError):
    pass


_GUARD = {"active": False}
_COMPILERS = {"nvcc", "cicc", "ptxas", "nvlink", "fatbinary", *_GUARDED}


def _audit(event: str, args: tuple[object, ...]) -> None:
    """Refuses, while a unit test runs, a compiler or engine started from this process by its full path (the PATH
    stand-ins catch the rest, also in child processes)."""
    if event != "subprocess.Popen" or not _GUARD["active"]:
        return
    argv = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
    name = os.path.basename(os.fspath(argv[0])) if argv else ""  # type: ignore[arg-type]
    if name in _COMPILERS and not (name == "nvcc" and len(argv) > 1 and argv[1] in ("--version", "--list-gpu-arch", "--list-gpu-code")):
        raise BuildRefused(f"unit-tier guard: a unit test ran {name}; mark the test e2e (tests/conftest.py)")


sys.addaudithook(_audit)


@pytest.fixture(scope="session")
def _guard_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("unit-guard-bin")
    real_nvcc = shutil.which("nvcc") or ""
    for name, text in [("nvcc", _NVCC.replace("{real}", real_nvcc)),
                       *((n, _REFUSE.replace("{name}", n)) for n in _GUARDED)]:
        path = folder / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return folder


@pytest.fixture(autouse=True)
def unit_guard(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """In the unit tier: no compiles, containers or network, in this process or in the processes it starts."""
    if not is_unit(request.node):
        yield
        return
    guard_bin: Path = request.getfixturevalue("_guard_bin")
    monkeypatch.setenv("PATH", f"{guard_bin}{os.pathsep}{os.environ.get('PATH', '')}")
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(var, "http://127.0.0.1:9")  # the discard port: closed, so a download fails at once
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    real_connect = socket.socket.connect

    def connect(self: socket.socket, address: object) -> None:
        host = address[0] if isinstance(address, tuple) else None
        if self.family in (socket.AF_INET, socket.AF_INET6) and host not in ("127.0.0.1", "::1", "localhost"):
            raise NetworkRefused(f"unit-tier guard: a unit test connected to {address}; mark it network "
                                 "(tests/conftest.py)")
        real_connect(self, address)  # type: ignore[arg-type]

    monkeypatch.setattr(socket.socket, "connect", connect)
    _GUARD["active"] = True
    try:
        yield
    finally:
        _GUARD["active"] = False


# ---------------------------------------------------------------- fixtures


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """A private cache and wheelhouse for one test."""
    return {"BUILDER_CACHE_DIR": str(tmp_path / "cache"), "BUILDER_WHEELHOUSE": str(tmp_path / "wheelhouse")}


@pytest.fixture
def recipe_tree(tmp_path: Path) -> Path:
    """A copy of the fixture recipes/patches/sources that a test may edit; returns its recipes/ folder."""
    root = tmp_path / "tree"
    for name in ("recipes", "patches", "tinyext"):
        shutil.copytree(FIXTURES / name, root / name)
    return root / "recipes"


@pytest.fixture
def farm_demo(tmp_path: Path) -> Path:
    """The farm demo of docs/FARM.md written into this test's folder (tests/fixtures/farm_demo.py: with the 0.2.0
    sources made from the 0.1.0 ones); returns its farm-demo.toml."""
    return write_farm_demo(tmp_path / "demo")


@pytest.fixture(autouse=True)
def _fresh_net_policy() -> Iterator[None]:
    """Each test starts with no process-wide network policy: a CLI main() run in-process calls net.use(), which
    would otherwise outlive its test and override the BUILDER_NET_* variables a later test in the worker sets."""
    saved = list(net._CURRENT)
    net._CURRENT.clear()
    net.forget()  # failures remembered for a process's life (core/netbudget.py) are one test's, not the worker's
    yield
    net._CURRENT[:] = saved
