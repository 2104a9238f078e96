"""Ships recipes/, patches/, dockerfiles/ and evidence/ inside the package (as builder/_data/…) for non-editable
installs.

The top-level folders stay the single source of truth in the repository; build_py copies them into the built
package, so a wheel, `pip install .` and `uv tool install .` carry them. Editable installs skip the copy and keep
reading the checkout (builder/recipe.py: data_dir). The sdist carries the folders through MANIFEST.in.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DATA_FOLDERS = ("recipes", "patches", "dockerfiles", "evidence")
HERE = Path(__file__).resolve().parent


class build_py_with_data(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the checkout's folders
        target = Path(self.build_lib) / "builder" / "_data"
        shutil.rmtree(target, ignore_errors=True)
        for name in DATA_FOLDERS:
            source = HERE / name
            if not source.is_dir():
                raise SystemExit(f"setup.py: {source} is missing; the package would have no {name}")
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


setup(cmdclass={"build_py": build_py_with_data})
