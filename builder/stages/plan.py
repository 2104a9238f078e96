"""The plan stage: a target (what the user asked for) resolved against its recipe into a ``Plan``.

Resolves the upstream version and its source, the patches that apply to it, the torch pin and index, the local
version label and the docker image a container build would use. Nothing is downloaded but index metadata. The
ABI the build is made for is chosen by stages/abichoice.py.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from packaging.version import Version

from builder.core.errors import ToolchainError, UsageError
from builder.core.log import log
from builder.core.settings import Settings
from builder.discovery.compat import (
    TorchIndex,
    check_torch_has_python,
    check_torch_listed,
    check_torch_matches_cuda,
    is_known_cuda,
    known_cuda_text,
    resolve_index,
    torch_cuda,
    torch_cuda_unverified,
)
from builder.model.abi import (
    Abi,
    AbiChoice,
    PerTorchAbi3,
    StableAbi,
    first_torch_of_major,
    per_torch_label,
    per_torch_requirement,
    stable_label,
)
from builder.model.arch import (
    Arch,
    check_archs_for_cuda,
    check_known_bad,
    format_arch_list,
    torch_arch_list,
)
from builder.model.cuda import CudaVersion
from builder.model.platform import X86_64, Platform, check_archs_for_platform, this_machine
from builder.model.python import PythonSpec
from builder.model.recipe import Recipe, find_recipe, load_recipe
from builder.model.recipeparts import PatchSpec
from builder.stages.abichoice import (
    GivenInterpreter,
    ask_interpreter,
    check_python_agnostic,
    choose_abi,
    default_build_torch,
    port_applies,
)
from builder.stages.resolve import (
    SourceRef,
    check_recipe_path,
    local_version,
    pypi_releases,
    resolve_version,
    source_for,
)
from builder.toolchain import docker_image_for
from builder.toolchain.base import nvcc_version
from builder.toolchain.host import candidate_homes


@dataclass(frozen=True, kw_only=True)
class Target:
    """What the user asked for, validated but not yet resolved."""

    package: str
    version: str | None = None
    cuda: CudaVersion
    archs: tuple[Arch, ...]
    python: PythonSpec = PythonSpec("3.12")  # a version (3.12) or a path to an interpreter
    torch: str | None = None
    torch_index: str | None = None
    toolchain: str = "auto"
    source: str | None = None
    jobs: int = 1
    test_patches: tuple[str, ...] = ()
    abi: str = "auto"  # auto (torch-stable where the recipe has a port for this version and torch) | an Abi
    platform: Platform = X86_64  # the CPU the wheel is for; another than this machine's is a cross build
    subset: str | None = None  # a recipe [[subset]] (--subset): a smaller build for tests, never published


@dataclass(frozen=True)
class Plan:
    target: Target
    recipe: Recipe
    version: str
    source: SourceRef
    patches: tuple[PatchSpec, ...]
    torch: str | None  # None: taken from the interpreter given with --python
    index: TorchIndex
    image: str
    env: dict[str, str] = field(default_factory=dict)
    abi: Abi = Abi.PER_TORCH
    # why the index does not say which CUDA the torch was built with ("": it says, or torch comes from --python):
    # the label then assumes --cuda, and the build venv checks torch.version.cuda before compiling (stages/pyenv.py)
    torch_cuda_unverified: str = ""
    abi_why: str = ""  # why ``abi`` (AbiChoice.why): the "abi choice" row and the build record's abi_choice
    given: GivenInterpreter | None = None  # ``--python PATH`` as the plan saw it (asked only where a port applies)

    @property
    def cuda(self) -> CudaVersion:
        return self.target.cuda

    @property
    def recorded_platform(self) -> str | None:
        """The platform as the cache key and the build record name it: None for x86_64 (their keys and records stay
        as they were before the axis) and for pure Python (one wheel serves every platform). Compared by value: a
        farm worker gets its target pickled, so its X86_64 is an equal copy."""
        target = self.target.platform
        return None if target == X86_64 or not self.recipe.kind.is_cuda else target.name

    @property
    def stable(self) -> bool:
        return self.abi is Abi.TORCH_STABLE

    @property
    def python_agnostic(self) -> PerTorchAbi3 | None:
        """The recipe's ``[per-torch-abi3]`` where this is a per-torch build of a release it covers: the wheel is
        then one ``cp310-abi3`` wheel for every Python of its torch (labelled and pinned per torch as usual)."""
        return None if self.abi is not Abi.PER_TORCH else self.recipe.python_agnostic(self.version)

    @property
    def abi3(self) -> bool:
        """The wheel is tagged abi3 (Python's limited API): a stable-ABI wheel, or a Python-agnostic per-torch one."""
        return self.stable or self.python_agnostic is not None

    @property
    def python_tag(self) -> str:
        """The Python and ABI tags of the wheel this plan builds (its setup.py writes them; inspection checks the
        abi3 ones): ``py3-none`` for a pure-Python recipe, ``cp310-abi3`` for a stable-ABI or Python-agnostic
        per-torch one, else the target Python's own ``cp312-cp312``."""
        if self.pure_python:
            return "py3-none"
        if self.stable and self.recipe.stable_abi is not None:
            return f"cp{self.recipe.stable_abi.python_floor.replace('.', '')}-abi3"
        if self.python_agnostic is not None:
            return self.python_agnostic.tag
        py = f"cp{str(self.target.python).replace('.', '')}"
        return f"{py}-{py}"

    @property
    def pure_python(self) -> bool:
        """A pure-Python recipe: one ``py3-none-any`` wheel per version, built once for every torch and CUDA."""
        return not self.recipe.kind.is_cuda

    def label(self, torch: str) -> str | None:
        """Local version label: ``cu12torch2.9`` per torch (one per CUDA major × torch minor, so resolvers cannot
        mix them; offered on each CUDA line of the major its torch checks passed on, model/abi.py). The CUDA is the
        one that torch was built with where the index says (a mismatch is refused by the plan). A stable-ABI wheel
        serves every verified torch of its CUDA major: ``cu13``. A pure-Python wheel has none (None): it holds no
        code built against torch or CUDA, and its checks say which torches it is offered for."""
        if self.pure_python:
            return None
        if self.stable:
            return stable_label(self.cuda)
        t = Version(torch)
        return per_torch_label(torch_cuda(self.index, str(t.public), self.cuda), torch)

    def torch_requirement(self, torch: str) -> str | None:
        """What the wheel says about torch: ``torch==2.11.0`` (per torch), ``torch>=2.11`` (stable ABI); None for
        a pure-Python wheel, which keeps upstream's own torch requirement (finalize pins nothing over it)."""
        if self.pure_python:
            return None
        if self.stable and self.recipe.stable_abi is not None:
            return self.recipe.stable_abi.requirement
        return per_torch_requirement(torch)

    @property
    def requires_python(self) -> str | None:
        """What finalize writes as the wheel's Requires-Python: for a stable-ABI wheel the higher of its abi3 tag's
        Python (cp310 → 3.10) and the oldest Python its torch floor has wheels for on the index (upstream's
        setup.py says >=3.9, which no cp310-abi3 wheel or torch 2.11 serves); None for the others, which keep
        upstream's (a per-torch wheel's cpXY tag names its one Python, a pure-Python wheel's is upstream's)."""
        stable = self.recipe.stable_abi
        agnostic = self.python_agnostic
        if agnostic is not None and self.torch is not None:  # the abi3 tag's Python, or the torch's oldest if newer
            floors = [Version(agnostic.python_floor), self.index.oldest_python(Version(self.torch))]
            floor = max(f for f in floors if f is not None)
            return f">={floor.major}.{floor.minor}"
        if not self.stable or stable is None:
            return None
        floors = [Version(stable.python_floor), self.index.oldest_python(stable.torch_floor)]
        floor = max(f for f in floors if f is not None)
        return f">={floor.major}.{floor.minor}"

    def describe(self, buildable_here: str | None = None) -> list[tuple[str, str]]:
        """The plan as rows; ``buildable_here`` (``builder plan``: whether and how this machine can build it,
        from toolchain.select.probe_build_here) adds a row after the toolchain."""
        given = f" ({self.given.torch})" if self.given is not None and self.given.torch else ""
        torch = f"{self.torch or f'from {self.target.python}{given}'} from {self.index.name} ({self.index.url}; table from " \
                f"{self.index.source})"
        label = self._label_text()
        unverified = self.torch_cuda_unverified
        if unverified:
            torch += f"; its CUDA NOT VERIFIED: {unverified}"
            label += f"  (UNVERIFIED: assumes CUDA {self.cuda} from --cuda; the build venv checks torch's CUDA " \
                     "before compiling and stops on a mismatch)"
            if buildable_here is not None and buildable_here.startswith("yes"):
                buildable_here += f" (if torch {self.torch} proves a CUDA {self.cuda} build: checked in the build venv)"
        rows = [
            ("package", f"{self.recipe.name} {self.version} ({self.recipe.kind})"),
            ("source", self.source.describe()),
            ("patches", ", ".join(p.name for p in self.patches) or "none"),
            ("cuda", str(self.cuda)),
            ("archs", format_arch_list(self.target.archs) + f"  (TORCH_CUDA_ARCH_LIST={torch_arch_list(self.target.archs)})"),
            ("platform", self._platform_text()),
            ("python", str(self.target.python)),
            ("torch", torch),
            ("label", label),
            ("abi", self._abi_text()),
            ("abi choice", self.abi_why),
            ("toolchain", self.target.toolchain),
            ("docker image", self.image),
        ]
        if buildable_here is not None:
            rows.insert(rows.index(("toolchain", self.target.toolchain)) + 1, ("buildable here", buildable_here))
        if self.target.subset is not None:
            subset = self.recipe.subset(self.target.subset)
            env = " ".join(f"{k}={v}" for k, v in subset.env.items())
            rows.insert(1, ("subset", f"{subset.name}: {subset.summary} ({env}); tests only, never published"))
        return rows

    def _label_text(self) -> str:
        if self.pure_python:
            return "none (pure Python: built once, offered for each torch its checks pass on)"
        label = self.label(self.torch) if self.torch else stable_label(self.cuda) if self.stable else None
        return label or f"cu{self.cuda.major}torch<from interpreter>"

    def _platform_text(self) -> str:
        target = self.target.platform
        if not self.recipe.kind.is_cuda:
            return f"{target} (pure Python: one wheel serves every platform)"
        if target != this_machine():
            return f"{target} (cross-built here, repaired to {target.manylinux_tag}; docs/BUILDS.md \"Issue 27\")"
        return f"{target} (this machine's)"

    def _abi_text(self) -> str:
        stable = self.recipe.stable_abi
        if self.stable and stable is not None:
            return (f"torch-stable (one cp{stable.python_floor.replace('.', '')}-abi3 wheel for CUDA "
                    f"{self.cuda.major} torches >= {stable.floor_text}, each verified; Requires-Python {self.requires_python})")
        if self.pure_python:
            return ("none (pure Python: one py3-none-any wheel for every torch its own requirement allows, each "
                    "verified by an import beside it)")
        agnostic = self.python_agnostic
        if agnostic is not None:
            minor = ".".join(str(Version(self.torch).release[i]) for i in (0, 1)) if self.torch else "this torch"
            return (f"per-torch, Python-agnostic (one {agnostic.tag} wheel pinned to torch {minor}, serving every "
                    f"Python that torch has wheels for: per-torch-abi3 in the recipe covers {self.version}; "
                    f"Requires-Python {self.requires_python})")
        return "per-torch (pinned to this torch)"


def validate_cuda(text: str, settings: Settings | None = None) -> CudaVersion:
    """``--cuda`` parsed, and checked against the known CUDA lines (discovery/compat.known_cuda, as farm.toml is)."""
    try:
        cuda = CudaVersion.parse(text)
    except Exception as e:
        raise UsageError(f"--cuda {text!r} is not a version", f"use one of {known_cuda_text(settings)}") from e
    if not is_known_cuda(cuda, settings) and not host_toolkit_line(cuda):
        raise UsageError(f"--cuda {text}: no toolchain here can provide CUDA {cuda.line}",
                         f"use one of {known_cuda_text(settings)} (CUDA 12 releases, the cuda-toolkit minors on "
                         f"PyPI, the CUDAs dockerfiles/ builds images for); or install a CUDA {cuda.line} toolkit "
                         f"(CUDA_HOME), or add {cuda.line} to IMAGE_CUDAS in builder/model/cuda.py (the CUDA lines "
                         "dockerfiles/manylinux-cuda.Dockerfile builds images for)")
    return cuda


def host_toolkit_line(cuda: CudaVersion) -> bool:
    """Whether a CUDA install on this machine is of ``cuda``'s line (`nvcc --version` of each candidate home)."""
    for home in candidate_homes(os.environ):
        try:
            if CudaVersion.of(nvcc_version(home / "bin" / "nvcc")).same_line(cuda):
                return True
        except ToolchainError:
            continue
    return False


def load_target_recipe(target: Target, settings: Settings) -> Recipe:
    return for_cuda_major(load_recipe(find_recipe(target.package, settings.recipes_dir), settings.patches_dir),
                          target.cuda)


def for_cuda_major(recipe: Recipe, cuda: CudaVersion) -> Recipe:
    """The recipe as a build for ``cuda`` uses it: its stable-ABI floor raised to the first torch whose PyPI build is
    of ``cuda``'s major (model/abi.py ``StableAbi.for_cuda_major``: 2.11 for CUDA 13), so the ``+cu13`` wheel's
    ``torch>=`` (and TORCH_TARGET_VERSION, the record's torch_floor, the torch-range check, the ABI choice) refuses
    PyPI's CUDA 12.8 torch 2.10.0. Read from the shipped PyPI listing (discovery's snapshot, no network): the same
    answer the combined index's pages are rendered with (index/channelpolicy.py ``root_lists``)."""
    stable = recipe.stable_abi
    if stable is None:
        return recipe
    raised = stable_on_major(stable, cuda.major)
    return recipe if raised is stable else replace(recipe, stable_abi=raised)


def stable_on_major(stable: StableAbi, major: int) -> StableAbi:
    """``stable`` as a wheel of CUDA ``major`` offers it (``for_cuda_major``'s rule; the farm's folding uses it too)."""
    return stable.for_cuda_major(_first_of_major(major))


@functools.cache
def _first_of_major(major: int) -> Version | None:
    """The first torch whose PyPI build is of CUDA ``major``, from the shipped listing (the same in every process)."""
    return first_torch_of_major(resolve_index("pypi").torch_by_cuda, major)


def make_plan(target: Target, settings: Settings) -> Plan:
    recipe = load_target_recipe(target, settings)
    if recipe.kind.is_cuda:
        check_archs_for_cuda(target.archs, target.cuda, settings)
        check_archs_for_platform(target.archs, target.platform)
    version = resolve_version(recipe, target.version, _available_versions(target, recipe, settings))
    if recipe.kind.is_cuda:
        check_known_bad(recipe.name, recipe.known_bad, target.archs, target.cuda, version)
    source = source_for(recipe, version, target.source, settings)
    for name in target.test_patches:
        if name not in {p.name for p in recipe.patches if p.test_only}:
            raise UsageError(f"--test-patch {name}: the recipe has no test-only patch of that name")
    index = resolve_index(target.torch_index, settings)
    given = ask_interpreter(target.python) if target.python.is_path and port_applies(target.abi, recipe, version) \
        else None
    choice = choose_abi(target.abi, target.python, recipe, version,
                        python=target.python.version or (given.version if given else None),
                        torch=given.torch if given else None, given=given)
    torch, unverified, choice = _build_torch(target, recipe, version, index, choice, settings)
    abi = choice.abi
    check_python_agnostic(recipe, version, abi, target.python.version or (given.version if given else None))
    env = dict(recipe.build_env)
    if abi is Abi.TORCH_STABLE and recipe.stable_abi is not None:
        env.update(recipe.stable_abi.build_env())
    if target.subset is not None:  # in the env, so in the cache key: a subset never stands for the whole build
        env.update(recipe.subset(target.subset).env)
    return Plan(target=target, recipe=recipe, version=version, source=source,
                patches=recipe.patches_for(version, target.test_patches, abi), torch=torch, index=index,
                image=docker_image_for(target.cuda, target.platform), env=env, abi=abi,
                torch_cuda_unverified=unverified, abi_why=choice.why, given=given)


def _available_versions(target: Target, recipe: Recipe, settings: Settings) -> list[str]:
    """The versions ``resolve_version`` may pick: PyPI's releases (asked again when the one asked for is missing),
    or the version a local source holds (none where the recipe has a default)."""
    available: list[str] = []
    if target.source is None and recipe.source.path is None and recipe.source.git is None:
        available = list(pypi_releases(recipe.source.pypi or recipe.name, settings))
        if target.version is not None and target.version not in available and not settings.offline:
            available = list(pypi_releases(recipe.source.pypi or recipe.name, settings, refresh=True))
    if target.source is None:
        check_recipe_path(recipe)
    if target.version is None and not available:
        local = target.source or (str(recipe.source.path) if recipe.source.path else None)
        found = local_version(Path(local)) if local and "://" not in local else None
        if found is None and recipe.default_version is None:
            raise UsageError(f"cannot tell which version of {recipe.name} the source holds", "pass --version")
        available = [found] if found else []
    return available


def _build_torch(target: Target, recipe: Recipe, version: str, index: TorchIndex, choice: AbiChoice,
                 settings: Settings) -> tuple[str | None, str, AbiChoice]:
    """(build torch, why its CUDA is unverified or "", the ABI choice) for a Python version; a ``--python PATH``
    brings its own torch (None here). A torch-stable choice is made again once the build torch is known."""
    if target.python.version is None:
        return None, "", choice
    torch = target.torch or default_build_torch(index, target.cuda, recipe, choice.abi)
    check_torch_listed(index, torch, target.cuda)
    check_torch_matches_cuda(index, torch, target.cuda, settings)
    unverified = (torch_cuda_unverified(index, torch) or "") if recipe.kind.is_cuda else ""
    if unverified:
        log.warning(f"torch {torch}: its CUDA is not verified ({unverified}); the plan assumes CUDA {target.cuda} "
                    "(--cuda) and the build venv checks torch.version.cuda before compiling")
    check_torch_has_python(index, torch, target.python.version)
    if choice.abi is Abi.TORCH_STABLE:  # now that the build torch is known: at or above the floor?
        choice = choose_abi(target.abi, target.python, recipe, version, python=target.python.version, torch=torch)
    return torch, unverified, choice
