"""Facts about this machine that no Python environment holds: GPUs and driver (nvidia-smi), CUDA compilers, a
container engine, and from them which CUDA versions this machine can compile wheels for. Nothing is installed."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from builder.core.errors import ToolchainError
from builder.core.settings import Settings
from builder.model.cuda import CudaVersion
from builder.model.platform import Platform, this_machine
from builder.toolchain.base import nvcc_version
from builder.toolchain.cross import find_tools
from builder.toolchain.host import candidate_homes
from builder.toolchain.select import container_engine_answers, probe_build_here
from builder.user.envprobe import GpuDevice


@dataclass(frozen=True)
class Driver:
    """What nvidia-smi says; ``error`` when it is missing or fails (then nothing else is known)."""

    gpus: tuple[GpuDevice, ...] = ()
    version: str | None = None
    cuda: str | None = None  # the newest CUDA the driver runs
    error: str | None = None


@dataclass(frozen=True)
class Compiler:
    home: Path
    version: str  # 13.0.88


@dataclass(frozen=True)
class MachineFacts:
    driver: Driver
    compilers: tuple[Compiler, ...]
    engine: str | None  # a Docker-API engine's address, when one answers
    settings: Settings = field(repr=False, compare=False)
    env: Mapping[str, str] = field(repr=False, compare=False)
    _answers: dict[str, tuple[bool, str]] = field(default_factory=dict, repr=False, compare=False)

    def can_build(self, cuda: CudaVersion, platform: Platform | None = None) -> tuple[bool, str]:
        """Whether this machine can compile for CUDA ``cuda`` (12.8) and ``platform`` (default: its own), and how
        or why not, in one phrase: the answer ``builder plan`` gives (toolchain.select.probe_build_here), asked once
        per CUDA; for another platform, a cross build's (``cross_toolchain``)."""
        if platform is not None and platform != this_machine():
            return self._can_cross_build(cuda, platform)
        return self._probe(None, cuda)

    def cross_toolchain(self, cuda: CudaVersion) -> str | None:
        """The ``--toolchain`` a cross build for ``cuda`` runs on here: this machine's own toolkit, host before pip
        (pipeline/run.py refuses the container toolchain for one); None where neither has CUDA ``cuda``."""
        return next((t for t in ("host", "pip") if self._probe(t, cuda)[0]), None)

    def _probe(self, toolchain: str | None, cuda: CudaVersion) -> tuple[bool, str]:
        """``probe_build_here`` for ``--toolchain toolchain`` (None: auto), remembered."""
        key = str(cuda) if toolchain is None else f"{cuda} --toolchain {toolchain}"  # the doctor's JSON names them
        if key not in self._answers:
            answer = probe_build_here(toolchain or "auto", cuda, self.settings, self.env)
            self._answers[key] = (answer.possible, answer.how)
        return self._answers[key]

    def _can_cross_build(self, cuda: CudaVersion, platform: Platform) -> tuple[bool, str]:
        """A cross build (toolchain/cross.py): this machine's own CUDA ``cuda`` toolkit (host or pip), and the
        platform's cross gcc/g++ and qemu-user; the target's torch, CUDA libraries and Python come from PyPI and
        Debian at build time."""
        key = f"{cuda} {platform}"
        if key not in self._answers:
            toolchain = self.cross_toolchain(cuda)
            if toolchain is None:
                self._answers[key] = (False, self._probe("host", cuda)[1] + " (a cross build runs on this machine's "
                                      "own toolkit: --toolchain host or pip)")
            else:
                try:
                    tools = find_tools(platform, self.env)
                    how = self._probe(toolchain, cuda)[1]
                    self._answers[key] = (True, f"{how}, cross-compiled for {platform} with {tools.cxx.name}")
                except ToolchainError as e:
                    self._answers[key] = (False, f"{e.message.removeprefix(f'--platform {platform}: ')} ({e.hint})")
        return self._answers[key]

    def answered(self) -> dict[str, tuple[bool, str]]:
        """The ``can_build`` answers given so far, by CUDA as asked (the doctor's "builds" table)."""
        return dict(self._answers)


def query_driver(timeout_s: float = 20.0) -> Driver:
    """GPUs, driver version and driver CUDA from nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return Driver(error="nvidia-smi not found (no NVIDIA driver here, or not on PATH)")
    try:
        listing = subprocess.run([smi, "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=timeout_s, check=False)
        header = subprocess.run([smi], capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Driver(error=f"nvidia-smi does not run: {e}")
    if listing.returncode != 0:
        return Driver(error=f"nvidia-smi failed: {(listing.stderr or listing.stdout).strip()[-200:]}")
    gpus: list[GpuDevice] = []
    version = None
    for line in listing.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and re.fullmatch(r"\d+\.\d+", parts[1]):
            major, minor = parts[1].split(".")
            gpus.append(GpuDevice(len(gpus), parts[0], (int(major), int(minor))))
            version = parts[2]
    cuda = re.search(r"CUDA Version:\s*(\d+\.\d+)", header.stdout)
    return Driver(tuple(gpus), version, cuda.group(1) if cuda else None)


def find_compilers(env: Mapping[str, str]) -> tuple[Compiler, ...]:
    found = []
    for home in candidate_homes(env):
        try:
            found.append(Compiler(home, str(nvcc_version(home / "bin" / "nvcc"))))
        except ToolchainError:
            continue
    return tuple(found)


def machine_facts(env: Mapping[str, str], settings: Settings) -> MachineFacts:
    return MachineFacts(query_driver(), find_compilers(env), container_engine_answers(env), settings, dict(env))
