"""The project's GPU runs as data: ``evidence/gpu-runs.json`` read strictly, each entry made from a raw report.

One entry per GPU run that matters (docs/GPU-RESULTS.md summarises them, evidence/README.md describes the format):
when and where it ran (date, GPU-RESULTS.md section, session, GPU and sm), what ran (package, version, wheel file,
torch, the command, the expected outcome of a planted-fault run), the outcome (status, passed/failed/skipped, the
worst error as a share of tolerance where the report has it) and where the raw file is: a git commit and a path
(raw logs leave the working tree but stay in git history), with the file's sha256.

An entry's ``source`` says where its numbers come from:

- ``report``: the JSON a recipe's kernel_tests.py (or a check script) wrote; ``entry_facts(report)`` derives the
  facts, and tests/test_gpu_evidence.py derives them again from ``git show COMMIT:PATH`` so a hand-edited number
  fails;
- ``summary``: one line of the summary scripts/kernel-report-summary.py printed on the GPU machine (the report
  itself was not kept); ``summary_facts`` parses it, and the test parses it again;
- ``prose``: numbers from docs/GPU-RESULTS.md for a run with no machine-readable output; said so, never derived.

``builder coverage`` prints, per package, what the file holds (``package_lines``); nothing when it holds nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from builder.core.datafiles import data_dir
from builder.core.errors import BuilderError
from builder.core.statefile import StateFileError, describe, read_json

FORMAT = 1
SOURCES = ("report", "summary", "prose")
EXPECTS = ("pass", "fail", "memcheck-pass", "memcheck-fail", "racecheck-pass")
STATUSES = ("passed", "failed", "incomplete", "crashed")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}\Z")
SM = re.compile(r"sm_\d{2,3}[a-z]?\Z")
COMMIT = re.compile(r"[0-9a-f]{40}\Z")
# scripts/kernel-report-summary.py's first line of a report
SUMMARY_LINE = re.compile(
    r"(?P<name>\S+): (?P<status>\w+) on (?P<gpu>.+?) \(seed (?P<seed>\d+), quick (?P<quick>True|False)\): "
    r"(?P<passed>\d+) passed, (?P<failed>\d+) failed, (?P<skipped>\d+) skipped"
    r"(?:; worst (?P<worst>[\d.]+) of tolerance)?\Z")


class EvidenceError(BuilderError):
    """The evidence file cannot be read as what it should be; the message names the file and the field."""


def default_path() -> Path:
    """evidence/gpu-runs.json of the checkout (or of a package that carries the folder)."""
    return data_dir("evidence") / "gpu-runs.json"


@dataclass(frozen=True)
class Outcome:
    status: str
    passed: int | None
    failed: int | None
    skipped: int | None
    worst: float | None  # the largest error / allowed error of any check, where the report has it

    def text(self) -> str:
        counts = [f"{n} {what}" for n, what in ((self.passed, "passed"), (self.failed, "failed"),
                                                  (self.skipped, "skipped")) if n is not None]
        if not counts:
            return self.status
        if self.worst is not None:
            counts.append(f"worst {self.worst:.3f} of tolerance" if self.worst < 100 else
                          f"worst {self.worst:,.0f}x tolerance")
        return ", ".join(counts)


@dataclass(frozen=True)
class GpuRun:
    id: str
    date: str
    section: int
    session: int | None
    gpu: str
    sm: str
    package: str
    version: str
    torch: str | None
    wheel: str | None
    command: str
    expect: str | None  # a planted-fault run's expected outcome (scripts/gpu-kernel-proof.sh's EXPECT)
    outcome: Outcome
    source: str
    raw_commit: str | None
    raw_path: str | None
    raw_sha256: str | None
    raw_line: str | None  # a summary entry: the report name its line starts with
    note: str | None

    @property
    def gpu_short(self) -> str:
        words = self.gpu.removeprefix("NVIDIA ").split()
        return words[0] if words else self.gpu

    @property
    def planted(self) -> bool:
        return self.expect is not None and self.expect.endswith("fail")

    @property
    def met(self) -> bool | None:
        """Whether the outcome is the one expected; None without an expectation."""
        if self.expect is None:
            return None
        return self.outcome.status == ("failed" if self.expect.endswith("fail") else "passed")

    def headline(self) -> str:
        return f"{self.date} {self.gpu_short} {self.sm} {self.package} {self.version}: {self.outcome.text()}"

    def raw_text(self) -> str:
        if self.raw_path is None:
            return f"docs/GPU-RESULTS.md section {self.section} (prose)"
        where = f"git show {self.raw_commit[:12]}:{self.raw_path}" if self.raw_commit else self.raw_path
        return where + (f" (line {self.raw_line})" if self.raw_line else "")

    def to_json(self) -> dict[str, Any]:
        raw = None if self.raw_path is None else {
            "commit": self.raw_commit, "path": self.raw_path, "sha256": self.raw_sha256,
            **({"line": self.raw_line} if self.raw_line else {})}
        entry: dict[str, Any] = {
            "id": self.id, "date": self.date, "section": self.section, "session": self.session, "gpu": self.gpu,
            "sm": self.sm, "package": self.package, "version": self.version, "torch": self.torch,
            "wheel": self.wheel, "command": self.command, "expect": self.expect,
            "outcome": {"status": self.outcome.status, "passed": self.outcome.passed, "failed": self.outcome.failed,
                        "skipped": self.outcome.skipped, "worst": self.outcome.worst},
            "source": self.source, "raw": raw}
        if self.note:
            entry["note"] = self.note
        return entry


KEYS = {"id", "date", "section", "session", "gpu", "sm", "package", "version", "torch", "wheel", "command", "expect",
        "outcome", "source", "raw", "note"}


def load(path: Path) -> tuple[GpuRun, ...]:
    """Every run in the evidence file, checked field by field; EvidenceError naming the file and field."""
    try:
        data = read_json(path, limit=4 << 20)
    except FileNotFoundError as e:
        raise EvidenceError(f"{path}: no such evidence file") from e
    except StateFileError as e:
        raise EvidenceError(str(e)) from e
    if not isinstance(data, dict):
        raise EvidenceError(f"{path}: holds {describe(data)}, not a JSON object")
    if data.get("format") != FORMAT:
        raise EvidenceError(f"{path}: field 'format' is {data.get('format')!r}, not {FORMAT}")
    runs = data.get("runs")
    if not isinstance(runs, list):
        raise EvidenceError(f"{path}: field 'runs' is {describe(runs) if 'runs' in data else 'missing'}, not a list")
    out = []
    seen: set[str] = set()
    for i, entry in enumerate(runs):
        run = parse_run(entry, f"{path}: runs[{i}]")
        if run.id in seen:
            raise EvidenceError(f"{path}: runs[{i}].id {run.id!r} appears twice")
        seen.add(run.id)
        out.append(run)
    return tuple(out)


def parse_run(entry: Any, where: str) -> GpuRun:
    """One entry of ``runs``; ``where`` (file and index) starts every error message."""
    if not isinstance(entry, dict):
        raise EvidenceError(f"{where} is {describe(entry)}, not an object")
    unknown = sorted(set(entry) - KEYS)
    if unknown:
        raise EvidenceError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(sorted(KEYS))})")
    f = _Fields(entry, where)
    outcome = f.obj("outcome")
    o = _Fields(outcome, f"{where}.outcome")
    source = f.choice("source", SOURCES)
    raw = f.obj("raw", optional=True)
    if raw is None and source != "prose":
        raise EvidenceError(f"{where}.raw is null, but a {source} entry names its raw file")
    r = _Fields(raw or {}, f"{where}.raw")
    return GpuRun(
        id=f.text("id"), date=f.match("date", DATE, "a date YYYY-MM-DD"), section=f.count("section"),
        session=f.count("session", optional=True), gpu=f.text("gpu"), sm=f.match("sm", SM, "sm_NN"),
        package=f.text("package"), version=f.text("version"), torch=f.text("torch", optional=True),
        wheel=f.text("wheel", optional=True), command=f.text("command"),
        expect=f.choice("expect", EXPECTS, optional=True),
        outcome=Outcome(status=o.choice("status", STATUSES), passed=o.count("passed", optional=True),
                        failed=o.count("failed", optional=True), skipped=o.count("skipped", optional=True),
                        worst=o.number("worst", optional=True)),
        source=source,
        raw_commit=r.match("commit", COMMIT, "a 40-digit git commit") if raw is not None else None,
        raw_path=r.text("path") if raw is not None else None,
        raw_sha256=r.text("sha256", optional=source == "prose") if raw is not None else None,
        raw_line=r.text("line", optional=source != "summary") if raw is not None else None,
        note=f.text("note", optional=True))


class _Fields:
    def __init__(self, data: dict[str, Any], where: str) -> None:
        self.data, self.where = data, where

    def _get(self, key: str, kind: str, ok: type | tuple[type, ...], optional: bool) -> Any:
        value = self.data.get(key)
        if value is None and optional:
            return None
        if not isinstance(value, ok) or isinstance(value, bool):
            got = describe(value) if key in self.data else "missing"
            raise EvidenceError(f"{self.where}.{key} is {got}, not {kind}")
        return value

    def text(self, key: str, optional: bool = False) -> Any:
        value = self._get(key, "a string", str, optional)
        if value == "":
            raise EvidenceError(f"{self.where}.{key} is empty")
        return value

    def count(self, key: str, optional: bool = False) -> Any:
        value = self._get(key, "a whole number", int, optional)
        if value is not None and value < 0:
            raise EvidenceError(f"{self.where}.{key} is {value}, not a whole number >= 0")
        return value

    def number(self, key: str, optional: bool = False) -> Any:
        value = self._get(key, "a number", (int, float), optional)
        if value is not None and not 0 <= value < float("inf"):
            raise EvidenceError(f"{self.where}.{key} is {value}, not a number >= 0")
        return value

    def obj(self, key: str, optional: bool = False) -> Any:
        return self._get(key, "an object", dict, optional)

    def match(self, key: str, pattern: re.Pattern[str], kind: str) -> str:
        value: str = self.text(key)
        if not pattern.match(value):
            raise EvidenceError(f"{self.where}.{key} is {value!r}, not {kind}")
        return value

    def choice(self, key: str, choices: tuple[str, ...], optional: bool = False) -> Any:
        value = self.text(key, optional)
        if value is not None and value not in choices:
            raise EvidenceError(f"{self.where}.{key} is {value!r}, not one of {', '.join(choices)}")
        return value


def sm_of(capability: str) -> str:
    """``9.0`` (torch's capability) → ``sm_90``."""
    major, _, minor = capability.partition(".")
    return f"sm_{major}{minor or '0'}"


def report_facts(data: bytes) -> dict[str, Any]:
    """What an entry takes from a raw report (a kernel-test report, or a check script's JSON): the GPU, package,
    version, torch and outcome. Only what the report holds: no count where it has none, no worst where it has none."""
    report = json.loads(data)
    counts = report.get("counts")
    facts: dict[str, Any] = {"gpu": report["gpu"], "torch": report.get("torch")}
    if "capability" in report:
        facts["sm"] = sm_of(report["capability"])
    if "package" in report:
        facts["package"], facts["version"] = report["package"], report["version"]
    worst = report.get("worst")
    facts["outcome"] = {"status": report["status"],
                        "passed": counts["passed"] if counts else None,
                        "failed": counts["failed"] if counts else None,
                        "skipped": counts["skipped"] if counts else None,
                        "worst": round(worst, 4) if isinstance(worst, (int, float)) else None}
    return facts


def summary_facts(text: str, name: str) -> dict[str, Any]:
    """The facts of one report's line in a summary scripts/kernel-report-summary.py printed (``name``: the report's
    file name the line starts with)."""
    for line in text.splitlines():
        m = SUMMARY_LINE.match(line)
        if m and m["name"] == name:
            return {"gpu": m["gpu"],
                    "outcome": {"status": m["status"], "passed": int(m["passed"]), "failed": int(m["failed"]),
                                "skipped": int(m["skipped"]),
                                "worst": round(float(m["worst"]), 4) if m["worst"] else None}}
    raise ValueError(f"no summary line for {name}")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def derived(run: GpuRun, data: bytes) -> dict[str, Any]:
    """The facts of ``run`` its raw file gives, next to what the entry says (for the re-derivation check)."""
    facts = report_facts(data) if run.source == "report" else summary_facts(data.decode(), run.raw_line or "")
    entry = run.to_json()
    return {"derived": facts, "entry": {k: entry[k] for k in facts}}


def dump(runs: list[dict[str, Any]]) -> str:
    """The file's text: one entry a line, so a diff shows the run that changed."""
    lines = ",\n".join(" " + json.dumps(r, ensure_ascii=False) for r in runs)
    return f'{{"format": {FORMAT},\n "about": "evidence/README.md",\n "runs": [\n{lines}\n]}}\n'


def package_lines(runs: tuple[GpuRun, ...], package: str, version: str | None = None) -> list[str]:
    """What the evidence file holds of one package, in a few lines; none when it holds nothing."""
    mine = sorted((r for r in runs if r.package == package), key=lambda r: r.date)
    if not mine:
        return []
    gpus = sorted({f"{r.gpu_short} {r.sm}" for r in mine})
    of_version = [r for r in mine if version and r.version.split("+")[0] == version]
    head = (f"GPU evidence: {_runs(len(mine))}, {mine[0].date} to {mine[-1].date}, on {', '.join(gpus)}"
            + (f"; {len(of_version)} of {version}" if version else ""))
    lines = [head]
    real = [r for r in mine if not r.planted]
    suites = [r for r in real if r.outcome.passed is not None] or real  # the last test suite, before a check
    if suites:
        last = suites[-1]
        lines.append(f"  last: {last.headline()} (GPU-RESULTS.md section {last.section}; {last.raw_text()})")
    planted = [r for r in mine if r.planted]
    if planted:
        unmet = [r.id for r in planted if not r.met]
        lines.append(f"  expected to fail (planted faults, unfixed defects): {_runs(len(planted))}, "
                     f"{len(planted) - len(unmet)} failed as expected"
                     + (f"; not as expected: {', '.join(unmet)}" if unmet else ""))
    other = [r for r in real if r.met is False or (r.met is None and r.outcome.status != "passed")]
    if other:
        lines.append(f"  not passed (each entry's note says why): "
                     f"{', '.join(f'{r.id} ({r.outcome.status})' for r in other)}")
    return lines


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"
