"""A farm's model: ``Farm`` (the whole file), ``FarmEntry`` (one [[package]] with its settings resolved),
``Exclusion`` (one [[exclude]]) and ``FarmTarget`` (one target expand.py makes of an entry), and ``FarmError``.
farm/spec.py reads farm.toml into them."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.core.datafiles import default_patches_dir
from builder.core.errors import RecipeError
from builder.core.settings import Settings
from builder.model.abi import Abi, StableAbi, per_torch_label, stable_label
from builder.model.arch import Arch, format_arch_list
from builder.model.cuda import CudaVersion
from builder.model.platform import X86_64, Platform
from builder.model.python import PythonSpec
from builder.model.recipe import RecipeKind
from builder.stages.plan import Target

DEFAULT_RUNNER = "gpu-sm{arch}-{platform}"  # gpu-sm120-x86_64, gpu-sm121-aarch64
Archs = tuple[Arch, ...]  # one target's arch list, sorted (model/arch.parse_arch_list)


class FarmError(RecipeError):
    """A farm file that is missing, malformed, or names a combination that cannot be built (exit code 3)."""


@dataclass(frozen=True, kw_only=True)
class FarmEntry:
    """One [[package]] table with the [defaults] merged in."""

    where: str  # "package[0]", for messages
    name: str
    versions: tuple[str, ...] = ()  # pinned; empty → newest
    newest: int | None = None
    previous: int | None = None  # the N releases before the newest (a narrower entry for them than the newest's)
    source: str | None = None  # a path / URL / git+URL@ref for every version; "{version}" is substituted
    sources: dict[str, str] = field(default_factory=dict)  # per version
    recipes: Path | None = None  # None: the project's (or --recipes)
    toolchain: str = "auto"
    cuda: tuple[CudaVersion, ...] = ()
    archs: tuple[Archs, ...] = ()  # each one target's arch list: (120,), (90, 120+ptx); () → each platform's default
    platforms: tuple[Platform, ...] = (X86_64,)
    python: tuple[PythonSpec, ...] = (PythonSpec("3.12"),)
    torch: tuple[str, ...] = ()  # empty → the newest torch built for each CUDA on the index
    torch_index: str | None = None
    jobs: int | None = None
    torch_newest: int = 1  # torch omitted: the newest N torch minors built for each CUDA (newest patch of each)
    archs_where_supported: bool = False  # drop from each arch list what a target's CUDA cannot compile
    abi: str = "auto"  # auto: one torch-stable target per CUDA major where the recipe has a port | an Abi (ABI_CHOICES)
    variants: bool = False  # CUDA extensions: also one thin wheel per arch (PEP 825 variants, `builder build --variants`)

    def source_for(self, version: str) -> str | None:
        if version in self.sources:
            return self.sources[version]
        return self.source.replace("{version}", version) if self.source else None


@dataclass(frozen=True, kw_only=True)
class Exclusion:
    """[[exclude]]: a target matching every given field is dropped (``version`` may be a range)."""

    where: str
    package: str | None = None
    version: SpecifierSet | None = None
    cuda: CudaVersion | None = None
    arch: Archs | None = None
    python: PythonSpec | None = None
    torch: str | None = None
    platform: Platform | None = None

    def matches(self, package: str, version: str, cuda: CudaVersion, archs: Archs, python: PythonSpec,
                torch: str | None, platform: Platform | None = None) -> bool:
        if self.platform is not None and platform is not None and self.platform != platform:
            return False
        if self.package is not None and canonicalize_name(self.package) != canonicalize_name(package):
            return False
        if self.version is not None and not self.version.contains(Version(version), prereleases=True):
            return False
        if self.cuda is not None and not self.cuda.same_line(cuda):
            return False
        if self.arch is not None and self.arch != archs:
            return False
        if self.python is not None and self.python != python:
            return False
        return self.torch is None or (torch is not None and Version(self.torch) == Version(torch))


@dataclass(frozen=True)
class Farm:
    file: Path
    entries: tuple[FarmEntry, ...]
    excludes: tuple[Exclusion, ...]
    runners: dict[str, str]  # "120" / "121-aarch64" → runner label; "default" → template with {arch}, {platform}
    available: tuple[str, ...] | None = None  # [runners] available: the GPU runners' labels; None: every label

    @property
    def directory(self) -> Path:
        return self.file.parent

    def runner_label(self, number: int, platform: Platform = X86_64) -> str:
        """The label of a GPU runner with an sm_``number`` GPU in a ``platform`` machine: [runners] "121-aarch64",
        else "121", else the default template (``gpu-sm{arch}-{platform}``)."""
        for key in (f"{number}-{platform}", str(number)):
            if key in self.runners:
                return self.runners[key]
        return self.runners.get("default", DEFAULT_RUNNER).format(arch=number, platform=platform.name)

    def runner_for(self, archs: Archs, platform: Platform = X86_64) -> str | None:
        """The GPU test runner of a wheel with SASS for ``archs`` on ``platform``, its newest arch first. With
        [runners] available: the first label there (a 90,120 wheel goes to gpu-sm90-x86_64 when only that runner
        exists), None when no runner can test it. Without: the first arch [runners] names, else the newest arch's
        label from the template (every label is taken to exist)."""
        numbers = sorted({a.number for a in archs}, reverse=True)
        if self.available is not None:
            return next((label for n in numbers if (label := self.runner_label(n, platform)) in self.available), None)
        for number in numbers:
            for key in (f"{number}-{platform}", str(number)):
                if key in self.runners:
                    return self.runners[key]
        return self.runner_label(numbers[0], platform) if numbers else None

    def runners_per_arch(self, archs: Archs, platform: Platform = X86_64) -> tuple[tuple[int, str | None], ...]:
        """Each arch number of a wheel with SASS for ``archs`` on ``platform``, newest first, with the label of the
        GPU runner that kernel-tests its code there, or None where no runner of [runners] available has it (without
        ``available`` every label is taken to exist)."""
        out: list[tuple[int, str | None]] = []
        for number in sorted({a.number for a in archs}, reverse=True):
            label = self.runner_label(number, platform)
            out.append((number, label if self.available is None or label in self.available else None))
        return tuple(out)


@dataclass(frozen=True, kw_only=True)
class FarmTarget:
    """One build of the expanded matrix: everything ``builder build`` needs. A per-torch target is one cell (CUDA ×
    arch list × Python × torch); a torch-stable target stands for every cell of its CUDA major at or above the
    port's floor and is built with the plan's torch (the floor's newest release) and one Python (abi3)."""

    package: str
    version: str
    kind: RecipeKind
    cuda: CudaVersion
    archs: Archs
    python: PythonSpec
    torch: str
    torch_index: str | None
    toolchain: str
    recipes: Path
    source: str | None
    jobs: int | None
    entry: str  # "package[0]"
    abi: Abi = Abi.PER_TORCH
    port: StableAbi | None = None  # the recipe's [stable-abi] where it covers this version (either abi)
    # the platforms the wheel serves: one for a CUDA extension; every platform of the entry for a pure-Python wheel
    # (py3-none-any: built once, on the first of them)
    platforms: tuple[Platform, ...] = (X86_64,)
    variants: bool = False  # a CUDA target whose entry asks for variants: `builder build --variants`
    # a per-torch target whose recipe's [per-torch-abi3] covers its version: the Pythons its one cp310-abi3 wheel
    # serves (``python`` builds it); () for a cpXY wheel of ``python`` alone (farm/abifold.py fold_pythons)
    pythons: tuple[PythonSpec, ...] = ()

    @property
    def platform(self) -> Platform:
        """The platform the wheel is built for (``builder build --platform``)."""
        return self.platforms[0]

    @property
    def stable(self) -> bool:
        return self.abi is Abi.TORCH_STABLE

    @property
    def id(self) -> str:
        """A name safe for files and artifact names: tinyext-0.1.0-cu130-sm90-py3.11-torch2.14.1; a torch-stable
        target names its CUDA major and abi3 instead of CUDA line, Python and torch:
        demo-1.0-cu13-abi3-sm90_120-aarch64. A CUDA target names its platform after its archs; a pure-Python one
        (every platform's wheel) none."""
        sm = "sm" + format_arch_list(self.archs).replace(",", "_").replace("+ptx", "ptx")
        if self.stable:
            parts = [canonicalize_name(self.package), self.version, stable_label(self.cuda), "abi3", sm,
                     self.platform.name]
            return re.sub(r"[^A-Za-z0-9._-]", "_", "-".join(parts))
        cuda = "cu" + str(self.cuda).replace(".", "")  # as given: 13.0.1 → cu1301 (not the flavour, cu130)
        parts = [canonicalize_name(self.package), self.version, cuda]
        if self.kind.is_cuda:
            parts += [sm, self.platform.name]
        parts += ["abi3" if self.pythons else f"py{self.python.name}", f"torch{self.torch}"]
        return re.sub(r"[^A-Za-z0-9._-]", "_", "-".join(parts))

    @property
    def wheel_identity(self) -> tuple[str, ...]:
        """What the wheel's file name is made of: targets equal here would overwrite each other's wheel."""
        if self.stable and self.port is not None:  # +cu13, cp310-abi3: no torch, no Python
            return (canonicalize_name(self.package), str(Version(self.version)), stable_label(self.cuda),
                    self.port.requirement, f"cp{self.port.python_floor.replace('.', '')}-abi3", self.platform.name)
        if not self.kind.is_cuda:
            torch = Version(self.torch)
            return (canonicalize_name(self.package), str(Version(self.version)), self.cuda.line,
                    f"{torch.major}.{torch.minor}", "py3-none-any", "any")
        tag = "abi3" if self.pythons else str(self.python)  # the label names the CUDA major: cu12torch2.9
        return (canonicalize_name(self.package), str(Version(self.version)), per_torch_label(self.cuda, self.torch),
                tag, self.platform.name)

    def to_target(self, jobs: int) -> Target:
        return Target(
            package=self.package,
            version=self.version,
            cuda=self.cuda,
            archs=self.archs,
            python=self.python,
            torch=self.torch,
            torch_index=self.torch_index,
            toolchain=self.toolchain,
            source=self.source,
            jobs=self.jobs or jobs,
            abi=str(self.abi),
            platform=self.platform,
        )

    def settings(self, base: Settings) -> Settings:
        return dataclasses.replace(base, recipes_dir=self.recipes, patches_dir=default_patches_dir(self.recipes))
