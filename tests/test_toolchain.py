"""Toolchain selection and the pip-provisioned CUDA 13 toolkit (real download from PyPI, cached by uv)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from packaging.version import Version

from builder.core.errors import RecipeError, ToolchainError
from builder.core.settings import Settings
from builder.model.cuda import CudaVersion
from builder.model.python import PythonSpec
from builder.toolchain import pip as pip_toolchain
from builder.toolchain.base import CudaToolkit
from builder.toolchain.host import find_host_toolkit
from builder.toolchain.select import select_toolkit
from tests.helpers import ROOT, write_recipes


def settings(tmp_path: Path, offline: bool = False) -> Settings:
    return Settings(cache_dir=tmp_path / "cache", wheelhouse=tmp_path / "wh", recipes_dir=tmp_path,
                    patches_dir=tmp_path, offline=offline)


def test_pip_refuses_cuda12_with_alternatives(tmp_path: Path) -> None:
    with pytest.raises(ToolchainError) as info:
        pip_toolchain.provision(CudaVersion.parse("12.8"), settings(tmp_path))
    assert "PyPI has no CUDA 12 compiler" in info.value.message
    assert "--toolchain docker" in (info.value.hint or "") and "--toolchain host" in (info.value.hint or "")


def test_host_toolkit_must_match_requested_version(tmp_path: Path) -> None:
    with pytest.raises(ToolchainError, match="no CUDA 12.9 toolkit"):
        find_host_toolkit(CudaVersion.parse("12.9"), {"PATH": "/usr/bin:/bin", "CUDA_HOME": str(tmp_path)})


def test_host_toolkit_none_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("builder.toolchain.host.Path.glob", lambda self, pattern: iter(()))
    monkeypatch.setattr("builder.toolchain.host.candidate_homes", lambda env: [])
    with pytest.raises(ToolchainError, match="no nvcc found"):
        find_host_toolkit(CudaVersion.parse("13.0"), {"PATH": "/nonexistent"})


@pytest.mark.network
def test_pip_toolkit_provisioned_cached_and_repaired(tmp_path: Path) -> None:
    cfg = settings(tmp_path)
    first = pip_toolchain.provision(CudaVersion.parse("13.0"), cfg)
    assert first.kind == "pip" and (first.version.major, first.version.minor) == (13, 0)
    assert (first.cuda_home / "lib" / "libcudart.so").exists(), "the unversioned cudart link is made"
    again = pip_toolchain.provision(CudaVersion.parse("13.0"), cfg)
    assert again.cuda_home == first.cuda_home and "cached" in again.reason
    (first.cuda_home / "nvvm" / "bin" / "cicc").unlink()  # damage the cached toolkit
    with pytest.raises(ToolchainError, match="--offline forbids"):
        pip_toolchain.provision(CudaVersion.parse("13.0"), settings(tmp_path, offline=True))
    repaired = pip_toolchain.provision(CudaVersion.parse("13.0"), cfg)
    assert (repaired.cuda_home / "nvvm" / "bin" / "cicc").exists() and "cached" not in repaired.reason


@pytest.mark.skipif(not shutil.which("nvcc"), reason="skipped: no nvcc on PATH")
def test_auto_prefers_matching_host_toolkit(tmp_path: Path) -> None:
    import os

    choice = select_toolkit("auto", CudaVersion.parse("13.0"), settings(tmp_path), dict(os.environ))
    assert choice.toolkit is not None and choice.toolkit.kind == "host"
    assert choice.toolkit.reason.startswith("auto:") and "host nvcc is CUDA 13.0" in choice.toolkit.reason


def test_host_compiler_identity_names_path_version_and_flags(tmp_path: Path) -> None:
    from builder.toolchain.hostcompiler import host_compiler

    def fake(name: str, version: str) -> Path:
        path = tmp_path / name
        path.write_text(f'#!/bin/sh\necho "{version}"\n')
        path.chmod(0o755)
        return path

    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    one = host_compiler({**env, "CXX": str(fake("cxx1", "fakecxx 1.0"))})
    two = host_compiler({**env, "CXX": str(fake("cxx2", "fakecxx 2.0"))})
    assert one == {"cxx": f"{tmp_path / 'cxx1'}: fakecxx 1.0"} and one != two
    fake("c++", "plain 3.0")  # the default name, found on PATH
    assert host_compiler(env) == {"cxx": f"{tmp_path / 'c++'}: plain 3.0"}
    flagged = host_compiler({**env, "CC": "c++", "NVCC_CCBIN": "c++", "CXXFLAGS": "-O1"})
    assert flagged["cc"] == flagged["nvcc_ccbin"] == flagged["cxx"] and flagged["CXXFLAGS"] == "-O1"
    with pytest.raises(ToolchainError, match=r"'no-such-cxx' \(\$CXX\) is not on PATH"):
        host_compiler({**env, "CXX": "no-such-cxx"})


def test_cache_key_changes_with_the_host_compiler_only_when_given(tmp_path: Path) -> None:
    from builder.model.arch import parse_arch_list
    from builder.stages.inputs import target_inputs
    from builder.stages.plan import Target, make_plan
    from tests.test_inputs import build_venv

    def cache_key(plan, *, python: str, torch: str, **parts) -> str:
        return target_inputs(plan, python=build_venv(python, torch), **parts).cache_key()

    from tests.helpers import FIXTURES, LOCAL_TORCH_INDEX

    settings = Settings.from_env({}, recipes_dir=FIXTURES / "recipes", cache_dir=tmp_path / "cache")
    plan = make_plan(Target(package="tinyext", version="0.1.0", cuda=CudaVersion.parse("13.0"),
                            archs=parse_arch_list("90"), python=PythonSpec("3.11"), torch="2.14.1",
                            torch_index=str(LOCAL_TORCH_INDEX), toolchain="host"),
                     settings)
    args = dict(source_digest="0" * 64, toolkit={"kind": "host", "nvcc": "13.0.88"}, python="3.11.7", torch="2.14.1")
    base = cache_key(plan, **args)
    assert cache_key(plan, **args, compiler=None) == base  # pure-Python and container keys stay as they were
    a = cache_key(plan, **args, compiler={"cxx": "/usr/bin/c++: g++ 12.2.0"})
    b = cache_key(plan, **args, compiler={"cxx": "/usr/bin/c++: g++ 13.1.0"})
    assert len({base, a, b}) == 3
    # container builds: the image tag (a hash of Dockerfile and base) is part of the key, its content ID is not
    docker = dict(args, toolkit={"kind": "docker", "nvcc": "13.0.88", "image": "cuda-wheel-builder:cuda13.0-aaaa",
                                 "image_id": "sha256:1"})
    rebuilt = dict(docker, toolkit={**docker["toolkit"], "image_id": "sha256:2"})
    edited = dict(docker, toolkit={**docker["toolkit"], "image": "cuda-wheel-builder:cuda13.0-bbbb"})
    assert cache_key(plan, **docker) == cache_key(plan, **rebuilt) != cache_key(plan, **edited)


def test_every_build_host_has_the_protocols_members() -> None:
    """LocalRunner and ContainerToolchain answer everything BuildHost names (no type checker runs in CI)."""
    import inspect

    from builder.toolchain.base import BuildHost
    from builder.toolchain.container import ContainerToolchain
    from builder.toolchain.local import LocalRunner

    methods = {n for n, v in vars(BuildHost).items() if callable(v) and (not n.startswith("_") or n in
                                                                          ("__enter__", "__exit__"))}
    # data members: annotated ones, and read-only ones declared as properties (toolkit)
    attributes = set(BuildHost.__annotations__) | {n for n, v in vars(BuildHost).items() if isinstance(v, property)}
    # each one called by the stages, the pipeline or the farm (describe and record were not: removed)
    assert methods == {"__enter__", "__exit__", "close", "run", "path", "base_env", "prepare_python", "given_python",
                       "host_compiler", "build_wheel"} and attributes == {"toolkit", "where"}
    for cls in (LocalRunner, ContainerToolchain):
        missing = [m for m in methods if not callable(getattr(cls, m, None))]
        missing += [a for a in attributes if not hasattr(cls, a) and a not in cls.__init__.__code__.co_names]
        assert not missing, f"{cls.__name__} lacks {missing}"
        for name in methods:
            wanted = set(inspect.signature(getattr(BuildHost, name)).parameters)
            assert wanted <= set(inspect.signature(getattr(cls, name)).parameters), (cls.__name__, name)


def test_nvcc_version_text_has_one_reading() -> None:
    """model/arch.parse_nvcc_version: what the host and pip probes (toolchain/base.nvcc_version), the container's
    probe and the arch lookups (model/arch.py) read from ``nvcc --version``."""
    from builder.model.arch import parse_nvcc_version

    text = ("nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA Corporation\n"
            "Built on Wed_Aug_20_01:58:59_PM_PDT_2025\nCuda compilation tools, release 13.0, V13.0.88\n"
            "Build cuda_13.0.r13.0/compiler.36424714_0\n")
    assert parse_nvcc_version(text) == Version("13.0.88") and str(parse_nvcc_version(text)) == "13.0.88"
    assert parse_nvcc_version("Cuda compilation tools, release 12.8, V12.8.93") == Version("12.8.93")
    assert parse_nvcc_version("bash: nvcc: command not found") is None
    assert parse_nvcc_version("Cuda compilation tools, release 13.0") is None  # no full version: not nvcc's text


def test_a_host_runs_each_pep517_hook_with_the_script_and_control_folder_mounted(tmp_path: Path) -> None:
    """The frontend every toolchain shares: a real setuptools build through ProjectBuilder whose one hook call
    goes through the host's run() with network off and, for a host that runs elsewhere, the in-process script
    (read-only) and the control folder (writable) among its mounts."""
    import sys
    import textwrap

    from builder.toolchain.base import WheelRequest
    from builder.toolchain.frontend import pep517_wheel
    from builder.toolchain.local import LocalRunner

    calls: list[tuple[list[str], dict, bool]] = []

    class Recording(LocalRunner):
        def run(self, argv, **kw):  # type: ignore[no-untyped-def, override]
            calls.append((list(argv), dict(kw["mounts"]), kw["network"]))
            return super().run(argv, **kw)

    project = tmp_path / "proj"
    (project / "demo").mkdir(parents=True)
    (project / "demo" / "__init__.py").write_text("")
    (project / "setup.py").write_text(textwrap.dedent("""
        from setuptools import setup
        setup(name="demo", version="0.1", packages=["demo"])
    """))
    log_file = tmp_path / "build.log"
    request = WheelRequest(source_dir=project, python=Path(sys.executable), env={"PATH": "/usr/bin:/bin"},
                           out_dir=tmp_path / "dist", log_file=log_file)
    lines: list[str] = []
    wheel = pep517_wheel(request, Recording(), lines.append, mounts={project: False})
    assert wheel.name == "demo-0.1-py3-none-any.whl" and wheel.is_file()
    ((argv, mounts, network),) = calls
    assert argv[0] == sys.executable and argv[2] == "build_wheel" and network is False
    assert mounts[project] is False and mounts[Path(argv[1])] is True and mounts[Path(argv[3])] is False
    assert f"+ {' '.join(argv)}" in log_file.read_text() and any("bdist_wheel" in line for line in lines)


# A translation unit shaped like torch extensions' kernel files: templates and internal-linkage code only. nvcc's
# front end numbers its internal symbols (_INTERNAL_<path hash>_<file>_<hash>_<n>) with its process ID for such a
# file unless -frandom-seed is given (docs/RELIABILITY.md, case 12).
TEMPLATE_ONLY_TU = """#include <cuda/std/utility>
namespace { template <typename T> __device__ T twice(T x) { return x + x; } }
template <typename T> __global__ void scale(T* y, long n) {
    auto p = cuda::std::make_pair(blockIdx.x * (long)blockDim.x + threadIdx.x, n);
    if (p.first < p.second) y[p.first] = twice(y[p.first]);
}
template __global__ void scale<float>(float*, long);
"""


def host_cuda13() -> CudaToolkit | None:
    import os

    try:
        return find_host_toolkit(CudaVersion.parse("13.0"), os.environ)
    except ToolchainError:
        return None


def host_cuda13_source(source: Path, text: str) -> tuple[CudaToolkit, Path]:
    """The host CUDA 13.0 toolkit (tests that call this skip without it) and ``source`` written with ``text``."""
    toolkit = host_cuda13()
    assert toolkit is not None
    source.write_text(text)
    return toolkit, source


@pytest.mark.e2e  # compiles with the real nvcc
@pytest.mark.skipif(host_cuda13() is None, reason="no host CUDA 13.0 nvcc")
def test_the_builders_nvcc_flags_make_a_template_only_translation_unit_compile_to_the_same_bytes(
        tmp_path: Path) -> None:
    import hashlib
    import re
    import subprocess

    toolkit, source = host_cuda13_source(tmp_path / "scale.cu", TEMPLATE_ONLY_TU)

    def digest(flags: tuple[str, ...], out: str) -> str:
        subprocess.run([str(toolkit.nvcc), "-c", "-arch=sm_90", *flags, str(source), "-o", str(tmp_path / out)],
                       check=True, capture_output=True)
        # nvcc's temp file names (tmpxft_<pid>_…) are in the object too; finalize zeroes them in the .so
        return hashlib.sha256(re.sub(rb"tmpxft_[0-9a-f]{8}_", b"tmpxft_00000000_", (tmp_path / out).read_bytes())
                              ).hexdigest()

    # two compiles are two processes: without the flags their objects differ (the control) ...
    assert digest((), "a.o") != digest((), "b.o")
    # ... with the builder's flags they are the same bytes
    assert toolkit.nvcc_flags and digest(toolkit.nvcc_flags, "c.o") == digest(toolkit.nvcc_flags, "d.o")


# Kernels enough for ptxas's split compilation to hand out (it compiles a file's functions in threads).
MANY_KERNELS_TU = """
template <int N, typename T> __global__ void smooth(const T* x, T* y, long n) {
    long i = blockIdx.x * (long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    T acc = 0;
#pragma unroll
    for (int k = 0; k < N; ++k) acc += x[(i + k) % n] * T(k + 1) / T(N);
    y[i] = acc > T(0) ? acc : acc / T(2);
}
template __global__ void smooth<3, float>(const float*, float*, long);
template __global__ void smooth<7, float>(const float*, float*, long);
template __global__ void smooth<16, float>(const float*, float*, long);
template __global__ void smooth<3, double>(const double*, double*, long);
template __global__ void smooth<7, double>(const double*, double*, long);
template __global__ void smooth<16, double>(const double*, double*, long);
"""


@pytest.mark.e2e  # compiles with the real nvcc
@pytest.mark.skipif(host_cuda13() is None, reason="no host CUDA 13.0 nvcc")
def test_ptxas_split_compilation_gives_the_same_kernels_and_writes_its_thread_count_into_the_cubin(
        tmp_path: Path) -> None:
    import subprocess

    from builder.core.elf import elf_sections
    from builder.toolchain.base import PTXAS_THREADS

    toolkit, source = host_cuda13_source(tmp_path / "smooth.cu", MANY_KERNELS_TU)
    split = next(f for f in toolkit.nvcc_flags if f.startswith("--ptxas-options=--split-compile="))
    assert split == f"--ptxas-options=--split-compile={PTXAS_THREADS}"
    assert split not in toolkit.nvcc_flags_for(ptxas_split=False)

    def cubin(out: str, *flags: str) -> dict[str, bytes]:
        subprocess.run([str(toolkit.nvcc), "-cubin", "-arch=sm_90", "-O3", "-frandom-seed=x", *flags, str(source),
                        "-o", str(tmp_path / out)], check=True, capture_output=True)
        return elf_sections((tmp_path / out).read_bytes())

    plain, ours, again, two = (cubin("plain.cubin"), cubin("ours.cubin", split), cubin("again.cubin", split),
                               cubin("two.cubin", "--ptxas-options=--split-compile=2"))
    code = [name for name in plain if name.startswith((".text.", ".nv.info."))]
    assert sum(name.startswith(".text.") for name in code) == 6  # the six kernels
    # the same machine code and resource use (.nv.info: registers, stack, ...) in every section but the tool note
    for other in (ours, two):
        assert sorted(other) == sorted(plain)
        assert [name for name in plain if plain[name] != other[name]] == [".note.nv.tkinfo"]
    # ptxas writes its command line into that note: another thread count, other bytes. So the count is a
    # constant (PTXAS_THREADS), never the machine's cores; with the same count the bytes are the same
    assert f"-split-compile {PTXAS_THREADS}".encode() in ours[".note.nv.tkinfo"]
    assert ours == again and ours[".note.nv.tkinfo"] != two[".note.nv.tkinfo"]


def test_parallelism_threads_nvcc_only_for_a_multi_arch_list_within_cores_and_memory() -> None:
    from builder.model.arch import parse_arch_list
    from builder.stages.compile import Parallelism, parallelism
    from builder.toolchain.base import PTXAS_THREADS

    cuda13 = CudaToolkit("host", Path("/cuda"), Version("13.0.88"))
    one, four = parse_arch_list("120"), parse_arch_list("80,90,100,120")
    assert parallelism(2, one, cuda13, ptxas_split=True, cores=16, slots=30) == Parallelism(2, 1, PTXAS_THREADS)
    assert parallelism(2, four, cuda13, ptxas_split=True, cores=16, slots=30).nvcc_threads == 4
    assert parallelism(2, four, cuda13, ptxas_split=True, cores=2, slots=30).nvcc_threads == 2  # cores
    assert parallelism(2, four, cuda13, ptxas_split=True, cores=16, slots=3).nvcc_threads == 3  # memory
    assert parallelism(2, four, cuda13, ptxas_split=False, cores=2, slots=3).ptxas_threads == 1  # the recipe's off
    cuda12 = CudaToolkit("docker", Path("/cuda"), Version("12.8.93"))
    assert parallelism(2, one, cuda12, ptxas_split=True).ptxas_threads == 1  # not verified on 12.x: not given
    assert parallelism(3, (), None, ptxas_split=True) == Parallelism(max_jobs=3)
    assert Parallelism(2, 4, 8).nvcc_flags() == ("--threads=4",) and Parallelism(2, 1, 8).nvcc_flags() == ()


def test_max_jobs_fit_the_memory_with_the_recipes_measured_peak(tmp_path: Path) -> None:
    """Issue 52 item 1: flash-attn's backward files take 6 GiB each; MAX_JOBS × nvcc threads heavy processes must fit
    the machine's memory at the recipe's measured peak ([build] nvcc-peak-gib), never more."""
    from builder.core.settings import memory_slots
    from builder.model.arch import parse_arch_list
    from builder.model.recipe import find_recipe, load_recipe
    from builder.stages.compile import parallelism

    cuda13 = CudaToolkit("host", Path("/cuda"), Version("13.0.88"))
    one, four = parse_arch_list("90"), parse_arch_list("80,90,100,120")
    fa = load_recipe(find_recipe("flash-attn", ROOT / "recipes"), ROOT / "patches")
    assert fa.nvcc_peak_gib == 7.0
    assert memory_slots(7.0) <= memory_slots() and memory_slots(1e9) == 1
    # the 2-core, 23 GiB machine: 3 slots of 7 GiB; 4 archs → 2 nvcc threads, so one job, not two
    assert parallelism(2, four, cuda13, ptxas_split=True, cores=2, slots=3).max_jobs == 1
    assert parallelism(2, one, cuda13, ptxas_split=True, cores=2, slots=3).max_jobs == 2
    # the 16-core GPU machine, 125 GiB / 7 = 17 slots: 16 jobs of one arch; 4 archs → 4 threads → 4 jobs
    assert parallelism(16, one, cuda13, ptxas_split=True, cores=16, slots=17).max_jobs == 16
    assert parallelism(16, four, cuda13, ptxas_split=True, cores=16, slots=17).max_jobs == 4
    recipes = write_recipes(tmp_path, {"bad": 'name = "bad"\nversions = ">=1"\n[source]\npypi = "bad"\n'
                                               '[build]\nnvcc-peak-gib = 0\n'})
    with pytest.raises(RecipeError, match="build.nvcc-peak-gib"):
        load_recipe(recipes / "bad" / "recipe.toml", tmp_path)
