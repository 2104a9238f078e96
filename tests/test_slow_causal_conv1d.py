"""The full upstream build: causal-conv1d for sm_120 with the pip-provisioned CUDA 13.0 compiler (minutes).

Marked slow: run by hand with `pytest --run-slow tests/test_slow_causal_conv1d.py`; results are in docs/BUILDS.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.network]


@pytest.mark.parametrize("version", ["1.7.0", "1.5.2"])
def test_causal_conv1d_sm120_cuda13(version: str, tmp_path: Path) -> None:
    env = {"BUILDER_CACHE_DIR": str(tmp_path / "cache"), "BUILDER_WHEELHOUSE": str(tmp_path / "wh")}
    result = run_cli("build", "causal-conv1d", "--version", version, "--cuda", "13.0", "--arch", "120",
                     "--toolchain", "pip", env=env, timeout=3600)
    assert result.code == 0, result.stderr[-3000:]
    # 1.7.0 has a stable-ABI port: one cp310-abi3 wheel for CUDA 13 torches; 1.5.2 is built per torch
    name = f"causal_conv1d-{version}+cu13-cp310-abi3-*.whl" if version == "1.7.0" else (
        f"causal_conv1d-{version}+cu13torch2.*-cp312-cp312-*.whl")
    (wheel,) = (tmp_path / "wh" / "wheels").glob(name)
    report = json.loads(run_cli("inspect", str(wheel), "--json", env=env).stdout)
    assert [o["sass"] for o in report["objects"]] == [["sm_120"]]
    assert report["tests"]["import_status"] == "passed"
    assert report["tests"]["kernel_status"] == "skipped"
