"""One error root for the project; every user-facing failure is a subclass.

Each error carries a one-line message (the cause), an optional hint (the cure) and an exit code.
Only ``builder.cli.main`` catches them, prints them once and exits.
"""

from __future__ import annotations


class BuilderError(Exception):
    """Root of all expected failures. ``str(err)`` is the one-line cause."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None, *, extra: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.extra = extra  # further lines (ways forward), printed under the error line

    def one_line(self) -> str:
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(BuilderError):
    """A bad command-line flag or value (``--arch abc``, ``--cuda 99.9``)."""

    exit_code = 2


class RecipeError(BuilderError):
    """A recipe file that is missing, malformed or names an unknown package/version."""

    exit_code = 3


class SourceError(BuilderError):
    """Fetching or extracting sources failed (network, offline cache miss, hostile archive)."""

    exit_code = 4


class ChecksumError(SourceError):
    """A downloaded or cached file does not have the recorded sha256."""

    exit_code = 5


class PatchError(BuilderError):
    """A patch no longer applies to the sources it is scoped to."""

    exit_code = 6


class ToolchainError(BuilderError):
    """No usable CUDA toolkit or Python for the requested target."""

    exit_code = 7


class BuildFailed(BuilderError):
    """The upstream build itself failed; the log path is in the message."""

    exit_code = 8


class InspectError(BuilderError):
    """The built wheel lacks GPU code that was asked for, or cannot be read."""

    exit_code = 9


class TestFailed(BuilderError):
    """The import test or a kernel test failed; nothing was published."""

    __test__ = False  # not a pytest class
    exit_code = 10


class PublishError(BuilderError):
    """The wheel could not be published into the wheelhouse."""

    exit_code = 11


class InstallError(BuilderError):
    """No wheel fits the user's environment and none can be built here; the ways forward are in the message."""

    exit_code = 12


class PortabilityError(BuilderError):
    """A wheel that would not import elsewhere: it vendors torch's or CUDA's runtime libraries."""

    exit_code = 13
