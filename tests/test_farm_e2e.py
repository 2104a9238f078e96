"""`builder farm` end to end: one real tinyext compile (about a minute), then the unchanged path.

The farm holds two targets: tinyext (host nvcc 13.0, torch 2.14.1 for Python 3.11 from the local index) and
tinyscale with the docker toolchain pointed at a container engine that does not exist, so it fails at once: a
failed target must not stop the other, and the farm must exit non-zero.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.fixtures.farm_demo import write_twin
from tests.helpers import FIXTURES, LOCAL_TORCH_INDEX, local_cuda_path_missing, run_cli

if TYPE_CHECKING:
    from builder.core.settings import Settings
    from builder.farm.spec import FarmTarget

pytestmark = pytest.mark.e2e

TINYEXT = "tinyext-0.1.0-cu130-sm90-x86_64-py3.11-torch2.14.1"
TINYSCALE = "tinyscale-0.1.0-cu130-sm90-x86_64-py3.11-torch2.14.1"
WHEEL = "tinyext-0.1.0+cu13torch2.14-cp311-cp311-linux_x86_64.whl"

FARM = f"""
[defaults]
recipes = "{FIXTURES / 'recipes'}"
toolchain = "host"
cuda = "13.0"
archs = "90"
python = "3.11"
torch = "2.14.1"
torch-index = "{LOCAL_TORCH_INDEX}"

[[package]]
name = "tinyext"
versions = ["0.1.0"]

[[package]]
name = "tinyscale"
recipes = "farm/recipes"   # tinyscale, written beside this file by write_twin
versions = ["0.1.0"]
toolchain = "docker"
"""


missing = local_cuda_path_missing()
if missing:
    pytestmark = [pytest.mark.e2e, pytest.mark.skip(reason=f"skipped: {missing}")]


def _summary(log_dir: Path) -> dict:
    data = json.loads((log_dir / "summary.json").read_text())
    data["by_id"] = {t["id"]: t for t in data["targets"]}
    return data


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The first farm run (one real compile) and the second (nothing to compile), with their times."""
    base = tmp_path_factory.mktemp("farm")
    (base / "farm.toml").write_text(FARM)
    write_twin(base)  # tinyscale's recipe and source under base/farm, where FARM's relative path finds them
    # the docker target must fail the same way everywhere: point it at an engine that cannot answer
    env = {"BUILDER_CACHE_DIR": str(base / "cache"), "BUILDER_WHEELHOUSE": str(base / "wheelhouse"),
           "DOCKER_HOST": f"unix://{base / 'no-engine.sock'}"}
    runs = {}
    for name in ("first", "second"):
        start = time.monotonic()
        result = run_cli("farm", "--file", str(base / "farm.toml"), "--parallel", "2", "--log-dir",
                         str(base / name), env=env)
        runs[name] = {"result": result, "seconds": time.monotonic() - start, "logs": base / name}
    return {"base": base, "env": env, **runs}


def test_first_run_builds_and_a_failed_target_does_not_stop_the_other(farm: dict) -> None:
    result = farm["first"]["result"]
    assert result.code == 1, result.stderr[-3000:]  # one target failed
    summary = _summary(farm["first"]["logs"])
    assert summary["counts"] == {"built": 1, "unchanged": 0, "failed": 1}
    built, failed = summary["by_id"][TINYEXT], summary["by_id"][TINYSCALE]
    assert built["status"] == "built" and built["wheel"].endswith(WHEEL) and built["timings"]["build"] > 0
    assert failed["status"] == "failed" and "--toolchain docker: no container engine answers" in failed["error"]
    assert (farm["base"] / "wheelhouse" / "wheels" / WHEEL).is_file()
    # one log per target, with the pipeline's stages in the built one and the one-line error in the failed one
    log = (farm["first"]["logs"] / f"{TINYEXT}.log").read_text()
    assert "tinyext-0.1.0: ==> build" in log and "import test passed" in log
    assert "error: --toolchain docker" in (farm["first"]["logs"] / f"{TINYSCALE}.log").read_text()
    # the summary table on stdout
    assert "farm summary" in result.stdout and "1 built, 0 unchanged, 1 failed" in result.stdout
    # neither was built before: both assumed long (farm/schedule.py), so the file's order stands
    assert (f"start order, longest first: {TINYEXT} ~10m00s (no past build), {TINYSCALE} ~10m00s (no past build)"
            in result.stdout + result.stderr)


def test_the_next_run_starts_the_longest_target_first_by_its_real_record(farm: dict) -> None:
    """tinyext's record from the first run gives it its real length (about a minute), so a never-built target
    (assumed 10 minutes) goes before it, though the file lists it last."""
    from builder.core.settings import Settings
    from builder.farm.expand import expand
    from builder.farm.schedule import longest_first, past_builds
    from builder.farm.spec import load_farm

    text = farm["base"].joinpath("farm.toml").read_text() + '\n[[package]]\nname = "tinyscale"\n' \
        'recipes = "farm/recipes"\nversions = ["0.2.0"]\n'
    path = farm["base"] / "farm-order.toml"
    path.write_text(text)
    settings = Settings.from_env({"BUILDER_CACHE_DIR": str(farm["base"] / "cache")})
    targets = expand(load_farm(path), settings, releases=lambda name, s: [])
    house = farm["base"] / "wheelhouse"
    order = longest_first([t for t in targets if t.toolchain == "host"], past_builds([house]))
    built = json.loads(next((house / "records").glob("tinyext-*.whl.json")).read_text())
    assert [(e.target.package, e.basis) for e in order] == [("tinyscale", "no past build"), ("tinyext", "past build")]
    assert order[1].seconds == pytest.approx(sum(built["timings"].values()))


def test_second_run_skips_the_unchanged_target_fast(farm: dict) -> None:
    result = farm["second"]["result"]
    assert result.code == 1, result.stderr[-3000:]
    summary = _summary(farm["second"]["logs"])
    assert summary["counts"] == {"built": 0, "unchanged": 1, "failed": 1}
    unchanged = summary["by_id"][TINYEXT]
    assert unchanged["status"] == "unchanged" and unchanged["wheel"].endswith(WHEEL)
    log = (farm["second"]["logs"] / f"{TINYEXT}.log").read_text()
    assert log.startswith("unchanged:") and "==> build" not in log
    # decided from the cache key without starting a build: seconds, against a minute of compiling
    assert summary["check_seconds"] < 30, summary["check_seconds"]
    assert farm["second"]["seconds"] < farm["first"]["seconds"] / 2
    assert "0 built, 1 unchanged, 1 failed" in result.stdout


def test_only_the_good_package_exits_zero(farm: dict) -> None:
    result = run_cli("farm", "--file", str(farm["base"] / "farm.toml"), "--only", "tinyext", "--log-dir",
                     str(farm["base"] / "only"), env=farm["env"])
    assert result.code == 0, result.stderr[-2000:]
    assert _summary(farm["base"] / "only")["counts"] == {"built": 0, "unchanged": 1, "failed": 0}


def test_pipeline_unchanged_decision_in_a_worker_is_reported_as_unchanged(
    farm: dict, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without the farm's up-front check the worker's run_build decides: still "unchanged", still no compile."""
    import builder.farm.unchanged
    from builder.cli.main import main

    monkeypatch.setattr(builder.farm.unchanged, "find_unchanged", lambda *a, **k: {})
    for key, value in farm["env"].items():
        monkeypatch.setenv(key, value)
    log_dir = farm["base"] / "worker"
    code = main(["farm", "--file", str(farm["base"] / "farm.toml"), "--only", "tinyext", "--log-dir", str(log_dir)])
    assert code == 0, capsys.readouterr().err[-2000:]
    assert _summary(log_dir)["counts"] == {"built": 0, "unchanged": 1, "failed": 0}
    log = (log_dir / f"{TINYEXT}.log").read_text()
    assert "unchanged:" in log and "==> build" not in log


def test_matrix_changed_and_watch_read_the_real_record(farm: dict) -> None:
    """The light comparison of `matrix --changed` (no toolkit, no build venv) agrees with the real build record."""
    changed = run_cli("matrix", "--file", str(farm["base"] / "farm.toml"), "--changed", "--format", "github",
                      env=farm["env"])
    assert changed.code == 0, changed.stderr
    assert [e["id"] for e in json.loads(changed.stdout)["include"]] == [TINYSCALE]
    watched = run_cli("watch", "--file", str(farm["base"] / "farm.toml"), "--format", "json", env=farm["env"])
    rows = {r["package"]: r for r in json.loads(watched.stdout)}
    assert rows["tinyext"]["built"] == ["0.1.0"] and rows["tinyscale"]["built"] == []


def _tinyext_in_farm_env(farm: dict, monkeypatch: pytest.MonkeyPatch) -> tuple[Settings, list[FarmTarget]]:
    """The first run's environment (no compiler variables: the cache key names them) and tinyext's target."""
    from builder.core.settings import Settings
    from builder.farm.expand import expand
    from builder.farm.spec import load_farm

    for var, value in farm["env"].items():
        monkeypatch.setenv(var, value)
    for var in ("CXX", "CC", "NVCC_CCBIN", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS"):
        monkeypatch.delenv(var, raising=False)
    settings = Settings.from_env(os.environ)
    return settings, [t for t in expand(load_farm(farm["base"] / "farm.toml"), settings) if t.id == TINYEXT]


def test_another_host_compiler_is_not_unchanged(farm: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache key names the host C++ compiler: with $CXX pointing at another compiler (a wrapper that reports
    another version) the built target is no longer "unchanged"; with CFLAGS added neither; as before, it is."""
    from builder.farm.unchanged import find_unchanged

    settings, targets = _tinyext_in_farm_env(farm, monkeypatch)
    assert TINYEXT in find_unchanged(targets, settings)
    wrapper = tmp_path / "other-c++"
    wrapper.write_text('#!/bin/sh\nif [ "$1" = --version ]; then echo "other-c++ 99.1"; exit 0; fi\nexec c++ "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    assert find_unchanged(targets, settings) == {}
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("CFLAGS", "-O1")
    assert find_unchanged(targets, settings) == {}
    monkeypatch.delenv("CFLAGS")
    assert TINYEXT in find_unchanged(targets, settings)
    record = json.loads(next((farm["base"] / "wheelhouse" / "records").glob("tinyext-*.json")).read_text())
    assert record["host_compiler"]["cxx"].startswith("/") and "--version" not in record["host_compiler"]["cxx"]


def test_a_new_input_is_seen_by_the_build_the_farm_check_and_matrix_changed(
    farm: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stages/inputs.py is the one definition of a target's inputs: one more field in TargetInputs (a stand-in
    for a future input) and the build, the farm's up-front check and `matrix --changed` all stop calling the
    built target unchanged. The build is stopped where it would start compiling (a stand-in for _build_in)."""
    import builder.pipeline.run
    from builder.farm.unchanged import changed_targets, find_unchanged
    from builder.pipeline.run import BuildOptions, run_build
    from tests.test_inputs import add_new_input

    settings, targets = _tinyext_in_farm_env(farm, monkeypatch)

    def build() -> str:
        return run_build(targets[0].to_target(1), targets[0].settings(settings), BuildOptions(kernel_tests=False)).status

    assert build() == "unchanged"
    assert TINYEXT in find_unchanged(targets, settings) and changed_targets(targets, settings) == []

    class WouldBuild(Exception):
        pass

    def would_build(*args: object, **kwargs: object) -> None:
        raise WouldBuild

    add_new_input(monkeypatch, "one")
    monkeypatch.setattr(builder.pipeline.run, "_build_in", would_build)
    with pytest.raises(WouldBuild):
        build()
    assert find_unchanged(targets, settings) == {}
    assert changed_targets(targets, settings) == targets
