"""The test lock (requirements/test.txt) and the checks around it: the README's test command installs exactly the
lock, CI runs that command, and the drift watch is a separate, non-gating workflow (issue 38)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements" / "test.txt"


def locked() -> dict[str, tuple[Version, list[str]]]:
    """name → (pinned version, its hashes), read from the lock's `name==version \\ --hash=...` entries."""
    text = LOCK.read_text().replace("\\\n", " ")
    pins = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        match = re.match(r"^([A-Za-z0-9._-]+)==(\S+)\s*(.*)$", line)
        assert match, f"requirements/test.txt: not an exact pin: {line[:80]}"
        pins[canonicalize_name(match.group(1))] = (Version(match.group(2)), re.findall(r"--hash=sha256:([0-9a-f]{64})",
                                                                                      match.group(3)))
    return pins


def readme_test_command() -> str:
    lines = [line.strip() for line in (ROOT / "README.md").read_text().splitlines()
             if line.startswith("    python3 -m venv .venv") and "pytest" in line]
    assert len(lines) == 1, lines
    return lines[0]


def test_every_locked_package_is_pinned_with_a_hash() -> None:
    pins = locked()
    assert len(pins) > 50
    assert all(hashes for _, hashes in pins.values()), [n for n, (_, h) in pins.items() if not h]
    # the CPU torch comes from the machine's disk, its CUDA wheels are never needed by the tests
    assert not {n for n in pins if n == "torch" or n == "triton" or n.startswith(("nvidia-", "cuda-"))}


def test_the_lock_satisfies_what_pyproject_asks() -> None:
    """A dependency added to pyproject.toml without re-locking fails here, naming it (scripts/lock-tests.sh)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = locked()
    for text in [*project["dependencies"], *project["optional-dependencies"]["test"]]:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not in requirements/test.txt: run scripts/lock-tests.sh"
        assert req.specifier.contains(pins[name][0], prereleases=True), (
            f"requirements/test.txt pins {req.name} {pins[name][0]}, outside pyproject's {req}: run scripts/lock-tests.sh")


def test_the_readme_test_command_installs_the_lock_and_ci_runs_it_verbatim() -> None:
    command = readme_test_command()
    assert "pip install -q --require-hashes -r requirements/test.txt" in command
    assert "--no-deps" in command and "torch==2.13.0" in command and "pip check" in command
    assert command in (ROOT / ".ci" / "run").read_text()
    assert command in (ROOT / ".github" / "workflows" / "ci.yml").read_text()


def test_the_drift_watch_never_gates_a_landing() -> None:
    yaml = pytest.importorskip("ruamel.yaml", reason="ruamel.yaml (a check-jsonschema dependency) is not installed")
    drift = yaml.YAML(typ="safe").load((ROOT / ".github" / "workflows" / "drift.yml").read_text())
    triggers = drift[True] if True in drift else drift["on"]
    assert set(triggers) == {"schedule", "workflow_dispatch"}  # never push or pull_request
    steps = drift["jobs"]["drift"]["steps"]
    check = next(s for s in steps if "scripts/drift-check.sh" in s.get("run", ""))
    assert check.get("continue-on-error") is True
    assert any("gh issue create" in s.get("run", "") for s in steps)
    assert "drift" in (ROOT / "pyproject.toml").read_text()  # the marker the check selects


def test_drift_marked_tests_cover_the_transformers_facing_files() -> None:
    for rel in ("tests/test_envprobe.py", "tests/test_doctor_hybrids.py",
                "recipes/flash-linear-attention/test_fastpath_cpu.py"):
        assert "pytest.mark.drift" in (ROOT / rel).read_text(), rel
