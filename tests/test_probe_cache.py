"""Issue 55 item 5: the env probe's answer is kept, keyed by the env's fingerprint (user/probecache.py), so a
repeat ``builder doctor`` on an unchanged env does not import torch and transformers again; a changed env (a
package installed, one reinstalled at the same version, a variable the probe reads, the probe script) is probed
again, and so is any env with ``--refresh``. A real venv of this Python, a stand-in torch written into it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from builder.core.uvtool import uv_bin
from builder.user import envprobe, probecache
from builder.user.envprobe import PackageSpec, probe_env
from tests.helpers import run_cli

CAUSAL = PackageSpec("causal-conv1d", ("causal_conv1d",))


def write_dist(site: Path, name: str, version: str, code: str) -> Path:
    """``name`` as an installer leaves it: the module and a ``.dist-info`` folder; returns that folder."""
    module = name.replace("-", "_")
    (site / module).mkdir(exist_ok=True)
    (site / module / "__init__.py").write_text(code)
    info = site / f"{module}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "RECORD").write_text(f"{module}/__init__.py,,\n{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    return info


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A venv of this Python holding a stand-in CPU torch 2.14.1 (no transformers): the probe takes ~0.2 s."""
    folder = tmp_path / "venv"
    subprocess.run([uv_bin(), "venv", "-q", "--python", sys.executable, str(folder)], check=True)
    site = next(folder.glob("lib/python*/site-packages"))
    write_dist(site, "torch", "2.14.1", "__version__ = '2.14.1+cpu'\nclass version:\n    cuda = None\n"
               "class cuda:\n    is_available = staticmethod(lambda: False)\n"
               "    get_arch_list = staticmethod(lambda: [])\n")
    return folder / "bin" / "python"


def site_of(python: Path) -> Path:
    return next(python.parent.parent.glob("lib/python*/site-packages"))


class NoProbe(Exception):
    pass


def no_probe_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """From here on, running the probe script fails the test (asking sys.path for the fingerprint is allowed)."""
    real = envprobe.run_small

    def guarded(argv: list[str], **kw: object) -> object:
        if any(a.endswith("env.py") for a in argv):
            raise NoProbe(argv)
        return real(argv, **kw)  # type: ignore[arg-type]
    monkeypatch.setattr(envprobe, "run_small", guarded)


def test_an_unchanged_env_is_read_back_without_probing(venv: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    memo = tmp_path / "memo"
    first = probe_env(venv, [CAUSAL], memo=memo)
    assert first.cached_at is None and first.torch.version == "2.14.1+cpu"
    assert len(list(memo.glob("envprobe-*.json"))) == 1
    monkeypatch.chdir(tmp_path)  # the current folder is no part of the fingerprint
    (tmp_path / "doctor.out").write_text("written where doctor runs")
    no_probe_allowed(monkeypatch)
    again = probe_env(venv, [CAUSAL], memo=memo)
    assert again.cached_at is not None
    assert again.torch == first.torch and again.packages == first.packages and again.python == first.python
    with pytest.raises(NoProbe):  # without a memo, and with refresh, the probe runs
        probe_env(venv, [CAUSAL])
    with pytest.raises(NoProbe):
        probe_env(venv, [CAUSAL], memo=memo, refresh=True)


def test_a_changed_env_is_probed_again(venv: Path, tmp_path: Path) -> None:
    memo, site = tmp_path / "memo", site_of(venv)
    assert not probe_env(venv, [CAUSAL], memo=memo).package("causal-conv1d").installed
    info = write_dist(site, "causal-conv1d", "1.7.0", "")  # installed
    now = probe_env(venv, [CAUSAL], memo=memo)
    assert now.cached_at is None and now.package("causal-conv1d").version == "1.7.0"
    assert probe_env(venv, [CAUSAL], memo=memo).cached_at is not None
    shutil.rmtree(info)  # reinstalled at the same version: a new .dist-info folder
    (site / "causal_conv1d" / "__init__.py").write_text("raise ImportError('rebuilt wrong')\n")
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: causal-conv1d\nVersion: 1.7.0\n")
    (info / "RECORD").write_text("causal_conv1d/__init__.py,,\n")
    reinstalled = probe_env(venv, [CAUSAL], memo=memo)
    assert reinstalled.cached_at is None
    assert not reinstalled.package("causal-conv1d").imports_ok  # the new answer, not the kept one
    shutil.rmtree(info)
    shutil.rmtree(site / "causal_conv1d")  # uninstalled
    gone = probe_env(venv, [CAUSAL], memo=memo)
    assert gone.cached_at is None and not gone.package("causal-conv1d").installed


def test_what_the_probe_reads_besides_the_files_counts(venv: Path, tmp_path: Path) -> None:
    memo = tmp_path / "memo"
    probe_env(venv, [CAUSAL], memo=memo)
    assert probe_env(venv, [CAUSAL], memo=memo).cached_at is not None
    seen = {**os.environ, "CUDA_VISIBLE_DEVICES": "1"}
    assert probe_env(venv, [CAUSAL], memo=memo, env=seen).cached_at is None  # another variable the probe reads
    assert probe_env(venv, [CAUSAL], memo=memo, env=seen).cached_at is not None
    assert probe_env(venv, [CAUSAL, PackageSpec("fla-core")], memo=memo).cached_at is None  # other packages asked
    extra = tmp_path / "extra"
    extra.mkdir()
    on_path = {**os.environ, "PYTHONPATH": str(extra)}
    probe_env(venv, [CAUSAL], memo=memo, env=on_path)
    write_dist(extra, "causal-conv1d", "1.6.0", "")  # a package on PYTHONPATH is a sys.path folder too
    found = probe_env(venv, [CAUSAL], memo=memo, env=on_path)
    assert found.cached_at is None and found.package("causal-conv1d").version == "1.6.0"


def test_a_kept_answer_is_dropped_when_old_or_damaged_or_of_another_probe(venv: Path, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    memo = tmp_path / "memo"
    probe_env(venv, [CAUSAL], memo=memo)
    (entry,) = memo.glob("envprobe-*.json")
    data = json.loads(entry.read_text())
    entry.write_text(json.dumps({**data, "at": data["at"] - probecache.MAX_AGE_S - 1}))  # a day old
    assert probe_env(venv, [CAUSAL], memo=memo).cached_at is None
    entry.write_text("{not json")
    assert probe_env(venv, [CAUSAL], memo=memo).cached_at is None
    assert probe_env(venv, [CAUSAL], memo=memo).cached_at is not None  # written over
    entry.write_text(json.dumps({**json.loads(entry.read_text()), "output": '{"python": 1}'}))  # not parseable
    assert probe_env(venv, [CAUSAL], memo=memo).cached_at is None
    changed = tmp_path / "env.py"  # a builder whose probe script differs: its answers are not this one's
    changed.write_bytes(envprobe.script("env").read_bytes() + b"\n# changed\n")
    monkeypatch.setattr(envprobe, "script", lambda name: changed)
    assert probe_env(venv, [CAUSAL], memo=memo).cached_at is None


def test_doctor_says_it_reused_the_answer_and_refresh_probes(venv: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    args = ("doctor", "--python", str(venv), "--cache-dir", str(cache), "--from", str(tmp_path / "none"))
    first = run_cli(*args)
    assert first.code == 0, first.stderr
    assert "this answer was kept" not in first.stdout
    second = run_cli(*args)
    assert second.code == 0 and "this answer was kept (the env is unchanged since); --refresh probes again" in \
        second.stdout
    assert "2.14.1+cpu: a CPU build" in second.stdout
    fresh = run_cli(*args, "--refresh")
    assert fresh.code == 0 and "this answer was kept" not in fresh.stdout
    assert json.loads(run_cli(*args, "--json").stdout)["env"]["cached_at"] is not None
