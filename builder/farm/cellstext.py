"""The users' matrix cells written for people: ``compact_pythons`` (3.10–3.12, 3.14), ``cells_text`` (per CUDA line
and platform, torch and Python spans with a count) and ``cells_list`` (every cell named), as `builder coverage`,
`builder matrix` and `coverage --resolve` print them."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

from packaging.version import InvalidVersion, Version

from builder.farm.served import Cell


def compact_pythons(pythons: Iterable[str]) -> str:
    """``3.10 3.11 3.12 3.14`` → ``3.10–3.12, 3.14``."""
    minors = sorted({int(p.split(".")[1]) for p in pythons})
    runs: list[list[int]] = []
    for m in minors:
        if runs and m == runs[-1][-1] + 1:
            runs[-1].append(m)
        else:
            runs.append([m])
    return ", ".join(f"3.{r[0]}" if len(r) == 1 else f"3.{r[0]}–3.{r[-1]}" for r in runs)


def cells_text(cells: Iterable[Cell]) -> str:
    """``13.0 x86_64+aarch64: torch 2.11-2.14 × py3.10-3.14 (40); 13.2 aarch64: torch 2.15 × py3.11-3.15 (5)``: per
    CUDA line, the platforms that have the same cells together (none named where x86_64 is the only one)."""
    by_line: dict[str, dict[str, set[tuple[str, str]]]] = {}
    for cell in cells:
        by_line.setdefault(cell.cuda, {}).setdefault(cell.platform, set()).add((cell.torch, cell.python))
    parts = []
    for line in sorted(by_line, key=Version):
        merged: dict[frozenset[tuple[str, str]], list[str]] = {}
        for platform in sorted(by_line[line], key=lambda p: (p != "x86_64", p)):
            merged.setdefault(frozenset(by_line[line][platform]), []).append(platform)
        for group, platforms in merged.items():
            torches = _span(sorted({t for t, _ in group}, key=Version))
            pythons = _span(sorted({p for _, p in group},
                                   key=lambda p: Version(p) if p[:1].isdigit() else Version("0")))
            where = "" if platforms == ["x86_64"] and len(by_line[line]) == 1 else " " + "+".join(platforms)
            parts.append(f"{line}{where}: torch {torches} × py{pythons} ({len(group) * len(platforms)})")
    return "; ".join(parts)


def _span(minors: list[str]) -> str:
    """``2.11, 2.12, 2.13`` → ``2.11-2.13`` where the minors are consecutive; listed otherwise."""
    try:
        keys = [Version(m).release[:2] for m in minors]
    except InvalidVersion:
        return ", ".join(minors)
    consecutive = len(keys) > 2 and all(a[0] == b[0] and b[1] == a[1] + 1 for a, b in pairwise(keys))
    return f"{minors[0]}-{minors[-1]}" if consecutive else ", ".join(minors)


def cells_list(cells: Iterable[Cell]) -> str:
    """``12.8 torch 2.7 py3.9, 2.8 py3.9; 12.9 torch 2.8 py3.9 (x86_64+aarch64)``: each cell named, by CUDA line and
    torch minor, the platforms that have the same cells together."""
    platforms_of: dict[tuple[str, str, str], set[str]] = {}
    for cell in cells:
        platforms_of.setdefault((cell.cuda, cell.torch, cell.python), set()).add(cell.platform)
    groups: dict[tuple[str, ...], dict[str, dict[str, list[str]]]] = {}
    for (line, torch, python), where in sorted(platforms_of.items(), key=lambda kv: tuple(map(Version, kv[0]))):
        key = tuple(sorted(where, key=lambda p: (p != "x86_64", p)))
        groups.setdefault(key, {}).setdefault(line, {}).setdefault(torch, []).append(python)
    parts = []
    for shared, lines in groups.items():
        text = "; ".join(f"{line} torch " + ", ".join(f"{torch} py{compact_pythons(pythons)}"
                                                     for torch, pythons in torches.items())
                         for line, torches in lines.items())
        parts.append(f"{text} ({'+'.join(shared)})")
    return "; ".join(parts)
