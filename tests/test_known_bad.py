"""[[known-bad]] in recipes: strict validation (file + dotted field) and the matching the plan refuses with."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.core.errors import RecipeError, UsageError
from builder.model.arch import check_known_bad, parse_arch_list
from builder.model.cuda import CudaVersion
from builder.model.recipe import load_recipe
from tests.helpers import DEMO_RECIPE, ROOT, write_recipes

ENTRY = """
[[known-bad]]
archs = ["103"]
cuda = ">=13"
reason = "sm_103 cubins from nvcc 13.x give wrong results"
instead = "100+ptx"
"""


def write(tmp_path: Path, text: str) -> Path:
    return write_recipes(tmp_path, {"demo": text}) / "demo" / "recipe.toml"


def test_entry_loads_and_matches(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path, DEMO_RECIPE + ENTRY + 'versions = "<1.5"\n'))
    (entry,) = recipe.known_bad
    assert entry.archs == ("103",) and entry.instead == "100+ptx"
    bad = parse_arch_list("90,103")
    with pytest.raises(UsageError) as info:
        check_known_bad("demo", recipe.known_bad, bad, CudaVersion.parse("13.2"), "1.4")
    assert info.value.message.startswith("--arch 103: sm_103 code of demo 1.4 from CUDA 13.2 is known bad: sm_103")
    assert info.value.hint == "use --arch 100+ptx instead" and info.value.exit_code == 2
    check_known_bad("demo", recipe.known_bad, bad, CudaVersion.parse("12.9"), "1.4")  # outside cuda
    check_known_bad("demo", recipe.known_bad, bad, CudaVersion.parse("13.2"), "1.6")  # outside versions
    check_known_bad("demo", recipe.known_bad, parse_arch_list("100+ptx,120,121"), CudaVersion.parse("13.2"), "1.4")
    with pytest.raises(UsageError):  # 103a is sm_103 SASS too
        check_known_bad("demo", recipe.known_bad, parse_arch_list("103a"), CudaVersion.parse("13.0"), "1.4")


@pytest.mark.parametrize(
    ("mutation", "needle"),
    [
        (lambda t: t.replace('archs = ["103"]', "archs = []"), "field 'known-bad[0].archs' is required"),
        (lambda t: t.replace('archs = ["103"]', 'archs = ["10x"]'), "field 'known-bad[0].archs[0]' is not one SASS arch"),
        (lambda t: t.replace('archs = ["103"]', 'archs = ["103+ptx"]'), "field 'known-bad[0].archs[0]'"),
        (lambda t: t.replace('archs = ["103"]', 'archs = "103"'), "field 'known-bad[0].archs' must be a list"),
        (lambda t: t.replace('cuda = ">=13"', 'cuda = "13.x"'), "field 'known-bad[0].cuda' is not a version range"),
        (lambda t: t.replace('cuda = ">=13"\n', ""), "field 'known-bad[0].cuda' is required"),
        (lambda t: t.replace('reason = "sm_103 cubins from nvcc 13.x give wrong results"', 'reason = " "'),
         "field 'known-bad[0].reason' is empty"),
        (lambda t: t.replace('instead = "100+ptx"', 'instead = "hundred"'), "field 'known-bad[0].instead'"),
        (lambda t: t.replace("instead =", "insted ="), "unknown field 'known-bad[0].insted'"),
    ],
)
def test_bad_entries_name_file_and_field(tmp_path: Path, mutation, needle: str) -> None:  # type: ignore[no-untyped-def]
    path = write(tmp_path, mutation(DEMO_RECIPE + ENTRY))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert str(path) in info.value.message and needle in info.value.message


def test_causal_conv1d_carries_the_sm_103_entry() -> None:
    recipe = load_recipe(ROOT / "recipes" / "causal-conv1d" / "recipe.toml")
    (entry,) = recipe.known_bad
    assert entry.archs == ("103",) and entry.cuda.contains("13.0") and not entry.cuda.contains("12.9")
    assert entry.instead == "100+ptx" and "wrong results" in entry.reason
