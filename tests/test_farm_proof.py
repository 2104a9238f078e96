"""The farm proven before it runs (issue 39): the root farm.toml expanded and every target planned with the real
recipes and their [[known-bad]] rules (stages/plan.make_plan; nothing compiled, nothing downloaded: the shipped
torch snapshots and PyPI's release lists cached with the recipes' own sha256)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

from builder.core.settings import Settings
from builder.farm.expand import expand
from builder.farm.proof import plan_all
from builder.farm.spec import load_farm

ROOT = Path(__file__).resolve().parents[1]
RELEASES = {"causal-conv1d": ["1.5.2", "1.6.2.post1", "1.7.0"], "mamba-ssm": ["2.3.1", "2.3.2.post1"],
            "fla-core": ["0.5.2", "0.6.0"], "flash-linear-attention": ["0.5.2", "0.6.0"],
            "flash-attn": ["2.8.3", "2.8.3.post1", "2.8.3.post2"]}


def planning_settings(tmp_path: Path) -> Settings:
    """Offline, an empty cache but for PyPI's release lists (each sdist with the sha256 its recipe records)."""
    index = tmp_path / "cache" / "index"
    index.mkdir(parents=True)
    for name, versions in RELEASES.items():
        recorded = tomllib.loads((ROOT / "recipes" / name / "recipe.toml").read_text())["source"]["sha256"]
        files = {v: [{"packagetype": "sdist", "url": f"https://files.example/{name}-{v}.tar.gz",
                      "filename": f"{name}-{v}.tar.gz", "digests": {"sha256": recorded[v]}}] for v in versions}
        (index / f"{name}.json").write_text(json.dumps({"releases": files}))
    return Settings.from_env({}, cache_dir=tmp_path / "cache", wheelhouse=tmp_path / "wheelhouse", offline=True)


def root_targets(settings: Settings) -> list:
    return expand(load_farm(ROOT / "farm.toml", settings), settings, releases=lambda name, s: RELEASES[name])


def test_every_target_of_the_root_farm_plans(tmp_path: Path) -> None:
    settings = planning_settings(tmp_path)
    targets = root_targets(settings)
    # the whole farm, not a narrowed one (26 once the per-torch abi3, previous-release stable and per-torch CUDA 12
    # wheels fold)
    assert len(targets) >= 26
    refused = plan_all(targets, settings)
    by_package: dict[str, int] = {}
    for r in refused:
        package = next(t.package for t in targets if t.id == r.target)
        by_package[package] = by_package.get(package, 0) + 1
    assert refused == [], (f"{len(refused)} of {len(targets)} targets cannot plan {by_package}:\n"
                           + "\n".join(r.line() for r in refused[:5]))


def test_a_target_the_recipe_refuses_fails_the_proof(tmp_path: Path) -> None:
    """The check can fail: causal-conv1d with sm_103 SASS from CUDA 13 is the recipe's known-bad combination."""
    settings = planning_settings(tmp_path)
    farm = tmp_path / "farm.toml"
    farm.write_text(f'[defaults]\ncuda = ["13.0"]\npython = "3.12"\nrecipes = "{ROOT / "recipes"}"\n'
                    'archs = ["90,100,103,120"]\n[[package]]\nname = "causal-conv1d"\nversions = ["1.7.0"]\n')
    targets = expand(load_farm(farm, settings), settings, releases=lambda name, s: RELEASES[name])
    (refused,) = plan_all(targets, settings)
    assert refused.target == "causal-conv1d-1.7.0-cu13-abi3-sm90_100_103_120-x86_64"
    assert "sm_103 code of causal-conv1d 1.7.0 from CUDA 13.0 is known bad" in refused.error
    assert "use --arch 100+ptx instead" in refused.error
