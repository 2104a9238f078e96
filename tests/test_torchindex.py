"""Torch × CUDA × Python discovery from an index: a local fixture index (PEP 691 JSON and PEP 503 HTML pages,
PEP 658 .metadata files, real zip wheels for range reads) served by a tiny HTTP server thread, so the
classification is proven without network. The server is a stand-in for PyPI only because PyPI's real torch pages
cannot be made to hold made-up releases; one network-marked test reads the real PyPI."""

from __future__ import annotations

import http.server
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.version import Version

from builder.core.errors import UsageError
from builder.core.settings import Settings
from builder.discovery.classify import cuda_from_label, cuda_from_requirements
from builder.discovery.compat import TorchIndex, check_torch_matches_cuda, default_torch
from builder.discovery.torchindex import (
    PYPI_SIMPLE,
    discover,
    load_snapshot,
    read_toolkit_versions,
)
from builder.model.cuda import CudaVersion
from tests.helpers import FIXTURES, assert_one_line_error, http_server, run_cli

# made-up releases, one per style: (version, Requires-Dist lines or None for "no .metadata file served")
RELEASES = {
    "3.1.0": ["filelock", 'nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux"'],
    "3.2.0": ['cuda-toolkit[cublas,cudart,cufft,nvrtc]==13.2.2; platform_system == "Linux"', "triton~=3.9.0"],
    "3.3.0": ['nvidia-cuda-runtime==13.1.80; platform_system == "Linux"'],
    "3.4.0": ["filelock", "sympy"],  # no CUDA at all: a cpu build
    "3.5.0": ['cuda-toolkit[cudart]==13.0.3; platform_system == "Linux"'],  # no .metadata: read by range
}
NO_SIDECAR = {"3.5.0"}


class _Handler(http.server.SimpleHTTPRequestHandler):
    """Files from the fixture folder; simple pages as JSON or HTML by Accept; byte ranges; a request log."""

    requests: list[str]
    ignore_range = False  # a server that answers a range request with the whole file

    def log_message(self, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _serve(self, head: bool) -> None:
        self.requests.append(self.path)
        path = Path(self.directory) / self.path.lstrip("/").split("?")[0]
        if path.is_dir():
            wants_json = "application/vnd.pypi.simple.v1+json" in self.headers.get("Accept", "")
            path, kind = ((path / "index.json", "application/vnd.pypi.simple.v1+json")
                          if wants_json and (path / "index.json").exists() else (path / "index.html", "text/html"))
        else:
            kind = "application/octet-stream"
        if not path.is_file():
            self.send_error(404)
            return
        data = path.read_bytes()
        status, body = 200, data
        if self.headers.get("Range") and not self.ignore_range:
            start, end = self.headers["Range"].removeprefix("bytes=").split("-")
            first, last = int(start), min(int(end), len(data) - 1)
            status, body = 206, data[first:last + 1]
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(data) if head else len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if not head:
            self.wfile.write(body)


def _wheel(folder: Path, version: str, python: str, requires: list[str], platform: str) -> str:
    name = f"torch-{version}-cp{python}-cp{python}-{platform}.whl"
    dist = f"torch-{version.split('+')[0]}.dist-info"
    metadata = "Metadata-Version: 2.1\nName: torch\nVersion: " + version + "\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(folder / name, "w") as z:
        z.writestr("torch/__init__.py", "# " + "x" * 5000)  # something before the METADATA member
        cuda = next((r.split("==")[1].split(";")[0] for r in requires if "cuda" in r), None)
        z.writestr("torch/version.py", f"__version__ = '{version}'\ncuda: Optional[str] = "
                   + (repr(cuda[:4]) if cuda else "None") + "\n")
        z.writestr(f"{dist}/METADATA", metadata)
        z.writestr(f"{dist}/RECORD", "")
    return metadata


def _make_index(root: Path) -> None:
    """simple/torch (PyPI style, JSON + .metadata) and channel/cu128/torch (HTML, +cu128 labels, no metadata)."""
    files = root / "files"
    files.mkdir(parents=True)
    entries = []
    for version, requires in RELEASES.items():
        for python in ("311", "312"):
            for platform in ("manylinux_2_28_x86_64", "macosx_14_0_arm64"):
                # a macOS wheel has no CUDA requirements: classification must not read it
                metadata = _wheel(files, version, python, requires if "linux" in platform else [], platform)
                name = f"torch-{version}-cp{python}-cp{python}-{platform}.whl"
                served = version not in NO_SIDECAR
                if served:
                    (files / f"{name}.metadata").write_text(metadata)
                entries.append({"filename": name, "url": f"../../files/{name}", "hashes": {},
                                "core-metadata": served})
    entries.append({"filename": "torch-1.13.0-cp310-cp310-manylinux1_x86_64.whl", "url": "../../files/old.whl",
                    "hashes": {}})  # before torch 2.0: not classified (its CUDA was inside the wheel)
    entries.append({"filename": "torch-3.9.0-cp312-cp312-manylinux_2_28_x86_64.whl", "url": "../../files/y.whl",
                    "hashes": {}, "yanked": "broken"})
    simple = root / "simple" / "torch"
    simple.mkdir(parents=True)
    (simple / "index.json").write_text(json.dumps({"meta": {"api-version": "1.1"}, "name": "torch", "files": entries}))
    (simple / "index.html").write_text("<html><body>"
                                       + "".join(f'<a href="{e["url"]}">{e["filename"]}</a>' for e in entries[:4])
                                       + "</body></html>")
    channel = root / "channel" / "cu128" / "torch"
    channel.mkdir(parents=True)
    links = "".join(f'<a href="../../../files/torch-{v}%2Bcu128-cp312-cp312-manylinux_2_28_x86_64.whl#sha256=00">'
                    f"torch-{v}+cu128-cp312-cp312-manylinux_2_28_x86_64.whl</a><br/>" for v in ("3.1.0", "3.2.0"))
    (channel / "index.html").write_text(f"<!DOCTYPE html><html><body>{links}</body></html>")


@pytest.fixture
def fixture_index(tmp_path: Path) -> Iterator[tuple[str, list[str]]]:
    root = tmp_path / "index"
    _make_index(root)
    requests: list[str] = []
    handler = type("H", (_Handler,), {"requests": requests})
    with http_server(lambda *a, **k: handler(*a, directory=str(root), **k)) as url:
        yield url.rstrip("/"), requests


def _settings(tmp_path: Path, offline: bool = False) -> Settings:
    return Settings.from_env({}, cache_dir=tmp_path / "cache", wheelhouse=tmp_path / "wh", offline=offline)


def test_classification_of_each_style(fixture_index: tuple[str, list[str]], tmp_path: Path) -> None:
    url, requests = fixture_index
    listing = discover("fixture", f"{url}/simple", _settings(tmp_path))
    assert listing.source == "index"
    got = {r.version: r.cuda for r in listing.releases}
    assert got == {"3.1.0": "12.8", "3.2.0": "13.2", "3.3.0": "13.1", "3.4.0": "cpu", "3.5.0": "13.0"}
    assert all(r.pythons == ("3.11", "3.12") for r in listing.releases)
    by_version = {r.version: r for r in listing.releases}
    assert "cuda-toolkit[...]==13.2.2" in by_version["3.2.0"].evidence and "PEP 658" in by_version["3.2.0"].evidence
    assert "range read" in by_version["3.5.0"].evidence
    assert not any(".metadata" in r and "macosx" in r for r in requests), "a macOS wheel was read"
    # a wheel is read by range only for its METADATA where no sidecar is served (3.5.0), and for torch/version.py
    # where its METADATA pins no CUDA (3.4.0: a CPU build, or one with its CUDA inside)
    assert not any(r.endswith(".whl") and "3.5.0" not in r and "3.4.0" not in r for r in requests), \
        "a wheel was read needlessly"
    assert "torch/version.py: cuda = None" in by_version["3.4.0"].evidence
    facts = by_version["3.1.0"].on("x86_64")
    assert facts is not None and facts.cuda == "12.8" and facts.url.endswith(facts.wheel) and facts.read_at
    assert by_version["3.1.0"].on("aarch64") is None and by_version["3.1.0"].cuda_on("aarch64") is None
    assert listing.torch_by_cuda() == {"cpu": ("3.4.0",), "12.8": ("3.1.0",), "13.0": ("3.5.0",),
                                       "13.1": ("3.3.0",), "13.2": ("3.2.0",)}


def test_a_server_ignoring_ranges_is_not_asked_for_the_wheel(fixture_index: tuple[str, list[str]],
                                                             tmp_path: Path) -> None:
    url, _ = fixture_index
    _Handler.ignore_range = True
    try:
        listing = discover("fixture", f"{url}/simple", _settings(tmp_path))
    finally:
        _Handler.ignore_range = False
    release = listing.release("3.5.0")
    assert release is not None and release.cuda is None and "ignored the range request" in release.evidence
    assert listing.release("3.2.0").cuda == "13.2"  # type: ignore[union-attr]


def test_channel_labels_need_no_metadata(fixture_index: tuple[str, list[str]], tmp_path: Path) -> None:
    url, requests = fixture_index
    listing = discover("fixture-cu128", f"{url}/channel/cu128", _settings(tmp_path))
    assert {r.version: r.cuda for r in listing.releases} == {"3.1.0": "12.8", "3.2.0": "12.8"}
    assert all(r.evidence == "+cu128 label" for r in listing.releases)
    assert requests == ["/channel/cu128/torch/"], requests


def test_html_page_when_no_json(fixture_index: tuple[str, list[str]], tmp_path: Path) -> None:
    url, _ = fixture_index
    (tmp_path / "index" / "simple" / "torch" / "index.json").unlink()
    listing = discover("fixture", f"{url}/simple", _settings(tmp_path))
    assert {r.version: r.cuda for r in listing.releases} == {"3.1.0": "12.8"}


def test_cache_ttl_offline_and_no_refetch(fixture_index: tuple[str, list[str]], tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    url, requests = fixture_index
    settings = _settings(tmp_path)
    first = discover("fixture", f"{url}/simple", settings)
    fetched = len(requests)
    again = discover("fixture", f"{url}/simple", settings)  # inside the TTL: no request at all
    assert again.source == "cache" and len(requests) == fetched
    assert {r.version: r.cuda for r in again.releases} == {r.version: r.cuda for r in first.releases}
    refreshed = discover("fixture", f"{url}/simple", settings, refresh=True)  # list again, no metadata again
    assert refreshed.source == "index"
    assert requests[fetched:] == ["/simple/torch/"], requests[fetched:]
    assert discover("fixture", f"{url}/simple", _settings(tmp_path, offline=True), refresh=True).source == "cache"


def test_unreachable_falls_back_to_cache_then_nothing(tmp_path: Path) -> None:
    dead = "http://127.0.0.1:9/simple"  # the discard port: nothing answers
    listing = discover("dead", dead, _settings(tmp_path))
    assert listing.source == "none" and listing.releases == ()
    snapshot = load_snapshot()
    pypi = discover("pypi", PYPI_SIMPLE, _settings(tmp_path, offline=True))
    assert pypi.source == "snapshot" and pypi.releases == snapshot[PYPI_SIMPLE].releases


def test_requirement_and_label_parsing() -> None:
    assert cuda_from_requirements(["nvidia-cuda-runtime-cu12==12.8.90"])[0] == "12.8"
    assert cuda_from_requirements(['cuda-toolkit[cudart]==13.2.2; platform_system == "Linux"'])[0] == "13.2"
    assert cuda_from_requirements(["nvidia-cuda-runtime-cu13==13.1.*"])[0] == "13.1"
    assert cuda_from_requirements(["numpy", "cuda-bindings<14,>=13.0.3"])[0] == "cpu"
    assert (cuda_from_label("2.11.0+cu128"), cuda_from_label("2.9.0+cu130"), cuda_from_label("2.5.0+cpu"),
            cuda_from_label("2.5.0")) == ("12.8", "13.0", "cpu", None)


def test_compat_on_a_discovered_index(fixture_index: tuple[str, list[str]], tmp_path: Path) -> None:
    url, _ = fixture_index
    index = TorchIndex("fixture", f"{url}/simple", discover("fixture", f"{url}/simple", _settings(tmp_path)))
    assert default_torch(index, CudaVersion.parse("13.2")) == "3.2.0"
    with pytest.raises(UsageError, match="torch 3.2.0 on fixture is a CUDA 13.2 build, not CUDA 13.0"):
        check_torch_matches_cuda(index, "3.2.0", CudaVersion.parse("13.0"))


def test_snapshot_has_every_row_sourced() -> None:
    snapshot = load_snapshot()
    assert PYPI_SIMPLE in snapshot
    for listing in snapshot.values():
        assert listing.read_at and listing.releases
        for release in listing.releases:
            assert release.evidence.startswith(("METADATA", "+cu", "release notes")), release
    channel = snapshot["https://download.pytorch.org/whl/cu128"]
    if all(r.evidence.startswith("release notes") for r in channel.releases):
        assert max((r.version for r in channel.releases), key=Version) == "2.11.0"  # cu128 ends with 2.11


# ---------------------------------------------------------------- through the CLI, with the fixture index


def _plan_with_known_bad(fixture_index: tuple[str, list[str]], tmp_path: Path) -> tuple[str, ...]:
    """``builder plan tinyext`` on a copy of the fixture tree whose recipe marks sm_103 known bad on CUDA 13,
    against the fixture torch index."""
    import shutil

    root = tmp_path / "tree"
    for name in ("recipes", "patches", "tinyext"):
        shutil.copytree(FIXTURES / name, root / name)
    recipe = root / "recipes" / "tinyext" / "recipe.toml"
    recipe.write_text(recipe.read_text() + '\n[[known-bad]]\narchs = ["103"]\ncuda = ">=13"\n'
                      'reason = "sm_103 cubins from nvcc 13.x give wrong results"\ninstead = "100+ptx"\n')
    url, _ = fixture_index
    return "plan", "tinyext", "--recipes", str(root / "recipes"), "--torch-index", f"{url}/simple"


def test_cli_label_follows_torch_and_mismatch_is_refused(fixture_index: tuple[str, list[str]], tmp_path: Path,
                                                        cli_env: dict[str, str]) -> None:
    base = (*_plan_with_known_bad(fixture_index, tmp_path), "--arch", "120")
    ok = run_cli(*base, "--cuda", "13.2", env=cli_env)
    assert ok.code == 0, ok.stderr
    assert "cu13torch3.2" in ok.stdout and "3.2.0" in ok.stdout
    bad = run_cli(*base, "--cuda", "13.0", "--torch", "3.2.0", env=cli_env)
    assert_one_line_error(bad, "torch 3.2.0 on custom is a CUDA 13.2 build, not CUDA 13.0", "omit --torch to get 3.5.0")
    assert bad.code == 2
    old_python = run_cli(*base, "--cuda", "13.2", "--python", "3.10", env=cli_env)
    assert_one_line_error(old_python, "torch 3.2.0 on custom has no wheel for Python 3.10", "it has 3.11, 3.12")
    assert old_python.code == 2


def test_cli_known_bad_is_refused(fixture_index: tuple[str, list[str]], tmp_path: Path,
                                  cli_env: dict[str, str]) -> None:
    base = (*_plan_with_known_bad(fixture_index, tmp_path), "--cuda", "13.2")
    bad = run_cli(*base, "--arch", "90,103", env=cli_env)
    assert_one_line_error(bad, "--arch 103: sm_103 code of tinyext", "known bad: sm_103 cubins from nvcc 13.x",
                          "use --arch 100+ptx instead")
    assert bad.code == 2
    assert run_cli(*base, "--arch", "100+ptx,120", env=cli_env).code == 0  # 121: aarch64 only


# ---------------------------------------------------------------- the real PyPI


@pytest.mark.network
def test_real_pypi_torch_2_15_is_cuda_13_2(tmp_path: Path) -> None:
    listing = discover("pypi", PYPI_SIMPLE, _settings(tmp_path), refresh=True)
    assert listing.source == "index"
    release = listing.release("2.15.0")
    assert release is not None and release.cuda == "13.2", release
    assert "cuda-toolkit" in release.evidence and "3.12" in release.pythons
    assert listing.release("2.10.0").cuda == "12.8"  # type: ignore[union-attr]
    assert "13.2" in read_toolkit_versions()


@pytest.mark.network
def test_real_plans_for_causal_conv1d(cli_env: dict[str, str]) -> None:
    """The issue's commands: the CUDA 13.2 plan, the mismatch refusal and the sm_103 refusal."""
    ok = run_cli("plan", "causal-conv1d", "--cuda", "13.2", "--arch", "120", env=cli_env)
    assert ok.code == 0, ok.stderr
    # 1.7.0 has a stable-ABI port: one +cu13 wheel, built against 2.15.0 (the only CUDA 13.2 torch); per torch, the
    # label names the torch's CUDA and minor
    assert "cu13 " in ok.stdout and "2.15.0 from pypi" in ok.stdout and "torch-stable" in ok.stdout
    per_torch = run_cli("plan", "causal-conv1d", "--cuda", "13.2", "--arch", "120", "--abi", "per-torch", env=cli_env)
    assert per_torch.code == 0 and "cu13torch2.15" in per_torch.stdout, per_torch.stderr
    mismatch = run_cli("plan", "causal-conv1d", "--cuda", "13.0", "--arch", "120", "--torch", "2.15.0", env=cli_env)
    assert_one_line_error(mismatch, "torch 2.15.0 on pypi is a CUDA 13.2 build, not CUDA 13.0")
    assert mismatch.code == 2
    bad = run_cli("plan", "causal-conv1d", "--cuda", "13.2", "--arch", "103", env=cli_env)
    assert_one_line_error(bad, "sm_103 code of causal-conv1d 1.7.0 from CUDA 13.2 is known bad", "--arch 100+ptx")
    assert bad.code == 2


def test_pip_toolchain_refuses_a_minor_pypi_lacks(tmp_path: Path) -> None:
    """The discovered cuda-toolkit list (here a fresh cache entry) decides; nothing is downloaded."""
    from builder.core.errors import ToolchainError
    from builder.discovery.torchindex import now_stamp
    from builder.stages.plan import validate_cuda
    from builder.toolchain.pip import provision

    settings = _settings(tmp_path)
    (settings.cache("index") / "cuda-toolkit-versions.json").write_text(
        json.dumps({"versions": ["13.0", "13.2"], "read_at": now_stamp()}))
    with pytest.raises(ToolchainError, match=r"cannot provide CUDA 13.1: PyPI's cuda-toolkit has 13.0, 13.2"):
        provision(CudaVersion.parse("13.1"), settings)
    assert str(validate_cuda("13.2", settings)) == "13.2"
    with pytest.raises(UsageError, match="--cuda 13.1: no toolchain here can provide CUDA 13.1"):
        validate_cuda("13.1", settings)


def test_farm_file_and_cuda_flag_check_one_list_of_known_cuda(tmp_path: Path) -> None:
    """farm.toml's ``cuda`` and ``--cuda`` ask discovery/compat.known_cuda: the same answer for the same settings
    (here a fresh cache entry without 13.1), and the shipped snapshot's for neither settings."""
    from builder.discovery.torchindex import now_stamp
    from builder.farm.spec import FarmError, load_farm
    from builder.stages.plan import validate_cuda

    settings = _settings(tmp_path)
    (settings.cache("index") / "cuda-toolkit-versions.json").write_text(
        json.dumps({"versions": ["13.0", "13.2"], "read_at": now_stamp()}))
    farm = tmp_path / "farm.toml"
    farm.write_text('[defaults]\ncuda = ["13.1"]\narchs = "120"\n\n[[package]]\nname = "demo"\n')
    with pytest.raises(FarmError, match=r"field 'defaults.cuda\[0\]' is not a known CUDA version: '13.1'"):
        load_farm(farm, settings)
    with pytest.raises(UsageError, match="--cuda 13.1: no toolchain here can provide CUDA 13.1"):
        validate_cuda("13.1", settings)
    assert [str(c) for c in load_farm(farm).entries[0].cuda] == ["13.1"]  # the snapshot has 13.1
    assert str(validate_cuda("13.1")) == "13.1"


# ---------------------------------------------------------------- new torch day (issue 39 c)


def _rc_index(root: Path) -> str:
    """A PEP 691 index with torch 2.15.0 (CUDA 13.2) and 2.16.0rc1 (CUDA 13.2), each with its upload time."""
    files, page = root / "files", root / "simple" / "torch"
    files.mkdir(parents=True)
    page.mkdir(parents=True)
    entries = []
    for version, uploaded in (("2.15.0", "2026-10-28T15:17:47Z"), ("2.16.0rc1", "2026-12-01T10:00:00Z")):
        name = f"torch-{version}-cp312-cp312-manylinux_2_28_x86_64.whl"
        (files / f"{name}.metadata").write_text(
            f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\nRequires-Dist: cuda-toolkit[cudart]==13.2.2\n")
        entries.append({"filename": name, "url": f"../../files/{name}", "hashes": {}, "core-metadata": True,
                        "upload-time": uploaded})
    (page / "index.json").write_text(json.dumps({"meta": {"api-version": "1.1"}, "name": "torch", "files": entries}))
    return (root / "simple").as_uri()


def test_pre_releases_only_with_pre_and_the_newest_torch_note(tmp_path: Path) -> None:
    """`builder verify` says what the index's newest torch is, when it was uploaded, and that the next minor is
    not there; --pre takes release candidates too (read from the index, so 2.16 needs no code change)."""
    from builder.discovery.compat import resolve_index
    from builder.pipeline.verify import newest_torch_note

    url = _rc_index(tmp_path / "index")
    settings = _settings(tmp_path)
    final = resolve_index(url, settings, refresh=True)
    assert [r.version for r in final.listing.releases] == ["2.15.0"]  # type: ignore[union-attr]
    note = newest_torch_note(final, pre=False)
    assert note.startswith("custom's newest torch is 2.15.0 (uploaded 2026-10-28; list read from ")
    assert note.endswith("; no torch 2.16 release is on it (pre-releases not looked at: --pre)")
    pre = resolve_index(url, settings, pre=True, refresh=True)
    assert pre.torch_by_cuda == {"13.2": ("2.15.0", "2.16.0rc1")}
    assert newest_torch_note(pre, pre=True).startswith("custom's newest torch is 2.16.0rc1 (a pre-release) "
                                                      "(uploaded 2026-12-01; ")
    assert [r.version for r in resolve_index(url, settings).listing.releases] == ["2.15.0"]  # type: ignore[union-attr]


@pytest.mark.network
def test_real_pypi_newest_torch_and_no_release_candidates(tmp_path: Path) -> None:
    """Read live, with pre-releases: the note names PyPI's newest torch and its upload day. (Measured 2026-12-06:
    2.15.0, uploaded 2026-10-28, and no pre-release at all: PyTorch puts its release candidates on
    download.pytorch.org/whl/test, docs/BUILDS.md.)"""
    from builder.discovery.compat import resolve_index
    from builder.pipeline.verify import newest_torch_note

    pre = resolve_index(None, _settings(tmp_path), pre=True, refresh=True)
    assert pre.listing is not None and pre.source == "index"
    newest = max(Version(r.version) for r in pre.listing.releases)
    note = newest_torch_note(pre, pre=True)
    assert note.startswith(f"pypi's newest torch is {newest}") and " (uploaded 20" in note
    assert note.endswith(f"; no torch {newest.major}.{newest.minor + 1} release or pre-release is on it")
