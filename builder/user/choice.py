"""The wheel chosen per requested package (Choice, choose) and, where none fits, the ways forward: what would build
one, which torch this machine could serve instead, what moving to it takes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from builder.core.errors import InstallError
from builder.model.arch import Arch, format_arch_list
from builder.model.cuda import CudaVersion
from builder.user.fit import EnvFacts, IndexedWheel, Verdict, best, env_label, judge, python_fits
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

def torch_for_this_machine(choices: list[Choice], machine: MachineFacts,
                           env: EnvFacts) -> tuple[str, CudaVersion] | None:
    """A torch (version, CUDA) this machine can build for, preferring one the wheelhouse already serves
    for the same Python: the way forward when the env's own CUDA cannot be compiled here."""
    seen: list[tuple[Version, CudaVersion]] = []
    for choice in choices:
        for verdict in choice.verdicts:
            if not python_fits(verdict.wheel, env):
                continue
            if verdict.wheel.facts.by_cuda_major:  # stable-ABI or per torch by CUDA major: each torch it was
                # verified on is served, in that torch's channel
                for check in verdict.wheel.torch_checks:
                    try:
                        line, channel = CudaVersion.parse(check.cuda), check.channel
                    except InvalidVersion:
                        continue
                    if check.passed and channel in verdict.wheel.channels and machine.can_build(line, env.platform)[0]:
                        seen.append((Version(Version(check.torch).public), line))
                continue
            pin, cuda = verdict.wheel.torch_pin, verdict.wheel.facts.label_cuda_line
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
    arch_text = format_arch_list(archs) if archs else f"\"<your GPU's arch, {arch_example(env)}>\""  # a shell: no <
    torch_public = Version(env.torch).public if env.torch else "?"
    index_flag = f" --torch-index {torch_cuda.flavour}" if torch_cuda and env.torch and Version(env.torch).local else ""
    hints = []
    if label and env.cross:  # another platform's env (aarch64 here): a cross build, with the env's Python
        where = ("cross-build it on this machine" if can else f"on a machine with a CUDA {cuda} toolkit and "
                 f"{env.platform.cross_prefix if env.platform else ''}g++ (a cross build), or an {env.machine} one")
        hints.append(f"{where}: `builder build {missing[0].package}{cross_flags(env, machine, torch_cuda)} --cuda "
                     f"{cuda} --arch {arch_text} --python {python_minor_of(env.python)} --torch {torch_public}{index_flag}`; "
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

def python_minor_of(python: str) -> str:
    v = Version(python)
    return f"{v.major}.{v.minor}"
