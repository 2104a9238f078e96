"""The farm's worker: one target built by the pipeline in a child process, all its output in one log file."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback

from rich.console import Console

from builder.core.errors import BuilderError
from builder.core.log import log
from builder.core.settings import Settings
from builder.farm.spec import FarmTarget
from builder.model.records import FarmOutcome
from builder.pipeline.run import BuildOptions, run_build
from builder.toolchain.cross import is_cross


def run_target(farm_target: FarmTarget, settings: Settings, options: BuildOptions, jobs: int, log_path: str) -> FarmOutcome:
    """Build one target with the pipeline, all output into ``log_path``; returns its outcome (picklable)."""
    start = time.monotonic()
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    log.console = Console(file=sys.stderr, highlight=False, soft_wrap=True, no_color=True, width=200,
                          force_terminal=False)
    log.quiet = False
    outcome = FarmOutcome(id=farm_target.id, status="failed")
    log.info(f"farm target {farm_target.id}: platform {farm_target.platform}"
             + (" (pure Python: one wheel for " + ", ".join(p.name for p in farm_target.platforms) + ")"
                if not farm_target.kind.is_cuda else ""))
    if farm_target.variants and not options.variants:
        if is_cross(farm_target.platform):  # an arm64 runner of the nightly builds them natively
            log.info("variants: not for a cross build here (its import test under qemu installs no variant)")
        else:
            options = dataclasses.replace(options, variants=True)
    try:
        result = run_build(farm_target.to_target(jobs), farm_target.settings(settings), options)
        outcome = FarmOutcome(id=farm_target.id, status=result.status,
                              wheel=str(result.wheel) if result.wheel else None, timings=dict(result.timings))
        log.ok(f"farm: {result.status}: {result.wheel}")
    except BuilderError as e:
        log.error(f"error: {e.one_line()}")
        for line in e.extra:
            log.error(f"  {line}")
        outcome = FarmOutcome(id=farm_target.id, status="failed", error="; ".join([e.one_line(), *e.extra]),
                              exit_code=e.exit_code)
    except Exception as e:  # noqa: BLE001 - one target's bug must not stop the farm; the traceback is in its log
        traceback.print_exc()
        outcome = FarmOutcome(id=farm_target.id, status="failed", exit_code=1,
                              error=f"internal error: {type(e).__name__}: {e} (traceback in the log)")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    return outcome.took(round(time.monotonic() - start, 2))
