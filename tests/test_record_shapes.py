"""Issue 40 (round 4): the wheelhouse's JSON state with wrong-typed fields (build records, assets.json) is one
error line naming the file and the field, a non-zero exit, and nothing written; a variant whose plain wheel is gone
is left out of the pages with one warning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from builder.index.store import Wheelhouse
from builder.model import variants
from builder.model.arch import Arch
from builder.model.cuda import CudaVersion
from builder.model.records import BuildRecord, RecordShapeError, VariantInfo, check_record_json
from tests.helpers import assert_one_line_error, run_cli
from tests.test_index import labelled_wheel


def _house(tmp: Path) -> tuple[Wheelhouse, Path, Path]:
    """A wheelhouse with a plain wheel and its sm90 variant, each with a record."""
    plain = labelled_wheel(tmp / "w", "demo", "1.0", "cu130torch2.14", pins=("torch==2.14.1",))
    variant = plain.with_name(plain.name[:-4] + "-sm90.whl")
    variant.write_bytes(plain.read_bytes())
    house = Wheelhouse(tmp / "house")
    v = variants.Variant.for_build(Arch(90), CudaVersion.parse("13.0"))
    house.publish(plain, BuildRecord(package="demo", version="1.0", cuda="13.0", archs=("90", "120")))
    house.publish(variant, BuildRecord(package="demo", version="1.0",
                                       variant=VariantInfo(v.label, ("90", "120"), v.properties())))
    return house, house.wheel_file(plain.name), house.wheel_file(variant.name)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


DEEP: object = "x"
for _ in range(5):
    DEEP = {"a": [DEEP]}

HOSTILE = [
    ("toolchain", ["nvcc", "12.8"], "'toolchain' is a list"),
    ("package", ["demo"], "'package' is a list"),
    ("python", 7, "'python' is a number"),
    ("archs", 90, "'archs' is a number"),
    ("archs", [DEEP], "'archs' is a list, not a list of strings"),
    ("tests", "passed", "'tests' is a string"),
    ("host", DEEP, "'host' is an object, not an object of plain values"),
    ("cuda", {"major": 13}, "'cuda' is an object"),
    ("variant", [1], "'variant' is a list"),
    ("timings", {"compile": "slow"}, "'timings.compile' is a string, not a number"),
    ("patches", [None], "'patches[0]'"),
]


@pytest.mark.parametrize(("key", "value", "needle"), HOSTILE[:4] + HOSTILE[6:7])
def test_index_rebuild_refuses_a_record_of_the_wrong_type_in_one_line(tmp_path: Path, key: str, value: object,
                                                                       needle: str) -> None:
    house, plain, _ = _house(tmp_path)
    record = house.record_file(plain.name)
    data = json.loads(record.read_text())
    data[key] = value
    record.write_text(json.dumps(data))
    before = _tree(house.root)
    result = run_cli("index", "rebuild", "--wheelhouse", str(house.root))
    assert result.code == 11, result.stderr
    assert_one_line_error(result, str(record), needle, "nothing was changed")
    assert _tree(house.root) == before


@pytest.mark.parametrize(("key", "value", "needle"), HOSTILE)
def test_every_reader_of_a_record_names_the_field(tmp_path: Path, key: str, value: object, needle: str) -> None:
    data = BuildRecord(package="demo", version="1.0").to_json() | {key: value}
    with pytest.raises(RecordShapeError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        BuildRecord.from_json(data)


def test_null_fields_and_unknown_keys_are_still_read(tmp_path: Path) -> None:
    data = {k: None for k in ("package", "archs", "toolchain", "tests", "variant", "timings")} | {"mine": [DEEP]}
    check_record_json(data)
    assert BuildRecord.from_json(data).extra == {"mine": [DEEP]}
    with pytest.raises(RecordShapeError, match="top level"):
        check_record_json([data])


def test_inspect_refuses_a_wrong_typed_published_record(tmp_path: Path) -> None:
    house, plain, _ = _house(tmp_path)
    record = house.record_file(plain.name)
    record.write_text(json.dumps(json.loads(record.read_text()) | {"tests": ["passed"]}))
    result = run_cli("inspect", str(plain), "--cache-dir", str(tmp_path / "cache"), "--offline")
    assert_one_line_error(result, str(record), "'tests' is a list")


def test_a_huge_record_is_refused_unread(tmp_path: Path) -> None:
    house, plain, _ = _house(tmp_path)
    record = house.record_file(plain.name)
    record.write_text(json.dumps({"package": "x" * (17 << 20)}))
    before = _tree(house.root)
    result = run_cli("index", "rebuild", "--wheelhouse", str(house.root))
    assert_one_line_error(result, str(record), "more than the 16777216")
    assert _tree(house.root) == before


@pytest.mark.parametrize(("content", "needle"), [
    ('["https://h/"]', "a JSON list, not an object"), ('{"url": 7}', "'url' is a JSON int"), ("null", "NoneType"),
    ("[" * 20000 + "]" * 20000, "RecursionError"),
])
def test_index_rebuild_refuses_a_wrong_typed_assets_json(tmp_path: Path, content: str, needle: str) -> None:
    house, _, _ = _house(tmp_path)
    (house.root / "assets.json").write_text(content)
    before = _tree(house.root)
    result = run_cli("index", "rebuild", "--wheelhouse", str(house.root))
    assert_one_line_error(result, "assets.json", needle)
    assert _tree(house.root) == before


def test_index_rebuild_leaves_out_a_variant_whose_plain_wheel_is_gone(tmp_path: Path) -> None:
    house, plain, variant = _house(tmp_path)
    plain.unlink()
    result = run_cli("index", "rebuild", "--wheelhouse", str(house.root))
    assert result.code == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and variant.name in warnings[0] and "left out of the pages" in warnings[0], result.stderr
    assert "(0 wheels)" in result.stdout and "channel" not in result.stdout
    pages = [*(house.root / "simple").rglob("*"), *(house.root / "channels").rglob("*"), house.root / "index.html"]
    assert [p for p in pages if p.is_file() and "sm90" in p.read_text()] == []
    assert variant.exists()  # left where it is: the pages do not list it
