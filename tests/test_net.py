"""The network policy (builder/core/net.py) against hostile local servers: one that drips a byte a second, one
that accepts and never answers, one that fails twice and then answers. Loopback only (the unit guard allows it);
deadlines of seconds."""

from __future__ import annotations

import argparse
import contextlib
import http.server
import json
import os
import socket
import time
import urllib.error
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from builder.cli.common import add_common, settings_from_args
from builder.core import net, uvtool
from builder.core.errors import SourceError, ToolchainError, UsageError
from builder.core.net import NetError, NetPolicy
from builder.discovery import simpleindex
from builder.index.mirror import pull
from builder.index.store import Wheelhouse
from builder.user.wheelhouse import WheelhouseReader
from tests.helpers import assert_one_line_error, http_server, run_cli
from tests.helpers import tarpit as helpers_tarpit

FAST = NetPolicy(connect_timeout_s=1, read_timeout_s=1, deadline_s=3, retries=5, backoff_s=0.05)
BODY = json.dumps({"meta": {"api-version": "1.1"}, "projects": []}).encode()


@pytest.fixture(autouse=True)
def _no_process_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees the policy its environment sets, not one an earlier CLI test in this process chose."""
    monkeypatch.setattr(net, "_CURRENT", [])
    for var in (*net.SETTINGS.values(), "UV_HTTP_TIMEOUT", "UV_HTTP_CONNECT_TIMEOUT", "UV_HTTP_RETRIES"):
        monkeypatch.setenv(var, "")  # noted, so that what a test (or net.use) sets there is undone after it
        monkeypatch.delenv(var)


# ---------------------------------------------------------------- the servers


class _Handler(http.server.BaseHTTPRequestHandler):
    behave: Callable[[http.server.BaseHTTPRequestHandler], None]
    seen: list[str]

    def do_GET(self) -> None:
        self.seen.append(self.path)
        type(self).behave(self)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def serving(behave: Callable[[http.server.BaseHTTPRequestHandler], None]) -> Iterator[tuple[str, list[str]]]:
    """A local HTTP server answering every GET with ``behave``: its root URL and the paths asked for."""
    seen: list[str] = []
    handler = type("Handler", (_Handler,), {"behave": staticmethod(behave), "seen": seen})
    with http_server(handler) as url:
        yield url, seen


def _drip(h: http.server.BaseHTTPRequestHandler) -> None:
    """Headers at once, then a 1 MB body one byte a second: no read ever times out."""
    h.send_response(200)
    h.send_header("Content-Length", "1000000")
    h.end_headers()
    try:
        for _ in range(1_000_000):
            h.wfile.write(b" ")
            h.wfile.flush()
            time.sleep(1)
    except OSError:
        pass  # the client gave up


@pytest.fixture
def drip() -> Iterator[tuple[str, list[str]]]:
    with serving(_drip) as served:
        yield served


@pytest.fixture
def tarpit() -> Iterator[str]:
    """A port that accepts connections (the kernel's backlog does) and never reads or answers."""
    with helpers_tarpit() as url:
        yield url


def _flaky(failures: int, how: str) -> Callable[[http.server.BaseHTTPRequestHandler], None]:
    count = [0]

    def behave(h: http.server.BaseHTTPRequestHandler) -> None:
        if h.path == "/assets.json":  # the pull's optional assets setting (index/assets.py): none here
            h.send_error(404)
            return
        count[0] += 1
        if count[0] <= failures:
            if how == "503":
                h.send_error(503)
            else:  # the answer breaks off half-way
                h.send_response(200)
                h.send_header("Content-Length", str(len(BODY)))
                h.end_headers()
                h.wfile.write(BODY[: len(BODY) // 2])
                h.wfile.flush()
                h.connection.shutdown(socket.SHUT_RDWR)
            return
        h.send_response(200)
        h.send_header("Content-Type", "application/vnd.pypi.simple.v1+json")
        h.send_header("Content-Length", str(len(BODY)))
        h.end_headers()
        h.wfile.write(BODY)

    return behave


def _timed(call: Callable[[], object]) -> tuple[BaseException | None, float]:
    start = time.monotonic()
    try:
        call()
    except BaseException as e:  # noqa: BLE001 (the test looks at it)
        return e, time.monotonic() - start
    return None, time.monotonic() - start


# ---------------------------------------------------------------- the policy itself


def test_a_drip_server_is_cut_at_the_deadline(drip: tuple[str, list[str]]) -> None:
    url = drip[0] + "simple/index.json"
    error, took = _timed(lambda: net.fetch_bytes(url, policy=FAST))
    assert isinstance(error, NetError), error
    assert 2.9 < took < 4.5, took
    line = error.one_line()
    assert "\n" not in line
    for needle in (url, "3 s network deadline", "bytes came", "BUILDER_NET_DEADLINE", "--net-deadline"):
        assert needle in line, line
    assert isinstance(error, SourceError) and isinstance(error, OSError)  # the CLI's error, and a cache fallback's


def test_a_tarpit_is_retried_and_given_up_within_the_deadline(tarpit: str) -> None:
    error, took = _timed(lambda: net.fetch_bytes(tarpit + "simple/index.json", policy=FAST))
    assert isinstance(error, NetError), error
    assert took < 3.5, took
    assert "tries; nothing came for 1 s" in str(error), str(error)


@pytest.mark.parametrize("how", ["503", "broken"])
def test_two_failures_then_an_answer_succeed_with_retries(how: str) -> None:
    with serving(_flaky(2, how)) as (url, seen):
        assert net.fetch_bytes(url + "x", policy=FAST) == BODY
        assert seen == ["/x", "/x", "/x"]


def test_retries_run_out_with_one_line_naming_the_url() -> None:
    policy = NetPolicy(retries=2, backoff_s=0.05, deadline_s=10)
    with serving(_flaky(99, "503")) as (url, seen):
        error, took = _timed(lambda: net.fetch_bytes(url + "x", policy=policy))
        assert isinstance(error, NetError) and took < 2, (error, took)
        assert len(seen) == 3
        assert f"{url}x: gave up after" in str(error) and "answered HTTP 503" in str(error), str(error)
        assert "BUILDER_NET_RETRIES" in error.one_line()


def test_a_missing_page_and_a_refused_port_are_answers_not_retried(tmp_path: Path) -> None:
    with serving(lambda h: h.send_error(404)) as (url, seen):
        with pytest.raises(urllib.error.HTTPError) as info:
            net.fetch_bytes(url + "gone", policy=FAST)
        assert info.value.code == 404 and seen == ["/gone"]
    error, took = _timed(lambda: net.fetch_bytes("http://127.0.0.1:9/x", policy=FAST))  # the discard port: closed
    assert isinstance(error, urllib.error.URLError) and took < 1, (error, took)
    (tmp_path / "page").write_bytes(b"local")
    assert net.fetch_bytes((tmp_path / "page").as_uri()) == b"local"


def test_settings_come_from_the_environment_and_a_bad_one_is_named() -> None:
    policy = NetPolicy.from_env({"BUILDER_NET_DEADLINE": "45", "BUILDER_NET_TIMEOUT": "7.5",
                                 "BUILDER_NET_RETRIES": "0"}, deadline_s=None)
    assert (policy.deadline_s, policy.read_timeout_s, policy.retries) == (45, 7.5, 0)
    assert NetPolicy.from_env({"BUILDER_NET_DEADLINE": "45"}, deadline_s=9).deadline_s == 9  # the flag wins
    assert NetPolicy.from_env({}) == NetPolicy()
    for var, value in (("BUILDER_NET_DEADLINE", "soon"), ("BUILDER_NET_TIMEOUT", "0"), ("BUILDER_NET_RETRIES", "1.5")):
        with pytest.raises(UsageError, match=var):
            NetPolicy.from_env({var: value})


# ---------------------------------------------------------------- uv gets the same bounds


def test_the_uv_environment_carries_the_timeouts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    policy = NetPolicy(read_timeout_s=7, connect_timeout_s=3, retries=4)
    env = uvtool.uv_env({"PATH": "/bin"}, policy)
    assert (env["UV_HTTP_TIMEOUT"], env["UV_HTTP_CONNECT_TIMEOUT"], env["UV_HTTP_RETRIES"]) == ("7", "3", "4")
    assert uvtool.uv_env({"UV_HTTP_TIMEOUT": "99"}, policy)["UV_HTTP_TIMEOUT"] == "99"  # the user's own setting wins
    fake = tmp_path / "uv"  # a uv that says what it was given
    fake.write_text("#!/bin/sh\necho $UV_HTTP_TIMEOUT $UV_HTTP_RETRIES\n")
    fake.chmod(0o755)
    monkeypatch.setattr(uvtool, "uv_bin", lambda: str(fake))
    monkeypatch.setenv("BUILDER_NET_TIMEOUT", "12")
    assert uvtool.run_uv(["pip", "list"], what="listing").split() == ["12", "2"]


def test_a_uv_that_hangs_is_stopped_at_its_deadline(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake = tmp_path / "uv"
    fake.write_text("#!/bin/sh\nsleep 60\n")
    fake.chmod(0o755)
    monkeypatch.setattr(uvtool, "uv_bin", lambda: str(fake))
    error, took = _timed(lambda: uvtool.run_uv(["pip", "install", "x"], what="installing x",
                                               policy=NetPolicy(uv_deadline_s=1)))
    assert isinstance(error, ToolchainError) and took < 5, (error, took)
    assert "installing x: uv ran past the 1 s deadline" in str(error) and "BUILDER_UV_DEADLINE" in error.one_line()


# ---------------------------------------------------------------- the callers


def test_index_pull_and_the_wheelhouse_reader_end_at_the_deadline(drip: tuple[str, list[str]], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUILDER_NET_DEADLINE", "2")
    error, took = _timed(lambda: pull(drip[0], Wheelhouse(tmp_path / "house")))
    assert isinstance(error, NetError) and took < 3.5, (error, took)
    error, took = _timed(lambda: WheelhouseReader(drip[0]).check())
    assert isinstance(error, NetError) and took < 3.5, (error, took)
    assert str(error).startswith(f"wheelhouse {drip[0]}: {drip[0]}simple/"), str(error)


def test_pull_retries_a_broken_answer(tmp_path: Path) -> None:
    with serving(_flaky(1, "broken")) as (url, seen):
        result = pull(url, Wheelhouse(tmp_path / "house"), policy=FAST)  # the whole (empty) index, second time
        assert result is not None and result.fetched_bytes == 0
        assert [p for p in seen if p != "/assets.json"] == ["/simple/index.json", "/simple/index.json",
                                                             "/channels/index.json"]  # every channel's list too


def test_the_torch_index_falls_back_when_its_fetch_gives_up(drip: tuple[str, list[str]],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BUILDER_NET_DEADLINE", "1")
    with pytest.raises(OSError):  # what discover() falls back to the cache or snapshot on
        simpleindex.project_files(drip[0].rstrip("/"))


def test_the_cli_gives_up_on_a_drip_server_with_one_line(drip: tuple[str, list[str]], tmp_path: Path) -> None:
    start = time.monotonic()
    result = run_cli("index", "pull", drip[0], "--wheelhouse", str(tmp_path / "house"),
                     env={"BUILDER_NET_DEADLINE": "2"}, timeout=60)
    assert time.monotonic() - start < 15
    assert result.code == 4
    assert_one_line_error(result, drip[0], "2 s network deadline", "BUILDER_NET_DEADLINE")


def test_the_flag_sets_the_process_policy_and_uv_inherits_it() -> None:
    parser = argparse.ArgumentParser()
    add_common(parser)
    settings = settings_from_args(parser.parse_args(["--net-deadline", "42"]))
    assert settings.net.deadline_s == 42 and net.current().deadline_s == 42
    assert os.environ["UV_HTTP_TIMEOUT"] == "30" and os.environ["UV_HTTP_RETRIES"] == "2"
    with pytest.raises(SystemExit):
        parser.parse_args(["--net-deadline", "-1"])
