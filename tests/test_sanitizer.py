"""`builder test --sanitize`: finding compute-sanitizer, its command line, and reading its log into the gate's
verdict. compute-sanitizer needs a GPU, so the logs here are the tool's own format as it prints it on the H100
machine (docs/GPU-RESULTS.md section 17 has the real run); the tool itself is exercised only there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from builder.core.errors import ToolchainError
from builder.stages.sanitizer import EXIT_CODE, SanitizerRun, find_sanitizer

CLEAN = """========= COMPUTE-SANITIZER
========= ERROR SUMMARY: 0 errors
"""
OOB = """========= COMPUTE-SANITIZER
========= Invalid __global__ read of size 4 bytes
=========     at void causal_conv1d_channellast_fwd_kernel<Causal_conv1d_channellast_fwd_kernel_traits<(int)128, (int)2, (int)64, (bool)1, float, float>, (bool)1>(ConvParamsBase)+0xab0 in causal_conv1d_fwd.cu:306
=========     by thread (5,0,0) in block (0,3,0)
=========     Address 0x7f3a2c000ffe is out of bounds
=========     Saved host backtrace up to driver entry point at kernel launch time
=========
========= Error: process didn't terminate successfully
========= Target application returned an error
========= ERROR SUMMARY: 68 errors
========= ERROR SUMMARY: 48 errors were not printed. Use --print-limit option to adjust the number of printed errors
"""  # the shape of the H100 run's log (docs/GPU-RESULTS.md section 17), abridged
GVISOR = """========= COMPUTE-SANITIZER
========= Error: Device not supported. Please refer to the "Supported Devices" section of the sanitizer documentation
========= Target application returned an error
========= ERROR SUMMARY: 0 errors
"""


def _run(tmp_path: Path, text: str | None, tool: str = "memcheck") -> SanitizerRun:
    log = tmp_path / "sanitizer.log"
    if text is not None:
        log.write_text(text)
    return SanitizerRun(tool, Path("/opt/cuda/bin/compute-sanitizer"), log)


def test_clean_run_passes(tmp_path: Path) -> None:
    assert _run(tmp_path, CLEAN).verdict(0) is None
    failed_suite = CLEAN.replace("========= ERROR SUMMARY", "========= Target application returned an error\n"
                                 "========= ERROR SUMMARY")
    assert _run(tmp_path, failed_suite).verdict(1) is None  # the suite's own failure is the suite's to report


def test_racecheck_summary_is_read(tmp_path: Path) -> None:
    clean = "========= COMPUTE-SANITIZER\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n"
    assert _run(tmp_path, clean, "racecheck").verdict(0) is None  # the H100 run's log, whole
    racy = clean.replace("0 hazards displayed (0 errors", "2 hazards displayed (2 errors")
    assert (_run(tmp_path, racy, "racecheck").verdict(EXIT_CODE) or "").startswith(
        "compute-sanitizer racecheck found 2 error(s)")


def test_errors_fail_with_count_and_first_error(tmp_path: Path) -> None:
    verdict = _run(tmp_path, OOB).verdict(EXIT_CODE)
    assert verdict is not None
    assert verdict == ("compute-sanitizer memcheck found 68 error(s), first: Invalid __global__ read of size 4 bytes in "
                       "causal_conv1d_channellast_fwd_kernel (causal_conv1d_fwd.cu:306)")


@pytest.mark.parametrize("text,code", [(GVISOR, 1), (None, 1), ("", EXIT_CODE), ("garbage\n", 0)])
def test_a_run_the_tool_could_not_check_never_passes(tmp_path: Path, text: str | None, code: int) -> None:
    verdict = _run(tmp_path, text).verdict(code)
    assert verdict is not None and "could not check the run on this machine" in verdict
    if text == GVISOR:
        assert "Device not supported" in verdict


def test_argv_and_env(tmp_path: Path) -> None:
    run = _run(tmp_path, None, "racecheck")
    argv = run.argv()
    assert argv[:3] == ["/opt/cuda/bin/compute-sanitizer", "--tool", "racecheck"]
    assert argv[argv.index("--error-exitcode") + 1] == str(EXIT_CODE)
    assert argv[argv.index("--log-file") + 1] == str(tmp_path / "sanitizer.log")
    assert "--target-processes" in argv  # the suites' worker processes are checked too
    assert run.env() == {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}  # each tensor its own allocation


def test_find_sanitizer_on_path_and_in_cuda_home(tmp_path: Path) -> None:
    tool = tmp_path / "cuda" / "bin" / "compute-sanitizer"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert find_sanitizer("memcheck", {"PATH": str(tool.parent)}) == tool
    assert find_sanitizer("memcheck", {"PATH": "/nonexistent", "CUDA_HOME": str(tmp_path / "cuda")}) == tool


def test_missing_tool_and_bad_tool_are_one_line_errors(tmp_path: Path) -> None:
    if Path("/usr/local/cuda/bin/compute-sanitizer").exists():  # pragma: no cover (a GPU host)
        pytest.skip("skipped: this machine has compute-sanitizer in /usr/local/cuda")
    with pytest.raises(ToolchainError, match="compute-sanitizer was not found") as caught:
        find_sanitizer("memcheck", {"PATH": str(tmp_path)})
    assert caught.value.hint and "PATH" in caught.value.hint
    with pytest.raises(ToolchainError, match="not a compute-sanitizer tool"):
        find_sanitizer("initcheck", dict(os.environ))
