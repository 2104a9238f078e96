"""Issue 52 item 4: a recipe's ``[[subset]]`` (flash-attn with one head dim) is a smaller build for tests and CI: its
env reaches the build (and so the cache key), its record says so, and publish refuses its wheel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.core.errors import PublishError, RecipeError, UsageError
from builder.core.settings import Settings
from builder.index.store import Wheelhouse
from builder.model.arch import parse_arch_list
from builder.model.cuda import CudaVersion
from builder.model.recipe import load_recipe
from builder.model.records import BuildRecord
from builder.stages.plan import Target, make_plan
from tests.helpers import write_recipes
from tests.test_index import labelled_wheel

RECIPE = """
name = "subsetdemo"
kind = "cuda-extension"
versions = ">=1.0,<2"
[source]
pypi = "subsetdemo"
[source.sha256]
"1.0" = "%s"
[[subset]]
name = "hdim128"
env = { DEMO_HDIMS = "128" }
summary = "head dim 128 only: a GPU check in one short call"
""" % ("a" * 64)


def _settings(tmp_path: Path) -> Settings:
    index = tmp_path / "cache" / "index"
    index.mkdir(parents=True)
    files = {"1.0": [{"packagetype": "sdist", "url": "https://files.example/subsetdemo-1.0.tar.gz",
                      "filename": "subsetdemo-1.0.tar.gz", "digests": {"sha256": "a" * 64}}]}
    (index / "subsetdemo.json").write_text(json.dumps({"releases": files}))
    recipes = write_recipes(tmp_path, {"subsetdemo": RECIPE})
    (tmp_path / "patches").mkdir()
    return Settings.from_env({}, cache_dir=tmp_path / "cache", wheelhouse=tmp_path / "wh", recipes_dir=recipes,
                             patches_dir=tmp_path / "patches", offline=True)


def _target(subset: str | None) -> Target:
    return Target(package="subsetdemo", cuda=CudaVersion.parse("13.0"), archs=parse_arch_list("90"),
                  torch="2.14.1", subset=subset)


def test_a_subset_reaches_the_builds_env(tmp_path: Path) -> None:
    settings = _settings(tmp_path)
    recipe = load_recipe(settings.recipes_dir / "subsetdemo" / "recipe.toml", settings.patches_dir)
    (subset,) = recipe.subsets
    assert (subset.name, subset.env) == ("hdim128", {"DEMO_HDIMS": "128"})
    whole, part = make_plan(_target(None), settings), make_plan(_target("hdim128"), settings)
    assert "DEMO_HDIMS" not in whole.env and part.env["DEMO_HDIMS"] == "128"  # the env is in the cache key
    with pytest.raises(UsageError, match=r"--subset hdim64: subsetdemo's recipe has no \[\[subset\]\] of that "
                                         r"name") as info:
        make_plan(_target("hdim64"), settings)
    assert "subsets: hdim128" in info.value.one_line()


@pytest.mark.parametrize(("text", "said"), [
    ('[[subset]]\nname = "Hdim"\nenv = { A = "1" }\nsummary = "x"\n', "subset[0].name"),
    ('[[subset]]\nname = "a"\nsummary = "x"\n', "subset[0].env"),
    ('[[subset]]\nname = "a"\nenv = { A = "1" }\n', "subset[0]"),
    ('[[subset]]\nname = "a"\nenv = { A = "1" }\nsummary = "x"\n[[subset]]\nname = "a"\nenv = { B = "1" }\n'
     'summary = "y"\n', "given twice"),
])
def test_a_bad_subset_names_its_field(tmp_path: Path, text: str, said: str) -> None:
    recipes = write_recipes(tmp_path, {"bad": 'name = "bad"\nversions = ">=1"\n[source]\npypi = "bad"\n' + text})
    with pytest.raises(RecipeError, match="subset") as info:
        load_recipe(recipes / "bad" / "recipe.toml", tmp_path)
    assert said in info.value.one_line()


def test_publish_refuses_a_subset_wheel_and_changes_nothing(tmp_path: Path) -> None:
    house = Wheelhouse(tmp_path / "wh")
    wheel = labelled_wheel(tmp_path / "work", "subsetdemo", "1.0", "cu13torch2.14", tag="cp312-cp312-linux_x86_64")
    record = BuildRecord(package="subsetdemo", version="1.0", cuda="13.0", subset="hdim128")
    assert BuildRecord.from_json(record.to_json()).subset == "hdim128" and record.in_wheel().subset == "hdim128"
    with pytest.raises(PublishError, match=r"a \[\[subset\]\] build \(hdim128\) of subsetdemo, made for tests only"):
        house.publish(wheel, record)
    assert not house.root.exists() or not list(house.wheel_files())
    house.publish(wheel, record.with_(subset=None))  # the same file, built whole: published
    assert [p.name for p in house.wheel_files()] == [wheel.name]
