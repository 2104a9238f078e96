"""``builder doctor``: one command for the whole diagnosis of a Python env that should run CUDA kernels.

What the env holds (envprobe: Python, torch, its GPUs, the recipes' packages, what transformers' GatedDeltaNet
and Mamba-2 mixer functions are bound to), what the machine has (machine: driver, compilers, engine), whether each installed package
carries GPU code the GPUs can run (cuobjdump where one is at hand, else the build record), and which wheels of a
wheelhouse fit the env, with the exact commands that install them without touching torch.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from packaging.version import Version

from builder.core.errors import BuilderError
from builder.core.settings import Settings
from builder.core.uvtool import uv_bin
from builder.model.arch import runs_on
from builder.model.cuda import CudaVersion
from builder.model.platform import this_machine
from builder.model.recipe import Recipe, RecipeKind, list_recipes, load_recipe
from builder.stages.inspection import find_local_cuobjdump, list_gpu_code
from builder.user.choice import arch_example
from builder.user.envprobe import EnvReport, PackageReport, PackageSpec, probe_env
from builder.user.fit import EnvFacts, IndexedWheel, Verdict, best, env_facts, env_label, judge
from builder.user.installer import install_argv
from builder.user.interpreter import interpreter_argv
from builder.user.machine import MachineFacts, machine_facts
from builder.user.probecache import probe_memo
from builder.user.superseded import Superseded, installed_superseded
from builder.user.wheelhouse import WheelhouseReader


@dataclass(frozen=True)
class GpuCode:
    """What GPU code one installed package carries and whether this machine's GPUs can run it."""

    sass: tuple[str, ...]
    ptx: tuple[str, ...]
    source: str  # "cuobjdump", "build record", "none" (pure Python), "unknown"
    verdict: str  # one phrase for the table


@dataclass(frozen=True)
class PackageState:
    report: PackageReport
    kind: RecipeKind
    gpu_code: GpuCode


@dataclass(frozen=True)
class WheelOffer:
    """What a wheelhouse has for one package, judged against the env."""

    package: str
    verdicts: tuple[Verdict, ...]
    chosen: Verdict | None
    index_url: str | None = None  # where this env installs the chosen wheel from: its channel (the env's own for
    #                               a stable-ABI wheel)
    why: str = ""  # a chosen stable-ABI wheel's: the torch it was verified on (fit.Verdict.why)


@dataclass(frozen=True)
class DoctorReport:
    python: Path
    env: EnvReport
    machine: MachineFacts
    facts: EnvFacts
    packages: tuple[PackageState, ...]
    wheelhouse: str | None  # its root URL
    wheelhouse_error: str | None
    offers: tuple[WheelOffer, ...]
    commands: tuple[str, ...]  # what to run next, in order
    advice: tuple[str, ...]
    superseded: tuple[Superseded, ...] = ()  # installed wheels a newer build supersedes (user/superseded.py)

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["facts"]["tags"] = []  # the env's own tag list is already under env.python
        for private in ("settings", "env", "_answers"):
            data["machine"].pop(private, None)
        data["machine"]["builds"] = {cuda: {"possible": ok, "how": how}
                                     for cuda, (ok, how) in self.machine.answered().items()}
        data["platform"] = {"env": self.facts.machine, "this_machine": this_machine().name, "cross": self.facts.cross,
                            "known": self.facts.platform is not None}
        return _jsonable_dict(data)


def recipe_packages(settings: Settings) -> list[Recipe]:
    return [load_recipe(path, settings.patches_dir) for path in list_recipes(settings.recipes_dir)]


def diagnose(python: Path, settings: Settings, wheelhouse: str | None, *, refresh: bool = False) -> DoctorReport:
    """The whole diagnosis; the env probe's answer is reused where the env has not changed since (``refresh``:
    probe anyway)."""
    recipes = recipe_packages(settings)
    # The env probe (importing torch and transformers: seconds) runs while this process asks the machine and reads
    # the wheelhouse: the doctor takes about as long as the probe alone.
    with ThreadPoolExecutor(max_workers=2) as pool:
        machine_job = pool.submit(machine_facts, os.environ, settings)
        listing_job = pool.submit(_listing, wheelhouse, recipes)
        env = probe_env(python, [PackageSpec.from_recipe(r) for r in recipes], memo=probe_memo(settings),
                        refresh=refresh)
        machine, (root, listed, error) = machine_job.result(), listing_job.result()
    facts = env_facts(env, machine)
    cuobjdump = find_local_cuobjdump(settings, (env.python.purelib,))
    states = tuple(PackageState(env.package(r.name), r.kind, _gpu_code(env.package(r.name), r.kind, facts, cuobjdump))
                   for r in recipes)
    offers: list[WheelOffer] = []
    for recipe in recipes if error is None else ():
        if recipe.name in listed:
            verdicts = tuple(judge(w, facts) for w in listed[recipe.name])
            chosen = best(list(verdicts))
            offers.append(WheelOffer(recipe.name, verdicts, chosen,
                                     chosen.wheel.index_url_for(facts) if chosen else None,
                                     chosen.why if chosen else ""))
    commands, advice = _next_steps(python, env, machine, facts, states, offers, root)
    old = tuple(found for r in recipes
                if (found := installed_superseded(env.package(r.name), r, listed.get(r.name, ()))) is not None)
    commands, advice = _superseded_steps(python, old, offers, facts, root, commands, advice)
    return DoctorReport(python, env, machine, facts, states, root, error, tuple(offers), commands, advice, old)


def _listing(wheelhouse: str | None, recipes: list[Recipe]
             ) -> tuple[str | None, dict[str, list[IndexedWheel]], str | None]:
    """(the wheelhouse's root URL, its wheels per recipe, the error that stopped reading it)."""
    if wheelhouse is None:
        return None, {}, None
    reader = WheelhouseReader(wheelhouse)
    listed: dict[str, list[IndexedWheel]] = {}
    try:
        reader.check()
        for recipe in recipes:
            listed[recipe.name] = reader.wheels(recipe.name)
    except BuilderError as e:
        return reader.root, {}, e.one_line()
    return reader.root, listed, None


def _superseded_steps(python: Path, old: tuple[Superseded, ...], offers: list[WheelOffer], facts: EnvFacts,
                      root: str | None, commands: tuple[str, ...], advice: tuple[str, ...],
                      ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """A line per superseded installed wheel, first of the advice; and the commands that replace it: builder
    install (which reinstalls it), and uv's and pip's own lines, which must be told to reinstall (the same
    version is installed: without that both change nothing)."""
    if not old:
        return commands, advice
    lines = [s.line(python) for s in old]
    names = " ".join(s.package for s in old)
    from_flag = "" if root is None or root == Path("wheelhouse").resolve().as_uri() + "/" else f" --from {root}"
    more = [f"builder install {names} --python {python}{from_flag}"]
    wheels = [o.chosen.wheel for o in offers if o.chosen is not None and any(s.package == o.package for s in old)]
    if wheels:
        reinstall = tuple(w.project for w in wheels)
        more.append(shlex.join(install_argv(python, wheels, facts, reinstall=reinstall)))
        if _has_pip(python):
            more.append(shlex.join(install_argv(python, wheels, facts, tool="pip", reinstall=reinstall)))
    return (*more, *commands), (*lines, *advice)


def _gpu_code(package: PackageReport, kind: RecipeKind, facts: EnvFacts, cuobjdump: Path | None) -> GpuCode:
    if not package.installed:
        return GpuCode((), (), "none", "-")
    if not kind.is_cuda or not package.shared_objects:
        return GpuCode((), (), "none", "no GPU code of its own (Triton compiles at run time)"
                       if not kind.is_cuda else "no shared objects found")
    sass: set[str] = set()
    ptx: set[str] = set()
    source = "unknown"
    if cuobjdump is not None:
        try:
            for so in package.shared_objects:
                s, p = list_gpu_code(cuobjdump, so)
                sass.update(s)
                ptx.update(p)
            source = "cuobjdump"
        except (BuilderError, OSError, subprocess.SubprocessError):
            sass, ptx = set(), set()
    if source == "unknown" and package.build_record and isinstance(archs := package.build_record.get("archs"), list):
        for arch in archs:
            text = str(arch)
            sass.add(f"sm_{text.removesuffix('+ptx')}")
            if text.endswith("+ptx"):
                ptx.add(f"compute_{text.removesuffix('+ptx')}")
        source = "build record"
    code = ", ".join(sorted(sass) + sorted(ptx)) or "no device code"
    if source == "unknown":
        return GpuCode((), (), source, "unknown (no cuobjdump here, no build record)")
    if not facts.gpus:
        return GpuCode(tuple(sorted(sass)), tuple(sorted(ptx)), source, f"{code} (no GPU here to run it)")
    bad = [cc for cc in facts.gpus if not runs_on(tuple(sass), tuple(ptx), cc)]
    verdict = f"{code}: runs on " + ", ".join(f"sm_{cc}" for cc in facts.gpus) if not bad else \
        f"{code}: NOT runnable on " + ", ".join(f"sm_{cc}" for cc in bad)
    return GpuCode(tuple(sorted(sass)), tuple(sorted(ptx)), source, verdict)


def _next_steps(python: Path, env: EnvReport, machine: MachineFacts, facts: EnvFacts,
                states: tuple[PackageState, ...], offers: list[WheelOffer], root: str | None,
                ) -> tuple[tuple[str, ...], tuple[str, ...]]:
    commands: list[str] = []
    advice: list[str] = []
    if not env.torch.installed:
        advice.append("torch is not installed in this env: install the torch you use first (builder install "
                      "never chooses torch for you)")
    elif env.torch.cuda is None:
        advice.append(f"torch {env.torch.version} is a CPU build: no CUDA kernel can run here; install a CUDA torch")
    elif not facts.gpus and facts.cross:
        advice.append(f"this env is {facts.machine} and runs here under qemu, on an {this_machine()} machine: kernels "
                      f"can be installed and imported here, but run only on an {facts.machine} machine's GPU")
    elif not facts.gpus:
        advice.append("no GPU is visible (torch sees none, nvidia-smi lists none): kernels can be installed and "
                      "imported here, but not run")
    missing = [s.report.distribution for s in states if not s.report.imports_ok]
    fitting = [o for o in offers if o.chosen is not None and o.package in missing]
    if fitting and root is not None:
        names = " ".join(o.package for o in fitting)
        from_flag = "" if root == Path("wheelhouse").resolve().as_uri() + "/" else f" --from {root}"
        commands.append(f"builder install {names} --python {python}{from_flag}")
        wheels = [o.chosen.wheel for o in fitting if o.chosen]
        uv_line = install_argv(python, wheels, facts)
        # uv on PATH, else the one that came with builder by its path, else no uv line (issue 55 item 8)
        uv = "uv" if shutil.which("uv") else (None if uv_bin() == "uv" else uv_bin())
        if uv is not None:
            commands.append(shlex.join([uv, *uv_line[1:]]))
        if _has_pip(python):
            commands.append(shlex.join(install_argv(python, wheels, facts, tool="pip")))
    for offer in offers:
        if offer.chosen is not None and offer.why:
            advice.append(f"{offer.package}: {offer.chosen.wheel.filename} fits: {offer.why}; this env's channel "
                          f"{offer.index_url}")
    kinds = {s.report.distribution: s.kind for s in states}
    for offer in offers:
        if offer.package in missing and offer.chosen is None and facts.torch and facts.torch_cuda:
            gpu_code = kinds.get(offer.package) is RecipeKind.CUDA_EXTENSION
            can, how = machine.can_build(CudaVersion.parse(facts.torch_cuda), facts.platform)
            if not gpu_code:
                can, how = True, "no compiler at all (pure Python)"
            label = env_label(facts.torch, facts.torch_cuda)
            if facts.cross and gpu_code:
                label = f"{facts.machine} and {label}"
            if can:
                # with no GPU here to take the arch from, the build needs --arch (install would stop and ask)
                arch = "" if facts.gpus or not gpu_code else f" --arch \"<your GPU's arch, {arch_example(facts)}>\""
                built = f"cross-builds it: builder build … --platform {facts.machine}" if facts.cross and gpu_code \
                    else "builds it"
                advice.append(f"{offer.package}: no wheel for {label} in the wheelhouse; this machine can build one "
                              f"with {how}: builder install {offer.package} --python {python}{arch} ({built})")
            else:
                advice.append(f"{offer.package}: no wheel for {label} in the wheelhouse, and {how}; "
                              f"`builder install {offer.package} --python {python}` lists the ways forward")
    for family, models in env.transformers.families:
        slow: dict[tuple[tuple[str, ...], int], list[str]] = {}  # (roles not on a kernel, of how many) → models
        for model in models:
            fallback = tuple(f.role for f in model.functions if f.kind != "kernel")
            if fallback:
                slow.setdefault((fallback, len(model.functions)), []).append(model.short)
        for (fallback, total), shorts in slow.items():
            advice.append(f"transformers {env.transformers.version}: {', '.join(shorts)} run"
                          f"{'s' if len(shorts) == 1 else ''} the torch fallback for {len(fallback)} of {total} "
                          f"{FAMILY_TITLES.get(family, family)} functions ({', '.join(fallback)})"
                          + _fix_hint(fallback, states))
    return tuple(commands), tuple(advice)


FAMILY_TITLES = {"GatedDeltaNet": "GatedDeltaNet", "Mamba2": "Mamba-2 mixer"}
ROLE_PACKAGES = {"causal_conv1d_fn": "causal-conv1d", "causal_conv1d_update": "causal-conv1d",
                 "chunk_gated_delta_rule": "fla-core", "fused_recurrent_gated_delta_rule": "fla-core",
                 "selective_state_update": "mamba-ssm", "mamba_chunk_scan_combined": "mamba-ssm",
                 "mamba_split_conv1d_scan_combined": "mamba-ssm"}


def _fix_hint(fallback: tuple[str, ...], states: tuple[PackageState, ...]) -> str:
    """``: install mamba-ssm`` naming the packages whose kernels those functions are, when they do not import."""
    working = {s.report.distribution for s in states if s.report.imports_ok}
    wanted = sorted({ROLE_PACKAGES[r] for r in fallback if r in ROLE_PACKAGES} - working)
    return f"; their kernels come from {', '.join(wanted)}" if wanted else ""


def _has_pip(python: Path) -> bool:
    try:
        result = subprocess.run([*interpreter_argv(python), "-c", "import pip"], capture_output=True, check=False)
    except OSError:  # an env this machine cannot run (another platform's, no qemu here): no pip line to offer
        return False
    return result.returncode == 0


def _jsonable(value: object) -> object:
    if isinstance(value, dict):
        return _jsonable_dict(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (Path, Version)):
        return str(value)
    return value


def _jsonable_dict(value: dict[Any, Any]) -> dict[str, object]:
    return {str(k): _jsonable(v) for k, v in value.items()}
