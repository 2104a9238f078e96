"""argparse types for every numeric flag: a bad value (nan, inf, -1, 1e400, 10**30, 'abc') is refused at parse,
one line naming the flag (argparse adds it) and the range, exit 2, before anything is read or written. Flags of
seconds use ``builder.core.net.seconds`` (positive, at most a month)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

MAX_DAYS = 100 * 365.0
MAX_JOBS = 4096  # MAX_JOBS per compile, --parallel targets: far above any machine's cores


def _float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _int(text: str) -> int | None:
    text = text.strip()
    if not text.lstrip("+-").isdigit() or len(text) > 12:
        return None
    return int(text)


def whole(low: int, high: int, what: str) -> Callable[[str], int]:
    """A whole number from ``low`` to ``high`` (``what`` names it in the error: 'jobs', 'a port')."""

    def parse(text: str) -> int:
        value = _int(text)
        if value is None or not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what} (a whole number from {low} to {high})")
        return value

    parse.__name__ = what  # argparse names the type in its own messages
    return parse


def days(text: str) -> float:
    """An age in days: 0 or more, at most ``MAX_DAYS``."""
    value = _float(text)
    if value is None or not 0 <= value <= MAX_DAYS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of days (0 to {MAX_DAYS:.0f})")
    return value


jobs = whole(1, MAX_JOBS, "a number of jobs")
parallel = whole(1, 256, "a number of targets at once")
port = whole(0, 65535, "a port")
