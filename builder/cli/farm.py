"""`builder farm`: the whole farm matrix built here, unchanged targets skipped, the rest in a pool of worker
processes with a live display (a terminal) or start/finish lines (a log), one log per target.

farm/unchanged, farm/schedule, farm/worker, index/store and pipeline/run are imported in the handler, not at the
top: together they add about 46 modules and 100 ms to every `builder` start (``python -X importtime -c 'import
builder.cli.main'``), which `builder --help` and the other commands need not pay (issue 19)."""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.table import Column, Table
from rich.text import Text

from builder.cli import numbers
from builder.cli.common import out
from builder.cli.farmcommon import duration, farm_file_args, load_targets, quiet
from builder.core.errors import UsageError
from builder.core.log import log
from builder.core.settings import default_jobs
from builder.model.records import FARM_STATUSES, FarmOutcome
from builder.stages.compilercache import add_compiler_cache_arg

STATUS_STYLE = {"built": "green", "unchanged": "cyan", "failed": "bold red"}


def register(sub: argparse._SubParsersAction, add_common: Callable[..., None]) -> dict:
    p = sub.add_parser("farm", help="build the whole farm matrix (farm.toml) here; unchanged targets are skipped")
    farm_file_args(p)
    p.add_argument("--parallel", type=numbers.parallel, default=1, help="targets built at once (default 1)")
    p.add_argument("--jobs", type=numbers.jobs, help="MAX_JOBS per target (default: cores and memory / --parallel)")
    p.add_argument("--force", action="store_true", help="rebuild even targets whose inputs are unchanged")
    p.add_argument("--stage", action="store_true", help="publish into wheelhouse/staging (kernel tests on a GPU later)")
    p.add_argument("--no-kernel-tests", action="store_true", help="run only the import tests")
    p.add_argument("--require-kernel-tests", action="store_true", help="treat skipped kernel tests as failure")
    p.add_argument("--log-dir", type=Path, help="one log per target here (default: the cache's farm-logs/<time>)")
    add_compiler_cache_arg(p)
    add_common(p)
    return {"farm": cmd_farm}


def cmd_farm(args: argparse.Namespace) -> int:
    from builder.farm.unchanged import find_unchanged
    from builder.pipeline.run import BuildOptions

    if args.parallel < 1:
        raise UsageError(f"--parallel {args.parallel}: must be at least 1")
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs {args.jobs}: must be at least 1")
    start = time.monotonic()
    settings, farm, targets = load_targets(args)
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
    with quiet():
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
              f"{counts['failed']} failed in {duration(elapsed)} (unchanged check {check_seconds:.1f}s); "
              f"logs and summary.json in {escape(str(log_dir))}")
    return 1 if counts["failed"] else 0


def _longest_first(todo: list, settings: Any, parallel: int) -> list:
    """The targets to build in the order they start: longest first by their past builds (farm/schedule.py)."""
    from builder.farm.schedule import longest_first, past_builds
    from builder.index.store import Wheelhouse

    house = Wheelhouse(Path(settings.wheelhouse))
    order = longest_first(todo, past_builds([house.root, house.staging().root]))
    if len(order) > 1 and parallel > 1:
        log.info("start order, longest first: " + ", ".join(
            f"{e.target.id} ~{duration(e.seconds)} ({e.basis})" for e in order))
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
        line = f"{result.status:9}{target.id}  {duration(result.seconds)}"
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
            f" — {duration(time.monotonic() - self.begun)}",
        )
        running = Table("building", "stage", "time", box=None, padding=(0, 2))
        for t in self.todo:
            if t.id in self.started and t.id not in self.results:
                running.add_row(t.id, _stage(self.logs[t.id]), duration(time.monotonic() - self.started[t.id]))
        queued = sum(1 for t in self.todo if t.id not in self.started and t.id not in self.results)
        return Group(head, running, Text(f"{queued} queued", style="dim"))

    @contextmanager
    def display(self, console: Any) -> Iterator[Live | None]:
        if not self.live_display:
            yield None
            return
        with Live(self.render(), console=console, refresh_per_second=2, transient=True) as live:
            yield live


def _run_pool(todo: list, settings: Any, options: Any, jobs: int, parallel: int, log_dir: Path, already: int,
              total: int) -> dict[str, FarmOutcome]:
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
        table.add_row(t.id, Text(status, style=STATUS_STYLE.get(status, "")), duration(r.seconds),
                      duration(build) if build is not None else "-", Text(detail))
    return table
