"""``builder install``: the fitting wheels from a wheelhouse into a user's environment, never touching its torch.

Per package the newest wheel that fits the env (fit.py) is installed from its channel, pinned exactly
(``pkg==1.7.0+cu130torch2.14``), with the env's own torch named exactly (``torch==2.14.1``), so no resolver can swap torch. A
stable-ABI wheel (``pkg==1.7.0+cu13``) comes from the env's own channel too (``cu130torch2.12``), which lists it
where it was verified on that torch. When
nothing fits, a wheel is built here if this machine can compile for the env's CUDA; otherwise the command stops
with the concrete ways forward. torch is checked again afterwards.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from builder.core.errors import InstallError, ToolchainError
from builder.core.log import log
from builder.core.settings import Settings, default_jobs
from builder.index.layout import Layout
from builder.model.arch import Arch, format_arch_list, parse_arch_list
from builder.model.cuda import CudaVersion
from builder.model.platform import this_machine
from builder.model.python import PythonSpec
from builder.model.recipe import expand_name, find_recipe, load_recipe
from builder.pipeline.run import BuildOptions, run_build
from builder.stages.plan import Target
from builder.user.choice import Choice, choose, cross_flags, ways_forward
from builder.user.envprobe import EnvReport, PackageSpec, probe_env
from builder.user.fit import EnvFacts, IndexedWheel, env_facts
from builder.user.installer import (
    ProviderView,
    installed_states,
    matching_variant,
    run_argv,
    run_install,
    uv_knows_variants,
    variant_notes,
)
from builder.user.interpreter import interpreter_argv
from builder.user.machine import MachineFacts, machine_facts
from builder.user.probecache import probe_memo
from builder.user.superseded import installed_superseded
from builder.user.wheelhouse import WheelhouseReader, project_wheelhouse


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
    torch_range: bool = False  # a wheel built here: also check it beside the other torches of its range (--torch-range)
    allow_origins: tuple[str, ...] = ()  # --allow-origin: wheel links the pages may make beyond the root's
    refresh: bool = False  # --refresh: probe the env even where an answer of it unchanged is remembered


@dataclass(frozen=True)
class InstallOutcome:
    python: Path
    installed: tuple[IndexedWheel, ...]
    built: tuple[str, ...]
    command: str | None
    torch: str | None
    why: Mapping[str, str] = field(default_factory=dict)  # wheel file → why it was chosen (stable-ABI wheels)
    would_build: tuple[str, ...] = ()  # --dry-run: the builds it would run here, as commands
    checks: str = ""  # --dry-run with builds: what those builds check, and the flag that checks more
    files: Mapping[str, str] = field(default_factory=dict)  # wheel file → the file installed (a variant's)

    def summary(self) -> list[str]:
        lines = [f"built here: {name}" for name in self.built]
        if self.command and not self.installed:
            lines.append(f"would run: {self.command}")
            lines += [f"  {name}: {line}" for name, line in self.why.items()]
        lines += [f"would build here: {command}" for command in self.would_build]
        if self.would_build and self.checks:
            lines.append(self.checks)
        lines += [f"installed: {self.files.get(w.filename, w.filename)}"
                  + (f" ({self.why[w.filename]})" if w.filename in self.why else "") for w in self.installed]
        if self.torch and (self.installed or self.built):
            lines.append(f"torch {self.torch} in {self.python}: unchanged")
        elif self.torch:
            lines.append(f"torch {self.torch} in {self.python}: would stay (held by torch=={self.torch} in the command)")
        return lines


def torch_distribution(python: Path) -> str | None:
    """torch's installed distribution version, read without importing torch (for the check after installing)."""
    code = "import importlib.metadata as m\ntry:\n print(m.version('torch'))\nexcept Exception:\n print('')"
    result = subprocess.run([*interpreter_argv(python), "-c", code], capture_output=True, text=True, check=False)
    return result.stdout.strip() or None


def install(request: InstallRequest, settings: Settings) -> InstallOutcome:
    names = [n for p in request.packages for n in expand_name(p, settings.recipes_dir)]
    report = probe_env(request.python, [PackageSpec(n) for n in names], memo=probe_memo(settings),
                       refresh=request.refresh)
    python = report.python.executable
    machine = machine_facts(os.environ, settings)
    facts = env_facts(report, machine)
    if facts.torch is None:
        raise InstallError(f"{python} has no torch ({report.torch.error or 'not installed'})",
                           "install the torch you use there first: builder install never chooses torch for you")
    reader = WheelhouseReader(request.source, allow=request.allow_origins)
    absent = None if _readable(reader) else missing_wheelhouse(reader, request, names, facts, settings, python)
    choices = choose(names, facts, reader) if absent is None else [Choice(n, (), None) for n in names]
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
    view = ProviderView.of(os.environ, facts.gpus or tuple(g.cc for g in machine.driver.gpus), machine.driver.cuda)
    for note in variant_notes(wheels, view):
        log.warning(note)
    reinstall = superseded_installs(report, wheels)
    reinstall += tuple(p for p in variant_swaps(python, wheels, view) if p not in reinstall)
    argv = run_argv(python, wheels, facts, offline=settings.offline, reinstall=reinstall) if wheels else None
    command = shlex.join(argv) if argv else None
    installed: tuple[IndexedWheel, ...] = ()
    files: dict[str, str] = {}
    if argv and not request.dry_run:
        log.step(f"installing {', '.join(w.filename for w in wheels)} into {python}")
        for name, line in why.items():
            log.info(f"  {name}: {line}")
        files = run_install(argv, python, wheels)
        installed = tuple(wheels)
        check_torch_unchanged(facts, torch_distribution(python))
    still = [c for c in choices if c.chosen is None]
    would_build: tuple[str, ...] = ()
    if still and request.dry_run and request.build:
        would_build = planned_builds(still, facts, report.python.minor, machine, request, settings)
        if len(would_build) == len(still):  # every missing one would be built: the dry run would succeed
            return InstallOutcome(python, (), (), command, facts.torch, why, would_build,
                                  build_checks(facts.torch, request.torch_range))
    if still:
        skipped = "--dry-run" if request.dry_run else None if request.build else "--no-build"
        error = ways_forward(still, choices, facts, machine, reader, python, _archs(request, facts, required=False),
                             skipped=skipped)
        done = f"installed {', '.join(w.filename for w in installed)}; " if installed else ""
        planned = (f"would run: {command}",) if request.dry_run and command else ()
        raise InstallError(done + error.message, error.hint, extra=planned + ((absent,) if absent else ()) + error.extra)
    return InstallOutcome(python, installed, tuple(built), command, facts.torch, why, files=files)


def variant_swaps(python: Path, wheels: list[IndexedWheel], view: ProviderView) -> tuple[str, ...]:
    """The wheels with variants whose plain wheel is installed already, at the same version: uv keeps an installed
    file of the pinned version, so it is told to reinstall where a thin wheel matches this machine's GPU (or the
    FORCE variables'); where none does, or uv here knows no variants, it says why the plain wheel stays."""
    with_variants = [w for w in wheels if w.variants]
    states = installed_states(python, [w.project for w in with_variants])
    out = []
    for wheel in with_variants:
        state = states.get(wheel.project)
        if state is None or state.label is not None or Version(state.version) != wheel.version:
            continue
        label = matching_variant(wheel, view.gpus)
        if label is not None and uv_knows_variants():
            log.info(f"  {wheel.project} {state.version} is installed as the plain wheel: --reinstall-package "
                     f"{wheel.project}, so uv can take the {label} variant ({view.source})")
            out.append(wheel.project)
        else:
            why = ("the uv this tool runs knows no variants" if label is not None else
                   f"no thin wheel matches {view.source}" + (f" ({', '.join(f'sm_{c}' for c in view.gpus)})"
                                                             if view.gpus else ""))
            log.info(f"  {wheel.project} {state.version} stays the plain wheel: {why}")
    return tuple(out)


def build_checks(torch: str, whole_range: bool) -> str:
    """What a wheel built by ``builder install`` is checked against: the env's own torch (the one it will run
    beside); other torches of its range only with --torch-range (each a fresh venv and a torch download)."""
    public = Version(torch).public
    if whole_range:
        return (f"each build checks its wheel beside your torch {public} and (--torch-range) beside the other "
                "torches of its range: a fresh venv and a torch download (GBs) each")
    return (f"each build checks its wheel beside your torch {public} only; --torch-range also checks it beside the "
            "other torches of its range (a fresh venv and a torch download, GBs, each)")


def superseded_installs(report: EnvReport, wheels: list[IndexedWheel]) -> tuple[str, ...]:
    """The chosen wheels whose project is installed as a superseded build of the same version (user/superseded.py):
    uv must be told to reinstall those, or it keeps the old file."""
    out = []
    for wheel in wheels:
        try:
            package = report.package(wheel.project)
        except KeyError:
            continue
        old = installed_superseded(package, None, [wheel])
        if old is not None:
            log.info(f"  {old.package} {old.version} build {old.build} is superseded by build {old.newest} "
                     f"({wheel.filename}): reinstalling it")
            out.append(wheel.project)
    return tuple(out)


def check_channels(wheels: list[IndexedWheel], facts: EnvFacts, reader: WheelhouseReader,
                   allow: tuple[str, ...]) -> None:
    """The channel pages uv will read for ``wheels`` link nothing outside their wheelhouse's origins (its root,
    its assets.json's prefix, --allow-origin): uv fetches whatever a page names, so the rule ``index pull``
    follows is applied before a URL is handed to uv."""
    for index_url in dict.fromkeys(w.index_url_for(facts) for w in wheels):
        root = next(w.wheelhouse for w in wheels if w.index_url_for(facts) == index_url)
        (reader if root == reader.root else WheelhouseReader(root, allow=allow)).check_channel(index_url)


def missing_wheelhouse(reader: WheelhouseReader, request: InstallRequest, names: list[str], facts: EnvFacts,
                       settings: Settings, python: Path) -> str:
    """A local wheelhouse that is not there (install run outside the project folder, or --from a wrong folder):
    say so and where it looked. Where the project folder this builder runs from has a wheelhouse with a fitting
    wheel of what is asked, stop and point there (--from) instead of compiling one for many minutes."""
    path = reader.local_path
    here = path == Path.cwd().resolve() / "wheelhouse"
    looked = f"found no wheelhouse at {path}" + (
        " (./wheelhouse of the current folder, where builder install looks unless --from names one)" if here else "")
    project = project_wheelhouse()
    if project is not None and project.resolve() != path:
        offered = choose(names, facts, WheelhouseReader(project, allow=request.allow_origins))
        fitting = [c.chosen.filename for c in offered if c.chosen is not None]
        if fitting:
            raise InstallError(f"{looked}; the project's wheelhouse {project} has {', '.join(fitting)}, which "
                               "fits this env",
                               f"install from it: `builder install {' '.join(request.packages)} --python {python} "
                               f"--from {project}`")
        looked += f"; the project's wheelhouse {project} has no wheel of {', '.join(names)} that fits this env either"
    if request.build and settings.wheelhouse == path:
        looked += "; a wheel built here is published there"
    log.warning(looked)
    return looked


def _readable(reader: WheelhouseReader) -> bool:
    """A local wheelhouse that does not exist yet is empty (a build may fill it); a remote one must answer."""
    if reader.local_path is not None and not Layout(reader.local_path).simple.is_dir():
        return False
    reader.check()
    return True


def _archs(request: InstallRequest, facts: EnvFacts, *, required: bool) -> tuple[Arch, ...]:
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
            " --arch \"<your GPU's arch: none here to take it from>\"" if gpu_code else "")  # quoted: no redirection
        cross = cross_flags(facts, machine, cuda) if gpu_code else ""
        only_own = "" if request.torch_range else " --no-torch-range"
        commands.append(f"builder build {choice.package}{cross} --cuda {cuda.line}{arch} "
                        f"--python {python_minor} --torch {version.public}{index}{only_own}")
    return tuple(commands)


def _build_missing(missing: list[Choice], facts: EnvFacts, python_minor: str, machine: MachineFacts,
                   request: InstallRequest, settings: Settings) -> list[str]:
    """Build what no wheel fits, where this machine can: against the env's torch version, in a build venv of
    the builder's (the user's env gets nothing but the finished wheel)."""
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
        log.info(f"  {build_checks(facts.torch, request.torch_range)}")
        toolchain = (machine.cross_toolchain(cuda) or "auto") if facts.cross and gpu_code else "auto"
        target = Target(package=choice.package, cuda=cuda, archs=archs, python=PythonSpec(python_minor),
                        torch=version.public, torch_index=index, jobs=default_jobs(), platform=platform,
                        toolchain=toolchain)
        result = run_build(target, settings, BuildOptions(torch_range=request.torch_range))
        built.append(choice.package)
        log.ok(f"{result.status}: {result.wheel}")
    return built
