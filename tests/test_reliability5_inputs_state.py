"""Trusted inputs that crashed (issue 54 item 5): an interpreter's answer to the probe, the builder's own state files
(cache entries, a wheelhouse's records and journal), SOURCE_DATE_EPOCH, a variant record's properties. Real
interpreters (shell scripts standing in for odd ones), real files, fifos and folders."""

from __future__ import annotations

import json
import os
import re
import time
import zipfile
from pathlib import Path

import pytest

from builder.core.cachedir import VENV_MARKER, clean
from builder.core.errors import PublishError, ToolchainError, UsageError
from builder.core.filememo import remembered
from builder.core.settings import Settings
from builder.core.smallrun import run_small
from builder.core.statefile import StateFileError, read_json, read_json_or_none, want
from builder.core.wheelfile import EPOCH_MAX, EPOCH_MIN, source_date_epoch, write_wheel
from builder.index.layout import JOURNAL
from builder.index.store import DamagedRecord, Wheelhouse
from builder.index.txn import replay
from builder.model.records import RecordShapeError, check_record_json
from builder.stages.pyenv import probe
from builder.user.envprobe import probe_env


def _script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


ANSWERS = {
    "not JSON": ("echo hello", "is not a JSON object: hello"),
    "a list": ("echo '[1, 2]'", "is not a JSON object: [1, 2]"),
    "a number for version": ("""echo '{"version": 3}'""", "has field 'version' int '3', not a string"),
    "no executable": ("""echo '{"version": "3.12", "torch": null}'""", "has field 'executable' missing"),
    "torch a list": ("""echo '{"version": "3.12", "executable": "/x", "purelib": "/y", "torch": [1], """
                     """"torch_cuda": null}'""", "has field 'torch' list '[1]', not a string or null"),
    "odd version": ("""echo '{"version": "three", "executable": "/x", "purelib": "/y", "torch": "2.9.0", """
                    """"torch_cuda": null}'""", "names version 'three', not MAJOR.MINOR"),
    "deep nesting": ("python3 -c 'print(\"{\" + \"[\" * 100000)'", "is not a JSON object"),
}


@pytest.mark.parametrize("case", sorted(ANSWERS))
def test_an_odd_probe_answer_is_one_line(tmp_path: Path, case: str) -> None:
    body, said = ANSWERS[case]
    python = _script(tmp_path, "python", body)
    with pytest.raises(ToolchainError) as e:
        probe(python, need_torch=True)
    assert said in str(e.value) and str(python) in str(e.value) and "\n" not in str(e.value)


def test_an_interpreter_that_floods_stdout_is_stopped(tmp_path: Path) -> None:
    """Before: the whole output was read (MemoryError at 6.2 GB); now at most 1 MiB is kept and the process is
    killed. One line with no newline at all, too."""
    for body in ("exec yes '{'", "exec tr '\\0' '{' < /dev/zero"):
        python = _script(tmp_path, "python", body)
        started = time.monotonic()
        with pytest.raises(ToolchainError, match=r"printed more than 1048576 bytes answering the environment probe"):
            probe(python, need_torch=True)
        assert time.monotonic() - started < 2


def test_the_doctor_probe_is_bounded_too(tmp_path: Path) -> None:
    python = _script(tmp_path, "python", "exec yes")
    with pytest.raises(ToolchainError, match="printed more than"):
        probe_env(python)
    python = _script(tmp_path, "python", "echo '[1]'")
    with pytest.raises(ToolchainError, match="the environment probe's answer is unreadable"):
        probe_env(python)


def test_run_small_keeps_stderr_apart_and_times_out(tmp_path: Path) -> None:
    ran = run_small(["sh", "-c", "echo out; echo err >&2; exit 3"], merge=False)
    assert (ran.code, ran.output, ran.errors) == (3, "out\n", "err\n")
    ran = run_small(["sleep", "5"], timeout_s=0.2)
    assert ran.timed_out and ran.code is None


# ---------------------------------------------------------------------------------------------- state files

def _damage(path: Path, how: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if how == "fifo":
        os.mkfifo(path)
    elif how == "folder":
        path.mkdir()
    elif how == "binary":
        path.write_bytes(b"\xff\xfe\x00garbage")
    elif how == "truncated":
        path.write_text('{"stamps": [1, 2')
    elif how == "deep":
        path.write_text("[" * 100_000)
    elif how == "list":
        path.write_text("[1, 2]")
    elif how == "dangling":
        path.symlink_to(path.parent / "nowhere")


DAMAGE = ["fifo", "folder", "binary", "truncated", "deep", "list", "dangling"]


@pytest.mark.parametrize("how", DAMAGE)
def test_a_damaged_memo_entry_is_asked_again(tmp_path: Path, how: str) -> None:
    """core/filememo.py: a fifo at an entry's path hung the build (read_text blocks for a writer)."""
    program = tmp_path / "prog"
    program.write_bytes(b"\x7fELF not a script")
    memo = tmp_path / "memo"
    assert remembered(memo, "x", [program], ["--version"], lambda: "one") == "one"
    (entry,) = memo.iterdir()
    entry.unlink()
    _damage(entry, how)
    started = time.monotonic()
    assert remembered(memo, "x", [program], ["--version"], lambda: "two") == "two"
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("how", ["fifo", "folder", "binary", "truncated", "deep"])
def test_read_json_names_the_file_and_never_opens_a_fifo(tmp_path: Path, how: str) -> None:
    path = tmp_path / "state.json"
    _damage(path, how)
    with pytest.raises(StateFileError) as e:
        read_json(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    assert read_json_or_none(path) is None


def test_read_json_refuses_a_device_and_an_oversized_file(tmp_path: Path) -> None:
    with pytest.raises(StateFileError, match="is a device, not a file"):
        read_json(Path("/dev/zero"))
    big = tmp_path / "big.json"
    big.write_text(json.dumps("x" * 100))
    with pytest.raises(StateFileError, match="more than the 50"):
        read_json(big, limit=50)
    with pytest.raises(StateFileError, match=r"field 'value' is a list, not a string"):
        want(big, {"value": []}, "value", "a string")


@pytest.mark.parametrize("how", ["fifo", "folder", "binary", "truncated", "deep"])
def test_a_damaged_record_is_one_line(tmp_path: Path, how: str) -> None:
    house = Wheelhouse(tmp_path / "wh")
    house.records.mkdir(parents=True)
    name = "demo-1.0-py3-none-any.whl"
    _damage(house.record_file(name), how)
    with pytest.raises(DamagedRecord) as e:
        house.record_json(name)
    assert str(house.record_file(name)) in str(e.value)


JOURNALS = {
    "[]": "holds a list, not a JSON object",
    '{"moves": 5}': "field 'moves' is a number, not a list",
    '{"moves": [["a"]]}': "field 'moves' is not a list of [temp, final] path pairs",
    '{"deletes": [1]}': "field 'deletes' is not a list of strings",
    '{"generations": ["x1"]}': "field 'generations' names something other than generation numbers",
    '{"previous": "3"}': "field 'previous' is a string, not a generation number",
    '{"moves": [' * 50_000: "JSON nested too deeply",
}


@pytest.mark.parametrize("text", sorted(JOURNALS))
def test_a_damaged_journal_is_one_line(tmp_path: Path, text: str) -> None:
    (tmp_path / JOURNAL).write_text(text)
    with pytest.raises(PublishError) as e:
        replay(tmp_path)
    assert JOURNALS[text] in str(e.value) and str(tmp_path / JOURNAL) in str(e.value)
    assert "remove it and run `builder index rebuild`" in (e.value.hint or "")


def test_a_fifo_journal_is_not_opened(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / JOURNAL)
    with pytest.raises(PublishError, match="is a fifo, not a file"):
        replay(tmp_path)


# ------------------------------------------------------------------------------------------ SOURCE_DATE_EPOCH

@pytest.mark.parametrize(("value", "epoch"), [("", EPOCH_MIN), ("  ", EPOCH_MIN), ("0", EPOCH_MIN),
                                              ("1700000000", 1700000000), (str(EPOCH_MAX), EPOCH_MAX)])
def test_source_date_epoch_empty_means_unset(value: str, epoch: int) -> None:
    assert source_date_epoch({"SOURCE_DATE_EPOCH": value}) == epoch
    assert source_date_epoch({}) == EPOCH_MIN


@pytest.mark.parametrize(("value", "said"), [
    ("abc", "not a whole number"), ("1e10", "not a whole number"), ("1.5", "not a whole number"),
    ("9" * 5000, "not a whole number"), (str(EPOCH_MAX + 2), "after 2107-12-31"),
])
def test_a_bad_source_date_epoch_is_one_line(value: str, said: str) -> None:
    with pytest.raises(UsageError, match=said) as e:
        source_date_epoch({"SOURCE_DATE_EPOCH": value})
    assert "\n" not in str(e.value)


def test_a_wheel_is_written_with_an_empty_source_date_epoch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`builder variants` under CI's empty SOURCE_DATE_EPOCH: int('') was a traceback."""
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "")
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    write_wheel(wheel, {"demo/__init__.py": b"", "demo-1.0.dist-info/METADATA": b"Name: demo\n"}, "demo-1.0.dist-info",
                {})
    with zipfile.ZipFile(wheel) as zf:
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}


# ------------------------------------------------------------------------------------ variant properties

@pytest.mark.parametrize(("properties", "field"), [
    ("x", "'variant.properties' is a string"), ({"nvidia": "x"}, "'variant.properties.nvidia' is a string"),
    ({"nvidia": {"sm": "x"}}, "'variant.properties.nvidia.sm' is a string, not a list of strings"),
    ({"nvidia": {"sm": [1]}}, "'variant.properties.nvidia.sm' is a list, not a list of strings"),
])
def test_a_variant_record_with_odd_properties_names_the_field(properties: object, field: str) -> None:
    """`"properties": {"nvidia": "x"}` was an AttributeError in pull and rebuild; `{"nvidia": {"sm": "x"}}` was
    read as the values ["x"]."""
    with pytest.raises(RecordShapeError, match=re.escape(field)):
        check_record_json({"variant": {"label": "sm90", "properties": properties}})


# ------------------------------------------------------------------------------------------------ the cache

@pytest.mark.parametrize("how", ["folder", "fifo"])
def test_cache_clean_removes_a_venv_whose_marker_is_damaged(tmp_path: Path, how: str) -> None:
    """`builder cache clean venvs` with a folder where a venv's marker belongs: IsADirectoryError traceback."""
    settings = Settings.from_env({}, cache_dir=tmp_path / "cache", wheelhouse=tmp_path / "wh")
    venv = settings.cache("venvs") / "build-abc"
    _damage(venv / VENV_MARKER, how)
    assert [r.entry for r in clean(settings, ["venvs"])] == [venv]
    assert not venv.exists()


def test_build_python_reads_the_same_bounded_checked_answer(tmp_path: Path) -> None:
    """`builder build --python X` asks through toolchain/local.py: it had the same MemoryError and KeyError."""
    from builder.toolchain.local import interpreter_facts

    python = _script(tmp_path, "python", "exec yes '{'")
    with pytest.raises(ToolchainError, match="printed more than 1048576 bytes"):
        interpreter_facts(python, with_torch=False)
    python = _script(tmp_path, "python", """echo '{"version": "3.12", "torch": null}'""")
    with pytest.raises(ToolchainError, match="has field 'executable' missing"):
        interpreter_facts(python, with_torch=False)
