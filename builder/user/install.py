"""``builder install``: the fitting wheels from a wheelhouse into a user's environment, never touching its torch.

Per package the newest wheel that fits the env (fit.py) is installed from its channel, pinned exactly
(``pkg==1.7.0+cu130torch2.14``), with the env's own torch named exactly (``torch==2.14.1``), so no resolver can swap torch. A
stable-ABI wheel (``pkg==1.7.0+cu13``) comes from the env's own channel too (``cu130torch2.12``), which lists it
where it was verified on that torch. When
nothing fits, a wheel is built here if this machine can compile for the env's CUDA; otherwise the command stops
with the concrete ways forward. torch is checked again afterwards.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from builder.core.errors import InstallError, ToolchainError
from builder.core.log import log
from builder.core.settings import Settings
from builder.core.uvtool import install_failure, run_uv_process, uv_bin
from builder.index.layout import Layout
from builder.model import variants
from builder.model.arch import Arch, format_arch_list
from builder.model.cuda import CudaVersion
from builder.model.platform import this_machine
from builder.model.python import PythonSpec
from builder.user.fit import EnvFacts, IndexedWheel, Verdict, best, env_facts, env_label, judge, label_cuda, python_fits
from builder.user.machine import MachineFacts
from builder.user.wheelhouse import WheelhouseReader


@dataclass(frozen=True)
class Choice:
    """One requested package: every wheel the wheelhouse has for it, judged, and the one to install (or None)."""

    package: str
    verdicts: tuple[Verdict, ...]
    chosen: IndexedWheel | None
    why: str = ""  # a stable-ABI wheel's: the torch it was verified on (fit.Verdict.why)


def choose(packages: list[str], env: EnvFacts, reader: WheelhouseReader) -> list[Choice]:
    choices = []
    for package in packages:
        verdicts = tuple(judge(w, env) for w in reader.wheels(package))
        picked = best(list(verdicts))
        choices.append(Choice(package, verdicts, picked.wheel if picked else None, picked.why if picked else ""))
    return choices


def install_argv(python: Path, wheels: list[IndexedWheel], env: EnvFacts, *, tool: str = "uv") -> list[str]:
    """The install command: each wheel's channel as an extra index (a stable-ABI wheel's: the env's), exact pins,
    torch held where it is by an exact requirement the env already meets. ``uv``/``pip``: the lines doctor prints
    for the user's own tools; ``uv-internal``: this tool's uv (``run_argv``)."""
    indexes: list[str] = []
    for wheel in wheels:
        if wheel.index_url_for(env) not in indexes:
            indexes.append(wheel.index_url_for(env))
    pins = [f"{w.project}=={w.version}" for w in wheels]
    hold = [f"torch=={env.torch}"] if env.torch else []
    index_args = [a for url in indexes for a in ("--extra-index-url", url)]
    if tool == "pip":  # pip knows no variants: it takes the plain wheel, which is always published
        return [str(python), "-m", "pip", "install", *index_args, *pins, *hold]
    # uv picks the variant for this machine's GPU (model/variants.py) where the wheel has any and uv knows them
    preview = ["--preview-features", variants.UV_PREVIEW_FEATURE] \
        if any(w.variants for w in wheels) and (tool == "uv" or uv_knows_variants()) else []
    return [uv_bin() if tool == "uv-internal" else "uv", "pip", "install", *preview, "--python", str(python),
            *index_args, *pins, *hold]


def run_argv(python: Path, wheels: list[IndexedWheel], env: EnvFacts, *, offline: bool = False) -> list[str]:
    """What ``builder install`` runs, and what its --dry-run prints: the one command line for both."""
    argv = install_argv(python, wheels, env, tool="uv-internal")
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


def torch_for_this_machine(choices: list[Choice], machine: MachineFacts,
                           env: EnvFacts) -> tuple[str, CudaVersion] | None:
    """A torch (version, CUDA) this machine can build for, preferring one the wheelhouse already serves
    for the same Python: the way forward when the env's own CUDA cannot be compiled here."""
    seen: list[tuple[Version, CudaVersion]] = []
    for choice in choices:
        for verdict in choice.verdicts:
            if not python_fits(verdict.wheel, env):
                continue
            if verdict.wheel.is_stable_abi:  # each torch it was verified on is served, in that torch's channel
                for check in verdict.wheel.torch_checks:
                    try:
                        line, channel = CudaVersion.parse(check.cuda), check.channel
                    except InvalidVersion:
                        continue
                    if check.passed and channel in verdict.wheel.channels and machine.can_build(line, env.platform)[0]:
                        seen.append((Version(Version(check.torch).public), line))
                continue
            pin, cuda = verdict.wheel.torch_pin, label_cuda(verdict.wheel.label)
            if pin is None or cuda is None or not machine.can_build(cuda, env.platform)[0]:
                continue
            exact = [s.version for s in pin if s.operator in ("==", "===") and "*" not in s.version]
            if exact:
                seen.append((Version(exact[0]), cuda))
    if seen:
        version, cuda = max(seen)
        return str(version), cuda
    return None


# The oldest Linux driver branch that runs each CUDA major (NVIDIA's CUDA toolkit release notes, table 3)
DRIVER_FLOOR = {12: "R525", 13: "R580"}


def alternative_caveats(cuda: CudaVersion, env: EnvFacts, machine: MachineFacts) -> str:
    """What moving the env to a torch of ``cuda`` also takes: a driver that runs that CUDA (checked against
    nvidia-smi's answer where there is one), and the env's packages that pin its current torch."""
    floor = DRIVER_FLOOR.get(cuda.major, "a newer branch")
    driver = machine.driver
    notes = []
    if driver.cuda is None:
        notes.append(f"it needs an NVIDIA driver that runs CUDA {cuda.line} ({floor} or newer); "
                     f"{driver.error or 'nvidia-smi reported no CUDA version'}, so that was not checked")
    else:
        try:
            runs = CudaVersion.parse(driver.cuda)
        except InvalidVersion:
            runs = None
        if runs is not None and (runs.major, runs.minor) < (cuda.major, cuda.minor):
            notes.append(f"first update the driver: {driver.version or 'this'} runs CUDA <= {driver.cuda}, a CUDA "
                         f"{cuda.line} torch needs {floor} or newer")
        elif runs is not None:
            notes.append(f"the driver ({driver.version}, CUDA <= {driver.cuda}) runs it")
    if env.torch_dependents:
        notes.append(f"these pin the env's torch and must move with it: {', '.join(env.torch_dependents)}")
    return "".join(f"; {n}" for n in notes)


def ways_forward(missing: list[Choice], choices: list[Choice], env: EnvFacts, machine: MachineFacts,
                 reader: WheelhouseReader, python: Path, archs: tuple[Arch, ...], *,
                 skipped: str | None = None) -> InstallError:
    """The refusal when nothing fits and this machine cannot build (or ``skipped``, the flag that kept it from
    building: ``--no-build``, ``--dry-run``): what would carry it, what works here."""
    names = " ".join(c.package for c in missing)
    cuda = env.torch_cuda or "cpu"
    torch_cuda = CudaVersion.parse(env.torch_cuda) if env.torch_cuda else None
    label = env_label(env.torch, env.torch_cuda) if env.torch and env.torch_cuda else None
    can, why = machine.can_build(torch_cuda, env.platform) if torch_cuda else (False, "the env's torch is a CPU build")
    arch_text = format_arch_list(archs) if archs else f"<your GPU's arch, {arch_example(env)}>"
    torch_public = Version(env.torch).public if env.torch else "?"
    index_flag = f" --torch-index {torch_cuda.flavour}" if torch_cuda and env.torch and Version(env.torch).local else ""
    hints = []
    if label and env.cross:  # another platform's env (aarch64 here): a cross build, with the env's Python
        where = ("cross-build it on this machine" if can else f"on a machine with a CUDA {cuda} toolkit and "
                 f"{env.platform.cross_prefix if env.platform else ''}g++ (a cross build), or an {env.machine} one")
        hints.append(f"{where}: `builder build {missing[0].package}{cross_flags(env, machine, torch_cuda)} --cuda "
                     f"{cuda} --arch {arch_text} --python {_minor(env.python)} --torch {torch_public}{index_flag}`; "
                     f"its wheel lands in channel {reader.channel_url(label)} and this command then installs it")
    elif label:
        hints.append(f"on a machine with Docker or a CUDA {cuda} toolkit: `builder build {missing[0].package} "
                     f"--cuda {cuda} --arch {arch_text} --torch {torch_public}{index_flag}`; its wheel lands in channel "
                     f"{reader.channel_url(label)} and this command then installs it")
    alternative = torch_for_this_machine(choices, machine, env)
    from_flag = "" if reader.root == WheelhouseReader("wheelhouse").root else f" --from {reader.root}"
    if alternative:
        torch, alt_cuda = alternative
        hints.append(f"or use torch {torch} (a CUDA {alt_cuda} build: the wheelhouse serves it and this machine builds "
                     f"for it), in this env or a new one: `uv pip install --python {python} torch=={torch}` then "
                     f"`builder install {names} --python {python}{from_flag}`{alternative_caveats(alt_cuda, env, machine)}")
    if can and skipped:
        not_built = f"{skipped} keeps this command from building one (this machine could, with {why})"
    elif can:
        not_built = f"the one built here with {why} does not fit either"
    else:
        not_built = f"this machine cannot build one: {why}"
    gap = platform_gap(missing, env)
    return InstallError(
        f"no {names} wheel fits {python}{': ' + gap if gap else ''} (torch {env.torch}, CUDA {cuda}, Python "
        f"{env.python}{', ' + env.machine if env.cross else ''}) and {not_built}",
        extra=tuple(f"hint: {h}" for h in hints) + tuple(
            f"{c.package} in {reader.root}: " + ("; ".join(f"{v.wheel.filename}: {', '.join(v.reasons)}"
                                                           for v in c.verdicts) or "no wheels") for c in missing),
    )


def platform_gap(missing: list[Choice], env: EnvFacts) -> str:
    """``the wheelhouse has causal-conv1d only for x86_64; this env is aarch64``, where every wheel of a missing
    package is for another platform than the env's; "" where that is not why nothing fits."""
    gaps = []
    for choice in missing:
        offered = {p for v in choice.verdicts for p in v.wheel.platforms}
        if offered and env.machine not in offered and all(v.wheel.platforms for v in choice.verdicts):
            gaps.append(f"{choice.package} only for {', '.join(sorted(offered))}")
    return f"the wheelhouse has {'; '.join(gaps)}; this env is {env.machine}" if gaps else ""


def cross_flags(env: EnvFacts, machine: MachineFacts, cuda: CudaVersion | None) -> str:
    """`` --platform aarch64`` for an env of another platform than this machine's ("" for one of its own), with
    ``--toolchain host|pip`` where a container engine answers here: ``auto`` would pick the container toolchain,
    which builds for this machine's platform only."""
    if not env.cross:
        return ""
    toolchain = machine.cross_toolchain(cuda) if machine.engine and cuda else None
    return f" --platform {env.machine}" + (f" --toolchain {toolchain}" if toolchain else "")


def arch_example(env: EnvFacts) -> str:
    """What ``--arch`` to name, for the env's platform: aarch64 machines are GH200 … DGX Spark, not RTX cards."""
    if env.machine == "aarch64":
        return "e.g. 90 (GH200), 100 (GB200), 121 (DGX Spark / GB10)"
    return "e.g. 120"


def _minor(python: str) -> str:
    v = Version(python)
    return f"{v.major}.{v.minor}"


def check_torch_unchanged(before: EnvFacts, after_torch: str | None) -> None:
    if before.torch != after_torch:
        raise ToolchainError(f"torch changed from {before.torch} to {after_torch} during the install",
                             "this is a bug in builder install; reinstall your torch and report it")


# ------------------------------------------------------------------------------------------- the command


@dataclass(frozen=True, kw_only=True)
class InstallRequest:
    packages: tuple[str, ...]
    python: Path
    source: str  # wheelhouse root: a folder or URL
    arch: str | None = None  # for a wheel built here when none fits
    build: bool = True
    dry_run: bool = False
    allow_origins: tuple[str, ...] = ()  # --allow-origin: wheel links the pages may make beyond the root's


@dataclass(frozen=True)
class InstallOutcome:
    python: Path
    installed: tuple[IndexedWheel, ...]
    built: tuple[str, ...]
    command: str | None
    torch: str | None
    why: Mapping[str, str] = field(default_factory=dict)  # wheel file → why it was chosen (stable-ABI wheels)
    would_build: tuple[str, ...] = ()  # --dry-run: the builds it would run here, as commands

    def summary(self) -> list[str]:
        lines = [f"built here: {name}" for name in self.built]
        if self.command and not self.installed:
            lines.append(f"would run: {self.command}")
            lines += [f"  {name}: {line}" for name, line in self.why.items()]
        lines += [f"would build here: {command}" for command in self.would_build]
        lines += [f"installed: {w.filename}" + (f" ({self.why[w.filename]})" if w.filename in self.why else "")
                  for w in self.installed]
        if self.torch and (self.installed or self.built):
            lines.append(f"torch {self.torch} in {self.python}: unchanged")
        elif self.torch:
            lines.append(f"torch {self.torch} in {self.python}: would stay (held by torch=={self.torch} in the command)")
        return lines


def torch_distribution(python: Path) -> str | None:
    """torch's installed distribution version, read without importing torch (for the check after installing)."""
    code = "import importlib.metadata as m\ntry:\n print(m.version('torch'))\nexcept Exception:\n print('')"
    from builder.user.envprobe import interpreter_argv

    result = subprocess.run([*interpreter_argv(python), "-c", code], capture_output=True, text=True, check=False)
    return result.stdout.strip() or None


def install(request: InstallRequest, settings: Settings) -> InstallOutcome:
    import os

    from builder.model.recipe import expand_name
    from builder.user.envprobe import probe_env
    from builder.user.machine import machine_facts

    names = [n for p in request.packages for n in expand_name(p, settings.recipes_dir)]
    report = probe_env(request.python)
    python = report.python.executable
    machine = machine_facts(os.environ, settings)
    facts = env_facts(report, machine)
    if facts.torch is None:
        raise InstallError(f"{python} has no torch ({report.torch.error or 'not installed'})",
                           "install the torch you use there first: builder install never chooses torch for you")
    reader = WheelhouseReader(request.source, allow=request.allow_origins)
    choices = choose(names, facts, reader) if _readable(reader) else [Choice(n, (), None) for n in names]
    built: list[str] = []
    missing = [c for c in choices if c.chosen is None]
    if missing and request.build and not request.dry_run:
        built = _build_missing(missing, facts, report.python.minor, machine, request, settings)
        if built:  # a wheel built here is in the local wheelhouse, which may not be the one given with --from
            local = WheelhouseReader(settings.wheelhouse, allow=request.allow_origins)
            choices = [choose([c.package], facts, local)[0] if c.package in built else c for c in choices]
    wheels = [c.chosen for c in choices if c.chosen is not None]
    why = {c.chosen.filename: f"{c.why}; channel {c.chosen.index_url_for(facts)}" for c in choices
           if c.chosen is not None and c.why}
    check_channels(wheels, facts, reader, request.allow_origins)
    argv = run_argv(python, wheels, facts, offline=settings.offline) if wheels else None
    command = shlex.join(argv) if argv else None
    installed: tuple[IndexedWheel, ...] = ()
    if argv and not request.dry_run:
        log.step(f"installing {', '.join(w.filename for w in wheels)} into {python}")
        for name, line in why.items():
            log.info(f"  {name}: {line}")
        run_install(argv, python, wheels)
        installed = tuple(wheels)
        check_torch_unchanged(facts, torch_distribution(python))
    still = [c for c in choices if c.chosen is None]
    would_build: tuple[str, ...] = ()
    if still and request.dry_run and request.build:
        would_build = planned_builds(still, facts, report.python.minor, machine, request, settings)
        if len(would_build) == len(still):  # every missing one would be built: the dry run would succeed
            return InstallOutcome(python, (), (), command, facts.torch, why, would_build)
    if still:
        skipped = "--dry-run" if request.dry_run else None if request.build else "--no-build"
        error = ways_forward(still, choices, facts, machine, reader, python, _archs(request, facts, required=False),
                             skipped=skipped)
        done = f"installed {', '.join(w.filename for w in installed)}; " if installed else ""
        planned = (f"would run: {command}",) if request.dry_run and command else ()
        raise InstallError(done + error.message, error.hint, extra=planned + error.extra)
    return InstallOutcome(python, installed, tuple(built), command, facts.torch, why)


def check_channels(wheels: list[IndexedWheel], facts: EnvFacts, reader: WheelhouseReader,
                   allow: tuple[str, ...]) -> None:
    """The channel pages uv will read for ``wheels`` link nothing outside their wheelhouse's origins (its root,
    its assets.json's prefix, --allow-origin): uv fetches whatever a page names, so the rule ``index pull``
    follows is applied before a URL is handed to uv."""
    for index_url in dict.fromkeys(w.index_url_for(facts) for w in wheels):
        root = next(w.wheelhouse for w in wheels if w.index_url_for(facts) == index_url)
        (reader if root == reader.root else WheelhouseReader(root, allow=allow)).check_channel(index_url)


def _readable(reader: WheelhouseReader) -> bool:
    """A local wheelhouse that does not exist yet is empty (a build may fill it); a remote one must answer."""
    if reader.local_path is not None and not Layout(reader.local_path).simple.is_dir():
        return False
    reader.check()
    return True


def _archs(request: InstallRequest, facts: EnvFacts, *, required: bool) -> tuple[Arch, ...]:
    from builder.model.arch import parse_arch_list

    if request.arch:
        return parse_arch_list(request.arch)
    if facts.gpus:
        return parse_arch_list(",".join(str(cc) for cc in facts.gpus))
    if required and facts.cross:
        raise InstallError(f"no GPU here to take the {facts.machine} wheel's arch from (this env runs here under qemu)",
                           "pass --arch of the machine it is for, e.g. --arch 90 (GH200), --arch 100 (GB200), "
                           "--arch 121 (DGX Spark / GB10)")
    if required:
        raise InstallError("no GPU here to take the wheel's arch from",
                           "pass --arch, e.g. --arch 120 (RTX 50xx / RTX PRO 6000), --arch 90 (H100/H200)")
    return ()


def planned_builds(missing: list[Choice], facts: EnvFacts, python_minor: str, machine: MachineFacts,
                   request: InstallRequest, settings: Settings) -> tuple[str, ...]:
    """What ``_build_missing`` would run, as `builder build` commands (--dry-run): only those this machine can
    build, with the archs it would use (none given and no GPU here: the command says --arch is needed)."""
    from builder.model.arch import format_arch_list
    from builder.model.recipe import find_recipe, load_recipe

    if facts.torch is None or facts.torch_cuda is None:
        return ()
    version, cuda = Version(facts.torch), CudaVersion.parse(facts.torch_cuda)
    index = f" --torch-index {cuda.flavour}" if version.local else ""
    commands = []
    for choice in missing:
        gpu_code = load_recipe(find_recipe(choice.package, settings.recipes_dir), settings.patches_dir).kind.is_cuda
        if gpu_code and not machine.can_build(cuda, facts.platform)[0]:
            continue
        archs = _archs(request, facts, required=False) if gpu_code else ()
        arch = f" --arch {format_arch_list(archs)}" if archs else (
            " --arch <your GPU's arch: none here to take it from>" if gpu_code else "")
        cross = cross_flags(facts, machine, cuda) if gpu_code else ""
        commands.append(f"builder build {choice.package}{cross} --cuda {cuda.line}{arch} "
                        f"--python {python_minor} --torch {version.public}{index}")
    return tuple(commands)


def _build_missing(missing: list[Choice], facts: EnvFacts, python_minor: str, machine: MachineFacts,
                   request: InstallRequest, settings: Settings) -> list[str]:
    """Build what no wheel fits, where this machine can: against the env's torch version, in a build venv of
    the builder's (the user's env gets nothing but the finished wheel)."""
    from builder.core.settings import default_jobs
    from builder.model.recipe import find_recipe, load_recipe
    from builder.pipeline.run import BuildOptions, run_build
    from builder.stages.plan import Target

    built: list[str] = []
    if facts.torch is None or facts.torch_cuda is None:
        return built
    version = Version(facts.torch)
    cuda = CudaVersion.parse(facts.torch_cuda)
    index = cuda.flavour if version.local else None  # PyTorch's own channel
    for choice in missing:
        gpu_code = load_recipe(find_recipe(choice.package, settings.recipes_dir), settings.patches_dir).kind.is_cuda
        if gpu_code and not machine.can_build(cuda, facts.platform)[0]:
            continue
        archs = _archs(request, facts, required=gpu_code) if gpu_code else ()
        platform = facts.platform or this_machine()
        log.step(f"no {choice.package} wheel fits; building one here (CUDA {facts.torch_cuda}, torch {version.public}"
                 + (f", cross-compiled for {platform})" if facts.cross and gpu_code else ")"))
        toolchain = (machine.cross_toolchain(cuda) or "auto") if facts.cross and gpu_code else "auto"
        target = Target(package=choice.package, cuda=cuda, archs=archs, python=PythonSpec(python_minor),
                        torch=version.public, torch_index=index, jobs=default_jobs(), platform=platform,
                        toolchain=toolchain)
        result = run_build(target, settings, BuildOptions())
        built.append(choice.package)
        log.ok(f"{result.status}: {result.wheel}")
    return built
