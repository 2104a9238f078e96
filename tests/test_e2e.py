"""End to end on a tiny CUDA extension of our own: real nvcc compile, real wheel, real inspect, real import
in a clean venv, real publish, real uv and pip installs from the wheelhouse.

Uses this machine's CUDA 13.0 nvcc with torch 2.14.1 (a CUDA 13.0 build) for Python 3.11, which lie on local
disk (/opt/pypi-more), so no large download is needed. Where any of that is missing the test says why it skipped.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from builder.core.uvtool import uv_bin
from builder.toolchain.base import PYTHON_PROBE
from tests.helpers import (
    FIXTURES,
    LOCAL_TORCH_INDEX,
    assert_one_line_error,
    local_cuda_path_missing,
    run_cli,
    run_cli_audited,
)

pytestmark = pytest.mark.e2e

WHEEL = "tinyext-0.1.0+cu13torch2.14-cp311-cp311-linux_x86_64.whl"


def assert_same_wheel(got: Path, want: Path) -> None:
    """sha256 of the two files, and on a difference the members that differ: a short message in a second, never
    pytest's diff of two binary blobs (which took over 20 minutes in difflib, issue 17 case 12)."""
    import hashlib

    def digest(path: Path) -> str:
        return hashlib.sha256(path.read_bytes()).hexdigest()

    if digest(got) == digest(want):
        return
    with zipfile.ZipFile(got) as a, zipfile.ZipFile(want) as b:
        crcs_a = {i.filename: (i.CRC, i.file_size, i.date_time) for i in a.infolist()}
        crcs_b = {i.filename: (i.CRC, i.file_size, i.date_time) for i in b.infolist()}
    differing = sorted(n for n in crcs_a.keys() | crcs_b.keys() if crcs_a.get(n) != crcs_b.get(n))
    pytest.fail(f"{got} differs from {want} (sha256 {digest(got)[:12]} vs {digest(want)[:12]}); "
                f"members that differ: {differing[:10] or 'none (zip metadata only)'}", pytrace=False)


missing = local_cuda_path_missing()
if missing:
    pytestmark = [pytest.mark.e2e, pytest.mark.skip(reason=f"skipped: {missing}")]


@pytest.fixture(scope="module")
def e2e(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """One real build of tinyext shared by the tests below (about a minute)."""
    base = tmp_path_factory.mktemp("e2e")
    env = {"BUILDER_CACHE_DIR": str(base / "cache"), "BUILDER_WHEELHOUSE": str(base / "wheelhouse")}
    args = ["build", "tinyext", "--recipes", str(FIXTURES / "recipes"), "--cuda", "13.0", "--arch", "90",
            "--python", "3.11", "--torch", "2.14.1", "--torch-index", str(LOCAL_TORCH_INDEX), "--toolchain", "host"]
    first = run_cli(*args, env=env)
    return {"base": base, "env": env, "args": args, "first": first}


def test_build_publishes_a_verified_wheel(e2e: dict) -> None:
    first = e2e["first"]
    assert first.code == 0, first.stderr[-3000:]
    house = e2e["base"] / "wheelhouse"
    wheel = house / "wheels" / WHEEL
    assert wheel.is_file()
    # the last line names the wheel's channel, not the combined simple/ (which can swap an env's torch)
    channel = (house.resolve() / "channels" / "cu130torch2.14" / "simple").as_uri()  # through the link
    assert f"(channel: {channel})" in first.stderr and "/simple)" not in first.stderr.replace(channel, ""), first.stderr[-800:]
    # the patch reached the wheel; METADATA carries the label and the torch pin; the record is inside
    with zipfile.ZipFile(wheel) as zf:
        assert "PATCHED = True" in zf.read("tinyext/__init__.py").decode()
        # the recipe's env value reached setup.py byte for byte: no shell ever saw it
        assert zf.read("tinyext/_build_note.txt").decode() == "value with spaces, 'quotes' and $(not a command)"
        info = "tinyext-0.1.0+cu13torch2.14.dist-info"
        metadata = zf.read(f"{info}/METADATA").decode()
        record = json.loads(zf.read(f"{info}/cuda_wheel_builder.json"))
    assert "Version: 0.1.0+cu13torch2.14" in metadata
    assert "Requires-Dist: torch>=2.14.0,<2.15" in metadata
    assert record["toolchain"]["kind"] == "host" and record["toolchain"]["nvcc"].startswith("13.0")
    assert record["patches"][0]["file"] == "0001-mark-patched.patch" and len(record["source"]["sha256"]) == 64
    # test results travel to the wheelhouse record: import passed, kernels skipped with the reason
    published = json.loads((house / "records" / f"{WHEEL}.json").read_text())
    assert published["tests"]["import_status"] == "passed"
    assert published["tests"]["kernel_status"] == "skipped"
    assert "no CUDA GPU visible" in published["tests"]["kernel_reason"] and "sm_90" in published["tests"]["kernel_reason"]
    page = (house / "simple" / "tinyext" / "index.html").read_text()
    assert f"../../wheels/{WHEEL}#sha256=" in page and 'data-requires-python="&gt;=3.9"' in page
    assert "import passed; kernel tests skipped (no CUDA GPU visible" in page
    # issue 55 item 8: the build ends with words and the way forward, not a raw timings dict
    assert "timings: {" not in first.stdout and "time per step: " in first.stdout
    assert "next: builder install tinyext --python <your env's python>" in first.stdout, first.stdout[-800:]


def test_the_builders_nvcc_flags_reach_ptxas_and_the_record(e2e: dict, tmp_path: Path) -> None:
    """ptxas writes its command line into each cubin (.note.nv.tkinfo): the split compilation the record claims is
    the one the wheel's kernels were compiled with."""
    import subprocess

    from builder.core.settings import Settings
    from builder.stages.inspection import find_cuobjdump
    from builder.toolchain.base import PTXAS_THREADS

    house = e2e["base"] / "wheelhouse"
    published = json.loads((house / "records" / f"{WHEEL}.json").read_text())
    assert f"--ptxas-options=--split-compile={PTXAS_THREADS}" in published["toolchain"]["nvcc_flags"]
    assert published["parallel"] == {"max_jobs": published["parallel"]["max_jobs"], "nvcc_threads": 1,
                                     "ptxas_threads": PTXAS_THREADS}  # one arch: no nvcc --threads
    with zipfile.ZipFile(house / "wheels" / WHEEL) as zf:
        so = next(n for n in zf.namelist() if n.endswith(".so"))
        (tmp_path / "ext.so").write_bytes(zf.read(so))
    cuobjdump = find_cuobjdump(Settings.from_env({"BUILDER_CACHE_DIR": str(e2e["base"] / "cache")}))
    subprocess.run([str(cuobjdump), "-xelf", "all", str(tmp_path / "ext.so")], cwd=tmp_path, check=True,
                   capture_output=True)
    (cubin,) = tmp_path.glob("*.sm_90.cubin")
    assert f"-split-compile {PTXAS_THREADS}".encode() in cubin.read_bytes()


def test_inspect_shows_exactly_the_requested_arch(e2e: dict) -> None:
    wheel = e2e["base"] / "wheelhouse" / "wheels" / WHEEL
    result = run_cli("inspect", str(wheel), "--json", env=e2e["env"])
    assert result.code == 0, result.stderr
    report = json.loads(result.stdout)
    (obj,) = report["objects"]
    assert obj["sass"] == ["sm_90"] and obj["ptx"] == []
    assert "libcudart.so.13" in obj["needed"]
    text = run_cli("inspect", str(wheel), env=e2e["env"]).stdout
    assert "SASS: sm_90" in text and "torch>=2.14.0,<2.15" in text
    # the record's toolchain and tests in words (issue 55 item 8), no Python dict
    assert "toolchain host: nvcc 13.0" in text and "{'" not in text
    assert "import passed; kernel skipped (no CUDA GPU visible" in text


def test_uv_and_pip_install_from_the_wheelhouse(e2e: dict, tmp_path: Path) -> None:
    index = (e2e["base"] / "wheelhouse" / "simple").as_uri()
    venv = tmp_path / "venv"
    subprocess.run([uv_bin(), "venv", "--quiet", "--python", "3.11", str(venv)], check=True)
    subprocess.run(
        [uv_bin(), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), "--index-url", index,
         "--extra-index-url", LOCAL_TORCH_INDEX.as_uri(), "--extra-index-url", "https://pypi.org/simple", "tinyext"],
        check=True,
    )
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import importlib.metadata as m, tinyext; print(m.version('tinyext'), tinyext.PATCHED)"],
                         capture_output=True, text=True, check=True).stdout
    assert out.split() == ["0.1.0+cu13torch2.14", "True"]
    pip_venv = tmp_path / "pipvenv"
    subprocess.run(["python3.11", "-m", "venv", str(pip_venv)], check=True)
    subprocess.run([str(pip_venv / "bin" / "pip"), "install", "--quiet", "--no-deps", "--index-url", index,
                    "tinyext==0.1.0"], check=True)
    assert (pip_venv / "lib" / "python3.11" / "site-packages" / "tinyext" / "__init__.py").exists()


def test_unchanged_target_is_not_rebuilt(e2e: dict) -> None:
    again = run_cli(*e2e["args"], env=e2e["env"])
    assert again.code == 0, again.stderr[-2000:]
    assert "unchanged:" in again.stderr and "==> build" not in again.stderr


def test_unchanged_target_starts_no_interpreter_with_torch(e2e: dict, tmp_path: Path) -> None:
    """The no-op reads the build venv's identity from its marker and nvcc's and c++'s answers from the memo
    (issue 19 item 2): neither the venv's python nor any interpreter asked to import torch is started. (A
    subprocess audit hook in the builder process: tests/helpers.py run_cli_audited.)"""
    again, started = run_cli_audited(*e2e["args"], spawns=tmp_path / "spawns.json", env=e2e["env"])
    assert again.code == 0 and "unchanged:" in again.stderr, again.stderr[-2000:]
    venvs = str(e2e["base"] / "cache" / "venvs")
    assert [argv for argv in started if argv and argv[0].startswith(venvs)] == []
    assert [argv for argv in started if PYTHON_PROBE in argv and "--no-torch" not in argv] == []
    # nvcc's and c++'s answers come from the memo; a wrapper script (/usr/local/bin/nvcc here) is asked once a run
    programs = [argv for argv in started if argv and Path(argv[0]).name in ("nvcc", "c++")]
    assert [argv for argv in programs if not Path(argv[0]).read_bytes().startswith(b"#!")] == []


def test_required_kernel_tests_block_publishing_on_a_cpu_machine(e2e: dict) -> None:
    """The planted fault build cannot be kernel-tested here; with --require-kernel-tests nothing is published."""
    house = e2e["base"] / "wheelhouse"
    before = sorted(p.name for p in (house / "wheels").iterdir())
    pages = (house / "simple" / "tinyext" / "index.html").read_text()
    result = run_cli(*e2e["args"], "--test-patch", "0002-break-kernel.patch", "--require-kernel-tests", env=e2e["env"])
    assert_one_line_error(result, "kernel tests skipped", "--require-kernel-tests")
    assert sorted(p.name for p in (house / "wheels").iterdir()) == before
    assert (house / "simple" / "tinyext" / "index.html").read_text() == pages


def test_two_concurrent_builds_of_one_target_build_once(e2e: dict, tmp_path: Path) -> None:
    """Two `builder build` runs of the same target at once into a new wheelhouse: one compiles, the other waits
    on the target's lock and then reuses the published wheel."""
    import os
    import sys

    env = {**os.environ, **e2e["env"], "BUILDER_WHEELHOUSE": str(tmp_path / "wh"), "COLUMNS": "200"}
    procs = [subprocess.Popen([sys.executable, "-m", "builder", *e2e["args"]], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outputs = [p.communicate(timeout=900) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [o[1][-2000:] for o in outputs]
    assert sum("==> build" in o[1] for o in outputs) == 1
    assert sum("unchanged:" in o[1] for o in outputs) == 1
    assert [p.name for p in (tmp_path / "wh" / "wheels").glob("*.whl")] == [WHEEL]
    page = (tmp_path / "wh" / "simple" / "tinyext" / "index.html").read_text()
    assert page.count("<a href=") == 1
    # the second, independent build of the same inputs is byte-for-byte the first one (reproducible wheels)
    first = e2e["base"] / "wheelhouse" / "wheels" / WHEEL
    assert_same_wheel(tmp_path / "wh" / "wheels" / WHEEL, first)


def _wait_for_process_in_session(proc: subprocess.Popen[bytes], names: tuple[str, ...], deadline: float) -> str | None:
    """The name of a process of ``proc``'s session (it started one) among ``names``, once one runs; None if ``proc``
    ends or the deadline passes first."""
    import time

    session = proc.pid
    while time.monotonic() < deadline and proc.poll() is None:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)
                name, sid = fields[0].split("(", 1)[1], int(fields[1].split()[3])
            except (OSError, IndexError, ValueError):
                continue
            if sid == session and name in names:
                return name
        time.sleep(0.1)
    return None


def test_sigkill_during_compile_then_rerun_recovers(e2e: dict, tmp_path: Path) -> None:
    """SIGKILL to the whole build (builder, ninja, nvcc) mid-compile: nothing reaches the wheelhouse, no stale lock
    or half-built tree blocks the next run, which builds and publishes normally."""
    import os
    import signal
    import sys
    import time

    house = tmp_path / "wh"
    env = {**os.environ, **e2e["env"], "BUILDER_WHEELHOUSE": str(house), "COLUMNS": "200"}
    log = tmp_path / "killed.log"
    with log.open("w") as err:
        # the compiler cache off: a build served from it runs no compiler to be killed in
        proc = subprocess.Popen([sys.executable, "-m", "builder", *e2e["args"], "--force", "--compiler-cache", "off"],
                                env=env,
                                stdout=subprocess.DEVNULL, stderr=err, start_new_session=True)
        deadline = time.monotonic() + 300
        while "compiling" not in log.read_text() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        compiler = _wait_for_process_in_session(proc, ("cicc", "ptxas", "nvcc", "cc1plus"), deadline)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert "compiling" in log.read_text()
    assert compiler, "no compiler process was seen running before the kill"
    assert not list(house.glob("wheels/*.whl")) and not (house / "simple").exists()
    rerun = run_cli(*e2e["args"], env={**e2e["env"], "BUILDER_WHEELHOUSE": str(house)})
    assert rerun.code == 0, rerun.stderr[-2000:]
    assert [p.name for p in house.glob("wheels/*.whl")] == [WHEEL]


def test_compiler_cache_reuses_every_object_and_changes_no_byte(e2e: dict, tmp_path: Path) -> None:
    """A forced rebuild (same sources and flags, new build) compiles nothing: ccache, from PyPI or PATH, serves
    nvcc's and c++'s objects from the builder cache, and the wheel is byte-identical; so is the wheel of a build
    with --compiler-cache off (no CCACHE_BASEDIR rewriting: every route names the prefix-mapped paths)."""
    first = e2e["base"] / "wheelhouse" / "wheels" / WHEEL
    assert "compiler cache: ccache" in e2e["first"].stderr, e2e["first"].stderr[-2000:]
    cached = run_cli(*e2e["args"], "--force", env={**e2e["env"], "BUILDER_WHEELHOUSE": str(tmp_path / "a")})
    assert cached.code == 0, cached.stderr[-2000:]
    line = next(x for x in cached.stderr.splitlines() if "compiler cache:" in x and "hits" in x)
    hits = int(line.split("compiler cache:")[1].split("hits")[0].strip())
    assert hits >= 2 and " 0 misses" in line, line  # the .cu and the .cpp
    assert_same_wheel(tmp_path / "a" / "wheels" / WHEEL, first)
    record = json.loads(next((tmp_path / "a" / "records").glob("*.json")).read_text())
    assert record["compiler_cache"]["hits"] == hits and record["compiler_cache"]["misses"] == 0
    plain = run_cli(*e2e["args"], "--force", "--compiler-cache", "off",
                    env={**e2e["env"], "BUILDER_WHEELHOUSE": str(tmp_path / "b")})
    assert plain.code == 0 and "compiler cache:" not in plain.stderr, plain.stderr[-2000:]
    cache_root = str(e2e["base"] / "cache").encode()

    def extension(wheel: Path) -> bytes:
        with zipfile.ZipFile(wheel) as zf:
            return zf.read(next(n for n in zf.namelist() if n.endswith(".so")))

    # the objects' debug info names the C++ source through the builder's -ffile-prefix-map (/build/<source folder>)
    # with and without ccache, never relative to a ccache base dir and never the builder's cache
    plain_so = extension(tmp_path / "b" / "wheels" / WHEEL)
    assert b"/build/tinyext/csrc/binding.cpp" in plain_so and b"../../csrc/binding.cpp" not in extension(first)
    assert cache_root not in plain_so and cache_root not in extension(first)
    assert_same_wheel(tmp_path / "b" / "wheels" / WHEEL, first)


def test_the_same_inputs_under_another_cache_give_the_same_bytes(e2e: dict, tmp_path: Path) -> None:
    """Wheels do not depend on where the builder's cache lives: the build folder, build venv and toolkit are
    renamed inside the objects (-ffile-prefix-map), and the record in the wheel names cache paths relative to
    $BUILDER_CACHE_DIR. A new cache at another, longer path (new venv, empty compiler cache) builds the same wheel."""
    first = e2e["base"] / "wheelhouse" / "wheels" / WHEEL
    elsewhere = tmp_path / "somewhere" / "else" / "entirely"
    again = run_cli(*e2e["args"], env={"BUILDER_CACHE_DIR": str(elsewhere / "cache"),
                                       "BUILDER_WHEELHOUSE": str(elsewhere / "wheelhouse")})
    assert again.code == 0, again.stderr[-2000:]
    assert "compiler cache: 0 hits" in again.stderr  # compiled afresh, not served from the first cache
    second = elsewhere / "wheelhouse" / "wheels" / WHEEL
    assert_same_wheel(second, first)
    with zipfile.ZipFile(second) as zf:
        record = json.loads(zf.read("tinyext-0.1.0+cu13torch2.14.dist-info/cuda_wheel_builder.json"))
    assert record["python"]["python"].startswith("$BUILDER_CACHE_DIR/venvs/build-")
    published = json.loads((elsewhere / "wheelhouse" / "records" / f"{WHEEL}.json").read_text())
    assert published["python"]["python"].startswith(str(elsewhere / "cache"))  # the local record keeps real paths


def test_a_published_build_keeps_its_report_not_its_bulk_and_cache_clean_frees_the_rest(e2e: dict) -> None:
    """After publishing, the build folder keeps the final wheel and reports but not the sources, raw wheel or
    import-test venv (a failed build keeps them: the --require-kernel-tests one above); `builder cache` shows
    where the disk is, `builder cache clean` removes it; the published wheel is untouched. Runs last: it removes
    the module's build venv."""
    cache = e2e["base"] / "cache"
    record = json.loads((e2e["base"] / "wheelhouse" / "records" / f"{WHEEL}.json").read_text())
    workdir = cache / "builds" / f"tinyext-0.1.0-{record['cache_key'][:12]}"
    assert (workdir / "final" / WHEEL).is_file()
    assert not any((workdir / name).exists() for name in ("src", "dist", "test-venv")), sorted(workdir.iterdir())
    shown = run_cli("cache", env=e2e["env"])
    assert shown.code == 0, shown.stderr
    venv_row = next(line for line in shown.stdout.splitlines() if line.startswith("│ venvs"))
    venvs = [p for p in (cache / "venvs").iterdir() if not p.name.endswith(".lock")]  # the build venv(s), as counted
    assert venvs and [c.strip() for c in venv_row.strip("│ ").split("│")][:2] == ["venvs", str(len(venvs))], venv_row
    assert "on disk in all:" in shown.stdout and "free on its filesystem" in shown.stdout
    dry = run_cli("cache", "clean", "venvs", "--dry-run", env=e2e["env"])
    assert dry.code == 0 and "would remove" in dry.stdout and any(v.is_dir() for v in (cache / "venvs").glob("build-*"))
    cleaned = run_cli("cache", "clean", "venvs", "builds", env=e2e["env"])
    assert cleaned.code == 0, cleaned.stderr
    assert not [v for v in (cache / "venvs").glob("build-*") if v.is_dir()] and not list((cache / "builds").iterdir())
    assert (e2e["base"] / "wheelhouse" / "wheels" / WHEEL).is_file()
