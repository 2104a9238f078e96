"""What a user's Python environment holds, asked from inside it: ``probe_env(python, packages) -> EnvReport``.

The questions run in that environment's own interpreter (``builder/probes/env.py``, stdlib only), because the
answers (which torch, which GPUs it sees, which function transformers bound) exist only there. The probe's JSON is
parsed here, in ``_parse``, and nowhere else; everything past this module sees frozen dataclasses.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from packaging.utils import canonicalize_name

from builder.core.errors import ToolchainError, UsageError
from builder.core.smallrun import run_small
from builder.model.platform import Platform, parse_platform
from builder.stages.finalize import RECORD_FILE
from builder.user import probecache
from builder.user.interpreter import cannot_run_cure, interpreter_argv, resolve_interpreter
from builder.user.probes import script

DEFAULT_TIMEOUT_S = 300.0  # importing torch and transformers from a cold disk can take a minute
PROBE_LIMIT = 16 << 20  # bytes the env probe may print (its JSON is some KiB; stderr alike)
GDN_ROLES = ("causal_conv1d_fn", "causal_conv1d_update", "chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule")
# The functions a Mamba-2 mixer (Mamba2, Bamba, Falcon-H1, GraniteMoeHybrid, Nemotron-H, Zamba2) calls, by the name
# causal_conv1d / mamba_ssm give them (transformers 5.15+ holds the last three as mamba2_selective_state_update,
# mamba2_chunk_scan, mamba2_split_conv1d_scan_combined).
MAMBA2_ROLES = ("causal_conv1d_fn", "causal_conv1d_update", "selective_state_update", "mamba_chunk_scan_combined",
                "mamba_split_conv1d_scan_combined")
FAMILY_ROLES = {"GatedDeltaNet": GDN_ROLES, "Mamba2": MAMBA2_ROLES}
BindingKind = Literal["kernel", "hub kernel", "torch fallback", "absent"]


@dataclass(frozen=True)
class PackageSpec:
    """A distribution to ask about and the modules that must import for it to count as working."""

    distribution: str
    imports: tuple[str, ...] = ()

    @classmethod
    def from_recipe(cls, recipe: Any) -> PackageSpec:
        """From a ``builder.model.recipe.Recipe``: its name and its ``[test] imports``."""
        return cls(recipe.name, tuple(recipe.imports))


@dataclass(frozen=True)
class PythonInfo:
    version: str  # 3.12.3
    minor: str  # 3.12
    executable: Path
    implementation: str  # cpython
    is_venv: bool
    prefix: Path
    base_prefix: Path
    purelib: Path
    platlib: Path
    machine: str  # x86_64
    glibc: str | None  # 2.36; None on musl or non-Linux
    tags: tuple[str, ...]  # wheel tags this interpreter accepts, best first (cp312-cp312-manylinux_2_36_x86_64, ...)
    tags_source: Literal["packaging", "computed"]  # packaging.tags in that env, or the probe's own computation

    @property
    def platform(self) -> Platform | None:
        """The env's CPU platform (its ``uname -m``); None for one the builder makes no wheels for."""
        return known_platform(self.machine)


def known_platform(machine: str) -> Platform | None:
    """``aarch64``/``arm64`` → AARCH64, ``x86_64``/``amd64`` → X86_64; None for any other machine (ppc64le)."""
    try:
        return parse_platform(machine)
    except UsageError:
        return None


@dataclass(frozen=True)
class GpuDevice:
    index: int
    name: str
    capability: tuple[int, int]

    @property
    def sm(self) -> str:
        """``"120"`` for compute capability 12.0 (the form ``--arch`` takes)."""
        return f"{self.capability[0]}{self.capability[1]}"

    @property
    def cc(self) -> int:
        """Compute capability as one number: 12.0 → 120."""
        return self.capability[0] * 10 + self.capability[1]


@dataclass(frozen=True)
class TorchInfo:
    installed: bool  # a torch distribution is installed (it may still fail to import: see error)
    version: str | None  # torch.__version__: 2.11.0+cu128 (PyPI's 2.10.0 says 2.10.0+cu128 too)
    distribution: str | None  # the installed distribution's version, what pins compare: 2.10.0 from PyPI
    cuda: str | None  # torch.version.cuda; None for a CPU build
    file: Path | None
    cuda_available: bool
    device_count: int
    devices: tuple[GpuDevice, ...]
    arch_list: tuple[str, ...]  # torch.cuda.get_arch_list(): sm_90, compute_90, ... (empty for a CPU build)
    error: str | None  # import or CUDA query failure, short
    dependents: tuple[str, ...] = ()  # installed distributions pinning torch: "torchvision (torch==2.14.1)"

    @property
    def importable(self) -> bool:
        return self.version is not None and self.file is not None


@dataclass(frozen=True)
class ImportCheck:
    module: str
    ok: bool
    file: Path | None
    error: str | None  # "ImportError: ...undefined symbol: ..." (the last few hundred characters)
    messages: tuple[str, ...] = ()  # warnings and log records (WARNING and up) emitted while importing it


@dataclass(frozen=True)
class PackageReport:
    distribution: str
    installed: bool
    version: str | None  # 1.7.0+cu130torch2.11
    local: str | None  # cu130torch2.11
    location: Path | None
    requires_torch: tuple[str, ...]  # its Requires-Dist lines on torch, as written
    shared_objects: tuple[Path, ...]  # absolute paths of its *.so files (for cuobjdump)
    build_record: Mapping[str, object] | None  # our record (finalize.RECORD_FILE) in its .dist-info, if built here
    imports: tuple[ImportCheck, ...]

    @property
    def imports_ok(self) -> bool:
        return self.installed and all(i.ok for i in self.imports)

    @property
    def built_by_us(self) -> bool:
        return self.build_record is not None


@dataclass(frozen=True)
class HubOption:
    """The Hugging Face hub kernel that transformers runs instead of a function or layer in a model loaded with
    ``use_kernels=True`` (with a usable ``kernels`` package): someone else's build, not this farm's wheel."""

    layer: str  # the name transformers looks up: "chunk_gated_delta_rule", "Qwen3_5GatedDeltaNet"
    repos: tuple[tuple[str, tuple[str, ...]], ...]  # ("kernels-community/fla (version 3)", ("cuda", "rocm", "xpu"))
    text: str  # "kernels-community/fla (version 3) on cuda, rocm, xpu"


@dataclass(frozen=True)
class KernelBinding:
    """What one of transformers' GatedDeltaNet or Mamba-2 functions is really bound to after import."""

    role: str  # one of GDN_ROLES or MAMBA2_ROLES
    kind: BindingKind
    text: str  # "kernel (causal-conv1d 1.7.0+cu130torch2.11: causal_conv1d....causal_conv1d_fn from /...py)"
    module: str | None
    qualname: str | None
    file: Path | None
    package: str | None  # the distribution a kernel comes from
    package_version: str | None
    attribute: str | None  # the modeling module's name that holds it
    wrapper: str | None  # "use_kernel_func_from_hub_with_fallback" (5.15+) or None (older: plain import)
    fallback_warning: str | None  # torch fallback only: "at first call" (5.17+), "none (silent)", "at layer init"
    hub: HubOption | None = None  # what use_kernels=True would run instead (5.15+ with a usable kernels package)


@dataclass(frozen=True)
class ModelKernels:
    module: str  # transformers.models.qwen3_next.modeling_qwen3_next
    error: str | None  # the modeling module failed to import
    layer_class: str | None  # Qwen3NextGatedDeltaNet, Mamba2Mixer
    functions: tuple[KernelBinding, ...]  # in FAMILY_ROLES[family] order; empty when the module failed to import
    is_fast_path_available: bool | None  # the module's own flag (transformers <= 5.14), else None
    fast_path: bool  # all of them bound to kernels
    import_messages: tuple[str, ...]  # warnings and log records emitted while importing it
    family: str = "GatedDeltaNet"  # or "Mamba2"
    layer_hub: HubOption | None = None  # a hub kernel for the whole layer class (use_kernels=True), e.g. on sm_121

    @property
    def short(self) -> str:
        """``qwen3_next`` for transformers.models.qwen3_next.modeling_qwen3_next."""
        return self.module.rsplit(".", 1)[-1].removeprefix("modeling_")

    def function(self, role: str) -> KernelBinding:
        return next(f for f in self.functions if f.role == role)


@dataclass(frozen=True)
class HubKernels:
    kernels_version: str | None
    usable: bool  # transformers accepts the installed `kernels` (only used with use_kernels=True)
    enabled_by_env: bool | None  # USE_HUB_KERNELS


@dataclass(frozen=True)
class FlashAttention2:
    """Whether transformers' ``attn_implementation="flash_attention_2"`` would load the installed flash-attn."""

    loads: bool  # transformers accepts it, its extension imports, the GPUs are sm_80+
    reasons: tuple[str, ...]  # why not (every one found), empty when it loads
    version: str | None  # the installed flash-attn, None when not installed
    transformers_says: bool | None  # is_flash_attn_2_available() (what transformers checks: presence and version)
    kernels_fallback: bool | None  # transformers would take kernels' hub build of FA2 instead (5.2x)
    built_head_dims: tuple[int, ...] | None  # a farm subset build's head dims (flash_attn_2_cuda.built_head_dims)


@dataclass(frozen=True)
class TransformersInfo:
    installed: bool
    version: str | None
    error: str | None
    hub_kernels: HubKernels | None
    models: tuple[ModelKernels, ...]  # the GatedDeltaNet modeling modules this transformers has
    missing_models: tuple[str, ...]  # those it does not have (names differ across 5.x)
    import_messages: tuple[str, ...]
    mamba2: tuple[ModelKernels, ...] = ()  # the Mamba-2 mixers' modeling modules (Mamba2 and its hybrids) it has
    missing_mamba2: tuple[str, ...] = ()
    flash_attention_2: FlashAttention2 | None = None  # None: transformers not installed (or an older probe)

    @property
    def families(self) -> tuple[tuple[str, tuple[ModelKernels, ...]], ...]:
        """(family, its modeling modules) for each family this transformers has."""
        return tuple((name, ms) for name, ms in (("GatedDeltaNet", self.models), ("Mamba2", self.mamba2)) if ms)


@dataclass(frozen=True)
class EnvReport:
    python: PythonInfo
    torch: TorchInfo
    packages: tuple[PackageReport, ...]
    transformers: TransformersInfo
    errors: tuple[str, ...]  # probe sections that crashed (a bug or a hostile package), others still filled in
    cached_at: float | None = None  # the answer remembered from a probe at this time (user/probecache.py), not asked

    def package(self, distribution: str) -> PackageReport:
        """The report on ``distribution`` (any spelling: causal_conv1d, Causal-Conv1d); KeyError if not asked."""
        want = canonicalize_name(distribution)
        for p in self.packages:
            if canonicalize_name(p.distribution) == want:
                return p
        raise KeyError(distribution)


def probe_env(
    python: Path,
    packages: Iterable[PackageSpec] = (),
    *,
    timeout: float = DEFAULT_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    memo: Path | None = None,
    refresh: bool = False,
) -> EnvReport:
    """Run the env probe with ``python`` (an interpreter, or a venv folder) and return what it found.

    ``env`` is the probe's environment (default: this process's), so PYTHONPATH and CUDA_VISIBLE_DEVICES count.
    ``memo`` (a folder): a repeat on an unchanged env reads the answer remembered there (``cached_at``;
    user/probecache.py), unless ``refresh``. UsageError: no ``python``; ToolchainError: it cannot run the probe.
    """
    interpreter = resolve_interpreter(python)
    spec = {"packages": [{"distribution": p.distribution, "imports": list(p.imports)} for p in packages],
            "record_file": RECORD_FILE}
    runner = interpreter_argv(interpreter, env)
    environ = dict(os.environ if env is None else env)
    slot = probecache.slot(memo, runner, interpreter, spec, script("env"), environ) if memo is not None else None
    found = slot.recall() if slot is not None and not refresh else None
    if found is not None:
        try:
            return dataclasses.replace(_parse(json.loads(found[0])), cached_at=found[1])
        except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):
            pass  # an entry of another builder's shape: probed again and written over
    report, output = _probe(interpreter, runner, spec, timeout, environ)
    if slot is not None and not report.errors and not (report.torch.installed and report.torch.error):  # else asked again
        slot.remember(output)
    return report


def _probe(interpreter: Path, runner: list[str], spec: Any, timeout: float, environ: dict[str, str]) -> tuple[EnvReport, str]:
    argv = [*runner, str(script("env")), json.dumps(spec)]  # → (what the probe found, its JSON text)
    try:  # bounded: an interpreter that floods stdout is stopped at PROBE_LIMIT bytes, never read whole
        result = run_small(argv, limit=PROBE_LIMIT, timeout_s=timeout, env=environ, merge=False)
    except OSError as e:
        raise ToolchainError(f"Python {interpreter} cannot run: {e.strerror or e}", cannot_run_cure(interpreter)) from e
    if result.timed_out:
        raise ToolchainError(f"Python {interpreter} did not finish the environment probe within {timeout:.0f} s",
                             "check that importing torch works there; a hung CUDA driver is a common cause")
    if result.overflowed:
        raise ToolchainError(f"Python {interpreter} printed more than {PROBE_LIMIT} bytes answering the environment "
                             "probe; stopped", "give a working Python interpreter (VENV/bin/python, or a venv folder)")
    if result.code != 0:
        under = f" under {Path(runner[0]).name}" if len(runner) > 1 else ""
        cure = (f"check that it starts: {shlex.join([*runner, '-c', 'pass'])}" + (
            "; set QEMU_LD_PREFIX to that env's sysroot (the folder holding its lib/ld-linux-*.so.1)" if under else ""))
        raise ToolchainError(f"Python {interpreter} failed the environment probe{under} (exit {result.code}): "
                             f"{_last_line(result.errors)}", cure)
    try:
        return _parse(json.loads(result.output)), result.output
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError) as e:
        raise ToolchainError(f"Python {interpreter}: the environment probe's answer is unreadable "
                             f"({type(e).__name__}: {str(e)[:200]}); stderr: {_last_line(result.errors)}",
                             "give a working Python interpreter (VENV/bin/python, or a venv folder)") from e


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][-300:] if lines else "(no output)"


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def _parse(data: dict[str, Any]) -> EnvReport:
    """The probe's JSON → EnvReport; the only place that knows its field names."""
    missing = [k for k in ("python", "torch", "packages", "transformers") if data.get(k) is None]
    if missing:
        raise ValueError(f"sections {missing} missing; probe errors: {data.get('errors')}")
    py, tc, tf = data["python"], data["torch"], data["transformers"]
    python = PythonInfo(
        version=py["version"], minor=py["minor"], executable=Path(py["executable"]),
        implementation=py["implementation"], is_venv=bool(py["is_venv"]), prefix=Path(py["prefix"]),
        base_prefix=Path(py["base_prefix"]), purelib=Path(py["purelib"]), platlib=Path(py["platlib"]),
        machine=py["machine"], glibc=py["glibc"], tags=tuple(py["tags"]), tags_source=py["tags_source"],
    )
    torch = TorchInfo(
        installed=bool(tc["installed"]), version=tc["version"], distribution=tc.get("distribution"), cuda=tc["cuda"],
        file=_path(tc["file"]),
        cuda_available=bool(tc["cuda_available"]), device_count=int(tc["device_count"]),
        devices=tuple(GpuDevice(d["index"], d["name"], (d["capability"][0], d["capability"][1]))
                      for d in tc["devices"]),
        arch_list=tuple(tc["arch_list"]), error=tc["error"], dependents=tuple(tc.get("dependents") or ()),
    )
    packages = tuple(
        PackageReport(
            distribution=p["distribution"], installed=bool(p["installed"]), version=p["version"], local=p["local"],
            location=_path(p["location"]), requires_torch=tuple(p["requires_torch"]),
            shared_objects=tuple(Path(s) for s in p["shared_objects"]), build_record=p["build_record"],
            imports=tuple(ImportCheck(i["module"], bool(i["ok"]), _path(i["file"]), i["error"], tuple(i["messages"]))
                          for i in p["imports"]),
        )
        for p in data["packages"]
    )
    hub = tf.get("hub_kernels")
    transformers = TransformersInfo(
        installed=bool(tf["installed"]), version=tf["version"], error=tf["error"],
        hub_kernels=HubKernels(hub["kernels_version"], bool(hub["usable"]), hub["enabled_by_env"]) if hub else None,
        models=tuple(_model(m) for m in tf["models"] if m["exists"]),
        missing_models=tuple(m["module"] for m in tf["models"] if not m["exists"]),
        import_messages=tuple(tf["import_messages"]),
        mamba2=tuple(_model(m) for m in tf.get("mamba2", ()) if m["exists"]),
        missing_mamba2=tuple(m["module"] for m in tf.get("mamba2", ()) if not m["exists"]),
        flash_attention_2=_fa2(tf.get("flash_attention_2")),
    )
    return EnvReport(python, torch, packages, transformers, tuple(data["errors"]))


def _model(m: dict[str, Any]) -> ModelKernels:
    family = m.get("family", "GatedDeltaNet")
    functions = tuple(
        KernelBinding(
            role=role, kind=f["kind"], text=f["text"], module=f["module"], qualname=f["qualname"],
            file=_path(f["file"]), package=f["package"], package_version=f["package_version"],
            attribute=f["attribute"], wrapper=f["wrapper"], fallback_warning=f["fallback_warning"],
            hub=_hub_option(f.get("hub")),
        )
        for role in FAMILY_ROLES[family] if (f := m["functions"].get(role)) is not None
    )
    return ModelKernels(
        module=m["module"], error=m["error"], layer_class=m["layer_class"], functions=functions,
        is_fast_path_available=m["is_fast_path_available"], fast_path=bool(m["fast_path"]),
        import_messages=tuple(m["import_messages"]), family=family, layer_hub=_hub_option(m.get("layer_hub")),
    )


def _fa2(f: dict[str, Any] | None) -> FlashAttention2 | None:
    if not f:
        return None
    dims = f.get("built_head_dims")
    return FlashAttention2(
        loads=bool(f["loads"]), reasons=tuple(map(str, f["reasons"])), version=f.get("version"),
        transformers_says=f.get("transformers_says"), kernels_fallback=f.get("kernels_fallback"),
        built_head_dims=tuple(int(d) for d in dims) if dims is not None else None,
    )


def _hub_option(h: dict[str, Any] | None) -> HubOption | None:
    if not h:
        return None
    return HubOption(layer=str(h["layer"]), repos=tuple((str(r["repo"]), tuple(map(str, r["devices"])))
                                                       for r in h["repos"]), text=str(h["text"]))
