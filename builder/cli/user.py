"""The user's side: ``builder doctor`` (what an env has and needs) and ``builder install`` (the fitting wheels into it).

The user modules (user/doctor, envprobe, interpreter, install) are imported in the handlers, not at the top: together
they add about 55 modules and 190 ms to every `builder` start (``python -X importtime -c 'import builder.cli.main'``),
which the build and farm commands need not pay (issue 19)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rich.table import Table

from builder.cli.common import out, settings_from_args, shell_folded
from builder.core.errors import UsageError
from builder.core.log import log
from builder.core.settings import Settings
from builder.model.cuda import CudaVersion
from builder.model.platform import this_machine

if TYPE_CHECKING:
    from builder.user.doctor import DoctorReport
    from builder.user.envprobe import FlashAttention2, KernelBinding, ModelKernels


REFRESH_HELP = ("probe the env again even where it has not changed since the last probe (its answer is kept in the "
                "cache, keyed by the env's interpreter, sys.path folders, variables and GPU devices, for a day)")


def register(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> dict:
    p = sub.add_parser("doctor", help="diagnose a Python env: torch, GPUs, compilers, kernels, what fits and how to "
                       "install it")
    p.add_argument("--python", help="the env's interpreter or venv folder (default: the active venv, else python3)")
    p.add_argument("--from", dest="source", help="wheelhouse to match against: a folder or URL (default ./wheelhouse)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--refresh", action="store_true", help=REFRESH_HELP)
    add_common(p, "cache-dir", "recipes", "patches", "offline", "net-deadline")

    p = sub.add_parser("install", help="install the fitting wheels into an env, never changing its torch")
    p.add_argument("packages", nargs="+", metavar="PACKAGE", help="recipe names, e.g. causal-conv1d fla-core (or fla)")
    p.add_argument("--python", help="the env's interpreter or venv folder (default: the active venv)")
    p.add_argument("--from", dest="source", help="wheelhouse to install from: a folder or URL (default ./wheelhouse)")
    p.add_argument("--arch", help="GPU archs for a wheel built when none fits (default: this machine's GPUs)")
    p.add_argument("--no-build", action="store_true", help="never build; stop with the ways forward when nothing fits")
    p.add_argument("--dry-run", action="store_true", help="show what would be installed and the command")
    p.add_argument("--torch-range", action="store_true",
                   help="a wheel built here: also check it beside the other torches of its range, not only beside "
                   "the env's torch (a fresh venv and a torch download, GBs, each)")
    p.add_argument("--allow-origin", action="append", default=[], metavar="URL",
                   help="also trust wheel links to this origin (default: only the --from root and its assets.json's "
                        "prefix); repeatable")
    p.add_argument("--refresh", action="store_true", help=REFRESH_HELP)
    add_common(p, "cache-dir", "recipes", "patches", "offline", "net-deadline")
    return {"doctor": cmd_doctor, "install": cmd_install}


def from_wheelhouse(settings: Settings, source: str | None) -> Settings:
    """``--from FOLDER`` is the one wheelhouse flag of doctor and install: a local folder is also where a wheel
    built here is published (a URL leaves that to ./wheelhouse or BUILDER_WHEELHOUSE)."""
    if source and "://" not in source:
        return dataclasses.replace(settings, wheelhouse=Path(source).resolve())
    return settings


def default_python(given: str | None) -> Path:
    """``--python`` as given (a venv folder becomes its bin/python, once, here), else the active venv (VIRTUAL_ENV,
    CONDA_PREFIX), else python3 on PATH."""
    # deferred on purpose: `builder` starts without builder.user (60-100 ms; issue 19)
    from builder.user.interpreter import resolve_interpreter

    if given:  # a path, a venv folder, or a command on PATH (python3)
        found = shutil.which(given) if "/" not in given else None
        return Path(found) if found else resolve_interpreter(Path(given))
    for var in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        if os.environ.get(var):
            return Path(os.environ[var]) / "bin" / "python"
    found = shutil.which("python3") or shutil.which("python")
    if found is None:
        raise UsageError("no active Python env and no python3 on PATH", "pass --python /path/to/venv/bin/python")
    return Path(found)


def cmd_doctor(args: argparse.Namespace) -> int:
    # deferred on purpose: `builder` starts without builder.user (60-100 ms; issue 19)
    from builder.user.doctor import diagnose

    settings = settings_from_args(args)
    python = default_python(args.python)
    source = args.source or (str(settings.wheelhouse) if settings.wheelhouse.is_dir() else None)
    with log.status(f"probing {python} (imports torch and transformers, unless this env's answer is kept)"):
        report = diagnose(python, settings, source, refresh=args.refresh)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
        return 0
    render_doctor(report)
    return 0


def render_doctor(report: DoctorReport) -> None:
    """The doctor's report as tables and lines: the env and machine, the packages, transformers, the wheelhouse."""
    _render_env(report)
    _render_packages(report)
    _render_transformers(report)
    _render_wheelhouse(report)
    for line in report.advice:
        out.print(f"- {line}", markup=False)
    if report.commands:
        out.print("install what fits (torch stays as it is):")
        for command in report.commands:
            out.print(shell_folded(command, "    "), markup=False)


def _render_env(report: DoctorReport) -> None:
    env, machine = report.env, report.machine
    py = env.python
    rows = Table(show_header=False, box=None, title=f"builder doctor: {report.python}", title_justify="left")
    rows.add_row("Python", f"{py.version} ({'venv ' + str(py.prefix) if py.is_venv else py.executable})"
                 + (f", glibc {py.glibc}" if py.glibc else ""))
    rows.add_row("platform", _platform_text(report))
    if env.cached_at is not None:
        rows.add_row("probed", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(env.cached_at))
                     + ": this answer was kept (the env is unchanged since); --refresh probes again")
    torch = env.torch
    if torch.version:
        rows.add_row("torch", f"{torch.version}: " + (f"a CUDA {torch.cuda} build" if torch.cuda else "a CPU build")
                     + f"; CUDA usable: {'yes' if torch.cuda_available else 'no'}")
    else:
        rows.add_row("torch", "not installed" if not torch.installed else f"fails to import: {torch.error}")
    gpus = [f"{d.name} (sm_{d.sm})" for d in torch.devices] or (
        [] if report.facts.cross else [f"{g.name} (sm_{g.sm})" for g in machine.driver.gpus])
    none = ("none visible to this env (torch sees no device; this machine's GPUs are not its)" if report.facts.cross
            else f"none visible ({machine.driver.error or 'nvidia-smi lists none'}; torch sees no device)")
    rows.add_row("GPUs", ", ".join(gpus) if gpus else none)
    if machine.driver.version:
        rows.add_row("driver", f"{machine.driver.version}, runs CUDA <= {machine.driver.cuda or '?'}")
    compilers = ", ".join(f"nvcc {c.version} at {c.home}" for c in machine.compilers) or "no nvcc / CUDA_HOME"
    rows.add_row("compilers", compilers + f"; container engine: {machine.engine or 'none answers'}")
    if torch.cuda:
        can, how = machine.can_build(CudaVersion.parse(torch.cuda), report.facts.platform)
        what = f"CUDA {torch.cuda} {report.facts.machine} wheels" if report.facts.cross else f"CUDA {torch.cuda} wheels"
        rows.add_row("build here", f"{what}: " + (f"yes, with {how}" if can else f"no: {how}"))
    out.print(rows)


def _platform_text(report: DoctorReport) -> str:
    """The env's CPU platform (as its interpreter says), and how it relates to this machine's."""
    facts, here = report.facts, this_machine()
    if facts.platform is None:
        return f"{facts.machine}: the builder makes wheels for x86_64 and aarch64 only"
    if facts.cross:
        return (f"{facts.machine} (run here under qemu; this machine is {here}: its wheels are cross-built here, "
                f"builder build … --platform {facts.machine})")
    return f"{facts.machine} (this machine's)"


def _render_packages(report: DoctorReport) -> None:
    table = Table("package", "installed", "imports", "GPU code", title="CUDA-extension packages the recipes know",
                  title_justify="left")
    for state in report.packages:
        pkg = state.report
        failed = [i for i in pkg.imports if not i.ok]
        imports = "-" if not pkg.installed else ("ok" if not failed else f"FAILS: {failed[0].module}: {failed[0].error}")
        table.add_row(pkg.distribution, pkg.version or "no", imports, state.gpu_code.verdict)
    out.print(table)


def _render_transformers(report: DoctorReport) -> None:
    tf = report.env.transformers
    if not tf.installed:
        out.print("transformers: not installed" + (f" ({tf.error})" if tf.error and "No module" not in tf.error else ""),
                  markup=False)
    else:
        out.print(f"transformers {tf.version}: what its kernel functions are bound to after import (modeling "
                  "modules grouped when alike)", markup=False)
        for family, models in tf.families:
            groups: dict[tuple[str, ...], list[str]] = {}
            for model in models:
                lines = ((f"modeling module fails to import: {model.error}",) if model.error else
                         tuple(f"{f.role:34} {_binding_text(f)}" for f in model.functions) + _hub_lines(model))
                groups.setdefault(lines, []).append(model.short)
            for lines, names in groups.items():
                out.print(f"  {family}: {', '.join(names)}:", markup=False)
                for line in lines:
                    out.print(f"    {line}", markup=False)
        if tf.flash_attention_2 is not None:
            out.print(f"  attn_implementation=\"flash_attention_2\": {fa2_text(tf.flash_attention_2)}", markup=False)


def fa2_text(fa: FlashAttention2) -> str:
    """Whether transformers would load flash-attn as FA2 here, and every reason it would not."""
    if fa.loads:
        dims = (f"; head dims {', '.join(map(str, fa.built_head_dims))} only (a subset build: other head dims "
                "are refused at the call)" if fa.built_head_dims is not None and len(fa.built_head_dims) < 6 else "")
        return f"loads flash-attn {fa.version}{dims}"
    text = "would not load: " + "; ".join(fa.reasons)
    if fa.kernels_fallback:
        text += " (transformers would take the Hugging Face hub's FA2 kernel instead: not built or tested here)"
    return text


def _hub_lines(model: ModelKernels) -> tuple[str, ...]:
    """What a model loaded with use_kernels=True runs instead: Hugging Face hub kernels, grouped by repository."""
    by_text: dict[str, list[str]] = {}
    for f in model.functions:
        if f.hub is not None:
            by_text.setdefault(f.hub.text, []).append(f.role)
    lines = [f"  {', '.join(roles)}: {text}" for text, roles in by_text.items()]
    if model.layer_hub is not None:
        lines.append(f"  the whole {model.layer_hub.layer} layer: {model.layer_hub.text}")
    if not lines:
        return ()
    return ("with use_kernels=True, Hugging Face hub kernels instead (downloaded at load, not built or tested "
            "by this farm):", *lines)


def _binding_text(f: KernelBinding) -> str:
    """A torch fallback without its module (the group names the models); a kernel with package, function, file."""
    if f.kind == "torch fallback" and f.qualname:
        return f"torch fallback ({f.qualname})"
    return f.text


def _render_wheelhouse(report: DoctorReport) -> None:
    if report.wheelhouse and report.wheelhouse_error:
        out.print(f"wheelhouse: {report.wheelhouse_error}", markup=False)
    elif report.wheelhouse:
        out.print(f"wheelhouse {report.wheelhouse}:", markup=False)
        for offer in report.offers:
            chosen = f"fits: {offer.chosen.wheel.filename}" if offer.chosen else "nothing fits"
            out.print(f"  {offer.package}: {chosen if offer.verdicts else 'no wheels'}", markup=False)
            for verdict in offer.verdicts:
                if not verdict.fits:
                    out.print(f"    not {verdict.wheel.filename}: {'; '.join(verdict.reasons)}", markup=False)
    else:
        out.print("wheelhouse: none given (--from PATH|URL) and no ./wheelhouse here")


def cmd_install(args: argparse.Namespace) -> int:
    # deferred on purpose: `builder` starts without builder.user (60-100 ms; issue 19)
    from builder.user.install import InstallRequest, install

    settings = from_wheelhouse(settings_from_args(args), args.source)
    python = default_python(args.python)
    request = InstallRequest(packages=tuple(args.packages), python=python,
                             source=args.source or str(settings.wheelhouse), arch=args.arch,
                             build=not args.no_build, dry_run=args.dry_run, torch_range=args.torch_range,
                             allow_origins=tuple(args.allow_origin), refresh=args.refresh)
    outcome = install(request, settings)
    for line in outcome.summary():
        head, sep, command = line.partition(": ")
        if head in ("would run", "would build here") and shell_folded(command) != command:  # piped, too long:
            out.print(f"{head}:\n{shell_folded(command, '    ')}", markup=False)  # a command that pastes
        else:
            out.print(line, markup=False)
    return 0
