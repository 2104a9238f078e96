"""The dashboard's rows: one ``Row`` per wheel of the wheelhouse (published or staged), read from its file name and its
record (``rows_of``) or from facts handed in for a publish not yet committed (``rows_from``: ``WheelFacts``). What
the page shows of them, and how, is index/dashboard.py."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from builder.index.channelpolicy import wheel_channels
from builder.index.layout import Layout, log_path, record_path, sidecar_path, wheel_path
from builder.model.label import Label
from builder.model.platform import of_wheel_platform
from builder.model.records import BuildRecord, TestReport, TorchCheck
from builder.model.wheelfacts import Wheel


@dataclass
class Row:
    filename: str
    package: str
    version: str
    label: str
    cuda: str
    torch: str
    python: str
    archs_requested: list[str]
    sass: list[str]
    ptx: list[str]
    area: str  # published | staged
    status: str  # passed | skipped | failed | staged | import only | unknown
    import_status: str
    kernel_status: str
    kernel_reason: str
    counts: dict[str, int]
    speed: list[dict[str, str | float | int]]
    gpu: str
    size: int
    links: dict[str, str] = field(default_factory=dict)
    stable: bool = False  # a stable-ABI wheel: the torch column is its floor, the checks say where it runs
    torch_checks: list[TorchCheck] = field(default_factory=list)
    channels: tuple[str, ...] = ()  # the channels that list it (checks.wheel_channels)
    platform: str = "any"  # the CPU platform its tags name: x86_64 | aarch64 | any (pure Python)
    variant: str = ""  # a PEP 825 variant's label (sm90): a thin wheel of one arch, beside the plain wheel
    tested_arch: str = ""  # the arch of the GPU its kernel tests passed on (the record's capability): "sm_90"
    torch_unchecked: list[TorchCheck] = field(default_factory=list)  # not checked (an --offline build), not failed

    @property
    def archs_found(self) -> list[str]:
        return self.sass + self.ptx


@dataclass(frozen=True)
class WheelFacts:
    """What a row needs of one wheel: read from disk, or (for a publish not yet committed) handed in."""

    filename: str
    size: int
    record: BuildRecord | None
    has_log: bool


def rows_of(paths: Layout, wheels: list[Path], *, area: str, prefix: str = "") -> list[Row]:
    """One row per wheel of one wheelhouse area; ``prefix`` makes links relative to the dashboard's folder."""
    facts = []
    for wheel in wheels:
        try:
            data = json.loads(paths.record_file(wheel.name).read_text())
            record = BuildRecord.from_json(data) if isinstance(data, dict) else None
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            record = None
        try:
            size = wheel.stat().st_size
        except FileNotFoundError:  # taken out of staging by a promotion while we looked
            continue
        facts.append(WheelFacts(wheel.name, size, record, paths.log_file(wheel.name).exists()))
    return rows_from(facts, area=area, prefix=prefix)


def rows_from(facts: list[WheelFacts], *, area: str, prefix: str = "") -> list[Row]:
    return [_row(f, area, prefix) for f in facts]


def _row(facts: WheelFacts, area: str, prefix: str) -> Row:
    record = facts.record or BuildRecord()
    wheel = Wheel.of(facts.filename, facts.record)
    name, version, tags, label, parsed = wheel.name, wheel.version, wheel.tags, wheel.local or "", wheel.label
    stable = wheel.stable  # as checks.wheel_channels decides
    cuda = record.cuda or _label_line(parsed)
    tests = record.tests or TestReport()
    torch = str(record.python.get("torch") or tests.torch or (parsed.torch_text if parsed else None) or "—")
    if stable:
        torch = f"≥ {record.torch_floor}" if record.torch_floor else "stable ABI"
    interpreters = sorted({t.interpreter for t in tags})
    platform = "/".join(sorted({p.name for t in tags if (p := of_wheel_platform(t.platform)) is not None})) or "any"
    python = ", ".join(_python_of(i) for i in interpreters)
    if wheel.abi3:  # the limited API: this Python and every later one
        python = ", ".join(f"≥ {_python_of(i)} (abi3)" for i in interpreters)
    inspect = record.inspect or {}
    objects = inspect.get("objects") or []
    sass = sorted({a for o in objects for a in o.get("sass", [])}, key=_arch_key)
    ptx = sorted({a for o in objects for a in o.get("ptx", [])}, key=_arch_key)
    links = {"wheel": prefix + wheel_path(facts.filename), "metadata": prefix + sidecar_path(facts.filename)}
    if facts.record is not None:
        links["record"] = prefix + record_path(facts.filename)
    if facts.has_log:
        links["log"] = prefix + log_path(facts.filename)
    import_status = tests.import_status or "not run"
    kernel_status = tests.kernel_status or "not run"
    return Row(
        filename=facts.filename, package=record.package or str(name), version=str(version.public),
        label=label, cuda=cuda, torch=torch, python=python,
        archs_requested=list(record.archs), sass=sass, ptx=ptx, area=area,
        variant=wheel.variant or "",
        status=_status(area, record, import_status, kernel_status), import_status=import_status,
        kernel_status=kernel_status, kernel_reason=tests.kernel_reason,
        counts={k: int(v) for k, v in tests.counts.items()},
        speed=[dict(s) for s in tests.speed if isinstance(s, Mapping)], gpu=tests.gpu or "",
        size=facts.size, links=links, stable=stable,
        torch_checks=sorted(record.torch_checks or (), key=lambda c: (version_key(c.torch), c.how)),
        channels=wheel_channels(facts.filename, facts.record), platform=platform,
        tested_arch=",".join(dict.fromkeys(f"sm_{r.capability.number}" for r in record.gpu_reports if r.capability)),
        torch_unchecked=list(record.torch_unchecked or ()),
    )


def _label_line(label: Label | None) -> str:
    """The CUDA a label names, for a row without a record: ``12.8`` (a line's), ``12.x`` (a major's), else ``—``."""
    if label is None:
        return "—"
    return str(label.cuda_line) if label.cuda_line is not None else f"{label.cuda_major}.x"


def _status(area: str, record: BuildRecord, import_status: str, kernel_status: str) -> str:
    if record == BuildRecord():  # no record, or an empty one
        return "unknown"
    if "failed" in (import_status, kernel_status):
        return "failed"
    if area == "staged" and kernel_status != "passed":
        return "staged"
    if kernel_status in ("passed", "skipped"):
        return kernel_status
    return "import only" if import_status == "passed" else "unknown"


def _python_of(interpreter: str) -> str:
    m = re.fullmatch(r"(?:cp|py)(\d)(\d+)", interpreter)
    if m:
        return f"{m.group(1)}.{m.group(2)}"
    return "any (py3)" if interpreter == "py3" else interpreter


def _arch_key(arch: str) -> tuple[int, str]:
    m = re.search(r"(\d+)", arch)
    return (int(m.group(1)) if m else 0, arch)


def version_key(version: str) -> tuple[int, Version] | tuple[int, str]:
    """A sort key that orders versions as versions (2.9 before 2.10), and text that is none after them."""
    try:
        return (0, Version(version))
    except InvalidVersion:
        return (1, version)
