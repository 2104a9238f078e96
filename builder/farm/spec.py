"""A farm file (``farm.toml``): its schema, its model (``Farm``, ``FarmEntry``, ``Exclusion``) and the target
type it expands into (``FarmTarget``, expand.py). Validated as strictly as a recipe: every problem names the file
and the dotted field, and an unknown key names the key it most likely meant."""

from __future__ import annotations

import dataclasses
import difflib
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from builder.core.datafiles import default_patches_dir
from builder.core.errors import RecipeError, UsageError
from builder.core.settings import Settings
from builder.core.tomlfile import read_toml
from builder.discovery.compat import is_known_cuda, known_cuda_text, resolve_index
from builder.model.abi import ABI_CHOICES, Abi, StableAbi, stable_label
from builder.model.arch import Arch, format_arch_list, parse_arch_list
from builder.model.cuda import CudaVersion
from builder.model.platform import PLATFORMS, X86_64, Platform, parse_platform
from builder.model.python import PythonSpec
from builder.model.recipe import RecipeKind, TomlChecker
from builder.stages.plan import Target
from builder.toolchain import TOOLCHAINS

DEFAULT_FARM_FILE = "farm.toml"
DEFAULT_RUNNER = "gpu-sm{arch}-{platform}"  # gpu-sm120-x86_64, gpu-sm121-aarch64
Archs = tuple[Arch, ...]  # one target's arch list, sorted (model/arch.parse_arch_list)



class FarmError(RecipeError):
    """A farm file that is missing, malformed, or names a combination that cannot be built (exit code 3)."""


# ---------------------------------------------------------------- schema

# Settings every [[package]] inherits from [defaults] and may override.
_SETTINGS: dict[str, tuple[type, ...]] = {
    "recipes": (str,),
    "toolchain": (str,),
    "cuda": (str, list),
    "archs": (str, list),
    "python": (str, list),
    "torch": (str, list),
    "torch-index": (str,),
    "jobs": (int,),
    "torch-newest": (int,),
    "archs-where-supported": (bool,),
    "abi": (str,),
    "platforms": (str, list),
    "variants": (bool,),
}
_TOP: dict[str, tuple[type, ...]] = {"defaults": (dict,), "package": (list,), "exclude": (list,), "runners": (dict,)}
_PACKAGE: dict[str, tuple[type, ...]] = {"name": (str,), "versions": (str, list), "newest": (int,), "previous": (int,),
                                         "source": (str, dict),
                                         **_SETTINGS}
_EXCLUDE: dict[str, tuple[type, ...]] = {k: (str,) for k in ("package", "version", "cuda", "arch", "python", "torch",
                                                             "platform")}
# [runners]: "default" (a label template), "available" (the labels of the GPU runners the farm has), and per-arch
# labels: "120" (any platform) or "121-aarch64" (one platform)
_RUNNER_KEY = re.compile(r"\d{2,3}[af]?(-(" + "|".join(PLATFORMS) + "))?")


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
    # serves (``python`` builds it); () for a cpXY wheel of ``python`` alone (farm/expand.py _fold_pythons)
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
        torch = Version(self.torch)
        tag = "abi3" if self.pythons else str(self.python) if self.kind.is_cuda else "py3-none-any"
        return (canonicalize_name(self.package), str(Version(self.version)), self.cuda.line,
                f"{torch.major}.{torch.minor}", tag, self.platform.name if self.kind.is_cuda else "any")

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


# ---------------------------------------------------------------- loading


def find_farm_file(given: Path | None, cwd: Path | None = None) -> Path:
    if given is not None:
        return given
    here = cwd or Path.cwd()
    for folder in (here, *here.parents):
        if (folder / DEFAULT_FARM_FILE).is_file():
            return folder / DEFAULT_FARM_FILE
    return here / DEFAULT_FARM_FILE


def load_farm(path: Path, settings: Settings | None = None) -> Farm:
    """Parse and validate a farm file (schema and values; recipes and PyPI are consulted by ``expand``).
    ``settings`` decide the known CUDA versions as for ``--cuda`` (None: the shipped snapshot's)."""
    path = path.resolve()
    data = read_toml(path, FarmError, what="farm file", missing_hint="pass --file PATH or create farm.toml")
    c = _Checker(path, settings)
    c.keys(data, _TOP, "")
    defaults_table = data.get("defaults", {})
    c.keys(defaults_table, _SETTINGS, "defaults")
    defaults = c.settings(defaults_table, "defaults")
    packages = data.get("package", [])
    if not packages:
        c.fail("package", "is required: at least one [[package]] table")
    entries = []
    for i, table in enumerate(packages):
        where = f"package[{i}]"
        if not isinstance(table, dict):
            c.fail(where, "must be a table ([[package]])")
        c.keys(table, _PACKAGE, where)
        entries.append(c.entry(table, where, defaults))
    excludes = []
    for i, table in enumerate(data.get("exclude", [])):
        where = f"exclude[{i}]"
        if not isinstance(table, dict):
            c.fail(where, "must be a table ([[exclude]])")
        c.keys(table, _EXCLUDE, where)
        if not table:
            c.fail(where, "is empty: it would exclude every target", f"give some of {', '.join(_EXCLUDE)}")
        excludes.append(c.exclusion(table, where))
    runners, available = c.runners(data.get("runners", {}), {p for e in entries for p in e.platforms})
    return Farm(path, tuple(entries), tuple(excludes), runners, available)


class _Checker(TomlChecker):
    """The recipe checker's conventions (file + dotted field + "did you mean"), raising FarmError."""

    error = FarmError

    def __init__(self, path: Path, settings: Settings | None = None) -> None:
        super().__init__(path)
        self.known_settings = settings  # for the known CUDA versions (discovery/compat.known_cuda)

    def runners(self, table: dict[str, Any], platforms: set[Platform]) -> tuple[dict[str, str], tuple[str, ...] | None]:
        """[runners]: the labels by arch (and platform), the template, and the labels of the runners that exist."""
        labels: dict[str, str] = {}
        available: tuple[str, ...] | None = None
        for key, value in table.items():
            if key == "available":
                if not isinstance(value, (str, list)):
                    self.fail("runners.available", "must be a list of runner labels")
                available = self.strings(value, "runners.available")
                continue
            if not isinstance(value, str) or not value:
                self.fail(f"runners.{key}", "must be a non-empty string (a runner label)")
            if key != "default" and not _RUNNER_KEY.fullmatch(key):
                self.fail(f"runners.{key}", "must be an arch number such as 120, an arch and a platform such as "
                          "121-aarch64, 'default' or 'available'")
            labels[key] = value
        template = labels.get("default", DEFAULT_RUNNER)
        self.label_template(template, "runners.default")
        if len(platforms) > 1 and "{platform}" not in template:
            self.fail("runners.default", f"is {template!r}, without {{platform}}, but the farm builds for "
                      f"{' and '.join(sorted(p.name for p in platforms))}: one label would send both platforms' "
                      "wheels to the same machines", "use {arch} and {platform}, e.g. 'gpu-sm{arch}-{platform}'")
        return labels, available

    def label_template(self, text: str, dotted: str) -> None:
        """A runner label template: ``{arch}`` and ``{platform}`` its only placeholders, bare (as ``template``
        checks one placeholder: no format spec or conversion is tried)."""
        try:
            fields = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(text)
                      if name is not None]
        except ValueError as e:
            self.fail(dotted, f"is {text!r}: {e}", "write {arch} and {platform} for the placeholders")
        for name, spec, conversion in fields:
            if name not in ("arch", "platform") or spec or conversion:
                shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
                self.fail(dotted, f"is {text!r}: {shown} is not allowed", "the only placeholders it may hold are "
                          "{arch} and {platform}, with no format spec or conversion: e.g. 'gpu-sm{arch}-{platform}'")

    def platforms(self, value: str | list[Any], dotted: str) -> tuple[Platform, ...]:
        out: list[Platform] = []
        for i, text in enumerate(self.strings(value, dotted)):
            try:
                out.append(parse_platform(text))
            except UsageError:
                self.fail(f"{dotted}[{i}]", f"is not a platform: {text!r}", f"use one of {', '.join(PLATFORMS)}")
        if len(set(out)) != len(out):
            self.fail(dotted, f"names one platform twice: {list(value)}")
        return tuple(out)

    def strings(self, value: str | list[Any], dotted: str) -> tuple[str, ...]:
        """A string or a list of strings, as a tuple; an empty list is an error."""
        items = [value] if isinstance(value, str) else value
        if not items:
            self.fail(dotted, "is empty")
        for i, item in enumerate(items):
            if not isinstance(item, str):
                self.fail(f"{dotted}[{i}]", f"must be a string, not {type(item).__name__}")
        if len(set(items)) != len(items):
            self.fail(dotted, f"repeats a value: {items}")
        return tuple(items)

    def settings(self, table: dict[str, Any], where: str) -> dict[str, Any]:
        """Validated, normalised values of the settings keys present in ``table``."""
        out: dict[str, Any] = {}
        at = lambda key: f"{where}.{key}"  # noqa: E731
        if "recipes" in table:
            recipes = (self.path.parent / table["recipes"]).resolve()
            if not recipes.is_dir():
                self.fail(at("recipes"), f"folder {recipes} does not exist")
            out["recipes"] = recipes
        if "toolchain" in table:
            if table["toolchain"] not in TOOLCHAINS:
                close = difflib.get_close_matches(table["toolchain"], TOOLCHAINS, n=1)
                self.fail(at("toolchain"), f"is {table['toolchain']!r}",
                          f"did you mean {close[0]!r}?" if close else f"use one of {', '.join(TOOLCHAINS)}")
            out["toolchain"] = table["toolchain"]
        if "cuda" in table:
            values = self.strings(table["cuda"], at("cuda"))
            versions = []
            for i, value in enumerate(values):
                try:
                    versions.append(CudaVersion.parse(value))
                    ok = is_known_cuda(versions[-1], self.known_settings)
                except InvalidVersion:
                    ok = False
                if not ok:
                    self.fail(f"{at('cuda')}[{i}]", f"is not a known CUDA version: {value!r}",
                              f"use one of {known_cuda_text(self.known_settings)}")
            out["cuda"] = tuple(versions)
        if "archs" in table:
            normalised: list[Archs] = []
            for i, value in enumerate(self.strings(table["archs"], at("archs"))):
                try:
                    normalised.append(parse_arch_list(value))
                except UsageError as e:
                    self.fail(f"{at('archs')}[{i}]", f"is not an arch list: {value!r}",
                              "each item is one target's archs: '120', '90,120' or '120+ptx'")
                    raise AssertionError from e  # unreachable
            if len(set(normalised)) != len(normalised):
                self.fail(at("archs"), f"names one arch list twice: {list(table['archs'])}")
            out["archs"] = tuple(normalised)
        if "python" in table:
            pythons = tuple(map(PythonSpec, self.strings(table["python"], at("python"))))
            for i, python in enumerate(pythons):
                if not (python.is_path or re.fullmatch(r"3\.\d{1,2}", python.text)):
                    self.fail(f"{at('python')}[{i}]", f"is neither a Python version nor a path: {python.text!r}",
                              "use a version such as '3.12' or a path to an interpreter")
            out["python"] = pythons
        if "torch" in table:
            values = self.strings(table["torch"], at("torch"))
            for i, value in enumerate(values):
                self.version(value, f"{at('torch')}[{i}]")
            out["torch"] = values
        if "torch-index" in table:
            try:
                resolve_index(table["torch-index"])
            except UsageError as e:  # "--torch-index X: why" (resolve_index speaks of the flag)
                value, reason = table["torch-index"], e.message.split(": ", 1)[-1]
                self.fail(at("torch-index"), f"is neither a URL nor a known index: {value!r}"
                          if "neither a URL" in reason else f"is {value!r}: {reason}", e.hint)
            out["torch_index"] = table["torch-index"]
        if "jobs" in table:
            if table["jobs"] < 1:
                self.fail(at("jobs"), "must be at least 1")
            out["jobs"] = table["jobs"]
        if "torch-newest" in table:
            if table["torch-newest"] < 1:
                self.fail(at("torch-newest"), "must be at least 1")
            if "torch" in table:
                self.fail(where, "gives both 'torch' and 'torch-newest'", "pin torch, or take the newest N, not both")
            out["torch_newest"] = table["torch-newest"]
        if "archs-where-supported" in table:
            out["archs_where_supported"] = table["archs-where-supported"]
        if "platforms" in table:
            out["platforms"] = self.platforms(table["platforms"], at("platforms"))
        if "variants" in table:
            out["variants"] = table["variants"]
        if "abi" in table:
            if table["abi"] not in ABI_CHOICES:
                close = difflib.get_close_matches(table["abi"], ABI_CHOICES, n=1)
                self.fail(at("abi"), f"is {table['abi']!r}",
                          f"did you mean {close[0]!r}?" if close else f"use one of {', '.join(ABI_CHOICES)}")
            out["abi"] = table["abi"]
        return out

    def entry(self, table: dict[str, Any], where: str, defaults: dict[str, Any]) -> FarmEntry:
        name = self.required(table, "name", where)
        if "versions" in table and "newest" in table:
            self.fail(where, "gives both 'versions' and 'newest'", "pin versions, or take the newest N, not both")
        versions = self.strings(table["versions"], f"{where}.versions") if "versions" in table else ()
        for i, version in enumerate(versions):
            self.version(version, f"{where}.versions[{i}]")
        newest = table.get("newest")
        if newest is not None and newest < 1:
            self.fail(f"{where}.newest", "must be at least 1")
        previous = table.get("previous")
        if previous is not None and ("versions" in table or "newest" in table):
            self.fail(where, "gives 'previous' with 'versions' or 'newest'",
                      "previous = N takes the N releases before the newest: give it alone")
        if previous is not None and previous < 1:
            self.fail(f"{where}.previous", "must be at least 1")
        source: str | None = None
        sources: dict[str, str] = {}
        given = table.get("source")
        if isinstance(given, str):
            source = self.location(given)
        elif isinstance(given, dict):
            for version, location in given.items():
                dotted = f"{where}.source.{version}"
                self.version(version, dotted)
                if not isinstance(location, str):
                    self.fail(dotted, f"must be a string, not {type(location).__name__}")
                if version not in versions:
                    self.fail(dotted, f"names a version that is not in {where}.versions ({', '.join(versions) or 'none'})",
                              "a per-version source needs the version pinned in 'versions'")
                sources[version] = self.location(location)
        own = self.settings(table, where)
        merged = {**defaults, **own}
        if "torch_newest" in own and "torch" not in own:  # the package's own choice wins over [defaults] torch
            merged.pop("torch", None)
        elif "torch" in own:
            merged.pop("torch_newest", None)
        if "cuda" not in merged:
            self.fail(f"{where}.cuda", "is required (here or in [defaults])", "e.g. cuda = ['13.0']")
        return FarmEntry(where=where, name=name, versions=versions, newest=newest, previous=previous, source=source,
                         sources=sources, **merged)

    def location(self, text: str) -> str:
        """A source: URLs and git+ stay as given; a relative local path is taken from the farm file's folder."""
        if "://" in text or text.startswith("git+"):
            return text
        return str((self.path.parent / Path(text).expanduser()).resolve())

    def exclusion(self, table: dict[str, Any], where: str) -> Exclusion:
        values: dict[str, Any] = {}
        if "version" in table:
            text = table["version"]
            try:
                Version(text)
                spec = SpecifierSet(f"=={text}")
            except InvalidVersion:
                try:
                    spec = SpecifierSet(text)
                except InvalidSpecifier as e:
                    raise FarmError(f"{self.path}: field '{where}.version' is neither a version nor a range: {text!r}",
                                    "e.g. '1.6.1' or '<1.6'") from e
            values["version"] = spec
        if "arch" in table:
            try:
                values["arch"] = parse_arch_list(table["arch"])
            except UsageError as e:
                raise FarmError(f"{self.path}: field '{where}.arch' is not an arch list: {table['arch']!r}") from e
        if "cuda" in table:
            settings = self.settings({"cuda": table["cuda"]}, where)
            values["cuda"] = settings["cuda"][0]
        if "torch" in table:
            self.version(table["torch"], f"{where}.torch")
            values["torch"] = table["torch"]
        if "package" in table:
            values["package"] = table["package"]
        if "python" in table:
            values["python"] = PythonSpec(table["python"])
        if "platform" in table:
            values["platform"] = self.platforms(table["platform"], f"{where}.platform")[0]
        return Exclusion(where=where, **values)
