"""The piped console parses a message's markup whole before folding it by lines: a style opened on one line and
closed on a later one (the build's inspect report) is no error (it was rich's MarkupError, a crashed build)."""
from __future__ import annotations

import io

from builder.cli.common import FoldingConsole


def test_markup_spanning_lines_is_kept_and_folded() -> None:
    out = io.StringIO()
    console = FoldingConsole(file=out, width=40, soft_wrap=False)
    console.print("a [bold]styled\nline[/bold] and " + "word " * 12 + "\n\nlast")
    lines = out.getvalue().splitlines()
    assert lines[:2] == ["a styled", "line and word word word word word word"]
    assert all(len(line) <= 40 for line in lines) and lines[-2:] == ["", "last"]
