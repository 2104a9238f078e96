"""The cibuildwheel request turned into CIBW_* settings, read back with cibuildwheel's own parsers; the repair check."""

from __future__ import annotations

import fnmatch
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
from cibuildwheel.environment import parse_environment
from cibuildwheel.frontend import BuildFrontendConfig
from cibuildwheel.oci_container import OCIContainerEngineConfig

from builder.core.errors import InspectError, PortabilityError, UsageError
from builder.stages.repair import check_portability, glibc_floor, glibc_floor_of, platform_glibc, portability_report
from builder.toolchain.cibw import EXCLUDED_LIBS, CibwRequest, check_request, cibw_settings, prefetch_argv, process_env

ROOT = Path(__file__).resolve().parent.parent


def _request(tmp_path: Path, **kw: object) -> CibwRequest:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "setup.py").write_text("")
    args = dict(source_dir=src, python="3.12", image="cuda-wheel-builder:manylinux-cuda12.8", engine="podman",
                torch="2.10.0", torch_index="https://download.pytorch.org/whl/cu128", cache_dir=tmp_path / "cache dir",
                out_dir=tmp_path / "out", log_file=tmp_path / "log",
                build_env={"TORCH_CUDA_ARCH_LIST": "8.0;12.0", "NOTE": "a $(rm -rf /) 'b'"})
    args.update(kw)
    return CibwRequest(**args)  # type: ignore[arg-type]


def test_settings_select_one_cpython_in_the_image_without_isolation(tmp_path: Path) -> None:
    s = cibw_settings(_request(tmp_path))
    assert s["CIBW_BUILD"] == "cp312-manylinux_x86_64"
    assert s["CIBW_MANYLINUX_X86_64_IMAGE"] == "cuda-wheel-builder:manylinux-cuda12.8"
    frontend = BuildFrontendConfig.from_config_string(s["CIBW_BUILD_FRONTEND"])
    assert frontend.name == "build" and list(frontend.args) == ["--no-isolation"]


def test_engine_is_offline_with_the_cache_mounted_and_no_host_root(tmp_path: Path) -> None:
    req = _request(tmp_path)
    engine = OCIContainerEngineConfig.from_config_string(cibw_settings(req)["CIBW_CONTAINER_ENGINE"])
    assert engine.name == "podman" and engine.disable_host_mount
    assert engine.create_args == ("--network=none", f"--volume={req.cache_dir}:{req.cache_dir}:rw")
    online_req = _request(tmp_path, network=True, engine="docker")
    online = OCIContainerEngineConfig.from_config_string(cibw_settings(online_req)["CIBW_CONTAINER_ENGINE"])
    assert online.name == "docker" and "--network=none" not in online.create_args


def test_build_env_passes_verbatim_and_our_environment_parses(tmp_path: Path) -> None:
    req = _request(tmp_path)
    s = cibw_settings(req)
    assert s["CIBW_ENVIRONMENT_PASS_LINUX"].split() == ["NOTE", "TORCH_CUDA_ARCH_LIST"]
    assert "rm -rf" not in s["CIBW_ENVIRONMENT_LINUX"]  # never through the bash-evaluated setting
    env = parse_environment(s["CIBW_ENVIRONMENT_LINUX"]).as_dictionary({"PATH": "/usr/bin"})
    assert env["PATH"] == "/usr/local/cuda/bin:/usr/bin" and env["UV_CACHE_DIR"] == str(req.uv_cache)
    proc = process_env(req)
    assert proc["NOTE"] == "a $(rm -rf /) 'b'" and proc["CIBW_BUILD"] == "cp312-manylinux_x86_64"


def test_before_build_installs_the_pin_offline_from_the_cache(tmp_path: Path) -> None:
    req = _request(tmp_path)
    words = shlex.split(cibw_settings(req)["CIBW_BEFORE_BUILD"])
    assert words[:3] == ["uv", "pip", "install"] and "--offline" in words and "--no-index" in words
    assert words[words.index("--find-links") + 1] == str(req.wheels_dir) and "torch==2.10.0" in words
    fetch = prefetch_argv(req)
    assert fetch[fetch.index("--dest") + 1] == str(req.wheels_dir) and "torch==2.10.0" in fetch
    assert fetch[fetch.index("--extra-index-url") + 1] == req.torch_index
    assert "manylinux_2_28_x86_64" in fetch and "manylinux2014_x86_64" in fetch and "manylinux_2_29_x86_64" not in fetch


def test_repair_excludes_torch_cuda_and_driver_libraries(tmp_path: Path) -> None:
    repair = cibw_settings(_request(tmp_path))["CIBW_REPAIR_WHEEL_COMMAND_LINUX"]
    words = shlex.split(repair)
    excluded = [words[i + 1] for i, w in enumerate(words) if w == "--exclude"]
    assert excluded == list(EXCLUDED_LIBS)
    for soname in ("libtorch_cpu.so", "libc10_cuda.so", "libtorch_python.so", "libcudart.so.12", "libcuda.so.1",
                   "libcublasLt.so.12"):
        assert any(fnmatch.fnmatch(soname, p) for p in excluded), soname
    assert words[-3:] == ["-w", "{dest_dir}", "{wheel}"] and words[words.index("--plat") + 1] == "auto"


def test_bad_requests_are_usage_errors(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        check_request(_request(tmp_path, python="three"))
    with pytest.raises(UsageError):
        check_request(_request(tmp_path, build_env={"CIBW_SKIP": "*"}))


def _readelf_floor(path: Path) -> tuple[int, int] | None:
    """What the repair check read with ``readelf -V`` before it parsed the section itself."""
    out = subprocess.run(["readelf", "-V", "-W", str(path)], capture_output=True, text=True, check=True).stdout
    needs = out.split("Version needs section", 1)[-1] if "Version needs section" in out else ""
    found = [(int(a), int(b)) for a, b in re.findall(r"\bGLIBC_(\d+)\.(\d+)(?:\.\d+)?\b", needs)]
    return max(found) if found else None


def test_glibc_floor_and_tags(tmp_path: Path) -> None:
    floor = glibc_floor(Path(sys.executable).resolve())
    assert floor is not None and floor >= (2, 2)
    objects = [Path(sys.executable).resolve(), *sorted(Path(sysconfig.get_config_var("DESTSHARED")).glob("*.so"))[:20]]
    assert len(objects) > 10  # the interpreter and its extension modules (_ssl, _ctypes, zlib …)
    if shutil.which("readelf"):  # read from the bytes (no temp file to leak, no binutils): readelf's answer
        assert [glibc_floor(p) for p in objects] == [_readelf_floor(p) for p in objects]
    with pytest.raises(InspectError, match="not a 64-bit ELF"):
        glibc_floor_of(b"/* GNU ld script */", "libx.so")
    assert platform_glibc("manylinux_2_28_x86_64") == (2, 28) and platform_glibc("manylinux2014_x86_64") == (2, 17)
    assert platform_glibc("linux_x86_64") is None
    # a wheel that claims manylinux_2_5 but holds an object needing a newer glibc is refused
    wheel = tmp_path / "x-1.0-cp311-cp311-manylinux_2_5_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.write(Path(sys.executable).resolve(), "x/_c.so")
    report = portability_report(wheel)
    assert report.glibc_floor == floor and report.vendored == ()
    if floor > (2, 5):
        with pytest.raises(PortabilityError):
            check_portability(report)


def test_the_manylinux_template_takes_the_base_and_the_cuda_as_arguments() -> None:
    from builder.toolchain.images import image_spec

    text = (ROOT / "dockerfiles" / "manylinux-cuda.Dockerfile").read_text()
    assert "ARG BASE_IMAGE" in text and "FROM ${BASE_IMAGE}" in text and "ARG CUDA_VERSION" in text
    for cuda in ("12.8", "12.9", "13.0", "13.2"):
        args = image_spec(cuda).buildargs
        assert args["BASE_IMAGE"] == "quay.io/pypa/manylinux_2_28_x86_64:latest" and args["CUDA_VERSION"] == cuda
        assert f"cuda-nvcc-{cuda.replace('.', '-')}" in args["CUDA_PACKAGES"].split()


def _vendoring_wheel(tmp_path: Path) -> Path:
    """A stand-in for a repair without --exclude: a real ELF object grafted in as tinyext.libs/libtorch_cpu-….so
    (the real library is 500 MB), in a wheel with valid METADATA, so only the vendoring is wrong."""
    wheel = tmp_path / "tinyext-0.1.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    info = "tinyext-0.1.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("tinyext/__init__.py", "")
        zf.write(Path(sys.executable).resolve(), "tinyext.libs/libtorch_cpu-1a2b3c4d.so")
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: tinyext\nVersion: 0.1.0\n\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nTag: cp311-cp311-manylinux_2_28_x86_64\n")
        zf.writestr(f"{info}/RECORD", "")
    return wheel


def test_wheel_vendoring_libtorch_is_refused(tmp_path: Path) -> None:
    report = portability_report(_vendoring_wheel(tmp_path))
    assert report.forbidden == ("tinyext.libs/libtorch_cpu-1a2b3c4d.so",)
    with pytest.raises(PortabilityError) as err:
        check_portability(report)
    assert err.value.exit_code == 13 and "vendors libtorch_cpu-1a2b3c4d.so" in str(err.value)


def test_the_wheelhouse_refuses_to_publish_a_wheel_vendoring_libtorch(tmp_path: Path) -> None:
    """Through the real store: the publish every build, promotion and farm run goes through refuses it (exit 13)
    and leaves the wheelhouse as it was."""
    from builder.index.store import Wheelhouse
    from builder.model.records import BuildRecord

    house = Wheelhouse(tmp_path / "house")
    with pytest.raises(PortabilityError) as err:
        house.publish(_vendoring_wheel(tmp_path), BuildRecord(cache_key="k" * 64))
    assert err.value.exit_code == 13 and "vendors libtorch_cpu-1a2b3c4d.so" in err.value.one_line()
    assert not list((tmp_path / "house").rglob("*.whl"))


def test_cibuildwheel_output_goes_through_the_shared_loop_and_a_failure_is_left_to_the_compile_stage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in for cibuildwheel (no engine, no container): its lines reach the log file after the echoed
    command and reach on_line as the other toolchains' do; without a wheel the result says so (the compile
    stage summarises the log for every toolchain), with one the wheel comes back."""
    from builder.toolchain import cibw

    req = _request(tmp_path)
    script = tmp_path / "cibuildwheel.py"
    script.write_text(
        "import pathlib, sys\nprint('Building cp312-manylinux_x86_64 wheel')\nprint()\n"
        "print('[1/1] c++ -c -c csrc/x.cpp -o x.o', flush=True)\n"
        "if sys.argv[1] == 'ok':\n    (pathlib.Path(sys.argv[2]) / 'tinyext-0.1-cp312-cp312-manylinux_2_28_x86_64.whl')"
        ".write_text('')\nelse:\n    print('csrc/x.cpp:1:1: error: boom')\n    sys.exit(1)\n")
    monkeypatch.setattr(cibw, "fetch_locked", lambda r: 0.0)
    monkeypatch.setattr(cibw.shutil, "which", lambda name, path=None: f"/usr/bin/{name}")
    for outcome in ("fails", "ok"):
        monkeypatch.setattr(cibw, "cibuildwheel_argv", lambda r, o=outcome: [sys.executable, str(script), o,
                                                                            str(r.out_dir)])
        lines: list[str] = []
        result = cibw.build_with_cibuildwheel(req, lines.append)
        assert lines[:2] == ["Building cp312-manylinux_x86_64 wheel", "[1/1] c++ -c -c csrc/x.cpp -o x.o"]
        if outcome == "fails":
            assert result.wheel is None and result.exit_code == 1 and lines[2:] == ["csrc/x.cpp:1:1: error: boom"]
        else:
            assert result.wheel == req.out_dir / "tinyext-0.1-cp312-cp312-manylinux_2_28_x86_64.whl"
    logged = req.log_file.read_text().splitlines()
    assert logged[0].startswith("+ CIBW_PLATFORM=linux CIBW_BUILD=cp312-manylinux_x86_64 ")  # the echoed command
    assert logged[0].endswith(f" {script} fails {req.out_dir}") and logged[1:5] == [
        "Building cp312-manylinux_x86_64 wheel", "", "[1/1] c++ -c -c csrc/x.cpp -o x.o", "csrc/x.cpp:1:1: error: boom"]


def test_an_aarch64_request_builds_in_the_aarch64_image_with_aarch64_wheels(tmp_path: Path) -> None:
    """The settings an arm64 runner gets; on another machine the request is refused (no emulated compile)."""
    from builder.model.platform import AARCH64, X86_64, this_machine

    req = _request(tmp_path, platform=AARCH64, image="cuda-wheel-builder:cuda13.0-aarch64-abc")
    s = cibw_settings(req)
    assert s["CIBW_BUILD"] == "cp312-manylinux_aarch64" and s["CIBW_ARCHS_LINUX"] == "aarch64"
    assert s["CIBW_MANYLINUX_AARCH64_IMAGE"] == "cuda-wheel-builder:cuda13.0-aarch64-abc"
    assert "CIBW_MANYLINUX_X86_64_IMAGE" not in s
    fetch = prefetch_argv(req)
    platforms = [fetch[i + 1] for i, a in enumerate(fetch) if a == "--platform"]
    assert platforms[0] == "manylinux_2_28_aarch64" and "manylinux2014_aarch64" in platforms
    assert not [p for p in platforms if "x86_64" in p]
    x86_fetch = prefetch_argv(_request(tmp_path))
    x86 = [x86_fetch[i + 1] for i, a in enumerate(x86_fetch) if a == "--platform"]
    assert x86[0] == "manylinux_2_28_x86_64" and x86[-1] == "manylinux1_x86_64" and len(x86) == 27  # as before
    if this_machine() == X86_64:
        with pytest.raises(UsageError) as info:
            check_request(req)
        assert "an aarch64 wheel through cibuildwheel needs an aarch64 machine" in info.value.message
        assert "ubuntu-24.04-arm" in (info.value.hint or "")
        check_request(_request(tmp_path))  # x86_64 here: fine
