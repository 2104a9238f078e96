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
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from threading import Lock
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.core.errors import BuilderError, UsageError
from builder.core.settings import Settings
from builder.core.uvtool import run_uv_process, uv_bin
from builder.core.wheelfile import write_wheel
from builder.discovery.compat import TorchIndex, known_indexes
from builder.farm.expand import Cell, serving
from builder.farm.facts import WheelFacts, wheel_facts
from builder.farm.spec import FarmTarget
from builder.model.platform import Platform, parse_platform
from builder.pipeline.run import label_and_pins
from builder.stages.finalize import labelled_version, rewrite_metadata
from builder.stages.plan import Plan, make_plan

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
        return tuple(line.split(":", 1)[1].strip() for line in self.metadata.splitlines()
                     if line.startswith("Requires-Dist:"))

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
    """The tag of the wheel the farm ships for ``plan``: one py3-none-any wheel for a pure-Python recipe, a
    cp3X-abi3 one at the port's Python floor for a stable-ABI build, else the target Python's own; manylinux_2_28
    of the target's platform (what PyPI's torch wheels are too)."""
    if plan.pure_python:
        return "py3-none-any"
    plat = plan.target.platform.manylinux_tag
    if plan.stable and plan.recipe.stable_abi is not None:
        return f"cp{plan.recipe.stable_abi.python_floor.replace('.', '')}-abi3-{plat}"
    py = f"cp{str(plan.target.python).replace('.', '')}"
    return f"{py}-{py}-{plat}"


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


# ------------------------------------------------------------------ the farm's claimed cells asked

@dataclass
class ResolvedView:
    """One package version's claimed cells as uv answered: installs, does not (uv's reason), not resolved."""

    package: str
    version: str
    claimed: set[Cell] = field(default_factory=set)
    installs: set[Cell] = field(default_factory=set)
    fails: dict[Cell, str] = field(default_factory=dict)  # claimed PyPI cells that do not install: uv's reason
    unresolved: dict[Cell, str] = field(default_factory=dict)  # claimed cells not asked, and why

    def reasons(self) -> dict[str, set[Cell]]:
        out: dict[str, set[Cell]] = {}
        for cell, why in {**self.unresolved, **self.fails}.items():
            out.setdefault(why, set()).add(cell)
        return dict(sorted(out.items(), key=lambda kv: -len(kv[1])))

    def to_json(self) -> dict[str, Any]:
        return {"claimed": len(self.claimed), "installs": len(self.installs),
                "not_installable": {r: sorted(c.as_list() for c in cells)
                                    for r, cells in self.reasons().items()}}


@dataclass(frozen=True)
class ResolveReport:
    views: tuple[ResolvedView, ...]
    runs: int  # uv processes run
    asked: int  # questions asked (torch release × cell × target), answered from the memo after the first
    seconds: float  # wall time of the whole check
    uv_seconds: float  # summed time of the uv runs
    channels: Mapping[str, str]  # channel index name → "" (reached) or why not

    def view(self, package: str, version: str) -> ResolvedView | None:
        return next((v for v in self.views if canonicalize_name(v.package) == canonicalize_name(package)
                     and v.version == version), None)

    def summary(self) -> str:
        return (f"resolver: {self.runs} uv resolutions ({self.asked} questions, the rest answered by an earlier "
                f"resolution) in {self.seconds:.1f} s ({self.uv_seconds:.1f} s of uv time)")


def refuse_offline(settings: Settings) -> None:
    if settings.offline:
        raise UsageError("--resolve asks PyPI (uv pip compile against https://pypi.org/simple) and --offline "
                         "forbids the network", "leave out --offline, or --resolve (the rules' counts need no "
                         "network)")


def _plan(target: FarmTarget, settings: Settings) -> Plan | str:
    try:
        return make_plan(target.to_target(jobs=1), target.settings(settings))
    except BuilderError as e:
        return f"target cannot plan: {e.one_line()}"


def probe_channel(resolver_of: Any, index: TorchIndex, cell: Cell, release: str) -> str:
    """"" when uv reaches ``index`` (torch ``release`` resolves there), else why not."""
    resolver = resolver_of(index.url)
    answer = resolver.check(None, release, cell.python, parse_platform(cell.platform))
    if answer.installs:
        return ""
    unreachable = index.url.rstrip("/") in answer.reason and any(
        w in answer.reason for w in ("dns error", "Connect", "error sending request", "timed out", "connection"))
    return f"{index.name} ({index.url}) unreachable (uv: {answer.cause})" if unreachable else \
        f"{index.name} ({index.url}): {answer.reason}"


def resolve_farm(targets: list[FarmTarget], settings: Settings, indexes: list[TorchIndex] | None = None, *,
                 workdir: Path | None = None, jobs: int = 4) -> ResolveReport:
    """Every claimed cell of ``targets`` asked of uv: PyPI cells against PyPI, each release behind the cell; the
    cells only PyPI's channels of PyTorch serve, probed once per channel (not resolved where unreachable)."""
    from builder.farm.coverage import USERS_PLATFORMS, users_matrix
    from builder.farm.proven import cell_releases

    refuse_offline(settings)
    start = time.monotonic()
    read = indexes if indexes is not None else known_indexes(settings)
    pypi = [i for i in read if i.name == PYPI_NAME]
    channels = [i for i in read if i.name != PYPI_NAME]
    everything = users_matrix(read)[0]
    pypi_matrix = users_matrix(pypi)[0]
    pypi_releases = cell_releases(pypi, USERS_PLATFORMS)
    served = serving(targets, settings, everything)
    with tempfile.TemporaryDirectory(prefix="builder-resolve-") as tmp:
        root = workdir or Path(tmp)
        resolvers: dict[str, Resolver] = {}

        def resolver_of(url: str) -> Resolver:
            if url not in resolvers:
                resolvers[url] = Resolver(root / f"r{len(resolvers)}", url, jobs=jobs)
            return resolvers[url]

        pypi_url = pypi[0].url if pypi else "https://pypi.org/simple"
        views: dict[tuple[str, str], ResolvedView] = {}
        questions: list[tuple[ResolvedView, Cell, Twin, str]] = []
        channel_cells: dict[tuple[int, Cell], ResolvedView] = {}  # by (id of the view, cell): cells are shared
        for t in targets:
            view = views.setdefault((canonicalize_name(t.package), t.version), ResolvedView(t.package, t.version))
            cells = served[t.id] & everything
            view.claimed |= cells
            plan = _plan(t, settings)
            facts = wheel_facts(t.package, t.version)
            for cell in cells:
                if cell not in pypi_matrix:
                    channel_cells[id(view), cell] = view
                    continue
                if isinstance(plan, str) or facts is None:
                    view.fails.setdefault(cell, plan if isinstance(plan, str) else
                                          f"{t.package} {t.version}: its wheel's requirements are not recorded "
                                          "(farm/facts.py WHEEL_FACTS): no twin to resolve")
                    continue
                twin = twin_of(plan, facts)
                for release in sorted(pypi_releases.get((cell.torch, cell.cuda, cell.platform), ()), key=Version):
                    questions.append((view, cell, twin, release))
        resolver = resolver_of(pypi_url)
        answers = resolver.check_all((twin, release, cell.python, parse_platform(cell.platform))
                                     for _, cell, twin, release in questions)
        by_question = dict(zip(dict.fromkeys((twin, release, cell.python, parse_platform(cell.platform))
                                             for _, cell, twin, release in questions), answers, strict=True))
        # per (view, cell, twin): installs when every release installs; a cell installs when one target's does
        verdicts: dict[tuple[int, Cell, str], str] = {}
        for view, cell, twin, release in questions:
            answer = by_question[twin, release, cell.python, parse_platform(cell.platform)]
            key = (id(view), cell, twin.filename)
            if not answer.installs and not verdicts.get(key):
                verdicts[key] = f"torch {release}: {answer.reason}"
            else:
                verdicts.setdefault(key, "")
        for view, cell, twin, _ in questions:
            why = verdicts[id(view), cell, twin.filename]
            if not why:
                view.installs.add(cell)
                view.fails.pop(cell, None)
            elif cell not in view.installs:
                view.fails.setdefault(cell, why)
        channel_state: dict[str, str] = {}
        per_channel = {i.name: cell_releases([i], USERS_PLATFORMS) for i in channels}
        for (_, cell), view in channel_cells.items():
            if cell in view.installs:
                continue
            where = (cell.torch, cell.cuda, cell.platform)
            offering = [i for i in channels if per_channel[i.name].get(where)]
            for index in offering:
                if index.name not in channel_state:
                    release = sorted(per_channel[index.name][where], key=Version)[-1]
                    channel_state[index.name] = probe_channel(resolver_of, index, cell, release)
            names = [i.name for i in offering]
            why = "; ".join(channel_state[n] for n in names if channel_state[n]) or (
                f"{', '.join(names)} reachable, but this check resolves only against PyPI" if names else
                "no index offers this cell's torch")
            view.unresolved[cell] = f"not resolved: {why}"
        runs = sum(r.runs for r in resolvers.values())
        asked = sum(r.asked for r in resolvers.values())
        uv_seconds = sum(r.seconds for r in resolvers.values())
    return ResolveReport(tuple(views.values()), runs, asked, time.monotonic() - start, uv_seconds, channel_state)


def resolve_of_farm(farm_file: Path | None, settings: Settings, packages: Iterable[str]
                    ) -> tuple[ResolveReport | None, str]:
    """``builder coverage --resolve``'s farm section: the farm file's targets of ``packages`` asked of uv
    (``resolve_farm``), and a note where the farm cannot be read."""
    from builder.farm.expand import expand
    from builder.farm.spec import find_farm_file, load_farm

    refuse_offline(settings)
    try:
        farm = load_farm(find_farm_file(farm_file), settings)
        wanted = [p for p in packages if canonicalize_name(p) in {canonicalize_name(e.name) for e in farm.entries}]
        targets = expand(farm, settings, only=wanted) if wanted else []
    except BuilderError as e:
        return None, f"farm not read: {e.one_line()}"
    return resolve_farm(targets, settings), ""


def disagreements(rules_installable: Iterable[Cell], view: ResolvedView) -> tuple[set[Cell], set[Cell]]:
    """(cells the rules call installable that uv does not install, cells uv installs that the rules do not), both
    among the PyPI cells uv was asked of (the not-resolved channel cells are no finding)."""
    rules = set(rules_installable) & (view.installs | set(view.fails))
    return rules - view.installs, view.installs - rules


def resolve_lines(view: ResolvedView, rules_installable: Iterable[Cell] | None, listed: int = 12) -> list[str]:
    """The resolver's counts for one package version, each reason a claimed cell does not install (uv's words)
    with its cells, and where the rules (farm/proven.py, PyPI only) disagree."""
    from builder.farm.cellstext import cells_list

    asked = view.installs | set(view.fails)
    lines = [f"{view.package} {view.version}, uv resolver (PyPI only): installs {len(view.installs)} of "
             f"{len(asked)} claimed PyPI cells; {len(view.unresolved)} claimed cells of other channels not resolved"]
    reasons = view.reasons()
    for reason, cells in list(reasons.items())[:listed]:
        lines.append(f"  {len(cells)} {reason}: {cells_list(cells)}")
    if len(reasons) > listed:
        lines.append(f"  ... {len(reasons) - listed} more reasons (--json lists every cell)")
    if rules_installable is not None:
        rules = set(rules_installable)
        only_rules, only_uv = disagreements(rules, view)
        lines.append(f"  rules (PyPI only) said installable: {len(rules & asked)} of these {len(asked)}; "
                     + ("uv agrees on every cell" if not (only_rules or only_uv) else
                        f"DISAGREE on {len(only_rules) + len(only_uv)}"))
        if only_rules:
            lines.append(f"  rules say installable, uv does not: {cells_list(only_rules)}")
        if only_uv:
            lines.append(f"  uv installs, rules do not: {cells_list(only_uv)}")
    return lines
