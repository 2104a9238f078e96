"""Faults: a process killed (SIGKILL) mid-download or mid-publish, and a full disk during publish, leave the
wheelhouse valid and unchanged, and the next run recovers by itself."""

from __future__ import annotations

import hashlib
import http.server
import os
import signal
import subprocess
import sys
import tarfile
import textwrap
import threading
import time
import zipfile
from pathlib import Path

import pytest

from builder.core.errors import PublishError
from builder.core.fsutil import sha256_file
from builder.core.settings import Settings
from builder.index.store import Wheelhouse
from builder.model.records import BuildRecord
from builder.stages.finalize import finalize_wheel
from builder.stages.resolve import SourceRef
from builder.stages.source import fetch
from tests.helpers import ROOT


def make_wheel(tmp: Path, name: str, version: str, payload: int = 0) -> Path:
    raw = tmp / "raw" / f"{name}-{version}-py3-none-any.whl"
    raw.parent.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(raw, "w") as zf:
        zf.writestr(f"{name}/__init__.py", "")
        zf.writestr(f"{name}/blob.bin", os.urandom(payload))
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return finalize_wheel(raw, tmp / "final", label="cu130torch2.14", pins=["torch>=2.14.0,<2.15"],
                          build_record=BuildRecord())


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(root: Path) -> dict[str, str]:
    """Digests, not bytes: a failing comparison reports in a second instead of diffing binary blobs. Files as
    readers see them: through the ``simple``/``channels`` links into the live page generation (docs/INDEX.md)."""
    found = {}
    for folder, dirs, files in os.walk(root, followlinks=True):
        if Path(folder) == root:
            dirs[:] = [d for d in dirs if d != ".generations"]
        found.update({str((Path(folder) / f).relative_to(root)): digest(Path(folder) / f)
                      for f in files if f != ".publish.lock"})
    return dict(sorted(found.items()))


def test_sigkill_during_publish_leaves_wheelhouse_unchanged_and_next_run_recovers(tmp_path: Path) -> None:
    house = Wheelhouse(tmp_path / "wh")
    house.publish(make_wheel(tmp_path, "first", "1.0"), BuildRecord.from_json({"cache_key": "a"}))
    before = snapshot(house.root)
    second = make_wheel(tmp_path, "second", "1.0", payload=1 << 20)
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(ROOT)!r})
        import builder.index.store as pub
        real = os.replace
        def dying_replace(src, dst):
            if str(dst).endswith(".whl"):
                os.kill(os.getpid(), signal.SIGKILL)   # killed after the temp copy, before the rename
            return real(src, dst)
        pub.os.replace = dying_replace
        pub.Wheelhouse(pub.Path({str(house.root)!r})).publish(pub.Path({str(second)!r}), pub.BuildRecord(cache_key="b"))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert result.returncode == -signal.SIGKILL
    leftovers = [p for p in house.root.rglob(".*") if p.is_file() and p.name != ".publish.lock"]
    assert leftovers, "the killed publisher left its temp file behind (that is what the next run must clean)"
    after = snapshot(house.root)
    assert not any(k.startswith("wheels/second") and k.endswith(".whl") for k in after)
    for page in ("simple/index.html", "simple/first/index.html"):
        assert after[page] == before[page], f"{page} changed although the publish died"
    # the next run takes the (free) lock, sweeps the stale temp files and publishes normally
    house.publish(second, BuildRecord.from_json({"cache_key": "b"}))
    assert digest(house.wheels / second.name) == digest(second), "the published wheel is not the one given"
    assert not [p for p in house.root.rglob(".*") if p.is_file() and p.name != ".publish.lock"]
    assert "second" in (house.simple / "index.html").read_text()


def test_full_disk_during_publish(tmp_path: Path) -> None:
    mount = tmp_path / "small"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("skipped: cannot mount a small tmpfs here (not root?)")
    try:
        house = Wheelhouse(mount / "wh")
        house.publish(make_wheel(tmp_path, "small", "1.0"), BuildRecord.from_json({"cache_key": "a"}))
        before = snapshot(house.root)
        with pytest.raises(PublishError, match="No space left on device"):
            house.publish(make_wheel(tmp_path, "huge", "1.0", payload=2 << 20), BuildRecord.from_json({"cache_key": "b"}))
        after = snapshot(house.root)
        assert not [k for k in after if "huge" in k], "nothing of the failed wheel is left (wheel, sidecar, record)"
        assert after == before
        assert {k: v for k, v in after.items() if k.startswith("simple/")} == \
            {k: v for k, v in before.items() if k.startswith("simple/")}
        assert not [p for p in house.root.rglob(".*") if p.is_file() and p.name != ".publish.lock"]
    finally:
        subprocess.run(["umount", str(mount)], check=False)


class _SlowHandler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self) -> None:
        data = Path(self.server.payload).read_bytes()  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        for i in range(0, len(data), 4096):
            self.wfile.write(data[i:i + 4096])
            time.sleep(0.01)

    def log_message(self, *args: object) -> None:
        pass


def test_sigkill_during_download_then_recovery(tmp_path: Path) -> None:
    archive = tmp_path / "pkg-1.0.tar.gz"
    blob = tmp_path / "blob"
    blob.write_bytes(os.urandom(600_000))
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(blob, arcname="pkg-1.0/blob")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _SlowHandler)
    server.payload = str(archive)  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/pkg-1.0.tar.gz"
    digest = sha256_file(archive)
    cache = tmp_path / "cache"
    script = textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(ROOT)!r})
        from pathlib import Path
        from builder.core.settings import Settings
        from builder.stages.resolve import SourceRef
        from builder.stages.source import fetch
        s = Settings(cache_dir=Path({str(cache)!r}), wheelhouse=Path("/nonexistent"), recipes_dir=Path("."), patches_dir=Path("."))
        fetch(SourceRef("url", {url!r}, "pkg-1.0.tar.gz", {digest!r}), s)
    """)
    try:
        proc = subprocess.Popen([sys.executable, "-c", script])
        def part_started() -> bool:
            return any(p.stat().st_size > 0 for p in (cache / "sources").rglob(".pkg-1.0.tar.gz.part"))
        deadline = time.monotonic() + 30
        while not part_started() and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert not list((cache / "sources").rglob("pkg-1.0.tar.gz")), "a partial download is never under the real name"
        settings = Settings(cache_dir=cache, wheelhouse=tmp_path / "wh", recipes_dir=tmp_path, patches_dir=tmp_path)
        path, got = fetch(SourceRef("url", url, "pkg-1.0.tar.gz", digest), settings)
        assert got == digest and sha256_file(path) == sha256_file(archive), "the cached archive differs"
    finally:
        server.shutdown()


def test_no_shell_anywhere() -> None:
    """Recipe values and flags reach subprocesses as argv lists, never as shell text."""
    offenders = [str(p) for p in (ROOT / "builder").rglob("*.py")
                 if "shell=True" in p.read_text() or "os.system(" in p.read_text()]
    assert offenders == []
