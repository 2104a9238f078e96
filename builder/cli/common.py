"""What every command module shares: the console, the common flags and the Settings they give."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from builder.core import net
from builder.core.log import log
from builder.core.settings import Settings

PIPED_WIDTH = 120  # piped output (a file, a CI log, `| less`) is folded at this many characters (issue 55 item 8)


class FoldingConsole(Console):
    """rich's Console, except that piped (``soft_wrap`` off) a line of text longer than the width is folded at
    spaces, its continuation lines indented two beyond the line's own indent, and a word longer than the width (a
    path, a URL) is kept whole, so it still copies; tables fit the width. On a terminal, or with COLUMNS set, it
    is rich's own console, lines unfolded (the terminal wraps them; tests read them whole)."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        if self.soft_wrap or kwargs.get("soft_wrap") or len(objects) != 1 or not isinstance(objects[0], str):
            super().print(*objects, **kwargs)
            return
        markup = kwargs.pop("markup", None)
        markup = self._markup if markup is None else markup
        whole = Text.from_markup(objects[0]) if markup else Text(objects[0])  # markup may span lines
        for text in whole.split("\n", allow_blank=True):
            for part in fold(text, self.width):
                super().print(part, soft_wrap=True, **kwargs)


def fold(text: Text, width: int) -> list[Text]:
    """``text`` as lines of at most ``width`` characters, broken at spaces (a longer word is a line of its own),
    each continuation line indented two beyond ``text``'s own indent; styles kept."""
    plain = text.plain
    if len(plain) <= width:
        return [text]
    lead = len(plain) - len(plain.lstrip(" "))
    room = max(width - lead - 2, 20)
    breaks: list[int] = []
    start = lead
    for word in re.finditer(r"\S+\s*", plain[lead:]):
        at = word.start() + lead
        if at > start and len(plain[start:word.end() + lead].rstrip()) > (room if breaks else width - lead):
            breaks.append(at)
            start = at
    parts = text.divide(breaks)
    parts[0].rstrip()
    for part in parts[1:]:
        part.rstrip()
        part.pad_left(lead + 2)
    return list(parts)


def shell_folded(command: str, indent: str = "") -> str:
    """A shell command for ``out``: piped and longer than the width, split at unquoted spaces into lines ending in
    `` \\`` (a shell joins them back: the lines still paste and run); otherwise ``indent + command``."""
    width = out.width if not out.soft_wrap else 0
    if not width or len(indent) + len(command) <= width:
        return indent + command
    words = re.findall(r"""(?:[^\s'"\\]|\\.|'[^']*'|"(?:[^"\\]|\\.)*"|['"\\])+""", command)
    if "".join(words) != "".join(command.split()):  # a space inside quotes the pattern did not pair: left whole
        return indent + command
    lines, current = [], indent
    for word in words:
        if current.strip() and len(current) + 1 + len(word) + 2 > width:
            lines.append(current + " \\")
            current = indent + "  " + word
        else:
            current = f"{current} {word}" if current.strip() else current + word
    return "\n".join([*lines, current])


def _console(stream: Any, **kwargs: Any) -> FoldingConsole:
    """Folding at PIPED_WIDTH where ``stream`` is no terminal and COLUMNS is unset, else rich's own width."""
    piped = not stream.isatty() and not os.environ.get("COLUMNS")
    return FoldingConsole(highlight=False, soft_wrap=not piped, width=PIPED_WIDTH if piped else None, **kwargs)


out = _console(sys.stdout)
log.console = _console(sys.stderr, stderr=True)  # error lines and their cures, folded alike when piped


# The shared flags: name → (argparse keywords). Their order is the order --help lists them in.
COMMON_FLAGS: dict[str, dict[str, object]] = {
    "cache-dir": {"type": Path, "help": "cache for sources, toolkits, venvs, logs (default "
                  "~/.cache/cuda-wheel-builder; BUILDER_CACHE_DIR)"},
    "wheelhouse": {"type": Path, "help": "the wheelhouse folder (default ./wheelhouse; BUILDER_WHEELHOUSE)"},
    "recipes": {"type": Path, "help": "recipes folder (default: the project's recipes/; BUILDER_RECIPES)"},
    "patches": {"type": Path, "help": "patches folder (default: patches/ beside the recipes folder; BUILDER_PATCHES)"},
    "offline": {"action": "store_true", "help": "use cached sources, indexes, toolkits and venvs only "
                "(BUILDER_OFFLINE=1)"},
    "net-deadline": {"type": net.seconds, "metavar": "SECONDS", "help": "the longest one download may take, retries "
                     "included (default 300; BUILDER_NET_DEADLINE; docs: Network policy)"},
}


def add_common(parser: argparse.ArgumentParser, *only: str) -> None:
    """The shared flags a command means something with (``only``; all of them when none is named): a command
    lists no flag it ignores (`serve --recipes`, `torch-table --wheelhouse` were such)."""
    unknown = set(only) - set(COMMON_FLAGS)
    assert not unknown, unknown
    for name, keywords in COMMON_FLAGS.items():
        if not only or name in only:
            parser.add_argument(f"--{name}", **keywords)  # type: ignore[arg-type]


def settings_from_args(args: argparse.Namespace) -> Settings:
    """The Settings the common flags (--cache-dir, --wheelhouse, --recipes, --patches, --offline,
    --net-deadline) give. Their network policy becomes the process's (``net.use``): every fetch follows it, and
    uv processes started from here inherit its timeouts."""
    settings = Settings.from_env(
        os.environ,
        cache_dir=getattr(args, "cache_dir", None),
        wheelhouse=getattr(args, "wheelhouse", None),
        recipes_dir=getattr(args, "recipes", None),
        patches_dir=getattr(args, "patches", None),
        offline=getattr(args, "offline", False),
        net_deadline_s=getattr(args, "net_deadline", None),
    )
    net.use(settings.net, os.environ)
    return settings
