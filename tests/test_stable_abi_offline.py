"""Issue 39 end to end: the GPU machine's build (no network, `--python` an interpreter holding its own torch,
`--abi auto`, `--offline`) on the stable-ABI tinyext fixture (tests/fixtures/recipes-stable), by the real CLI.

Before: `--abi auto` with `--python PATH` built a per-torch wheel without a word, and the torch-range step of a
stable build downloaded torch even offline, so nothing was published. Now the plan asks the interpreter for its
torch, picks the stable wheel and says why; the torch range checks the wheel beside the interpreter's own torch
through a .pth file (no download), records the range's other torch as "not checked" (not failed) and publishes.

The interpreter here is a venv holding torch 2.14.1 from the local torch index (as the GPU machine's python3 holds
its torch 2.11); the torch index the build is pointed at lists that torch and a 2.15.0 (CUDA 13.2) whose wheel is
nowhere on this machine (only its METADATA, for the index's classification). Every proxy points at a closed port,
and every uv install the builder starts must say --offline. Same local parts as tests/test_stable_abi_build.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from builder.core.uvtool import uv_bin
from tests.helpers import FIXTURES, LOCAL_TORCH_INDEX, local_cuda_path_missing, run_cli_audited

pytestmark = pytest.mark.e2e
missing = local_cuda_path_missing()
if missing:
    pytestmark = [pytest.mark.e2e, pytest.mark.skip(reason=f"skipped: {missing}")]

WHEEL = "tinyext-0.1.0+cu13-cp310-abi3-linux_x86_64.whl"
CLOSED = "http://127.0.0.1:9"  # the discard port: closed, so any download fails at once
NO_NETWORK = {var: CLOSED for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                                      "all_proxy")}
FAKE_TORCH = "torch-2.15.0-cp311-cp311-manylinux_2_28_x86_64.whl"


def gpu_machine_python(folder: Path) -> Path:
    """A venv standing in for the GPU machine's python3: torch 2.14.1 and the build requirements (set up here with
    the network allowed; the build itself then runs without it)."""
    venv = folder / "gpu-python"
    subprocess.run([uv_bin(), "venv", "-q", "--python", "3.11", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([uv_bin(), "pip", "install", "-q", "--python", str(python), "--extra-index-url",
                    LOCAL_TORCH_INDEX.as_uri(), "torch==2.14.1", "build", "setuptools>=64", "wheel", "packaging",
                    "ninja"], check=True)
    return python


def index_with_a_torch_not_here(folder: Path) -> Path:
    """A torch index listing the local 2.14.1 wheel and a 2.15.0 (CUDA 13.2) whose wheel is absent: its PEP 658
    METADATA beside where it would be is all the index's classification reads."""
    real = re.search(r'href="([^"]+)"', (LOCAL_TORCH_INDEX / "torch" / "index.html").read_text())
    assert real is not None
    here = (LOCAL_TORCH_INDEX / "torch" / "index.html").resolve().parent
    real_url = (here / real.group(1).split("#")[0]).resolve().as_uri()
    files = folder / "files"
    files.mkdir(parents=True)
    (files / f"{FAKE_TORCH}.metadata").write_text(
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.15.0\nRequires-Dist: cuda-toolkit[cudart]==13.2.2\n")
    page = folder / "index" / "torch"
    page.mkdir(parents=True)
    page.joinpath("index.html").write_text(
        f'<!DOCTYPE html><html><body>\n<a href="{real_url}">{real_url.rsplit("/", 1)[1]}</a>\n'
        f'<a href="{(files / FAKE_TORCH).as_uri()}">{FAKE_TORCH}</a>\n</body></html>\n')
    return folder / "index"


@pytest.fixture(scope="module")
def offline_build(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("offline")
    python = gpu_machine_python(base)
    index = index_with_a_torch_not_here(base)
    # this machine's CUDA has no cuobjdump (the GPU machine's has): the one triton carries beside that torch
    tools = next(python.parent.parent.glob("lib/python3.*/site-packages/triton/backends/nvidia/bin"))
    env = {"BUILDER_CACHE_DIR": str(base / "cache"), "BUILDER_WHEELHOUSE": str(base / "wheelhouse"), **NO_NETWORK,
           "NO_PROXY": "", "no_proxy": "", "PATH": f"{tools}{os.pathsep}{os.environ['PATH']}"}
    result, spawns = run_cli_audited(
        "build", "tinyext", "--recipes", str(FIXTURES / "recipes-stable"), "--cuda", "13.0", "--arch", "90",
        "--python", str(python), "--torch-index", str(index), "--toolchain", "host", "--offline",
        spawns=base / "spawns.json", env=env)
    return {"base": base, "python": python, "result": result, "spawns": spawns}


def test_auto_picks_the_stable_wheel_for_the_given_interpreter_and_says_why(offline_build: dict) -> None:
    result, python = offline_build["result"], offline_build["python"]
    assert result.code == 0, result.stderr[-4000:]
    line = next((x for x in result.stderr.splitlines() if "abi choice" in x), "")
    assert re.search(r"abi choice\s+torch-stable \(--abi auto\): tinyext 0\.1\.0 is covered by its stable-ABI port "
                     rf"\(<1,>=0\.1\), torch 2\.14\.1\S* \(in --python {re.escape(str(python))}\) is at or above its "
                     r"floor 2\.11", line), line
    record = json.loads((offline_build["base"] / "wheelhouse" / "records" / f"{WHEEL}.json").read_text())
    assert record["abi"] == "torch-stable" and record["abi_choice"].startswith("torch-stable (--abi auto): ")


def test_offline_checks_the_interpreters_torch_without_the_network_and_publishes(offline_build: dict) -> None:
    result, base = offline_build["result"], offline_build["base"]
    assert result.code == 0, result.stderr[-4000:]
    house = base / "wheelhouse"
    assert (house / "wheels" / WHEEL).is_file()
    record = json.loads((house / "records" / f"{WHEEL}.json").read_text())
    (check,) = record["torch_checks"]  # the interpreter's own torch, checked: no failed entry for 2.15.0
    assert (check["torch"], check["cuda"], check["status"]) == ("2.14.1", "13.0", "passed"), check
    assert "1 op registered with CUDA kernels (axpy)" in check["detail"]
    (skipped,) = record["torch_unchecked"]
    assert (skipped["torch"], skipped["cuda"], skipped["status"]) == ("2.15.0", "13.2", "not checked")
    assert skipped["detail"].startswith("offline: torch 2.15.0 is not on this machine without the network")
    assert f"{WHEEL}#sha256=" in (house / "channels" / "cu130torch2.14" / "simple" / "tinyext" / "index.html").read_text()
    assert not (house / "channels" / "cu132torch2.15").exists()
    assert "torch range: --offline: not checked on torch 2.15.0+cu132" in result.stderr
    assert "until `builder verify` checks the others" in result.stderr
    assert "torch 2.14.1 from the build env" in result.stderr  # borrowed, not installed


def test_no_network_was_used(offline_build: dict) -> None:
    """Every uv install the builder started was --offline (the proxies point at a closed port as well: a download
    would have failed the build), and no index was found unreadable."""
    result, spawns = offline_build["result"], offline_build["spawns"]
    assert result.code == 0, result.stderr[-4000:]
    installs = [argv for argv in spawns if Path(argv[0]).name == "uv" and argv[1:3] == ["pip", "install"]]
    assert installs and all("--offline" in argv for argv in installs), installs
    assert "not readable" not in result.stderr
