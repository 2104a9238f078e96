"""The patch stage: apply a recipe's unified diffs to the extracted sources, all-or-nothing.

Every patch is first dry-run (GNU patch, no fuzz); the first one that does not apply exactly stops the build
before anything compiles, naming the patch, the file and the failing hunk.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from builder.core.errors import PatchError
from builder.core.log import log
from builder.model.recipeparts import PatchSpec
from builder.stages.source import unpack


def apply_patches(root: Path, patches: tuple[PatchSpec, ...], package: str, version: str) -> None:
    """Each patch dry-run and then applied, in order: a later patch may build on an earlier one (a stable-ABI port
    on top of the build-script fixes), so each is checked against the tree the ones before it made."""
    for spec in patches:
        _run_patch(root, spec, package, version, dry_run=True)
        _run_patch(root, spec, package, version, dry_run=False)
        log.info(f"applied {spec.name}" + (f" ({spec.summary})" if spec.summary else ""))


def check_patches(source: Path, patches: tuple[PatchSpec, ...], package: str, version: str, scratch: Path) -> None:
    """Dry-run every patch on a scratch extraction right after the source is fetched, so that drift stops the
    build before the build venv (gigabytes of torch) is made; the real application comes later, as before."""
    if not patches:
        return

    tmp = Path(tempfile.mkdtemp(prefix=".patch-check-", dir=scratch))
    try:
        root = unpack(source, tmp / "src")
        for spec in patches:  # applied in turn on the scratch copy: patch N is checked on what 1..N-1 made
            _run_patch(root, spec, package, version, dry_run=True)
            _run_patch(root, spec, package, version, dry_run=False)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


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
            f"patch {spec.name} no longer applies to {package} {version}: "
            f"{describe_failure(result.stdout + result.stderr, hunk_lines(spec.path))}",
            f"update {spec.path} or narrow its version range ({spec.versions}) in the recipe",
        )


def hunk_lines(patch: Path) -> dict[tuple[str, int], tuple[int, int]]:
    """Per (file, hunk number): the line the hunk starts at in the original file (``@@ -L``) and the line of
    its ``@@`` header in the patch file. GNU patch reports neither: its "FAILED at N" is where it tried, offset."""
    found: dict[tuple[str, int], tuple[int, int]] = {}
    current, count = "?", 0
    try:
        lines = patch.read_text(errors="replace").splitlines()
    except OSError:
        return found
    for number, line in enumerate(lines, start=1):
        if line.startswith("+++ "):
            name = line[4:].split("\t", 1)[0].strip()
            current, count = (name.split("/", 1)[1] if "/" in name else name), 0
        elif m := re.match(r"@@ -(\d+)", line):
            count += 1
            found[(current, count)] = (int(m.group(1)), number)
    return found


def describe_failure(output: str, hunks: dict[tuple[str, int], tuple[int, int]] | None = None) -> str:
    """Condense GNU patch output to 'setup.py: hunk #2 FAILED at 120' style text; with the patch's ``hunks``
    (hunk_lines), the hunk's own line in the original file and in the patch instead."""
    current = "?"
    problems: list[str] = []
    for line in output.splitlines():
        if m := re.match(r"(?:checking|patching) file (.+)", line):
            current = m.group(1).strip()
        elif m := re.match(r"Hunk #(\d+) FAILED at (\d+)", line):
            where = (hunks or {}).get((current, int(m.group(1))))
            if where:
                problems.append(f"{current}: hunk #{m.group(1)} (line {where[0]} of the original, line {where[1]} "
                                "of the patch) FAILED")
            else:
                problems.append(f"{current}: hunk #{m.group(1)} FAILED at line {m.group(2)}")
        elif "can't find file to patch" in line or "No file to patch" in line:
            problems.append("a file it patches does not exist")
        elif "Reversed (or previously applied) patch detected" in line:
            problems.append(f"{current}: already applied (reversed patch detected)")
    if not problems:
        last = [line for line in output.splitlines() if line.strip()]
        problems.append(last[-1] if last else "unknown error")
    return "; ".join(dict.fromkeys(problems))
