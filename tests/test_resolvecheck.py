"""``builder coverage --resolve`` (farm/resolvecheck.py): the farm's claimed cells asked of uv's real resolver.

Unit tier: real uv, real resolution, against a local find-links folder of metadata twins (a torch 2.8.0 that pins
triton==3.4.0, a torch 2.9.0 that pins triton==3.5.0, both tritons): no network. The twins of real farm targets are
checked against what the plan says the wheel gets. Network tier: the same against PyPI, and ``builder coverage
--resolve`` for mamba-ssm.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename

from builder.farm.facts import wheel_facts
from builder.farm.resolvecheck import Resolver, Twin, twin_of
from builder.farm.resolvefarm import disagreements
from builder.model.platform import X86_64
from builder.stages.plan import make_plan
from tests.helpers import assert_one_line_error, run_cli
from tests.test_farm_proof import planning_settings, root_targets


def twin(name: str, version: str, *requires: str, tag: str = "py3-none-any", python: str = "") -> Twin:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
             *([f"Requires-Python: {python}"] if python else []), *(f"Requires-Dist: {r}" for r in requires)]
    return Twin(name, version, tag, "\n".join(lines) + "\n\n")


@pytest.fixture
def local_index(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A find-links folder with torch's and triton's metadata twins, and an env with a private uv cache."""
    links = tmp_path / "links"
    for t in (twin("torch", "2.8.0", "triton==3.4.0"), twin("torch", "2.9.0", "triton==3.5.0"),
              twin("triton", "3.4.0"), twin("triton", "3.5.0")):
        t.write(links)
    return links, {**os.environ, "UV_CACHE_DIR": str(tmp_path / "uv-cache")}


def test_uv_installs_a_compatible_twin_and_gives_its_reason_for_a_triton_conflict(
        tmp_path: Path, local_index: tuple[Path, dict[str, str]]) -> None:
    links, env = local_index
    resolver = Resolver(tmp_path / "work", None, find_links=[links], env=env, jobs=2)
    kernels = twin("demo-kernels", "1.0+cu128torch2.9", "torch==2.9.0", "triton>=3.5.0",
                   tag="cp312-cp312-manylinux_2_28_x86_64")
    floating = twin("demo-kernels", "1.0+cu12", "torch>=2.8", "triton>=3.5.0", tag="cp310-abi3-manylinux_2_28_x86_64")
    ok, pinned_away, triton, old_python = resolver.check_all([
        (kernels, "2.9.0", "3.12", X86_64),  # its own torch: installs
        (kernels, "2.8.0", "3.12", X86_64),  # pinned to 2.9.0: would change torch
        (floating, "2.8.0", "3.12", X86_64),  # admits torch 2.8.0, but 2.8.0 pins triton 3.4.0
        (twin("demo-py", "1.0", "triton>=3.4", python=">=3.10"), "2.8.0", "3.9", X86_64),
    ])
    assert ok.installs and ok.reason == ""
    assert not pinned_away.installs and "torch==2.9.0" in pinned_away.reason and "2.8.0" in pinned_away.reason
    assert not triton.installs
    assert "triton==3.4.0" in triton.reason and "triton>=3.5.0" in triton.reason, triton.reason
    assert "file://" not in triton.reason  # the twin is named by its file name, not its temp path
    assert not old_python.installs and "Python>=3.10" in old_python.reason, old_python.reason
    assert resolver.runs == 4
    # the same question again is answered from the memo: no uv run
    assert resolver.check(kernels, "2.9.0", "3.12", X86_64).installs and resolver.runs == 4 and resolver.asked == 5


def test_the_twin_of_a_farm_target_is_what_the_plan_gives_the_wheel(tmp_path: Path) -> None:
    settings = planning_settings(tmp_path)  # offline: the sdists' release lists the plan reads, no download
    targets = root_targets(settings)
    per_torch = next(t for t in targets if t.package == "mamba-ssm" and t.version == "2.3.2.post1" and not t.stable
                     and t.platform.name == "x86_64")
    stable = next(t for t in targets if t.package == "mamba-ssm" and t.version == "2.3.2.post1" and t.stable
                  and t.platform.name == "aarch64")
    facts = wheel_facts("mamba-ssm", "2.3.2.post1")
    assert facts is not None
    plan = make_plan(per_torch.to_target(jobs=1), per_torch.settings(settings))
    one = twin_of(plan, facts)
    assert one.version == f"2.3.2.post1+{plan.label(plan.torch or '')}" and "torch" in one.version
    # [per-torch-abi3] covers 2.3.2.post1: one cp310-abi3 wheel per torch serves every Python, and so must its twin
    # (a cpXY twin made uv refuse its 3.13/3.14 cells while the rules counted them installable)
    assert plan.python_agnostic is not None and one.tag == "cp310-abi3-manylinux_2_28_x86_64"
    # the plan's torch requirement (every patch of the minor: torch>=2.9.0,<2.10), not a hand-copied rule
    assert plan.torch_requirement(plan.torch or "") in one.requires and "triton>=3.5.0" in one.requires
    assert any(r.startswith("torch>=") and ",<" in r for r in one.requires), one.requires
    assert "torch" not in one.requires  # upstream's bare torch is replaced by the pin, as finalize does
    plan = make_plan(stable.to_target(jobs=1), stable.settings(settings))
    abi3 = twin_of(plan, facts)
    assert abi3.version == "2.3.2.post1+cu13" and abi3.tag.startswith("cp310-abi3-manylinux_2_28_aarch64")
    assert plan.recipe.stable_abi is not None and plan.recipe.stable_abi.requirement in abi3.requires
    assert abi3.requires_python == plan.requires_python
    wheel = abi3.write(tmp_path / "twins")
    assert parse_wheel_filename(wheel.name)[1] == parse_wheel_filename(abi3.filename)[1]


def test_disagreements_are_the_cells_rules_and_uv_judge_differently() -> None:
    from builder.farm.resolvefarm import ResolvedView
    from builder.farm.served import Cell

    a, b, c = Cell("2.8", "12.8", "3.12"), Cell("2.9", "12.8", "3.12"), Cell("2.10", "12.8", "3.12")
    view = ResolvedView("x", "1.0", claimed={a, b, c}, installs={b}, fails={a: "uv: no"},
                        unresolved={c: "not resolved: cu128 unreachable"})
    assert disagreements({a, b, c}, view) == ({a}, set())  # c was not asked: no finding
    assert disagreements(set(), view) == (set(), {b})


def test_resolve_refuses_offline_with_a_cure(tmp_path: Path) -> None:
    result = run_cli("coverage", "mamba-ssm", "--resolve", "--offline", "--cache-dir", str(tmp_path / "cache"))
    assert_one_line_error(result, "--resolve", "--offline")
    assert result.code == 2


@pytest.mark.network
def test_pypi_torch_2_8_refuses_a_triton_3_5_requirement_in_uvs_words(tmp_path: Path) -> None:
    resolver = Resolver(tmp_path / "work", "https://pypi.org/simple")
    wheel = twin("mamba-ssm", "2.3.2.post1+cu12", "torch>=2.7", "triton>=3.5.0",
                 tag="cp310-abi3-manylinux_2_28_x86_64")
    fails, installs = resolver.check_all([(wheel, "2.8.0", "3.12", X86_64), (wheel, "2.9.1", "3.12", X86_64)])
    assert not fails.installs and "==3.4.0" in fails.reason and "triton>=3.5.0" in fails.reason, fails.reason
    assert installs.installs, installs.reason


@pytest.mark.network
def test_coverage_resolve_against_pypi(tmp_path: Path) -> None:
    result = run_cli("coverage", "mamba-ssm", "--resolve", "--json", "--cache-dir", str(tmp_path / "cache"))
    assert result.code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["resolve"]["runs"] > 0 and data["resolve"]["seconds"] > 0
    (package,) = [p for p in data["packages"] if p["package"] == "mamba-ssm"]
    resolved, pypi = package["resolve"], package["farm"]["PyPI only"]
    assert resolved["claimed"] > resolved["installs"] > 0
    assert resolved["installs"] == pypi["installable"]  # uv and the rules agree on PyPI today (a finding if not)
    reasons = " ".join(resolved["not_installable"])
    assert "not resolved: " in reasons  # channel cells: never counted, said so
    text = run_cli("coverage", "mamba-ssm", "--resolve", "--cache-dir", str(tmp_path / "cache"))
    assert "uv resolutions" in text.stdout and "uv resolver (PyPI only): installs" in text.stdout
