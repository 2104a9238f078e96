"""What ``--python`` (or a farm's ``python``) names: a CPython version (``3.12``) or an interpreter (a path, or a
command looked up on PATH). Written back as given (``str``), so a plan, a record or a target id does not change."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PythonSpec:
    text: str

    @property
    def is_path(self) -> bool:
        """An interpreter (``/venv/bin/python``, ``python3``) rather than a version: anything not led by a digit."""
        return "/" in self.text or not self.text[:1].isdigit()

    @property
    def version(self) -> str | None:
        """``3.12`` as given; None for an interpreter (its version is the interpreter's to say)."""
        return None if self.is_path else self.text

    @property
    def name(self) -> str:
        """The version, or the interpreter's file name (for ids and labels)."""
        return Path(self.text).name if self.is_path else self.text

    def __str__(self) -> str:
        return self.text
