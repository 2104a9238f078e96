"""The layout's rules, read from the source: data flows one way and private names stay in their module.

Layers, lowest first (docs/ARCHITECTURE.md draws them): a module may import its own layer's modules and lower
layers, never a higher one. Inside builder/stages the stages run in pipeline order, and a stage never imports a
later one. No `_private` name is imported from another module, nor called on another module's object. Only
builder/index spells the wheelhouse's layout (index/layout.py); everyone else asks a `Wheelhouse` for its paths.
Every module has its line in the map at the top of docs/ARCHITECTURE.md.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from builder.index import layout

PACKAGE = Path(__file__).resolve().parent.parent / "builder"

LAYERS = [
    "core",
    "model",
    "discovery",
    "toolchain",
    "stages",
    "index",
    "pipeline",  # run.py (build one target), promote.py (test a staged wheel, promote it)
    "farm",
    "user",
    "cli",
]
# Stage modules in the order the pipeline runs them (the cache key is computed between pyenv and patch).
STAGE_ORDER = ["resolve", "abichoice", "plan", "source", "patch", "pyenv", "inputs", "compilercache", "compileprogress",
               "compile", "repair", "finalize", "inspection", "sanitizer", "testing", "torchrange", "slicing"]


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, imported module, imported names) for every `import`/`from` in the file, function-level ones too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module, [a.name for a in node.names]))
        elif isinstance(node, ast.ImportFrom) and node.level:
            found.append((node.lineno, "." * node.level + (node.module or ""), [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, a.name, []) for a in node.names)
    return found


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "builder" or len(parts) < 2:
        return None
    return LAYERS.index(parts[1]) if parts[1] in LAYERS else None


SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if "_data" not in p.parts)
ARCHITECTURE = PACKAGE.parent / "docs" / "ARCHITECTURE.md"
# a line of the map: a folder (``core/``) or a module (``cachedir.py``, ``probes/env.py``), then its description
MAP_LINE = re.compile(r"^(?P<indent> {6,})(?P<name>[\w./]+?(?:/|\.py))(?: {2,}\S|$)")


def test_every_module_sits_in_a_layer() -> None:
    loose = [module_name(p) for p in SOURCES
             if layer_of(module_name(p)) is None and module_name(p) not in ("builder", "builder.__main__")]
    assert not loose, f"modules outside the layers {LAYERS}: {loose}"


def test_imports_are_absolute() -> None:
    relative = [f"{module_name(p)}:{line}" for p in SOURCES for line, mod, _ in imports_of(p) if mod.startswith(".")]
    assert not relative, f"relative imports (write `from builder.x.y import ...`): {relative}"


def test_no_module_imports_a_higher_layer() -> None:
    back_edges = []
    for path in SOURCES:
        here = module_name(path)
        mine = layer_of(here)
        for line, mod, _ in imports_of(path):
            theirs = layer_of(mod)
            if mine is not None and theirs is not None and theirs > mine:
                back_edges.append(f"{here}:{line} imports {mod} ({LAYERS[mine]} → {LAYERS[theirs]})")
    assert not back_edges, "imports against the data flow:\n" + "\n".join(back_edges)


def test_no_stage_imports_a_later_stage() -> None:
    late = []
    for path in (PACKAGE / "stages").glob("*.py"):
        if path.stem == "__init__":
            continue
        assert path.stem in STAGE_ORDER, f"stage module {path.stem} is not in STAGE_ORDER"
        for line, mod, _ in imports_of(path):
            parts = mod.split(".")
            if parts[:2] == ["builder", "stages"] and len(parts) > 2 and parts[2] in STAGE_ORDER \
                    and STAGE_ORDER.index(parts[2]) > STAGE_ORDER.index(path.stem):
                late.append(f"builder.stages.{path.stem}:{line} imports {mod}")
    assert not late, "a stage imports a later one:\n" + "\n".join(late)


def test_no_private_name_crosses_a_module() -> None:
    crossing = [f"{module_name(p)}:{line} imports {name} from {mod}"
                for p in SOURCES for line, mod, names in imports_of(p) if mod.startswith("builder")
                for name in names if name.startswith("_") and not name.startswith("__")]
    assert not crossing, "private names imported across modules:\n" + "\n".join(crossing)


@pytest.mark.parametrize("name", ["inspect", "build", "test", "torch", "packaging", "docker", "uv", "json", "types"])
def test_no_module_shadows_stdlib_or_a_dependency(name: str) -> None:
    assert not [p for p in SOURCES if p.stem == name], f"a module named {name}.py shadows stdlib or a dependency"


TOOLCHAIN_NAMES = {"auto", "pip", "host", "docker"}


def _names_a_toolchain(node: ast.expr) -> bool:
    """``toolchain``, ``plan.target.toolchain``, ``toolkit.kind``: an expression that holds a toolchain's name."""
    text = ast.unparse(node)
    return "toolchain" in text.lower() or text.endswith("toolkit.kind")


def test_toolchains_are_told_apart_only_inside_the_toolchain_package() -> None:
    """The toolchain seam (docs/ARCHITECTURE.md): outside builder/toolchain nothing compares a toolchain's name or
    branches on "is there a container"; what differs between toolchains lives on their BuildHost."""
    found = []
    for path in SOURCES:
        if path.parent.name == "toolchain":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            constants = {s.value for s in sides if isinstance(s, ast.Constant)}
            if constants & TOOLCHAIN_NAMES and any(_names_a_toolchain(s) for s in sides):
                found.append(f"{module_name(path)}:{node.lineno} {ast.unparse(node)}")
            if any("container" in ast.unparse(s) for s in sides) and any(
                    isinstance(s, ast.Constant) and s.value is None for s in sides):
                found.append(f"{module_name(path)}:{node.lineno} {ast.unparse(node)}")
    assert not found, "toolchain-specific branches outside builder/toolchain:\n" + "\n".join(found)


WHEELHOUSE_NAMES = {layout.WHEELS, layout.RECORDS, layout.STAGING, layout.SIMPLE, layout.CHANNELS, layout.LOCK,
                    layout.JOURNAL}


def _docstrings(tree: ast.Module) -> set[int]:
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    return {id(n.body[0].value) for n in nodes
            if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def layout_spellings(path: Path) -> list[tuple[int, str]]:
    """(line, literal) for each string in ``path`` (an f-string's literal parts too, docstrings aside) that names a
    folder or file of the wheelhouse as a path segment: ``"records"``, ``"staging/wheels"``, ``f"{root}simple/"``.
    A URL (``https://pypi.org/simple``) is another index's address, not a path in ours. ``logs`` and ``index.html``
    are not checked: the cache has a logs/ folder and every simple index an index.html."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = _docstrings(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
            and "://" not in node.value and WHEELHOUSE_NAMES & set(node.value.split("/"))]


def test_only_the_index_spells_the_wheelhouse_layout() -> None:
    """cli/, pipeline/, farm/, user/ ask a `Wheelhouse` (or index/layout.py, for a served one) for a path; a
    second spelling of ``records/`` is how a layout change would miss a reader."""
    found = [f"{module_name(p)}:{line} {text!r}" for p in SOURCES if p.parent.name != "index"
             for line, text in layout_spellings(p)]
    assert not found, "the wheelhouse layout spelled outside builder/index:\n" + "\n".join(found)


def _root_name(node: ast.expr) -> str | None:
    """The name an expression starts from: ``house`` in ``house.staging()._x``."""
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _own_names(tree: ast.Module) -> set[str]:
    """Every name the module defines: functions, classes, and the names and attributes it assigns."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {t.attr for t in ast.walk(target) if isinstance(t, ast.Attribute)}
                names |= {t.id for t in ast.walk(target) if isinstance(t, ast.Name)}
    return names


def _library_names(tree: ast.Module) -> set[str]:
    """Names bound by importing something that is not the builder's (``os`` for ``os._exit``: their API)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if not a.name.startswith("builder")}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and not (node.module or "").startswith("builder"):
            names |= {a.asname or a.name for a in node.names}
    return names


def private_calls(path: Path) -> list[tuple[int, str]]:
    """(line, call) for each ``x._name(...)`` in ``path`` whose ``_name`` this module does not define: a call into
    another module's private function or method, through a module or an object it handed out. Calls on a library
    (``os._exit``) are the library's business."""
    tree = ast.parse(path.read_text(), str(path))
    own, libraries = _own_names(tree), _library_names(tree)
    return [(node.lineno, ast.unparse(node.func)) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr.startswith("_") and not node.func.attr.startswith("__")
            and node.func.attr not in own and _root_name(node.func.value) not in libraries]


def test_no_private_function_is_called_across_modules() -> None:
    found = [f"{module_name(p)}:{line} {call}" for p in SOURCES for line, call in private_calls(p)]
    assert not found, "private functions called from another module (make them public, or move the caller):\n" \
        + "\n".join(found)


def architecture_map(text: str) -> list[str]:
    """The module paths (relative to builder/) that the map at the top of docs/ARCHITECTURE.md names, in its order:
    the indented block under ``    builder/``, a folder line opening a folder for the lines indented below it."""
    block = text.split("\n    builder/\n", 1)[1].split("\n\n", 1)[0]
    folders: list[tuple[int, str]] = []
    modules = []
    for line in block.splitlines():
        match = MAP_LINE.match(line)
        if not match:
            continue
        indent, name = len(match["indent"]), match["name"]
        while folders and folders[-1][0] >= indent:
            folders.pop()
        if name.endswith("/"):
            folders.append((indent, name))
        else:
            modules.append("".join(f for _, f in folders) + name)
    return modules


def test_the_architecture_map_reader() -> None:
    text = ("intro\n\n    builder/\n      __main__.py    entry\n      core/          ground\n"
            "        errors.py    one root error\n      user/          the user's side\n"
            "        probes/env.py  the probe\n        fit.py       what fits\n\nafter\n        late.py  no\n")
    assert architecture_map(text) == ["__main__.py", "core/errors.py", "user/probes/env.py", "user/fit.py"]
    real = ARCHITECTURE.read_text()
    without_elf = "\n".join(line for line in real.splitlines() if not line.startswith("        elf.py "))
    assert "core/elf.py" in architecture_map(real)
    assert "core/elf.py" not in architecture_map(without_elf)


def test_every_module_has_a_line_in_the_architecture_map() -> None:
    """docs/ARCHITECTURE.md names every module of builder/ (package faces, __init__.py, aside) and no module that
    is gone; the stages stand in pipeline order."""
    listed = architecture_map(ARCHITECTURE.read_text())
    actual = {p.relative_to(PACKAGE).as_posix() for p in SOURCES if p.name != "__init__.py"}
    missing, gone = sorted(actual - set(listed)), sorted(set(listed) - actual)
    assert not missing, f"modules missing from the map in docs/ARCHITECTURE.md (add one line each): {missing}"
    assert not gone, f"docs/ARCHITECTURE.md's map names modules that do not exist: {gone}"
    assert len(listed) == len(set(listed)), "a module has two lines in docs/ARCHITECTURE.md's map"
    stages = [m.removeprefix("stages/").removesuffix(".py") for m in listed if m.startswith("stages/")]
    assert stages == STAGE_ORDER, "docs/ARCHITECTURE.md lists the stages out of pipeline order"


MAX_LINES = 400  # issue 41: smaller rooms


def test_a_module_over_400_lines_says_why() -> None:
    """A module longer than MAX_LINES is split along a seam, or its docstring says why not ("Over 400 lines on
    purpose: ..."), so that the next reader knows the size was chosen."""
    long = [f"{module_name(p)} ({n} lines)" for p in SOURCES
            if (n := len(p.read_text().splitlines())) > MAX_LINES
            and f"{MAX_LINES} lines" not in (ast.get_docstring(ast.parse(p.read_text())) or "")]
    assert not long, (f"modules over {MAX_LINES} lines without a reason in their docstring (split one along a seam, "
                      "or say why it is one room: 'Over 400 lines on purpose: ...'):\n" + "\n".join(long))
