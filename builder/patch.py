"""The patch stage: apply a recipe's unified diffs to the extracted sources, all-or-nothing.

Every patch is first dry-run (GNU patch, no fuzz); the first one that does not apply exactly stops the build
before anything compiles, naming the patch, the file and the failing hunk.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from .errors import PatchError
from .log import log
from .recipe import PatchSpec


def apply_patches(root: Path, patches: tuple[PatchSpec, ...], package: str, version: str) -> None:
    for spec in patches:
        _run_patch(root, spec, package, version, dry_run=True)
    for spec in patches:
        _run_patch(root, spec, package, version, dry_run=False)
        log.info(f"applied {spec.name}" + (f" ({spec.summary})" if spec.summary else ""))


def _run_patch(root: Path, spec: PatchSpec, package: str, version: str, *, dry_run: bool) -> None:
    argv = ["patch", "-p1", "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch", "-r", "-", "-i", str(spec.path)]
    if dry_run:
        argv.insert(1, "--dry-run")
    try:
        result = subprocess.run(argv, cwd=root, capture_output=True, text=True)
    except FileNotFoundError as e:
        raise PatchError("GNU patch is not installed", "install it (apt-get install patch)") from e
    if result.returncode != 0:
        raise PatchError(
            f"patch {spec.name} no longer applies to {package} {version}: {describe_failure(result.stdout + result.stderr)}",
            f"update {spec.path} or narrow its version range ({spec.versions}) in the recipe",
        )


def describe_failure(output: str) -> str:
    """Condense GNU patch output to 'setup.py: hunk #2 FAILED at 120' style text."""
    current = "?"
    problems: list[str] = []
    for line in output.splitlines():
        if m := re.match(r"(?:checking|patching) file (.+)", line):
            current = m.group(1).strip()
        elif m := re.match(r"Hunk #(\d+) FAILED at (\d+)", line):
            problems.append(f"{current}: hunk #{m.group(1)} FAILED at line {m.group(2)}")
        elif "can't find file to patch" in line or "No file to patch" in line:
            problems.append("a file it patches does not exist")
        elif "Reversed (or previously applied) patch detected" in line:
            problems.append(f"{current}: already applied (reversed patch detected)")
    if not problems:
        last = [l for l in output.splitlines() if l.strip()]
        problems.append(last[-1] if last else "unknown error")
    return "; ".join(dict.fromkeys(problems))
