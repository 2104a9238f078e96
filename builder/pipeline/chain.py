"""The one order of a wheel's checks: inspect → test (import, then kernel tests) → torch range → GPU check →
variants → publish (issue 53 item 2).

Each command that checks a wheel says which of these steps it runs and what each does in its context; ``run_chain``
runs them in this order, hands one ``Checked`` from step to step, times each and (for a build) announces it. A
build runs them all; ``builder test`` inspect, test, GPU check and publish (its promotion, or the record kept in
staging); ``builder variants`` inspect and publish per thin wheel; ``builder verify`` torch range and publish (the
record with its new checks). A step that is not one of these, or a command that names one twice, fails at once: the
order cannot drift apart between commands."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from builder.core.log import log
from builder.model.builtwheel import BuiltWheel
from builder.model.records import BuildRecord, TestReport, TorchCheck
from builder.pipeline.checks import VariantWheel
from builder.pipeline.resolveinputs import timed
from builder.stages.inspection import WheelReport

ORDER: Final = ("inspect", "test", "torch range", "gpu check", "variants", "publish")


@dataclass
class Checked:
    """What the steps found so far about one wheel, handed from each step to the next."""

    wheel: BuiltWheel  # its facts as read once; a step that grows the record keeps it in ``record``
    record: BuildRecord | None = None
    report: WheelReport | None = None
    tests: TestReport | None = None
    torch_checks: tuple[TorchCheck, ...] = ()
    torch_unchecked: tuple[TorchCheck, ...] = ()
    variants: list[VariantWheel] = field(default_factory=list)
    published: Path | None = None


Step = Callable[[Checked], None]


def run_chain(state: Checked, steps: Mapping[str, Step], *, timings: dict[str, float] | None = None,
              announce: bool = True) -> Checked:
    """Run ``steps`` (a name of ``ORDER`` → what it does) in ``ORDER``; ``timings`` gets each step's seconds,
    ``announce`` logs each as a pipeline stage (``==> test``)."""
    unknown = [name for name in steps if name not in ORDER]
    if unknown:
        raise ValueError(f"check chain: no step {', '.join(map(repr, unknown))}; the steps are {', '.join(ORDER)}")
    for name in ORDER:
        step = steps.get(name)
        if step is None:
            continue
        if announce:
            log.step(name)
        if timings is None:
            step(state)
        else:
            with timed(timings, name):
                step(state)
    return state
