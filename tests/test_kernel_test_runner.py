"""The kernel-test runner: output streamed into the log, a hung suite stopped at the recipe's timeout with its
worker processes, and the stop reported as a test failure (nothing published)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from builder.stages.testing import run_streaming

CHILD_AND_GRANDCHILD = """
import subprocess, sys, time
grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
print("grandchild", grandchild.pid, flush=True)
print("case 1 passed", flush=True)
time.sleep(60)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (already dead, not yet reaped by its parent) counts as dead
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_output_is_streamed_and_exit_code_kept(tmp_path: Path) -> None:
    log_file = tmp_path / "kernel-tests.log"
    code, last = run_streaming([sys.executable, "-c", "print('a'); print('b', flush=True); raise SystemExit(3)"],
                               tmp_path, dict(os.environ), log_file, 60, "testing")
    assert code == 3 and last == "b"
    assert log_file.read_text().splitlines() == ["a", "b"]


def test_a_hung_suite_is_stopped_with_its_workers(tmp_path: Path) -> None:
    log_file = tmp_path / "kernel-tests.log"
    start = time.monotonic()
    code, last = run_streaming([sys.executable, "-c", CHILD_AND_GRANDCHILD], tmp_path, dict(os.environ),
                               log_file, 5, "testing")
    assert code is None
    assert time.monotonic() - start < 30
    text = log_file.read_text()
    assert "case 1 passed" in text and "stopped by the builder after 5 s" in text
    grandchild = int(text.split("grandchild ")[1].split()[0])
    for _ in range(50):
        if not _alive(grandchild):
            break
        time.sleep(0.1)
    assert not _alive(grandchild)


def test_status_heartbeat_outside_a_terminal(capsys) -> None:  # type: ignore[no-untyped-def]
    """In CI logs (no terminal) a long step prints its latest line at most once per heartbeat."""
    from builder.core.log import log

    with log.status("compiling", heartbeat_s=0.0) as update:
        update("[1/3] nvcc binding.cu")
    with log.status("compiling", heartbeat_s=3600.0) as update:
        update("[2/3] never shown")
    err = capsys.readouterr().err
    assert "compiling: [1/3] nvcc binding.cu" in err and "never shown" not in err


def _recipe(tmp_path: Path, test_table: str) -> Path:
    folder = tmp_path / "recipes" / "demo"
    folder.mkdir(parents=True)
    (folder / "kernel_tests.py").write_text("")
    (folder / "recipe.toml").write_text(f'name = "demo"\n[test]\nkernel-tests = "kernel_tests.py"\n{test_table}\n')
    return folder / "recipe.toml"


def test_kernel_test_env_has_the_harness_and_the_recipes_test_env(tmp_path: Path) -> None:
    """The suite gets one GPU, the shared harness on PYTHONPATH (the builder's own, as this --recipes folder has
    no _harness/), and the recipe's [test] env; nothing is hard-coded for one package any more."""
    from builder.model.recipe import load_recipe
    from builder.stages.testing import HARNESS, kernel_test_env

    recipe = load_recipe(_recipe(tmp_path, 'env = { DEMO_FLAG = "1" }'))
    env = kernel_test_env(recipe, tmp_path, 3)
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["DEMO_FLAG"] == "1"
    assert (Path(env["PYTHONPATH"]) / HARNESS).is_file()
    assert env.get("FLA_DISABLE_BACKEND_DISPATCH") == os.environ.get("FLA_DISABLE_BACKEND_DISPATCH")  # not ours
    beside = tmp_path / "recipes" / "_harness"
    beside.mkdir()
    (beside / HARNESS).write_text("")
    assert kernel_test_env(recipe, tmp_path, 0)["PYTHONPATH"] == str(beside)


def test_fla_recipes_set_the_backend_dispatch_variable_themselves() -> None:
    from builder.core.datafiles import default_recipes_dir
    from builder.model.recipe import load_recipe

    for name in ("fla-core", "flash-linear-attention"):
        recipe = load_recipe(default_recipes_dir() / name / "recipe.toml")
        assert recipe.test_env == {"FLA_DISABLE_BACKEND_DISPATCH": "1"}


def test_test_env_values_must_be_strings(tmp_path: Path) -> None:
    import pytest

    from builder.core.errors import RecipeError
    from builder.model.recipe import load_recipe

    with pytest.raises(RecipeError, match=r"field 'test.env.N' must be a string, not int"):
        load_recipe(_recipe(tmp_path, "env = { N = 1 }"))


def test_a_missing_kernel_tests_file_is_a_skip_naming_the_file(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 26 6(d): the recipe loads (plan, recipes show) before its suite is written; the test stage says the
    file is missing in one line and records a skip (never a pass; --require-kernel-tests fails on it)."""
    from builder.model.recipe import load_recipe
    from builder.model.records import TestReport
    from builder.stages.inspection import WheelReport
    from builder.stages.pyenv import PythonEnv
    from builder.stages.testing import KernelTestPlan, TestStageFailed, kernel_tests, run_tests

    path = _recipe(tmp_path, "")
    (path.parent / "kernel_tests.py").unlink()
    recipe = load_recipe(path)
    env = PythonEnv(python=tmp_path / "no-python", version="3.11.7", torch="2.14.1", torch_cuda="13.0",
                    purelib=tmp_path, managed=True)  # never run: the check comes first
    wheel = WheelReport("w.whl", "w", "1", (), (), ())
    report = kernel_tests(env, recipe, wheel, TestReport(import_status="passed"), tmp_path, quick=False)
    missing = f"the recipe's kernel-tests file {path.parent / 'kernel_tests.py'} does not exist"
    assert (report.kernel_status, report.kernel_reason) == ("skipped", missing)
    assert [line for line in capsys.readouterr().err.splitlines() if "kernel" in line] == [
        f"warning: kernel tests skipped: {missing}"]
    imported = TestReport(import_status="passed")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("builder.stages.testing.import_test", lambda env, modules: imported)
        with pytest.raises(TestStageFailed, match="kernel tests skipped .*does not exist.* --require-kernel-tests"):
            run_tests(env, recipe, wheel, tmp_path, KernelTestPlan(required=True))


HARNESS_REPORT = """
import json, sys
out = sys.argv[sys.argv.index("--out") + 1]
json.dump({"status": "passed", "gpu": "NVIDIA H200", "capability": "9.0", "counts": {"passed": 84}}, open(out, "w"))
"""


def test_the_kernel_test_record_keeps_the_gpus_compute_capability(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 39 (d): the harness's "capability" was dropped; the test record keeps it, typed (an Arch), so coverage
    can say which arch a kernel test ran on. A record without it (before, or no kernel test) stays without it."""
    import json

    from builder.model.arch import Arch
    from builder.model.recipe import load_recipe
    from builder.model.records import BuildRecord, TestReport
    from builder.stages.inspection import WheelReport
    from builder.stages.pyenv import PythonEnv
    from builder.stages.testing import VisibleGpu, kernel_tests

    path = _recipe(tmp_path, "")
    (path.parent / "kernel_tests.py").write_text(HARNESS_REPORT)  # a suite answering as the shared harness does
    env = PythonEnv(python=Path(sys.executable), version="3.11.7", torch="2.11.0", torch_cuda="13.0",
                    purelib=tmp_path, managed=True)
    monkeypatch.setattr("builder.stages.testing.visible_gpus", lambda env: [VisibleGpu(0, "NVIDIA H200", 90)])
    report = kernel_tests(env, load_recipe(path), WheelReport("w.whl", "w", "1", (), (), ()),
                          TestReport(import_status="passed"), tmp_path, quick=False)
    assert (report.kernel_status, report.gpu, report.capability) == ("passed", "NVIDIA H200", Arch(90))
    assert "kernel tests passed on NVIDIA H200 (sm_90)" in capsys.readouterr().err
    saved = json.loads(BuildRecord(tests=report).file_bytes())["tests"]
    assert saved["capability"] == "9.0"
    assert BuildRecord.from_json({"tests": saved}).tests == report  # read back typed
    assert "capability" not in TestReport(import_status="passed").to_json()
    old = {"import_status": "passed", "kernel_status": "passed", "gpu": "NVIDIA H200"}
    assert TestReport.from_json(old).capability is None and "capability" not in TestReport.from_json(old).to_json()
