"""``builder install``: the fitting wheels from a wheelhouse into a user's environment, never touching its torch.

Per package the newest wheel that fits the env (fit.py) is installed from its channel, pinned exactly
(``pkg==1.7.0+cu130torch2.14``), with the env's own torch as a constraint, so no resolver can swap torch. When
nothing fits, a wheel is built here if this machine can compile for the env's CUDA; otherwise the command stops
with the concrete ways forward. torch is checked again afterwards.
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from .arch import Arch, format_arch_list
from .errors import InstallError, ToolchainError
from .fit import EnvFacts, IndexedWheel, Verdict, WheelhouseReader, best, env_label, judge, label_cuda
from .log import log
from .machine import MachineFacts
from .uvtool import install_failure, uv_bin


@dataclass(frozen=True)
class Choice:
    """One requested package: every wheel the wheelhouse has for it, judged, and the one to install (or None)."""

    package: str
    verdicts: tuple[Verdict, ...]
    chosen: IndexedWheel | None


def choose(packages: list[str], env: EnvFacts, reader: WheelhouseReader) -> list[Choice]:
    choices = []
    for package in packages:
        verdicts = tuple(judge(w, env) for w in reader.wheels(package))
        picked = best(list(verdicts))
        choices.append(Choice(package, verdicts, picked.wheel if picked else None))
    return choices


def install_argv(python: Path, wheels: list[IndexedWheel], env: EnvFacts, reader: WheelhouseReader,
                 constraints: Path | None = None, *, tool: str = "uv") -> list[str]:
    """The install command: each wheel's channel as an extra index, exact pins, torch held where it is."""
    indexes: list[str] = []
    for wheel in wheels:
        url = reader.channel_url(wheel.label) if wheel.label else reader.simple_url()
        if url not in indexes:
            indexes.append(url)
    pins = [f"{w.project}=={w.version}" for w in wheels]
    hold = [f"torch=={env.torch}"] if env.torch else []
    index_args = [a for url in indexes for a in ("--extra-index-url", url)]
    if tool == "pip":
        return [str(python), "-m", "pip", "install", *index_args, *pins, *hold]
    head = [uv_bin() if tool == "uv-internal" else "uv", "pip", "install", "--python", str(python), *index_args]
    if constraints is not None:
        return [*head, "--constraint", str(constraints), *pins]
    return [*head, *pins, *hold]


def run_install(python: Path, wheels: list[IndexedWheel], env: EnvFacts, reader: WheelhouseReader) -> None:
    """Install ``wheels`` with uv, the env's torch given as a constraint (a requirement it already meets)."""
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "hold-torch.txt"
        constraints.write_text(f"torch=={env.torch}\n" if env.torch else "")
        argv = install_argv(python, wheels, env, reader, constraints, tool="uv-internal")
        log.command(argv)
        result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        raise install_failure(f"installing {', '.join(w.filename for w in wheels)}", result.stderr,
                              where=python.parent.parent)
    for line in result.stderr.splitlines():
        if line.strip() and not line.startswith(("Using Python", "Resolved", "Prepared", "Audited")):
            log.info(f"  {line.strip()}")


def torch_for_this_machine(choices: list[Choice], machine: MachineFacts, env: EnvFacts) -> tuple[str, str] | None:
    """A torch (version, CUDA) this machine can build for, preferring one the wheelhouse already serves
    for the same Python: the way forward when the env's own CUDA cannot be compiled here."""
    seen: list[tuple[Version, str]] = []
    for choice in choices:
        for verdict in choice.verdicts:
            pin, cuda = verdict.wheel.torch_pin, label_cuda(verdict.wheel.label)
            if pin is None or cuda is None or not machine.can_build(cuda)[0]:
                continue
            exact = [s.version for s in pin if s.operator in ("==", "===") and "*" not in s.version]
            if exact and not any("built for" in r or "requires Python" in r for r in verdict.reasons):
                seen.append((Version(exact[0]), cuda))
    if seen:
        version, cuda = max(seen)
        return str(version), cuda
    return None


def ways_forward(missing: list[Choice], choices: list[Choice], env: EnvFacts, machine: MachineFacts,
                 reader: WheelhouseReader, python: Path, archs: tuple[Arch, ...]) -> InstallError:
    """The refusal when nothing fits and this machine cannot build: what would carry it, what works here."""
    names = " ".join(c.package for c in missing)
    cuda = env.torch_cuda or "cpu"
    label = env_label(env.torch, env.torch_cuda) if env.torch and env.torch_cuda else None
    _, why = machine.can_build(cuda) if env.torch_cuda else (False, "the env's torch is a CPU build")
    arch_text = format_arch_list(archs) if archs else "<your GPU's arch, e.g. 120>"
    torch_public = Version(env.torch).public if env.torch else "?"
    index_flag = f" --torch-index cu{cuda.replace('.', '')}" if env.torch and Version(env.torch).local else ""
    hints = []
    if label:
        hints.append(f"on a machine with Docker or a CUDA {cuda} toolkit: `builder build {missing[0].package} "
                     f"--cuda {cuda} --arch {arch_text} --torch {torch_public}{index_flag}`; its wheel lands in channel "
                     f"{reader.channel_url(label)} and this command then installs it")
    alternative = torch_for_this_machine(choices, machine, env)
    if alternative:
        torch, alt_cuda = alternative
        hints.append(f"or use a CUDA {alt_cuda} torch, which this machine can build for: `uv pip install --python "
                     f"{python} torch=={torch}` then `builder install {names} --python {python}`")
    return InstallError(
        f"no {names} wheel fits {python} (torch {env.torch}, CUDA {cuda}, Python {env.python}) and this machine "
        f"cannot build one: {why}",
        extra=tuple(f"hint: {h}" for h in hints) + tuple(
            f"{c.package} in {reader.root}: " + ("; ".join(f"{v.wheel.filename}: {', '.join(v.reasons)}"
                                                           for v in c.verdicts) or "no wheels") for c in missing),
    )


def describe_missing_build(env: EnvFacts) -> str:
    if env.torch is None:
        return "no torch is installed there"
    if env.torch_cuda is None:
        return f"its torch {env.torch} is a CPU build"
    return ""


def check_torch_unchanged(before: EnvFacts, after_torch: str | None) -> None:
    if before.torch != after_torch:
        raise ToolchainError(f"torch changed from {before.torch} to {after_torch} during the install",
                             "this is a bug in builder install; reinstall your torch and report it")


def shell(argv: list[str]) -> str:
    return shlex.join(argv)
