"""`builder coverage --resolve` over the farm: each claimed cell and each torch release behind it asked of uv
through the targets' metadata twins (farm/resolvecheck.py says how a twin is made and asked), PyTorch's channels
probed once per index, the answers against farm/proven.py's rules."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name
from packaging.version import Version

from builder.core.errors import BuilderError, SourceError, UsageError
from builder.core.settings import Settings
from builder.discovery.compat import TorchIndex, known_indexes
from builder.farm.cellstext import cells_list
from builder.farm.coverage import USERS_PLATFORMS, users_matrix
from builder.farm.expand import expand
from builder.farm.facts import wheel_facts
from builder.farm.proven import Releases, cell_releases
from builder.farm.resolvecheck import PYPI_NAME, Resolution, Resolver, Twin, twin_of
from builder.farm.served import Cell, serving
from builder.farm.spec import FarmTarget, find_farm_file, load_farm
from builder.model.platform import parse_platform
from builder.stages.plan import Plan, make_plan

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


def unreachable(answer: Resolution, url: str) -> bool:
    """uv could not reach ``url`` (an outage: no answer about the cell either way)."""
    return not answer.installs and url.rstrip("/") in answer.reason and any(
        w in answer.reason for w in ("dns error", "Connect", "error sending request", "timed out", "connection"))


def probe_channel(resolver_of: Any, index: TorchIndex, cell: Cell, release: str) -> str:
    """"" when uv reaches ``index`` (torch ``release`` resolves there), else why not."""
    resolver = resolver_of(index.url)
    answer = resolver.check(None, release, cell.python, parse_platform(cell.platform))
    if answer.installs:
        return ""
    return f"{index.name} ({index.url}) unreachable (uv: {answer.cause})" if unreachable(answer, index.url) else \
        f"{index.name} ({index.url}): {answer.reason}"


def check_pypi_reachable(resolver: Resolver, url: str, release: str, cell: Cell) -> None:
    """Ask uv once (torch ``release`` alone) before the many questions: PyPI unreachable is an outage, a
    SourceError, never "installs 0 of N" with every cell a disagreement."""
    answer = resolver.check(None, release, cell.python, parse_platform(cell.platform))
    if unreachable(answer, url):
        raise SourceError(f"coverage --resolve: {url} unreachable for uv ({answer.cause}); nothing was resolved",
                          "check this machine's network (and HTTPS_PROXY), then run again; without --resolve the "
                          "rules' counts need no network")


Question = tuple[ResolvedView, Cell, Twin, str]  # (view, PyPI cell, the target's twin, torch release behind the cell)


class _Resolvers:
    """One Resolver per index URL, made on first use under ``root`` (each keeps its own uv cache and memo)."""

    def __init__(self, root: Path, jobs: int) -> None:
        self.root, self.jobs = root, jobs
        self.by_url: dict[str, Resolver] = {}

    def __call__(self, url: str) -> Resolver:
        if url not in self.by_url:
            self.by_url[url] = Resolver(self.root / f"r{len(self.by_url)}", url, jobs=self.jobs)
        return self.by_url[url]


def _questions(targets: list[FarmTarget], settings: Settings, served: Mapping[str, frozenset[Cell]],
               everything: frozenset[Cell], pypi_matrix: frozenset[Cell], pypi_releases: Releases
               ) -> tuple[dict[tuple[str, str], ResolvedView], list[Question], dict[tuple[int, Cell], ResolvedView]]:
    """Each target's claimed cells sorted into: PyPI questions (one per torch release behind the cell), cells only
    a channel serves (keyed by (id of the view, cell): views are shared by targets of one version), and cells that
    fail before uv is asked (no plan, or no recorded wheel facts to make a twin from)."""
    views: dict[tuple[str, str], ResolvedView] = {}
    questions: list[Question] = []
    channel_cells: dict[tuple[int, Cell], ResolvedView] = {}
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
    return views, questions, channel_cells


def _ask_pypi(resolver: Resolver, pypi_url: str, questions: list[Question]) -> dict[tuple[Any, ...], Resolution]:
    """uv's answer to each distinct question (twin, release, python, platform), after one reachability check."""
    if questions:
        _, first_cell, _, first_release = questions[0]
        check_pypi_reachable(resolver, pypi_url, first_release, first_cell)
    answers = resolver.check_all((twin, release, cell.python, parse_platform(cell.platform))
                                 for _, cell, twin, release in questions)
    return dict(zip(dict.fromkeys((twin, release, cell.python, parse_platform(cell.platform))
                                  for _, cell, twin, release in questions), answers, strict=True))


def _record_pypi_answers(questions: list[Question], by_question: Mapping[tuple[Any, ...], Resolution],
                         pypi_url: str) -> None:
    """Per (view, cell, twin): installs when every release installs; a cell installs when one target's does.
    PyPI unreachable mid-run leaves the cell not resolved, not failed."""
    verdicts: dict[tuple[int, Cell, str], str] = {}
    outage: dict[tuple[int, Cell], str] = {}
    for view, cell, twin, release in questions:
        answer = by_question[twin, release, cell.python, parse_platform(cell.platform)]
        key = (id(view), cell, twin.filename)
        if unreachable(answer, pypi_url):
            outage[id(view), cell] = f"not resolved: {PYPI_NAME} ({pypi_url}) unreachable (uv: {answer.cause})"
        elif not answer.installs and not verdicts.get(key):
            verdicts[key] = f"torch {release}: {answer.reason}"
        else:
            verdicts.setdefault(key, "")
    for view, cell, twin, _ in questions:
        if (id(view), cell) in outage:
            view.unresolved[cell] = outage[id(view), cell]
            continue
        why = verdicts.get((id(view), cell, twin.filename), "")
        if not why:
            view.installs.add(cell)
            view.fails.pop(cell, None)
        elif cell not in view.installs:
            view.fails.setdefault(cell, why)


def _note_channel_cells(channel_cells: Mapping[tuple[int, Cell], ResolvedView], channels: list[TorchIndex],
                        resolver_of: _Resolvers) -> dict[str, str]:
    """Mark each channel-only cell not resolved, with why: each offering channel probed once (reached or not);
    returns channel name → "" (reached) or why not."""
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
    return channel_state


def resolve_farm(targets: list[FarmTarget], settings: Settings, indexes: list[TorchIndex] | None = None, *,
                 workdir: Path | None = None, jobs: int = 4) -> ResolveReport:
    """Every claimed cell of ``targets`` asked of uv: PyPI cells against PyPI, each release behind the cell; the
    cells only PyPI's channels of PyTorch serve, probed once per channel (not resolved where unreachable)."""

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
        resolver_of = _Resolvers(workdir or Path(tmp), jobs)
        pypi_url = pypi[0].url if pypi else "https://pypi.org/simple"
        views, questions, channel_cells = _questions(targets, settings, served, everything, pypi_matrix,
                                                     pypi_releases)
        resolver = resolver_of(pypi_url)
        _record_pypi_answers(questions, _ask_pypi(resolver, pypi_url, questions), pypi_url)
        channel_state = _note_channel_cells(channel_cells, channels, resolver_of)
        resolvers = resolver_of.by_url.values()
        runs = sum(r.runs for r in resolvers)
        asked = sum(r.asked for r in resolvers)
        uv_seconds = sum(r.seconds for r in resolvers)
    return ResolveReport(tuple(views.values()), runs, asked, time.monotonic() - start, uv_seconds, channel_state)


def resolve_of_farm(farm_file: Path | None, settings: Settings, packages: Iterable[str]
                    ) -> tuple[ResolveReport | None, str]:
    """``builder coverage --resolve``'s farm section: the farm file's targets of ``packages`` asked of uv
    (``resolve_farm``), and a note where the farm cannot be read."""

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

    asked = view.installs | set(view.fails)
    lines = [f"{view.package} {view.version}, uv resolver (PyPI only): installs {len(view.installs)} of "
             f"{len(asked)} claimed PyPI cells; {len(view.unresolved)} claimed cells not resolved (other channels, or "
             "an index uv could not reach)"]
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
