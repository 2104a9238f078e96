"""Issue 54 item 3: "unreachable" is its own outcome, never a result. ``builder verify`` records nothing for an index
that does not answer; ``coverage --resolve`` stops when uv cannot reach PyPI. Servers on loopback, real uv."""

from __future__ import annotations

import json
import socket
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from builder.core import net
from builder.core.settings import Settings
from builder.farm.resolvecheck import Resolver
from builder.farm.resolvefarm import check_pypi_reachable
from builder.farm.served import Cell
from builder.index.store import Wheelhouse
from builder.model.records import BuildRecord, TorchCheck
from builder.pipeline import verify
from builder.stages.torchrange import IMPORT_REGISTRATION
from tests.helpers import ROOT, http_server
from tests.test_index import raw_wheel

JSON = "application/vnd.pypi.simple.v1+json"
TORCHES = ("2.13.0+cu130", "2.14.0+cu130")


def _index(busy_for: tuple[str, ...]) -> type[BaseHTTPRequestHandler]:
    """A torch index that lists TORCHES (labelled: no METADATA is read) and answers 503 to the user agents named
    in ``busy_for`` ("cuda-wheel-builder": the builder's reader; "uv": uv's installs)."""
    files = [{"filename": f"torch-{t}-cp312-cp312-manylinux_2_28_x86_64.whl",
              "url": f"torch-{t}-cp312-cp312-manylinux_2_28_x86_64.whl"} for t in TORCHES]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            agent = self.headers.get("User-Agent", "")
            busy = any(agent.startswith(a) for a in busy_for)
            body = b"busy" if busy else json.dumps({"files": files}).encode()
            self.send_response(503 if busy else 200)
            self.send_header("Content-Type", "text/plain" if busy else JSON)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


def _published(tmp_path: Path, index_url: str) -> tuple[Settings, Wheelhouse, BuildRecord]:
    settings = Settings.from_env({}, cache_dir=tmp_path / "cache", wheelhouse=tmp_path / "wh",
                                 recipes_dir=ROOT / "recipes")
    house = Wheelhouse(settings.wheelhouse)
    record = BuildRecord(package="fla-core", version="0.6.0", cuda="13.0", torch_index=index_url,
                         python={"version": "3.12.1", "torch": "2.13.0", "torch_cuda": "13.0"},
                         toolchain={"kind": "none (pure Python)"},
                         torch_checks=(TorchCheck(torch="2.13.0", cuda="13.0", python="3.12.1",
                                                  how=IMPORT_REGISTRATION, status="passed"),))
    house.publish(raw_wheel(tmp_path / "raw", "fla-core", "0.6.0", requires=("einops", "torch>=2.7.0")), record)
    published = house.record_of("fla_core-0.6.0-py3-none-any.whl")
    assert published is not None
    return settings, house, published


def _record(house: Wheelhouse) -> BuildRecord | None:
    return house.record_of("fla_core-0.6.0-py3-none-any.whl")


def test_verify_records_nothing_when_uv_cannot_reach_the_index(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: each torch uv could not install from a 503 index went into the record as a failed check."""
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "uv-cache"))
    monkeypatch.setattr(verify, "find_interpreter", lambda version: Path(sys.executable))
    with http_server(_index(busy_for=("uv",))) as root:
        settings, house, before = _published(tmp_path, root + "simple")
        with pytest.raises(verify.Unreachable, match=r"torch 2\.14\.0\S* could not be installed, its index "
                                                     r"unreachable or failing \(uv: .*503.*\); not recorded"):
            verify.verify_package("fla-core", settings)
    assert _record(house) == before


def test_verify_stops_when_the_index_cannot_be_read_now(tmp_path: Path) -> None:
    """A cached list would answer, but the index answers 503 now: nothing is tried, nothing recorded, exit 4."""
    with http_server(_index(busy_for=())) as root:
        settings, house, before = _published(tmp_path, root + "simple")
        from builder.discovery.compat import resolve_index

        assert resolve_index(root + "simple", settings).listing.source == "index"  # cached now
    with http_server(_index(busy_for=("cuda-wheel-builder", "uv"))) as root2:
        house.write_record("fla_core-0.6.0-py3-none-any.whl", before.with_(torch_index=root2 + "simple"))
        moved = _record(house)
        settings2 = Settings.from_env({"BUILDER_NET_RETRIES": "0"}, cache_dir=tmp_path / "cache",
                                      wheelhouse=tmp_path / "wh", recipes_dir=ROOT / "recipes")
        net.use(settings2.net)
        (tmp_path / "cache" / "index").mkdir(parents=True, exist_ok=True)
        from builder.discovery.torchindex import cache_file

        cache_file(settings, root2 + "simple").write_text(cache_file(settings, root + "simple").read_text())
        with pytest.raises(verify.Unreachable, match=r"its torch index .* cannot be read now \(not reachable: .*HTTP "
                                                     r"503.*\); nothing was checked or recorded") as caught:
            verify.verify_package("fla-core", settings2)
    assert caught.value.exit_code == 4
    assert _record(house) == moved


def test_resolve_stops_when_uv_cannot_reach_pypi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: every question failed alike and the report said "installs 0 of 74 … DISAGREE on 74", exit 0."""
    monkeypatch.setenv("UV_HTTP_RETRIES", "0")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{closed.getsockname()[1]}/simple"
    closed.close()
    resolver = Resolver(tmp_path, url, env={"UV_CACHE_DIR": str(tmp_path / "uv-cache"), "UV_HTTP_RETRIES": "0",
                                            "PATH": "/usr/bin:/bin"})
    from builder.core.errors import SourceError

    with pytest.raises(SourceError, match=f"coverage --resolve: {url} unreachable for uv .*; nothing was resolved"):
        check_pypi_reachable(resolver, url, "2.9.0", Cell("2.9", "12.8", "3.12"))


def test_a_pull_whose_wheel_download_breaks_is_unreachable_not_free_space(tmp_path: Path) -> None:
    """D9: the wheel's answer broke off (the host went away mid-pull): before, a NetError (an OSError) read as the
    wheelhouse's disk failing, exit 11 "free space (or fix the permissions)"; now exit 4 naming the URL."""
    from functools import partial
    from http.server import SimpleHTTPRequestHandler

    from builder.index.mirror import Unreachable, pull
    from tests.test_pull_bounds import site

    folder = site(tmp_path)

    class Breaking(SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            if self.path.endswith(".whl"):  # the right size said, half of it sent, the connection closed
                body = Path(self.translate_path(self.path)).read_bytes()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body[: len(body) // 2])
                self.close_connection = True
                return
            super().do_GET()

    with http_server(partial(Breaking, directory=str(folder))) as url:
        with pytest.raises(Unreachable) as caught:
            pull(url, Wheelhouse(tmp_path / "pulled"), policy=net.NetPolicy(retries=0))
    message = caught.value.one_line()
    assert caught.value.exit_code == 4 and "free space" not in message, message
    assert ".whl: gave up after" in message and "nothing was changed" in message, message
    assert not list((tmp_path / "pulled").rglob("*.whl"))


def test_drift_check_calls_a_refused_connection_unreachable_and_writes_its_report(tmp_path: Path) -> None:
    """Before: "the newest releases do not resolve together", exit 1, no report (the workflow then read a missing
    file). The unit tier's proxy is a closed loopback port, so uv's connection to PyPI is refused."""
    import os
    import subprocess

    report = tmp_path / "drift.md"
    import shutil

    uv = Path(sys.executable).parent / "uv"
    uv_path = str(uv) if uv.exists() else shutil.which("uv")
    if uv_path is None:
        pytest.skip("no uv")
    env = {**os.environ, "UV_HTTP_RETRIES": "0", "UV_NO_CACHE": "1", "UV": uv_path,
           "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    result = subprocess.run([str(ROOT / "scripts" / "drift-check.sh"), str(report)], capture_output=True, text=True,
                            env=env, timeout=60)
    assert result.returncode == 3, result.stderr
    assert "error: PyPI unreachable: the newest releases were not resolved (uv: Connection refused" in result.stderr
    assert "do not resolve together" not in result.stderr
    assert "**PyPI could not be reached: no result.**" in report.read_text()
