"""One error root for the project; every user-facing failure is a subclass.

Each error carries a one-line message (the cause), an optional hint (the cure) and an exit code, which a subclass
names in its header. Only ``builder.cli.main`` catches them, prints them once and exits.
"""

from __future__ import annotations

from typing import Any


class BuilderError(Exception):
    """Root of all expected failures. ``str(err)`` is the one-line cause."""

    exit_code = 1

    def __init_subclass__(cls, exit_code: int | None = None, **kwargs: Any) -> None:
        """``class RecipeError(BuilderError, exit_code=3)``: a subclass names its exit code in its header."""
        super().__init_subclass__(**kwargs)
        if exit_code is not None:
            cls.exit_code = exit_code

    def __init__(self, message: str, hint: str | None = None, *, extra: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.extra = extra  # further lines (ways forward), printed under the error line

    def one_line(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(BuilderError, exit_code=2):
    """A bad command-line flag or value (``--arch abc``, ``--cuda 99.9``)."""


class RecipeError(BuilderError, exit_code=3):
    """A recipe file that is missing, malformed or names an unknown package/version."""


class SourceError(BuilderError, exit_code=4):
    """Fetching or extracting sources failed (network, offline cache miss, hostile archive)."""


class ChecksumError(SourceError, exit_code=5):
    """A downloaded or cached file does not have the recorded sha256."""


class PatchError(BuilderError, exit_code=6):
    """A patch no longer applies to the sources it is scoped to."""


class ToolchainError(BuilderError, exit_code=7):
    """No usable CUDA toolkit or Python for the requested target."""


class BuildFailed(BuilderError, exit_code=8):
    """The upstream build itself failed; the log path is in the message."""


class InspectError(BuilderError, exit_code=9):
    """The built wheel lacks GPU code that was asked for, or cannot be read."""


class TestFailed(BuilderError, exit_code=10):
    """The import test or a kernel test failed; nothing was published."""

    __test__ = False  # not a pytest class


class PublishError(BuilderError, exit_code=11):
    """The wheel could not be published into the wheelhouse."""


class InstallError(BuilderError, exit_code=12):
    """No wheel fits the user's environment and none can be built here; the ways forward are in the message."""


class PortabilityError(BuilderError, exit_code=13):
    """A wheel that would not import elsewhere: it vendors torch's or CUDA's runtime libraries."""
