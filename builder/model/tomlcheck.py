"""Strict reading of a TOML file's tables (recipes, farm.toml): ``TomlChecker`` checks each table against a schema
(each legal key → its type) and fails naming the file and the dotted field; an unknown key also names the key it most
likely meant (``did you mean``)."""

from __future__ import annotations

import difflib
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from builder.core.errors import BuilderError, RecipeError

# A TOML table's schema: each legal key → its type, or a tuple of the types it may have.
TomlSchema = Mapping[str, type | tuple[type, ...]]

_TYPE_NAMES: dict[type, str] = {str: "string", list: "list", dict: "table", int: "integer", bool: "boolean"}



class TomlChecker:
    """Validation helpers for TOML files (recipes, farm.toml): every error names the file and the dotted field.

    ``error`` is the BuilderError subclass raised; a schema maps each legal key to a type or a tuple of types, and
    is also the registry of names for "did you mean".
    """

    error: type[BuilderError] = RecipeError

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, field_name: str, problem: str, hint: str | None = None) -> NoReturn:
        raise self.error(f"{self.path}: field '{field_name}' {problem}", hint)

    def keys(self, table: Any, schema: TomlSchema, where: str) -> None:
        if not isinstance(table, dict):
            self.fail(where or "(top level)", "must be a table")
        for key, value in table.items():
            dotted = f"{where}.{key}" if where else key
            if key not in schema:
                close = difflib.get_close_matches(key, list(schema), n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(schema)}"
                raise self.error(f"{self.path}: unknown field '{dotted}'", hint)
            expected = schema[key]
            types = expected if isinstance(expected, tuple) else (expected,)
            if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
                wanted = " or ".join(_TYPE_NAMES.get(t, t.__name__) for t in types)
                article = "an" if wanted[0] in "aeiou" else "a"
                self.fail(dotted, f"must be {article} {wanted}, not {type(value).__name__}")

    def template(self, text: str, field_name: str, placeholder: str) -> str:
        """A string in which ``{placeholder}`` is replaced (``str.format``): that placeholder alone, bare. A format
        spec or conversion is refused, not tried: ``{version:999999999}`` would build a gigabyte string."""
        try:
            fields = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(text)
                      if name is not None]
        except ValueError as e:
            self.fail(field_name, f"is {text!r}: {e}", f"write {{{placeholder}}} for the placeholder and {{{{ }}}} "
                      "for a literal brace")
        for name, spec, conversion in fields:
            if name != placeholder or spec or conversion:
                shown = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
                self.fail(field_name, f"is {text!r}: {shown} is not allowed", f"the only placeholder it may hold is "
                          f"{{{placeholder}}}, with no format spec or conversion")
        return text

    def required(self, table: dict[str, Any], key: str, where: str) -> Any:
        if key not in table:
            self.fail(f"{where}.{key}" if where else key, "is required")
        return table[key]

    def str_list(self, table: dict[str, Any], key: str, where: str) -> list[str]:
        values = table.get(key, [])
        for i, value in enumerate(values):
            if not isinstance(value, str):
                self.fail(f"{where}.{key}[{i}]", f"must be a string, not {type(value).__name__}")
        return list(values)

    def specifier(self, text: str, field_name: str) -> SpecifierSet:
        try:
            spec = SpecifierSet(text)
        except InvalidSpecifier as e:
            raise self.error(
                f"{self.path}: field '{field_name}' is not a version range: {text!r}",
                "use a PEP 440 specifier such as '>=1.5.2,<=1.7.0'",
            ) from e
        return spec

    def version(self, text: str, field_name: str) -> None:
        try:
            Version(text)
        except InvalidVersion as e:
            raise self.error(f"{self.path}: field '{field_name}' is not a version: {text!r}") from e
