"""The installer runner: the uv (or pip) command that installs chosen wheels from their channels with exact pins
and the env's torch held by an exact requirement, its run, and which wheel variant uv chose."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from builder.core.log import log
from builder.core.uvtool import install_failure, run_uv_process, uv_bin
from builder.model import variants
from builder.model.arch import runs_on
from builder.user.fit import EnvFacts, IndexedWheel


def install_argv(python: Path, wheels: list[IndexedWheel], env: EnvFacts, *, tool: str = "uv",
                 reinstall: tuple[str, ...] = ()) -> list[str]:
    """The install command: each wheel's channel as an extra index (a stable-ABI wheel's: the env's), exact pins,
    torch held where it is by an exact requirement the env already meets. ``uv``/``pip``: the lines doctor prints
    for the user's own tools; ``uv-internal``: this tool's uv (``run_argv``). ``reinstall``: the projects whose
    installed build a newer one supersedes (the same version: uv and pip change nothing unless told):
    ``--reinstall-package`` each for uv; for pip ``--force-reinstall --no-deps`` (pip has no per-package form, and
    its --force-reinstall alone would reinstall torch too)."""
    indexes: list[str] = []
    for wheel in wheels:
        if wheel.index_url_for(env) not in indexes:
            indexes.append(wheel.index_url_for(env))
    pins = [f"{w.project}=={w.version}" for w in wheels]
    hold = [f"torch=={env.torch}"] if env.torch else []
    index_args = [a for url in indexes for a in ("--extra-index-url", url)]
    if tool == "pip":  # pip knows no variants: it takes the plain wheel, which is always published
        if reinstall:
            return [str(python), "-m", "pip", "install", "--force-reinstall", "--no-deps", *index_args, *pins]
        return [str(python), "-m", "pip", "install", *index_args, *pins, *hold]
    again = [a for name in reinstall for a in ("--reinstall-package", name)]
    # uv picks the variant for this machine's GPU (model/variants.py) where the wheel has any and uv knows them
    preview = ["--preview-features", variants.UV_PREVIEW_FEATURE] \
        if any(w.variants for w in wheels) and (tool == "uv" or uv_knows_variants()) else []
    return [uv_bin() if tool == "uv-internal" else "uv", "pip", "install", *preview, *again, "--python",
            str(python), *index_args, *pins, *hold]

def run_argv(python: Path, wheels: list[IndexedWheel], env: EnvFacts, *, offline: bool = False,
             reinstall: tuple[str, ...] = ()) -> list[str]:
    """What ``builder install`` runs, and what its --dry-run prints: the one command line for both."""
    argv = install_argv(python, wheels, env, tool="uv-internal", reinstall=reinstall)
    return [*argv[:3], "--offline", *argv[3:]] if offline else argv

def run_install(argv: list[str], python: Path, wheels: list[IndexedWheel]) -> dict[str, str]:
    """Run ``argv`` (``run_argv``'s) to install ``wheels`` into ``python``'s env; say which variant uv chose.
    Returns each wheel's file name → the file really installed (``…-sm120.whl`` where uv took a variant)."""
    what = f"installing {', '.join(w.filename for w in wheels)}"
    result = run_uv_process(argv, what=what)  # the network policy's timeouts and wall clock (core/net.py)
    if result.returncode != 0:
        raise install_failure(what, result.stderr, where=python.parent.parent)
    for line in result.stderr.splitlines():
        if line.strip() and not line.startswith(("Using Python", "Resolved", "Prepared", "Audited")):
            log.info(f"  {line.strip()}")
    files = {}
    states = installed_states(python, [w.project for w in wheels if w.variants])
    for wheel in wheels:
        if wheel.variants:
            log.info(f"  {wheel.project}: {variant_chosen(python, wheel)}")
            label = states[wheel.project].label if wheel.project in states else None
            files[wheel.filename] = wheel.filename[:-4] + f"-{label}.whl" if label else wheel.filename
    return files


@dataclass(frozen=True)
class Installed:
    """A distribution as installed in an env: its version, and the variant label its variant.json names (None
    for a plain wheel)."""

    version: str
    label: str | None


def installed_states(python: Path, projects: list[str]) -> dict[str, Installed]:
    """``projects`` as installed in ``python``'s env (one interpreter run for all; those not installed left out)."""
    if not projects:
        return {}
    code = ("import importlib.metadata as m, json, sys\nout = {}\nfor name in sys.argv[1:]:\n try:\n"
            "  d = m.distribution(name)\n except Exception:\n  continue\n"
            " out[name] = [d.version, d.read_text('variant.json') or '']\nprint(json.dumps(out))")
    done = subprocess.run([str(python), "-c", code, *projects], capture_output=True, text=True, timeout=120)
    try:
        found = json.loads(done.stdout) if done.returncode == 0 else {}
    except ValueError:
        return {}
    states = {}
    for name, (version, text) in found.items():
        label = None
        if text:
            try:
                label = next(iter(variants.read_metadata(text.encode(), f"{name}'s variant.json")), None)
            except ValueError:
                label = None
        states[name] = Installed(version, label)
    return states


@dataclass(frozen=True)
class ProviderView:
    """What uv's NVIDIA variant provider will read on this machine: the GPUs (compute capability as one number,
    120) and the driver's CUDA, from its FORCE variables where set, else from nvidia-smi / torch; ``source`` says
    which, for the messages."""

    gpus: tuple[int, ...]
    driver_cuda: str | None
    source: str
    forced_arch_only: bool = False  # FORCE_SM_ARCH without FORCE_CUDA_DRIVER_VERSION and no driver to read

    @classmethod
    def of(cls, environ: Mapping[str, str], gpus: tuple[int, ...], driver_cuda: str | None) -> ProviderView:
        forced, driver = environ.get(variants.FORCE_SM_ARCH), environ.get(variants.FORCE_DRIVER)
        if forced:
            ccs = tuple(int(m.group(1)) * 10 + int(m.group(2)) for part in forced.split(",")
                        if (m := re.fullmatch(r"\s*(\d+)\.(\d)\s*", part)))
            return cls(ccs, driver or driver_cuda, f"{variants.FORCE_SM_ARCH}={forced}",
                       forced_arch_only=not driver and driver_cuda is None)
        return cls(gpus, driver or driver_cuda, "this machine's GPU" if gpus else "no GPU here")


def matching_variant(wheel: IndexedWheel, gpus: tuple[int, ...]) -> str | None:
    """The variant label of ``wheel`` whose code runs on one of ``gpus`` (sm120 on sm_121 too), as uv's provider
    picks it; None where none does."""
    for label in sorted(wheel.variants, key=lambda text: -int(re.sub(r"\D", "", text) or 0)):
        match = re.fullmatch(r"sm(\d+)(\w?)", label)
        if match and any(runs_on((f"sm_{match.group(1)}{match.group(2)}",), (), cc) for cc in gpus):
            return label
    return None


def variant_notes(wheels: list[IndexedWheel], view: ProviderView) -> list[str]:
    """Warnings before an install of wheels with variants: the provider's override half set, or a GPU that no
    thin wheel matches (uv then installs the plain wheel, which may have no code for it either)."""
    with_variants = [w for w in wheels if w.variants]
    if not with_variants:
        return []
    if view.forced_arch_only:
        return [f"{variants.FORCE_SM_ARCH} is set but {variants.FORCE_DRIVER} is not, and no driver here tells uv's "
                f"NVIDIA provider the CUDA it runs: uv installs the plain wheel; set both (e.g. "
                f"{variants.FORCE_DRIVER}=13.0)"]
    notes = []
    for wheel in with_variants:
        if not view.gpus or matching_variant(wheel, view.gpus) is not None:
            continue
        gpus = ", ".join(f"sm_{cc}" for cc in view.gpus)
        code = [*(wheel.sass or ()), *(wheel.ptx or ())]
        runs = wheel.sass is not None and any(runs_on(wheel.sass, wheel.ptx or (), cc) for cc in view.gpus)
        plain = ("which runs there" if runs else
                 f"whose code ({', '.join(code) or 'not recorded'}) does not run on {gpus}")
        notes.append(f"no thin wheel of {wheel.project} matches {gpus} ({view.source}; its variants: "
                     f"{', '.join(wheel.variants)}): uv installs the plain wheel, {plain}")
    return notes

def uv_knows_variants() -> bool:
    """Whether the uv this tool runs installs PEP 825 variants (UV_MIN_VERSION: 0.13.6, whose provider also reads the FORCE variables)."""
    try:
        out = subprocess.run([uv_bin(), "--version"], capture_output=True, text=True, timeout=30).stdout.split()
        return len(out) > 1 and Version(out[1]) >= Version(variants.UV_MIN_VERSION)
    except (OSError, subprocess.SubprocessError, InvalidVersion):
        return False

def variant_chosen(python: Path, wheel: IndexedWheel) -> str:
    """Which file uv installed for ``wheel`` and why, read from the installed dist-info's variant.json."""
    code = ("import importlib.metadata as m, sys; d = m.distribution(sys.argv[1]); "
            "print(d.read_text('variant.json') or '')")
    done = subprocess.run([str(python), "-c", code, wheel.project], capture_output=True, text=True, timeout=120)
    text = done.stdout.strip()
    if done.returncode != 0 or not text:
        shown = ", ".join(wheel.variants)
        return (f"the plain wheel ({', '.join(wheel.sass or ()) or 'its arch list'}): uv's NVIDIA provider matched "
                f"none of its variants ({shown}) to this machine's GPU and driver, or found no GPU")
    try:
        table = variants.read_metadata(text.encode(), "the installed variant.json")
        label = next(iter(table))
        chosen = variants.Variant.from_metadata(label, table)
    except (ValueError, StopIteration):
        return "a variant this builder did not write (its variant.json is not one of ours)"
    return (f"the {label} variant ({chosen.arch.sm} code only): uv's NVIDIA provider found a GPU that runs "
            f"{chosen.arch.sm} and a driver for CUDA {chosen.cuda_floor} or newer")
