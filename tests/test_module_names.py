"""Module names say what they hold and are unique in builder/ (issue 53 item 5): a newcomer who reads
``checks.py`` in a traceback knows which one. The names still shared are listed and may only go away."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

BUILDER = Path(__file__).resolve().parents[1] / "builder"
# still shared: a cli/ command module named like the farm/toolchain module it prints; remove one when renamed
KNOWN = {"coverage.py", "images.py"}


def shared_names(root: Path = BUILDER) -> dict[str, list[str]]:
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        if path.name != "__init__.py":
            where[path.name].append(str(path.relative_to(root)))
    return {name: paths for name, paths in where.items() if len(paths) > 1}


def test_no_new_shared_module_name() -> None:
    shared = shared_names()
    assert set(shared) <= KNOWN, {n: p for n, p in shared.items() if n not in KNOWN}
    assert KNOWN <= set(shared), f"renamed since: drop {KNOWN - set(shared)} from KNOWN"


def test_a_second_module_of_a_name_is_found(tmp_path: Path) -> None:
    for folder in ("index", "pipeline"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "checks.py").write_text("")
    assert shared_names(tmp_path) == {"checks.py": ["index/checks.py", "pipeline/checks.py"]}
