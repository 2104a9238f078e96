"""Issue 51: the users' matrix is made of facts read from each platform's torch wheels, never assumed.

A local index (file://, real zip wheels, PEP 658 sidecars) holds a torch release like PyPI's 2.10.0 (CUDA 12.8 on
x86_64; the aarch64 wheel's CUDA requirements are marked x86_64-only and its torch/version.py says cuda = None)
and one like 2.11.0 (CUDA 13.0 on both). The shipped snapshot is checked against what PyPI's wheels say (read when it
was written: aarch64 CUDA from 2.11.0), and ``builder coverage --explain`` is run on it offline.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from builder.core.settings import Settings
from builder.discovery.compat import TorchIndex
from builder.discovery.torchfacts import Listing, Release
from builder.discovery.torchindex import PYPI_SIMPLE, discover, load_snapshot
from builder.farm.coverage import matrix_facts
from builder.farm.served import Cell
from tests.helpers import assert_one_line_error, run_cli

X86_ONLY = '; platform_system == "Linux" and platform_machine == "x86_64"'
RELEASES = {  # version → Requires-Dist lines of every Linux wheel of it (as PyPI's are: one METADATA per platform)
    "2.10.0": [f"nvidia-cuda-runtime-cu12==12.8.90{X86_ONLY}", f"triton==3.6.0{X86_ONLY}"],
    "2.11.0": ['cuda-toolkit[cudart]==13.0.2; platform_system == "Linux"', 'triton==3.6.0; platform_system == "Linux"'],
}
VERSION_PY = {("2.10.0", "aarch64"): "None", ("2.10.0", "x86_64"): "'12.8'", ("2.11.0", "aarch64"): "'13.0'",
              ("2.11.0", "x86_64"): "'13.0'"}


def _index(root: Path) -> str:
    files = root / "files"
    files.mkdir(parents=True)
    entries = []
    for version, requires in RELEASES.items():
        for platform in ("x86_64", "aarch64"):
            for python in ("311", "312"):
                name = f"torch-{version}-cp{python}-cp{python}-manylinux_2_28_{platform}.whl"
                metadata = "Metadata-Version: 2.1\nName: torch\nVersion: " + version + "\n" + "".join(
                    f"Requires-Dist: {r}\n" for r in requires)
                with zipfile.ZipFile(files / name, "w") as z:
                    z.writestr("torch/version.py", f"cuda: Optional[str] = {VERSION_PY[version, platform]}\n")
                    z.writestr(f"torch-{version}.dist-info/METADATA", metadata)
                (files / f"{name}.metadata").write_text(metadata)
                digest = hashlib.sha256((files / name).read_bytes()).hexdigest()
                entries.append({"filename": name, "url": f"../../files/{name}", "hashes": {"sha256": digest},
                                "core-metadata": True})
    page = root / "simple" / "torch"
    page.mkdir(parents=True)
    (page / "index.json").write_text(json.dumps({"meta": {"api-version": "1.1"}, "name": "torch", "files": entries}))
    return f"file://{root / 'simple'}"


@pytest.fixture
def listing(tmp_path: Path) -> Listing:
    url = _index(tmp_path / "index")
    return discover("fixture", url, Settings.from_env({}, cache_dir=tmp_path / "cache", wheelhouse=tmp_path / "wh"))


def test_each_platforms_cuda_is_read_from_its_own_wheel(listing: Listing) -> None:
    old, new = listing.release("2.10.0"), listing.release("2.11.0")
    assert old is not None and new is not None
    x86, arm = old.on("x86_64"), old.on("aarch64")
    assert x86 is not None and arm is not None
    assert (x86.cuda, arm.cuda) == ("12.8", "cpu")  # the markers: its CUDA runtime is for x86_64 only
    assert "no CUDA requirement on aarch64; torch/version.py: cuda = None" in arm.evidence
    assert (x86.triton, arm.triton) == ("3.6.0", None)
    assert new.cuda_on("aarch64") == new.cuda_on("x86_64") == "13.0" and new.on("aarch64").triton == "3.6.0"  # type: ignore[union-attr]
    for facts in (x86, arm):  # where each fact came from: the wheel, its URL and hash, when
        assert facts.wheel.endswith(f"{facts.platform}.whl") and facts.url.endswith(facts.wheel)
        assert len(facts.sha256) == 64 and facts.read_at and facts.pythons == ("3.11", "3.12")


def test_a_cpu_build_makes_no_cell_and_an_unread_platform_is_unknown(listing: Listing) -> None:
    facts = matrix_facts([TorchIndex("fixture", "u", listing)])
    assert Cell("2.10", "12.8", "3.12", "x86_64") in facts.cells
    assert not any(c.platform == "aarch64" and c.torch == "2.10" for c in facts.cells | facts.unknown)
    assert Cell("2.11", "13.0", "3.12", "aarch64") in facts.cells and not facts.unknown
    # a listing from release notes says nothing of aarch64: its cells are unknown, never counted
    notes = Listing("pytorch-cu128", "u", (Release("2.10.0", "12.8", ("3.12",), "release notes", ""),), "snapshot", "")
    facts = matrix_facts([TorchIndex("pytorch-cu128", "u", notes)])
    assert facts.cells == {Cell("2.10", "12.8", "3.12", "x86_64")}
    assert facts.unknown == {Cell("2.10", "12.8", "3.12", "aarch64")}
    assert any("pytorch-cu128 aarch64: the CUDA of torch 2.10.0 was not read" in n for n in facts.notes)


def test_the_shipped_snapshot_reads_pypi_aarch64_cuda_from_2_11() -> None:
    """What PyPI's wheels said when the snapshot was written (`builder torch-table --write-snapshot`): the aarch64
    wheels of 2.9.0-2.10.0 are CPU builds (issue 51: 10 phantom cells per package before)."""
    pypi = load_snapshot()[PYPI_SIMPLE]
    arm = {r.version: r.on("aarch64") for r in pypi.releases if Version(r.version) >= Version("2.7")}
    assert all(f is not None and f.url.startswith("https://") and len(f.sha256) == 64 for f in arm.values())
    cuda = {v: f.cuda for v, f in arm.items() if f is not None}
    assert {v for v, c in cuda.items() if c != "cpu"} == {v for v in cuda if Version(v) >= Version("2.11")}
    assert cuda["2.10.0"] == "cpu" and cuda["2.11.0"] == "13.0" and cuda["2.15.0"] == "13.2"
    assert "torch/version.py: cuda = None" in arm["2.10.0"].evidence  # type: ignore[union-attr]
    pypi_cells = matrix_facts([TorchIndex("pypi", PYPI_SIMPLE, pypi)]).cells
    assert len(pypi_cells) == 65 and {c.platform for c in pypi_cells if c.torch == "2.10"} == {"x86_64"}


def test_coverage_explain_names_the_wheel_each_fact_was_read_from(tmp_path: Path) -> None:
    env = {"BUILDER_CACHE_DIR": str(tmp_path / "cache"), "BUILDER_OFFLINE": "1"}
    result = run_cli("coverage", "--explain", "aarch64/*/2.10/3.12", "causal-conv1d", cwd=tmp_path, env=env)
    assert result.code == 0, result.stderr
    text = " ".join(result.stdout.split())
    assert "pypi torch 2.10.0 on aarch64: CUDA cpu" in text and "torch/version.py: cuda = None" in text
    assert "torch-2.10.0-cp312-cp312-manylinux_2_28_aarch64.whl" in text and "sha256 " in text
    assert "pytorch-cu128 torch 2.10.0 on aarch64: CUDA unknown" in text
    assert "causal-conv1d" in text and "not a cell of the users' matrix" in text
    result = run_cli("coverage", "--explain", "x86_64/13.2/2.15/3.12", "causal-conv1d", cwd=tmp_path, env=env)
    text = " ".join(result.stdout.split())
    assert result.code == 0 and "pypi torch 2.15.0 on x86_64: CUDA 13.2" in text and "triton pin 3.9.0" in text
    assert "causal-conv1d 1.7.0 CUDA 13.2: missing" in text


@pytest.mark.parametrize(("spec", "said"), [("aarch64/2.10/3.12", "four parts"), ("arm/*/2.10/3.12", "platform"),
                                             ("x86_64/*/two/3.12", "torch part 'two'"),
                                             ("x86_64/*/2.10.1/3.12", "MAJOR.MINOR")])
def test_a_bad_explain_cell_is_one_clear_line(tmp_path: Path, spec: str, said: str) -> None:
    result = run_cli("coverage", "--explain", spec, cwd=tmp_path,
                     env={"BUILDER_CACHE_DIR": str(tmp_path / "cache"), "BUILDER_OFFLINE": "1"})
    assert_one_line_error(result, said)
