"""The farm proven before it runs (issue 39): every target of a farm plans with its real recipe.

Expansion checks each combination against the torch indexes and what each CUDA compiles; the plan stage
(``stages/plan.make_plan``) checks more: the recipe's ``[[known-bad]]`` (arch, CUDA) rules, the version's source and
its recorded sha256, the torch pin, the Python the torch has, the ABI. A target that cannot plan fails every night
in the nightly's build job, long after ``builder matrix`` called its cells covered. ``plan_all`` plans each target
as ``builder build`` would (no download beyond index metadata, no compile) and returns the refusals by target id.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from builder.core.errors import BuilderError
from builder.core.settings import Settings
from builder.farm.spec import FarmTarget
from builder.stages.plan import make_plan


@dataclass(frozen=True)
class PlanRefusal:
    """One target the plan stage refuses, and its one-line error."""

    target: str  # the target's id
    entry: str  # the farm entry it comes from: package[0]
    error: str

    def line(self) -> str:
        return f"{self.target} ({self.entry}): {self.error}"


def plan_all(targets: Iterable[FarmTarget], settings: Settings) -> list[PlanRefusal]:
    """Plan every target (stages/plan.make_plan, each with its own recipes folder); the ones refused, in order."""
    refused = []
    for t in targets:
        try:
            make_plan(t.to_target(jobs=1), t.settings(settings))
        except BuilderError as e:
            refused.append(PlanRefusal(t.id, t.entry, e.one_line()))
    return refused
