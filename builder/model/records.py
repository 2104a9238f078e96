"""Typed values handed between stages and to the CLI, and their one JSON form each (``to_json``/``from_json``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

FARM_STATUSES = ("built", "unchanged", "failed")


@dataclass(frozen=True, kw_only=True)
class FarmOutcome:
    """What became of one farm target (a worker's answer, or the up-front check's "unchanged")."""

    id: str
    status: str  # built | unchanged | failed
    wheel: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0
    exit_code: int | None = None
    log: str | None = None

    def took(self, seconds: float) -> FarmOutcome:
        return dataclasses.replace(self, seconds=seconds)

    def with_log(self, path: str) -> FarmOutcome:
        return dataclasses.replace(self, log=path)

    def to_json(self) -> dict[str, Any]:
        """The entry of summary.json (``exit_code`` only where a worker failed with one, as before)."""
        out: dict[str, Any] = {"id": self.id, "status": self.status, "wheel": self.wheel, "timings": self.timings,
                               "error": self.error}
        if self.exit_code is not None:
            out["exit_code"] = self.exit_code
        out["seconds"] = self.seconds
        if self.log is not None:
            out["log"] = self.log
        return out
