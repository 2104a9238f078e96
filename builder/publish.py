"""The publish stage: wheels into the wheelhouse and a PEP 503 simple index over them, atomically.

Layout::

    wheelhouse/wheels/<file>.whl          the wheels
    wheelhouse/records/<file>.whl.json    build record + inspect + test results per wheel
    wheelhouse/simple/index.html          PEP 503 root; simple/<project>/index.html per project

Every file is written to a temp name and ``os.replace``d, under one lock, so readers never see a half-written
page and concurrent publishers lose nothing.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import tempfile
from pathlib import Path

from filelock import FileLock
from packaging.utils import canonicalize_name, parse_wheel_filename

from .errors import PublishError
from .finalize import read_metadata
from .source import sha256_file


class Wheelhouse:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.wheels = root / "wheels"
        self.records = root / "records"
        self.simple = root / "simple"

    def staging(self) -> Wheelhouse:
        """The staging area: built and import-tested wheels waiting for kernel tests on a GPU machine."""
        return Wheelhouse(self.root / "staging")

    def contains(self, wheel: Path) -> bool:
        return wheel.resolve().parent == self.wheels.resolve()

    def record_of(self, wheel_name: str) -> dict[str, object] | None:
        path = self.records / f"{wheel_name}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def remove(self, wheel_name: str) -> None:
        """Take a wheel and its record out (after promotion), then rewrite the index."""
        with self.lock():
            (self.wheels / wheel_name).unlink(missing_ok=True)
            (self.records / f"{wheel_name}.json").unlink(missing_ok=True)
            self._write_index()

    def write_record(self, wheel_name: str, record: dict[str, object]) -> None:
        with self.lock():
            self.records.mkdir(parents=True, exist_ok=True)
            _atomic_write(self.records / f"{wheel_name}.json", json.dumps(record, indent=2, sort_keys=True))

    def lock(self) -> FileLock:
        self.root.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.root / ".publish.lock"))

    def index_url(self) -> str:
        return (self.simple).resolve().as_uri()

    def publish(self, wheel: Path, record: dict[str, object]) -> Path:
        """Copy ``wheel`` in, write its record, regenerate the index. Returns the published path."""
        try:
            with self.lock():
                self.wheels.mkdir(parents=True, exist_ok=True)
                self.records.mkdir(parents=True, exist_ok=True)
                dest = self.wheels / wheel.name
                _atomic_copy(wheel, dest)
                _atomic_write(self.records / f"{wheel.name}.json", json.dumps(record, indent=2, sort_keys=True))
                self._write_index()
        except OSError as e:
            raise PublishError(f"publishing {wheel.name} into {self.root} failed: {e}") from e
        return dest

    def find_record(self, cache_key: str) -> tuple[Path, dict[str, object]] | None:
        """A published wheel built from exactly these inputs, if any (the "unchanged, skip" check)."""
        if not self.records.is_dir():
            return None
        for path in sorted(self.records.glob("*.whl.json")):
            try:
                record = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue
            wheel = self.wheels / path.name.removesuffix(".json")
            if record.get("cache_key") == cache_key and wheel.exists():
                return wheel, record
        return None

    def _status_text(self, wheel_name: str) -> str:
        """A human note after each link (PEP 503 allows other elements): the wheel's test results."""
        try:
            summary = _tests_summary(self.record_of(wheel_name))
        except (OSError, json.JSONDecodeError):
            return ""
        return f' <span class="tests">{html.escape(summary)}</span>' if summary else ""

    def rebuild_index(self) -> None:
        with self.lock():
            self._write_index()

    def _write_index(self) -> None:
        projects: dict[str, list[Path]] = {}
        for wheel in sorted(self.wheels.glob("*.whl")) if self.wheels.is_dir() else []:
            name = canonicalize_name(parse_wheel_filename(wheel.name)[0])
            projects.setdefault(name, []).append(wheel)
        self.simple.mkdir(parents=True, exist_ok=True)
        for name, wheels in projects.items():
            links = []
            for wheel in wheels:
                attrs = f'href="../../wheels/{html.escape(wheel.name)}#sha256={sha256_file(wheel)}"'
                requires_python = _requires_python(wheel)
                if requires_python:
                    attrs += f' data-requires-python="{html.escape(requires_python)}"'
                status = self._status_text(wheel.name)
                links.append(f"    <a {attrs}>{html.escape(wheel.name)}</a>{status}<br/>")
            page = _page(f"Links for {name}", links)
            (self.simple / name).mkdir(exist_ok=True)
            _atomic_write(self.simple / name / "index.html", page)
        root_links = [f'    <a href="{n}/">{n}</a><br/>' for n in sorted(projects)]
        _atomic_write(self.simple / "index.html", _page("Simple index", root_links))
        for stale in self.simple.iterdir():
            if stale.is_dir() and stale.name not in projects and stale.name != "staging":
                shutil.rmtree(stale, ignore_errors=True)


def _tests_summary(record: dict[str, object] | None) -> str:
    tests = record.get("tests") if record else None
    if not isinstance(tests, dict):
        return ""
    kernel = str(tests.get("kernel_status", "not run"))
    reason = tests.get("kernel_reason")
    return f"import {tests.get('import_status')}; kernel tests {kernel}" + (f" ({reason})" if reason else "")


def _requires_python(wheel: Path) -> str | None:
    for line in read_metadata(wheel).splitlines():
        if line.startswith("Requires-Python:"):
            return line.split(":", 1)[1].strip()
    return None


def _page(title: str, links: list[str]) -> str:
    body = "\n".join(links)
    return (
        '<!DOCTYPE html>\n<html>\n  <head><meta name="pypi:repository-version" content="1.0">'
        f"<title>{html.escape(title)}</title></head>\n  <body>\n    <h1>{html.escape(title)}</h1>\n{body}\n  </body>\n</html>\n"
    )


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _atomic_copy(src: Path, dest: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.chmod(tmp, 0o644)
        os.replace(tmp, dest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
