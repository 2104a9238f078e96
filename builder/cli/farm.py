"""Farm commands: `builder farm` (build the matrix here), `builder matrix` (list it, or emit it for GitHub
Actions) and `builder watch` (PyPI versions newer than the wheelhouse's)."""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Group
from rich.markup import escape
from rich.table import Column, Table
from rich.text import Text

from builder.cli import numbers
from builder.cli.common import out, settings_from_args
from builder.model.records import FarmOutcome

if TYPE_CHECKING:
    from concurrent.futures import Future

    from rich.live import Live

STATUS_STYLE = {"built": "green", "unchanged": "cyan", "failed": "bold red"}
GITHUB_MATRIX_LIMIT = 256  # jobs per matrix


def register(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> dict:
    from builder.stages.compilercache import add_compiler_cache_arg

    p = sub.add_parser("farm", help="build the whole farm matrix (farm.toml) here; unchanged targets are skipped")
    _farm_file_args(p)
    p.add_argument("--parallel", type=numbers.parallel, default=1, help="targets built at once (default 1)")
    p.add_argument("--jobs", type=numbers.jobs, help="MAX_JOBS per target (default: cores and memory / --parallel)")
    p.add_argument("--force", action="store_true", help="rebuild even targets whose inputs are unchanged")
    p.add_argument("--stage", action="store_true", help="publish into wheelhouse/staging (kernel tests on a GPU later)")
    p.add_argument("--no-kernel-tests", action="store_true", help="run only the import tests")
    p.add_argument("--require-kernel-tests", action="store_true", help="treat skipped kernel tests as failure")
    p.add_argument("--log-dir", type=Path, help="one log per target here (default: the cache's farm-logs/<time>)")
    add_compiler_cache_arg(p)
    add_common(p)

    p = sub.add_parser("matrix", help="list the farm's targets, or emit them as a GitHub Actions matrix")
    _farm_file_args(p)
    p.add_argument("--format", choices=("table", "json", "github"), default="table",
                   help="github: {\"include\": [...]} on one line, for strategy.matrix")
    p.add_argument("--changed", action="store_true",
                   help="only targets that no wheel in the wheelhouse was built from (same inputs)")
    p.add_argument("--tested", action="store_true",
                   help="with --format github: only the targets a configured GPU runner can test ([runners] available)")
    p.add_argument("--details", action="store_true",
                   help="with --format table: every target, what each package serves, and the untested targets "
                   "(default: a one-screen summary)")
    add_common(p)

    p = sub.add_parser("watch", help="upstream versions on PyPI newer than the wheelhouse holds")
    _farm_file_args(p, platform=False)
    p.add_argument("--format", choices=("table", "json", "markdown"), default="table",
                   help="table (default), json, or markdown (for a GitHub step summary)")
    add_common(p)
    return {"farm": cmd_farm, "matrix": cmd_matrix, "watch": cmd_watch}


def _farm_file_args(p: argparse.ArgumentParser, platform: bool = True) -> None:
    p.add_argument("--file", type=Path, help="farm file (default: farm.toml here or in a parent folder)")
    p.add_argument("--only", action="append", default=[], metavar="PACKAGE", help="only this package (repeatable)")
    if platform:
        p.add_argument("--platform", action="append", default=[], metavar="PLATFORM",
                       help="only the targets built for this platform, x86_64 or aarch64 (repeatable; a pure-Python "
                       "wheel, built once for every platform, is built on the first of its platforms)")


def _load(args: argparse.Namespace) -> tuple[Any, Any, list]:
    from builder.farm.expand import expand
    from builder.farm.spec import find_farm_file, load_farm
    from builder.model.platform import parse_platform

    wanted = {parse_platform(text) for text in getattr(args, "platform", None) or ()}  # a typo fails before any work
    settings = settings_from_args(args)
    farm = load_farm(find_farm_file(args.file), settings)
    targets = expand(farm, settings, only=args.only)
    return settings, farm, [t for t in targets if not wanted or t.platform in wanted]


# ---------------------------------------------------------------- builder matrix


def cmd_matrix(args: argparse.Namespace) -> int:
    from builder.farm.coverage import cells_text
    from builder.farm.expand import coverage, github_matrix, serving, summary, tested_matrix
    from builder.farm.unchanged import changed_targets

    settings, farm, targets = _load(args)
    total = len(targets)
    if args.changed:
        with _quiet():
            targets = changed_targets(targets, settings)
    matrix = github_matrix(farm, targets)
    if args.format == "github" and len(targets) > GITHUB_MATRIX_LIMIT:
        from builder.core.errors import UsageError

        raise UsageError(f"{len(targets)} targets: a GitHub Actions matrix holds at most {GITHUB_MATRIX_LIMIT} jobs",
                         "split the farm with --only PACKAGE, or narrow it")
    if args.format == "github":
        _emit(json.dumps(matrix if not args.tested else tested_matrix(matrix), separators=(",", ":")))
        return 0
    untested = [row for row in matrix["include"] if row["untested"]]
    universe, serves = _users_matrix(settings)
    served = serving(targets, settings, universe)
    covered = coverage(targets, served)
    versions = [serves(c) for c in covered]
    totals = {**summary(covered), "untested": len(untested), "matrix_cells": len(universe)}
    if args.format == "json":
        _emit(json.dumps({
            "farm": str(farm.file),
            "targets": [{**row, "abi": str(t.abi), "cells_served": len(served[t.id]),
                         "platforms": [p.name for p in t.platforms]}
                        for t, row in zip(targets, matrix["include"], strict=True)],
            "summary": totals,
            "packages": [{"package": c.package, "version": c.version, "targets": len(c.targets),
                          "compiles": c.compiles, "stable_compiles": c.stable, "cells_served": len(c.cells),
                          **v.to_json(),
                          "cells": [cell.as_list() for cell in sorted(c.cells, key=_cell_order)]}
                         for c, v in zip(covered, versions, strict=True)],
        }, indent=2))
        return 0
    if not args.details:
        from builder.farm.proven import prove_farm

        with _quiet():
            proofs = prove_farm(farm, targets, settings)
        for line in summary_lines(farm.file, targets, served, totals, proofs, changed=args.changed, total=total):
            out.print(escape(line), soft_wrap=True)
        return 0
    table = Table("package", "version", "platform", "cuda", "arch", "python", "torch", "abi", "cells", "toolchain",
                  Column("GPU runner", overflow="fold"),
                  title=f"{farm.file}: {len(targets)} targets" + (f" changed of {total}" if args.changed else ""))
    for target, row in zip(targets, matrix["include"], strict=True):
        abi = f"stable >={target.port.floor_text}" if target.stable and target.port else "per-torch"
        platform = row["platform"] if target.kind.is_cuda else "+".join(p.name for p in target.platforms) + " (any)"
        table.add_row(row["package"], row["version"], platform, row["cuda"],
                      row["arch"] if target.kind.is_cuda else "(any)", row["python"], row["torch"], abi,
                      str(len(served[target.id])), target.toolchain,
                      row["runner"] or f"[yellow]{escape(_short_untested(row['untested']))}[/]")
    out.print(table)
    table = Table("package", "version", "targets", "compiles", "cells served",
                  Column("torch minors × Pythons, per CUDA line and platform", overflow="fold"),
                  title="what they serve: the (torch minor, CUDA line, Python, platform) cells a user can have")
    for c, v in zip(covered, versions, strict=True):
        table.add_row(c.package, c.version, str(len(c.targets)),
                      f"{c.compiles}" + (f" ({c.stable} stable)" if c.stable else ""),
                      f"{len(v.served)} of {v.cells} ({v.percent:.1f} %)", escape(cells_text(c.cells)))
    out.print(table)
    which = "the changed targets" if args.changed else "the farm"
    out.print(f"compiles needed: [bold]{totals['compiles']}[/bold] ({totals['stable_compiles']} stable-ABI, "
              f"{totals['per_torch_compiles']} per-torch), plus {totals['pure_python_builds']} pure-Python builds "
              "(one py3-none-any wheel per version, offered to every torch and CUDA its checks verify)")
    per_platform = ", ".join(f"{k.removeprefix('cells_served_')} {v}" for k, v in totals.items()
                             if k.startswith("cells_served_"))
    out.print(f"cells served by {which}: [bold]{totals['cells_served']}[/bold] (torch minor × CUDA line × Python × "
              f"platform, summed over package versions{': ' + per_platform if per_platform else ''}); per-torch "
              f"wheels for the compiled packages' {totals['compiled_cells_served']} cells would take "
              f"{totals['compiled_cells_served']} compiles")
    who = "the changed targets" if args.changed else "farm targets"
    out.print(f"the users' matrix ([bold]builder coverage[/bold]'s): {len(universe)} cells per package; once built "
              f"and verified, {who} serve:")
    for v in versions:
        out.print("  " + escape(v.line(who)))
    if untested:
        out.print(f"[yellow]untested: {len(untested)} of {len(targets)} targets[/yellow] (built and staged, not "
                  "promoted: no configured GPU runner has their platform and an arch they carry)")
        for row in untested:
            out.print(f"  {escape(row['id'])}: {escape(row['untested'])}")
    return 0


def summary_lines(file: Path, targets: list, served: dict, totals: dict, proofs: list, *, changed: bool = False,
                  total: int = 0) -> list[str]:
    """``builder matrix``'s one screen (under 100 columns): targets, compiles, the cells they serve and the cells
    per compile, then per package version the users' cells claimed / installable / GPU-evidenced (farm/proven.py),
    all channels and PyPI only."""
    from builder.farm.proven import ALL, PYPI

    cuda = [t for t in targets if t.kind.is_cuda]
    stable = [t for t in cuda if t.stable]
    per_torch = [t for t in cuda if not t.stable]
    def cells(group: list) -> int:  # summed over package versions (each package's wheel is its own install)
        by: dict[tuple[str, str], set] = {}
        for t in group:
            by.setdefault((t.package, t.version), set()).update(served[t.id])
        return sum(len(v) for v in by.values())

    compiles = len(cuda)
    per = totals["compiled_cells_served"] / compiles if compiles else 0.0
    lines = [f"{file}: {len(targets)} targets" + (f" changed of {total}" if changed else ""),
             f"compiles {compiles} ({len(stable)} stable-ABI, {len(per_torch)} per-torch) + "
             f"{totals['pure_python_builds']} pure-Python builds",
             f"cells per compile {per:.1f}: {len(stable)} stable compiles serve {cells(stable)} cells, "
             f"{len(per_torch)} per-torch compiles {cells(per_torch)}",
             f"untested targets (no GPU runner for their platform and archs): {totals['untested']} of {len(targets)}",
             "",
             f"{'package':<24}{'version':<13}{'all channels: claimed/inst/GPU':>31}{'PyPI: claimed/inst/GPU':>28}"]
    for proof in proofs:
        every, pypi = proof.view(ALL).counts(), proof.view(PYPI).counts()
        text = lambda c: f"{c['claimed']}/{c['installable']}/{c['evidenced']} of {c['cells']}"  # noqa: E731
        lines.append(f"{proof.package:<24}{proof.version:<13}{text(every):>31}{text(pypi):>28}")
    lines += ["", "claimed: a target's wheel is built for the cell; installable: beside every torch release of it",
              "unchanged (torch, triton, Python, platform); GPU: its kernels run on a GPU of each arch it ships.",
              "Why each cell is left out: builder coverage. Every target and cell: builder matrix --details"]
    return lines


def _users_matrix(settings: Any) -> tuple[Any, Callable[[Any], Any]]:
    """The users' matrix (``builder coverage``'s, farm/coverage.users_matrix) and how one package version of the
    farm (expand.Coverage) counts against it (coverage.farm_serves)."""
    from builder.core.datafiles import default_patches_dir
    from builder.discovery.compat import known_indexes
    from builder.farm.coverage import FarmView, farm_serves, users_matrix
    from builder.model.recipe import find_recipe, load_recipe

    universe, _ = users_matrix(known_indexes(settings))

    def serves(c: Any) -> Any:
        recipes = c.targets[0].recipes
        recipe = load_recipe(find_recipe(c.package, recipes), default_patches_dir(recipes))
        archs = tuple(dict.fromkeys(t.archs for t in c.targets if t.kind.is_cuda))
        return farm_serves(recipe, c.version, universe, FarmView(c.cells & universe, archs))

    return universe, serves


def _short_untested(text: str) -> str:
    """``untested: no runner for aarch64 sm_121,110 (none of ...)`` → without the parenthesis (the table's cell)."""
    return text.split(" (", 1)[0]


def _cell_order(cell: Any) -> tuple:
    from packaging.version import Version

    return Version(cell.cuda), Version(cell.torch), Version(cell.python), cell.platform


# ---------------------------------------------------------------- builder watch


def cmd_watch(args: argparse.Namespace) -> int:
    from builder.farm.expand import check_only
    from builder.farm.spec import find_farm_file, load_farm
    from builder.farm.watch import watch, watch_torch

    settings = settings_from_args(args)
    farm = load_farm(find_farm_file(args.file), settings)
    wanted = check_only(farm, args.only)
    rows = watch(farm, settings, only=wanted)
    if args.format == "json":
        _emit(json.dumps([r.as_dict() for r in rows], indent=2))
        return 0
    headers = ("package", "recipe range", "built", "newer on PyPI (in range)", "above the range", "note")
    cells = [(r.package, r.versions, ", ".join(r.built) or "none", ", ".join(r.newer) or "-", ", ".join(r.beyond) or "-",
              r.note) for r in rows]
    torch_headers = ("torch index", "CUDA", "in farm", "torch on the index", "built", "not built yet", "note", "read from")
    torch_cells = [(r.index, r.cuda, "yes" if r.in_farm else "no", _short(r.available), ", ".join(r.built) or "none",
                    ", ".join(r.unbuilt) or "-", r.note, r.source) for r in watch_torch(farm, settings)]
    if args.format == "markdown":
        for heads, body in ((headers, cells), (torch_headers, torch_cells)):
            print("| " + " | ".join(heads) + " |")
            print("|" + " --- |" * len(heads))
            for row in body:
                print("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
            print()
        return 0
    table = Table(*headers, title=f"{farm.file} vs {settings.wheelhouse}")
    for row in cells:
        table.add_row(*(escape(c) for c in row))
    out.print(table)
    table = Table(*torch_headers, title="torch releases and CUDA toolkits")
    for row in torch_cells:
        table.add_row(*(escape(c) for c in row))
    out.print(table)
    return 0


def _short(versions: tuple[str, ...]) -> str:
    return ", ".join(versions) if len(versions) <= 4 else f"{versions[0]} … {', '.join(versions[-3:])}"


# ---------------------------------------------------------------- builder farm


def cmd_farm(args: argparse.Namespace) -> int:
    from builder.core.errors import UsageError
    from builder.core.log import log
    from builder.core.settings import default_jobs
    from builder.farm.unchanged import find_unchanged
    from builder.model.records import FARM_STATUSES, FarmOutcome
    from builder.pipeline.run import BuildOptions

    if args.parallel < 1:
        raise UsageError(f"--parallel {args.parallel}: must be at least 1")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: must be at least 1")
    start = time.monotonic()
    settings, farm, targets = _load(args)
    jobs = args.jobs or max(1, default_jobs() // args.parallel)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_dir = (args.log_dir or settings.cache("farm-logs") / stamp).resolve()
    log_dir.mkdir(parents=True, exist_ok=True)
    options = BuildOptions(force=args.force, kernel_tests=not args.no_kernel_tests,
                           require_kernel_tests=args.require_kernel_tests, stage=args.stage,
                           compiler_cache=args.compiler_cache)
    log.info(f"farm {farm.file}: {len(targets)} targets, {args.parallel} at a time, MAX_JOBS {jobs}; "
             f"one log per target in {log_dir}")
    results: dict[str, FarmOutcome] = {}
    check_start = time.monotonic()
    with _quiet():
        unchanged = {} if args.force else find_unchanged(targets, settings, stage=args.stage)
    check_seconds = time.monotonic() - check_start
    for target in targets:
        if target.id in unchanged:
            hit = unchanged[target.id]
            (log_dir / f"{target.id}.log").write_text(
                f"unchanged: {hit.wheel.name} was built from the same inputs (cache key {hit.cache_key}); "
                f"decided in {hit.seconds:.2f}s without starting a build\n")
            results[target.id] = FarmOutcome(id=target.id, status="unchanged", wheel=str(hit.wheel),
                                             seconds=hit.seconds)
    log.info(f"checked {len(targets)} targets against the wheelhouse in {check_seconds:.1f}s: "
             f"{len(unchanged)} unchanged, {len(targets) - len(unchanged)} to build")
    todo = [t for t in targets if t.id not in results]
    if todo:
        todo = _longest_first(todo, settings, args.parallel)
        results.update(_run_pool(todo, settings, options, jobs, args.parallel, log_dir, len(targets) - len(todo),
                                 len(targets)))
    elapsed = time.monotonic() - start
    ordered = [results[t.id].with_log(str(log_dir / f"{t.id}.log")) for t in targets]
    counts = {s: sum(1 for r in ordered if r.status == s) for s in FARM_STATUSES}
    (log_dir / "summary.json").write_text(json.dumps(
        {"farm": str(farm.file), "seconds": round(elapsed, 1), "check_seconds": round(check_seconds, 2),
         "counts": counts, "targets": [r.to_json() for r in ordered]}, indent=2))
    out.print(_summary_table(targets, ordered))
    out.print(f"[bold]{len(targets)} targets[/bold]: {counts['built']} built, {counts['unchanged']} unchanged, "
              f"{counts['failed']} failed in {_duration(elapsed)} (unchanged check {check_seconds:.1f}s); "
              f"logs and summary.json in {escape(str(log_dir))}")
    return 1 if counts["failed"] else 0


def _longest_first(todo: list, settings: Any, parallel: int) -> list:
    """The targets to build in the order they start: longest first by their past builds (farm/schedule.py)."""
    from builder.core.log import log
    from builder.farm.schedule import longest_first, past_builds
    from builder.index.store import Wheelhouse

    house = Wheelhouse(Path(settings.wheelhouse))
    order = longest_first(todo, past_builds([house.root, house.staging().root]))
    if len(order) > 1 and parallel > 1:
        log.info("start order, longest first: " + ", ".join(
            f"{e.target.id} ~{_duration(e.seconds)} ({e.basis})" for e in order))
    return [e.target for e in order]


class _PoolProgress:
    """What the pool's targets are doing, for the live display (a terminal) or plain start/finish lines (a log):
    a target has started once its log file exists, finished once its future is done."""

    def __init__(self, todo: list, log_dir: Path, already: int, total: int, live_display: bool) -> None:
        self.todo, self.already, self.total, self.live_display = todo, already, total, live_display
        self.logs = {t.id: log_dir / f"{t.id}.log" for t in todo}
        for path in self.logs.values():
            path.unlink(missing_ok=True)
        self.results: dict[str, FarmOutcome] = {}
        self.started: dict[str, float] = {}
        self.begun = time.monotonic()

    def poll_started(self, console: Any) -> None:
        for t in self.todo:
            if t.id not in self.started and t.id not in self.results and self.logs[t.id].exists():
                self.started[t.id] = time.monotonic()
                if not self.live_display:
                    console.print(f"start    {t.id}", highlight=False)

    def finished(self, target: Any, result: FarmOutcome, console: Any, live: Live | None) -> None:
        self.results[target.id] = result
        line = f"{result.status:9}{target.id}  {_duration(result.seconds)}"
        line += f"  {result.error}" if result.error else ""
        if live is not None:
            live.console.print(Text(line, style=STATUS_STYLE.get(result.status, "")))
        else:
            console.print(line, highlight=False, markup=False)

    def render(self) -> Group:
        counts = {s: sum(1 for r in self.results.values() if r.status == s) for s in STATUS_STYLE}
        head = Text.assemble(
            (f"[{self.already + len(self.results)}/{self.total}] ", "bold"), (f"{counts['built']} built", "green"),
            ", ", (f"{self.already + counts['unchanged']} unchanged", "cyan"), ", ",
            (f"{counts['failed']} failed", "red" if counts["failed"] else ""),
            f" — {_duration(time.monotonic() - self.begun)}",
        )
        running = Table("building", "stage", "time", box=None, padding=(0, 2))
        for t in self.todo:
            if t.id in self.started and t.id not in self.results:
                running.add_row(t.id, _stage(self.logs[t.id]), _duration(time.monotonic() - self.started[t.id]))
        queued = sum(1 for t in self.todo if t.id not in self.started and t.id not in self.results)
        return Group(head, running, Text(f"{queued} queued", style="dim"))

    @contextmanager
    def display(self, console: Any) -> Iterator[Live | None]:
        if not self.live_display:
            yield None
            return
        from rich.live import Live

        with Live(self.render(), console=console, refresh_per_second=2, transient=True) as live:
            yield live


def _run_pool(todo: list, settings: Any, options: Any, jobs: int, parallel: int, log_dir: Path, already: int,
              total: int) -> dict[str, FarmOutcome]:
    # here, not at the top: `builder build` and an unchanged farm do not start a pool (issue 19: no-op startup)
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    from builder.core.log import log
    from builder.farm.worker import run_target

    console = log.console
    progress = _PoolProgress(todo, log_dir, already, total, live_display=console.is_terminal)
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads (the live display)
    pool = ProcessPoolExecutor(max_workers=parallel, mp_context=context, max_tasks_per_child=1)
    futures: dict[Future, Any] = {
        pool.submit(run_target, t, settings, options, jobs, str(progress.logs[t.id])): t for t in todo
    }
    try:
        with progress.display(console) as live:
            pending = set(futures)
            while pending:
                done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
                progress.poll_started(console)
                for future in done:
                    t = futures[future]
                    try:
                        result = future.result()
                    except Exception as e:  # noqa: BLE001 - a worker that died (killed, out of memory)
                        result = FarmOutcome(id=t.id, status="failed", error=f"worker died: {type(e).__name__}: {e}")
                    progress.finished(t, result, console, live)
                if live is not None:
                    live.update(progress.render())
    except KeyboardInterrupt:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)
    return progress.results


def _stage(log_file: Path) -> str:
    """The last pipeline stage (``==> build``) in a target's log."""
    try:
        with log_file.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            tail = f.read().decode(errors="replace")
    except OSError:
        return "starting"
    stage = "starting"
    for line in tail.splitlines():
        if "==> " in line:
            stage = line.split("==> ", 1)[1].strip()
    return stage


def _summary_table(targets: list, results: list[Any]) -> Table:
    table = Table(Column("target", overflow="fold"), "status", "time", "compile",
                  Column("wheel / error", overflow="fold"), title="farm summary")
    for t, r in zip(targets, results, strict=True):
        status = r.status
        detail = Path(r.wheel).name if r.wheel and status != "failed" else (r.error or "")
        build = r.timings.get("build")
        table.add_row(t.id, Text(status, style=STATUS_STYLE.get(status, "")), _duration(r.seconds),
                      _duration(build) if build is not None else "-", Text(detail))
    return table


def _emit(text: str) -> None:
    """Machine-readable output on stdout; a reader that stops early (``| head``) is not an error."""
    import sys

    try:
        print(text, flush=True)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes}m{secs:02d}s"


@contextmanager
def _quiet() -> Iterator[None]:
    from builder.core.log import log

    before = log.quiet
    log.quiet = True
    try:
        yield
    finally:
        log.quiet = before
