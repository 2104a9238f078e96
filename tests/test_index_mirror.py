"""`builder index pull`: a wheelhouse restored from a published one, served by the real `builder serve` in a
subprocess and pulled by the real CLI in another.

The published wheelhouse holds real (small) wheels published with ``Wheelhouse.publish``, with records carrying a
cache key and a build log, as the pipeline's do. After the pull, the unchanged check (``find_record``: the wheel's
bytes against its record, and listed in the pages with that hash) says "unchanged" against the pulled copy; a
damaged wheel on the server is refused by name and changes nothing; a rerun downloads no wheel (the server's own
request log shows it); a SIGKILL in the middle of a download leaves the old state."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from builder.core.settings import Settings
from builder.farm.expand import expand
from builder.farm.spec import load_farm
from builder.farm.unchanged import known_inputs
from builder.index.store import Wheelhouse
from builder.index.txn import is_builder_temp
from builder.model.records import BuildRecord
from tests.helpers import ROOT, assert_one_line_error, run_cli
from tests.test_farm import _record_for
from tests.test_index import labelled_wheel
from tests.test_publish_txn import assert_consistent, make_wheel

PACKAGES = (("alpha", "1.0", "key-a10"), ("alpha", "1.1", "key-a11"), ("beta", "0.3", "key-b03"))
MIRRORED = ("simple", "channels", "records", "logs", "wheels")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def digests(root: Path) -> dict[str, str]:
    """Every file of the mirrored folders (pages, records, logs, wheels, sidecars) and its sha256."""
    return {str(p.relative_to(root)): sha(p) for top in MIRRORED if (root / top).is_dir()
            for p in sorted((root / top).rglob("*")) if p.is_file() and not is_builder_temp(p)}


def publish(house: Wheelhouse, tmp: Path, name: str, version: str, key: str, payload: int = 20_000) -> Path:
    build_log = tmp / "cache-logs" / f"{name}-{version}-{key}.log"
    build_log.parent.mkdir(parents=True, exist_ok=True)
    build_log.write_text(f"compiling {name} {version}\n")
    wheel = make_wheel(tmp / "src", name, version, key=key, payload=payload)
    return house.publish(wheel, BuildRecord.from_json({"cache_key": key, "package": name, "version": version,
                                 "build_log": str(build_log)}))


@dataclass
class Server:
    house: Wheelhouse
    url: str
    log: Path

    def requests(self) -> list[str]:
        return [line for line in self.log.read_text().splitlines() if '"GET ' in line]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    house = Wheelhouse(tmp_path / "published")
    for name, version, key in PACKAGES:
        publish(house, tmp_path, name, version, key)
    log = tmp_path / "serve.log"
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "builder", "serve", "--wheelhouse", str(house.root),
                                 "--port", "0"], stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT)
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving "), line + log.read_text()
        yield Server(house, line.split(" at ", 1)[1].split(" ", 1)[0], log)
    finally:
        proc.send_signal(signal.SIGTERM)  # not SIGINT: a test run started in the background ignores it
        proc.wait(timeout=10)


def pull(url: str, into: Path, *extra: str):
    return run_cli("index", "pull", url, "--wheelhouse", str(into), *extra, timeout=300)


def test_pull_restores_the_published_index_and_the_unchanged_check_reads_it(server: Server, tmp_path: Path) -> None:
    pulled = tmp_path / "pulled"
    result = pull(server.url, pulled)
    assert result.code == 0, result.stderr
    assert "3 wheel(s) fetched" in result.stdout and "0 kept" in result.stdout, result.stdout
    published, restored = digests(server.house.root), digests(pulled)
    assert len([n for n in published if n.startswith("logs/")]) == 3, "the fixture publishes three build logs"
    differing = sorted(n for n in published.keys() | restored.keys() if published.get(n) != restored.get(n))
    assert not differing, f"the pulled copy differs from the published one in {differing}"
    house = Wheelhouse(pulled)
    assert_consistent(house)
    for name, version, key in PACKAGES:
        found = house.find_record(key)
        assert found is not None, f"the unchanged check does not find {name} {version} in the pulled copy"
        wheel, record = found
        assert record.wheel_sha256 == sha(wheel) == sha(server.house.wheels / wheel.name)
    assert house.find_record("key-never-built") is None


def test_the_nightly_plan_check_reads_the_pulled_copy(server: Server, tmp_path: Path, farm_demo: Path) -> None:
    """`builder matrix --changed` (the nightly plan's check) against the pulled copy: the target a published wheel
    was built from is not rebuilt; against an empty wheelhouse (an evicted cache, no pull) every target would be."""
    demo = farm_demo
    env = {"BUILDER_CACHE_DIR": str(tmp_path / "cache")}
    settings = Settings.from_env({}, cache_dir=tmp_path / "cache", wheelhouse=server.house.root)
    first = expand(load_farm(demo), settings)[0]
    wheel = labelled_wheel(tmp_path, first.package, first.version, "cu130torch2.14", tag="cp311-cp311-linux_x86_64")
    server.house.publish(wheel, _record_for(first, known_inputs(first, settings)))

    def changed(wheelhouse: Path) -> list[str]:
        result = run_cli("matrix", "--file", str(demo), "--changed", "--format", "github",
                         "--wheelhouse", str(wheelhouse), env=env)
        assert result.code == 0, result.stderr
        return [t["id"] for t in json.loads(result.stdout)["include"]]

    evicted = changed(tmp_path / "evicted")
    assert first.id in evicted and len(evicted) == 8, evicted
    assert pull(server.url, tmp_path / "pulled").code == 0
    unchanged = changed(tmp_path / "pulled")
    assert first.id not in unchanged and len(unchanged) == 7, unchanged


def test_a_rerun_downloads_no_wheel(server: Server, tmp_path: Path) -> None:
    pulled = tmp_path / "pulled"
    assert pull(server.url, pulled).code == 0
    before = digests(pulled)
    asked = len(server.requests())
    result = pull(server.url, pulled)
    assert result.code == 0, result.stderr
    assert "0 wheel(s) fetched (0.0 MB), 3 kept" in result.stdout, result.stdout
    wheel_gets = [r for r in server.requests()[asked:] if ".whl " in r]
    assert not wheel_gets, f"the rerun downloaded wheels again: {wheel_gets}"
    assert digests(pulled) == before

    # a wheel republished with other bytes is fetched, the others kept
    publish(server.house, tmp_path / "again", "beta", "0.3", "key-b03-new", payload=30_000)
    result = pull(server.url, pulled)
    assert "1 wheel(s) fetched" in result.stdout and "2 kept" in result.stdout, result.stdout + result.stderr
    assert Wheelhouse(pulled).find_record("key-b03-new") is not None
    assert Wheelhouse(pulled).find_record("key-b03") is None


def test_a_wheel_no_longer_published_is_kept_unless_delete(server: Server, tmp_path: Path) -> None:
    pulled = tmp_path / "pulled"
    assert pull(server.url, pulled).code == 0
    gone = "alpha-1.0+cu130torch2.14-py3-none-any.whl"
    server.house.remove(gone)
    result = pull(server.url, pulled)
    assert f"kept {gone}: here but not published" in result.stdout, result.stdout
    assert (pulled / "wheels" / gone).is_file()
    result = pull(server.url, pulled, "--delete")
    assert "1 removed (not published)" in result.stdout, result.stdout
    assert not (pulled / "wheels" / gone).exists() and not (pulled / "records" / f"{gone}.json").exists()
    assert digests(pulled) == digests(server.house.root), "--delete gives an exact mirror"
    assert Wheelhouse(pulled).find_record("key-a10") is None


def test_a_damaged_wheel_on_the_server_is_refused_by_name(server: Server, tmp_path: Path) -> None:
    name = "beta-0.3+cu130torch2.14-py3-none-any.whl"
    served = server.house.wheels / name
    original = served.read_bytes()
    data = bytearray(original)
    data[len(data) // 2] ^= 0xFF  # same size, other bytes: only the hash can tell
    served.write_bytes(bytes(data))
    pulled = tmp_path / "pulled"
    result = pull(server.url, pulled)
    assert result.code == 5, result.stderr
    assert_one_line_error(result, name, "sha256", "refused, nothing was changed")
    assert digests(pulled) == {}, "a refused pull left files behind"
    assert not [p for p in pulled.rglob("*") if is_builder_temp(p)], "a refused pull left temp files"

    # a record that disagrees with its page is refused too
    served.write_bytes(original)
    record = server.house.records / f"{name}.json"
    record.write_text(json.dumps({**json.loads(record.read_text()), "wheel_sha256": "0" * 64}))
    assert_one_line_error(pull(server.url, pulled), f"record of {name}", "0" * 64)
    assert digests(pulled) == {}


def test_a_kill_during_the_download_leaves_the_old_state(tmp_path: Path) -> None:
    """SIGKILL while a wheel is being written (its temp file exists): the wheelhouse is as before the pull, and
    the next pull completes. Served from a folder (file://) so the download's pace is the disk's."""
    source = Wheelhouse(tmp_path / "published")
    publish(source, tmp_path, "alpha", "1.0", "key-a10")
    pulled = tmp_path / "pulled"
    assert pull(str(source.root), pulled).code == 0
    before = digests(pulled)
    publish(source, tmp_path, "beta", "0.3", "key-b03", payload=64_000_000)
    env = {**os.environ, "COLUMNS": "200"}
    proc = subprocess.Popen([sys.executable, "-m", "builder", "index", "pull", str(source.root),
                             "--wheelhouse", str(pulled)], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline, seen = time.monotonic() + 60, None
    while seen is None and proc.poll() is None and time.monotonic() < deadline:
        seen = next((p for p in (pulled / "wheels").glob(".beta-*.whl.*") if is_builder_temp(p)), None)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert seen is not None, "the pull finished before a wheel's temp file was seen: nothing was killed mid-download"
    assert digests(pulled) == before, "a killed pull changed the wheelhouse"
    Wheelhouse(pulled).recover()
    assert not [p for p in pulled.rglob("*") if is_builder_temp(p)], "the next open did not sweep the temp"
    result = pull(str(source.root), pulled)
    assert result.code == 0 and "1 wheel(s) fetched" in result.stdout and "1 kept" in result.stdout, result.stdout
    assert_consistent(Wheelhouse(pulled))


def test_nothing_published_yet(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = pull(str(tmp_path / "empty"), tmp_path / "pulled", "--missing-ok")
    assert result.code == 0 and "nothing published at" in result.stdout, result.stdout + result.stderr
    assert_one_line_error(pull(str(tmp_path / "empty"), tmp_path / "pulled"), "no published index", "--missing-ok")


def test_a_page_naming_a_path_is_refused(tmp_path: Path) -> None:
    """A hostile (or broken) index cannot make the pull write outside wheels/."""
    root = tmp_path / "hostile"
    (root / "simple" / "evil").mkdir(parents=True)
    (root / "simple" / "index.json").write_text(json.dumps({"projects": [{"name": "evil"}]}))
    (root / "simple" / "evil" / "index.json").write_text(json.dumps({"files": [{
        "filename": "../../evil-1.0-py3-none-any.whl", "url": "x.whl", "hashes": {"sha256": "0" * 64},
        "size": 1, "core-metadata": {"sha256": "0" * 64}}]}))
    assert_one_line_error(pull(str(root), tmp_path / "pulled"), "not a wheel file name")
    assert not (tmp_path / "evil-1.0-py3-none-any.whl").exists()
    shutil.rmtree(root)
