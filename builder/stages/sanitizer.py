"""Kernel tests under NVIDIA's compute-sanitizer (``builder test --sanitize``): an out-of-bounds access or a
shared-memory race that happens to give the right numbers still fails the gate.

The run is the suite's ``--quick`` set (its boundary shapes and a seeded sample; the tools slow kernels 10-100x),
without benchmarks, with PyTorch's caching allocator off so that every tensor is its own allocation: memcheck sees
a read past a tensor's end only when no other tensor lies there. Which GPU machines run the tool: a bare-metal or
Firecracker host does (the lent H100); gVisor refuses the device ("Device not supported", the lent H200), and then
the run fails with that said, never passes.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from builder.core.errors import ToolchainError

TOOLS = ("memcheck", "racecheck")
EXIT_CODE = 86  # --error-exitcode: what the tool returns when it found errors (the suite's own codes are 0/1/3)
SLOWDOWN = 10  # the suite's timeout is multiplied by this under the tool
# memcheck/initcheck/synccheck end with "ERROR SUMMARY: N errors" (not "... N errors were not printed"), racecheck
# with "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)" (seen on the H100)
_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) errors?$|RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?",
                      re.MULTILINE)
_WHERE = re.compile(r"^=+\s+at (?:void )?(\w+).*? in ([\w./-]+:\d+)", re.MULTILINE)
# what the tool prints when it could not instrument the run ("Target application returned an error" is not one:
# it only says the suite exited non-zero, e.g. with failed cases, which the suite's report tells)
_UNSUPPORTED = ("Device not supported", "Unable to find injection library", "Target application terminated before",
                "cannot be profiled")


@dataclass(frozen=True)
class SanitizerRun:
    """The tool and its log, for one kernel-test run."""

    tool: str
    executable: Path
    log_file: Path

    def argv(self) -> list[str]:
        return [str(self.executable), "--tool", self.tool, "--error-exitcode", str(EXIT_CODE),
                "--target-processes", "all", "--print-limit", "20", "--log-file", str(self.log_file)]

    @staticmethod
    def env() -> dict[str, str]:
        return {"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}

    def verdict(self, returncode: int | None) -> str | None:
        """None when the tool ran and found nothing; else why the gate fails: the error count and first error, or
        that the tool could not instrument the run on this machine."""
        text = self.log_file.read_text(errors="replace") if self.log_file.is_file() else ""
        found = _SUMMARY.findall(text)
        errors = sum(int(a or b) for a, b in found)
        if errors:
            first = next((line.strip("= ").strip() for line in text.splitlines()
                          if line.startswith("=========") and any(w in line for w in ("Invalid", "Race", "Error", "error"))
                          and "ERROR SUMMARY" not in line), "")
            where = _WHERE.search(text)
            if first and where:
                first += f" in {where.group(1)} ({where.group(2)})"
            return f"compute-sanitizer {self.tool} found {errors} error(s)" + (f", first: {first[:300]}" if first else "")
        refused = next((marker for marker in _UNSUPPORTED if marker in text), None)
        if refused or returncode == EXIT_CODE or not found:
            why = refused or ("it wrote no error summary" if not found else f"it exited {returncode}")
            return (f"compute-sanitizer {self.tool} could not check the run on this machine ({why}; log "
                    f"{self.log_file}): a GPU host that supports it is needed (the H100 machine does, a gVisor one "
                    "such as the H200 does not)")
        return None


def find_sanitizer(tool: str, env: dict[str, str] | None = None) -> Path:
    """compute-sanitizer on PATH, else in CUDA_HOME's or /usr/local/cuda's bin; a ToolchainError naming the cure."""
    if tool not in TOOLS:
        raise ToolchainError(f"--sanitize {tool}: not a compute-sanitizer tool this builder runs",
                             f"use one of {', '.join(TOOLS)}")
    env = dict(os.environ) if env is None else env
    found = shutil.which("compute-sanitizer", path=env.get("PATH"))
    if found:
        return Path(found)
    for home in (env.get("CUDA_HOME"), env.get("CUDA_PATH"), "/usr/local/cuda"):
        for candidate in (Path(home or "/nonexistent") / "bin" / "compute-sanitizer",
                          Path(home or "/nonexistent") / "compute-sanitizer" / "compute-sanitizer"):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return candidate
    raise ToolchainError("--sanitize: compute-sanitizer was not found (not on PATH, nor in $CUDA_HOME/bin or "
                         "/usr/local/cuda/bin)",
                         "install the CUDA toolkit's compute-sanitizer on the GPU machine, or put it on PATH")
