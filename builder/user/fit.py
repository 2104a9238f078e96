"""Which published wheels fit a user's environment, decided per wheel (user/wheelhouse.py reads them).

A wheel fits an environment when its Python tags are accepted there, its torch pin holds the installed torch, its
local label names that torch's CUDA, and (GPU code, a GPU known) it carries SASS or PTX the GPU can run. Its platform
tag must name the env's CPU: an aarch64 env (GH200, DGX Spark) takes no x86_64 wheel, and the reason says so by
platform, not by tag (a channel holds both platforms' files, as PyPI does; the installer picks by tag).

A stable-ABI wheel (model/abi.py: ``+cu13``, ``cp310-abi3``, ``torch>=2.11``) serves a torch range: it fits an env
whose torch meets its requirement, is a build for the wheel's CUDA major, and whose torch minor on that CUDA line it
was verified on (its record's torch checks; index/channelpolicy.wheel_channels, the rule the pages list it by). It is
installed from that env's own channel (``cu130torch2.12``), where the index lists it. A per-torch wheel labelled by
CUDA major (``+cu12torch2.9``) is judged the same way for its one torch minor. A pure-Python wheel built once
(``py3-none-any``, unlabelled, with a record: stages/torchrange.py ``built_once``) is judged the same way with no
CUDA major, and installed from that env's channel, torch held where it is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

from packaging.specifiers import SpecifierSet
from packaging.tags import Tag
from packaging.version import InvalidVersion, Version

from builder.core.wheelfile import parse_wheel_name
from builder.index.layout import simple_path
from builder.model.abi import torch_minor
from builder.model.arch import runs_on
from builder.model.cuda import CudaVersion
from builder.model.label import Label
from builder.model.platform import Platform, of_wheel_platform, this_machine
from builder.model.records import TorchCheck, cuda_or_none
from builder.model.wheelfacts import Wheel
from builder.stages.torchrange import GPU_KERNEL_TESTS
from builder.user.envprobe import EnvReport, known_platform
from builder.user.machine import MachineFacts


@dataclass(frozen=True, kw_only=True)
class EnvFacts:
    """What fitting needs to know about an environment."""

    python: str  # full version, 3.12.1
    tags: frozenset[str]  # e.g. cp312-cp312-manylinux_2_36_x86_64, py3-none-any
    torch: str | None  # 2.10.0, 2.11.0+cu128; None when torch is not installed
    torch_cuda: str | None  # 12.8; None for a CPU torch
    gpus: tuple[int, ...] = ()  # compute capabilities: 90, 120
    torch_dependents: tuple[str, ...] = ()  # what pins torch in the env: "torchvision (torch==2.14.1)"
    machine: str = "x86_64"  # the env's CPU platform (x86_64, aarch64), as its interpreter says (uname -m)

    @property
    def platform(self) -> Platform | None:
        """The env's platform; None for a machine the builder makes no wheels for."""
        return known_platform(self.machine)

    @property
    def cross(self) -> bool:
        """The env is another platform's than this machine (an aarch64 env here): its wheels are cross-built."""
        return self.platform is not None and self.platform != this_machine()


def wheel_platforms(filename: str) -> tuple[str, ...]:
    """The CPU platforms a wheel's tags name (``x86_64``, ``aarch64``); empty for a pure-Python (``any``) wheel."""
    tags = parse_wheel_name(filename)[3]
    return tuple(sorted({p.name for t in tags if (p := of_wheel_platform(t.platform)) is not None}))


@dataclass(frozen=True, kw_only=True)
class IndexedWheel:
    """One wheel as the wheelhouse's pages list it, plus what its sidecar and record say."""

    filename: str
    project: str
    version: Version
    label: str | None
    url: str
    wheelhouse: str  # the root URL of the wheelhouse that lists it (its channels are under it)
    requires_python: str | None
    requires: tuple[str, ...]  # Requires-Dist lines of its METADATA
    sass: tuple[str, ...] | None  # sm_120 …; None when the wheelhouse keeps no record of it
    ptx: tuple[str, ...] | None
    kernel_tests: str | None  # passed / skipped / failed, from the record
    abi: str | None = None  # the record's: "torch-stable" for a stable-ABI wheel, None for a per-torch one
    cuda: str = ""  # the record's CUDA (13.0)
    torch_checks: tuple[TorchCheck, ...] = ()  # a stable-ABI wheel: each torch it was tried on
    channels: tuple[str, ...] = ()  # the channels that list it (index/channelpolicy.wheel_channels)
    variants: tuple[str, ...] = ()  # labels of its PEP 825 variants listed beside it (sm90, sm120): uv may pick one
    built_once: bool = False  # a pure-Python wheel built once for every torch (unlabelled py3-none-any, recorded)

    @cached_property
    def facts(self) -> Wheel:
        """What it is (model/wheelfacts.py): from its file name, its record's ABI and CUDA, its Requires-Dist."""
        return Wheel.named(self.filename).with_record(
            abi=self.abi, cuda=cuda_or_none(self.cuda),
            recorded=self.built_once or self.abi is not None or bool(self.cuda)).with_requires(self.requires)

    @property
    def is_stable_abi(self) -> bool:
        """One wheel for a range of torches of one CUDA major (label ``cu13``, or a record saying so)."""
        return self.facts.stable

    @property
    def per_torch_major(self) -> bool:
        """A per-torch wheel labelled by CUDA major (``cu12torch2.9``): offered in the channel of each line of that
        major its checks passed on for its torch minor."""
        return self.facts.per_torch_major

    @property
    def ranged(self) -> bool:
        """Offered in the channel of each torch its checks passed on: stable-ABI, per-torch by CUDA major, or pure
        Python built once."""
        return self.facts.ranged

    @property
    def cuda_major(self) -> int | None:
        """A stable-ABI or per-torch wheel's CUDA major: its label's (``cu13``, ``cu12torch2.9``), else its record's;
        None where neither says."""
        return self.facts.cuda_major

    @property
    def torch_pin(self) -> SpecifierSet | None:
        """Its torch requirement (model/wheelfacts.py ``torch_requirement``); None where it names no torch."""
        return self.facts.torch_requirement

    @property
    def index_url(self) -> str:
        """The index that lists it for every env: its channel (the combined index for an unlabelled wheel and for a
        stable-ABI wheel, which is in one channel per verified torch instead: see ``index_url_for``)."""
        return self.wheelhouse + simple_path(None if self.ranged else self.label)

    def channel_for(self, env: EnvFacts) -> str | None:
        """The channel ``env`` installs it from: a per-torch wheel's own label; for a stable-ABI wheel (or a
        pure-Python one built once) the env's channel (``cu130torch2.12``) where the wheel is listed there, else
        None."""
        if not self.ranged:
            return self.label
        if env.torch is None or env.torch_cuda is None:
            return None
        label = env_label(env.torch, env.torch_cuda)
        return label if label in self.channels else None

    def index_url_for(self, env: EnvFacts) -> str:
        """The index to install it into ``env`` from: the channel of that env's torch and CUDA (see above)."""
        return self.wheelhouse + simple_path(self.channel_for(env))

    @property
    def has_gpu_code(self) -> bool:
        return bool(self.sass or self.ptx)

    @property
    def platforms(self) -> tuple[str, ...]:
        """The CPU platforms its tags name; empty for a pure-Python wheel, which serves every platform."""
        return wheel_platforms(self.filename)


@dataclass(frozen=True)
class Verdict:
    wheel: IndexedWheel
    reasons: tuple[str, ...]  # why it does not fit; empty when it fits
    channel: str | None = None  # the channel the env installs it from (a stable-ABI wheel: the env's own)
    why: str = ""  # why a stable-ABI wheel fits: the torch it was verified on ("" for a per-torch wheel)

    @property
    def fits(self) -> bool:
        return not self.reasons

    @property
    def kernel_tested(self) -> bool:
        """Its kernel tests passed: a per-torch wheel's (on its one torch); a stable-ABI wheel's on a torch of
        this env's channel (a ``gpu-kernel-tests`` check there); a pure-Python wheel's likewise."""
        if not self.wheel.ranged:
            return self.wheel.kernel_tests == "passed"
        return any(c.passed and c.how == GPU_KERNEL_TESTS and _check_channel(c) == self.channel
                   for c in self.wheel.torch_checks)


def label_cuda(label: str | None) -> CudaVersion | None:
    """``cu128torch2.10`` → 12.8; None for a label of another shape (model/label.py)."""
    parsed = Label.parse(label)
    return parsed.cuda_line if parsed is not None else None


def env_label(torch: str, torch_cuda: str) -> str:
    """The channel an environment's wheels live in: torch 2.10.0 with CUDA 12.8 → ``cu128torch2.10``."""
    return str(Label.channel(torch_cuda, torch))


def python_fits(wheel: IndexedWheel, env: EnvFacts) -> bool:
    """Whether the env's Python takes the wheel: one of its tags, and its Requires-Python."""
    tags = parse_wheel_name(wheel.filename)[3]
    return bool({str(t) for t in tags} & env.tags) and not _requires_python_fails(wheel, env)


def _requires_python_fails(wheel: IndexedWheel, env: EnvFacts) -> bool:
    return bool(wheel.requires_python) and not SpecifierSet(wheel.requires_python or "").contains(
        env.python, prereleases=True)


def judge(wheel: IndexedWheel, env: EnvFacts) -> Verdict:
    """Every reason ``wheel`` cannot be installed into ``env`` without changing its torch (none: it fits)."""
    reasons: list[str] = []
    _, _, _, tags = parse_wheel_name(wheel.filename)
    if not {str(t) for t in tags} & env.tags:
        other = _platform_reason(wheel, env)
        if other:
            reasons.append(other)
        if not _python_matches(tags, env):
            reasons.append(_tags_reason(tags, env))
        elif not other:  # its Python and CPU are the env's: the glibc (musl) part of the platform tag is not
            plats = ", ".join(sorted({t.platform for t in tags}))
            reasons.append(f"its platform tag ({plats}) is none this env takes (an older glibc, or not glibc)")
    if _requires_python_fails(wheel, env):
        reasons.append(f"requires Python {wheel.requires_python}")
    why = ""
    if wheel.ranged:
        ranged_reasons, why = _judge_ranged(wheel, env)
        reasons += ranged_reasons
    else:
        pin = wheel.torch_pin
        if pin is not None:
            if env.torch is None:
                reasons.append(f"needs torch{pin}; no torch is installed")
            elif not pin.contains(Version(env.torch), prereleases=True):
                reasons.append(f"pins torch{pin}, the env has torch {env.torch}")
        wheel_cuda = wheel.facts.label_cuda_line
        if wheel_cuda is not None and env.torch is not None:
            if env.torch_cuda is None:
                reasons.append(f"a CUDA {wheel_cuda} build; the env's torch is a CPU build")
            elif not CudaVersion.parse(env.torch_cuda).same_line(wheel_cuda):
                reasons.append(f"a CUDA {wheel_cuda} build; the env's torch is CUDA {env.torch_cuda}")
    if env.gpus and wheel.sass is not None and wheel.has_gpu_code:
        for cc in env.gpus:
            if not runs_on(wheel.sass, wheel.ptx or (), cc):
                code = ", ".join([*wheel.sass, *(wheel.ptx or ())])
                reasons.append(f"carries {code}, nothing an sm_{cc} GPU can run")
    return Verdict(wheel, tuple(reasons), wheel.channel_for(env), why if not reasons else "")


def _platform_reason(wheel: IndexedWheel, env: EnvFacts) -> str | None:
    """``an x86_64 wheel (linux_x86_64); this env is aarch64``: None where the wheel is for the env's platform."""
    platforms = wheel.platforms
    if not platforms or env.machine in platforms:
        return None
    tags = sorted({t.platform for t in parse_wheel_name(wheel.filename)[3]})
    return f"an {'/'.join(platforms)} wheel ({', '.join(tags)}); this env is {env.machine}"


def _python_matches(tags: frozenset[Tag], env: EnvFacts) -> bool:
    """Whether the env takes the wheel's Python and ABI tags, its platform tag aside."""
    pairs = {tuple(t.split("-")[:2]) for t in env.tags}
    return any((t.interpreter, t.abi) in pairs for t in tags)


def _tags_reason(tags: frozenset[Tag], env: EnvFacts) -> str:
    """Why none of a wheel's tags is the env's; an abi3 wheel names the oldest CPython its limited API serves."""
    interpreters = sorted({t.interpreter for t in tags})
    if tags and all(t.abi == "abi3" for t in tags):
        floors = sorted(f for i in interpreters if (f := _cpython(i)) is not None)
        if floors and _version_tuple(env.python) < floors[0]:
            major, minor = floors[0]
            return f"a cp{major}{minor}-abi3 wheel (CPython >= {major}.{minor}), not Python {env.python}"
        return f"its tags ({', '.join(sorted(str(t) for t in tags))}) are none of this env's (Python {env.python})"
    return f"built for {', '.join(interpreters)}, not Python {env.python}"


def _cpython(interpreter: str) -> tuple[int, int] | None:
    match = re.fullmatch(r"cp(\d)(\d+)", interpreter)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _version_tuple(python: str) -> tuple[int, int]:
    v = Version(python)
    return v.major, v.minor


def _judge_ranged(wheel: IndexedWheel, env: EnvFacts) -> tuple[list[str], str]:
    """A wheel offered across torches against the env's torch: its requirement (a stable wheel's floor, a
    pure-Python wheel's own), a stable wheel's CUDA major, and whether the env's torch minor on its CUDA line is one
    the wheel was verified on. (reasons, why it fits)."""
    pin = wheel.torch_pin
    if env.torch is None:
        return [f"needs torch{pin or ''}; no torch is installed"], ""
    reasons = []
    if pin is not None and not pin.contains(Version(env.torch), prereleases=True):
        whose = ("its stable-ABI floor" if wheel.is_stable_abi else "its torch minor" if wheel.per_torch_major
                 else "its own requirement")
        reasons.append(f"needs torch{pin} ({whose}), the env has torch {env.torch}")
    compiled = wheel.facts.by_cuda_major
    major = wheel.cuda_major if compiled else None  # pure Python: every CUDA line
    what = f"CUDA {major} torches" if major is not None else "CUDA torches"
    if env.torch_cuda is None:  # a channel is a CUDA line's: a pure-Python wheel is checked on CUDA torches only
        head = f"built for {what}" if compiled else "offered for the CUDA torches its checks passed on"
        return [*reasons, f"{head}; this env's torch {env.torch} is a CPU build"], ""
    cuda = CudaVersion.parse(env.torch_cuda)
    if major is not None and cuda.major != major:
        return [*reasons, f"built for {what}; this env's torch {env.torch} is CUDA {cuda.major}"], ""
    if reasons:  # below the floor: no torch there is verified, and the floor says so already
        return reasons, ""
    channel = env_label(env.torch, env.torch_cuda)
    minor = "{}.{}".format(*torch_minor(env.torch))
    if channel not in wheel.channels:
        return [_not_verified(wheel, channel, minor, cuda)], ""
    here = [c for c in wheel.torch_checks if c.passed and _check_channel(c) == channel]
    best_check = max(here, key=lambda c: (c.how == GPU_KERNEL_TESTS, Version(c.torch)), default=None)
    checked = f": {best_check.how} passed on torch {best_check.torch}" if best_check else ""
    kind = "stable-ABI" if wheel.is_stable_abi else "per-torch" if wheel.per_torch_major else "pure-Python"
    return [], f"the {kind} wheel verified on this env's torch {minor} with CUDA {cuda.line}{checked}" + (
        _other_python(wheel, best_check.python, env.python) if best_check else "")


def _other_python(wheel: IndexedWheel, checked: str, here: str) -> str:
    """``with Python 3.12; this env runs Python 3.13 (the same abi3 wheel)`` where the check ran on another Python
    minor than the env's (the same file serves both: cp310-abi3 or py3); empty where they are the same or the
    record does not say."""
    try:
        ran, runs = _version_tuple(checked), _version_tuple(here)
    except InvalidVersion:
        return ""
    if ran == runs:
        return ""
    tag = "py3" if wheel.built_once else "abi3"
    return (f" with Python {ran[0]}.{ran[1]}; this env runs Python {runs[0]}.{runs[1]} (the same {tag} wheel, "
            "not run on that Python by the checks)")


def _not_verified(wheel: IndexedWheel, channel: str, minor: str, cuda: CudaVersion) -> str:
    """Why the env's channel does not list a stable-ABI wheel: a failed check on its torch, or none made there."""
    failed = [c for c in wheel.torch_checks if not c.passed and _check_channel(c) == channel]
    if failed:
        check = failed[0]
        return (f"failed its {check.how or 'torch'} check on torch {check.torch} (CUDA {check.cuda})"
                + (f": {check.detail}" if check.detail else ""))
    verified = sorted({parts for c in wheel.channels if (parts := _channel_parts(c)) is not None},
                      key=lambda p: (Version(p[1]), p[0]))
    if not verified:
        return f"not verified on torch {minor}: no torch check of it passed"
    other_line = any(m == minor for _, m in verified)  # this minor, verified on another CUDA line than the env's
    head = f"not verified on torch {minor}" + (f" with CUDA {cuda.line}" if other_line else "")
    listed = dict.fromkeys(m if m != minor else f"{m} with CUDA {c.line}" for c, m in verified)
    return f"{head} (verified: {', '.join(listed)})"


def _check_channel(check: TorchCheck) -> str | None:
    """A check's channel label, None for a check that names no torch or CUDA version."""
    try:
        return check.channel
    except InvalidVersion:
        return None


def _channel_parts(label: str) -> tuple[CudaVersion, str] | None:
    """``cu130torch2.12`` → (13.0, "2.12")."""
    parsed = Label.parse(label)
    cuda, torch = (parsed.cuda_line, parsed.torch_text) if parsed is not None else (None, None)
    return (cuda, torch) if cuda is not None and torch is not None else None


def env_facts(env: EnvReport, machine: MachineFacts) -> EnvFacts:
    """What fitting needs of a probed env: torch's distribution version (what pins and constraints compare: PyPI's
    torch says ``2.10.0+cu128`` at run time but is installed as 2.10.0), the GPUs torch sees, else nvidia-smi's
    (for an env of this machine's platform only), and its CPU platform."""
    platform = env.python.platform
    gpus = tuple(d.cc for d in env.torch.devices)
    if not gpus and (platform is None or platform == this_machine()):  # nvidia-smi's GPUs are this machine's, not
        gpus = tuple(g.cc for g in machine.driver.gpus)                 # those of an env run here under qemu
    torch = (env.torch.distribution or env.torch.version) if env.torch.version else None
    return EnvFacts(python=env.python.version, tags=frozenset(env.python.tags), torch=torch,
                    torch_cuda=env.torch.cuda, gpus=gpus, torch_dependents=env.torch.dependents,
                    machine=platform.name if platform else env.python.machine)


def best(verdicts: list[Verdict]) -> Verdict | None:
    """The fitting wheel to install: the newest version and, of one version, the newest build (a higher build
    supersedes a wheel with a known defect, whatever else it has: docs/INDEX.md "Superseded builds"), then
    kernel-tested (on this env's torch) before untested, a per-torch wheel (built against this very torch) before a
    stable-ABI one or a pure-Python one built once."""
    fitting = [v for v in verdicts if v.fits]
    if not fitting:
        return None
    return max(fitting, key=lambda v: (Version(v.wheel.version.public), v.wheel.facts.build, v.kernel_tested,
                                       v.wheel.facts.per_torch,
                                       v.wheel.filename))
