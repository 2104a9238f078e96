"""Issue 55 item 7: the README's "By hand" lines with a CPU torch. The channel variable is empty there, and the old
guard (``test -d wheelhouse/channels/$CH``) passed on the channels folder itself; the guard now needs a CUDA torch
and says why it stops, and the lines install causal-conv1d (what the main job builds), not fla-core."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from builder.core.uvtool import uv_bin
from builder.core.wheelfile import write_wheel
from builder.index.store import Wheelhouse
from builder.model.records import BuildRecord
from tests.test_index import labelled_wheel
from tests.test_user_install import readme_block


def cpu_torch(folder: Path, version: str) -> Path:
    """A wheel named torch that answers like a CPU build: ``torch.version.cuda`` is None."""
    info = f"torch-{version}.dist-info"
    entries = {
        "torch/__init__.py": f"__version__ = {version + '+cpu'!r}\nclass version:\n    cuda = None\n".encode(),
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n\nstand-in\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"torch-{version}-py3-none-any.whl"
    write_wheel(wheel, entries, info, {})
    return wheel


def test_the_by_hand_lines_stop_on_a_cpu_torch_and_say_why(tmp_path: Path) -> None:
    block = readme_block("By hand, for any env")
    assert "causal-conv1d torch==$T" in block and "fla-core" not in block
    project = tmp_path / "project"
    project.mkdir()
    (project / ".venv").symlink_to(Path(sys.prefix))
    Wheelhouse(project / "wheelhouse").publish(
        labelled_wheel(tmp_path, "causal-conv1d", "1.7.0", "cu130torch2.14", pins=("torch==2.14.1",)),
        BuildRecord.from_json({}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_", "VIRTUAL_ENV", "CONDA"))}
    env.update(UV_CACHE_DIR=str(tmp_path / "uv-cache"), UV_OFFLINE="1", UV_NO_PROGRESS="1")
    venv = tmp_path / "cpu"
    subprocess.run([uv_bin(), "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, env=env)
    subprocess.run([uv_bin(), "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"),
                    str(cpu_torch(tmp_path / "torch", "2.13.0"))], check=True, env=env)
    script = "\n".join([f"V={venv}", *block.splitlines()[1:]])
    result = subprocess.run(["bash", "-c", script], cwd=project, env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    assert result.returncode != 0, result.stdout + result.stderr
    assert "no channel for torch 2.13.0 in wheelhouse/channels/ (a CPU torch: none serves it)" in result.stderr
    assert "Resolved" not in result.stderr and "Collecting" not in result.stdout  # no installer ran
    listed = subprocess.run([uv_bin(), "pip", "list", "--python", str(venv / "bin" / "python")], env=env,
                            capture_output=True, text=True, check=True).stdout
    assert "causal-conv1d" not in listed and "torch" in listed
