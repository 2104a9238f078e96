"""A wheel's build number: the PEP 427 build tag a kernel-fix patch brings (docs/INDEX.md "Superseded builds")."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WheelBuild:
    """A wheel's build number (its PEP 427 build tag; docs/INDEX.md "Superseded builds") and the patches that
    brought it (``0005-….patch: summary``): this build supersedes every lower build of the same file name."""

    number: int
    by: tuple[str, ...]

    def describe(self) -> str:
        """``0005: kernel fix: …`` (the patches' numbers and summaries)."""
        return "; ".join(f"{b.split('-', 1)[0]}: {b.split(': ', 1)[1]}" if ": " in b else b for b in self.by)
