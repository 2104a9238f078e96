"""Typed values handed between stages and to the CLI, and their one JSON form each (``to_json``/``from_json``).

Over 400 lines on purpose: the record is one schema (a build record, its test reports, torch checks and parts), and
each field's JSON form sits beside its declaration; model/recordshape.py checks a read record's shapes and
model/recordmerge.py merges two of them."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from packaging.version import InvalidVersion, Version

from builder.core.errors import UsageError
from builder.model.abi import channel_label
from builder.model.arch import Arch, parse_arch_list
from builder.model.cuda import CudaVersion
from builder.model.recordmerge import merge_reports
from builder.model.recordshape import RecordShapeError as RecordShapeError
from builder.model.recordshape import as_read, check_record_json, plain, recipe_json
from builder.model.wheelbuild import WheelBuild as WheelBuild

FARM_STATUSES = ("built", "unchanged", "failed")


@dataclass(frozen=True, kw_only=True)
class FarmOutcome:
    """What became of one farm target (a worker's answer, or the up-front check's "unchanged")."""

    id: str
    status: str  # built | unchanged | failed
    wheel: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0
    exit_code: int | None = None
    log: str | None = None

    def took(self, seconds: float) -> FarmOutcome:
        return dataclasses.replace(self, seconds=seconds)

    def with_log(self, path: str) -> FarmOutcome:
        return dataclasses.replace(self, log=path)

    def to_json(self) -> dict[str, Any]:
        """The entry of summary.json (``exit_code`` only where a worker failed with one, as before)."""
        out: dict[str, Any] = {"id": self.id, "status": self.status, "wheel": self.wheel, "timings": self.timings,
                               "error": self.error}
        if self.exit_code is not None:
            out["exit_code"] = self.exit_code
        out["seconds"] = self.seconds
        if self.log is not None:
            out["log"] = self.log
        return out


# ---------------------------------------------------------------- the kernel-test result


@dataclass(frozen=True, kw_only=True)
class TestReport:
    """The test stage's result: the import test in a clean venv, then the recipe's kernel tests."""

    __test__ = False  # not a pytest class

    import_status: str = "not run"  # passed | failed | not run
    import_detail: str = ""
    kernel_status: str = "not run"  # passed | failed | skipped | not run
    kernel_reason: str = ""
    counts: Mapping[str, int] = field(default_factory=dict)
    speed: tuple[Mapping[str, Any], ...] = ()  # one row per benchmark the suite wrote (name, speedup, ...)
    gpu: str | None = None
    torch: str | None = None
    # the compute capability of the GPU the kernel tests ran on (the harness's "capability": "9.0" → Arch 90), so
    # coverage can say which arch a kernel test covered; None where none ran (or a record from before)
    capability: Arch | None = None
    python: str | None = None  # the tests' venv's Python (3.12.1): coverage tells ran from inferred; None before
    read_keys: frozenset[str] | None = field(default=None, compare=False, repr=False)  # see BuildRecord

    @property
    def failed(self) -> bool:
        return "failed" in (self.import_status, self.kernel_status)

    def summary(self) -> str:
        kernel = self.kernel_status + (f" ({self.kernel_reason})" if self.kernel_reason else "")
        return f"import {self.import_status}; kernel tests {kernel}"

    def to_json(self) -> dict[str, Any]:
        out = {"import_status": self.import_status, "import_detail": self.import_detail,
               "kernel_status": self.kernel_status, "kernel_reason": self.kernel_reason, "counts": dict(self.counts),
               "speed": [dict(row) for row in self.speed], "gpu": self.gpu, "torch": self.torch}
        if self.capability is not None:  # absent where none ran, as in records from before
            out["capability"] = self.capability.torch_name
        out.update({"python": self.python} if self.python is not None else {})
        return as_read(self, out)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TestReport:
        return cls(import_status=str(data.get("import_status", "not run")),
                   import_detail=str(data.get("import_detail") or ""),
                   kernel_status=str(data.get("kernel_status", "not run")),
                   kernel_reason=str(data.get("kernel_reason") or ""), counts=dict(data.get("counts") or {}),
                   speed=tuple(dict(r) for r in data.get("speed") or ()), gpu=data.get("gpu"), torch=data.get("torch"),
                   capability=parse_capability(data.get("capability")),
                   python=str(data["python"]) if data.get("python") else None, read_keys=frozenset(data))


def parse_capability(value: object) -> Arch | None:
    """A GPU's compute capability as the kernel harness reports it ("9.0", "12.0"; also 90 or "sm_90") as an Arch;
    None for none or anything else."""
    if value is None or isinstance(value, bool) or not isinstance(value, str | int):
        return None
    try:
        (arch,) = parse_arch_list(str(value))
    except (UsageError, ValueError):
        return None
    return arch


def cuda_or_none(text: str) -> CudaVersion | None:
    """A record's CUDA string typed; None where it names none or not a version (records stay readable)."""
    try:
        return CudaVersion.parse(text) if text else None
    except InvalidVersion:
        return None


# ---------------------------------------------------------------- a stable-ABI wheel on one torch


@dataclass(frozen=True, kw_only=True)
class TorchCheck:
    """One torch a stable-ABI wheel was tried on (stages/torchrange.py), and how: ``import+registration`` (the
    wheel imported beside that torch and every op of its namespaces has a CUDA kernel, on a CPU machine) or
    ``gpu-kernel-tests`` (the kernel suite passed on a GPU with that torch)."""

    torch: str  # the release installed: 2.12.1
    cuda: str  # that torch's torch.version.cuda: 13.0
    python: str  # the venv's Python: 3.12.1
    how: str
    status: str  # passed | failed
    detail: str = ""

    @property
    def channel(self) -> str:
        """The channel label of this torch (``cu130torch2.12``): where the wheel is offered once this passed."""
        return channel_label(self.cuda, self.torch)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def version(self) -> Version:
        """The torch release as a version (its public part: ``2.12.1``); 0 where the record names none."""
        try:
            return Version(Version(self.torch).public)
        except InvalidVersion:
            return Version("0")

    @property
    def cuda_version(self) -> CudaVersion | None:
        return cuda_or_none(self.cuda)

    @property
    def key(self) -> tuple[Version, str, str]:
        """What one check is of: (torch release, CUDA line, how). A later check of the same key replaces it."""
        cuda = self.cuda_version
        return self.version, cuda.line if cuda is not None else self.cuda, self.how

    @property
    def named(self) -> str:
        """The torch with its CUDA, as pip names such a build: ``2.15.0+cu130`` (the bare release where no CUDA)."""
        cuda = self.cuda_version
        return f"{self.version}+{cuda.flavour}" if cuda is not None else str(self.version)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TorchCheck:
        return cls(torch=str(data.get("torch", "")), cuda=str(data.get("cuda", "")), python=str(data.get("python", "")),
                   how=str(data.get("how", "")), status=str(data.get("status", "")), detail=str(data.get("detail", "")))


# ---------------------------------------------------------------- the build record


@dataclass(frozen=True, kw_only=True)
class FileDigest:
    file: str
    sha256: str  # the file's bytes (provenance)
    content_sha256: str = ""  # its parsed content (model/recipe.py content_digest): what the cache key covers


@dataclass(frozen=True, kw_only=True)
class SourceDigest:
    kind: str  # pypi | url | path | git
    location: str
    sha256: str | None


@dataclass(frozen=True, kw_only=True)
class PatchDigest:
    file: str
    sha256: str
    versions: str  # the version range it applies to


@dataclass(frozen=True, kw_only=True)
class RuntimeDropped:
    names: tuple[str, ...]
    reason: str


StrMap = Mapping[str, str]
# What a build record holds besides the wheel's own part: added after finalize, in records/ only (the wheel's
# bytes stay reproducible), written only where set.
_AFTER_FINALIZE = ("timings", "tests", "inspect", "wheel", "compiler_cache", "wheel_sha256", "parallel",
                   "torch_checks", "torch_unchecked", "abi_choice", "gpu_tests")


@dataclass(frozen=True)
class VariantInfo:
    """A variant wheel's (PEP 825, model/variants.py): its label, the archs of the plain wheel it was sliced from,
    and the provider properties it is chosen by."""

    label: str
    of_archs: tuple[str, ...]
    properties: Mapping[str, Mapping[str, list[str]]]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VariantInfo:
        return cls(str(data.get("label", "")), tuple(str(a) for a in data.get("of_archs") or ()),
                   dict(data.get("properties") or {}))


@dataclass(frozen=True, kw_only=True)
class BuildRecord:
    """What a wheel was built from and how: in its .dist-info (cuda_wheel_builder.json, written by finalize) and,
    with the test results, inspection and timings, in the wheelhouse's records/<wheel>.json (index/store.py).

    ``from_json`` reads every record written before this type too (a missing key gets its default) and keeps keys
    it does not know in ``extra``, so a record read and written again loses nothing."""

    builder_version: str = ""
    cache_key: str = ""
    package: str = ""
    version: str = ""
    recipe: FileDigest | None = None
    source: SourceDigest | None = None
    patches: tuple[PatchDigest, ...] = ()
    cuda: str = ""  # as the JSON says it (str(CudaVersion)); read typed through ``cuda_version``
    archs: tuple[str, ...] = ()  # () for pure Python
    toolchain: StrMap = field(default_factory=dict)  # the toolkit's record; {"kind": "none (pure Python)"}
    host_compiler: StrMap | None = None
    python: Mapping[str, str | None] = field(default_factory=dict)  # the build venv: python, version, torch, ...
    torch_index: str = ""
    host: StrMap = field(default_factory=dict)
    build_log: str = ""
    runtime_dropped: RuntimeDropped | None = None  # absent for recipes without [runtime] drop
    abi: str | None = None  # "torch-stable" (model/abi.py); absent for per-torch builds, as before
    torch_floor: str | None = None  # a stable-ABI wheel's oldest torch (2.11)
    platform: str | None = None  # the wheel's CPU platform (aarch64); absent for x86_64 and pure Python, as before
    variant: VariantInfo | None = None  # a variant wheel (one arch sliced from the plain wheel); absent otherwise
    build: WheelBuild | None = None  # its build tag's number and why; absent for build 0 (no build tag), as before
    subset: str | None = None  # a recipe [[subset]] build (--subset: tests only, never published); absent otherwise
    # records/ only
    timings: Mapping[str, float] | None = None
    tests: TestReport | None = None
    inspect: Mapping[str, Any] | None = None  # the inspection stage's report (stages/inspection.WheelReport)
    wheel: str | None = None
    compiler_cache: Mapping[str, int] | None = None
    wheel_sha256: str | None = None
    parallel: Mapping[str, int] | None = None  # MAX_JOBS, nvcc and ptxas threads (stages/compile.Parallelism)
    torch_checks: tuple[TorchCheck, ...] | None = None  # a stable-ABI wheel: each torch it was tried on
    # the torches of its range that could not be tried here (--offline: not on this machine without the network),
    # each a TorchCheck with status "not checked": neither passed nor failed, so no channel is decided by them
    torch_unchecked: tuple[TorchCheck, ...] | None = None
    abi_choice: str | None = None  # why this ABI (stages/abichoice.py choose_abi: "torch-stable (--abi auto): ...")
    # one report per (GPU arch, GPU model, torch) its kernel tests ran on (model/recordmerge.py); ``tests`` stays the
    # latest report of any machine; absent in records from before (``gpu_reports`` reads those)
    gpu_tests: tuple[TestReport, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    # the keys of the JSON it was read from (None: made here): a read record is written back with those keys
    # and any the builder set since, not with every default, so records of older builders keep their bytes
    read_keys: frozenset[str] | None = field(default=None, compare=False, repr=False)

    @property
    def cuda_version(self) -> CudaVersion | None:
        """The CUDA the wheel was built for; None where the record names none (or not a version)."""
        return cuda_or_none(self.cuda)

    @property
    def arch_list(self) -> tuple[Arch, ...]:
        """The archs it was built for, typed (``archs`` keeps the JSON's strings); () for pure Python or a record
        whose archs do not parse."""
        try:
            return parse_arch_list(",".join(self.archs)) if self.archs else ()
        except UsageError:
            return ()

    @property
    def build_torch(self) -> Version | None:
        """The torch of the build venv (``python["torch"]``: 2.11.0+cu130), typed; None where the record has none."""
        return _version_or_none(self.python.get("torch"))

    @property
    def build_python(self) -> str | None:
        """The build venv's Python version as recorded (``python["version"]``: "3.12"); None where absent."""
        value = self.python.get("version")
        return str(value) if value else None

    @property
    def target_platform(self) -> str:
        """The CPU platform the wheel was built for (records before the platform axis: x86_64)."""
        return self.platform or "x86_64"

    @property
    def build_number(self) -> int:
        """The wheel's build number (0: a wheel without a build tag)."""
        return self.build.number if self.build is not None else 0

    @property
    def is_stable_abi(self) -> bool:
        return self.abi == "torch-stable"

    def with_(self, **changes: Any) -> BuildRecord:
        return dataclasses.replace(self, **changes)

    @property
    def gpu_reports(self) -> tuple[TestReport, ...]:
        """One test report per (GPU arch, GPU model, torch) its kernel tests ran on; an old record: its GPU report."""
        if self.gpu_tests is not None:
            return self.gpu_tests
        return (self.tests,) if self.tests is not None and self.tests.capability is not None else ()

    def with_tests(self, report: TestReport) -> BuildRecord:
        """``report`` as the latest; one from a GPU replaces only the report of its own (arch, GPU model, torch)
        (model/recordmerge.py ``report_key``), so the test jobs of two GPUs on the same wheel keep both."""
        if report.capability is None:
            return self.with_(tests=report)
        return self.with_(tests=report, gpu_tests=merge_reports(self.gpu_reports, (report,)))

    def in_wheel(self) -> BuildRecord:
        """The part finalize writes into the wheel (nothing that differs between two builds of the same inputs)."""
        cleared: dict[str, Any] = {name: None for name in _AFTER_FINALIZE}  # each of them is optional (None)
        return dataclasses.replace(self, **cleared)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        out.update(
            builder_version=self.builder_version, cache_key=self.cache_key, package=self.package,
            version=self.version, recipe=recipe_json(self.recipe), source=plain(self.source),
            patches=[plain(p) for p in self.patches], cuda=self.cuda, archs=list(self.archs),
            toolchain=dict(self.toolchain),
            host_compiler=None if self.host_compiler is None else dict(self.host_compiler),
            python=dict(self.python), torch_index=self.torch_index, host=dict(self.host), build_log=self.build_log,
        )
        if self.runtime_dropped is not None:
            out["runtime_dropped"] = {"names": list(self.runtime_dropped.names), "reason": self.runtime_dropped.reason}
        if self.abi is not None:
            out["abi"], out["torch_floor"] = self.abi, self.torch_floor
        if self.platform is not None:
            out["platform"] = self.platform
        if self.variant is not None:
            out["variant"] = plain(self.variant)
        if self.build is not None:
            out["build"] = {"number": self.build.number, "by": list(self.build.by)}
        out.update({"subset": self.subset} if self.subset is not None else {})
        for name in _AFTER_FINALIZE:
            value = getattr(self, name)
            if value is not None or (name == "compiler_cache" and self.wheel is not None):
                out[name] = value.to_json() if isinstance(value, TestReport) else [r.to_json() for r in value] \
                    if name == "gpu_tests" else plain(value)
        return as_read(self, out)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BuildRecord:
        """Raises RecordShapeError (a ValueError naming the field) for a known field of the wrong type."""
        check_record_json(data)
        known = {f.name for f in dataclasses.fields(cls)} - {"extra", "read_keys"}
        recipe, source, dropped = data.get("recipe"), data.get("source"), data.get("runtime_dropped")
        tests = data.get("tests")
        return cls(
            builder_version=str(data.get("builder_version") or ""), cache_key=str(data.get("cache_key") or ""),
            package=str(data.get("package") or ""), version=str(data.get("version") or ""),
            recipe=FileDigest(file=str(recipe.get("file", "")), sha256=str(recipe.get("sha256", "")),
                              content_sha256=str(recipe.get("content_sha256", "")))
            if isinstance(recipe, Mapping) else None,
            source=SourceDigest(kind=str(source.get("kind", "")), location=str(source.get("location", "")),
                                sha256=source.get("sha256")) if isinstance(source, Mapping) else None,
            patches=tuple(PatchDigest(file=str(p["file"]), sha256=str(p["sha256"]), versions=str(p.get("versions", "")))
                          for p in data.get("patches") or ()),
            cuda=str(data.get("cuda") or ""), archs=tuple(str(a) for a in data.get("archs") or ()),
            toolchain=dict(data.get("toolchain") or {}),
            host_compiler=dict(data["host_compiler"]) if data.get("host_compiler") is not None else None,
            python=dict(data.get("python") or {}), torch_index=str(data.get("torch_index") or ""),
            host=dict(data.get("host") or {}), build_log=str(data.get("build_log") or ""),
            runtime_dropped=RuntimeDropped(names=tuple(dropped.get("names", ())), reason=str(dropped.get("reason", "")))
            if isinstance(dropped, Mapping) else None,
            timings=data.get("timings"), tests=TestReport.from_json(tests) if isinstance(tests, Mapping) else None,
            inspect=data.get("inspect"), wheel=data.get("wheel"), compiler_cache=data.get("compiler_cache"),
            wheel_sha256=data.get("wheel_sha256"), parallel=data.get("parallel"),
            abi=data.get("abi"), torch_floor=data.get("torch_floor"), subset=data.get("subset"),
            platform=str(data["platform"]) if data.get("platform") else None,
            variant=VariantInfo.from_json(data["variant"]) if isinstance(data.get("variant"), Mapping) else None,
            build=WheelBuild(int(data["build"].get("number") or 0), tuple(str(b) for b in data["build"].get("by") or ()))
            if isinstance(data.get("build"), Mapping) else None,
            torch_checks=tuple(TorchCheck.from_json(c) for c in data["torch_checks"] if isinstance(c, Mapping))
            if isinstance(data.get("torch_checks"), list) else None,
            torch_unchecked=tuple(TorchCheck.from_json(c) for c in data["torch_unchecked"] if isinstance(c, Mapping))
            if isinstance(data.get("torch_unchecked"), list) else None,
            abi_choice=str(data["abi_choice"]) if data.get("abi_choice") else None,
            gpu_tests=tuple(TestReport.from_json(r) for r in data["gpu_tests"])
            if isinstance(data.get("gpu_tests"), list) else None,
            extra={k: v for k, v in data.items() if k not in known}, read_keys=frozenset(data),
        )

    def wheel_bytes(self) -> bytes:
        """The record file inside the wheel (finalize): sorted keys, so equal records give equal bytes."""
        return (json.dumps(self.in_wheel().to_json(), indent=2, sort_keys=True) + "\n").encode()

    def file_bytes(self) -> bytes:
        """records/<wheel>.json in the wheelhouse (index/store.py)."""
        return json.dumps(self.to_json(), indent=2, sort_keys=True).encode()


def _version_or_none(value: object) -> Version | None:
    """A version a record holds as text; None for none or one that does not parse."""
    try:
        return Version(str(value)) if value else None
    except InvalidVersion:
        return None
