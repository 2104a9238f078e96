"""A recipe's ``[build] cuda-components``: validated in the recipe, provided by each toolchain (pip: cuda-toolkit's
extras in a cache folder of their own; host: headers checked; docker: extra rpms in the image and its tag)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from packaging.version import Version

from builder.core.errors import RecipeError, ToolchainError
from builder.core.settings import Settings
from builder.model.cuda import CudaVersion
from builder.model.cudacomponents import CUDA_COMPONENTS
from builder.model.recipe import load_recipe
from builder.toolchain import pip as pip_toolchain
from builder.toolchain.host import find_host_toolkit
from builder.toolchain.images import DOCKERFILES, LABEL_PACKAGES, image_spec

CUDA13 = CudaVersion.parse("13.0")
RECIPE = """
name = "demo"
versions = ">=1.0"
[build]
{build}
"""


def recipe_with(tmp_path: Path, build: str) -> Path:
    path = tmp_path / "recipes" / "demo" / "recipe.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(RECIPE.format(build=build))
    return path


def settings(tmp_path: Path, offline: bool = False) -> Settings:
    return Settings(cache_dir=tmp_path / "cache", wheelhouse=tmp_path / "wh", recipes_dir=tmp_path,
                    patches_dir=tmp_path, offline=offline)


# ---------------------------------------------------------------- the recipe field


def test_recipe_field_is_a_sorted_tuple_without_repeats(tmp_path: Path) -> None:
    recipe = load_recipe(recipe_with(tmp_path, 'cuda-components = ["cusparse", "cublas", "cusparse"]'))
    assert recipe.cuda_components == ("cublas", "cusparse")
    assert load_recipe(recipe_with(tmp_path, "")).cuda_components == ()


@pytest.mark.parametrize(("value", "needle", "hint"), [
    ('["cublas", "cusparce"]', "field 'build.cuda-components[1]' is not a known CUDA component: 'cusparce'",
     "did you mean 'cusparse'?"),
    ('["CUBLAS"]', "field 'build.cuda-components[0]' is not a known CUDA component: 'CUBLAS'",
     "did you mean 'cublas'?"),
    ('["zzz"]', "field 'build.cuda-components[0]' is not a known CUDA component: 'zzz'",
     f"known: {', '.join(CUDA_COMPONENTS)}"),
    ('[1]', "field 'build.cuda-components[0]' must be a string, not int", None),
    ('"cublas"', "field 'build.cuda-components' must be a list, not str", None),
])
def test_recipe_field_names_file_field_and_the_likely_name(tmp_path: Path, value: str, needle: str,
                                                           hint: str | None) -> None:
    path = recipe_with(tmp_path, f"cuda-components = {value}")
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert info.value.message == f"{path}: {needle}"
    assert info.value.hint == hint


def test_misspelt_key_suggests_cuda_components(tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe(recipe_with(tmp_path, 'cuda-component = ["cublas"]'))
    assert "unknown field 'build.cuda-component'" in info.value.message
    assert info.value.hint == "did you mean 'cuda-components'?"


# ---------------------------------------------------------------- pip: cache folders, requirement, marker

FAKE_NVCC = "#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n"


def fake_toolkit(target: Path, headers: tuple[str, ...] = (), libs: tuple[str, ...] = ("cudart.so.13",)) -> Path:
    """A tree shaped like ``pip install --target`` of cuda-toolkit: nvidia/cu13 with a stand-in nvcc."""
    home = target / "nvidia" / "cu13"
    for name in pip_toolchain.ESSENTIAL + tuple(f"include/{h}" for h in headers):
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(FAKE_NVCC if name == "bin/nvcc" else "")
    (home / "bin" / "nvcc").chmod(0o755)
    (home / "lib").mkdir(exist_ok=True)
    for lib in libs:
        (home / "lib" / f"lib{lib}").write_text("")
    return home


def test_cache_folder_is_keyed_by_the_component_set() -> None:
    assert pip_toolchain.folder_name(CUDA13) == "cuda-13.0"  # the default: the folder it always had
    assert pip_toolchain.folder_name(CUDA13, ("cusparse", "cublas")) == "cuda-13.0+cublas+cusparse"
    assert pip_toolchain.folder_name(CUDA13, ("cublas", "cusparse")) == "cuda-13.0+cublas+cusparse"


def test_toolkits_of_different_sets_do_not_stand_in_for_one_another(tmp_path: Path) -> None:
    cfg = settings(tmp_path)
    plain = tmp_path / "cache" / "toolkits" / "cuda-13.0"
    fake_toolkit(plain)
    (plain / pip_toolchain.MARKER).write_text("{}")
    assert pip_toolchain.cached_home(CUDA13, cfg) == plain / "nvidia" / "cu13"
    assert pip_toolchain.cached_home(CUDA13, cfg, ("cublas",)) is None  # another folder, not provisioned
    with_cublas = tmp_path / "cache" / "toolkits" / "cuda-13.0+cublas"
    fake_toolkit(with_cublas)  # no cublas_v2.h: not healthy
    (with_cublas / pip_toolchain.MARKER).write_text("{}")
    assert pip_toolchain.cached_home(CUDA13, cfg, ("cublas",)) is None
    fake_toolkit(with_cublas, headers=("cublas_v2.h",))
    assert pip_toolchain.cached_home(CUDA13, cfg, ("cublas",)) == with_cublas / "nvidia" / "cu13"
    with pytest.raises(ToolchainError) as info:
        pip_toolchain.provision(CUDA13, settings(tmp_path, offline=True), ("cusparse",))
    assert info.value.message == ("CUDA 13.0 with cusparse is not in the toolkit cache and --offline forbids "
                                  "downloading")
    cached = pip_toolchain.provision(CUDA13, cfg, ("cublas",))
    assert cached.reason == "pip-provisioned from PyPI with cublas (cached)"
    assert pip_toolchain.provision(CUDA13, cfg).reason == "pip-provisioned from PyPI (cached)"


@pytest.mark.parametrize(("components", "folder", "requirement", "reason"), [
    ((), "cuda-13.0", "cuda-toolkit[nvcc,crt,nvvm,cccl,cudart]==13.0.*", "pip-provisioned from PyPI"),
    (("cusparse", "cublas"), "cuda-13.0+cublas+cusparse",
     "cuda-toolkit[nvcc,crt,nvvm,cccl,cudart,cublas,cusparse]==13.0.*",
     "pip-provisioned from PyPI with cublas, cusparse"),
])
def test_provision_installs_the_extras_and_records_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        components: tuple[str, ...], folder: str, requirement: str,
                                                        reason: str) -> None:
    asked: list[list[str]] = []

    def fake_uv(args: list[str], what: str) -> None:
        asked.append(args)
        fake_toolkit(Path(args[args.index("--target") + 1]), headers=("cublas_v2.h", "cusparse.h"),
                     libs=("cudart.so.13", "cublas.so.13", "cublasLt.so.13", "cusparse.so.12"))

    monkeypatch.setattr(pip_toolchain, "run_uv", fake_uv)
    monkeypatch.setattr(pip_toolchain, "check_on_pypi", lambda cuda, settings: None)
    toolkit = pip_toolchain.provision(CUDA13, settings(tmp_path), components)
    assert asked == [["pip", "install", "--quiet", "--target", asked[0][4], requirement]]
    target = tmp_path / "cache" / "toolkits" / folder
    assert toolkit.cuda_home == target / "nvidia" / "cu13" and toolkit.reason == reason
    marker = json.loads((target / pip_toolchain.MARKER).read_text())
    if components:
        assert marker == {"nvcc": "13.0.88", "requirement": requirement, "components": ["cublas", "cusparse"]}
        lib = toolkit.cuda_home / "lib"
        assert {p.name: p.readlink().name for p in lib.glob("*.so")} == {
            "libcudart.so": "libcudart.so.13", "libcublas.so": "libcublas.so.13",
            "libcublasLt.so": "libcublasLt.so.13", "libcusparse.so": "libcusparse.so.12"}
    else:  # exactly what it was before components existed
        assert marker == {"nvcc": "13.0.88", "requirement": requirement}
        assert [p.name for p in (toolkit.cuda_home / "lib").glob("*.so")] == ["libcudart.so"]
    assert toolkit.record() == {"kind": "pip", "cuda_home": str(toolkit.cuda_home), "nvcc": "13.0.88",
                                "reason": reason, "nvcc_flags": " ".join(toolkit.nvcc_flags)}


# ---------------------------------------------------------------- host: headers checked before building


def host_cuda(tmp_path: Path, headers: tuple[str, ...]) -> Path:
    home = tmp_path / "cuda-13.0"
    for name in ("include/cuda_runtime.h", *(f"include/{h}" for h in headers)):
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text("")
    (home / "bin").mkdir()
    (home / "bin" / "nvcc").write_text(FAKE_NVCC)
    (home / "bin" / "nvcc").chmod(0o755)
    return home


def test_host_refuses_a_cuda_home_without_a_components_header(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    home = host_cuda(tmp_path, headers=("cublas_v2.h",))
    monkeypatch.setattr("builder.toolchain.host.Path.glob", lambda self, pattern: iter(()))  # no /usr/local/cuda-*
    env = {"CUDA_HOME": str(home), "PATH": "/nonexistent"}
    monkeypatch.setattr("builder.toolchain.host.candidate_homes", lambda env: [home])
    assert find_host_toolkit(CUDA13, env, components=("cublas",)).cuda_home == home
    assert find_host_toolkit(CUDA13, env).cuda_home == home
    with pytest.raises(ToolchainError) as info:
        find_host_toolkit(CUDA13, env, components=("cublas", "cusparse"))
    assert info.value.message == (f"--toolchain host: CUDA 13.0 at {home} lacks cusparse (include/cusparse.h), "
                                  "which the recipe's [build] cuda-components asks for")
    assert info.value.hint == ("install cuda-libraries-dev-13-0, or just libcusparse-dev-13-0 (rpm: "
                               "libcusparse-devel-13-0); or use --toolchain pip or docker")
    with pytest.raises(ToolchainError) as info:
        find_host_toolkit(CudaVersion.parse("12.8"), env, components=("cusparse",))
    assert "no CUDA 12.8 toolkit" in info.value.message  # another CUDA: the old message


def test_selection_passes_components_to_every_toolchain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """auto on a host CUDA 13.0 without cusparse.h falls through to the pip toolkit with cusparse; ``plan``'s probe
    looks for that toolkit's own cache folder."""
    from builder.toolchain import container as docker_toolchain
    from builder.toolchain import host, select
    from builder.toolchain.base import CudaToolkit

    home = host_cuda(tmp_path, headers=())
    monkeypatch.setattr(host, "candidate_homes", lambda env: [home])
    monkeypatch.setattr(docker_toolchain, "connect", lambda env, timeout=3: None)
    asked: list[tuple[str, ...]] = []

    def provision(cuda: CudaVersion, cfg: Settings, components: tuple[str, ...] = ()) -> CudaToolkit:
        asked.append(components)
        return CudaToolkit("pip", tmp_path / "pip-home", Version("13.0.88"))

    monkeypatch.setattr(select.pip_toolchain, "provision", provision)
    cfg = settings(tmp_path)
    plain = select.select_toolkit("auto", CUDA13, cfg, {})
    assert plain.toolkit is not None and plain.toolkit.kind == "host" and asked == []
    choice = select.select_toolkit("auto", CUDA13, cfg, {}, components=("cusparse",))
    assert choice.toolkit is not None and choice.toolkit.kind == "pip" and asked == [("cusparse",)]
    assert "lacks cusparse (include/cusparse.h)" in choice.toolkit.reason
    with pytest.raises(ToolchainError, match="lacks cusparse"):
        select.select_toolkit("host", CUDA13, cfg, {}, components=("cusparse",))
    select.select_toolkit("pip", CUDA13, cfg, {}, components=("cublas",))
    assert asked[-1] == ("cublas",)
    probe = select.probe_build_here("pip", CUDA13, cfg, {}, components=("cublas",))
    assert probe.text() == ("yes: pip toolchain (CUDA 13.0 from PyPI, not yet provisioned: about 100 MB on the "
                            "first build)")
    cached = tmp_path / "cache" / "toolkits" / "cuda-13.0+cublas"
    fake_toolkit(cached, headers=("cublas_v2.h",))
    (cached / pip_toolchain.MARKER).write_text("{}")
    probe = select.probe_build_here("pip", CUDA13, cfg, {}, components=("cublas",))
    assert probe.text() == f"yes: pip toolchain (CUDA 13.0 from PyPI, cached at {cached / 'nvidia' / 'cu13'})"


# ---------------------------------------------------------------- docker: extra rpms, tag and labels


def test_docker_image_without_extra_packages_is_the_image_it_was() -> None:
    plain = image_spec("13.0")
    assert "EXTRA_PACKAGES" not in plain.buildargs
    assert plain.dockerfile_text() == (DOCKERFILES / "manylinux-cuda.Dockerfile").read_bytes()
    assert LABEL_PACKAGES not in plain.labels()
    # cublas, cusparse, … are in every image already: asking for them changes nothing
    for cuda in ("12.8", "12.9", "13.0", "13.2"):
        assert image_spec(cuda, components=("cublas", "cufft", "curand", "cusolver", "cusparse", "nvrtc", "nvtx",
                                            "profiler")) == image_spec(cuda)


def test_docker_extra_packages_are_a_build_argument_hashed_into_the_tag() -> None:
    plain = image_spec("12.8")
    spec = image_spec("12.8", components=("nvjitlink", "cublas"))
    assert spec.buildargs == plain.buildargs | {"EXTRA_PACKAGES": "libnvjitlink-devel-12-8"}
    assert spec.tag.startswith("cuda-wheel-builder:cuda12.8-") and spec.tag != plain.tag
    assert spec.labels()[LABEL_PACKAGES] == "libnvjitlink-devel-12-8"
    assert spec.dockerfile_sha256 != plain.dockerfile_sha256
    text = spec.dockerfile_text().decode()  # the one template installs them when the argument is set
    assert "ARG EXTRA_PACKAGES" in text
    assert "dnf install -y --setopt=install_weak_deps=False ${EXTRA_PACKAGES}" in text
    other_base = image_spec("12.8", "localhost/stand-in", components=("nvjitlink",))
    assert other_base.buildargs == spec.buildargs | {"BASE_IMAGE": "localhost/stand-in"}
    assert other_base.tag != spec.tag
    assert image_spec("13.2", components=("nvjitlink",)).buildargs["EXTRA_PACKAGES"] == "libnvjitlink-devel-13-2"


# ---------------------------------------------------------------- a real provisioning (PyPI)

PROBE = "#include <cusparse.h>\n#include <cublas_v2.h>\nint main() { cublasHandle_t b; cusparseHandle_t s; " \
        "(void)b; (void)s; return 0; }\n"


@pytest.mark.network
def test_pip_toolkit_with_cublas_and_cusparse_has_their_headers(tmp_path: Path) -> None:
    """cuda-toolkit 13.0 with the cublas and cusparse extras from PyPI: g++ finds both headers (no CUDA build)."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("no g++ here")
    cfg = settings(tmp_path)
    toolkit = pip_toolchain.provision(CUDA13, cfg, ("cusparse", "cublas"))
    assert toolkit.cuda_home == tmp_path / "cache" / "toolkits" / "cuda-13.0+cublas+cusparse" / "nvidia" / "cu13"
    assert toolkit.reason == "pip-provisioned from PyPI with cublas, cusparse"
    assert (toolkit.cuda_home / "lib" / "libcublas.so").resolve().name.startswith("libcublas.so.")
    probe = tmp_path / "probe.cpp"
    probe.write_text(PROBE)
    result = subprocess.run([gxx, "-fsyntax-only", f"-I{toolkit.cuda_home / 'include'}", str(probe)],
                            check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    plain_home = tmp_path / "cache" / "toolkits" / "cuda-13.0"
    assert not plain_home.exists()  # the default toolkit is another folder, untouched
    again = pip_toolchain.provision(CUDA13, cfg, ("cublas", "cusparse"))
    assert again.cuda_home == toolkit.cuda_home and again.reason.endswith("(cached)")


ATEN_PROBE = "#include <ATen/cuda/CUDAContext.h>\nint main() { return 0; }\n"


@pytest.mark.network
def test_aten_cuda_context_needs_cublas_cusolver_and_cusparse(tmp_path: Path) -> None:
    """The case that made the field: a .cpp including <ATen/cuda/CUDAContext.h> (torch's CUDA headers from the
    local CUDA 13.0 torch wheel) finds every CUDA header it includes in the pip toolkit with the three components."""
    import sysconfig
    import zipfile

    from tests.helpers import LOCAL_TORCH_INDEX

    wheels = sorted((LOCAL_TORCH_INDEX.parent / "files").glob("torch-*-manylinux*_x86_64.whl"))
    gxx = shutil.which("g++")
    if not wheels or gxx is None:
        pytest.skip(f"no CUDA torch wheel beside {LOCAL_TORCH_INDEX}, or no g++")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        wheel.extractall(tmp_path / "torch", [n for n in wheel.namelist() if n.startswith("torch/include/")])
    include = tmp_path / "torch" / "torch" / "include"
    toolkit = pip_toolchain.provision(CUDA13, settings(tmp_path), ("cublas", "cusolver", "cusparse"))
    probe = tmp_path / "aten.cpp"
    probe.write_text(ATEN_PROBE)
    flags = ["-std=c++20", "-fsyntax-only", f"-I{include}", f"-I{include / 'torch/csrc/api/include'}",
             f"-I{toolkit.cuda_home / 'include'}", f"-I{sysconfig.get_paths()['include']}"]
    result = subprocess.run([gxx, *flags, str(probe)], check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
