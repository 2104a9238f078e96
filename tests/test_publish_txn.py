"""Publishing as one transaction, tried the hard way: a real child process SIGKILLed at every rename and fsync of
a publish, a publish into a real 1 MiB tmpfs at every amount of free space, records that do not match their wheel,
pages that do not list it, a replace across arch sets, and a user's dot-files.

After every fault the wheelhouse, once opened again, is either the old state or the new one: every wheel listed
in the combined and the channel pages with the sha256 and size of its bytes, its record saying the same hash, no
temp file and no journal left. Byte comparisons compare sha256 digests, so a failure reports in a second."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from builder.core.errors import PublishError
from builder.index.layout import JOURNAL
from builder.index.store import Wheelhouse
from builder.index.txn import is_builder_temp
from builder.model.records import BuildRecord
from builder.stages.finalize import finalize_wheel
from tests.helpers import ROOT

LABEL = "cu130torch2.14"


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_wheel(tmp: Path, name: str, version: str, *, key: str, payload: int = 0, tag: str = "") -> Path:
    """A finalized wheel whose embedded build record carries ``key`` (as the pipeline's wheels do)."""
    raw = tmp / f"raw-{key}{tag}" / f"{name}-{version}-py3-none-any.whl"
    raw.parent.mkdir(parents=True, exist_ok=True)
    info = f"{name}-{version}.dist-info"
    with zipfile.ZipFile(raw, "w") as zf:
        zf.writestr(f"{name}/__init__.py", f"KEY = {key!r}\n")
        zf.writestr(f"{name}/blob.bin", os.urandom(payload))
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return finalize_wheel(raw, tmp / f"final-{key}{tag}", label=LABEL, pins=["torch>=2.14.0,<2.15"],
                          build_record=BuildRecord(cache_key=key))


def state(house: Wheelhouse) -> dict[str, str]:
    """The published wheels and their digests."""
    return {w.name: sha(w) for w in sorted(house.wheels.glob("*.whl"))} if house.wheels.is_dir() else {}


def snapshot(root: Path) -> dict[str, str]:
    """Every file's digest but the lock's and the builder's own temp files', as readers see them: through the
    ``simple`` and ``channels`` links into the live generation (the generations themselves left out)."""
    found = {}
    for folder, dirs, files in os.walk(root, followlinks=True):
        if Path(folder) == root:
            dirs[:] = [d for d in dirs if d != ".generations"]
        for name in files:
            path = Path(folder) / name
            if name != ".publish.lock" and not is_builder_temp(path):
                found[str(path.relative_to(root))] = sha(path)
    return dict(sorted(found.items()))


def assert_consistent(house: Wheelhouse) -> None:
    """Every wheel listed everywhere with its hash and size, nothing listed that is not there, records agree."""
    assert not (house.root / JOURNAL).exists(), "a journal is left"
    temps = [str(p) for p in house.root.rglob("*") if is_builder_temp(p)]
    assert not temps, f"temp files left: {temps}"
    generations = [p.name for p in (house.root / ".generations").iterdir() if p.name != "current"] \
        if (house.root / ".generations").is_dir() else []
    assert len(generations) <= 2 and all(g.isdigit() for g in generations), f"generations left: {generations}"
    wheels = {w.name: w for w in house.wheels.glob("*.whl")} if house.wheels.is_dir() else {}
    listed: dict[str, dict] = {}
    for page in [*house.simple.glob("*/index.json"), *house.channels.glob("*/simple/*/index.json")]:
        html_page = (page.parent / "index.html").read_text()
        for entry in json.loads(page.read_text())["files"]:
            name = entry["filename"]
            assert name in wheels, f"{page} lists {name}, which is not in wheels/"
            assert f"{name}#sha256={entry['hashes']['sha256']}" in html_page, f"{page.parent}/index.html disagrees"
            listed.setdefault(name, entry)
            assert entry["hashes"]["sha256"] == listed[name]["hashes"]["sha256"], f"two pages disagree on {name}"
    for name, wheel in wheels.items():
        assert name in listed, f"{name} is in wheels/ but in no page"
        digest = sha(wheel)
        assert listed[name]["hashes"]["sha256"] == digest, f"the pages list {name} with another sha256"
        assert listed[name]["size"] == wheel.stat().st_size, f"the pages list {name} with another size"
        project = name.split("-")[0]
        assert name in (house.channels / LABEL / "simple" / project / "index.html").read_text(), f"{name}: channel"
        record = json.loads((house.records / f"{name}.json").read_text())
        assert record["wheel_sha256"] == digest, f"the record of {name} is not of its bytes"
        sidecar = house.wheels / f"{name}.metadata"
        with zipfile.ZipFile(wheel) as zf:
            meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            assert hashlib.sha256(zf.read(meta)).hexdigest() == sha(sidecar), f"{name}: sidecar is not its METADATA"


# A child process doing one wheelhouse ``operation``, SIGKILLed at its ``kill_at``-th call of the os functions in
# ``steps`` (argv[1]); it prints how many calls it made.
CHILD = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    sys.path.insert(0, {root!r})
    from builder.index.store import Wheelhouse
    from builder.model.records import BuildRecord
    kill_at, count = int(sys.argv[1]), [0]
    def step(real):
        def hooked(*args, **kwargs):
            count[0] += 1
            if count[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)
        return hooked
    for name in {steps!r}:
        setattr(os, name, step(getattr(os, name)))
    house = Wheelhouse(Path({house!r}))
    {operation}
    print(count[0])
""")


@pytest.mark.heavy  # a killed publisher per rename and fsync, about 10 s each: the integration tier
@pytest.mark.parametrize("case", ["new file name", "same file name, other bytes"])
def test_sigkill_at_every_rename_and_fsync_leaves_the_old_or_the_new_state(tmp_path: Path, case: str) -> None:
    old_wheel = make_wheel(tmp_path, "demo", "1.0", key="old", payload=2000)
    new_wheel = (make_wheel(tmp_path, "other", "2.0", key="new", payload=3000) if case == "new file name"
                 else make_wheel(tmp_path, "demo", "1.0", key="new", payload=3000))
    assert sha(old_wheel) != sha(new_wheel)
    outcomes = {"old": 0, "new": 0}
    kill_at = 0
    while True:
        kill_at += 1
        root = tmp_path / f"wh{kill_at}"
        house = Wheelhouse(root)
        house.publish(old_wheel, BuildRecord.from_json({"cache_key": "old", "archs": ["90"]}))
        before_files, before = snapshot(root), state(house)
        script = CHILD.format(root=str(ROOT), steps=("replace", "fsync"), house=str(root),
                              operation=f"house.publish(Path({str(new_wheel)!r}), BuildRecord(cache_key='new', archs=('90',)))")
        child = subprocess.run([sys.executable, "-c", script, str(kill_at)], capture_output=True, text=True, check=False)
        if child.returncode == 0:
            break
        assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
        if not (root / JOURNAL).exists() and state(house) == before:  # killed before the commit point
            assert snapshot(root) == before_files, f"kill at step {kill_at}: files changed before the commit"
        Wheelhouse(root).recover()  # what any next builder command on it does first
        after = state(house)
        expected_new = {**({} if case != "new file name" else before), new_wheel.name: sha(new_wheel)}
        assert after in (before, expected_new), f"kill at step {kill_at}: neither the old nor the new state"
        outcome = "old" if after == before else "new"
        outcomes[outcome] += 1
        assert_consistent(house)
        found = house.find_record("new")
        assert (found is not None) == (outcome == "new"), f"kill at step {kill_at}: unchanged check says {found}"
        shutil.rmtree(root)
    print(f"{case}: killed at {kill_at - 1} steps, then completed: {outcomes}")
    assert kill_at > 15, f"only {kill_at} steps: the hook did not see the publish's renames and fsyncs"
    assert outcomes["old"] and outcomes["new"], outcomes
    assert_consistent(house)
    assert state(house)[new_wheel.name] == sha(new_wheel)


def _mount_tmpfs(mount: Path, size: str) -> None:
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True, check=False)
    if done.returncode:
        pytest.skip(f"skipped: cannot mount a tmpfs here (not root?): {done.stderr.decode().strip()}")


def _fill(mount: Path, leave: int) -> None:
    """Leave about ``leave`` bytes free on the tmpfs (in whole pages)."""
    st = os.statvfs(mount)
    free = st.f_bavail * st.f_frsize
    with open(mount / "filler", "wb") as f:
        f.write(b"\0" * max(0, free - leave))


@pytest.mark.parametrize("case", ["new file name", "same file name, other bytes"])
def test_full_disk_at_every_amount_of_free_space(tmp_path: Path, case: str) -> None:
    mount = tmp_path / "small"
    _mount_tmpfs(mount, "1m")
    old_wheel = make_wheel(tmp_path, "demo", "1.0", key="old", payload=20_000)
    new_wheel = (make_wheel(tmp_path, "other", "2.0", key="new", payload=60_000) if case == "new file name"
                 else make_wheel(tmp_path, "demo", "1.0", key="new", payload=60_000))
    outcomes = {"failed, nothing changed": 0, "published": 0}
    try:
        for leave_kib in range(0, 400, 4):  # tmpfs allocates whole 4 KiB pages
            shutil.rmtree(mount / "wh", ignore_errors=True)
            (mount / "filler").unlink(missing_ok=True)
            house = Wheelhouse(mount / "wh")
            house.publish(old_wheel, BuildRecord.from_json({"cache_key": "old", "archs": ["90"]}))
            before_files, before = snapshot(house.root), state(house)
            _fill(mount, leave_kib * 1024)
            try:
                house.publish(new_wheel, BuildRecord.from_json({"cache_key": "new", "archs": ["90"]}))
            except PublishError as e:
                assert "No space left on device" in e.message and "nothing was changed" in e.message, e.message
                assert snapshot(house.root) == before_files, f"{leave_kib} KiB free: failed, yet files changed"
                outcomes["failed, nothing changed"] += 1
            else:
                assert new_wheel.name in state(house)
                outcomes["published"] += 1
            assert_consistent(house)
            assert (house.find_record("new") is not None) == (state(house) != before)
            if outcomes["published"] >= 3:
                break
        print(f"{case}: {outcomes}, the last at {leave_kib} KiB free")
        assert outcomes["failed, nothing changed"] >= 5 and outcomes["published"], outcomes
        (mount / "filler").unlink()
        house.publish(new_wheel, BuildRecord.from_json({"cache_key": "new", "archs": ["90"]}))  # space again: the rerun publishes
        assert_consistent(house)
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_record_ahead_of_its_wheel_is_not_trusted(tmp_path: Path) -> None:
    """What a kill between the record's and the wheel's rename left before this change: the record of the new
    build beside the old build's bytes. The unchanged check must not say "unchanged" there."""
    house = Wheelhouse(tmp_path / "wh")
    wheel = make_wheel(tmp_path, "demo", "1.0", key="old")
    house.publish(wheel, BuildRecord.from_json({"cache_key": "old"}))
    record_path = house.records / f"{wheel.name}.json"
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps({**record, "cache_key": "new", "wheel_sha256": "0" * 64}))
    assert house.find_record("new") is None, "a record whose wheel_sha256 is not of the wheel's bytes was trusted"
    legacy = {k: v for k, v in record.items() if k != "wheel_sha256"}  # a record from before wheel_sha256
    record_path.write_text(json.dumps({**legacy, "cache_key": "new"}))
    assert house.find_record("new") is None, "the wheel's embedded cache key says old, the record new"
    record_path.write_text(json.dumps(legacy))
    assert house.find_record("old") is not None, "a legacy record that matches its wheel is still trusted"


def test_unchanged_check_heals_pages_that_do_not_list_the_wheel(tmp_path: Path) -> None:
    house = Wheelhouse(tmp_path / "wh")
    first = make_wheel(tmp_path, "demo", "1.0", key="a")
    second = make_wheel(tmp_path, "extra", "1.0", key="b")
    house.publish(first, BuildRecord.from_json({"cache_key": "a"}))
    house.publish(second, BuildRecord.from_json({"cache_key": "b"}))
    # what issue 17 case 1 left: a wheel in wheels/ that the pages do not name
    shutil.rmtree(house.simple / "extra")
    (house.channels / LABEL / "simple" / "index.json").unlink()
    found = house.find_record("b")
    assert found is not None and found[0].name == second.name
    assert_consistent(house)


def test_replacing_a_wheel_built_for_other_archs_needs_replace(tmp_path: Path) -> None:
    house = Wheelhouse(tmp_path / "wh")
    sm90 = make_wheel(tmp_path, "demo", "1.0", key="a", payload=100)
    sm120 = make_wheel(tmp_path, "demo", "1.0", key="b", payload=200)
    house.publish(sm90, BuildRecord.from_json({"cache_key": "a", "archs": ["90"]}))
    before = snapshot(house.root)
    with pytest.raises(PublishError, match=r"built for 90, this build is for 120") as caught:
        house.publish(sm120, BuildRecord.from_json({"cache_key": "b", "archs": ["120"]}))
    assert "--replace" in caught.value.one_line() and "\n" not in caught.value.one_line()
    assert snapshot(house.root) == before, "a refused replace changed the wheelhouse"
    staged = house.staging()
    with pytest.raises(PublishError, match="built for 90, this build is for 120"):
        staged.publish(sm120, BuildRecord.from_json({"cache_key": "b", "archs": ["120"]}))  # staging checks the published wheel too
    house.publish(sm120, BuildRecord.from_json({"cache_key": "b", "archs": ["120"]}), replace=True)
    assert state(house) == {sm120.name: sha(sm120)}
    house.publish(sm120, BuildRecord.from_json({"cache_key": "b", "archs": ["120"]}))  # the same arch set again: no question
    assert_consistent(house)


def test_replace_flag_is_on_build() -> None:
    from builder.cli.main import build_parser

    args = build_parser().parse_args(["build", "tinyext", "--replace"])
    assert args.replace is True


def test_publish_leaves_the_users_dot_files_alone(tmp_path: Path) -> None:
    house = Wheelhouse(tmp_path / "wh")
    house.root.mkdir()
    foreign = {house.root / ".nojekyll": b"", house.root / ".htaccess": b"Options -Indexes\n",
               house.root / "wheels" / ".keep": b"x", house.root / "simple" / ".hidden.json": b"{}"}
    for path, data in foreign.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    house.publish(make_wheel(tmp_path, "demo", "1.0", key="a"), BuildRecord.from_json({"cache_key": "a"}))
    house.rebuild_index()
    house.remove("demo-1.0+cu130torch2.14-py3-none-any.whl")
    for path, data in foreign.items():
        assert path.is_file() and sha(path) == hashlib.sha256(data).hexdigest(), f"{path.name} was touched"
