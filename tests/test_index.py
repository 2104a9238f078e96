"""The wheelhouse index: PEP 503 HTML + PEP 691 JSON, PEP 658/714 sidecars, channels, rebuild, concurrency.

The helpers at the top (small pure-Python wheels, labelled like real ones by ``finalize_wheel``) are shared with
test_index_clients.py, test_serve.py and test_dashboard.py.
"""

from __future__ import annotations

import hashlib
import html.parser
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.parse
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from builder.core.errors import PublishError
from builder.core.wheelfile import write_wheel
from builder.index.store import Wheelhouse
from builder.model.abi import per_torch_requirement
from builder.model.records import BuildRecord
from builder.stages.finalize import finalize_wheel
from tests.helpers import ROOT, assert_one_line_error, run_cli


def raw_wheel(folder: Path, name: str, version: str, *, requires: tuple[str, ...] = (), tag: str = "py3-none-any",
              metadata_version: str | None = None, requires_python: str | None = ">=3.9") -> Path:
    """A tiny pure-Python wheel ``name-version-tag.whl`` (METADATA may claim another version)."""
    folder.mkdir(parents=True, exist_ok=True)
    module = name.replace("-", "_")
    wheel = folder / f"{module}-{version}-{tag}.whl"
    info = f"{module}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {metadata_version or version}\n"
    if requires_python:
        metadata += f"Requires-Python: {requires_python}\n"
    metadata += "".join(f"Requires-Dist: {r}\n" for r in requires) + f"\n{name}, a test wheel.\n"
    entries = {
        f"{module}/__init__.py": f"VERSION = {version!r}\n".encode(),
        f"{info}/METADATA": metadata.encode(),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: {tag}\n".encode(),
    }
    write_wheel(wheel, entries, info, {})  # with a complete RECORD, as installers check
    return wheel


def labelled_wheel(folder: Path, name: str, version: str, label: str | None, *, requires: tuple[str, ...] = (),
                   pins: tuple[str, ...] = (), tag: str = "py3-none-any") -> Path:
    """Like a real build's output: ``name-version+label-tag.whl`` with Version and pins rewritten by finalize. A
    labelled wheel pins torch as a build does (``label_torch_pin``) unless ``pins`` or ``requires`` name torch: the
    combined index lists a CUDA-labelled wheel only where its torch requirement admits no PyPI torch of another
    CUDA major (index/channelpolicy.py ``root_lists``)."""
    raw = raw_wheel(folder / "raw" / f"{name}-{version}-{label}-{tag}", name, version, requires=requires, tag=tag)
    if label is None:
        return raw
    if not any(canonicalize_name(Requirement(r).name) == "torch" for r in (*pins, *requires)):
        pins = (*pins, *label_torch_pin(label))
    return finalize_wheel(raw, folder / "final" / f"{label}-{tag}", label=label, pins=list(pins),
                          build_record=BuildRecord(extra={"label": label}))


def label_torch_pin(label: str) -> tuple[str, ...]:
    """The torch requirement a build with this label writes: ``cu130torch2.14`` / ``cu13torch2.14`` →
    ``torch>=2.14.0,<2.15``; ``cu13`` (stable) → ``torch>=2.11`` (the floor of CUDA 13, model/abi.py), ``cu12`` →
    ``torch>=2.10``; none for another label."""
    per_torch = re.fullmatch(r"cu\d+torch(\d+\.\d+)", label)
    if per_torch:
        return (per_torch_requirement(per_torch.group(1)),)
    stable = re.fullmatch(r"cu(\d+)", label)
    if stable:
        return (f"torch>={'2.11' if int(stable.group(1)) >= 13 else '2.10'}",)
    return ()


def served_files(root: Path) -> list[Path]:
    """Every file a reader of the wheelhouse sees, by the paths it sees them at (through the ``simple`` and
    ``channels`` links into the live generation), the generations themselves left out."""
    found = []
    for folder, dirs, files in os.walk(root, followlinks=True):
        if Path(folder) == root:
            dirs[:] = [d for d in dirs if d != ".generations"]
        found += [Path(folder) / f for f in files]
    return sorted(found)


def leftovers(root: Path) -> list[Path]:
    """Dot-files but the lock and the page generations (``.generations/<N>`` and its ``current`` link)."""
    generations = root / ".generations"
    return [p for p in root.rglob(".*") if p.name != ".publish.lock" and p != generations
            and not (p.parent == generations and (p.name == "current" or p.name.isdigit()))]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Anchors(html.parser.HTMLParser):
    """The <a> elements of a page: [(attrs, text)]."""

    def __init__(self) -> None:
        super().__init__()
        self.anchors: list[tuple[dict[str, str], str]] = []
        self._open: dict[str, str] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self._open = {k: v or "" for k, v in attrs}

    def handle_data(self, data):
        if self._open is not None:
            self.anchors.append((self._open, data))
            self._open = None


def anchors(page: Path) -> list[tuple[dict[str, str], str]]:
    parser = Anchors()
    parser.feed(page.read_text())
    return parser.anchors


def target(page: Path, href: str) -> Path:
    """Resolve a relative link of a page the way a client does (file:// URL semantics)."""
    url = urllib.parse.urljoin(page.as_uri(), href.split("#")[0])
    return Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path))


# ------------------------------------------------------------------------------------------------ tests


@pytest.fixture
def house(tmp_path: Path) -> Wheelhouse:
    """A wheelhouse with demo 1.0 for two CUDA+torch labels, and an unlabelled helper package."""
    house = Wheelhouse(tmp_path / "wh")
    for label in ("cu130torch2.14", "cu128torch2.10"):
        wheel = labelled_wheel(tmp_path, "demo", "1.0", label, requires=("helper>=1",), pins=("helper==1.1",))
        house.publish(wheel, BuildRecord.from_json({"cuda": "13.0" if label.startswith("cu130") else "12.8",
                              "tests": {"import_status": "passed", "kernel_status": "skipped",
                                        "kernel_reason": "no CUDA GPU visible"}}))
    house.publish(labelled_wheel(tmp_path, "helper", "1.1", None), BuildRecord.from_json({}))
    return house


def test_pep503_html_with_pep658_attributes(house: Wheelhouse) -> None:
    page = house.simple / "demo" / "index.html"
    text = page.read_text()
    assert '<meta name="pypi:repository-version" content="1.1">' in text
    links = anchors(page)
    assert sorted(t for _, t in links) == [
        "demo-1.0+cu128torch2.10-py3-none-any.whl", "demo-1.0+cu130torch2.14-py3-none-any.whl"]
    for attrs, name in links:
        wheel = target(page, attrs["href"])
        assert wheel == house.wheels / name and wheel.is_file()
        assert attrs["href"].endswith(f"#sha256={sha256(wheel)}")
        assert attrs["data-requires-python"] == ">=3.9"
        sidecar = Path(f"{wheel}.metadata")
        assert attrs["data-core-metadata"] == attrs["data-dist-info-metadata"] == f"sha256={sha256(sidecar)}"
        with zipfile.ZipFile(wheel) as zf:
            inside = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            assert hashlib.sha256(sidecar.read_bytes()).digest() == hashlib.sha256(zf.read(inside)).digest(), \
                "the sidecar is METADATA byte for byte"
        assert "Version: 1.0+cu" in sidecar.read_text() and "Requires-Dist: helper==1.1" in sidecar.read_text()
    assert "kernel tests skipped (no CUDA GPU visible)" in text, "the human note after each link stays"
    root = anchors(house.simple / "index.html")
    assert [(a["href"], t) for a, t in root] == [("demo/", "demo"), ("helper/", "helper")]


def test_pep691_json_pages(house: Wheelhouse) -> None:
    root = json.loads((house.simple / "index.json").read_text())
    assert root == {"meta": {"api-version": "1.1"}, "projects": [{"name": "demo"}, {"name": "helper"}]}
    page_path = house.simple / "demo" / "index.json"
    page = json.loads(page_path.read_text())
    assert page["meta"] == {"api-version": "1.1"} and page["name"] == "demo"
    assert page["versions"] == ["1.0+cu128torch2.10", "1.0+cu130torch2.14"]
    html_links = {t: a for a, t in anchors(house.simple / "demo" / "index.html")}
    for entry in page["files"]:
        wheel = target(page_path, entry["url"])
        assert wheel.name == entry["filename"] and wheel.is_file()
        assert entry["hashes"] == {"sha256": sha256(wheel)} and entry["size"] == wheel.stat().st_size
        meta = {"sha256": sha256(Path(f"{wheel}.metadata"))}
        assert entry["core-metadata"] == entry["dist-info-metadata"] == meta
        assert entry["requires-python"] == ">=3.9" and entry["yanked"] is False
        assert entry["upload-time"].endswith("Z")
        assert html_links[entry["filename"]]["href"] == f"{entry['url']}#sha256={entry['hashes']['sha256']}"


def test_channels_hold_only_their_label(house: Wheelhouse) -> None:
    for label in ("cu130torch2.14", "cu128torch2.10"):
        simple = house.channels / label / "simple"
        assert [t for _, t in anchors(simple / "index.html")] == ["demo"], "helper has no label: no channel"
        page = simple / "demo" / "index.html"
        (attrs, name), = anchors(page)
        assert name == f"demo-1.0+{label}-py3-none-any.whl"
        assert target(page, attrs["href"]) == house.wheels / name
        assert "data-core-metadata" in attrs
        files = json.loads((simple / "demo" / "index.json").read_text())["files"]
        assert [f["filename"] for f in files] == [name]
        assert target(simple / "demo" / "index.json", files[0]["url"]) == house.wheels / name
    assert [t for _, t in anchors(house.channels / "index.html")] == ["cu128torch2.10", "cu130torch2.14"]
    assert house.labels() == ["cu128torch2.10", "cu130torch2.14"]


def test_refuses_wheel_whose_metadata_version_differs(tmp_path: Path) -> None:
    house = Wheelhouse(tmp_path / "wh")
    bad = raw_wheel(tmp_path / "bad", "demo", "1.0+cu130torch2.14", metadata_version="1.0")
    with pytest.raises(PublishError) as err:
        house.publish(bad, BuildRecord.from_json({}))
    assert err.value.message == (
        "refusing to publish demo-1.0+cu130torch2.14-py3-none-any.whl: its METADATA says Version: 1.0 "
        "but the file name says 1.0+cu130torch2.14")
    assert "finalize_wheel" in (err.value.hint or "") and err.value.exit_code == 11
    assert not (house.wheels / bad.name).exists() and not (house.simple / "demo").exists()
    wrong_name = raw_wheel(tmp_path / "bad2", "other", "1.0")
    renamed = wrong_name.with_name("demo-1.0-py3-none-any.whl")
    wrong_name.rename(renamed)
    with pytest.raises(PublishError, match="METADATA says Name: other but the file name says demo"):
        house.publish(renamed, BuildRecord.from_json({}))
    garbage = tmp_path / "demo-1.0-py3-none-any.whl"
    garbage.write_text("not a zip")
    with pytest.raises(PublishError, match="not a readable wheel"):
        house.publish(garbage, BuildRecord.from_json({}))
    assert not house.wheels.exists() or not any(house.wheels.iterdir())


def test_publish_takes_the_inspections_portability_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A build hands publish the report inspection made of the same file: publish does not read the wheel's
    objects again, yet a refusal in that report still refuses, and a broken file is still a PublishError first.
    Without a report, or with one of another file, publish makes its own."""
    from builder.core.errors import PortabilityError
    from builder.index import store
    from builder.stages.repair import PortabilityReport

    made: list[str] = []
    monkeypatch.setattr(store, "portability_report",
                        lambda wheel: made.append(wheel.name) or PortabilityReport(wheel.name, ("any",), None, ()))
    house = Wheelhouse(tmp_path / "wh")
    wheel = raw_wheel(tmp_path / "w", "demo", "1.0")
    given = PortabilityReport(wheel.name, ("any",), None, ())
    house.publish(wheel, BuildRecord.from_json({"cache_key": "a"}), portability=given)
    assert made == [] and (house.wheels / wheel.name).is_file()
    vendoring = PortabilityReport(wheel.name, ("any",), None, ("demo.libs/libcudart.so.13",))
    with pytest.raises(PortabilityError, match="vendors libcudart.so.13"):
        house.publish(wheel, BuildRecord.from_json({"cache_key": "b"}), portability=vendoring)
    kept = house.record_of(wheel.name)
    assert kept is not None and kept.cache_key == "a", "a refused wheel changed the wheelhouse"
    garbage = tmp_path / "broken-1.0-py3-none-any.whl"
    garbage.write_text("not a zip")
    with pytest.raises(PublishError, match="not a readable wheel"):
        house.publish(garbage, BuildRecord.from_json({}),
                      portability=PortabilityReport(garbage.name, ("any",), None, ("x.libs/libtorch.so",)))
    other = raw_wheel(tmp_path / "o", "other", "2.0")
    house.publish(other, BuildRecord.from_json({"cache_key": "c"}), portability=given)  # given is of demo's file
    house.publish(raw_wheel(tmp_path / "p", "third", "3.0"), BuildRecord.from_json({"cache_key": "d"}))
    assert made == [other.name, "third-3.0-py3-none-any.whl"]


def test_rebuild_regenerates_everything(house: Wheelhouse, tmp_path: Path) -> None:
    log = tmp_path / "cache" / "logs" / "demo-2.0-0123456789ab.log"  # named as the pipeline names it
    log.parent.mkdir(parents=True)
    log.write_text("nvcc -gencode arch=compute_120,code=sm_120 ...\nbuild ok\n")
    wheel = labelled_wheel(tmp_path, "demo", "2.0", "cu130torch2.14")
    house.publish(wheel, BuildRecord.from_json({"build_log": str(log), "package": "demo", "version": "2.0",
                          "cache_key": "0123456789abcdef"}))
    copied = house.logs / f"{wheel.name}.log"
    assert copied.read_text() == log.read_text(), "the build log is copied in at publish time"
    generated = [p for p in served_files(house.root) if p.parts[-2] not in ("records",)
                 and p.suffix != ".whl" and p.name != ".publish.lock"]
    before = {p: p.read_bytes() for p in generated if p.name != "index.html" or p.parent != house.root}
    for path in generated:
        path.unlink()
    result = run_cli("index", "rebuild", "--wheelhouse", str(house.root))
    assert result.code == 0, result.stderr
    assert f"index rebuilt: {house.index_url()} (4 wheels)" in result.stdout
    assert f"channel cu130torch2.14: {house.channel_url('cu130torch2.14')}" in result.stdout
    for path, data in before.items():
        assert hashlib.sha256(path.read_bytes()).digest() == hashlib.sha256(data).digest(), \
            f"{path.relative_to(house.root)} differs after rebuild"
    assert house.dashboard.is_file()
    assert not leftovers(house.root), "no temp files left"


def test_rebuild_refuses_a_planted_mismatch(house: Wheelhouse, tmp_path: Path) -> None:
    bad = raw_wheel(tmp_path / "bad", "demo", "3.0+cu130torch2.14", metadata_version="3.0")
    (house.wheels / bad.name).write_bytes(bad.read_bytes())
    result = run_cli("index", "rebuild", "--wheelhouse", str(house.root))
    assert_one_line_error(result, "refusing to publish demo-3.0+cu130torch2.14-py3-none-any.whl",
                          "METADATA says Version: 3.0")
    assert result.code == 11


def test_stale_pages_and_channels_go(house: Wheelhouse) -> None:
    house.remove("demo-1.0+cu128torch2.10-py3-none-any.whl")
    assert not (house.channels / "cu128torch2.10").exists()
    assert not (house.wheels / "demo-1.0+cu128torch2.10-py3-none-any.whl.metadata").exists()
    assert [t for _, t in anchors(house.simple / "demo" / "index.html")] == ["demo-1.0+cu130torch2.14-py3-none-any.whl"]
    house.remove("helper-1.1-py3-none-any.whl")
    assert not (house.simple / "helper").exists()
    assert json.loads((house.simple / "index.json").read_text())["projects"] == [{"name": "demo"}]


def test_staging_promotion_carries_log_and_updates_dashboard(tmp_path: Path) -> None:
    """gate.py's flow: staging().publish → write_record → publish → staging().remove; log travels along."""
    house = Wheelhouse(tmp_path / "wh")
    staging = house.staging()
    log = tmp_path / "b.log"
    log.write_text("compiled\n")
    wheel = labelled_wheel(tmp_path, "demo", "1.0", "cu130torch2.14")
    staged = staging.publish(wheel, BuildRecord.from_json({"build_log": str(log), "tests": {"import_status": "passed"}}))
    assert staging.contains(staged) and (staging.logs / f"{wheel.name}.log").is_file()
    assert "staging/wheels/" + wheel.name in house.dashboard.read_text(), "staged rows show on the main dashboard"
    log.unlink()  # the GPU machine does not have the build machine's log: it comes from staging
    record = {"build_log": str(log), "tests": {"import_status": "passed", "kernel_status": "passed"}}
    staging.write_record(wheel.name, BuildRecord.from_json(record))
    house.publish(staged, BuildRecord.from_json(record))
    staging.remove(wheel.name)
    assert (house.logs / f"{wheel.name}.log").read_text() == "compiled\n"
    assert not (staging.wheels / wheel.name).exists() and not (staging.simple / "demo").exists()
    board = house.dashboard.read_text()
    assert "staging/wheels/" not in board and f'data-wheel="{wheel.name}" data-status="passed"' in board


_PUBLISHER = """
import sys
from pathlib import Path
sys.path.insert(0, {root!r})
from tests.test_index import labelled_wheel
from builder.index.store import Wheelhouse
from builder.model.records import BuildRecord
from builder.core.wheelfile import write_wheel
worker, count, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
house = Wheelhouse(out / "wh")
wheels = [labelled_wheel(out / f"w{{worker}}", f"pkg{{worker % 3}}", f"{{worker}}.{{i}}",
                         ["cu130torch2.14", "cu128torch2.10"][i % 2]) for i in range(count)]
print("ready", flush=True)
sys.stdin.readline()  # all start together
for wheel in wheels:
    house.publish(wheel, BuildRecord.from_json({{"worker": worker, "tests": {{"import_status": "passed"}}}}))
"""


def test_concurrent_publishers_lose_nothing(tmp_path: Path) -> None:
    workers, per_worker = 6, 4
    script = _PUBLISHER.format(root=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(w), str(per_worker), str(tmp_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in range(workers)]
    for proc in procs:
        assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    house = Wheelhouse(tmp_path / "wh")
    torn: list[str] = []
    reads = [0]
    done = threading.Event()

    def reader() -> None:  # readers must never see a half-written page
        while not done.is_set():
            for page in [house.simple / "index.json", *house.simple.glob("*/index.json"),
                         *house.channels.glob("*/simple/*/index.json")]:
                try:
                    text = page.read_text()
                except FileNotFoundError:
                    continue  # a project folder not created yet
                try:
                    json.loads(text)
                except ValueError:
                    torn.append(str(page))
                reads[0] += 1
            for page in [house.simple / "index.html", house.dashboard, *house.simple.glob("*/index.html")]:
                try:
                    text = page.read_text()
                except FileNotFoundError:
                    continue
                if not text.rstrip().endswith("</html>"):
                    torn.append(str(page))
                reads[0] += 1

    thread = threading.Thread(target=reader)
    thread.start()
    start = time.monotonic()
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    elapsed = time.monotonic() - start
    done.set()
    thread.join()

    expected = {f"pkg{w % 3}-{w}.{i}+{['cu130torch2.14', 'cu128torch2.10'][i % 2]}-py3-none-any.whl"
                for w in range(workers) for i in range(per_worker)}
    assert {p.name for p in house.wheels.glob("*.whl")} == expected
    assert {p.name.removesuffix(".metadata") for p in house.wheels.glob("*.metadata")} == expected
    assert {p.name.removesuffix(".json") for p in house.records.glob("*.json")} == expected
    listed = {f["filename"] for page in house.simple.glob("*/index.json")
              for f in json.loads(page.read_text())["files"]}
    assert listed == expected
    listed_html = {t for page in house.simple.glob("*/index.html") for _, t in anchors(page)}
    assert listed_html == expected
    for label in ("cu130torch2.14", "cu128torch2.10"):
        in_channel = {f["filename"] for page in (house.channels / label / "simple").glob("*/index.json")
                      for f in json.loads(page.read_text())["files"]}
        assert in_channel == {w for w in expected if f"+{label}-" in w}
    board = house.dashboard.read_text()
    assert all(f'data-wheel="{w}"' in board for w in expected)
    assert not torn, f"torn reads: {torn[:3]}"
    assert not leftovers(house.root), "no temp files left"
    print(f"{workers} publishers x {per_worker} wheels in {elapsed:.1f}s; {reads[0]} concurrent page reads, 0 torn")


def test_rebuild_copies_no_log_from_outside_the_builders_folders(tmp_path: Path) -> None:
    """Issue 17 case 9: a record whose build_log names /etc/passwd (or a link to it) gets no copy in logs/."""
    house = Wheelhouse(tmp_path / "wh")
    wheel = labelled_wheel(tmp_path, "demo", "1.0", "cu130torch2.14")
    house.publish(wheel, BuildRecord.from_json({}))
    record_path = house.records / f"{wheel.name}.json"
    record = json.loads(record_path.read_text())
    logs = tmp_path / "cache" / "logs"
    logs.mkdir(parents=True)
    link = logs / "demo-1.0-0123456789ab.log"  # the builder's naming, but a link to a foreign file
    link.symlink_to("/etc/passwd")
    for build_log in ("/etc/passwd", str(link)):
        record_path.write_text(json.dumps({**record, "build_log": build_log, "package": "demo", "version": "1.0",
                                           "cache_key": "0123456789abcdef"}))
        assert run_cli("index", "rebuild", "--wheelhouse", str(house.root)).code == 0
        assert not (house.logs / f"{wheel.name}.log").exists(), f"{build_log} was copied into logs/"
