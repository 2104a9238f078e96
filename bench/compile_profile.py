#!/usr/bin/env python3
"""Where one CUDA translation unit's compile time goes, and what split compilation and fatbin compression change
(issue 19). Subcommands:

    # 1. the exact nvcc commands torch's cpp_extension ran, read from a builder build log, paths made portable
    python bench/compile_profile.py template --log ~/.cache/cuda-wheel-builder/logs/causal-conv1d-1.7.0-*.log \
        --tu all --out bench/results/nvcc-causal-conv1d-1.7.0.json
    # 2. run one TU's command (with the interpreter whose torch it builds against): variants in a --group run one
    #    after another, groups side by side; a variant is name[=flag,flag][@cores given]
    python bench/compile_profile.py compile --template bench/results/nvcc-causal-conv1d-1.7.0.json \
        --tu causal_conv1d_bwd --sdist causal_conv1d-1.7.0.tar.gz --arch 120 --variant plain \
        --variant split2=--split-compile=2@2 --group plain,split2 --work /tmp/cpl --out bench/results/x.json
    # 3. SASS of two objects: kernels, per-kernel resource usage, instructions
    python bench/compile_profile.py compare a.o b.o
    # 3b. the same, exactly and fast: every cubin's code sections compared byte for byte (CODE_SECTIONS)
    python bench/compile_profile.py same-code a.o b.o   # or two .so files, or two wheels; exit 1 if not
    # 4. fatbins of an object, .so or wheel under each compression mode: sizes (--sizes-only) and, on a GPU,
    #    module load times (bench/h200_fatbin_load.sh)
    python bench/compile_profile.py load --object causal_conv1d-....whl --arch 90 --out load.json

Each compile runs under `nvcc --time` (per-phase wall times: cudafe++, cicc, ptxas, fatbinary, the host compiler),
with wall time, CPU time and peak RSS of the process tree (os.wait4's ru_maxrss — what /usr/bin/time -v prints —
and the sum of the tree's resident sets sampled every 0.5 s, since split compilation may run phases side by side).
`compare` checks the SASS of two objects: same kernels, same register/stack/shared use, identical instructions.
"""
from __future__ import annotations

import argparse
import csv
import ctypes
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tarfile
import threading
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# --- 1. template ---------------------------------------------------------------------------------------------------


def template_from_log(log: Path, tu: str) -> dict[str, Any]:
    """The nvcc argv ninja ran for `tu`, with machine-specific paths replaced by {placeholders}."""
    for line in log.read_text(errors="replace").splitlines():
        m = re.match(r"\[\d+/\d+\] (.*)$", line)
        if not m or f"/{tu} " not in m.group(1) + " " or " -c " not in m.group(1) or "nvcc" not in m.group(1):
            continue
        argv = shlex.split(m.group(1))
        while argv and not argv[0].endswith("nvcc"):
            argv.pop(0)  # a compiler-cache launcher in front
        src = re.search(r"(\S*/src/[^/\s]+)/" + re.escape(tu) + r"\b", m.group(1))
        if not argv or not src:
            continue
        root = src.group(1)
        out: list[str] = []
        for arg in argv[1:]:
            arg = arg.replace(root + "/build/", "{work}/build/").replace(root, "{src}")
            arg = re.sub(r"^-I\S*/site-packages/torch/include", "-I{torch_include}", arg)
            arg = re.sub(r"^-I\S*/include/python3\.\d+$", "-I{python_include}", arg)
            arg = re.sub(r"^-I\S*/venvs/[^/]+/include$", "-I{venv_include}", arg)
            arg = re.sub(r"^-I/\S*cuda\S*/include$", "-I{cuda_include}", arg)
            arg = re.sub(r"arch=compute_\d+a?,code=sm_\d+a?", "arch=compute_{arch},code=sm_{arch}", arg)
            out.append(arg)
        return {"tu": tu, "nvcc": argv[0], "args": out}
    raise SystemExit(f"{log}: no nvcc command for {tu}")


# --- 2. compile ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Measured:
    name: str
    tu: str
    extra: list[str]
    cores_given: int
    rc: int
    wall_s: float
    cpu_s: float
    maxrss_mib: float  # os.wait4: the largest single process of the tree (= /usr/bin/time -v)
    tree_peak_rss_mib: float  # sampled sum over the tree
    phases_s: dict[str, float] = field(default_factory=dict)
    object_bytes: int = 0
    started_s: float = 0.0


def _tree_rss_kib(root: int) -> int:
    """Sum of VmRSS over `root` and its descendants, from /proc."""
    parent: dict[int, int] = {}
    rss: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        parent[int(entry)] = int(fields.get("PPid", "0").strip() or 0)
        rss[int(entry)] = int(fields.get("VmRSS", "0 kB").split()[0]) if "VmRSS" in fields else 0
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        kids = [p for p, pp in parent.items() if pp == pid and p not in tree]
        tree.update(kids)
        frontier.extend(kids)
    return sum(rss.get(p, 0) for p in tree)


def _parse_time_csv(path: Path) -> dict[str, float]:
    """nvcc --time's CSV (source file, phase name, arch, tool, metric, unit): ms per phase, summed by phase name."""
    phases: dict[str, float] = {}
    if not path.exists():
        return phases
    for row in csv.reader(io.StringIO(path.read_text())):
        if len(row) < 5 or not re.match(r"^\s*[\d.]+\s*$", row[-2] if row[-1].strip() == "ms" else row[-1]):
            continue
        value = float((row[-2] if row[-1].strip() == "ms" else row[-1]).strip())
        name = row[1].strip() if len(row) > 1 else row[0]
        phases[name] = round(phases.get(name, 0.0) + value / 1000.0, 2)
    return phases


def run_measured(name: str, argv: list[str], cwd: Path, cores: int, time_csv: Path, obj: Path,
                 t0: float) -> Measured:
    started = time.monotonic()
    log = open(cwd / "nvcc.log", "w")
    proc = subprocess.Popen(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    peak = [0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.5):
            peak[0] = max(peak[0], _tree_rss_kib(proc.pid))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - started
    done.set()
    sampler.join()
    log.close()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Measured(name=name, tu=str(obj.name), extra=[], cores_given=cores, rc=proc.returncode,
                    wall_s=round(wall, 1), cpu_s=round(usage.ru_utime + usage.ru_stime, 1),
                    maxrss_mib=round(usage.ru_maxrss / 1024, 0), tree_peak_rss_mib=round(peak[0] / 1024, 0),
                    phases_s=_parse_time_csv(time_csv), object_bytes=obj.stat().st_size if obj.exists() else 0,
                    started_s=round(started - t0, 1))


def extract_sdist(sdist: Path, work: Path) -> Path:
    with tarfile.open(sdist) as tar:
        top = tar.getnames()[0].split("/")[0]
        if not (work / top).exists():
            tar.extractall(work, filter="data")
    return work / top


def torch_paths() -> dict[str, str]:
    import torch.utils.cpp_extension as ext  # the interpreter running this script holds the torch to build against

    inc = ext.include_paths(device_type="cuda") if "device_type" in ext.include_paths.__code__.co_varnames \
        else ext.include_paths(cuda=True)
    home = ext.CUDA_HOME or os.environ.get("CUDA_HOME", "/usr/local/cuda")
    return {"torch_include": inc[0], "cuda_include": f"{home}/include", "nvcc": f"{home}/bin/nvcc",
            "python_include": sysconfig.get_paths()["include"], "venv_include": f"{sys.prefix}/include"}


def variant_argv(tpl: dict[str, Any], values: dict[str, str], extra: list[str], time_csv: Path) -> list[str]:
    args = [a.format(**values) for a in tpl["args"]]
    return [values["nvcc"], *args, "--time", str(time_csv), *extra]


def cmd_compile(ns: argparse.Namespace) -> int:
    commands = json.loads(ns.template.read_text())["commands"]
    tu = next((t for t in commands if t == ns.tu or Path(t).name == ns.tu or Path(t).stem == ns.tu), None)
    if tu is None:
        raise SystemExit(f"{ns.template}: no command for {ns.tu}; has {sorted(commands)}")
    tpl = commands[tu]
    ns.tu = tu
    src = extract_sdist(ns.sdist, ns.work)
    paths = torch_paths()
    variants: list[tuple[str, list[str], int]] = []
    for spec in ns.variant:  # name[=flags][@cores]
        spec, _, cores = spec.partition("@")
        name, _, flags = spec.partition("=")
        variants.append((name, shlex.split(flags.replace(",", " ")), int(cores or 1)))
    t0 = time.monotonic()
    results: list[Measured] = []
    lock = threading.Lock()

    def one(name: str, extra: list[str], cores: int) -> None:
        work = ns.work / f"{Path(ns.tu).stem}-{name}"
        if work.exists():
            shutil.rmtree(work)
        (work / "build").mkdir(parents=True)
        values = {**paths, "src": str(src), "work": str(work), "arch": ns.arch}
        argv = variant_argv(tpl, values, extra, work / "time.csv")
        obj = Path(argv[argv.index("-o") + 1])
        obj.parent.mkdir(parents=True, exist_ok=True)
        (work / "cmd.sh").write_text(shlex.join(argv) + "\n")
        m = run_measured(name, argv, work, cores, work / "time.csv", obj, t0)
        m = Measured(**{**asdict(m), "extra": extra})
        with lock:
            results.append(m)
        print(json.dumps(asdict(m)), flush=True)

    by_name = {v[0]: v for v in variants}
    # each --group is a chain run in order; chains run side by side
    threads = [threading.Thread(target=lambda chain=chain: [one(*by_name[n]) for n in chain])
               for chain in [g.split(",") for g in (ns.group or [",".join(by_name)])]]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": machine_facts(paths["nvcc"]),
              "tu": tpl["tu"], "arch": ns.arch, "sdist": ns.sdist.name, "results": [asdict(r) for r in results]}
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(r.rc == 0 for r in results) else 1


def machine_facts(nvcc: str) -> dict[str, Any]:
    cpu = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"model name\s*:\s*(.*)", cpu)
    mem = re.search(r"MemTotal:\s*(\d+)", Path("/proc/meminfo").read_text())
    ver = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    return {"cpus": os.cpu_count(), "cpu_model": model.group(1) if model else None,
            "mem_gib": round(int(mem.group(1)) / 2**20, 1) if mem else None, "loadavg_start": os.getloadavg(),
            "nvcc": ver[-1] if ver else None}


# --- compare -------------------------------------------------------------------------------------------------------


def cuobjdump() -> str:
    """cuobjdump, with nvdisasm beside it or on PATH (-sass needs both; triton's nvidia backend ships the pair)."""
    found = shutil.which("cuobjdump")
    if not found:
        raise SystemExit("cuobjdump not found: put a CUDA bin folder (or triton/backends/nvidia/bin) on PATH")
    return found


def res_usage(obj: Path) -> dict[str, str]:
    text = subprocess.run([cuobjdump(), "-res-usage", str(obj)], capture_output=True, text=True, check=True).stdout
    out, name = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function (\S+):", line)
        if m:
            name = m.group(1)
        elif name and "REG:" in line:
            out[name] = line.strip()
            name = None
    return out


def sass_by_function(obj: Path) -> dict[str, str]:
    text = subprocess.run([cuobjdump(), "-sass", str(obj)], capture_output=True, text=True, check=True).stdout
    funcs: dict[str, list[str]] = {}
    cur = None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = m.group(1)
            funcs[cur] = []
        elif cur and re.match(r"\s*/\*[0-9a-f]{4,}\*/", line):
            funcs[cur].append(re.sub(r"\s+", " ", line.strip()))
    return {k: hashlib.sha256("\n".join(v).encode()).hexdigest() for k, v in funcs.items()}, \
        {k: len(v) for k, v in funcs.items()}


def compare(a: Path, b: Path) -> dict[str, Any]:
    ra, rb = res_usage(a), res_usage(b)
    (ha, na), (hb, nb) = sass_by_function(a), sass_by_function(b)
    differ_res = sorted(k for k in ra if rb.get(k) != ra[k])
    differ_sass = sorted(k for k in ha if hb.get(k) != ha[k])
    return {"a": str(a), "b": str(b), "kernels_a": len(ra), "kernels_b": len(rb),
            "same_kernel_names": sorted(ra) == sorted(rb), "resource_usage_differs": len(differ_res),
            "resource_usage_examples": [(k, ra[k], rb.get(k)) for k in differ_res[:3]],
            "sass_identical_functions": len(ha) - len(differ_sass), "sass_differing_functions": len(differ_sass),
            "sass_instructions_a": sum(na.values()), "sass_instructions_b": sum(nb.values())}


def cmd_compare(ns: argparse.Namespace) -> int:
    result = compare(ns.a, ns.b)
    print(json.dumps(result, indent=1))
    if ns.out:
        ns.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


# What the GPU runs: machine code, resource use (.nv.info*: registers, stack, barriers), constants, shared and
# global data. The rest is names and debug data: the symbol table, line info, the embedded PTX text (paths and the
# `_INTERNAL_<hash of the source path>` names differ between build folders) and ptxas's command line (tool note).
CODE_SECTIONS = (".text.", ".nv.info", ".nv.constant", ".nv.shared", ".nv.global", ".nv.local", ".nv.callgraph")
_INTERNAL = re.compile(rb"_INTERNAL_[0-9a-f]{8}_\d+_\w+?_[0-9a-f]{8}")


def code_sections(cubin: Path) -> dict[str, bytes]:
    """The sections that hold what the GPU runs, keyed by name with internal-linkage hashes blanked."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout's builder, any interpreter
    from builder.core.elf import elf_sections

    return {_INTERNAL.sub(b"_INTERNAL_", name.encode()).decode(): data
            for name, data in elf_sections(cubin.read_bytes()).items() if name.startswith(CODE_SECTIONS)}


def same_code(a: Path, b: Path, work: Path) -> dict[str, Any]:
    """Every cubin of `a` against `b`'s of the same name, section by section, over CODE_SECTIONS."""
    ca = {c.name: c for c in cubins_of(a, work / "a")}
    cb = {c.name: c for c in cubins_of(b, work / "b")}
    out: dict[str, Any] = {"a": str(a), "b": str(b), "cubins_a": sorted(ca), "cubins_b": sorted(cb), "cubins": {}}
    for name in sorted(set(ca) & set(cb)):
        sa, sb = code_sections(ca[name]), code_sections(cb[name])
        differ = sorted(k for k in set(sa) | set(sb) if sa.get(k) != sb.get(k))
        out["cubins"][name] = {"code_sections": len(sa), "kernels": sum(k.startswith(".text.") for k in sa),
                               "code_bytes": sum(len(v) for v in sa.values()), "differing_sections": differ}
    out["same_code"] = sorted(ca) == sorted(cb) and all(not c["differing_sections"] for c in out["cubins"].values())
    return out


def cmd_same_code(ns: argparse.Namespace) -> int:
    result = same_code(ns.a, ns.b, ns.work)
    print(json.dumps({k: v for k, v in result.items() if k != "cubins"}
                     | {"kernels": sum(c["kernels"] for c in result["cubins"].values()),
                        "differing": sorted({s for c in result["cubins"].values() for s in c["differing_sections"]})},
                     indent=1))
    if ns.out:
        ns.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["same_code"] else 1


# --- 3. load -------------------------------------------------------------------------------------------------------

FATBIN_VARIANTS = {"default": ["--compress-mode=default"], "size": ["--compress-mode=size"],
                   "speed": ["--compress-mode=speed"], "balance": ["--compress-mode=balance"],
                   "none": ["--compress-mode=none"],
                   "default+compress-all": ["--compress-mode=default", "--compress-all"],
                   "speed+compress-all": ["--compress-mode=speed", "--compress-all"],
                   "balance+compress-all": ["--compress-mode=balance", "--compress-all"],
                   "size+compress-all": ["--compress-mode=size", "--compress-all"]}


def binaries_of(path: Path, work: Path) -> list[Path]:
    """The ELF files to take cubins from: an object or .so as given, or every .so inside a wheel."""
    if path.suffix != ".whl":
        return [path]
    out = []
    with zipfile.ZipFile(path) as whl:
        for name in whl.namelist():
            if name.endswith(".so"):
                dest = work / "so" / Path(name).name
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(whl.read(name))
                out.append(dest)
    return out


def cubins_of(path: Path, work: Path) -> list[Path]:
    """Every cubin inside `path` (one per translation unit), extracted with cuobjdump -xelf."""
    dest = work / "cubins"
    dest.mkdir(parents=True, exist_ok=True)
    cubins: list[Path] = []
    for binary in binaries_of(path, work):
        sub = dest / binary.name
        sub.mkdir(exist_ok=True)
        subprocess.run([cuobjdump(), "-xelf", "all", str(binary.resolve())], cwd=sub, check=True,
                       capture_output=True)
        cubins.extend(sorted(sub.glob("*.cubin")))
    if not cubins:
        raise SystemExit(f"{path}: no cubin inside")
    return cubins


def make_fatbins(cubins: list[Path], arch: str, work: Path) -> dict[str, list[Path]]:
    """Each cubin wrapped by fatbinary under each compression mode, with the options nvcc's fatbinary step gets for
    these builds (nvcc -dryrun): one fatbin per translation unit, as in the built .so."""
    fatbinary = shutil.which("fatbinary") or str(Path(torch_paths()["nvcc"]).parent / "fatbinary")
    out: dict[str, list[Path]] = {}
    for name, flags in FATBIN_VARIANTS.items():
        (work / name).mkdir(parents=True, exist_ok=True)
        made = []
        for i, cubin in enumerate(cubins):
            dest = work / name / f"{i:02d}.fatbin"
            argv = [fatbinary, "-64", "--cmdline=-v  --generate-line-info ", f"--create={dest}",
                    f"--image3=kind=elf,sm={arch},file={cubin}", *flags]
            proc = subprocess.run(argv, capture_output=True, text=True)
            if proc.returncode != 0:
                print(f"fatbinary {name}: {proc.stderr.strip()[:300]}", file=sys.stderr)
                break
            made.append(dest)
        else:
            out[name] = made
    return out


def load_child(repeats: int) -> dict[str, Any]:
    """In this (fresh) process: cuInit + primary context, then `repeats` × (cuModuleLoadData of every fatbin, every
    kernel looked up, cuModuleUnload), each repeat timed as a whole; the first is the cold one."""
    cu = ctypes.CDLL("libcuda.so.1")

    def ok(rc: int, what: str) -> None:
        if rc != 0:
            raise SystemExit(f"{what}: CUresult {rc}")

    ok(cu.cuInit(0), "cuInit")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    ok(cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
    ok(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "retain")
    ok(cu.cuCtxSetCurrent(ctx), "set")
    images = [(ctypes.create_string_buffer(Path(p).read_bytes()), [n.encode() for n in names])
              for p, names in json.loads(Path(os.environ["FATBINS"]).read_text())]
    loads, totals = [], []
    for _ in range(repeats):
        mods = []
        fn = ctypes.c_void_p()
        t = time.perf_counter()
        for buf, _names in images:
            mod = ctypes.c_void_p()
            ok(cu.cuModuleLoadData(ctypes.byref(mod), buf), "cuModuleLoadData")
            mods.append(mod)
        t1 = time.perf_counter()
        for mod, (_buf, names) in zip(mods, images, strict=True):
            for n in names:
                ok(cu.cuModuleGetFunction(ctypes.byref(fn), mod, n), f"get {n!r}")
        t2 = time.perf_counter()
        loads.append((t1 - t) * 1e3)
        totals.append((t2 - t) * 1e3)
        for mod in mods:
            ok(cu.cuModuleUnload(mod), "unload")
    return {"load_ms": loads, "load_and_get_all_ms": totals}


def time_loads(fatbins: list[Path], kernels: list[list[str]], mode: str, processes: int,
               repeats: int) -> dict[str, Any]:
    """`processes` fresh processes, each loading all fatbins `repeats` times (modules + every kernel looked up)."""
    firsts, warm, load_only = [], [], []
    # the fatbin list (kernel names included) goes through a file: as an env value it passes the kernel's limit
    spec_file = fatbins[0].parent / "fatbins-spec.json"
    spec_file.write_text(json.dumps([[str(p), k] for p, k in zip(fatbins, kernels, strict=True)]))
    spec = str(spec_file)
    for _ in range(processes):
        env = {**os.environ, "CUDA_MODULE_LOADING": mode, "FATBINS": spec}
        proc = subprocess.run([sys.executable, __file__, "load", "--child", "--repeats", str(repeats)],
                              env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            return {"error": proc.stderr.strip()[-500:]}
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        firsts.append(r["load_and_get_all_ms"][0])
        warm.extend(r["load_and_get_all_ms"][1:])
        load_only.extend(r["load_ms"])
    return {"first_load_ms_median": round(statistics.median(firsts), 2),
            "first_load_ms_range": [round(min(firsts), 2), round(max(firsts), 2)],
            "repeat_load_ms_median": round(statistics.median(warm), 2) if warm else None,
            "repeat_load_ms_range": [round(min(warm), 2), round(max(warm), 2)] if warm else None,
            "module_load_data_only_ms_median": round(statistics.median(load_only), 2)}


def zipped_size(paths: list[Path]) -> int:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for p in paths:
            z.writestr(p.name, p.read_bytes())
    return len(buf.getvalue())


def cmd_load(ns: argparse.Namespace) -> int:
    if ns.child:
        print(json.dumps(load_child(ns.repeats)))
        return 0
    cubins = cubins_of(ns.object, ns.work)
    kernels = [sorted(res_usage(c)) for c in cubins]
    fatbins = make_fatbins(cubins, ns.arch, ns.work)
    rows: list[dict[str, Any]] = []
    timed: dict[str, list[dict[str, Any]]] = {}  # sha256 of the bytes -> rows already measured
    for name, paths in fatbins.items():
        digest = hashlib.sha256(b"".join(p.read_bytes() for p in paths)).hexdigest()
        base = {"variant": name, "fatbins": len(paths), "fatbin_bytes": sum(p.stat().st_size for p in paths),
                "fatbin_zip_deflated_bytes": zipped_size(paths), "kernels": sum(map(len, kernels)),
                "sha256": digest[:16]}
        if digest in timed:
            rows.extend({**r, **base, "same_bytes_as": r["variant"]} for r in timed[digest])
            continue
        timed[digest] = []
        for mode in ns.modes.split(","):
            row = {**base, "module_loading": mode}
            if not ns.sizes_only:
                row.update(time_loads(paths, kernels, mode, ns.processes, ns.repeats))
            timed[digest].append(row)
            rows.append(row)
            print(json.dumps(row), flush=True)
    report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "input": ns.object.name, "arch": ns.arch,
              "input_bytes": ns.object.stat().st_size, "processes": ns.processes, "repeats_per_process": ns.repeats,
              "rows": rows}
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("template")
    p.add_argument("--log", type=Path, required=True)
    p.add_argument("--tu", action="append", required=True, help="a .cu path as in the log, or all")
    p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("compile")
    p.add_argument("--template", type=Path, required=True)
    p.add_argument("--tu", required=True, help="which of the template's commands (path, file name or stem)")
    p.add_argument("--sdist", type=Path, required=True)
    p.add_argument("--arch", required=True)
    p.add_argument("--variant", action="append", required=True, help="name[=flag,flag][@cores]")
    p.add_argument("--group", action="append", help="a,b,c: variants run one after another; groups side by side")
    p.add_argument("--work", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("compare")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--out", type=Path)
    p = sub.add_parser("same-code", help="cubins of two objects, .so files or wheels: section by section")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--work", type=Path, default=Path("/tmp/same-code"))
    p.add_argument("--out", type=Path)
    p = sub.add_parser("load")
    p.add_argument("--object", type=Path, help="a .o, a .so or a wheel (all its .so files)")
    p.add_argument("--arch", default="90")
    p.add_argument("--modes", default="LAZY,EAGER", help="CUDA_MODULE_LOADING values to time")
    p.add_argument("--sizes-only", action="store_true", help="fatbin sizes only (no GPU needed)")
    p.add_argument("--work", type=Path, default=Path("/tmp/fatbins"))
    p.add_argument("--processes", type=int, default=5)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--child", action="store_true")
    p.add_argument("--out", type=Path)
    ns = parser.parse_args(argv)
    if ns.cmd == "template":
        tus = ns.tu
        if tus == ["all"]:
            tus = sorted(set(re.findall(r"/src/[^/\s]+/(\S+\.cu) ", ns.log.read_text(errors="replace"))))
        commands = {tu: template_from_log(ns.log, tu) for tu in tus}
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text(json.dumps({"log": ns.log.name, "commands": commands}, indent=1) + "\n")
        print(sorted(commands))
        return 0
    return {"compile": cmd_compile, "compare": cmd_compare, "same-code": cmd_same_code,
            "load": cmd_load}[ns.cmd](ns)


if __name__ == "__main__":
    raise SystemExit(main())
