"""The installer runner: the uv (or pip) command that installs chosen wheels from their channels with exact pins
and the env's torch held by an exact requirement, its run, and which wheel variant uv chose."""

from __future__ import annotations

import subprocess
from pathlib import Path

from packaging.version import InvalidVersion, Version

from builder.core.log import log
from builder.core.uvtool import install_failure, run_uv_process, uv_bin
from builder.model import variants
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

def run_install(argv: list[str], python: Path, wheels: list[IndexedWheel]) -> None:
    """Run ``argv`` (``run_argv``'s) to install ``wheels`` into ``python``'s env; say which variant uv chose."""
    what = f"installing {', '.join(w.filename for w in wheels)}"
    result = run_uv_process(argv, what=what)  # the network policy's timeouts and wall clock (core/net.py)
    if result.returncode != 0:
        raise install_failure(what, result.stderr, where=python.parent.parent)
    for line in result.stderr.splitlines():
        if line.strip() and not line.startswith(("Using Python", "Resolved", "Prepared", "Audited")):
            log.info(f"  {line.strip()}")
    for wheel in wheels:
        if wheel.variants:
            log.info(f"  {wheel.project}: {variant_chosen(python, wheel)}")

def uv_knows_variants() -> bool:
    """Whether the uv this tool runs installs PEP 825 variants (0.13.7: the provider's FORCE variables too)."""
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
