"""What readers see while a wheelhouse is published (issue 30, item 5): the pages switch by generations.

A reader that reads the index as pip does (tests/index_reader.py: every page, every listed file and sidecar by the
URL a resolver joins, its sha256 against the fragment) runs between every two steps of a publish (every rename,
fsync, unlink, rmdir and symlink the builder makes), in-process; after a SIGKILL at any of them, before anything
recovers; and (integration tier) in a loop of its own, with rounds of real `pip download`, while publishes are
killed at every step 100 times. It must never fail. Also: a wheelhouse of the older layout (or a copy whose links
were dereferenced, as the Pages artifact is) is adopted without a reader seeing a gap, generations are pruned to
two, and a read-only wheelhouse is one line."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from builder.core.errors import PublishError
from builder.index.layout import JOURNAL
from builder.index.store import Wheelhouse
from builder.model.records import BuildRecord
from tests.helpers import ROOT, assert_one_line_error, run_cli
from tests.index_reader import Inconsistent, read_index
from tests.test_publish_txn import CHILD, LABEL, assert_consistent, make_wheel, sha, state

STEPS = ("replace", "rename", "fsync", "unlink", "rmdir", "symlink")


@contextmanager
def reader_between_every_step(root: Path) -> Iterator[tuple[dict[str, int], list[str]]]:
    """Run ``read_index(root)`` before every rename, fsync, unlink, rmdir and symlink of this process."""
    seen, failures, busy = {"steps": 0, "files": 0}, [], [False]
    real = {name: getattr(os, name) for name in STEPS}

    def hooked(name: str) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            if not busy[0]:
                busy[0] = True
                try:
                    seen["steps"] += 1
                    seen["files"] += read_index(root)
                except Inconsistent as e:
                    failures.append(f"step {seen['steps']} (before os.{name}{args[:2]!r}): {e}")
                finally:
                    busy[0] = False
            return real[name](*args, **kwargs)
        return call

    for name in STEPS:
        setattr(os, name, hooked(name))
    try:
        yield seen, failures
    finally:
        for name, function in real.items():
            setattr(os, name, function)


def record(key: str) -> BuildRecord:
    return BuildRecord.from_json({"cache_key": key, "archs": ["90"]})


@pytest.fixture
def wheels(tmp_path: Path) -> dict[str, Path]:
    return {
        "demo": make_wheel(tmp_path, "demo", "1.0", key="old", payload=2000),
        "demo-new": make_wheel(tmp_path, "demo", "1.0", key="new", payload=3000),
        "other": make_wheel(tmp_path, "other", "2.0", key="other", payload=1000),
        "keep": make_wheel(tmp_path, "keep", "3.0", key="keep", payload=500),
    }


def published(root: Path, wheels: dict[str, Path]) -> Wheelhouse:
    house = Wheelhouse(root)
    house.publish(wheels["keep"], record("keep"))
    house.publish(wheels["demo"], record("old"))
    return house


OPERATIONS: dict[str, Callable[[Wheelhouse, dict[str, Path]], None]] = {
    "publish a new file name": lambda h, w: h.publish(w["other"], record("other")),
    "publish the same file name, other bytes": lambda h, w: h.publish(w["demo-new"], record("new")),
    "remove": lambda h, w: h.remove(w["demo"].name),
    "rebuild": lambda h, w: h.rebuild_index(),
    "write a record": lambda h, w: h.write_record(w["demo"].name, record("old").with_(archs=("90", "120"))),
}


@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_a_reader_between_every_two_steps_sees_every_listed_file_with_its_hash(
        tmp_path: Path, wheels: dict[str, Path], operation: str) -> None:
    house = published(tmp_path / "wh", wheels)
    assert read_index(house.root) == 8  # 2 wheels + 2 sidecars, in simple/ and in the channel
    with reader_between_every_step(house.root) as (seen, failures):
        OPERATIONS[operation](house, wheels)
    assert not failures, f"{len(failures)} of {seen['steps']} steps: " + "\n".join(failures[:5])
    assert seen["steps"] > 10 and seen["files"] > 40, seen
    assert_consistent(house)
    read_index(house.root)
    if operation == "publish the same file name, other bytes":
        assert state(house)[wheels["demo"].name] == sha(wheels["demo-new"])
    print(f"{operation}: {seen['steps']} steps, {seen['files']} files checked, 0 failures")


def test_generations_are_switched_by_one_rename_and_pruned_to_two(tmp_path: Path, wheels: dict[str, Path]) -> None:
    house = published(tmp_path / "wh", wheels)
    gens = house.root / ".generations"
    assert os.readlink(house.root / "simple") == ".generations/current/simple"
    assert os.readlink(house.root / "channels") == ".generations/current/channels"
    for _ in range(3):
        house.publish(wheels["other"], record("other"))
    numbers = sorted(int(p.name) for p in gens.iterdir() if p.name.isdigit())
    assert len(numbers) == 2 and os.readlink(gens / "current") == str(numbers[-1]), numbers
    assert house.index_url().endswith("/wh/simple") and ".generations" not in house.channel_url(LABEL)
    assert not [p for p in gens.iterdir() if p.name.startswith(".")], "a temp link is left"


def dereferenced_copy(house: Wheelhouse, dest: Path) -> Wheelhouse:
    """What the Pages artifact (tar --dereference) and a plain `cp -rL` make of a wheelhouse: every link a folder."""
    shutil.copytree(house.root, dest, symlinks=False)
    return Wheelhouse(dest)


@pytest.mark.parametrize("shape", ["older layout", "dereferenced copy"])
def test_a_wheelhouse_with_real_page_folders_is_adopted_without_a_gap(
        tmp_path: Path, wheels: dict[str, Path], shape: str) -> None:
    house = dereferenced_copy(published(tmp_path / "wh", wheels), tmp_path / "copy")
    (house.simple / ".nojekyll").write_bytes(b"")
    if shape == "older layout":
        shutil.rmtree(house.root / ".generations")
    assert not house.simple.is_symlink()
    with reader_between_every_step(house.root) as (seen, failures):
        house.publish(wheels["other"], record("other"))
    assert not failures, "\n".join(failures[:5])
    assert house.simple.is_symlink() and house.channels.is_symlink()
    assert (house.simple / ".nojekyll").is_file(), "the user's dot-file in simple/ was lost"
    assert_consistent(house)
    assert not (house.root / ".generations" / "current").is_dir() or (house.root / ".generations" / "current").is_symlink()


CHILD_OPERATIONS = {
    "publish a new file name": "house.publish(Path({other!r}), BuildRecord(cache_key='other', archs=('90',)))",
    "publish the same file name, other bytes":
        "house.publish(Path({new!r}), BuildRecord(cache_key='new', archs=('90',)))",
    "remove": "house.remove({demo_name!r})",
}


def child_script(house: Path, wheels: dict[str, Path], operation: str) -> str:
    op = CHILD_OPERATIONS[operation].format(other=str(wheels["other"]), new=str(wheels["demo-new"]),
                                            demo_name=wheels["demo"].name)
    return CHILD.format(root=str(ROOT), steps=STEPS, house=str(house), operation=op)


def kill_at_every_step(tmp_path: Path, wheels: dict[str, Path], operation: str, *, reset: Callable[[Path], None],
                       after_kill: Callable[[Path, int], None]) -> int:
    """SIGKILL a child doing ``operation`` at step 1, 2, … until it completes; ``after_kill`` sees each wheelhouse
    as the kill left it; ``reset`` makes the starting state. Returns the number of kills."""
    kill_at = 0
    while True:
        kill_at += 1
        root = tmp_path / "wh"
        reset(root)
        script = child_script(root, wheels, operation)
        child = subprocess.run([sys.executable, "-c", script, str(kill_at)], capture_output=True, text=True, check=False)
        if child.returncode == 0:
            return kill_at - 1
        assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
        after_kill(root, kill_at)


@pytest.mark.heavy  # a killed child per step, about 0.3 s each
@pytest.mark.parametrize("operation", list(CHILD_OPERATIONS))
def test_after_a_sigkill_at_any_step_readers_see_a_whole_generation_before_anything_recovers(
        tmp_path: Path, wheels: dict[str, Path], operation: str) -> None:
    pristine = tmp_path / "pristine"
    published(pristine, wheels)

    def reset(root: Path) -> None:
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(pristine, root, symlinks=True)

    outcomes = {"journal left": 0, "no journal": 0}

    def after_kill(root: Path, kill_at: int) -> None:
        outcomes["journal left" if (root / JOURNAL).exists() else "no journal"] += 1
        try:
            read_index(root)  # before any recovery: what a static server or Pages shows now
        except Inconsistent as e:
            raise AssertionError(f"{operation}, killed at step {kill_at}: {e}") from None
        Wheelhouse(root).recover()
        assert_consistent(Wheelhouse(root))

    kills = kill_at_every_step(tmp_path, wheels, operation, reset=reset, after_kill=after_kill)
    print(f"{operation}: {kills} kills, {outcomes}, the reader never failed")
    assert kills > 10 and outcomes["journal left"] and outcomes["no journal"], outcomes


def _mount_read_only(source: Path, mount: Path) -> None:
    mount.mkdir()
    for argv in (["mount", "--bind", str(source), str(mount)], ["mount", "-o", "remount,ro,bind", str(mount)]):
        done = subprocess.run(argv, capture_output=True, check=False)
        if done.returncode:
            subprocess.run(["umount", str(mount)], capture_output=True, check=False)
            pytest.skip(f"skipped: cannot make a read-only bind mount here: {done.stderr.decode().strip()}")


def test_a_read_only_wheelhouse_is_one_line_naming_it_and_the_cure(tmp_path: Path, wheels: dict[str, Path]) -> None:
    house = published(tmp_path / "wh", wheels)
    (house.root / ".publish.lock").unlink(missing_ok=True)  # as the nightly leaves it, and as a copy may come
    mount = tmp_path / "ro"
    _mount_read_only(house.root, mount)
    try:
        with pytest.raises(PublishError) as caught:
            Wheelhouse(mount).find_record("keep")
        line = caught.value.one_line()
        assert str(mount) in line and "writable --wheelhouse" in line and "\n" not in line, line
        result = run_cli("index", "rebuild", "--wheelhouse", str(mount), timeout=120)
        assert_one_line_error(result, str(mount), "writable --wheelhouse")
        assert read_index(mount) == 8, "the read-only wheelhouse is still a readable index"
    finally:
        subprocess.run(["umount", str(mount)], check=False)


# ---------------------------------------------------------------------- the integration tier: readers in a loop


PIP_ROUND = """
import subprocess, sys, time, json, pathlib, shutil
index, stop, out, dest, wanted = sys.argv[1:6]
counts = {"ok": 0, "failed": []}
while not pathlib.Path(stop).exists():
    shutil.rmtree(dest, ignore_errors=True)
    done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-cache-dir", "--quiet",
                           "--disable-pip-version-check", "--index-url", index, "-d", dest, wanted],
                          capture_output=True, text=True)
    if done.returncode == 0:
        counts["ok"] += 1
    else:
        counts["failed"].append(done.stderr[-600:])
pathlib.Path(out).write_text(json.dumps(counts))
"""


@pytest.mark.heavy  # about 100 killed children with a reader and pip running beside them: minutes
def test_100_kills_during_publish_with_a_reader_and_pip_in_a_loop(tmp_path: Path, wheels: dict[str, Path]) -> None:
    """One wheelhouse, publishes (a new name, the same name with other bytes, a removal) killed at every step,
    each followed by the recovery any next builder command does; meanwhile a page/hash reader and `pip download`
    of the wheel nobody touches (``keep``) run in loops of their own. Neither may ever fail."""
    root = tmp_path / "wh"
    published(root, wheels)
    stop, reader_out, pip_out = tmp_path / "stop", tmp_path / "reader.json", tmp_path / "pip.json"
    reader = subprocess.Popen([sys.executable, str(ROOT / "tests" / "index_reader.py"), str(root), str(stop),
                               str(reader_out)], cwd=ROOT)
    pip = subprocess.Popen([sys.executable, "-c", PIP_ROUND, (root / "simple").as_uri() + "/", str(stop),
                            str(pip_out), str(tmp_path / "dl"), "keep==3.0"])
    kills, started = 0, time.monotonic()
    try:
        for operation in [*CHILD_OPERATIONS, *CHILD_OPERATIONS]:
            for kill_at in range(1, 200):
                if kills >= 100:
                    break
                _prepare(Wheelhouse(root), wheels, operation)
                script = child_script(root, wheels, operation)
                child = subprocess.run([sys.executable, "-c", script, str(kill_at)], capture_output=True, text=True,
                                       check=False)
                if child.returncode == 0:
                    break
                assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
                kills += 1
                Wheelhouse(root).recover()
                assert_consistent(Wheelhouse(root))
    finally:
        stop.touch()
        reader.wait(timeout=120)
        pip.wait(timeout=300)
    took = time.monotonic() - started
    rounds, pips = json.loads(reader_out.read_text()), json.loads(pip_out.read_text())
    print(f"{kills} kills in {took:.0f} s; reader: {rounds['rounds']} rounds, {rounds['files']} files checked, "
          f"{rounds['straddled']} rounds straddled a switch (retried), {len(rounds['failures'])} failures; "
          f"pip download: {pips['ok']} ok, {len(pips['failed'])} failed")
    assert kills == 100
    assert not rounds["failures"], rounds["failures"][:5]
    assert not pips["failed"], pips["failed"][:3]
    assert rounds["rounds"] > 100 and pips["ok"] > 5, (rounds, pips)


def _prepare(house: Wheelhouse, wheels: dict[str, Path], operation: str) -> None:
    """The starting state each operation needs: ``demo`` with its old bytes, ``other`` absent."""
    if wheels["other"].name in state(house):
        house.remove(wheels["other"].name)
    if state(house).get(wheels["demo"].name) != sha(wheels["demo"]):
        house.publish(wheels["demo"], record("old"))
