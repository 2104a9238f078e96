"""What this machine can build, for the original user's machine: no container engine and no nvcc at all.

This workplace has a CUDA 13.0 nvcc at /usr/local/cuda-13.0, which that machine lacks; the tests hide it by
making the host-toolkit search find nothing (the only stand-in here). The rest is real: the pip toolkit cache
lookup (an empty cache), the torch table, the one-line refusal from auto selection.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.core.errors import ToolchainError
from builder.core.settings import Settings
from builder.model.cuda import CudaVersion
from builder.toolchain import container as docker_toolchain
from builder.toolchain import host, select

NO_ENGINE = {"DOCKER_HOST": "unix:///nonexistent.sock", "PATH": "/usr/bin:/bin"}


@pytest.fixture
def bare_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "candidate_homes", lambda env: [])
    monkeypatch.setattr(select, "candidate_homes", lambda env: [])
    monkeypatch.setattr(docker_toolchain, "connect", lambda env, timeout=3: None)


def test_cuda_12_8_refusal_names_the_cuda_13_way(bare_machine: None, tmp_path: Path) -> None:
    settings = Settings.from_env({"BUILDER_CACHE_DIR": str(tmp_path)})
    with pytest.raises(ToolchainError) as e:
        select.select_toolkit("auto", CudaVersion.parse("12.8"), settings, NO_ENGINE)
    assert "no CUDA 12.8 compiler here" in e.value.message and "no nvcc found" in e.value.message
    hint = "\n".join(e.value.extra)  # the ways forward, a line each under the one error line
    newest = select._pip_cuda(settings)  # the newest CUDA PyPI has torch builds for (13.2 on 2026-12-01)
    lines = hint.splitlines()  # issue 55 item 1: what serves the target's CUDA 12.8 torch first, a torch switch last
    assert lines[0].startswith("hint: for CUDA 12.8 wheels (what a CUDA 12.8 torch loads): install Docker or podman"), hint
    assert lines[1].startswith("hint: or install a CUDA 12.8 toolkit ("), hint
    assert lines[2].startswith("hint: needs a torch switch (a CUDA 13 wheel loads beside a CUDA 13 torch only, not a "
                               f"CUDA 12.8 one): this machine can build CUDA {newest} wheels (pip toolchain): use "
                               f"--cuda {newest} with a CUDA {newest} torch (torch "), hint
    assert not (tmp_path / "toolkits" / "cuda-13.0").exists()  # refusing provisions nothing


def test_plan_row_on_a_bare_machine(bare_machine: None, tmp_path: Path) -> None:
    settings = Settings.from_env({"BUILDER_CACHE_DIR": str(tmp_path)})
    no = select.probe_build_here("auto", CudaVersion.parse("12.8"), settings, NO_ENGINE)
    assert not no.possible
    assert no.text().startswith("no: no CUDA 12.8 compiler here (no container engine answers")
    newest = select._pip_cuda(settings)
    assert "ways forward: for CUDA 12.8 wheels (what a CUDA 12.8 torch loads)" in no.text()
    assert f"needs a torch switch (a CUDA 13 wheel loads beside a CUDA 13 torch only, not a CUDA 12.8 one): this " \
           f"machine can build CUDA {newest} wheels (pip toolchain)" in no.text()
    yes = select.probe_build_here("auto", CudaVersion.parse("13.0"), settings, NO_ENGINE)
    assert yes.text() == ("yes: pip toolchain (CUDA 13.0 from PyPI, not yet provisioned: about 100 MB on the "
                          "first build)")
    offline = Settings.from_env({"BUILDER_CACHE_DIR": str(tmp_path)}, offline=True)
    stuck = select.probe_build_here("auto", CudaVersion.parse("13.0"), offline, NO_ENGINE)
    assert not stuck.possible and "--offline forbids downloading" in stuck.text()
    assert not (tmp_path / "toolkits" / "cuda-13.0").exists()
