"""The inspect stage: which SASS (sm_XX) and PTX (compute_XX) each shared object in a wheel carries.

Uses ``cuobjdump --list-elf/--list-ptx`` (from the toolkit, PATH, or provisioned once from PyPI's
nvidia-cuda-cuobjdump) and ``readelf -d`` for the shared libraries each object needs.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from filelock import FileLock

from builder.core.elf import elf_machine
from builder.core.errors import InspectError
from builder.core.settings import Settings
from builder.core.uvtool import run_uv
from builder.core.wheelfile import parse_wheel_name, read_entries, split_label
from builder.model.arch import Arch
from builder.model.platform import ELF_NAMES, Platform, of_wheel_platform
from builder.model.records import BuildRecord
from builder.model.wheelfacts import Wheel, requires_dist
from builder.stages.finalize import read_build_record, read_metadata
from builder.stages.repair import PortabilityReport, portability_report

_SM_RE = re.compile(r"\.sm_(\d+[af]?)\.(?:cubin|ptx)")


@dataclass(frozen=True)
class SharedObject:
    path: str
    sass: tuple[str, ...]
    ptx: tuple[str, ...]
    needed: tuple[str, ...]
    machine: str = ""  # the CPU its ELF header names (core/elf.py): x86_64, aarch64


@dataclass(frozen=True)
class StableAbiReport:
    """What a stable-ABI wheel's shared objects import: no torch C++ symbol may be among them (only the C shims),
    its tag must be abi3, and abi3audit must find no Python symbol outside the limited API."""

    torch_cxx_imports: tuple[str, ...]  # mangled at::/c10::/torch:: symbols: each one ties the wheel to one torch
    shim_imports: tuple[str, ...]  # the stable C shims it calls (aoti_torch_*, torch_*)
    abi3_tag: bool
    abi3audit: str  # "clean" | the violations | "not run: <why>"

    def problems(self) -> list[str]:
        out = []
        if self.torch_cxx_imports:
            shown = ", ".join(self.torch_cxx_imports[:3]) + (" …" if len(self.torch_cxx_imports) > 3 else "")
            out.append(f"imports {len(self.torch_cxx_imports)} torch C++ symbols ({shown}): not stable-ABI")
        if not self.abi3_tag:
            out.append("its tag is not abi3")
        if self.abi3audit != "clean" and not self.abi3audit.startswith("not run"):
            out.append(f"abi3audit: {self.abi3audit}")
        return out

    def limited_api_problems(self) -> list[str]:
        """For a Python-agnostic per-torch wheel (``[per-torch-abi3]``): only the Python side must be abi3 (tag and
        abi3audit); its torch C++ imports are expected, since it is pinned to one torch minor."""
        out = []
        if not self.abi3_tag:
            out.append("its tag is not abi3")
        if self.abi3audit != "clean" and not self.abi3audit.startswith("not run"):
            out.append(f"abi3audit: {self.abi3audit}")
        return out


@dataclass(frozen=True)
class WheelReport:
    wheel: str
    name: str
    version: str
    tags: tuple[str, ...]
    requires: tuple[str, ...]
    objects: tuple[SharedObject, ...]
    record: BuildRecord | None = field(default=None, compare=False)
    portability: PortabilityReport | None = field(default=None, compare=False)  # shown, not stored in records
    stable_abi: StableAbiReport | None = None  # for a stable-ABI wheel (its record says so): what its .so imports
    # for a per-torch wheel tagged abi3 (its recipe's [per-torch-abi3]): the same imports and abi3audit's verdict,
    # of which only the Python side is checked (torch C++ imports are expected: it is pinned to one torch minor)
    limited_api: StableAbiReport | None = None

    @property
    def sass(self) -> set[str]:
        return {a for o in self.objects for a in o.sass}

    @property
    def ptx(self) -> set[str]:
        return {a for o in self.objects for a in o.ptx}

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["record"] = self.record.to_json() if self.record is not None else None
        data.pop("portability", None)
        return data


def find_cuobjdump(settings: Settings, hints: tuple[Path, ...] = ()) -> Path:
    """A cuobjdump binary; provisioned from PyPI into the tool cache when none is on this machine."""
    for home in hints:
        if (home / "bin" / "cuobjdump").exists():
            return home / "bin" / "cuobjdump"
    if found := shutil.which("cuobjdump"):
        return Path(found)
    for candidate in sorted(Path("/usr/local").glob("cuda*/bin/cuobjdump")):
        return candidate
    tools = settings.cache("tools")
    target = tools / "cuobjdump"
    binary = target / "nvidia" / "cu13" / "bin" / "cuobjdump"
    with FileLock(str(tools / "cuobjdump.lock")):
        if not binary.exists():
            if settings.offline:
                raise InspectError("cuobjdump not found and --offline forbids fetching it", "put cuobjdump on PATH")
            shutil.rmtree(target, ignore_errors=True)
            run_uv(["pip", "install", "--quiet", "--target", str(target), "nvidia-cuda-cuobjdump"],
                   what="fetching cuobjdump")
    return binary


def find_local_cuobjdump(settings: Settings, extra: tuple[Path, ...] = ()) -> Path | None:
    """A cuobjdump already on this machine (PATH, /usr/local/cuda*, the builder's cache, a triton package's copy
    under ``extra`` site-packages), or None: for reports that must not download anything."""
    if found := shutil.which("cuobjdump"):
        return Path(found)
    candidates = [*sorted(Path("/usr/local").glob("cuda*/bin/cuobjdump")),
                  settings.cache_dir / "tools" / "cuobjdump" / "nvidia" / "cu13" / "bin" / "cuobjdump",
                  *sorted(settings.cache_dir.glob("toolkits/*/**/bin/cuobjdump")),
                  *(site / "triton" / "backends" / "nvidia" / "bin" / "cuobjdump" for site in extra)]
    return next((c for c in candidates if c.is_file()), None)


def list_gpu_code(cuobjdump: Path, path: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(SASS, PTX) one shared object carries: (sm_120,), (compute_120,)."""
    found = _inspect_object(cuobjdump, path.name, path)
    return found.sass, found.ptx


def inspect_wheel(wheel: Path, settings: Settings, toolkit_homes: tuple[Path, ...] = ()) -> WheelReport:
    name, version, _, tags = parse_wheel_name(wheel.name)
    entries = read_entries(wheel)
    objects: list[SharedObject] = []
    so_names = sorted(n for n in entries if re.search(r"\.so(\.\d+)*$", n))
    if so_names:
        cuobjdump = find_cuobjdump(settings, toolkit_homes)
        with tempfile.TemporaryDirectory() as tmp:
            for so in so_names:
                local = Path(tmp) / Path(so).name
                local.write_bytes(entries[so])
                objects.append(_inspect_object(cuobjdump, so, local))
    requires = requires_dist(read_metadata(wheel))
    record = read_build_record(wheel)
    stable = None
    limited = None
    if Wheel.of(wheel.name, record).stable:
        stable = stable_abi_report(wheel, {so: entries[so] for so in so_names}, tuple(str(t) for t in tags))
    elif so_names and any(t.abi == "abi3" for t in tags):
        limited = stable_abi_report(wheel, {so: entries[so] for so in so_names}, tuple(str(t) for t in tags))
    return WheelReport(
        wheel=wheel.name,
        name=str(name),
        version=str(version),
        tags=tuple(sorted(str(t) for t in tags)),
        requires=requires,
        objects=tuple(objects),
        record=record,
        portability=portability_report(wheel) if so_names and shutil.which("readelf") else None,
        stable_abi=stable,
        limited_api=limited,
    )


_TORCH_CXX = re.compile(r"^_ZN(?:K)?(?:2at|3c10|5torch)")


def stable_abi_report(wheel: Path, objects: dict[str, bytes], tags: tuple[str, ...]) -> StableAbiReport:
    """The undefined dynamic symbols of each .so (``nm -D --undefined-only``) and abi3audit's verdict."""
    cxx: set[str] = set()
    shims: set[str] = set()
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in objects.items():
            local = Path(tmp) / Path(name).name
            local.write_bytes(data)
            result = subprocess.run(["nm", "-D", "--undefined-only", str(local)], capture_output=True, text=True)
            symbols = [line.split()[-1] for line in result.stdout.splitlines() if line.strip()]
            cxx |= {s for s in symbols if _TORCH_CXX.match(s)}
            shims |= {s.split("@")[0] for s in symbols if s.startswith(("aoti_torch_", "torch_"))}
    return StableAbiReport(torch_cxx_imports=tuple(sorted(cxx)), shim_imports=tuple(sorted(shims)),
                           abi3_tag=any(t.split("-")[1] == "abi3" for t in tags), abi3audit=_abi3audit(wheel))


def _abi3audit(wheel: Path) -> str:
    tool = shutil.which("abi3audit") or str(Path(sys.executable).parent / "abi3audit")
    if not Path(tool).is_file():
        return "not run: abi3audit is not installed (pip install abi3audit)"
    with tempfile.TemporaryDirectory() as tmp:  # abi3audit parses the file name: a variant's label is none of its
        named = Path(tmp) / split_label(wheel.name)[0]  # business, the plain name is what it understands
        named.symlink_to(wheel.resolve())
        result = subprocess.run([tool, "--strict", "--report", str(named)], capture_output=True, text=True)
    try:
        report = json.loads(result.stdout)
    except ValueError:
        return f"not run: abi3audit said {(result.stderr.strip().splitlines() or ['nothing'])[-1]}"
    problems = []
    for spec in report.get("specs", {}).values():
        for item in spec.get("wheel", []):
            res = item.get("result", {})
            symbols = [str(v.get("name", v)) if isinstance(v, dict) else str(v) for v in res.get("non_abi3_symbols", [])]
            if symbols:
                problems.append(f"{item.get('name')}: not in the limited API: {', '.join(symbols[:5])}")
            if res.get("future_abi3_objects") or res.get("is_abi3_baseline_compatible") is False:
                problems.append(f"{item.get('name')}: needs Python {res.get('computed')}, tagged {res.get('baseline')}")
    if result.returncode == 0 and not problems:
        return "clean"
    return "; ".join(problems) or f"exit {result.returncode}: {(result.stderr.strip().splitlines() or [''])[-1]}"


def _inspect_object(cuobjdump: Path, name: str, path: Path) -> SharedObject:
    sass = _list(cuobjdump, "--list-elf", path)
    ptx = _list(cuobjdump, "--list-ptx", path)
    return SharedObject(
        path=name,
        sass=tuple(sorted({f"sm_{a}" for a in sass}, key=_arch_key)),
        ptx=tuple(sorted({f"compute_{a}" for a in ptx}, key=_arch_key)),
        needed=_needed(path),
        machine=elf_machine(path) or "",
    )


def _list(cuobjdump: Path, flag: str, path: Path) -> list[str]:
    result = subprocess.run([str(cuobjdump), flag, str(path)], capture_output=True, text=True)
    text = result.stdout + result.stderr
    if result.returncode != 0 and "does not contain device code" not in text:
        raise InspectError(f"cuobjdump {flag} {path.name} failed: {text.strip()[-200:]}")
    return _SM_RE.findall(result.stdout)


def _needed(path: Path) -> tuple[str, ...]:
    if not shutil.which("readelf"):
        return ()
    result = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True)
    return tuple(re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", result.stdout))


def _arch_key(name: str) -> tuple[int, str]:
    digits = re.search(r"(\d+)([af]?)$", name)
    return (int(digits.group(1)), digits.group(2)) if digits else (0, name)


def verify_archs(report: WheelReport, archs: tuple[Arch, ...]) -> list[str]:
    """Problems with the GPU code in a built wheel: a requested arch missing, or one that was not asked for."""
    problems: list[str] = []
    if not report.objects or not report.sass | report.ptx:
        return [f"{report.wheel} contains no GPU code at all"]
    wanted_sass = {a.sm for a in archs}
    wanted_ptx = {a.compute for a in archs if a.ptx}
    for obj in report.objects:
        if not obj.sass and not obj.ptx:
            continue  # a host-only helper library
        missing = sorted(wanted_sass - set(obj.sass)) + sorted(wanted_ptx - set(obj.ptx))
        if missing:
            problems.append(f"{obj.path} lacks {', '.join(missing)} (has {', '.join(obj.sass + obj.ptx)})")
        extra = sorted(set(obj.sass) - wanted_sass) + sorted(set(obj.ptx) - wanted_ptx)
        if extra:
            problems.append(f"{obj.path} carries {', '.join(extra)}, which was not requested")
    return problems


def verify_platform(report: WheelReport, target: Platform) -> list[str]:
    """Problems with a built wheel's CPU platform: an object for another CPU, or a tag naming another platform."""
    problems = [f"{o.path} is an ELF for {o.machine}, not {target}" for o in report.objects
                if o.machine and o.machine != target.name]
    wrong = [t for t in report.tags if (p := of_wheel_platform(t.split("-")[-1])) is not None and p != target]
    if wrong:
        problems.append(f"its tag {wrong[0]} is not a {target} tag")
    return problems


def render_report(report: WheelReport) -> str:
    lines = [f"{report.wheel}", f"  tags: {', '.join(report.tags)}"]
    lines += [f"  requires: {r}" for r in report.requires]
    for obj in report.objects:
        lines.append(f"  {obj.path}")
        if obj.machine:
            lines.append(f"    machine: {ELF_NAMES.get(obj.machine, obj.machine)}")
        lines.append(f"    SASS: {' '.join(obj.sass) or '-'}")
        lines.append(f"    PTX:  {' '.join(obj.ptx) or '-'}")
        if obj.needed:
            lines.append(f"    needs: {' '.join(obj.needed)}")
    if not report.objects:
        lines.append("  no shared objects (pure Python)")
    if report.portability is not None:
        lines.append(report.portability.render())
    if report.stable_abi is not None:
        st = report.stable_abi
        lines.append(f"  stable ABI: {len(st.torch_cxx_imports)} torch C++ imports, {len(st.shim_imports)} C shim "
                     f"imports; abi3 tag: {'yes' if st.abi3_tag else 'no'}; abi3audit: {st.abi3audit}")
    if report.limited_api is not None:
        la = report.limited_api
        lines.append(f"  abi3 (per torch): abi3 tag: {'yes' if la.abi3_tag else 'no'}; abi3audit: {la.abi3audit}; "
                     f"{len(la.torch_cxx_imports)} torch C++ imports (expected: pinned to its torch minor)")
    if report.record:
        rec = report.record
        lines.append(f"  built by: cuda-wheel-builder {rec.builder_version}, {toolchain_text(rec.toolchain)}")
        if rec.toolchain.get("nvcc_flags"):
            lines.append(f"  nvcc flags: {rec.toolchain['nvcc_flags']}")
        if rec.tests:
            t = rec.tests
            counts = ", ".join(f"{n} {k}" for k, n in t.counts.items())
            where = " on ".join(x for x in (f"torch {t.torch}" if t.torch else "", t.gpu or "") if x)
            lines.append(f"  tests: {t.summary()}" + (f"; {counts}" if counts else "") + (f" ({where})" if where else ""))
    return "\n".join(lines)


def toolchain_text(toolchain: Mapping[str, Any]) -> str:
    """``toolchain host: nvcc 13.0.88 at /usr/local/cuda (host CUDA at /usr/local/cuda)`` from a record's toolchain."""
    kind = toolchain.get("kind") or "?"
    parts = [f"nvcc {toolchain['nvcc']}" if toolchain.get("nvcc") else "",
             f"at {toolchain['cuda_home']}" if toolchain.get("cuda_home") else "",
             f"image {toolchain['image']}" if toolchain.get("image") else ""]
    said = " ".join(p for p in parts if p)
    reason = toolchain.get("reason")
    return f"toolchain {kind}" + (f": {said}" if said else "") + (f" ({reason})" if reason else "")
