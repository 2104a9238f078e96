"""Issue 52 items 1 and 4 (build side): the flash-attn recipe and its patch series.

Unit tier: the recipe loads with what the build needs; the head-dim and arch-list helpers 0001 adds to setup.py,
taken out of the patch file itself and run. Network tier: the series applies to every real sdist in range (the
test-only fault on top), and the patched setup.py of 2.8.3.post2, run with stand-ins for torch and setuptools (no
compile), hands exactly the hdim128 kernel files to CUDAExtension under FLASH_ATTN_HDIMS=128."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import repo_recipe

ROOT = Path(__file__).resolve().parents[1]
PATCHES = ROOT / "patches" / "flash-attn"
P0001 = "0001-arch-list-no-download-clear-errors-hdims-2.8.3-2.8.3.post2.patch"
P9001 = "9001-test-only-causal-mask-off-by-one-hdim128.patch"
VERSIONS = ("2.8.3", "2.8.3.post1", "2.8.3.post2")
HEAD_DIMS = (32, 64, 96, 128, 192, 256)


def test_the_recipe_loads_with_what_the_build_needs() -> None:
    recipe = repo_recipe("flash-attn")
    assert recipe.kind.is_cuda
    assert all(recipe.versions.contains(v, prereleases=True) for v in VERSIONS)
    assert not recipe.versions.contains("2.8.2") and not recipe.versions.contains("2.8.4")
    assert set(recipe.source.sha256) == set(VERSIONS)
    assert recipe.source.sha256["2.8.3.post2"] == "d0f9f0b08a986cdeadbffcf5ec8b3a8f514366c68ad1853d3ab061bc83cc340b"
    # never a download, skip nothing, no head-dim subset in a published build's env
    assert recipe.build_env["FLASH_ATTENTION_FORCE_BUILD"] == "TRUE"
    assert recipe.build_env.get("FLASH_ATTENTION_SKIP_CUDA_BUILD", "FALSE") == "FALSE"
    assert not any(k.startswith(("FLASH_ATTN_HDIMS", "FLASH_ATTN_CUDA_ARCHS", "FLASH_ATTENTION_DISABLE"))
                   for k in recipe.build_env)
    assert {"ninja", "packaging", "wheel"} <= {r.split(">")[0].split("=")[0] for r in recipe.build_requires}
    assert recipe.imports[:2] == ("flash_attn", "flash_attn_2_cuda")
    assert recipe.kernel_tests == ROOT / "recipes" / "flash-attn" / "kernel_tests.py"
    assert recipe.runtime_requires == () and recipe.runtime_drop == ()  # upstream's einops stays, torch is pinned


def test_0001_applies_to_every_release_and_the_fault_only_when_asked() -> None:
    recipe = repo_recipe("flash-attn")
    for version in VERSIONS:
        assert [p.name for p in recipe.patches_for(version)] == [P0001], version
        asked = recipe.patches_for(version, include_test_only=(P9001,))
        assert [p.name for p in asked] == [P0001, P9001], version
    fault = next(p for p in recipe.patches if p.name == P9001)
    assert fault.test_only and fault.build == 0
    assert all(p.path.is_file() for p in recipe.patches)


def test_patch_headers_say_which_versions_and_why() -> None:
    text = (PATCHES / P0001).read_text()
    header = text.split("\ndiff --git", 1)[0]
    for needle in ("2.8.3", "2.8.3.post2", "TORCH_CUDA_ARCH_LIST", "FLASH_ATTENTION_FORCE_BUILD", "bare_metal_version",
                   "MAX_JOBS", "FLASH_ATTN_HDIMS", "-std=c++17"):
        assert needle in header, needle
    assert "TEST-ONLY" in (PATCHES / P9001).read_text().split("\ndiff --git", 1)[0]


def _setup_helpers() -> dict[str, Any]:
    """The functions 0001 adds to setup.py (one hunk of added lines, from torch_cuda_arch_list_gencode to
    filter_head_dim_sources), taken out of the patch file and executed: what the patched setup.py runs."""
    text = (PATCHES / P0001).read_text()
    setup_diff = text.split("diff --git a/setup.py b/setup.py", 1)[1]
    lines = setup_diff.splitlines()
    start = lines.index("+def torch_cuda_arch_list_gencode():")
    block = []
    for line in lines[start:]:
        if not line.startswith("+"):
            break
        block.append(line[1:])
    namespace: dict[str, Any] = {"os": os, "re": re}
    exec(compile("\n".join(block), str(PATCHES / P0001), "exec"), namespace)
    return namespace


def _upstream_kernel_files() -> list[str]:
    return [f"csrc/flash_attn/src/flash_{kind}_hdim{d}_{dtype}{causal}_sm80.cu"
            for kind in ("fwd", "bwd", "fwd_split") for causal in ("", "_causal") for d in HEAD_DIMS
            for dtype in ("fp16", "bf16")]


def test_the_head_dim_subset_keeps_only_those_kernel_files() -> None:
    h = _setup_helpers()
    sources = ["csrc/flash_attn/flash_api.cpp", *_upstream_kernel_files()]
    assert len(sources) == 73
    assert h["selected_head_dims"]("") == HEAD_DIMS  # unset: every head dim, as upstream
    assert h["selected_head_dims"]("128") == (128,)
    assert h["selected_head_dims"]("128, 64,128") == (64, 128)
    assert h["filter_head_dim_sources"](sources, HEAD_DIMS) == sources
    kept = h["filter_head_dim_sources"](sources, (128,))
    assert kept[0] == "csrc/flash_attn/flash_api.cpp" and len(kept) == 13
    assert all("_hdim128_" in s for s in kept[1:])
    assert h["head_dims_mask"](HEAD_DIMS) == 63 and h["head_dims_mask"]((128,)) == 8
    assert h["head_dims_mask"]((64, 128)) == 0b1010
    for bad in ("100", "hdim128", "-64"):
        with pytest.raises(RuntimeError, match="FLASH_ATTN_HDIMS entry"):
            h["selected_head_dims"](bad)


def test_the_arch_list_comes_from_torch_cuda_arch_list(monkeypatch: pytest.MonkeyPatch) -> None:
    h = _setup_helpers()
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0 10.0;12.0+PTX")
    assert h["torch_cuda_arch_list_gencode"]() == [
        "-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90",
        "-gencode", "arch=compute_100,code=sm_100", "-gencode", "arch=compute_120,code=sm_120",
        "-gencode", "arch=compute_120,code=compute_120"]
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a;12.1")  # upstream silently dropped both
    assert h["torch_cuda_arch_list_gencode"]() == ["-gencode", "arch=compute_90a,code=sm_90a",
                                                   "-gencode", "arch=compute_121,code=sm_121"]
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "")
    assert h["torch_cuda_arch_list_gencode"]() == []  # upstream's FLASH_ATTN_CUDA_ARCHS list then
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "Hopper")
    with pytest.raises(RuntimeError, match="cannot parse TORCH_CUDA_ARCH_LIST entry 'Hopper'"):
        h["torch_cuda_arch_list_gencode"]()


# ----------------------------------------------------------------------------------------------- real sdists

@pytest.mark.network
@pytest.mark.parametrize("version", VERSIONS)
def test_the_series_applies_to_the_real_sdist(tmp_path: Path, version: str) -> None:
    """The patch stage's own dry run and apply (GNU patch --fuzz=0) on the sdist PyPI serves (sha256 of the
    recipe), then the test-only fault on top."""
    from builder.stages.patch import apply_patches
    from tests.helpers import real_sdist

    recipe, root = real_sdist("flash-attn", version, tmp_path)
    before = (root / "setup.py").read_text()
    apply_patches(root, recipe.patches_for(version), "flash-attn", version)
    setup = (root / "setup.py").read_text()
    assert "def selected_head_dims" in setup
    # the CUDA branch's two -std=c++17 (nvcc_flags, compiler_c17_flag) are gone; the HIP branch keeps its own
    assert setup.count('"-std=c++17"') == before.count('"-std=c++17"') - 2
    api = (root / "csrc" / "flash_attn" / "flash_api.cpp").read_text()
    assert "run_mha_fwd_hdim_checked<elem_type, kHeadDim>" in api and 'm.attr("built_head_dims")' in api
    fault = tuple(p for p in recipe.patches_for(version, include_test_only=(P9001,)) if p.test_only)
    apply_patches(root, fault, "flash-attn", version)
    assert "kPlantedShift" in (root / "csrc" / "flash_attn" / "src" / "flash_fwd_kernel.h").read_text()


# Runs the patched setup.py with stand-ins: torch (a CUDA 13.0 build whose CUDA_HOME is a folder with a fake
# nvcc printing its version), torch.utils.cpp_extension.CUDAExtension and setuptools.setup recording their
# arguments, wheel.bdist_wheel. Prints what CUDAExtension got as JSON, or the RuntimeError's text.
DRIVER = textwrap.dedent('''
    import json, runpy, sys, types
    cuda_home, torch_cuda = sys.argv[1] or None, sys.argv[2] or None
    got = {}
    torch = types.ModuleType("torch")
    torch.__version__ = "2.14.1+cu130" if torch_cuda else "2.14.1+cpu"
    torch.version = types.SimpleNamespace(cuda=torch_cuda, hip=None)
    torch._C = types.SimpleNamespace(_GLIBCXX_USE_CXX11_ABI=True)
    ext = types.ModuleType("torch.utils.cpp_extension")
    def CUDAExtension(name, sources, extra_compile_args, include_dirs):
        got.update(name=name, sources=list(sources), args=extra_compile_args)
        return name
    ext.CUDAExtension = CUDAExtension
    ext.CppExtension = ext.BuildExtension = object
    ext.CUDA_HOME, ext.ROCM_HOME, ext.IS_HIP_EXTENSION = cuda_home, None, False
    utils = types.ModuleType("torch.utils")
    utils.cpp_extension = ext
    torch.utils = utils
    wheel_bdist = types.ModuleType("wheel.bdist_wheel")
    wheel_bdist.bdist_wheel = type("bdist_wheel", (), {"run": lambda self: None})
    sys.modules.update({"torch": torch, "torch.utils": utils, "torch.utils.cpp_extension": ext,
                        "wheel": types.ModuleType("wheel"), "wheel.bdist_wheel": wheel_bdist})
    import setuptools
    setuptools.setup = lambda **kw: got.update(cmdclass=sorted(kw.get("cmdclass", {})))
    try:
        runpy.run_path("setup.py", run_name="__main__")
    except RuntimeError as e:
        got["error"] = str(e)
    print("RESULT " + json.dumps(got))
''')


def _run_setup(root: Path, tmp_path: Path, env: dict[str, str], *, cuda_home: bool = True,
               torch_cuda: str = "13.0") -> dict[str, Any]:
    home = tmp_path / "cuda"
    (home / "bin").mkdir(parents=True, exist_ok=True)
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    (tmp_path / "driver.py").write_text(DRIVER)
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("TORCH_CUDA_ARCH_LIST", "FLASH_ATTN", "FLASH_ATTENTION", "MAX_JOBS"))}
    out = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(home) if cuda_home else "", torch_cuda],
                         cwd=root, env={**clean, **env}, capture_output=True, text=True, timeout=120)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line is not None, out.stdout[-2000:] + out.stderr[-2000:]
    result: dict[str, Any] = json.loads(line[len("RESULT "):])
    return result


@pytest.mark.network
def test_the_patched_setup_compiles_only_the_head_dims_asked_and_the_archs_asked(tmp_path: Path) -> None:
    from builder.stages.patch import apply_patches
    from tests.helpers import real_sdist

    version = "2.8.3.post2"
    recipe, root = real_sdist("flash-attn", version, tmp_path)
    apply_patches(root, recipe.patches_for(version), "flash-attn", version)

    sub = _run_setup(root, tmp_path, {"FLASH_ATTN_HDIMS": "128", "TORCH_CUDA_ARCH_LIST": "9.0;12.0+PTX",
                                      "MAX_JOBS": "2"})
    assert sub["name"] == "flash_attn_2_cuda"
    kernels = sub["sources"][1:]
    assert sub["sources"][0] == "csrc/flash_attn/flash_api.cpp" and len(kernels) == 12
    assert all("_hdim128_" in s and (root / s).is_file() for s in kernels)
    assert {re.sub(r"_(fp16|bf16)", "", Path(s).name) for s in kernels} == {
        "flash_fwd_hdim128_sm80.cu", "flash_fwd_hdim128_causal_sm80.cu", "flash_bwd_hdim128_sm80.cu",
        "flash_bwd_hdim128_causal_sm80.cu", "flash_fwd_split_hdim128_sm80.cu", "flash_fwd_split_hdim128_causal_sm80.cu"}
    nvcc, cxx = sub["args"]["nvcc"], sub["args"]["cxx"]
    assert "-DFLASH_ATTN_HDIMS_MASK=8" in nvcc and "-DFLASH_ATTN_HDIMS_MASK=8" in cxx
    gencode = [nvcc[i + 1] for i, f in enumerate(nvcc) if f == "-gencode"]
    assert gencode == ["arch=compute_90,code=sm_90", "arch=compute_120,code=sm_120",
                       "arch=compute_120,code=compute_120"]
    assert not any(f.startswith("-std") for f in nvcc + cxx)  # torch's cpp_extension adds its standard

    full = _run_setup(root, tmp_path, {"TORCH_CUDA_ARCH_LIST": "9.0", "MAX_JOBS": "2"})
    assert len(full["sources"]) == 73 and "-DFLASH_ATTN_HDIMS_MASK=63" in full["args"]["nvcc"]
    assert sorted(full["sources"][1:]) == sorted(_upstream_kernel_files())

    upstream_list = _run_setup(root, tmp_path, {"MAX_JOBS": "2"})  # no TORCH_CUDA_ARCH_LIST: upstream's 4 archs
    assert [f for f in upstream_list["args"]["nvcc"] if f.startswith("arch=")] == [
        f"arch=compute_{a},code=sm_{a}" for a in (80, 90, 100, 120)]

    bad = _run_setup(root, tmp_path, {"FLASH_ATTN_HDIMS": "100"})
    assert "FLASH_ATTN_HDIMS entry '100'" in bad["error"]
    no_toolkit = _run_setup(root, tmp_path, {}, cuda_home=False)
    assert "no CUDA toolkit found" in no_toolkit["error"]
    cpu_torch = _run_setup(root, tmp_path, {}, cuda_home=False, torch_cuda="")
    assert "is a CPU-only build" in cpu_torch["error"]
