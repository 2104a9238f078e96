"""Issue 31 item 1: the way forward that moves an env to another torch says what else that takes: a driver that
runs the new CUDA (checked against nvidia-smi's answer) and the env's packages that pin its torch."""

from __future__ import annotations

from pathlib import Path

from builder.core.settings import Settings
from builder.model.cuda import CudaVersion
from builder.user.choice import alternative_caveats
from builder.user.fit import EnvFacts
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


def test_dry_run_says_what_it_would_build_and_keeps_the_install_line(tmp_path: Path) -> None:
    """Issue 31 item 3: --dry-run on a machine that can build lists the builds it would run (with the arch it would
    use, or that one is needed) beside the `would run:` line, instead of an error that drops that line."""
    from builder.user.choice import Choice
    from builder.user.install import InstallOutcome, InstallRequest, planned_builds

    class Builds13:
        driver = Driver(version="580.65", cuda="13.0")

        def can_build(self, cuda: CudaVersion, platform: object = None) -> tuple[bool, str]:
            return cuda.major == 13, "host nvcc 13.0"

    env = EnvFacts(python="3.12.1", tags=frozenset(), torch="2.14.1", torch_cuda="13.0")
    settings = Settings.from_env({}, cache_dir=tmp_path / "cache")
    missing = [Choice("mamba-ssm", (), None), Choice("fla-core", (), None)]
    request = InstallRequest(packages=("mamba-ssm", "fla-core"), python=Path("/env/bin/python"), source="wh",
                             dry_run=True)
    plans = planned_builds(missing, env, "3.12", Builds13(), request, settings)  # type: ignore[arg-type]
    assert plans == ("builder build mamba-ssm --cuda 13.0 --arch \"<your GPU's arch: none here to take it from>\" "
                     "--python 3.12 --torch 2.14.1 --no-torch-range",
                     "builder build fla-core --cuda 13.0 --python 3.12 --torch 2.14.1 --no-torch-range")
    gpu_env = EnvFacts(python="3.12.1", tags=frozenset(), torch="2.11.0+cu130", torch_cuda="13.0", gpus=(90,))
    assert planned_builds(missing[:1], gpu_env, "3.12", Builds13(), request, settings)[0] == (  # type: ignore[arg-type]
        "builder build mamba-ssm --cuda 13.0 --arch 90 --python 3.12 --torch 2.11.0 --torch-index cu130 --no-torch-range")
    outcome = InstallOutcome(Path("/env/bin/python"), (), (), "uv pip install … causal-conv1d==1.7.0+cu13", "2.14.1",
                             {}, plans)
    lines = outcome.summary()
    assert lines[0].startswith("would run: uv pip install") and lines[1].startswith("would build here: builder build")
    assert lines[-1] == "torch 2.14.1 in /env/bin/python: would stay (held by torch==2.14.1 in the command)"
