"""A farm file (``farm.toml``): its schema, found and read into its model (farm/entries.py: ``Farm``,
``FarmEntry``, ``Exclusion``, and ``FarmTarget``, the target type expand.py makes). Validated as strictly as a
recipe: every problem names the file and the dotted field, and an unknown key names the key it most likely meant."""

from __future__ import annotations

import difflib
import re
import string
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from builder.core.errors import UsageError
from builder.core.settings import Settings
from builder.core.tomlfile import read_toml
from builder.discovery.compat import is_known_cuda, known_cuda_text, resolve_index
from builder.farm.entries import DEFAULT_RUNNER, Archs, Exclusion, Farm, FarmEntry, FarmError, FarmTarget
from builder.model.abi import ABI_CHOICES
from builder.model.arch import parse_arch_list
from builder.model.cuda import CudaVersion
from builder.model.platform import PLATFORMS, Platform, parse_platform
from builder.model.python import PythonSpec
from builder.model.tomlcheck import TomlChecker
from builder.toolchain import TOOLCHAINS

# the model's names stay importable from here, where the farm's modules have always found them
__all__ = ["DEFAULT_FARM_FILE", "Archs", "Exclusion", "Farm", "FarmEntry", "FarmError", "FarmTarget", "find_farm_file",
           "load_farm"]

DEFAULT_FARM_FILE = "farm.toml"



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

    def choice(self, value: Any, choices: Sequence[str], dotted: str) -> str:
        """``value`` if it is one of ``choices``; else the error names the closest one ("did you mean") or all."""
        if value not in choices:
            close = difflib.get_close_matches(str(value), choices, n=1)
            self.fail(dotted, f"is {value!r}",
                      f"did you mean {close[0]!r}?" if close else f"use one of {', '.join(choices)}")
        return str(value)

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

    def cudas(self, value: str | list[Any], dotted: str) -> tuple[CudaVersion, ...]:
        """Each a CUDA version this builder knows (``known_cuda_text``)."""
        versions = []
        for i, text in enumerate(self.strings(value, dotted)):
            try:
                versions.append(CudaVersion.parse(text))
                ok = is_known_cuda(versions[-1], self.known_settings)
            except InvalidVersion:
                ok = False
            if not ok:
                self.fail(f"{dotted}[{i}]", f"is not a known CUDA version: {text!r}",
                          f"use one of {known_cuda_text(self.known_settings)}")
        return tuple(versions)

    def arch_lists(self, value: str | list[Any], dotted: str) -> tuple[Archs, ...]:
        """Each item one target's arch list, normalised; two items naming one list are an error."""
        normalised: list[Archs] = []
        for i, text in enumerate(self.strings(value, dotted)):
            try:
                normalised.append(parse_arch_list(text))
            except UsageError as e:
                self.fail(f"{dotted}[{i}]", f"is not an arch list: {text!r}",
                          "each item is one target's archs: '120', '90,120' or '120+ptx'")
                raise AssertionError from e  # unreachable
        if len(set(normalised)) != len(normalised):
            self.fail(dotted, f"names one arch list twice: {list(value)}")
        return tuple(normalised)

    def pythons(self, value: str | list[Any], dotted: str) -> tuple[PythonSpec, ...]:
        pythons = tuple(map(PythonSpec, self.strings(value, dotted)))
        for i, python in enumerate(pythons):
            if not (python.is_path or re.fullmatch(r"3\.\d{1,2}", python.text)):
                self.fail(f"{dotted}[{i}]", f"is neither a Python version nor a path: {python.text!r}",
                          "use a version such as '3.12' or a path to an interpreter")
        return pythons

    def torch_index(self, value: str, dotted: str) -> None:
        """A URL or a known index name; the error reworded from resolve_index's, which speaks of the flag
        ("--torch-index X: why")."""
        try:
            resolve_index(value)
        except UsageError as e:
            reason = e.message.split(": ", 1)[-1]
            self.fail(dotted, f"is neither a URL nor a known index: {value!r}"
                      if "neither a URL" in reason else f"is {value!r}: {reason}", e.hint)

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
            out["toolchain"] = self.choice(table["toolchain"], TOOLCHAINS, at("toolchain"))
        if "cuda" in table:
            out["cuda"] = self.cudas(table["cuda"], at("cuda"))
        if "archs" in table:
            out["archs"] = self.arch_lists(table["archs"], at("archs"))
        if "python" in table:
            out["python"] = self.pythons(table["python"], at("python"))
        if "torch" in table:
            values = self.strings(table["torch"], at("torch"))
            for i, value in enumerate(values):
                self.version(value, f"{at('torch')}[{i}]")
            out["torch"] = values
        if "torch-index" in table:
            self.torch_index(table["torch-index"], at("torch-index"))
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
            out["abi"] = self.choice(table["abi"], ABI_CHOICES, at("abi"))
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
