"""One definition of a target's inputs (stages/inputs.py): the cache key's value, and its three users."""

from __future__ import annotations

from pathlib import Path

from packaging.version import Version

from builder.core.settings import Settings
from builder.model.arch import parse_arch_list
from builder.stages.inputs import target_inputs
from builder.stages.plan import Target, make_plan
from builder.stages.pyenv import PythonEnv
from tests.conftest import FIXTURES, LOCAL_TORCH_INDEX

# Computed on main (52c90c2) with stages.plan.cache_key before the inputs were given their own type: the same
# inputs must keep the same key, or every wheel in every wheelhouse would be rebuilt. They change only with
# builder.__version__ or the tinyext fixture's recipe/patches.
PINNED = {
    "host": "0c551d6c5ccb60458d25f8cb883426127a1c745dbc3cab78dc1d40a824082b34",
    "host+compiler": "5fe751b7def1328d078320fddd935107367661e8b942bc975fdc597f2af00ee8",
    "no toolkit": "a8184238bff0bbc31c94a3880b925c2e377ec3fbe4e56c6e8526ce602d772f35",
}


def tinyext_plan(tmp_path: Path):
    settings = Settings.from_env({}, recipes_dir=FIXTURES / "recipes", cache_dir=tmp_path / "cache")
    return make_plan(Target(package="tinyext", version="0.1.0", cuda=Version("13.0"), archs=parse_arch_list("90,120+ptx"),
                            python="3.11", torch="2.14.1", torch_index=str(LOCAL_TORCH_INDEX), toolchain="host"),
                     settings)


def build_venv(version: str, torch: str | None) -> PythonEnv:
    """A build venv's identity as the probe reports it (no interpreter is run: only version and torch count)."""
    return PythonEnv(python=Path("/venv/bin/python"), version=version, torch=torch, torch_cuda="13.0",
                     purelib=Path("/venv/lib/python3.11/site-packages"), managed=True)


def test_cache_key_values_are_the_ones_main_computed(tmp_path: Path) -> None:
    plan = tinyext_plan(tmp_path)
    toolkit = {"kind": "host", "nvcc": "13.0.88", "cuda_home": "/x"}
    args = dict(source_digest="0" * 64, toolkit=toolkit, python=build_venv("3.11.7", "2.14.1+cu130"))
    assert target_inputs(plan, **args).cache_key() == PINNED["host"]
    assert target_inputs(plan, **args, compiler={"cxx": "/usr/bin/c++: g++ 12.2.0"}).cache_key() == PINNED["host+compiler"]
    pure = target_inputs(plan, source_digest="1" * 64, toolkit=None, python=build_venv("3.11.7", "2.14.1"))
    assert pure.cache_key() == PINNED["no toolkit"]
