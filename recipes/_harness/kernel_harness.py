"""The shared kernel-test harness: what every recipe's kernel_tests.py imports, so a suite holds only its cases
and its pure-torch references.

The contract with the builder (docs/RECIPES.md, "Kernel tests"): the suite is run as

    python kernel_tests.py --out RESULT.json [--quick] [--no-bench] [--seed N] [--jobs N] [--only REGEX]

in a clean venv holding the wheel, torch and the recipe's [test] requires, with CUDA_VISIBLE_DEVICES set to one
GPU that can run the wheel; it writes the JSON report to --out (also when it crashes) and exits 0 passed,
1 failed, 3 skipped. The builder reads status, reason, counts, speed and gpu from the report.

A suite subclasses ``Suite`` and ends with ``sys.exit(MySuite().main())``. The harness does the rest: argument
parsing, the seed, the "no GPU" / "no kernel image for this GPU" skips, the cases (in worker processes when
``group_key`` groups them, with ``--jobs``), refusals (an error the package raises on purpose for a GPU it
knows to compute wrong on: that case is skipped with the package's own words), known upstream defects (a case
declared to fail because of a reported upstream bug: its failure is counted as ``known_defect``, never as
passed, and its pass fails it), a broken CUDA context (the rest is skipped, not blamed on later cases),
CUDA-event timing of the speed rows, and the report.

Only the standard library and torch are imported: the file travels with the suite into the clean test venv
(the suite finds it at ../_harness/ beside itself; the builder also puts this folder on PYTHONPATH).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import importlib.metadata
import importlib.util
import itertools
import json
import math
import multiprocessing
import os
import random
import re
import statistics
import sys
import time
import traceback
import types
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from re import Pattern
from typing import (
    Any,
)

import torch

EXIT_CODES = {"passed": 0, "failed": 1, "skipped": 3}
KNOWN_DEFECT = "known_defect"  # a case's status (and counts key) when it failed as a declared upstream defect
KNOWN_DEFECT_PREFIX = "known upstream defect: "
NO_KERNEL_IMAGE = "no kernel image is available for execution on the device"
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


# --------------------------------------------------------------------------- checks


@dataclass
class Check:
    """One tensor compared with its reference: ``close`` (allclose rule), ``ratio`` (RMS error ratio) or
    ``equal`` (bitwise, e.g. two runs of the kernel or an in-place state)."""

    tensor: str
    ok: bool
    max_abs_err: float | None
    atol: float = 0.0
    rtol: float = 0.0
    ratio: float | None = None
    tol: float | None = None  # the ratio bound (ratio checks only)
    note: str = ""
    worst: float | None = None  # largest error / allowed error over the elements (< 1 passes); None: n/a

    def describe(self) -> str:
        flag = "ok" if self.ok else "FAIL"
        if self.tol is not None:
            value = (f"ratio={self.ratio:.2e} (tol {self.tol:g})" if self.ratio is not None else
                     "err=n/a" if self.max_abs_err is None else f"maxdiff={self.max_abs_err:.3g}")
        else:
            err = "n/a" if self.max_abs_err is None else f"{self.max_abs_err:.3g}"
            value = f"err={err} (rtol={self.rtol:g}, atol={self.atol:g})"
        return f"{self.tensor} {flag} {value}{' ' + self.note if self.note else ''}"


@dataclass(frozen=True)
class KnownDefect:
    """A defect upstream has and has been told about: the cases whose name matches ``cases`` (a regex) are
    expected to fail, for ``reason``, reported at ``url`` (the upstream issue)."""

    cases: str
    reason: str
    url: str

    def describe(self) -> str:
        return f"{self.reason} ({self.url})"


@dataclass
class CaseResult:
    """One row of the report's "cases" list. status: passed / failed / skipped / known_defect."""

    name: str
    status: str
    max_abs_err: float | None = None
    atol: float = 0.0
    rtol: float = 0.0
    max_ratio: float | None = None
    worst: float | None = None  # the largest error / allowed error of the case's checks (< 1 passes)
    detail: str = ""
    checks: list[dict[str, Any]] = field(default_factory=list)


def expect_defect(results: list[CaseResult], reason: str | None) -> list[CaseResult]:
    """The results of a case declared a known upstream defect (``reason``; None: not declared), strictly: where
    the case failed, each failed result becomes known_defect ("known upstream defect: <reason>; <what failed>")
    and its passed ones (e.g. the forward of a case whose backward has the defect) stay passed; where nothing
    failed, its passed results fail (the declaration is stale: upstream fixed it, or the case no longer reaches
    the defect). Skipped results stay skipped."""
    if not reason:
        return results
    reason = " ".join(reason.split()).replace("; ", ", ")  # the report's reason is read back up to the first "; "
    failed = any(r.status == "failed" for r in results)
    for result in results:
        if failed and result.status == "failed":
            result.status, result.detail = KNOWN_DEFECT, f"{KNOWN_DEFECT_PREFIX}{reason}; {result.detail}"
        elif not failed and result.status == "passed":
            result.status = "failed"
            result.detail = (f"passed, but is declared a known upstream defect ({reason}): if upstream fixed it, "
                             f"remove the declaration; {result.detail}")
    return results


def finite_float(value: float) -> float | None:
    """JSON-safe float: None for NaN/Inf."""
    return value if math.isfinite(value) else None


def short_error(exc: BaseException) -> str:
    """One-line exception text for the report."""
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:600]


def _shape_problem(label: str, got: torch.Tensor | None, ref: torch.Tensor | None) -> str | None:
    if got is None or ref is None:
        return f"{'kernel' if got is None else 'reference'} returned no tensor"
    if tuple(got.shape) != tuple(ref.shape):
        return f"shape {tuple(got.shape)} != {tuple(ref.shape)}"
    nonfinite = int((~torch.isfinite(got.detach().float())).sum().item())
    if nonfinite:
        return f"{nonfinite}/{got.numel()} non-finite"
    return None


def check_close(label: str, got: torch.Tensor, ref: torch.Tensor, rtol: float, atol: float) -> Check:
    """Every element finite and |got - ref| <= atol + rtol * |ref| (torch.allclose's rule, upstream tests' too)."""
    problem = _shape_problem(label, got, ref)
    if problem:
        return Check(label, False, None, atol, rtol, note=problem)
    if got.numel() == 0:
        return Check(label, True, 0.0, atol, rtol)
    got32, ref32 = got.detach().float(), ref.detach().float()
    err = (got32 - ref32).abs()
    bound = atol + rtol * ref32.abs()
    n_bad = int((err > bound).sum().item())
    worst = finite_float((err / bound).max().item()) if atol > 0 or rtol > 0 else None
    return Check(label, n_bad == 0, finite_float(err.max().item()), atol, rtol,
                 note=f"{n_bad}/{got.numel()} outside tolerance" if n_bad else "", worst=worst)


def err_ratio(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(RMS(got - ref) / RMS(ref), max |got - ref|): fla's get_err_ratio and get_abs_err."""
    diff = got.detach().double() - ref.detach().double()
    rms_ref = ref.detach().double().square().mean().sqrt().item()
    return diff.square().mean().sqrt().item() / (rms_ref + 1e-8), diff.abs().max().item()


def check_ratio(label: str, got: torch.Tensor | None, ref: torch.Tensor | None, tol: float,
                abs_pass: float = 1e-6) -> Check:
    """Finite, same shape, and ratio < tol (or max abs err <= abs_pass)."""
    problem = _shape_problem(label, got, ref)
    if problem:
        return Check(label, False, None, tol=tol, note=problem)
    assert got is not None and ref is not None
    if got.numel() == 0:
        return Check(label, True, 0.0, ratio=0.0, tol=tol)
    ratio, abs_err = err_ratio(got, ref)
    ok = abs_err <= abs_pass or ratio < tol
    worst = min(ratio / tol, abs_err / abs_pass) if abs_pass > 0 else ratio / tol
    return Check(label, ok, finite_float(abs_err), ratio=finite_float(ratio), tol=tol,
                 note="" if ok else f"ratio {ratio:.5f} >= {tol}", worst=finite_float(worst))


def check_equal(label: str, got: torch.Tensor | None, ref: torch.Tensor | None, what: str = "elements differ"
                ) -> Check:
    """Bitwise equality: dtype, shape and every value (NaN never equals). Two None are equal."""
    if got is None or ref is None:
        ok = got is None and ref is None
        return Check(label, ok, None, note="" if ok else "returned by one side only")
    if got.dtype != ref.dtype or tuple(got.shape) != tuple(ref.shape):
        return Check(label, False, None, note=f"{got.dtype}{tuple(got.shape)} != {ref.dtype}{tuple(ref.shape)}")
    same = torch.equal(got, ref)
    diff = (got.detach().float() - ref.detach().float()).abs()
    err = finite_float(diff.max().item()) if diff.numel() else 0.0
    nonfinite = int((~torch.isfinite(got.detach().float())).sum().item())
    note = "" if same else f"{int((got != ref).sum().item())}/{got.numel()} {what}" + (
        f", {nonfinite} non-finite" if nonfinite else "")
    return Check(label, same, err, note=note)


def result_from_checks(name: str, checks: Sequence[Check]) -> CaseResult:
    """Fold checks into a case: the headline error and tolerances are the first failing check's (else the first
    check's), max_ratio the largest ratio, worst the largest error/bound of any close or ratio check."""
    failing = [c for c in checks if not c.ok]
    head = failing[0] if failing else checks[0]
    ratios = [c.ratio for c in checks if c.ratio is not None]
    worsts = [c.worst for c in checks if c.worst is not None]
    return CaseResult(name=name, status="failed" if failing else "passed", max_abs_err=head.max_abs_err,
                      atol=head.atol, rtol=head.rtol, max_ratio=max(ratios) if ratios else None,
                      worst=max(worsts) if worsts else None, detail="; ".join(c.describe() for c in checks),
                      checks=[asdict(c) for c in checks])


# --------------------------------------------------------------------------- case design (pairwise)


def covering_rows(levels: dict[str, list[Any]], fixed: Sequence[str]) -> list[dict[str, Any]]:
    """Case design: the full product over the `fixed` factors; every other factor is filled greedily (AETG
    style): first to cover pairs of factor levels not seen yet, then to keep the counts of all pairs even, so
    that free factors do not move in lockstep. ``levels`` maps each factor to its levels; rows are dicts."""
    names = list(levels)
    free = [n for n in names if n not in fixed]
    counts: Counter = Counter()
    rows: list[dict[str, Any]] = []
    for combo in itertools.product(*(levels[n] for n in fixed)):
        row = dict(zip(fixed, combo, strict=True))
        for k, name in enumerate(free):
            row[name] = _best_level(names, name, levels[name], row, counts, len(rows) + k)
        counts.update(pairs_of(names, row))
        rows.append({n: row[n] for n in names})
    return rows


def _best_level(names: list[str], name: str, choices: list[Any], row: dict[str, Any], counts: Counter,
                turn: int) -> Any:
    """The level of `name` whose pairs with the row so far are most often unseen, then
    least often seen; remaining ties go round-robin by `turn`."""
    def score(i: int) -> tuple[int, int, int]:
        seen = [counts[_pair(names, name, choices[i], other, value)] for other, value in row.items()]
        return sum(c == 0 for c in seen), -sum(seen), -((i - turn) % len(choices))

    return choices[max(range(len(choices)), key=score)]


def _pair(names: list[str], a: str, va: Any, b: str, vb: Any) -> tuple[str, Any, str, Any]:
    """A pair of factor levels in canonical (factor order) form."""
    return (a, va, b, vb) if names.index(a) < names.index(b) else (b, vb, a, va)


def pairs_of(names: list[str], row: dict[str, Any]) -> set:
    """All level pairs a row covers."""
    return {_pair(names, a, row[a], b, row[b]) for a, b in itertools.combinations(names, 2)}


def all_pairs(levels: dict[str, list[Any]]) -> set:
    """Every pair of levels of two different factors."""
    names = list(levels)
    return {(a, va, b, vb) for a, b in itertools.combinations(names, 2) for va in levels[a] for vb in levels[b]}


# --------------------------------------------------------------------------- boundaries from a kernel's structure


@dataclass(frozen=True)
class Tiling:
    """How one kernel splits one axis of its work, as upstream's source states it: ``chunk`` elements per block
    (or per loop step) along ``axis``, ``vec`` of them per thread load, and where that is written (``source``:
    file and the line that says it), so a reviewer can check the fact and a new release can be re-read."""

    kernel: str
    axis: str
    chunk: int
    vec: int = 1
    source: str = ""

    def boundaries(self, chunks: int = 2, tails: Sequence[int] = ()) -> list[int]:
        return boundary_values(self.chunk, self.vec, chunks=chunks, tails=tails)


def boundary_values(chunk: int, vec: int = 1, *, chunks: int = 2, tails: Sequence[int] = ()) -> list[int]:
    """Every length at which a kernel that covers ``chunk`` elements per step and loads ``vec`` at a time changes
    behaviour: k * chunk + {0, 1, vec - 1, vec, vec + 1, chunk - 1} for k = 0 .. ``chunks``, plus k * chunk + t for
    each extra tail ``t`` (e.g. 1 .. width - 1, tails shorter than a filter). Positive, sorted, unique."""
    if chunk < 1 or vec < 1:
        raise ValueError(f"chunk and vec must be positive, not {chunk} and {vec}")
    offsets = {0, 1, vec - 1, vec, vec + 1, chunk - 1, *tails}
    return sorted({k * chunk + o for k in range(chunks + 1) for o in offsets if k * chunk + o > 0})


def seeded_sample(items: Sequence[Any], n: int, *, keep: Callable[[Any], bool] | None = None) -> list[Any]:
    """``--quick``'s subset of boundary cases: every item ``keep`` selects, plus a sample of the rest up to ``n`` in
    all, drawn with the run's seed (torch.initial_seed(), recorded in the report), in the items' order."""
    kept = [i for i, item in enumerate(items) if keep is not None and keep(item)]
    rest = [i for i in range(len(items)) if i not in set(kept)]
    picked = random.Random(torch.initial_seed()).sample(rest, max(0, min(len(rest), n - len(kept))))
    return [items[i] for i in sorted([*kept, *picked])]


# --------------------------------------------------------------------------- CUDA helpers


def poison_allocator(nbytes: int, device: torch.device) -> None:
    """Best effort: leave a NaN-filled block in the CUDA caching allocator, so buffers the kernel allocates next
    (outputs, gradients) start as NaN, not zeros or stale results: memory a kernel never writes then fails."""
    if device.type != "cuda" or nbytes <= 0:
        return
    block = torch.full((min(nbytes, 2 << 30) // 4 + 1,), float("nan"), dtype=torch.float32, device=device)
    del block


def cuda_context_ok(device: torch.device) -> str | None:
    """None if the device still works; else the sticky error (e.g. an illegal memory access)."""
    if device.type != "cuda":
        return None
    try:
        torch.cuda.synchronize(device)
        return None
    except Exception as exc:  # noqa: BLE001  (any sticky CUDA error)
        return short_error(exc)


def use_exact_fp32() -> None:
    """References must be real fp32, not TF32."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def median_cuda_ms(fn: Callable[[], Any], warmup: int = 10, iters: int = 50) -> float:
    """Median time of fn on the current stream, by CUDA events, after warm-up."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in events)


def nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def speed_row(name: str, kernel: Callable[[], Any], reference: Callable[[], Any], moved_bytes: int, *,
              grad: bool = False, warmup: int = 10, iters: int = 50, ref_warmup: int | None = None,
              ref_iters: int | None = None) -> dict[str, Any]:
    """Time kernel and reference; GB/s counts the kernel's minimum bytes read + written."""
    with torch.set_grad_enabled(grad):
        kernel_ms = median_cuda_ms(kernel, warmup, iters)
        reference_ms = median_cuda_ms(reference, warmup if ref_warmup is None else ref_warmup,
                                      iters if ref_iters is None else ref_iters)
    return {"name": name, "kernel_ms": kernel_ms, "reference_ms": reference_ms, "speedup": reference_ms / kernel_ms,
            "kernel_gbps": moved_bytes / (kernel_ms * 1e-3) / 1e9, "bytes": moved_bytes}


def installed_version(*names: str) -> str | None:
    """Version of the first installed distribution among names, or None."""
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def parse_version(version: str | None) -> tuple[int, int, int] | None:
    """'1.5.3.post1' or '1.7.0+cu130torch2.11' -> (1, 5, 3); None if unparseable."""
    match = re.match(r"^(\d+)\.(\d+)\.(\d+)", version or "")
    return tuple(int(g) for g in match.groups()) if match else None  # type: ignore[return-value]


# --------------------------------------------------------------------------- the suite


class Suite:
    """Subclass and override; ``main()`` runs it. Cases are any objects with a ``name``."""

    package: str = ""  # the distribution under test, as on PyPI
    description: str = ""  # first line of --help
    quick_help: str = "fewer cases"
    # Errors the package raises on purpose for a GPU it knows to compute wrong results on (not defects of the
    # wheel): a case that raises one is reported as skipped with the package's own words.
    refusals: tuple[Pattern[str], ...] = ()
    # Cases expected to fail because of a reported upstream defect (see known_defect): a failure is reported as
    # "known upstream defect: <reason>" and counted apart, never as passed; a pass fails the case (strict).
    known_defects: tuple[KnownDefect, ...] = ()
    env_vars: tuple[str, ...] = ()  # environment variables recorded in the report

    # --- what a suite provides
    def load(self) -> Any:
        """Import the package and return its API (any object); an exception fails the run."""
        raise NotImplementedError

    def probe(self, api: Any, device: torch.device) -> None:
        """Run one tiny kernel call; an exception whose text says "no kernel image" skips the whole run."""

    def cases(self, api: Any, quick: bool) -> list[Any]:
        raise NotImplementedError

    def run_case(self, api: Any, case: Any, device: torch.device) -> CaseResult:
        raise NotImplementedError

    def skip_reason(self, api: Any, case: Any) -> str | None:
        """A reason to skip one case (a feature this version lacks), else None."""
        return None

    def known_defect(self, api: Any, case: Any) -> str | None:
        """Why this case is expected to fail because of an upstream defect (what goes wrong and the upstream
        issue's URL), else None. The default matches the case's name against ``known_defects``; override it
        for a defect only some versions have (``self.version()``)."""
        for defect in self.known_defects:
            if re.search(defect.cases, case.name):
                return defect.describe()
        return None

    def group_key(self, case: Any) -> Hashable | None:
        """Cases with the same key run in one worker process (e.g. the same Triton autotune keys); None (the
        default for every case) runs all cases in this process, one after another."""
        return None

    def benchmarks(self, api: Any, device: torch.device, quick: bool) -> list[tuple[str, Callable[[], dict]]]:
        """(name, function returning a speed_row) pairs."""
        return []

    def preliminary_cases(self, api: Any, device: torch.device) -> list[CaseResult]:
        """Checks run once in this process before the cases (e.g. a device flag the package derives)."""
        return []

    def report_extra(self, api: Any) -> dict[str, Any]:
        """Facts for the report (detected features, device flags, ...)."""
        return {}

    def setup_process(self) -> None:
        """Called in the main process and in every worker before any case runs."""
        use_exact_fp32()

    def version(self) -> str | None:
        return installed_version(self.package, self.package.replace("-", "_"))

    # --- the machinery
    def run_one(self, api: Any, case: Any, device: torch.device) -> list[CaseResult]:
        """A missing feature → skipped; a refusal → skipped with its words; any other exception → failed; then a
        declared known upstream defect turns a failure into known_defect and a pass into a failure.
        ``run_case`` may return one result or several (e.g. a checked forward and a refused backward)."""
        reason = self.skip_reason(api, case)
        if reason:
            return [CaseResult(case.name, "skipped", detail=reason)]
        return expect_defect(self._run_checked(api, case, device), self.known_defect(api, case))

    def _run_checked(self, api: Any, case: Any, device: torch.device) -> list[CaseResult]:
        try:
            result = self.run_case(api, case, device)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            return result if isinstance(result, list) else [result]
        except Exception as exc:  # noqa: BLE001  (a kernel error is a test failure)
            text = short_error(exc)
            if any(p.search(text) for p in self.refusals):
                return [CaseResult(case.name, "skipped", detail=f"refused by the package: {text}")]
            return [CaseResult(case.name, "failed", detail=f"raised {text}")]
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()

    def run_cases(self, api: Any, cases: Sequence[Any], device: torch.device) -> list[CaseResult]:
        """All cases in order, each timed (" [1.2s]" ends its detail) and printed as it ends; once the CUDA
        context breaks, the rest are skipped with the error."""
        results: list[CaseResult] = []
        broken: str | None = None
        for case in cases:
            if broken:
                results.append(CaseResult(case.name, "skipped", detail=f"not run: CUDA context unusable ({broken})"))
                continue
            start = time.monotonic()
            case_results = self.run_one(api, case, device)
            seconds = time.monotonic() - start
            for result in case_results:
                result.detail += f" [{seconds:.1f}s]"
                print(f"{result.status:7} {result.name} ({seconds:.1f}s)", flush=True)
            results += case_results
            if any(r.status in ("failed", KNOWN_DEFECT) and "raised " in r.detail for r in case_results):
                broken = cuda_context_ok(device)
        return results

    def _run_group(self, task: tuple[int, list[Any], int, str]) -> list[dict[str, Any]]:
        """Worker: one group of cases on its own CUDA context, seeded with seed + group index."""
        index, cases, seed, device_name = task
        device = torch.device(device_name)
        torch.manual_seed(seed + index)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        self.setup_process()
        return [asdict(r) for r in self.run_cases(self.load(), cases, device)]

    def group_cases(self, cases: Sequence[Any]) -> list[list[Any]]:
        """Cases by group_key, groups and cases in first-seen order."""
        groups: dict[Hashable, list[Any]] = {}
        for case in cases:
            groups.setdefault(self.group_key(case), []).append(case)
        return list(groups.values())

    def default_jobs(self, n_groups: int, device: torch.device) -> int:
        """Worker processes: each compiles on one CPU core and holds a CUDA context plus its tensors (about
        8 GiB at most), so min(groups, cores / 2, GPU GiB / 8, 8); 1 when the suite does not group."""
        if n_groups <= 1:
            return 1
        gib = torch.cuda.get_device_properties(device).total_memory / 2**30 if device.type == "cuda" else 8
        return max(1, min(n_groups, (os.cpu_count() or 2) // 2, int(gib // 8), 8))

    def run_groups(self, report: dict[str, Any], out: Path | None, cases: Sequence[Any], jobs: int | None,
                   api: Any, device: torch.device) -> list[dict[str, Any]]:
        """Ungrouped suites run here; grouped ones `jobs` groups at a time in spawned processes. After each
        group the report so far is written to `out`, so a run cut short still leaves its results."""
        if all(self.group_key(c) is None for c in cases):
            return [asdict(r) for r in self.run_cases(api, cases, device)]
        groups = self.group_cases(cases)
        jobs = jobs or self.default_jobs(len(groups), device)
        report["jobs"] = jobs
        print(f"{len(cases)} cases in {len(groups)} groups, {jobs} worker process(es)", flush=True)
        results: dict[int, list[dict[str, Any]]] = {}
        tasks = [(i, group, report["seed"], str(device)) for i, group in enumerate(groups)]

        def done(index: int, rows: list[dict[str, Any]]) -> None:
            results[index] = rows
            print(f"group {len(results)}/{len(groups)} done ({len(rows)} cases)", flush=True)
            if out is not None:
                write_report(dict(report, cases=report["cases"] + [r for i in sorted(results) for r in results[i]],
                                  status="incomplete", reason=f"{len(results)} of {len(groups)} case groups finished"),
                             out)

        if jobs <= 1:
            for task in tasks:
                done(task[0], self._run_group(task))
        else:
            ctx = multiprocessing.get_context("spawn")  # CUDA cannot be forked
            with concurrent.futures.ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
                futures = {pool.submit(self._run_group, task): task for task in tasks}
                for future in concurrent.futures.as_completed(futures):
                    index, group = futures[future][0], futures[future][1]
                    try:
                        done(index, future.result())
                    except Exception as exc:  # noqa: BLE001  (a crashed worker fails its cases, not the run)
                        done(index, [asdict(CaseResult(c.name, "failed", detail=f"worker process died: "
                                                       f"{short_error(exc)}")) for c in group])
        return [row for i in sorted(results) for row in results[i]]

    def run_benchmarks(self, api: Any, device: torch.device, quick: bool) -> list[dict[str, Any]]:
        """All speed rows; a failing benchmark is recorded, never fatal."""
        rows = []
        for name, bench in self.benchmarks(api, device, quick):
            try:
                rows.append(bench())
            except Exception as exc:  # noqa: BLE001
                rows.append({"name": name, "kernel_ms": None, "reference_ms": None, "speedup": None,
                             "kernel_gbps": None, "error": short_error(exc)})
            torch.cuda.empty_cache()
        return rows

    def new_report(self, seed: int, quick: bool) -> dict[str, Any]:
        return {"package": self.package, "version": self.version(), "torch": torch.__version__,
                "triton": installed_version("triton"), "gpu": None, "capability": None, "seed": seed,
                "quick": quick, "env": {name: os.environ.get(name) for name in self.env_vars}, "status": None,
                "reason": "", "counts": {"passed": 0, "failed": 0, "skipped": 0}, "cases": [], "speed": []}

    def run_suite(self, report: dict[str, Any], args: argparse.Namespace) -> None:
        """Fill the report: environment, cases, speed (the status is set by finalize)."""
        if not torch.cuda.is_available():
            report.update(status="skipped", reason="no CUDA GPU visible to torch")
            return
        device = torch.device("cuda", torch.cuda.current_device())
        major, minor = torch.cuda.get_device_capability(device)
        report.update(gpu=torch.cuda.get_device_name(device), capability=f"{major}.{minor}")
        self.setup_process()
        try:
            api = self.load()
        except Exception as exc:  # noqa: BLE001  (a wheel that does not import has failed)
            report.update(status="failed", reason=f"import {self.package} failed: {short_error(exc)}",
                          traceback=traceback.format_exc()[-4000:])
            return
        report.update(self.report_extra(api))
        try:
            self.probe(api, device)
            torch.cuda.synchronize(device)
        except Exception as exc:  # noqa: BLE001  (other errors are left to the cases)
            if NO_KERNEL_IMAGE in str(exc).lower():
                report.update(status="skipped", reason=NO_KERNEL_IMAGE)
                return
        cases = [c for c in self.cases(api, args.quick) if args.only is None or re.search(args.only, c.name)]
        report["only"] = args.only
        report["cases"] = [asdict(r) for r in self.preliminary_cases(api, device)]
        report["cases"] = report["cases"] + self.run_groups(report, args.out, cases, args.jobs, api, device)
        if not args.no_bench and cuda_context_ok(device) is None:
            report["speed"] = self.run_benchmarks(api, device, args.quick)

    def parse_args(self, argv: Sequence[str] | None = None) -> argparse.Namespace:
        parser = argparse.ArgumentParser(description=self.description or f"kernel tests for {self.package}")
        parser.add_argument("--out", required=True, type=Path, help="where to write the JSON report")
        parser.add_argument("--quick", action="store_true", help=self.quick_help)
        parser.add_argument("--no-bench", action="store_true", help="skip the speed measurements")
        parser.add_argument("--seed", type=int, default=None, help="reuse a recorded seed (default: from the clock)")
        parser.add_argument("--jobs", type=int, default=None,
                            help="worker processes for grouped cases (default: from CPU cores and GPU memory)")
        parser.add_argument("--only", default=None, metavar="REGEX", help="run only the cases whose name matches")
        return parser.parse_args(argv)

    def main(self, argv: Sequence[str] | None = None) -> int:
        """CLI entry point; always writes the report; returns the exit code (0 passed, 1 failed, 3 skipped)."""
        args = self.parse_args(argv)
        seed = args.seed if args.seed is not None else time.time_ns() % (2**31 - 1)
        torch.manual_seed(seed)
        report = self.new_report(seed, args.quick)
        try:
            self.run_suite(report, args)
        except BaseException as exc:  # noqa: BLE001  (the report must still be written)
            report.update(status="failed", reason=f"harness error: {short_error(exc)}",
                          traceback=traceback.format_exc()[-4000:])
        finally:
            finalize(report)
            write_report(report, args.out)
            print_summary(report)
        return EXIT_CODES[report["status"]]


# --------------------------------------------------------------------------- the report


def finalize(report: dict[str, Any]) -> None:
    """Counts, the worst error/bound ratio, and the overall status (a status set earlier, e.g. skipped, is
    kept). A passed run with skipped cases says which and why in its reason; known upstream defects are counted
    apart (``known_defect``, only when there are any) and named in every reason."""
    counts = {"passed": 0, "failed": 0, "skipped": 0}
    for case in report["cases"]:
        counts[case["status"]] = counts.get(case["status"], 0) + 1
    report["counts"] = counts
    worsts = [c["worst"] for c in report["cases"] if c.get("worst") is not None]
    report["worst"] = max(worsts) if worsts else None
    defects = _known_defects(report["cases"])
    if report["status"] is None:
        if counts["failed"]:
            report["status"] = "failed"
            report["reason"] = "; ".join([f"{counts['failed']} case(s) failed", *defects])
        elif counts["passed"]:
            report["status"] = "passed"
            skipped = Counter(c["detail"].split(" [")[0] for c in report["cases"] if c["status"] == "skipped")
            report["reason"] = "; ".join(defects + [f"{n} case(s) skipped: {why}" for why, n in skipped.most_common()])
        else:
            report["status"] = "skipped"
            report["reason"] = report["reason"] or "; ".join(defects) or "no case ran"


def _known_defects(cases: list[dict[str, Any]]) -> list[str]:
    """'N case(s) known upstream defect: <reason>' per declared reason, most cases first."""
    reasons = Counter(c["detail"].removeprefix(KNOWN_DEFECT_PREFIX).split("; ", 1)[0]
                      for c in cases if c["status"] == KNOWN_DEFECT)
    return [f"{n} case(s) {KNOWN_DEFECT_PREFIX}{why}" for why, n in reasons.most_common()]


def json_safe(value: Any) -> Any:
    """Replace NaN/Inf floats (invalid JSON) with None, recursively."""
    if isinstance(value, float):
        return finite_float(value)
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    return repr(value)  # anything else (a dtype, a function) as its text


def write_report(report: dict[str, Any], path: Path) -> None:
    """Write the JSON report, creating the parent folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(json_safe(report), indent=2, allow_nan=False) + "\n")


def print_summary(report: dict[str, Any]) -> None:
    """One line per failed case and per known upstream defect, the speed rows, the run's reason, then
    'N passed, N failed, N skipped' (and ', N known upstream defect(s)' when there are any)."""
    for case in report["cases"]:
        if case["status"] == "failed":
            print(f"FAILED {case['name']}: {case['detail']}")
        elif case["status"] == KNOWN_DEFECT:
            print(f"KNOWN UPSTREAM DEFECT {case['name']}: {case['detail'].removeprefix(KNOWN_DEFECT_PREFIX)}")
    for row in report.get("speed", []):
        if row.get("kernel_ms") is not None:
            print(f"speed {row['name']}: kernel {row['kernel_ms']:.4f} ms, reference {row['reference_ms']:.4f} ms, "
                  f"x{row['speedup']:.1f}, {row['kernel_gbps']:.0f} GB/s")
        elif row.get("error"):
            print(f"speed {row['name']}: {row['error']}")
    if report.get("worst") is not None:
        print(f"worst error / allowed error: {report['worst']:.3f}")
    if report["reason"]:
        print(f"{report['status']}: {report['reason']}")
    c = report["counts"]
    known = f", {c[KNOWN_DEFECT]} known upstream defect(s)" if c.get(KNOWN_DEFECT) else ""
    print(f"{c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped{known}")



# --------------------------------------------------------------------------- for a suite's CPU tests


def load_suite(path: Path, name: str) -> types.ModuleType:
    """The suite ``path`` (a recipe's kernel_tests.py) imported as the module ``name``: every recipe has a
    kernel_tests.py, so each recipe's CPU tests load theirs under a name of its own (one pytest run loads several)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module

if __name__ == "__main__":  # pragma: no cover
    sys.exit("kernel_harness.py is a library: run a recipe's kernel_tests.py")
