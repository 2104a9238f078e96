"""The JSON shape of a build record (records/<wheel>.json, and the one inside a wheel): ``check_record_json`` refuses
a known field of the wrong type with ``RecordShapeError`` naming it, so a damaged file is one line, never a traceback
in a reader. model/records.py reads the checked JSON into typed fields, and writes them back through ``plain``
(frozen parts as JSON values) and ``as_read`` (a record read is written with its own keys)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


class RecordShapeError(ValueError):
    """A build record's JSON with a field of the wrong type; ``field`` is its dotted path (``tests.counts``)."""

    def __init__(self, field_path: str, problem: str) -> None:
        super().__init__(f"field {field_path!r} {problem}")
        self.field = field_path


_SCALAR = (str, int, float, bool, type(None))


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "a number", float: "a number"}.get(type(value), type(value).__name__)


def _want(data: Mapping[str, Any], key: str, shape: str, where: str = "") -> None:
    """Refuse ``data[key]`` unless it has ``shape``: str | number | map (an object of scalars) | object | list |
    strlist (a list of strings or numbers); null is always allowed (the field's default)."""
    if key not in data or data[key] is None:
        return
    value, path = data[key], f"{where}{key}"
    ok = {"str": isinstance(value, str),
          "number": isinstance(value, int | float) and not isinstance(value, bool),
          "map": isinstance(value, dict) and all(isinstance(v, _SCALAR) for v in value.values()),
          "object": isinstance(value, dict), "list": isinstance(value, list),
          "strlist": isinstance(value, list) and all(isinstance(v, str | int) and not isinstance(v, bool)
                                                      for v in value)}[shape]
    if not ok:
        said = {"str": "a string", "number": "a number", "map": "an object of plain values (strings, numbers)",
                "object": "an object", "list": "a list", "strlist": "a list of strings"}[shape]
        raise RecordShapeError(path, f"is {_kind(value)}, not {said}")


_RECORD_SHAPE = {"builder_version": "str", "cache_key": "str", "package": "str", "version": "str", "cuda": "str",
                 "torch_index": "str", "build_log": "str", "abi": "str", "torch_floor": "str", "platform": "str", "subset": "str",
                 "wheel": "str", "wheel_sha256": "str", "abi_choice": "str", "archs": "strlist",
                 "toolchain": "map", "host_compiler": "map", "python": "map", "host": "map", "timings": "map",
                 "compiler_cache": "map", "parallel": "map", "recipe": "map", "source": "map",
                 "runtime_dropped": "object", "tests": "object", "inspect": "object", "variant": "object",
                 "build": "object",
                 "patches": "list", "torch_checks": "list", "torch_unchecked": "list", "gpu_tests": "list"}


def check_record_json(data: object) -> None:
    """Refuse a build record whose known fields have the wrong type (``RecordShapeError`` naming the field), so a
    damaged records/*.json is one line, never a traceback in a reader; unknown keys are kept as they are."""
    if not isinstance(data, Mapping):
        raise RecordShapeError("(top level)", f"is {_kind(data)}, not an object")
    for key, shape in _RECORD_SHAPE.items():
        _want(data, key, shape)
    for key in ("timings", "compiler_cache", "parallel"):
        for name in (data.get(key) or {}):
            _want(data[key], name, "number", f"{key}.")
    for key, fields in (("recipe", ("file", "sha256", "content_sha256")), ("source", ("kind", "location", "sha256"))):
        for name in fields:
            _want(data.get(key) or {}, name, "str", f"{key}.")
    for i, patch in enumerate(data.get("patches") or ()):
        if not isinstance(patch, dict) or not isinstance(patch.get("file"), str) \
                or not isinstance(patch.get("sha256"), str):
            raise RecordShapeError(f"patches[{i}]", "is not an object with the strings 'file' and 'sha256'")
        _want(patch, "versions", "str", f"patches[{i}].")
    dropped = data.get("runtime_dropped") or {}
    _want(dropped, "names", "strlist", "runtime_dropped.")
    _want(dropped, "reason", "str", "runtime_dropped.")
    _test_report(data.get("tests") or {}, "tests")
    for i, report in enumerate(data.get("gpu_tests") or ()):
        if not isinstance(report, dict):
            raise RecordShapeError(f"gpu_tests[{i}]", f"is {_kind(report)}, not an object")
        _test_report(report, f"gpu_tests[{i}]")
    build = data.get("build") or {}
    _want(build, "number", "number", "build.")
    _want(build, "by", "strlist", "build.")
    variant = data.get("variant") or {}
    _want(variant, "label", "str", "variant.")
    _want(variant, "of_archs", "strlist", "variant.")
    _want(variant, "properties", "object", "variant.")
    for namespace, features in (variant.get("properties") or {}).items():  # PEP 825: namespace → feature → values
        where = f"variant.properties.{namespace}"
        if not isinstance(features, dict):
            raise RecordShapeError(where, f"is {_kind(features)}, not an object of features")
        for feature, values in features.items():
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise RecordShapeError(f"{where}.{feature}", f"is {_kind(values)}, not a list of strings")
    for key in ("torch_checks", "torch_unchecked"):
        for i, check in enumerate(data.get(key) or ()):
            if not isinstance(check, dict):
                raise RecordShapeError(f"{key}[{i}]", f"is {_kind(check)}, not an object")
            for name in ("torch", "cuda", "python", "how", "status", "detail"):
                _want(check, name, "str", f"{key}[{i}].")


def _test_report(tests: Mapping[str, Any], where: str) -> None:
    for name in ("import_status", "import_detail", "kernel_status", "kernel_reason", "gpu", "torch"):
        _want(tests, name, "str", f"{where}.")
    _want(tests, "counts", "map", f"{where}.")
    _want(tests, "speed", "list", f"{where}.")
    for i, row in enumerate(tests.get("speed") or ()):
        if not isinstance(row, dict):
            raise RecordShapeError(f"{where}.speed[{i}]", f"is {_kind(row)}, not an object")


# ---------------------------------------------------------------- records' parts as JSON values


def as_read(record: Any, out: dict[str, Any]) -> dict[str, Any]:
    """``out`` less the keys a read record did not have and whose value is still the default."""
    if record.read_keys is None:
        return out
    default = type(record)()
    return {k: v for k, v in out.items()
            if k in record.read_keys or k not in {f.name for f in dataclasses.fields(record)}
            or getattr(record, k) != getattr(default, k)}


def recipe_json(recipe: Any) -> dict[str, str] | None:
    """The recipe's digests; records written before the content digest existed are written back as they were."""
    digests = plain(recipe)
    if digests is not None and not digests["content_sha256"]:
        del digests["content_sha256"]
    return digests


def plain(value: Any) -> Any:
    """A frozen record part as JSON values (dataclasses → dicts, tuples → lists, mappings → dicts)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    return value
