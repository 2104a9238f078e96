"""A real cross build: the tiny extension's stable-ABI port for aarch64 (DGX Spark's sm_121), compiled here with the
host nvcc and Debian's aarch64 g++, repaired by auditwheel to manylinux_2_28_aarch64, and import-tested under
qemu-aarch64 in Debian's arm64 Python with PyPI's aarch64 torch 2.11.0. No aarch64 GPU exists here: the kernel
tests must say so and never pass.

Needs what .ci/run installs as root: g++-aarch64-linux-gnu, qemu-user-static and dpkg's arm64 architecture (for
`apt-get download` of the target Python). PyPI gives torch 2.11.0 for both platforms (about 3 and 4 GB, through uv's
cache)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from builder.core.elf import elf_machine
from builder.model.platform import AARCH64
from builder.toolchain.cross import find_qemu
from tests.helpers import FIXTURES, local_cuda_path_missing, run_cli


def _cross_missing() -> str | None:
    for tool in ("aarch64-linux-gnu-g++", "apt-get", "dpkg"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (.ci/run installs it as root)"
    if find_qemu(AARCH64) is None:  # by what it is: qemu-aarch64, qemu-aarch64-static or binfmt_misc's interpreter
        return "no qemu-user for aarch64 (qemu-aarch64, -static or binfmt_misc) is installed (.ci/run installs it)"
    foreign = subprocess.run(["dpkg", "--print-foreign-architectures"], capture_output=True, text=True).stdout
    if "arm64" not in foreign.split():
        return "dpkg has no arm64 architecture (.ci/run adds it: dpkg --add-architecture arm64 && apt-get update)"
    return local_cuda_path_missing()


pytestmark = [pytest.mark.e2e, pytest.mark.network]
missing = _cross_missing()
if missing:
    pytestmark = [*pytestmark, pytest.mark.skip(reason=f"skipped: {missing}")]

ARGS = ["build", "tinyext", "--recipes", str(FIXTURES / "recipes-stable"), "--cuda", "13.0", "--arch", "121",
        "--platform", "aarch64", "--python", "3.11", "--torch", "2.11.0", "--toolchain", "host", "--no-torch-range"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict:
    base = tmp_path_factory.mktemp("cross")
    env = {"BUILDER_CACHE_DIR": str(base / "cache"), "BUILDER_WHEELHOUSE": str(base / "wheelhouse")}
    return {"base": base, "env": env, "result": run_cli(*ARGS, env=env)}


def _wheel(built: dict) -> Path:
    wheels = sorted((built["base"] / "wheelhouse" / "wheels").glob("*.whl"))
    assert len(wheels) == 1, [w.name for w in wheels]
    return wheels[0]


def test_the_wheel_is_a_manylinux_2_28_aarch64_abi3_wheel_with_sm121_only(built: dict) -> None:
    result = built["result"]
    assert result.code == 0, result.stderr[-3000:]
    wheel = _wheel(built)
    assert wheel.name.startswith("tinyext-0.1.0+cu13-cp310-abi3-") and wheel.name.endswith(
        "manylinux_2_28_aarch64.whl"), wheel.name
    assert "GPU code check passed: sm_121" in result.stderr
    assert "machine: AArch64" in result.stderr and "SASS: sm_121" in result.stderr
    assert "auditwheel repair --plat manylinux_2_28_aarch64" in result.stderr
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        so = zf.read("tinyext/_C.abi3.so")
        record = json.loads(zf.read("tinyext-0.1.0+cu13.dist-info/cuda_wheel_builder.json"))
    assert not [n for n in names if ".libs/" in n], names  # nothing vendored: torch and CUDA come from the env
    path = built["base"] / "_C.abi3.so"
    path.write_bytes(so)
    assert elf_machine(path) == "aarch64"
    assert b"__libc_single_threaded" not in so  # the one glibc 2.32 symbol, kept out (toolchain/cross.py)
    assert record["platform"] == "aarch64" and record["abi"] == "torch-stable"


def test_the_import_test_ran_under_qemu_and_the_kernel_tests_say_why_they_did_not(built: dict) -> None:
    result = built["result"]
    assert result.code == 0, result.stderr[-3000:]
    assert re.search(r"import test under qemu-aarch64(-static)?\b", result.stderr), result.stderr[-2000:]
    assert "import test passed: tinyext, tinyext._C (torch 2.11.0+cu130)" in result.stderr
    record = json.loads((built["base"] / "wheelhouse" / "records" / f"{_wheel(built).name}.json").read_text())
    tests = record["tests"]
    assert tests["import_status"] == "passed" and tests["kernel_status"] == "skipped"
    assert tests["kernel_reason"].startswith("no aarch64 GPU available")
    (check,) = record["torch_checks"]
    assert (check["torch"], check["status"], check["python"]) == ("2.11.0", "passed", "3.11.2")


def test_a_second_run_is_unchanged_and_an_x86_64_only_arch_list_is_refused(built: dict) -> None:
    assert built["result"].code == 0
    again = run_cli(*ARGS, env=built["env"])
    assert again.code == 0 and "unchanged:" in again.stderr, again.stderr[-2000:]
    x86 = [a if a != "aarch64" else "x86_64" for a in ARGS]
    refused = run_cli(*x86, env=built["env"])
    assert refused.code == 2 and refused.error_lines[0].startswith(
        "error: --arch 121 for --platform x86_64: no x86_64 machine carries sm_121"), refused.stderr
