"""Issue 31 item 1: the way forward that moves an env to another torch says what else that takes: a driver that
runs the new CUDA (checked against nvidia-smi's answer) and the env's packages that pin its torch."""

from __future__ import annotations

from pathlib import Path

from builder.core.settings import Settings
from builder.model.cuda import CudaVersion
from builder.user.fit import EnvFacts
from builder.user.install import alternative_caveats
from builder.user.machine import Driver, MachineFacts

ENV = EnvFacts(python="3.12.1", tags=frozenset(), torch="2.10.0", torch_cuda="12.8",
               torch_dependents=("torchvision (torch==2.10.0)", "vllm (torch==2.10.0)"))


def machine(tmp_path: Path, driver: Driver) -> MachineFacts:
    return MachineFacts(driver, (), None, Settings.from_env({}, cache_dir=tmp_path / "cache"), {})


def test_an_old_driver_is_named_with_the_branch_the_new_cuda_needs(tmp_path: Path) -> None:
    text = alternative_caveats(CudaVersion.parse("13.0"), ENV, machine(tmp_path, Driver(version="570.124", cuda="12.8")))
    assert "first update the driver: 570.124 runs CUDA <= 12.8, a CUDA 13.0 torch needs R580 or newer" in text
    assert "these pin the env's torch and must move with it: torchvision (torch==2.10.0), vllm (torch==2.10.0)" in text


def test_a_new_enough_driver_is_said_to_run_it(tmp_path: Path) -> None:
    text = alternative_caveats(CudaVersion.parse("13.0"), ENV, machine(tmp_path, Driver(version="580.65", cuda="13.0")))
    assert "the driver (580.65, CUDA <= 13.0) runs it" in text and "update" not in text


def test_no_driver_to_ask_says_it_was_not_checked(tmp_path: Path) -> None:
    no_smi = Driver(error="nvidia-smi not found (no NVIDIA driver here, or not on PATH)")
    env = EnvFacts(python="3.12.1", tags=frozenset(), torch="2.10.0", torch_cuda="12.8")
    text = alternative_caveats(CudaVersion.parse("13.2"), env, machine(tmp_path, no_smi))
    assert text == ("; it needs an NVIDIA driver that runs CUDA 13.2 (R580 or newer); nvidia-smi not found (no NVIDIA "
                    "driver here, or not on PATH), so that was not checked")
