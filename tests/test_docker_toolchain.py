"""The docker toolchain without an engine: auto's fall-through and its printed reason, the engine's name, what the
cibuildwheel build step is passed, the torch it names from the fetched wheel, GPU requests."""

from __future__ import annotations

from pathlib import Path

import docker
import pytest
from packaging.version import Version

from builder.core.errors import ToolchainError
from builder.core.settings import Settings
from builder.model.cuda import CudaVersion
from builder.toolchain import cibw, select
from builder.toolchain import container as docker_toolchain
from builder.toolchain.base import CudaToolkit, WheelRequest
from builder.toolchain.local import LocalRunner
from tests.helpers import LOCAL_TORCH_INDEX


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
        select.select_toolkit("auto", CudaVersion.parse("12.8"), settings, {"PATH": "/nonexistent"})
    line = e.value.one_line()
    assert "no CUDA 12.8 compiler here" in line and "PyPI has no CUDA 12 compiler" in line
    assert "a container engine answers at http+docker://fake-engine" in line
    assert "quay.io/pypa/manylinux_2_28_x86_64:latest is present (auto never pulls" in line
    assert any("--toolchain docker" in hint for hint in e.value.extra) and engine.closed  # a hint line of its own


def test_auto_records_why_the_engine_was_passed_over(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(docker_toolchain, "connect", lambda env, timeout=3: _FakeEngine())
    fake = CudaToolkit("host", tmp_path, Version("13.0.88"), "host CUDA")
    monkeypatch.setattr(select, "find_host_toolkit",
                        lambda cuda, env, memo=None, components=(): fake)
    choice = select.select_toolkit("auto", CudaVersion.parse("13.0"), Settings.from_env({"BUILDER_CACHE_DIR": str(tmp_path)}), {})
    assert choice.toolkit is not None and choice.toolkit.kind == "host" and isinstance(choice.host, LocalRunner)
    assert choice.toolkit.reason.startswith("auto: a container engine answers at http+docker://fake-engine but neither")
    assert choice.toolkit.reason.endswith("host nvcc is CUDA 13.0.88")


def test_auto_without_engine_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setattr(docker_toolchain, "connect", lambda env, timeout=3: None)
    fake = CudaToolkit("host", tmp_path, Version("13.0.88"), "host CUDA")
    monkeypatch.setattr(select, "find_host_toolkit",
                        lambda cuda, env, memo=None, components=(): fake)
    choice = select.select_toolkit("auto", CudaVersion.parse("13.0"), Settings.from_env({"BUILDER_CACHE_DIR": str(tmp_path)}), {})
    assert ("no container engine answers for quay.io/pypa/manylinux_2_28_x86_64:latest + CUDA 13.0 "
            "(dockerfiles/manylinux-cuda.Dockerfile)") in choice.toolkit.reason


def test_docker_toolkit_record_carries_the_image() -> None:
    toolkit = CudaToolkit("docker", docker_toolchain.CONTAINER_CUDA_HOME, Version("12.8.93"), "r",
                          image="cuda-wheel-builder:cuda12.8-abc", image_id="sha256:1234", image_digest="")
    record = toolkit.record()
    assert record["image"] == "cuda-wheel-builder:cuda12.8-abc" and record["image_id"] == "sha256:1234"
    assert "image" not in CudaToolkit("host", docker_toolchain.CONTAINER_CUDA_HOME, Version("13.0.88")).record()


def test_the_engine_is_named_from_its_version_components() -> None:
    class Podman:
        def version(self) -> dict:
            return {"Components": [{"Name": "Podman Engine", "Version": "4.3.1"}]}

    class Docker:
        def version(self) -> dict:
            return {"Components": [{"Name": "Engine"}, {"Name": "containerd"}]}

    assert docker_toolchain.engine_name(Podman()) == "podman"
    assert docker_toolchain.engine_name(Docker()) == "docker"
    assert docker_toolchain.engine_name(object()) == "docker"  # cannot say: docker's CLI


def test_the_build_step_gets_the_recipe_env_not_the_containers_own(tmp_path: Path) -> None:
    """What cibuildwheel passes into its container: the build's variables, with the prefix map of the source
    renamed to cibuildwheel's copy at /project; PATH, HOME and CUDA_HOME are the container's own."""
    src = tmp_path / "src" / "tinyext"
    env = {"PATH": "/usr/local/cuda/bin:/usr/bin", "CUDA_HOME": "/usr/local/cuda", "HOME": "/root",
           "TORCH_CUDA_ARCH_LIST": "9.0", "MAX_JOBS": "2", "NOTE": "a $(b)", "SOURCE_DATE_EPOCH": "315532800",
           "CFLAGS": f"-O2 -ffile-prefix-map={src}=/build/tinyext -ffile-prefix-map=/usr/local/cuda=/cuda",
           "NVCC_APPEND_FLAGS": f"-Xcompiler=-ffile-prefix-map={src}=/build/tinyext"}
    request = WheelRequest(source_dir=src, python=Path("/opt/python/cp311-cp311/bin/python"), env=env,
                           out_dir=tmp_path / "out", log_file=tmp_path / "log")
    passed = docker_toolchain.passed_env(request)
    assert set(passed) == {"TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "NOTE", "SOURCE_DATE_EPOCH", "CFLAGS",
                           "NVCC_APPEND_FLAGS"}
    assert passed["CFLAGS"] == "-O2 -ffile-prefix-map=/project=/build/tinyext -ffile-prefix-map=/usr/local/cuda=/cuda"
    assert passed["NVCC_APPEND_FLAGS"] == "-Xcompiler=-ffile-prefix-map=/project=/build/tinyext"
    assert passed["NOTE"] == "a $(b)"


@pytest.mark.skipif(not LOCAL_TORCH_INDEX.is_dir(), reason=f"no local torch index at {LOCAL_TORCH_INDEX}")
def test_the_torch_named_is_what_the_fetched_wheel_says(tmp_path: Path) -> None:
    """The cache key's torch for a container build: torch/version.py of the very wheel the build installs
    (a real torch 2.14.1 wheel of the local index, linked into the cache: no copy, no install)."""
    (wheel,) = (LOCAL_TORCH_INDEX.parent / "files").glob("torch-2.14.1-cp311-*.whl")
    fetch = cibw.TorchCache(python="3.11", torch="2.14.1", torch_index=LOCAL_TORCH_INDEX.as_uri(),
                            cache_dir=tmp_path)
    fetch.wheels_dir.mkdir()
    (fetch.wheels_dir / wheel.name).symlink_to(wheel)
    found = cibw.fetched_torch(fetch)
    assert (found.version, found.cuda) == ("2.14.1+cu130", "13.0")
    with pytest.raises(ToolchainError, match="0 torch==2.14.1 wheels for cp312"):
        cibw.fetched_torch(cibw.TorchCache(python="3.12", torch="2.14.1", torch_index="x", cache_dir=tmp_path))


def test_gpus_are_requested_only_when_present(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(docker_toolchain, "gpu_present", lambda: False)
    assert docker_toolchain.gpu_requests(True) == []
    monkeypatch.setattr(docker_toolchain, "gpu_present", lambda: True)
    assert docker_toolchain.gpu_requests(False) == []
    (request,) = docker_toolchain.gpu_requests(True)
    assert request["Count"] == -1 and request["Capabilities"] == [["gpu"]]


def test_the_build_step_takes_the_prepared_python_from_the_request(tmp_path: Path) -> None:
    """prepare_python's answer travels in the WheelRequest: the toolchain keeps no state between the two, and a
    request without it is refused before anything runs."""
    from builder.toolchain.base import PreparedPython

    fetch = cibw.TorchCache(python="3.11", torch="2.14.1", torch_index="https://download.pytorch.org/whl/cu130",
                            cache_dir=tmp_path / "torch", requirements=("build", "ninja"))
    prepared = PreparedPython(Path("/opt/python/cp311-cp311/bin/python"), "3.11", "2.14.1+cu130", "13.0",
                              Path("/opt/python/cp311-cp311/lib/python3.11/site-packages"), fetch)
    request = WheelRequest(source_dir=tmp_path / "src", python=prepared.python, env={"MAX_JOBS": "2"},
                           out_dir=tmp_path / "out", log_file=tmp_path / "log", prepared=prepared)
    req = docker_toolchain.cibuildwheel_request(request, prepared, image="sha256:abc", engine="podman",
                                                engine_env={"CONTAINERS_CONF": "/x"})
    assert (req.python, req.torch, req.torch_index, req.cache_dir, req.requirements) == (
        "3.11", "2.14.1", "https://download.pytorch.org/whl/cu130", tmp_path / "torch", ("build", "ninja"))
    assert (req.image, req.engine, dict(req.engine_env), dict(req.build_env)) == (
        "sha256:abc", "podman", {"CONTAINERS_CONF": "/x"}, {"MAX_JOBS": "2"})
    unprepared = docker_toolchain.ContainerToolchain.__new__(docker_toolchain.ContainerToolchain)  # no engine
    with pytest.raises(ToolchainError, match="the Python its prepare_python answered"):
        unprepared.build_wheel(WheelRequest(source_dir=tmp_path, python=prepared.python, env={},
                                            out_dir=tmp_path, log_file=tmp_path / "log"), lambda line: None)


def test_a_containers_output_goes_through_the_shared_loop(tmp_path: Path) -> None:
    """The engine's log chunks are cut anywhere (a UTF-8 character too); the lines reach the log file, on_line
    (non-empty, stripped) and the returned output whole."""

    class Container:
        def logs(self, **_: object) -> list[bytes]:
            return [b"nvcc: NVIDIA (R) Cuda compiler\nCuda compilation tools, rel", b"ease 13.0, V13.0.88\n\n  caf\xc3",
                    b"\xa9 \nlast"]

    seen: list[str] = []
    with (tmp_path / "log").open("w") as out:
        output = docker_toolchain.ContainerToolchain._follow(Container(), out, seen.append)
    assert output == ["nvcc: NVIDIA (R) Cuda compiler", "Cuda compilation tools, release 13.0, V13.0.88", "",
                      "  café ", "last"]
    assert seen == ["nvcc: NVIDIA (R) Cuda compiler", "Cuda compilation tools, release 13.0, V13.0.88", "café", "last"]
    assert (tmp_path / "log").read_text() == "\n".join(output) + "\n"
