"""The test stage: import test in a clean venv, then the recipe's kernel tests on a GPU that can run the wheel.

A kernel test that cannot run is reported as ``skipped`` with the reason; it never counts as passed. Neither does
a case the suite declares a known upstream defect: the report counts it as ``known_defect`` and says why.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from builder.core.datafiles import default_recipes_dir
from builder.core.errors import TestFailed
from builder.core.log import log
from builder.core.streaming import stream
from builder.model.recipe import Recipe
from builder.model.records import TestReport, parse_capability
from builder.stages.inspection import WheelReport
from builder.stages.pyenv import PythonEnv
from builder.stages.sanitizer import SLOWDOWN, SanitizerRun, find_sanitizer

_GPU_PROBE = r"""
import json, torch
gpus = []
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(i)
        gpus.append({"index": i, "name": torch.cuda.get_device_name(i), "capability": major * 10 + minor})
print(json.dumps(gpus))
"""


class TestStageFailed(TestFailed):
    """A failed import or kernel test, carrying the report so far (``builder test`` records it before exiting)."""

    def __init__(self, message: str, hint: str | None, report: TestReport) -> None:
        super().__init__(message, hint)
        self.report = report


def import_test(env: PythonEnv, modules: tuple[str, ...]) -> TestReport:
    """Import torch first (extensions need its libraries loaded), then each module the recipe names."""
    code = "import importlib, sys\nimport torch\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    code += "print('imported', ', '.join(sys.argv[1:]))\n"
    argv = [str(env.python), "-c", code, *modules]
    log.command([str(env.python), "-c", f"import torch; import {', '.join(modules)}"])
    result = subprocess.run(argv, capture_output=True, text=True, cwd=tempfile.gettempdir(), env=_clean_env())
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise TestStageFailed(f"import test failed in a clean venv: {last}", "nothing was published",
                              TestReport(import_status="failed", import_detail=last, torch=env.torch,
                                         python=env.version))
    log.ok(f"import test passed: {', '.join(modules)} (torch {env.torch})")
    return TestReport(import_status="passed", import_detail=result.stdout.strip(), torch=env.torch,
                      python=env.version)


@dataclass(frozen=True, kw_only=True)
class KernelTestPlan:
    """Whether and how the test stage runs the kernel tests (``skip``: the reason they are not run here)."""

    skip: str | None = None
    quick: bool = False
    bench: bool = True
    required: bool = False  # a result other than passed fails the stage
    sanitize: str | None = None  # a compute-sanitizer tool (memcheck, racecheck) to run the --quick set under
    not_published: str = "nothing was published"  # what the --require-kernel-tests hint says happened


def run_tests(env: PythonEnv, recipe: Recipe, wheel_report: WheelReport, workdir: Path,
              kernel: KernelTestPlan) -> TestReport:
    """The test stage, for ``builder build`` and ``builder test`` alike: the import test, then the kernel tests
    (or the reason they are skipped); raises TestStageFailed with the report so far."""
    imported = import_test(env, recipe.imports)
    if kernel.skip is not None:
        report = replace(imported, kernel_status="skipped", kernel_reason=kernel.skip)
    else:
        report = kernel_tests(env, recipe, wheel_report, imported, workdir, quick=kernel.quick, bench=kernel.bench,
                              sanitize=kernel.sanitize)
    if kernel.required and report.kernel_status != "passed":
        raise TestStageFailed(
            f"kernel tests {report.kernel_status} ({report.kernel_reason}) and --require-kernel-tests is set",
            f"run on a GPU that can execute one of the wheel's archs; {kernel.not_published}", report)
    return report


@dataclass(frozen=True)
class VisibleGpu:
    """A GPU as the test venv's torch sees it (``capability``: 90 for sm_90)."""

    index: int
    name: str
    capability: int


def visible_gpus(env: PythonEnv) -> list[VisibleGpu]:
    result = subprocess.run([str(env.python), "-c", _GPU_PROBE], capture_output=True, text=True, env=_clean_env())
    if result.returncode != 0:
        return []
    return [VisibleGpu(int(g["index"]), str(g["name"]), int(g["capability"]))
            for g in json.loads(result.stdout.strip().splitlines()[-1])]


def runnable_on(capability: int, sass: set[str], ptx: set[str]) -> bool:
    """SASS sm_XY runs on the same major with minor >= Y ('a'/'f' variants only on the exact arch);
    PTX compute_XY is JIT-compiled for any capability >= XY."""
    for arch in sass:
        digits = arch.removeprefix("sm_")
        number = int(digits.rstrip("af"))
        if digits[-1] in "af":
            if number == capability:
                return True
        elif number // 10 == capability // 10 and number <= capability:
            return True
    return any(int(a.removeprefix("compute_").rstrip("af")) <= capability for a in ptx)


def kernel_skip_reason(gpus: list[VisibleGpu], report: WheelReport) -> tuple[str | None, int | None]:
    """(reason to skip, GPU index to use). The reason names the wheel's archs and the GPUs seen."""
    built = ", ".join(sorted(report.sass | report.ptx)) or "no GPU code"
    if not gpus:
        return f"no CUDA GPU visible to torch on this machine; wheel has {built}", None
    for gpu in gpus:
        if not report.objects or runnable_on(gpu.capability, report.sass, report.ptx):
            return None, gpu.index
    seen = "; ".join(f"GPU {g.index} is sm_{g.capability} ({g.name})" for g in gpus)
    return f"wheel has {built}; {seen}", None


def kernel_tests(
    env: PythonEnv, recipe: Recipe, wheel_report: WheelReport, report: TestReport, workdir: Path, *, quick: bool,
    bench: bool = True, sanitize: str | None = None,
) -> TestReport:
    """Run the recipe's kernel tests where a GPU can run the wheel: ``report`` (the import test's) with passed /
    skipped, or TestStageFailed with failed. ``sanitize``: the --quick set under that compute-sanitizer tool,
    whose findings fail the run."""
    if recipe.kernel_tests is None:
        return replace(report, kernel_status="skipped", kernel_reason="the recipe has no kernel tests")
    reason, gpu_index = _cannot_run(env, recipe.kernel_tests, wheel_report)
    if reason is not None:
        log.warning(f"kernel tests skipped: {reason}")
        return replace(report, kernel_status="skipped", kernel_reason=reason)
    out = workdir / "kernel-tests.json"
    returncode, last_line, sanitizer = _run_suite(env, recipe, report, workdir, cast(int, gpu_index), out,
                                                  quick=quick, bench=bench, sanitize=sanitize)
    data = json.loads(out.read_text()) if out.exists() else {}
    status, reason = _suite_verdict(data, returncode, last_line, sanitizer)
    report = replace(report, gpu=data.get("gpu"), capability=parse_capability(data.get("capability")),
                     counts=data.get("counts", {}),
                     speed=tuple(data.get("speed", [])), kernel_status=status, kernel_reason=reason)
    _tell_outcome(report, workdir)
    return report


def _cannot_run(env: PythonEnv, suite: Path, wheel_report: WheelReport) -> tuple[str | None, int | None]:
    """(why the suite cannot run here, or None and the GPU index to run it on). The file is checked here, not when
    the recipe loads: `builder plan` works before the suite is written."""
    if not suite.is_file():
        return f"the recipe's kernel-tests file {suite} does not exist", None
    return kernel_skip_reason(visible_gpus(env), wheel_report)


def _run_suite(env: PythonEnv, recipe: Recipe, report: TestReport, workdir: Path, gpu_index: int, out: Path, *,
               quick: bool, bench: bool, sanitize: str | None) -> tuple[int, str, SanitizerRun | None]:
    """Run the suite (under compute-sanitizer where asked) with its output in kernel-tests.log: (exit code, last
    line, the sanitizer run); TestStageFailed when it runs past its timeout."""
    argv = [str(env.python), str(recipe.kernel_tests), "--out", str(out)]
    argv += ["--quick"] if quick or sanitize else []
    argv += [] if bench and not sanitize else ["--no-bench"]
    run_env = kernel_test_env(recipe, workdir, gpu_index)
    timeout_s = recipe.kernel_tests_timeout_s
    sanitizer = None
    if sanitize:
        sanitizer = SanitizerRun(sanitize, find_sanitizer(sanitize, run_env), workdir / f"sanitizer-{sanitize}.log")
        argv, timeout_s = sanitizer.argv() + argv, timeout_s * SLOWDOWN
        run_env.update(sanitizer.env())
    log.command(argv)
    returncode, last_line = run_streaming(argv, workdir, run_env, workdir / "kernel-tests.log", timeout_s,
                                          "running kernel tests on the GPU" + (f" under {sanitize}" if sanitize else ""))
    if returncode is None:
        raise TestStageFailed(
            f"kernel tests ran past {timeout_s} s and were stopped",
            f"log: {workdir / 'kernel-tests.log'}; raise [test] kernel-tests-timeout in {recipe.file} if the "
            "suite is just slow; nothing was published",
            replace(report, kernel_status="failed", kernel_reason=f"ran past {timeout_s} s"),
        )
    return returncode, last_line, sanitizer


def _suite_verdict(data: dict[str, Any], returncode: int, last_line: str,
                   sanitizer: SanitizerRun | None) -> tuple[str, str]:
    """(status, reason) from the suite's JSON report, its exit code and the sanitizer's finding: a crash or an
    unknown status is a failure, whatever the report says."""
    status = data.get("status") or ("failed" if returncode else "passed")
    if (returncode not in (0, 3) and status != "failed") or status not in ("passed", "failed", "skipped"):
        status = "failed"
    reason = data.get("reason", "") or ("" if status == "passed" else last_line or "no output")
    found = sanitizer.verdict(returncode) if sanitizer is not None and status != "skipped" else None
    if found:  # the suite's own last line adds nothing when the tool's finding stopped it before its report
        status, reason = "failed", "; ".join(r for r in (found, data.get("reason", "")) if r)
    elif sanitizer is not None and status == "passed":
        reason = "; ".join(r for r in (f"compute-sanitizer {sanitizer.tool}: 0 errors", reason) if r)
    return status, reason


def _tell_outcome(report: TestReport, workdir: Path) -> None:
    """Log a pass or skip; raise TestStageFailed on a failure."""
    if report.kernel_status == "failed":
        raise TestStageFailed(
            f"kernel tests failed: {report.counts.get('failed', '?')} case(s) ({report.kernel_reason})",
            f"log: {workdir / 'kernel-tests.log'}; nothing was published", report,
        )
    if report.kernel_status == "passed":
        on = f"{report.gpu} ({report.capability.sm})" if report.capability else report.gpu
        log.ok(f"kernel tests passed on {on}: {dict(report.counts)}")
        if report.kernel_reason:  # passed with some cases skipped: say which and why
            log.warning(report.kernel_reason)
    else:
        log.warning(f"kernel tests skipped: {report.kernel_reason}")


HARNESS = "kernel_harness.py"


def kernel_test_env(recipe: Recipe, workdir: Path, gpu_index: int) -> dict[str, str]:
    """The suite's environment: one GPU, its own Triton cache, the harness importable, the recipe's [test] env."""
    env = _clean_env()
    env["CUDA_VISIBLE_DEVICES"] = str(gpu_index)
    env["TRITON_CACHE_DIR"] = str(workdir / "triton-cache")
    env["PYTHONPATH"] = str(harness_dir(recipe))
    env.update(recipe.test_env)  # e.g. fla's FLA_DISABLE_BACKEND_DISPATCH=1
    return env


def harness_dir(recipe: Recipe) -> Path:
    """The folder holding the shared kernel-test harness the suites import: ``_harness/`` beside the recipe's
    folder, else the builder's own recipes' (a --recipes folder without one still gets the harness)."""
    beside = recipe.directory.parent / "_harness"
    return beside if (beside / HARNESS).is_file() else default_recipes_dir() / "_harness"


def run_streaming(argv: list[str], cwd: Path, env: dict[str, str], log_file: Path, timeout_s: float,
                  what: str) -> tuple[int | None, str]:
    """Run argv with its output streamed into log_file and the latest line shown as progress.

    Returns (exit code, last output line); exit code None when it ran past timeout_s and was killed
    (with its whole process group: kernel-test scripts may start worker processes).
    """
    with log_file.open("w") as out, log.status(what) as update:
        code, last = stream(argv, out=out, on_line=update, cwd=cwd, env=env, timeout_s=timeout_s)
    if code is None:
        with log_file.open("a") as out:
            out.write(f"\n# stopped by the builder after {timeout_s:g} s\n")
    return code, last


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        env.pop(var, None)
    return env
