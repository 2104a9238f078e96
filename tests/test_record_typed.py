"""BuildRecord's typed readers (issue 53 item 3): archs, the build torch and Python read once, typed, from the
record's JSON strings; a record of another builder (or a damaged one) gives None / () rather than an exception."""
from __future__ import annotations

from packaging.version import Version

from builder.model.arch import Arch
from builder.model.records import BuildRecord


def test_typed_readers_of_a_record() -> None:
    record = BuildRecord.from_json({"archs": ["90", "120a"], "python": {"torch": "2.11.0+cu130", "version": "3.12.1"},
                                    "cuda": "13.0"})
    assert record.arch_list == (Arch(90, ""), Arch(120, "a"))
    assert record.build_torch == Version("2.11.0+cu130") and record.build_torch.public == "2.11.0"
    assert record.build_python == "3.12.1" and str(record.cuda_version) == "13.0"


def test_what_does_not_parse_is_none() -> None:
    record = BuildRecord.from_json({"archs": ["sm_nine"], "python": {"torch": "not-a-version"}})
    assert record.arch_list == () and record.build_torch is None and record.build_python is None
    assert BuildRecord().arch_list == () and BuildRecord().build_torch is None
