"""Finalize (label, pins, record, reproducible zip), publish (index, atomicity) and test-gating helpers."""

from __future__ import annotations

import hashlib
import json
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

from builder.index.store import Wheelhouse
from builder.model.arch import parse_arch_list
from builder.model.records import BuildRecord
from builder.stages.finalize import finalize_wheel, labelled_version, read_build_record, read_metadata, rewrite_metadata
from builder.stages.inspection import SharedObject, WheelReport, verify_archs
from builder.stages.patch import describe_failure
from builder.stages.testing import VisibleGpu, kernel_skip_reason, runnable_on

METADATA = """Metadata-Version: 2.1
Name: demo
Version: 1.0
Requires-Python: >=3.9
Requires-Dist: torch
Requires-Dist: torch>=2; extra == "dev"
Requires-Dist: einops

A description.
"""


def make_wheel(path: Path, name: str = "demo", version: str = "1.0", metadata: str = METADATA) -> Path:
    wheel = path / f"{name}-{version}-cp312-cp312-linux_x86_64.whl"
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{name}/__init__.py", "X = 1\n")
        zf.writestr(f"{info}/METADATA", metadata.replace("Version: 1.0", f"Version: {version}"))
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nTag: cp312-cp312-linux_x86_64\n")
        zf.writestr(f"{info}/RECORD", "")
    return wheel


def test_labelled_version() -> None:
    assert str(labelled_version(Version("1.7.0"), "cu130torch2.11")) == "1.7.0+cu130torch2.11"
    assert str(labelled_version(Version("1.0+local"), "cu128torch2.10")) == "1.0+local.cu128torch2.10"


def test_rewrite_metadata_pins_unconditional_requirement_only() -> None:
    text = rewrite_metadata(METADATA, Version("1.0+cu130torch2.14"), ["torch==2.14.1"])
    assert "Version: 1.0+cu130torch2.14" in text
    assert "Requires-Dist: torch\n" not in text
    assert 'Requires-Dist: torch>=2; extra == "dev"' in text and "Requires-Dist: einops" in text
    assert text.rstrip().endswith("A description.") and "Requires-Dist: torch==2.14.1" in text


def test_rewrite_metadata_raises_the_python_floor_and_keeps_upstreams_other_bounds() -> None:
    def requires_python(metadata: str, floor: str) -> list[str]:
        text = rewrite_metadata(metadata, Version("1.0+cu13"), [], requires_python=floor)
        return [line for line in text.splitlines() if line.startswith("Requires-Python:")]

    assert requires_python(METADATA, ">=3.10") == ["Requires-Python: >=3.10"]  # upstream's >=3.9
    assert requires_python(METADATA.replace(">=3.9", ">=3.9,<3.15"), ">=3.10") == ["Requires-Python: <3.15,>=3.10"]
    assert requires_python(METADATA.replace(">=3.9", ">=3.12"), ">=3.10") == ["Requires-Python: >=3.12"]
    assert requires_python(METADATA.replace("Requires-Python: >=3.9\n", ""), ">=3.10") == ["Requires-Python: >=3.10"]
    assert "Requires-Python: >=3.9" in rewrite_metadata(METADATA, Version("1.0"), [])  # per-torch: as upstream's


def test_finalize_drops_build_time_requirements(tmp_path: Path) -> None:
    """A recipe's [runtime] drop removes upstream's Requires-Dist entries (also ones under a marker) from METADATA
    of the real wheel file; other requirements and the torch pin stay."""
    # upstream causal-conv1d declares these two, for its setup.py only
    upstream = METADATA.replace("Requires-Dist: einops\n", "Requires-Dist: einops\nRequires-Dist: packaging\n"
                                "Requires-Dist: Ninja; python_version >= '3'\n")
    wheel = make_wheel(tmp_path, metadata=upstream)
    out = finalize_wheel(wheel, tmp_path / "out", label="cu130torch2.14", pins=["torch==2.14.1"], build_record=BuildRecord(),
                         drop=("ninja", "packaging"))
    requires = [x for x in read_metadata(out).splitlines() if x.startswith("Requires-Dist:")]
    assert requires == ['Requires-Dist: torch>=2; extra == "dev"', "Requires-Dist: einops",
                        "Requires-Dist: torch==2.14.1"], requires
    kept = finalize_wheel(wheel, tmp_path / "kept", label="cu130torch2.14", pins=[], build_record=BuildRecord())
    assert "Requires-Dist: packaging" in read_metadata(kept)  # nothing is dropped unless the recipe says so


def test_finalize_renames_and_records(tmp_path: Path) -> None:
    out = finalize_wheel(make_wheel(tmp_path), tmp_path / "out", label="cu130torch2.14", pins=["torch==2.14.1"],
                         build_record=BuildRecord(cache_key="abc"))
    assert out.name == "demo-1.0+cu130torch2.14-cp312-cp312-linux_x86_64.whl"
    with zipfile.ZipFile(out) as zf:
        names = zf.namelist()
        record = zf.read("demo-1.0+cu130torch2.14.dist-info/RECORD").decode()
        assert all(info.date_time == (1980, 1, 1, 0, 0, 0) for info in zf.infolist())
    assert names[-1].endswith("RECORD") and "demo/__init__.py,sha256=" in record
    assert read_build_record(out) == BuildRecord(cache_key="abc")
    again = finalize_wheel(make_wheel(tmp_path), tmp_path / "again", label="cu130torch2.14",
                           pins=["torch==2.14.1"], build_record=BuildRecord(cache_key="abc"))
    assert hashlib.sha256(again.read_bytes()).hexdigest() == hashlib.sha256(out.read_bytes()).hexdigest(), \
        "finalize must be reproducible"


def test_publish_writes_index_with_hashes(tmp_path: Path) -> None:
    house = Wheelhouse(tmp_path / "wh")
    wheel = finalize_wheel(make_wheel(tmp_path), tmp_path / "out", label="cu130torch2.14", pins=["torch==2.14.1"],
                           build_record=BuildRecord())
    house.publish(wheel, BuildRecord.from_json({"cache_key": "k1"}))
    page = (tmp_path / "wh" / "simple" / "demo" / "index.html").read_text()
    assert f"../../wheels/{wheel.name}#sha256=" in page and 'data-requires-python="&gt;=3.9"' in page
    assert '<a href="demo/">demo</a>' in (tmp_path / "wh" / "simple" / "index.html").read_text()
    assert house.find_record("k1")[0].name == wheel.name and house.find_record("k2") is None
    generations = tmp_path / "wh" / ".generations"  # the page generations (docs/INDEX.md): <N>/ and current
    assert not [p for p in (tmp_path / "wh").rglob(".*") if p.name != ".publish.lock" and p != generations
                and not (p.parent == generations and (p.name == "current" or p.name.isdigit()))], "no temp files left"


def test_staging_promotion_moves_wheel(tmp_path: Path) -> None:
    house = Wheelhouse(tmp_path / "wh")
    wheel = finalize_wheel(make_wheel(tmp_path), tmp_path / "out", label="x", pins=[], build_record=BuildRecord())
    staged = house.staging().publish(wheel, BuildRecord.from_json({"cache_key": "k"}))
    assert house.staging().contains(staged) and not house.contains(staged)
    house.publish(staged, BuildRecord.from_json({"cache_key": "k", "tests": {"kernel_status": "passed"}}))
    house.staging().remove(staged.name)
    assert not staged.exists() and (house.wheels / wheel.name).exists()
    assert json.loads((house.records / f"{wheel.name}.json").read_text())["tests"]["kernel_status"] == "passed"


def so(sass: tuple[str, ...], ptx: tuple[str, ...] = ()) -> WheelReport:
    return WheelReport("w.whl", "w", "1", (), (), (SharedObject("w/_C.so", sass, ptx, ()),))


def test_verify_archs() -> None:
    assert verify_archs(so(("sm_120",)), parse_arch_list("120")) == []
    assert verify_archs(so(("sm_120",), ("compute_120",)), parse_arch_list("120+ptx")) == []
    assert "lacks sm_90" in verify_archs(so(("sm_120",)), parse_arch_list("90,120"))[0]
    assert "lacks compute_120" in verify_archs(so(("sm_120",)), parse_arch_list("120+ptx"))[0]
    assert "sm_80, which was not requested" in verify_archs(so(("sm_80", "sm_120")), parse_arch_list("120"))[0]
    assert "no GPU code" in verify_archs(so(()), parse_arch_list("120"))[0]


@pytest.mark.parametrize(
    ("capability", "sass", "ptx", "ok"),
    [
        (90, {"sm_90"}, set(), True),
        (90, {"sm_120"}, set(), False),
        (120, {"sm_90"}, set(), False),
        (86, {"sm_80"}, set(), True),
        (120, set(), {"compute_90"}, True),
        (90, set(), {"compute_120"}, False),
        (100, {"sm_90a"}, set(), False),
        (90, {"sm_90a"}, set(), True),
    ],
)
def test_runnable_on(capability: int, sass: set[str], ptx: set[str], ok: bool) -> None:
    assert runnable_on(capability, sass, ptx) is ok


def test_kernel_skip_reason_names_wheel_and_gpu() -> None:
    reason, index = kernel_skip_reason([VisibleGpu(0, "NVIDIA H200", 90)], so(("sm_120",)))
    assert index is None and reason == "wheel has sm_120; GPU 0 is sm_90 (NVIDIA H200)"
    reason, index = kernel_skip_reason([], so(("sm_120",)))
    assert "no CUDA GPU visible" in reason and "sm_120" in reason
    assert kernel_skip_reason([VisibleGpu(1, "H", 90)], so(("sm_90",))) == (None, 1)


def test_describe_patch_failure() -> None:
    output = "checking file setup.py\nHunk #2 FAILED at 120.\n1 out of 2 hunks FAILED\n"
    assert describe_failure(output) == "setup.py: hunk #2 FAILED at line 120"
    assert "does not exist" in describe_failure("can't find file to patch at input line 3\n")


def test_the_record_in_the_wheel_names_cache_paths_relative_to_the_cache() -> None:
    from builder.stages.finalize import portable_record

    record = BuildRecord.from_json({
        "python": {"python": "/c/cache/venvs/build-1/bin/python"}, "build_log": "/c/cache/logs/x.log",
        "toolchain": {"reason": "pip toolkit at /c/cache/toolkits/13.0 (cached)"},
        "source": {"kind": "path", "location": "/c/cache-other/src", "sha256": "0"}, "archs": ["/c/cache"], "n": 3})
    out = portable_record(record, Path("/c/cache"))
    assert out.python == {"python": "$BUILDER_CACHE_DIR/venvs/build-1/bin/python"}
    assert out.build_log == "$BUILDER_CACHE_DIR/logs/x.log"
    assert out.toolchain == {"reason": "pip toolkit at $BUILDER_CACHE_DIR/toolkits/13.0 (cached)"}
    assert out.source is not None and out.source.location == "/c/cache-other/src"  # another folder: kept
    assert out.archs == ("$BUILDER_CACHE_DIR",) and out.extra == {"n": 3}
    assert record.build_log == "/c/cache/logs/x.log"  # the wheelhouse's copy is not touched


def test_patch_failure_names_the_hunks_own_lines(tmp_path: Path) -> None:
    """Issue 17 case 10: GNU patch's "FAILED at N" is where it tried (with its offset), not the hunk's line; the
    error gives the hunk's line in the original file and in the patch file (a real GNU patch run)."""
    import subprocess

    from packaging.specifiers import SpecifierSet

    from builder.core.errors import PatchError
    from builder.model.recipeparts import PatchSpec
    from builder.stages.patch import apply_patches

    tree = tmp_path / "src"
    tree.mkdir()
    lines = [f"line {i}\n" for i in range(1, 61)]
    (tree / "setup.py").write_text("".join(lines))
    changed = tmp_path / "changed.py"
    changed.write_text("".join(lines).replace("line 3\n", "line three\n").replace("line 41\n", "line forty-one\n"))
    diff = subprocess.run(["diff", "-u", "--label", "a/setup.py", "--label", "b/setup.py", str(tree / "setup.py"),
                           str(changed)], capture_output=True, text=True, check=False).stdout
    patch = tmp_path / "fix.patch"
    patch.write_text("A description line.\n\n" + diff)
    (tree / "setup.py").write_text("".join(["extra\n"] * 5 + lines).replace("line 40\n", "line 40 upstream\n"))
    with pytest.raises(PatchError) as info:
        apply_patches(tree, (PatchSpec(patch, SpecifierSet(), ""),), "demo", "1.0")
    header = next(i for i, text in enumerate(patch.read_text().splitlines(), 1) if text.startswith("@@ -38"))
    assert f"setup.py: hunk #2 (line 38 of the original, line {header} of the patch) FAILED" in info.value.message, \
        info.value.message
