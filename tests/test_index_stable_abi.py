"""Stable-ABI wheels in the wheelhouse (issue 25): one ``cp310-abi3`` wheel per CUDA major (``+cu13``, pinned
``torch>=2.11``) is listed in the channel of each torch it was verified on (``channels/cu130torch2.12/simple/``, the
URL an env with that torch already uses), never in a channel named ``cu13``, and in no channel before a check
passed; the combined ``simple/`` lists it as every wheel. The dashboard shows each torch it was checked on and how.

The wheels are tiny pure-Python ones labelled by ``finalize_wheel`` as real builds are; no torch, no compiler.
"""

from __future__ import annotations

import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from builder.index.channelpolicy import wheel_channels
from builder.index.mirror import pull
from builder.index.pages import listed
from builder.index.store import Wheelhouse
from builder.model.records import BuildRecord
from tests.test_index import anchors, labelled_wheel, target

CC = "causal-conv1d"
STABLE = "causal_conv1d-1.7.0+cu13-cp310-abi3-linux_x86_64.whl"
PER_TORCH = "causal_conv1d-1.7.0+cu130torch2.11-cp312-cp312-linux_x86_64.whl"
OTHER_TORCH = "causal_conv1d-1.7.0+cu130torch2.14-cp312-cp312-linux_x86_64.whl"
VERIFIED = ("cu130torch2.11", "cu130torch2.12", "cu132torch2.15")


def check(torch: str, cuda: str = "13.0", how: str = "import+registration", status: str = "passed",
          detail: str = "") -> dict[str, str]:
    return {"torch": torch, "cuda": cuda, "python": "3.12.1", "how": how, "status": status, "detail": detail}


CHECKS = [check("2.11.0", how="gpu-kernel-tests"), check("2.12.1"), check("2.15.0", cuda="13.2")]


def stable_record(checks: list[dict[str, str]] | None, key: str = "stable-key") -> BuildRecord:
    data: dict[str, object] = {
        "package": CC, "version": "1.7.0", "cuda": "13.0", "cache_key": key, "archs": ["90"],
        "abi": "torch-stable", "torch_floor": "2.11", "python": {"version": "3.12", "torch": "2.15.0+cu130"},
        "tests": {"import_status": "passed", "kernel_status": "passed", "counts": {"passed": 12}, "gpu": "NVIDIA H200"},
    }
    if checks is not None:
        data["torch_checks"] = checks
    return BuildRecord.from_json(data)


def per_torch_record(label: str, torch: str) -> BuildRecord:
    return BuildRecord.from_json({"package": CC, "version": "1.7.0", "cuda": "13.0", "cache_key": label,
                                  "python": {"version": "3.12", "torch": torch},
                                  "tests": {"import_status": "passed", "kernel_status": "skipped",
                                            "kernel_reason": "no CUDA GPU visible"}})


def stable_wheel(work: Path) -> Path:
    wheel = labelled_wheel(work, CC, "1.7.0", "cu13", pins=("torch>=2.11",), tag="cp310-abi3-linux_x86_64")
    assert wheel.name == STABLE
    return wheel


def make_house(root: Path, checks: list[dict[str, str]] | None = CHECKS) -> Wheelhouse:
    """The stable wheel and two per-torch wheels of the same release (torch 2.11 and 2.14)."""
    house = Wheelhouse(root / "wh")
    work = root / "work"
    house.publish(stable_wheel(work), stable_record(checks))
    for label, torch in (("cu130torch2.11", "2.11.0+cu130"), ("cu130torch2.14", "2.14.1+cu130")):
        wheel = labelled_wheel(work, CC, "1.7.0", label, pins=(f"torch=={torch.split('+')[0]}",),
                               tag="cp312-cp312-linux_x86_64")
        house.publish(wheel, per_torch_record(label, torch))
    return house


def channel_files(house: Wheelhouse, label: str) -> list[str]:
    page = house.channels / label / "simple" / CC / "index.json"
    return sorted(f["filename"] for f in json.loads(page.read_text())["files"])


def channel_dirs(house: Wheelhouse) -> list[str]:
    return sorted(d.name for d in house.channels.iterdir() if d.is_dir()) if house.channels.is_dir() else []


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def house(tmp_path: Path) -> Wheelhouse:
    return make_house(tmp_path)


# ------------------------------------------------------------------------------------------------ channels


def test_a_stable_wheel_is_in_the_channel_of_each_verified_torch(house: Wheelhouse) -> None:
    assert channel_dirs(house) == ["cu130torch2.11", "cu130torch2.12", "cu130torch2.14", "cu132torch2.15"], \
        "one channel per verified torch and per per-torch label; none named cu13"
    assert not (house.channels / "cu13").exists()
    assert channel_files(house, "cu130torch2.11") == [STABLE, PER_TORCH], "beside the per-torch wheel of 2.11"
    assert channel_files(house, "cu130torch2.12") == [STABLE]
    assert channel_files(house, "cu132torch2.15") == [STABLE], "a CUDA 13.2 torch finds the cu13 wheel too"
    assert channel_files(house, "cu130torch2.14") == [OTHER_TORCH], "2.14 was not checked: not offered there"
    combined = json.loads((house.simple / CC / "index.json").read_text())
    assert sorted(f["filename"] for f in combined["files"]) == sorted([STABLE, PER_TORCH, OTHER_TORCH])
    assert house.labels() == ["cu130torch2.11", "cu130torch2.12", "cu130torch2.14", "cu132torch2.15"]
    assert house.channels_of(STABLE) == VERIFIED
    assert house.channels_of(PER_TORCH) == ("cu130torch2.11",), "a per-torch wheel's channel is its label, as before"
    assert [t for _, t in anchors(house.channels / "index.html")] == house.labels()
    assert [t for _, t in anchors(house.channels / "cu130torch2.12" / "simple" / "index.html")] == [CC]


@pytest.mark.parametrize(("checks", "expected"), [
    ([check("2.11.0"), check("2.12.1", status="failed", detail="aten::foo has no CUDA kernel"), check("2.15.0", "13.2")],
     ("cu130torch2.11", "cu132torch2.15")),
    # a passed and a failed release of one minor: the channel serves both releases' users, so it is left out
    ([check("2.11.0"), check("2.12.0"), check("2.12.1", how="gpu-kernel-tests", status="failed")], ("cu130torch2.11",)),
    # a check of another CUDA major, and one below the torch floor, offer nothing
    ([check("2.11.0"), check("2.12.1", cuda="12.8"), check("2.10.0")], ("cu130torch2.11",)),
    ([check("2.11.0", status="failed"), check("", cuda="")], ()),
    ([], ()),
    (None, ()),
])
def test_only_passed_checks_give_channels(checks: list[dict[str, str]] | None, expected: tuple[str, ...]) -> None:
    assert wheel_channels(STABLE, stable_record(checks)) == expected
    assert wheel_channels(STABLE, None) == (), "a stable wheel without a record is in no channel"
    assert wheel_channels(PER_TORCH, None) == wheel_channels(PER_TORCH, stable_record(checks)) == ("cu130torch2.11",)
    assert wheel_channels("helper-1.0-py3-none-any.whl", None) == ()


def test_a_failed_check_leaves_that_channel_out(tmp_path: Path) -> None:
    failed = [CHECKS[0], check("2.12.1", status="failed", detail="import failed: undefined symbol"), CHECKS[2]]
    house = make_house(tmp_path, failed)
    assert channel_dirs(house) == ["cu130torch2.11", "cu130torch2.14", "cu132torch2.15"]
    assert house.channels_of(STABLE) == ("cu130torch2.11", "cu132torch2.15")
    assert STABLE in channel_files(house, "cu132torch2.15")


def test_a_stable_wheel_with_no_passed_check_is_only_in_the_combined_index(tmp_path: Path) -> None:
    house = Wheelhouse(tmp_path / "wh")
    house.publish(stable_wheel(tmp_path / "work"), stable_record(None))
    assert [f["filename"] for f in json.loads((house.simple / CC / "index.json").read_text())["files"]] == [STABLE]
    assert channel_dirs(house) == [] and not (house.channels / "index.html").exists()
    assert house.labels() == []
    house.write_record(STABLE, stable_record(CHECKS))  # checks came later (builder test): now it is offered
    assert channel_dirs(house) == list(VERIFIED) and (house.channels / "index.html").is_file()
    house.write_record(STABLE, stable_record([check("2.11.0", how="gpu-kernel-tests", status="failed")]))
    assert channel_dirs(house) == [], "every channel of the wheel goes when its checks fail"
    assert not (house.channels / "index.html").exists(), "no channel list naming channels that are gone"
    assert [f["filename"] for f in json.loads((house.simple / CC / "index.json").read_text())["files"]] == [STABLE]


def test_channel_pages_carry_the_wheels_hashes_and_resolve(house: Wheelhouse) -> None:
    wheel, sidecar = house.wheels / STABLE, house.wheels / f"{STABLE}.metadata"
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA")))
    assert sidecar.read_bytes() == metadata and b"Requires-Dist: torch>=2.11" in metadata
    for label in (None, *VERIFIED):
        simple = house.simple if label is None else house.channels / label / "simple"
        page = simple / CC / "index.html"
        links = {name: attrs for attrs, name in anchors(page)}
        href = links[STABLE]["href"]
        assert href.endswith(f"#sha256={sha256(wheel)}")
        assert target(page, href) == wheel, f"{page}: {href}"
        assert links[STABLE]["data-core-metadata"] == links[STABLE]["data-dist-info-metadata"] == \
            f"sha256={sha256(sidecar)}"
        assert target(page, href.split("#")[0] + ".metadata") == sidecar
        entry = next(f for f in json.loads((simple / CC / "index.json").read_text())["files"]
                     if f["filename"] == STABLE)
        assert target(simple / CC / "index.json", entry["url"]) == wheel
        assert entry["hashes"] == {"sha256": sha256(wheel)} and entry["size"] == wheel.stat().st_size
        assert entry["core-metadata"] == {"sha256": sha256(sidecar)}
    record = house.record_of(STABLE)
    assert record is not None and record.wheel_sha256 == sha256(wheel)
    assert listed(house, STABLE, sha256(wheel), record)


def test_the_unchanged_check_rebuilds_a_missing_channel_page_and_old_cu13_channels_go(house: Wheelhouse) -> None:
    """``find_record`` asks ``listed`` with the record, so a verified channel that lost its page is rebuilt; a
    channel named after the stable label (what the per-label rule made) goes with the next rebuild."""
    shutil.rmtree(house.channels / "cu130torch2.12")
    assert not listed(house, STABLE, sha256(house.wheels / STABLE), house.record_of(STABLE))
    found = house.find_record("stable-key")
    assert found is not None and found[0] == house.wheels / STABLE
    assert channel_files(house, "cu130torch2.12") == [STABLE]
    stale = house.channels / "cu13" / "simple" / CC
    stale.mkdir(parents=True)
    (stale / "index.html").write_text("<a href='../../../../wheels/x.whl'>x</a>")
    house.rebuild_index()
    assert not (house.channels / "cu13").exists()
    assert channel_dirs(house) == ["cu130torch2.11", "cu130torch2.12", "cu130torch2.14", "cu132torch2.15"]


def test_a_pulled_copy_has_the_same_channels(house: Wheelhouse, tmp_path: Path) -> None:
    copy = Wheelhouse(tmp_path / "copy")
    result = pull(house.root.resolve().as_uri(), copy)
    assert result is not None and sorted(result.restore.fetched) == sorted([STABLE, PER_TORCH, OTHER_TORCH])
    assert copy.labels() == house.labels() and copy.channels_of(STABLE) == VERIFIED
    for label in house.labels():
        assert channel_files(copy, label) == channel_files(house, label)


# ------------------------------------------------------------------------------------------------ dashboard


def _row_text(page: str, wheel: str) -> str:
    row = re.search(rf'<tr class="wheel" data-wheel="{re.escape(html.escape(wheel))}".*?</tr>', page, re.S)
    assert row, wheel
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", row.group(0)))).replace(" ,", ",")


def test_the_dashboard_shows_each_torch_a_stable_wheel_was_checked_on(tmp_path: Path) -> None:
    checks = [*CHECKS, check("2.13.0", status="failed", detail="aten::causal_conv1d_fwd has no CUDA kernel")]
    house = make_house(tmp_path, checks)
    page = house.dashboard.read_text()
    stable = _row_text(page, STABLE)
    assert "≥ 2.11 stable ABI" in stable and "≥ 3.10 (abi3)" in stable, stable
    assert "torch 2.11.0 (cu13.0, py3.12): GPU kernel tests passed" in stable
    assert "torch 2.12.1 (cu13.0, py3.12): import + registration passed" in stable
    assert "torch 2.15.0 (cu13.2, py3.12): import + registration passed" in stable
    assert "torch 2.13.0 (cu13.0, py3.12): import + registration failed aten::causal_conv1d_fwd has no CUDA kernel" \
        in stable
    assert stable.index("2.11.0") < stable.index("2.12.1") < stable.index("2.13.0") < stable.index("2.15.0")
    assert "channels: cu130torch2.11, cu130torch2.12, cu132torch2.15" in stable
    per_torch = _row_text(page, PER_TORCH)
    assert "2.11.0+cu130" in per_torch and "stable ABI" not in per_torch and "checked on" not in per_torch
    assert " 3.12 " in per_torch
    for label in VERIFIED:
        assert f'href="channels/{label}/simple/"' in page
    assert 'href="channels/cu13/simple/"' not in page and 'href="channels/cu130torch2.13/simple/"' not in page
    for row in re.findall(r'<tr class="wheel".*?</tr>', page):
        for href in re.findall(r'href="([^"]+)"', row):
            assert (house.root / html.unescape(href)).is_file(), f"dashboard link {href} leads nowhere"


def test_the_dashboard_says_when_a_stable_wheel_is_in_no_channel(tmp_path: Path) -> None:
    house = Wheelhouse(tmp_path / "wh")
    house.publish(stable_wheel(tmp_path / "work"), stable_record(None))
    stable = _row_text(house.dashboard.read_text(), STABLE)
    assert "checked on no torch yet" in stable and "none (only the combined index)" in stable, stable


# ------------------------------------------------------------------------------------------------ a real client


def test_pip_installs_the_stable_wheel_from_a_verified_torchs_channel(house: Wheelhouse, tmp_path: Path) -> None:
    """pip over file:// from the channel an env with torch 2.12 uses gets the cu13 wheel; from the 2.14 channel
    (not verified) it gets the per-torch wheel, never the stable one."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}  # only the index named here
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")

    def pip(label: str, *args: str) -> subprocess.CompletedProcess:
        url = house.channel_url(label) + "/"  # through the `channels` link, as users are given it
        return subprocess.run([sys.executable, "-m", "pip", *args, "--no-deps", "--no-cache-dir", "--index-url", url,
                               f"{CC}==1.7.0"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)

    downloads = tmp_path / "downloads"
    result = pip("cu132torch2.15", "download", "--dest", str(downloads))
    assert result.returncode == 0, result.stdout + result.stderr
    assert [p.name for p in downloads.iterdir()] == [STABLE]
    assert sha256(downloads / STABLE) == sha256(house.wheels / STABLE)
    site = tmp_path / "site"
    result = pip("cu130torch2.12", "install", "--target", str(site))
    assert result.returncode == 0, result.stdout + result.stderr
    assert sorted(p.name for p in site.glob("*.dist-info")) == ["causal_conv1d-1.7.0+cu13.dist-info"]
    assert (site / "causal_conv1d" / "__init__.py").read_text() == "VERSION = '1.7.0'\n"
    other = tmp_path / "other"
    result = pip("cu130torch2.14", "download", "--dest", str(other), "--python-version", "3.12",
                 "--only-binary", ":all:")
    assert result.returncode == 0, result.stdout + result.stderr
    assert [p.name for p in other.iterdir()] == [OTHER_TORCH]
