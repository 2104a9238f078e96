"""The one wheel value (model/wheelfacts.py) and the one label grammar (model/label.py): what a wheel is, decided
once, and a layout rule that keeps it so: no other module of builder/ holds a label regex, prints a label, reads a
wheel file name's local label or reads a torch requirement from Requires-Dist by its own rule."""

from __future__ import annotations

import ast
import re

import pytest
from packaging.specifiers import SpecifierSet

from builder.model.abi import Abi, channel_label, per_torch_label, stable_label
from builder.model.cuda import CudaVersion
from builder.model.label import Label, LabelKind
from builder.model.records import BuildRecord
from builder.model.wheelfacts import Wheel, requires_dist, torch_requirement
from tests.test_architecture import SOURCES, module_name

ABI3 = "cp310-abi3-manylinux_2_28_x86_64"


@pytest.mark.parametrize(("text", "label", "kind"), [
    ("cu13", Label(13), LabelKind.STABLE),
    ("cu12torch2.9", Label(12, None, (2, 9)), LabelKind.PER_TORCH_MAJOR),
    ("cu130torch2.14", Label(13, 0, (2, 14)), LabelKind.PER_TORCH_LINE),
    ("cu128torch2.10", Label(12, 8, (2, 10)), LabelKind.PER_TORCH_LINE),
])
def test_one_parser_and_one_printer(text: str, label: Label, kind: LabelKind) -> None:
    assert Label.parse(text) == label and label.kind == kind and str(label) == text


@pytest.mark.parametrize("text", [None, "", "cpu", "cu9torch2.1", "cu13torch2", "local", "cu13.sm90"])
def test_what_is_no_label_of_ours(text: str | None) -> None:
    assert Label.parse(text) is None


def test_the_printers_are_the_grammar_s() -> None:
    assert stable_label(CudaVersion.parse("13.0")) == "cu13" == str(Label.stable(CudaVersion.parse("13.2")))
    assert per_torch_label(CudaVersion.parse("12.8"), "2.9.1") == "cu12torch2.9"
    assert channel_label("13.0.1", "2.12.0+cu130") == "cu130torch2.12" == str(Label.channel("13.0", "2.12"))
    assert Label.parse("cu128torch2.9").cuda_line == CudaVersion.parse("12.8")  # type: ignore[union-attr]
    assert Label.parse("cu12torch2.9").cuda_line is None  # type: ignore[union-attr]


STABLE = BuildRecord(package="x", version="1.0", cuda="13.0", abi="torch-stable", torch_floor="2.11")


@pytest.mark.parametrize(("filename", "record", "facts"), [
    (f"x-1.0+cu13-{ABI3}.whl", STABLE, {"stable", "ranged", "by_cuda_major"}),
    (f"x-1.0+cu13-{ABI3}.whl", None, {"stable", "ranged", "by_cuda_major"}),  # the label says so, no checks yet
    (f"x-1.0-{ABI3}.whl", STABLE, {"stable", "ranged", "by_cuda_major"}),  # unlabelled: its record says so
    ("x-1.0+cu12torch2.9-cp312-cp312-linux_x86_64.whl", BuildRecord(cuda="12.8"),
     {"per_torch_major", "ranged", "by_cuda_major"}),
    ("x-1.0+cu128torch2.9-cp312-cp312-linux_x86_64.whl", BuildRecord(cuda="12.8"), {"per_torch_line"}),
    ("x-1.0-py3-none-any.whl", BuildRecord(), {"pure_python", "built_once", "ranged"}),
    ("x-1.0-py3-none-any.whl", None, {"pure_python"}),  # nobody's build: in the combined index alone
    ("x-1.0+cu130torch2.14-py3-none-any.whl", BuildRecord(), {"pure_python", "per_torch_line"}),
])
def test_each_fact_is_decided_once(filename: str, record: BuildRecord | None, facts: set[str]) -> None:
    wheel = Wheel.of(filename, record)
    names = {"stable", "per_torch_major", "per_torch_line", "built_once", "ranged", "pure_python", "by_cuda_major"}
    assert {n for n in names if getattr(wheel, n)} == facts


def test_the_cuda_major_from_the_label_else_an_unlabelled_stable_wheel_s_record() -> None:
    assert Wheel.of(f"x-1.0+cu13-{ABI3}.whl").cuda_major == 13
    assert Wheel.of("x-1.0+cu128torch2.9-cp312-cp312-linux_x86_64.whl").cuda_major == 12
    assert Wheel.of(f"x-1.0-{ABI3}.whl", STABLE).cuda_major == 13
    assert Wheel.of("x-1.0-py3-none-any.whl", BuildRecord(cuda="13.0")).cuda_major is None
    wheel = Wheel.of("x-1.0-2-cp310-abi3-linux_x86_64-sm120.whl", STABLE)
    assert (wheel.variant, wheel.abi, wheel.record_cuda) == ("sm120", Abi.TORCH_STABLE, CudaVersion.parse("13.0"))


def test_the_build_number_is_a_fact_of_the_name() -> None:
    """A re-patched wheel's build tag (docs/INDEX.md "Superseded builds"): 2 of ``x-1.0-2-…``, 0 without one."""
    assert Wheel.named("x-1.0-2-cp310-abi3-linux_x86_64-sm120.whl").build == 2
    assert Wheel.named(f"x-1.0+cu13-1-{ABI3}.whl").build == 1 and Wheel.named(f"x-1.0+cu13-{ABI3}.whl").build == 0


def test_one_rule_for_the_torch_requirement() -> None:
    fla = ['torch>=2.7.0; extra == "cuda"', 'torch>=2.7.0; extra == "rocm"', 'torch==2.10.0; extra == "npu"']
    assert torch_requirement(fla) == SpecifierSet(">=2.7.0")  # the cuda extra's, not npu's
    assert torch_requirement(["torch>=2.9.0,<2.10", "einops"]) == SpecifierSet(">=2.9.0,<2.10")
    assert torch_requirement(["torch>=2.5", "torch<3", "not a requirement !"]) == SpecifierSet(">=2.5,<3")
    assert torch_requirement(["einops"]) is None
    metadata = "Metadata-Version: 2.1\nName: x\nRequires-Dist: torch>=2.11\nRequires-Dist: einops\n\n"
    assert requires_dist(metadata.encode()) == ("torch>=2.11", "einops")
    assert Wheel.of(f"x-1.0+cu13-{ABI3}.whl", requires=requires_dist(metadata)).torch_requirement == SpecifierSet(
        ">=2.11")
    assert Wheel.of(f"x-1.0+cu13-{ABI3}.whl").torch_requirement is None  # METADATA not read


# ------------------------------------------------------------------------- the rule: one owner of the grammar

OWNERS = {"builder.model.label", "builder.model.wheelfacts",
          "builder.model.cuda"}  # cuda.py: the CUDA flavour (cu130 → 13.0) a line's label and torch's indexes share
# Modules this rule cannot fix from here, with why; each is a place to move onto the value, not a pattern to copy.
KNOWN = {
    "builder.stages.plan": "prints `cu13torch<from interpreter>` for a plan whose torch is not known yet",
}
LABEL_REGEX = re.compile(r"cu(\(|\\d|\[0-9\])|torch(\(|\\d|\[0-9\])")  # cu(\d+), cu\d+torch, torch(\d+)\.
WHEEL_NAME_READERS = {"parse_wheel_name", "parse_wheel_filename"}


def _docstrings(tree: ast.Module) -> set[int]:
    nodes = [n for n in ast.walk(tree) if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    return {id(n.body[0].value) for n in nodes
            if n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}


def grammar_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) for each place in ``source`` that does the label grammar's or the wheel value's work itself:
    a label regex (``cu(\\d+)``, ``cu\\d+torch``), a label printed (``f"cu{major}torch{minor}"``), a wheel file
    name's local label read (``version.local`` where the module parses wheel names), or a torch requirement taken
    from a ``Requirement`` by its own rule."""
    tree = ast.parse(source)
    docs = _docstrings(tree)
    uses_requirement = any(isinstance(n, ast.Name) and n.id == "Requirement" for n in ast.walk(tree))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            if LABEL_REGEX.search(node.value):
                found.append((node.lineno, f"a label regex {node.value!r}"))
        elif isinstance(node, ast.JoinedStr):
            parts = node.values
            for before, value, after in zip(parts, parts[1:], parts[2:], strict=False):
                if (isinstance(before, ast.Constant) and str(before.value).endswith("cu")
                        and isinstance(value, ast.FormattedValue) and isinstance(after, ast.Constant)
                        and str(after.value).startswith("torch")):
                    found.append((node.lineno, "a label printed"))
        elif (isinstance(node, ast.Compare) and uses_requirement and "torch" in ast.unparse(node)
              and ".name" in ast.unparse(node.left)):
            found.append((node.lineno, "a torch requirement read by its own rule"))
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        found += [(line, "a wheel file name's local label read") for line in _local_reads(scope)]
    return sorted(set(found))


def _is_name_reader(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) in WHEEL_NAME_READERS


def _local_reads(scope: ast.AST) -> list[int]:
    """Lines in ``scope`` that read ``.local`` off a version a wheel file name was parsed into: ``_, version, _, _ =
    parse_wheel_name(f)`` then ``version.local``, or ``parse_wheel_name(f)[1].local``."""
    if isinstance(scope, ast.Module):  # its statements outside every function (each function is a scope of its own)
        inner = {id(n) for f in ast.walk(scope) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for n in ast.walk(f)}
        body = [n for n in ast.walk(scope) if id(n) not in inner]
    else:
        body = [n for stmt in scope.body for n in ast.walk(stmt)]  # type: ignore[attr-defined]
    parsed = {t.elts[1].id for n in body if isinstance(n, ast.Assign) and _is_name_reader(n.value)
              for t in n.targets if isinstance(t, ast.Tuple) and len(t.elts) > 1 and isinstance(t.elts[1], ast.Name)}
    return [n.lineno for n in body if isinstance(n, ast.Attribute) and n.attr == "local" and (
        getattr(n.value, "id", None) in parsed
        or (isinstance(n.value, ast.Subscript) and _is_name_reader(n.value.value)))]


def test_only_the_wheel_value_knows_the_label_grammar() -> None:
    found = [f"{module_name(p)}:{line} {what}" for p in SOURCES if module_name(p) not in OWNERS | set(KNOWN)
             for line, what in grammar_uses(p.read_text())]
    assert not found, ("the label grammar or a wheel fact outside model/label.py and model/wheelfacts.py (ask "
                       "Label.parse / Wheel.of / torch_requirement instead):\n" + "\n".join(found))


def test_the_known_exceptions_still_need_their_place() -> None:
    stale = [m for m in KNOWN if not any(grammar_uses(p.read_text()) for p in SOURCES if module_name(p) == m)]
    assert not stale, f"remove from KNOWN (they ask the value now): {stale}"


@pytest.mark.parametrize("planted", [
    're.fullmatch(r"cu(\\d+)torch(\\d+)\\.(\\d+)", label)',
    'LINE = re.compile(r"(cu\\d+)torch\\d+\\.\\d+")',
    'label = f"cu{cuda.major}torch{major}.{minor}"',
    '_, version, _, _ = parse_wheel_name(filename); label = version.local',
    'label = parse_wheel_name(filename)[1].local',
    '[Requirement(r).specifier for r in requires if Requirement(r).name == "torch"]',
])
def test_the_rule_bites(planted: str) -> None:
    assert grammar_uses(planted), planted
    assert not grammar_uses('label = Label.parse(Wheel.of(filename).local); spec = torch_requirement(lines)')
