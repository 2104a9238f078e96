"""The wheelhouse dashboard (wheelhouse/index.html), rendered by a real browser: Debian's headless Chromium.

The demo wheelhouse below carries records shaped like real ones (the H200 numbers are from docs/GPU-RESULTS.md).
``python tests/test_dashboard.py docs/dashboard.png`` regenerates the screenshot in docs/.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

if __name__ == "__main__":  # run as a script: make `tests.` and `builder` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from builder.index.store import Wheelhouse
from builder.model.records import BuildRecord
from tests.test_index import labelled_wheel

H200_SPEED = [
    {"name": "fwd_qwen3next_b1_d8192_L4096_w4_bf16_silu_channel_last", "kernel_ms": 0.11307, "reference_ms": 1.63856,
     "speedup": 14.4913, "kernel_gbps": 1187.6},
    {"name": "fwd_qwen3next_b1_d8192_L4096_w4_bf16_silu_channel_first", "kernel_ms": 0.11586, "reference_ms": 1.43539,
     "speedup": 12.3894, "kernel_gbps": 1159.1},
    {"name": "update_decode_b64_d8192_w4_bf16_silu", "kernel_ms": 0.07602, "reference_ms": 0.66877,
     "speedup": 8.7977, "kernel_gbps": 111.2},
]
# a benchmark that could not run (fla refuses the gated chunk backward on Hopper with Triton 3.6) has no numbers
FLA_SPEED = [
    {"name": "chunk_fwd_qwen3next_B1_T4096_h16v32_D128_bf16", "kernel_ms": 1.3374, "reference_ms": 755.17,
     "speedup": 564.67, "kernel_gbps": 75.9, "bytes": 101449728},
    {"name": "chunk_fwd_bwd", "kernel_ms": None, "reference_ms": None, "speedup": None, "kernel_gbps": None,
     "error": "RuntimeError: Triton >= 3.4.0 and < 3.7.1 on Hopper GPUs produces incorrect results (see #640)"},
]
CC = "causal-conv1d"
NO_GPU = "no CUDA GPU visible to torch on this machine; wheel has sm_120"


def _record(package: str, version: str, cuda: str, torch: str, archs: list[str], sass: list[str], ptx: list[str],
            tests: dict, log: Path | None) -> dict:
    return {
        "package": package, "version": version, "cuda": cuda, "archs": archs,
        "python": {"version": "3.12", "torch": torch},
        "inspect": {"objects": [{"path": "causal_conv1d_cuda.so", "sass": sass, "ptx": ptx, "needed": []}]
                    if sass or ptx else []},
        "tests": {"import_status": "passed", "kernel_status": "not run", "kernel_reason": "", "counts": {},
                  "speed": [], "gpu": None, **tests},
        "build_log": str(log) if log else "",
    }


def _fake_so(wheel: Path, size: int) -> Path:
    """Add a stand-in for the compiled extension, so the sizes look like a CUDA wheel's: a real ELF file (publishing
    reads every .so's glibc needs, stages/repair.py) padded with incompressible bytes."""
    import os

    elf = Path("/bin/true").read_bytes()
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.writestr(zipfile.ZipInfo("causal_conv1d_cuda.so"), elf + os.urandom(max(0, size - len(elf))))
    return wheel


def demo_wheelhouse(root: Path) -> Wheelhouse:
    """Published: passed on an H200, skipped (no GPU / wrong GPU), import-only; staging: failed, awaiting GPU."""
    house = Wheelhouse(root / "wh")
    work = root / "work"
    log = work / "build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("[1/3] nvcc -gencode arch=compute_90,code=sm_90 ...\nbuilt causal_conv1d-1.7.0\n")

    def wheel(name: str, version: str, label: str, tag: str, size: int = 0) -> Path:
        w = labelled_wheel(work, name, version, label, tag=tag)
        return _fake_so(w, size) if size else w

    cp312 = "cp312-cp312-linux_x86_64"
    house.publish(wheel(CC, "1.7.0", "cu130torch2.11", cp312, 900_000), BuildRecord.from_json(_record(
        CC, "1.7.0", "13.0", "2.11.0+cu130", ["90"], ["sm_90"], [],
        {"kernel_status": "passed", "counts": {"passed": 207, "failed": 0, "skipped": 0}, "speed": H200_SPEED,
         "gpu": "NVIDIA H200"}, log)))
    house.publish(wheel(CC, "1.7.0", "cu130torch2.14", cp312, 1_400_000), BuildRecord.from_json(_record(
        CC, "1.7.0", "13.0", "2.14.1+cu130", ["120"], ["sm_120"], [],
        {"kernel_status": "skipped", "kernel_reason": NO_GPU}, log)))
    house.publish(wheel(CC, "1.5.2", "cu130torch2.14", cp312, 700_000), BuildRecord.from_json(_record(
        CC, "1.5.2", "13.0", "2.14.1+cu130", ["120+ptx"], ["sm_120"], ["compute_120"],
        {"kernel_status": "skipped", "kernel_reason": "wheel has sm_120; GPU 0 is sm_90 (NVIDIA H200)"}, None)))
    house.publish(wheel("fla-core", "0.6.0", "cu130torch2.14", "py3-none-any"), BuildRecord.from_json(_record(
        "fla-core", "0.6.0", "13.0", "2.14.1+cu130", [], [], [],
        {"kernel_status": "passed", "counts": {"passed": 38, "failed": 0, "skipped": 25}, "gpu": "NVIDIA H200",
         "speed": FLA_SPEED}, None)))
    staging = house.staging()
    staging.publish(wheel(CC, "1.7.0", "cu130torch2.11", "cp311-cp311-linux_x86_64", 880_000), BuildRecord.from_json(_record(
        CC, "1.7.0", "13.0", "2.11.0+cu130", ["90"], ["sm_90"], [],
        {"kernel_status": "failed", "kernel_reason": "23 case(s) failed", "gpu": "NVIDIA H200",
         "counts": {"passed": 184, "failed": 23, "skipped": 0}}, log)))
    staging.publish(wheel(CC, "1.7.0", "cu128torch2.10", cp312, 1_300_000), BuildRecord.from_json(_record(
        CC, "1.7.0", "12.8", "2.10.0+cu128", ["100", "120"], ["sm_100", "sm_120"], [], {}, log)))
    return house


def find_chromium() -> str | None:
    return next((found for name in ("chromium", "chromium-browser") if (found := shutil.which(name))), None)


def chromium(*args: str) -> subprocess.CompletedProcess:
    binary = find_chromium()
    assert binary is not None
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        return subprocess.run(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--disable-dev-shm-usage", f"--user-data-dir={profile}", *args],
            capture_output=True, text=True, timeout=120,
        )


# A probe appended to a copy of the page: what the browser laid out and styled, written into the DOM.
_PROBE = """<script>
const out = {};
const rows = [...document.querySelectorAll('#wheels tr.wheel')];
out.rows = rows.length;
out.visible = rows.filter(r => r.getBoundingClientRect().height > 0).length;
for (const s of ['passed', 'skipped', 'failed', 'staged', 'import-only']) {
  const b = document.querySelector('#wheels .badge.' + s);
  out['color_' + s] = b ? getComputedStyle(b).backgroundColor : 'none';
}
out.matrixCells = document.querySelectorAll('#matrix .cell').length;
out.tableWidth = Math.round(document.querySelector('#wheels').getBoundingClientRect().width);
document.body.setAttribute('data-probe', JSON.stringify(out));
</script>"""


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Wheelhouse:
    return demo_wheelhouse(tmp_path_factory.mktemp("dashboard"))


def test_dashboard_is_written_with_the_index(demo: Wheelhouse) -> None:
    page = demo.dashboard.read_text()
    assert "<title>Wheelhouse: 6 wheels</title>" in page
    assert 'href="channels/cu130torch2.14/simple/"' in page and 'href="simple/"' in page
    assert (demo.root / "staging" / "index.html").is_file(), "staging has a dashboard of its own too"
    assert "chunk_fwd_bwd</td><td colspan=4 class=dim>RuntimeError: Triton &gt;= 3.4.0" in page  # error, no numbers
    assert "564.7×" in page
    for row in re.findall(r'<tr class="wheel".*?</tr>', page):
        for href in re.findall(r'href="([^"]+)"', row):
            assert (demo.root / href).is_file(), f"dashboard link {href} leads nowhere"


@pytest.mark.skipif(find_chromium() is None,
                    reason="chromium is not installed (apt-get install -y chromium; .ci/run installs it)")
def test_dashboard_in_headless_chromium(demo: Wheelhouse, tmp_path: Path) -> None:
    import html
    import json

    probe_page = demo.root / "probe.html"
    probe_page.write_text(demo.dashboard.read_text().replace("</body>", _PROBE + "</body>"))
    result = chromium("--window-size=1600,1000", "--dump-dom", probe_page.as_uri())
    probe_page.unlink()
    dom = result.stdout
    assert result.returncode == 0 and "</html>" in dom, result.stderr[-2000:]
    probe = json.loads(html.unescape(re.search(r'data-probe="([^"]*)"', dom).group(1)))
    assert probe["rows"] == probe["visible"] == 6 and probe["matrixCells"] == 6
    assert probe["color_passed"] == "rgb(26, 127, 55)" and probe["color_failed"] == "rgb(207, 34, 46)"
    assert probe["color_skipped"] == "rgb(191, 135, 0)" and probe["color_staged"] == "rgb(130, 80, 223)"
    assert probe["tableWidth"] > 800

    text = re.sub(r"<[^>]+>", " ", dom)
    text = re.sub(r"\s+", " ", html.unescape(text))
    assert "6 wheels of 2 packages: 2 passed, 2 skipped, 1 failed, 1 staged" in text, text[:400]
    table = dom.split('id="wheels"', 1)[1].split("<footer", 1)[0]
    rows = {seg.split('"', 1)[0]: seg for seg in table.split('<tr class="wheel" data-wheel="')[1:]}
    assert len(rows) == 6

    def row_text(wheel: str) -> str:
        return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", rows[wheel])))

    passed = row_text("causal_conv1d-1.7.0+cu130torch2.11-cp312-cp312-linux_x86_64.whl")
    assert "passed" in passed and "207/207 on NVIDIA H200" in passed and "sm_90" in passed
    assert "11.6× geo-mean of 3 (8.8–14.5×)" in passed and "fwd_qwen3next_b1_d8192_L4096_w4_bf16_silu" in passed
    assert re.search(r"8\d\d\.\d KiB", passed), passed
    skipped = row_text("causal_conv1d-1.7.0+cu130torch2.14-cp312-cp312-linux_x86_64.whl")
    assert f"skipped {NO_GPU}" in skipped and "3.12" in skipped and "sm_120" in skipped
    ptx = row_text("causal_conv1d-1.5.2+cu130torch2.14-cp312-cp312-linux_x86_64.whl")
    assert "sm_120, compute_120 (PTX)" in ptx and "sm_120+ptx" in ptx and "GPU 0 is sm_90 (NVIDIA H200)" in ptx
    pure = row_text("fla_core-0.6.0+cu130torch2.14-py3-none-any.whl")
    assert "no GPU code" in pure and "38/63 on NVIDIA H200 (25 skipped)" in pure and "any (py3)" in pure, pure
    assert "564.7×" in pure and "refused" not in pure.split("chunk_fwd_bwd")[0]
    failed = row_text("causal_conv1d-1.7.0+cu130torch2.11-cp311-cp311-linux_x86_64.whl")
    assert "failed" in failed and "23 of 207 failed" in failed and "3.11" in failed
    staged = row_text("causal_conv1d-1.7.0+cu128torch2.10-cp312-cp312-linux_x86_64.whl")
    assert "staged" in staged and "awaiting GPU tests" in staged and "sm_100, sm_120" in staged
    assert "12.8" in staged and "2.10.0+cu128" in staged
    log_links = re.findall(r'<a href="([^"]+\.log)">log</a>', dom)
    assert "logs/causal_conv1d-1.7.0+cu130torch2.11-cp312-cp312-linux_x86_64.whl.log" in log_links
    assert "staging/logs/causal_conv1d-1.7.0+cu128torch2.10-cp312-cp312-linux_x86_64.whl.log" in log_links
    assert len(log_links) == 4 and all((demo.root / link).read_text().startswith("[1/3] nvcc") for link in log_links)

    shot = tmp_path / "dashboard.png"
    result = chromium("--window-size=1600,1000", "--hide-scrollbars", f"--screenshot={shot}", demo.dashboard.as_uri())
    assert result.returncode == 0 and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", result.stderr[-2000:]
    assert shot.stat().st_size > 50_000, "a screenshot of a rendered page, not a blank one"


def main(out: Path) -> None:
    """Regenerate the screenshot kept in docs/ from the demo wheelhouse."""
    with tempfile.TemporaryDirectory() as tmp:
        house = demo_wheelhouse(Path(tmp))
        result = chromium("--window-size=1560,1010", "--hide-scrollbars", f"--screenshot={out.resolve()}",
                          house.dashboard.as_uri())
        if result.returncode != 0:
            sys.exit(result.stderr)
    print(f"wrote {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "docs/dashboard.png"))


def test_aarch64_wheels_beside_x86_64_ones_in_one_channel(tmp_path: Path) -> None:
    """Issue 27: a channel holds both platforms' files (as PyPI does; the installer picks by tag); the dashboard says
    which is which, in the wheels table (a platform column) and in each matrix cell."""
    import json

    house = Wheelhouse(tmp_path / "wh")
    for tag, sass, platform in (("cp312-cp312-manylinux_2_28_x86_64", ["sm_90", "sm_120"], None),
                                ("cp312-cp312-manylinux_2_28_aarch64", ["sm_90", "sm_121"], "aarch64")):
        data = _record(CC, "1.7.0", "13.0", "2.14.1+cu130", [s.removeprefix("sm_") for s in sass], sass, [],
                       {"kernel_status": "skipped", "kernel_reason": "no aarch64 GPU available"}, None)
        house.publish(labelled_wheel(tmp_path / "work", CC, "1.7.0", "cu130torch2.14", tag=tag),
                      BuildRecord.from_json({**data, **({"platform": platform} if platform else {})}))
    house.publish(labelled_wheel(tmp_path / "work", "fla-core", "0.6.0", "cu130torch2.14"), BuildRecord.from_json({}))
    arm = "causal_conv1d-1.7.0+cu130torch2.14-cp312-cp312-manylinux_2_28_aarch64.whl"
    x86 = "causal_conv1d-1.7.0+cu130torch2.14-cp312-cp312-manylinux_2_28_x86_64.whl"
    channel = json.loads((house.root / "channels" / "cu130torch2.14" / "simple" / "causal-conv1d" / "index.json")
                         .read_text())
    assert {f["filename"] for f in channel["files"]} == {arm, x86}
    page = house.dashboard.read_text()
    assert "<th>platform</th>" in page
    rows = {m.group(1): m.group(0) for m in re.finditer(r'<tr class="wheel" data-wheel="([^"]+)".*?</tr>', page, re.S)}
    assert 'data-platform="aarch64"' in rows[arm] and '<td class="platform">aarch64</td>' in rows[arm]
    assert 'data-platform="x86_64"' in rows[x86] and "sm_121" in rows[arm] and "sm_121" not in rows[x86]
    assert '<td class="platform">any</td>' in rows["fla_core-0.6.0+cu130torch2.14-py3-none-any.whl"]
    matrix = page.split('id="matrix"', 1)[1].split("</table>", 1)[0]
    cells = re.findall(r'<div class="cell"[^>]*data-platform="([^"]+)">(.*?)</div>', matrix)
    assert sorted(p for p, _ in cells) == ["aarch64", "any", "x86_64"], cells
    arm_cell = next(text for p, text in cells if p == "aarch64")
    assert re.sub(r"<[^>]+>", "", arm_cell).startswith("Python 3.12 · aarch64 · sm_90, sm_121"), arm_cell


def test_kernel_evidence_per_arch_and_unchecked_torches() -> None:
    """Issue 39 item 5: the tests cell says which arch the kernels ran on, and a torch not checked (--offline) is
    shown "not checked", not failed."""
    from builder.index.dashboard import _tests_cell
    from builder.index.dashrows import Row
    from builder.model.records import TorchCheck

    row = Row(filename="x.whl", package="x", version="1.0", label="cu130torch2.11", cuda="13.0", torch="2.11",
              python="3.12", archs_requested=["90", "120"], sass=["sm_90", "sm_120"], ptx=[], area="published",
              status="passed", import_status="passed", kernel_status="passed", kernel_reason="",
              counts={"passed": 3}, speed=[], gpu="NVIDIA H100", size=1, tested_arch="sm_90", stable=True,
              torch_unchecked=[TorchCheck(torch="2.12.0", cuda="13.0", python="3.12", how="import+registration",
                                          status="not checked")])
    cell = _tests_cell(row)
    assert "kernel evidence: sm_90" in cell and "sm_120 untested" in cell
    assert 'data-status="not checked"' in cell and "failed" not in cell


def test_kernel_evidence_names_each_gpu_arch_that_reported() -> None:
    """Issue 39: two GPU-arch test jobs of one wheel: the row names both archs, and neither is "untested"."""
    from builder.index.dashboard import _tests_cell
    from builder.index.dashrows import WheelFacts, rows_from
    from builder.model.records import TestReport, parse_capability

    record = BuildRecord(package="x", version="1.0", cuda="13.0", archs=("90", "120"))
    for gpu, capability in (("NVIDIA H100", "9.0"), ("NVIDIA RTX 5090", "12.0")):
        record = record.with_tests(TestReport(import_status="passed", kernel_status="passed", gpu=gpu,
                                              capability=parse_capability(capability)))
    (row,) = rows_from([WheelFacts("x-1.0+cu130torch2.11-cp312-cp312-linux_x86_64.whl", 1, record, False)],
                       area="published")
    assert row.tested_arch == "sm_90,sm_120"
    cell = _tests_cell(row)
    assert "kernel evidence: sm_90,sm_120" in cell and "untested" not in cell
