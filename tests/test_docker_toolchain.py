"""The docker toolchain without an engine: auto's fall-through and its printed reason, mounts, GPU requests."""

from __future__ import annotations

import docker
import pytest
from packaging.version import Version

from builder.core.errors import ToolchainError
from builder.core.settings import Settings
from builder.toolchain import container as docker_toolchain
from builder.toolchain import select
from builder.toolchain.base import CudaToolkit, index_mounts
from builder.toolchain.local import LocalRunner


class _Images:
    def get(self, name: str) -> object:
        raise docker.errors.ImageNotFound(f"{name} not found")

    def list(self, **_: object) -> list:
        return []


class _Api:
    base_url = "http+docker://fake-engine"


class _FakeEngine:
    """An engine that answers but holds no images (like a fresh podman here, where nothing can be pulled)."""

    images = _Images()
    api = _Api()
    closed = False

    def close(self) -> None:
        self.closed = True


def test_auto_never_pulls_and_falls_through_with_the_reason(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    engine = _FakeEngine()
    monkeypatch.setattr(docker_toolchain, "connect", lambda env, timeout=3: engine)
    settings = Settings.from_env({"BUILDER_CACHE_DIR": str(tmp_path)})
    with pytest.raises(ToolchainError) as e:
        select.select_toolkit("auto", Version("12.8"), settings, {"PATH": "/nonexistent"})
    line = e.value.one_line()
    assert "no CUDA 12.8 compiler here" in line and "PyPI has no CUDA 12 compiler" in line
    assert "a container engine answers at http+docker://fake-engine" in line
    assert "nvidia/cuda:12.8.1-devel-ubuntu24.04 is present (auto never pulls" in line
    assert any("--toolchain docker" in hint for hint in e.value.extra) and engine.closed  # a hint line of its own


def test_auto_records_why_the_engine_was_passed_over(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(docker_toolchain, "connect", lambda env, timeout=3: _FakeEngine())
    fake = CudaToolkit("host", tmp_path, Version("13.0.88"), "host CUDA")
    monkeypatch.setattr(select, "find_host_toolkit", lambda cuda, env: fake)
    choice = select.select_toolkit("auto", Version("13.0"), Settings.from_env({"BUILDER_CACHE_DIR": str(tmp_path)}), {})
    assert choice.toolkit is not None and choice.toolkit.kind == "host" and isinstance(choice.host, LocalRunner)
    assert choice.toolkit.reason.startswith("auto: a container engine answers at http+docker://fake-engine but neither")
    assert choice.toolkit.reason.endswith("host nvcc is CUDA 13.0.88")


def test_auto_without_engine_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(docker_toolchain, "connect", lambda env, timeout=3: None)
    fake = CudaToolkit("host", tmp_path, Version("13.0.88"), "host CUDA")
    monkeypatch.setattr(select, "find_host_toolkit", lambda cuda, env: fake)
    choice = select.select_toolkit("auto", Version("13.0"), Settings.from_env({"BUILDER_CACHE_DIR": str(tmp_path)}), {})
    assert "no container engine answers for nvidia/cuda:13.0.2-devel-ubuntu24.04" in choice.toolkit.reason


def test_docker_toolkit_record_carries_the_image() -> None:
    toolkit = CudaToolkit("docker", docker_toolchain.CONTAINER_CUDA_HOME, Version("12.8.93"), "r",
                          image="cuda-wheel-builder:cuda12.8-abc", image_id="sha256:1234", image_digest="")
    record = toolkit.record()
    assert record["image"] == "cuda-wheel-builder:cuda12.8-abc" and record["image_id"] == "sha256:1234"
    assert "image" not in CudaToolkit("host", docker_toolchain.CONTAINER_CUDA_HOME, Version("13.0.88")).record()


def test_a_local_torch_index_is_mounted_read_only_with_its_files() -> None:
    from pathlib import Path

    assert index_mounts("file:///opt/pypi-more/simple") == {Path("/opt/pypi-more"): True}
    assert index_mounts("https://download.pytorch.org/whl/cu128") == {}


def test_gpus_are_requested_only_when_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docker_toolchain, "gpu_present", lambda: False)
    assert docker_toolchain.gpu_requests(True) == []
    monkeypatch.setattr(docker_toolchain, "gpu_present", lambda: True)
    assert docker_toolchain.gpu_requests(False) == []
    (request,) = docker_toolchain.gpu_requests(True)
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]
