"""The PEP 517 frontend of the builds on this machine: pypa/build's ProjectBuilder, no isolation.

ProjectBuilder runs in this process and reads pyproject.toml here; each backend hook it calls (an interpreter, the
in-process hook script, a control folder) is a command run through the ``BuildHost`` (the hook script and control
folder are named as mounts, for a host that runs commands elsewhere). So the hook calls, the log file, the progress
and the failure handling are the same for the pip and host toolchains. The docker toolchain builds with
cibuildwheel instead (toolchain/cibw.py: its ``BuildHost.build_wheel``).
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import build as pypa_build
import pyproject_hooks

from builder.toolchain.base import NO_MOUNTS, BuildHost, Mounts, WheelBuildFailed, WheelRequest


class HookRunner:
    """A pyproject_hooks runner: each hook call runs through ``host`` with the request's environment, its output
    appended to the request's log file and each line offered to ``on_line`` (the progress display)."""

    def __init__(self, host: BuildHost, request: WheelRequest, mounts: Mounts,
                 on_line: Callable[[str], None]) -> None:
        self.host = host
        self.request = request
        self.mounts = dict(mounts)
        self.on_line = on_line

    def __call__(self, cmd: Sequence[str], cwd: str | None = None,
                 extra_environ: Mapping[str, str] | None = None) -> None:
        env = {**self.request.env, **(extra_environ or {})}
        with self.request.log_file.open("a") as out:
            out.write(f"+ {' '.join(cmd)}\n")
            out.flush()
            result = self.host.run(cmd, env=env, cwd=Path(cwd) if cwd else None, mounts=self._mounts(cmd),
                                   network=False, out=out, on_line=self.on_line)
        if result.code != 0:
            raise subprocess.CalledProcessError(result.code, cmd)

    def _mounts(self, cmd: Sequence[str]) -> dict[Path, bool]:
        """The request's mounts plus what the hook's argv names: the in-process script (read-only) and the control
        folder its input and output JSON live in (writable)."""
        mounts = dict(self.mounts)
        for arg in cmd[1:]:
            path = Path(arg)
            if path.is_absolute() and path.exists():
                mounts.setdefault(path, path.is_file())
        return mounts


def pep517_wheel(request: WheelRequest, host: BuildHost, on_line: Callable[[str], None], *,
                 mounts: Mounts = NO_MOUNTS) -> Path:
    """Build ``request``'s wheel with ProjectBuilder, its hooks run by ``host``; WheelBuildFailed if none came out."""
    runner = HookRunner(host, request, mounts, on_line)
    try:
        project = pypa_build.ProjectBuilder(request.source_dir, python_executable=str(request.python), runner=runner)
        return Path(project.build("wheel", str(request.out_dir)))
    except (pypa_build.BuildException, pypa_build.BuildBackendException, subprocess.CalledProcessError,
            pyproject_hooks.BackendUnavailable) as e:
        raise WheelBuildFailed(str(e)) from e
