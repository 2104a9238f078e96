"""A real resolver's word on the farm's claimed cells (issue 39 item 2, ``builder coverage --resolve``).

farm/proven.py judges a claimed cell *installable* by rules (the torch pin, the triton pin table, Requires-Python).
Here uv's own resolver is asked instead: for each claimed cell and each torch release behind it, ``uv pip compile``
with ``--python-version``, ``--python-platform`` and the requirements ``torch==RELEASE`` plus the farm target's wheel.
Since torch is pinned, an answer keeps that torch release or says why it cannot: "installs beside that exact torch
release without changing it".

The wheels do not exist before the farm runs, so each target's wheel is a *metadata twin*: a wheel with no code and
the name, version (local label included), tag, Requires-Python and Requires-Dist the real one would get, written by
the code that writes the real one (pipeline/run.label_and_pins, stages/finalize.rewrite_metadata over upstream's
recorded METADATA, farm/facts.py ``WHEEL_FACTS``). The twin is given to uv by its file URL (``name @ file://…``), so
a same-named release on the index cannot stand in for it.

Only PyPI is reachable from here: cells whose torch comes only from PyPI's channels of PyTorch
(download.pytorch.org) are each probed once per index and reported "not resolved: <index> unreachable" when uv
cannot reach it; they never count as installable. Each distinct question (twin, torch release, Python, platform) is
asked once; uv's own cache keeps the index pages between runs.

Here: the twin (``Twin``, ``twin_of``) and the resolver that asks uv (``Resolver``); farm/resolvefarm.py asks it
about the farm's claimed cells and reports the answers.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from threading import Lock

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.core.uvtool import run_uv_process, uv_bin
from builder.core.wheelfile import write_wheel
from builder.farm.facts import WheelFacts
from builder.model.platform import Platform
from builder.model.wheelfacts import requires_dist
from builder.pipeline.run import label_and_pins
from builder.stages.finalize import labelled_version, rewrite_metadata
from builder.stages.plan import Plan

PYPI_NAME = "pypi"


@dataclass(frozen=True)
class Twin:
    """A wheel with no code and the real one's name, version, tag and METADATA: what a resolver reads of it."""

    name: str
    version: str
    tag: str  # cp312-cp312-manylinux_2_28_x86_64 | cp310-abi3-manylinux_2_28_aarch64 | py3-none-any
    metadata: str

    @property
    def filename(self) -> str:
        return f"{self.name.replace('-', '_')}-{self.version}-{self.tag}.whl"

    @property
    def requires(self) -> tuple[str, ...]:
        return requires_dist(self.metadata)  # model/wheelfacts.py: the one reader

    @property
    def requires_python(self) -> str | None:
        return next((line.split(":", 1)[1].strip() for line in self.metadata.splitlines()
                     if line.startswith("Requires-Python:")), None)

    def write(self, folder: Path) -> Path:
        """The twin as a valid wheel file in ``folder`` (written once; same name, same bytes)."""
        path = folder / self.filename
        if not path.exists():
            info = f"{self.name.replace('-', '_')}-{self.version}.dist-info"
            wheel = f"Wheel-Version: 1.0\nGenerator: cuda-wheel-builder (metadata twin)\nRoot-Is-Purelib: " \
                    f"{'true' if self.tag.endswith('-none-any') else 'false'}\nTag: {self.tag}\n"
            folder.mkdir(parents=True, exist_ok=True)
            write_wheel(path, {f"{info}/METADATA": self.metadata.encode(), f"{info}/WHEEL": wheel.encode()}, info,
                        {})
        return path


def upstream_metadata(name: str, version: str, facts: WheelFacts) -> str:
    """The METADATA upstream's build writes, as far as a resolver reads it: recorded in farm/facts.py."""
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}",
             f"Requires-Python: {facts.requires_python}", "Requires-Dist: torch",
             *(f"Requires-Dist: {r}" for r in facts.requires)]
    return "\n".join(lines) + "\n\n"


def wheel_tag(plan: Plan) -> str:
    """The tag of the wheel the farm ships for ``plan``: its Python and ABI tags (``Plan.python_tag``) on
    manylinux_2_28 of the target's platform (what PyPI's torch wheels are too); ``py3-none-any`` for a
    pure-Python recipe."""
    return "py3-none-any" if plan.pure_python else f"{plan.python_tag}-{plan.target.platform.manylinux_tag}"


def twin_of(plan: Plan, facts: WheelFacts) -> Twin:
    """The metadata twin of the wheel ``plan`` builds: label and pins as pipeline/run.py gives finalize, METADATA
    as finalize rewrites upstream's."""
    label, pins = label_and_pins(plan, plan.torch or "")
    version = labelled_version(Version(plan.version), label) if label else Version(plan.version)
    text = rewrite_metadata(upstream_metadata(plan.recipe.name, plan.version, facts), version, pins,
                            plan.recipe.runtime_drop, plan.requires_python)
    return Twin(canonicalize_name(plan.recipe.name), str(version), wheel_tag(plan), text)


@dataclass(frozen=True)
class Resolution:
    """uv's answer: installs (torch kept at the release asked), or why not in uv's words."""

    installs: bool
    reason: str = ""
    cause: str = ""  # uv's last cause line (the root: "failed to lookup address information: …")


def _uv_reason(stderr: str, replace: Mapping[str, str]) -> str:
    """uv's error as one line: its ``cause:``/``╰─▶`` lines (the derivation), file URLs named by the twin."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    keep = [ln.removeprefix("cause:").removeprefix("╰─▶").strip() for ln in lines
            if not ln.startswith(("error: No solution found", "warning:", "hint:"))]
    text = " ".join(keep or lines[-1:]).removeprefix("error:").strip()
    for old, new in replace.items():
        text = text.replace(old, new)
    return text or "uv failed without a message"


class Resolver:
    """Asks ``uv pip compile`` whether requirements resolve with torch kept at one release, once per distinct
    question. ``index_url``: the index (None: ``--no-index``); ``find_links``: folders of extra wheels."""

    def __init__(self, workdir: Path, index_url: str | None, *, find_links: Iterable[Path] = (),
                 env: Mapping[str, str] | None = None, jobs: int = 4) -> None:
        self.workdir = workdir
        self.index_url = index_url
        self.find_links = tuple(find_links)
        self.env = env
        self.jobs = jobs
        self.runs = 0
        self.asked = 0
        self.seconds = 0.0
        self._memo: dict[tuple[str, ...], Resolution] = {}
        self._lock = Lock()

    def _argv(self, requirements: Path, python: str, platform: Platform) -> list[str]:
        argv = [uv_bin(), "pip", "compile", str(requirements), "--python-version", python,
                "--python-platform", platform.uv_platform, "--no-build", "--no-header", "--no-annotate",
                "--no-config", "--no-python-downloads", "--color", "never"]  # --python-version: the
        # target Python is assumed, not run: no interpreter of it is needed (without this uv fetches one)
        argv += ["--index-url", self.index_url] if self.index_url else ["--no-index"]
        for folder in self.find_links:
            argv += ["--find-links", str(folder)]
        return argv

    def check(self, twin: Twin | None, torch: str, python: str, platform: Platform) -> Resolution:
        """Does ``twin`` install beside ``torch==TORCH`` for Python ``python`` on ``platform`` (``twin`` None:
        does that torch release resolve at all)?"""
        key = (twin.filename if twin else "", twin.metadata if twin else "", torch, python, platform.name)
        with self._lock:
            self.asked += 1
            if key in self._memo:
                return self._memo[key]
        lines = [f"torch=={torch}"]
        replace: dict[str, str] = {}
        if twin is not None:
            with self._lock:  # threads of check_all ask of one twin at once: one writes it
                path = twin.write(self.workdir / "twins")
            lines.append(f"{twin.name} @ {path.as_uri()}")
            replace = {path.as_uri(): twin.filename, str(path): twin.filename}
        digest = hashlib.sha256("\0".join(key).encode()).hexdigest()[:16]
        requirements = self.workdir / "req" / f"{digest}.txt"
        requirements.parent.mkdir(parents=True, exist_ok=True)
        requirements.write_text("\n".join(lines) + "\n")
        start = time.monotonic()
        result = run_uv_process(self._argv(requirements, python, platform), what=f"resolving {' + '.join(lines)}",
                                env=self.env)
        took = time.monotonic() - start
        pinned = {_pin(line) for line in result.stdout.splitlines()}
        if result.returncode == 0 and f"torch=={Version(torch)}" in pinned:
            answer = Resolution(True)
        elif result.returncode == 0:
            answer = Resolution(False, f"uv resolved without torch=={torch}: {result.stdout.strip()}")
        else:
            causes = [ln.strip() for ln in result.stderr.splitlines() if ln.strip()]
            answer = Resolution(False, _uv_reason(result.stderr, replace),
                                causes[-1].removeprefix("cause:").strip() if causes else "")
        with self._lock:
            self.runs += 1
            self.seconds += took
            self._memo[key] = answer
        return answer

    def check_all(self, questions: Iterable[tuple[Twin | None, str, str, Platform]]) -> list[Resolution]:
        """``check`` for each question, ``jobs`` uv processes at a time (distinct questions only run)."""
        unique = list(dict.fromkeys(questions))
        with ThreadPoolExecutor(max_workers=self.jobs) as pool:
            answers = dict(zip(unique, pool.map(lambda q: self.check(*q), unique), strict=True))
        return [answers[q] for q in unique]


def _pin(line: str) -> str:
    """``torch==2.9.1`` of a compiled line (``torch==2.9.1 ; marker`` too), normalised."""
    text = line.split(";", 1)[0].strip()
    if "==" not in text or text.startswith("#"):
        return ""
    try:
        req = Requirement(text)
    except ValueError:
        return ""
    spec = next(iter(req.specifier), None)
    return f"{canonicalize_name(req.name)}=={Version(spec.version)}" if spec is not None else ""
