#!/usr/bin/env python3
"""Places in builder/ that parse a wheel's local label, decide a wheel fact, or read the torch requirement.
A "place" is one function (or module body) doing it. Usage: python scripts/wheel-facts-places.py [OWNER.py ...]: owners listed apart."""
import ast
import re
import sys
from pathlib import Path


def name_of(f):
    return getattr(f, "id", getattr(f, "attr", ""))
def calls(fn, names):
    return any(isinstance(n, ast.Call) and name_of(n.func) in names for n in ast.walk(fn))
def consts(fn, docs):
    return [n.value for n in ast.walk(fn) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]
def attrs(fn):
    return {n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute)}

LABEL_RE = re.compile(r"cu(\(|\\d|\[0-9\])")  # a regex literal of the label grammar: cu(\d+)torch…, cu\d+
TESTS = {
    "label regex": lambda fn, c, a: any(LABEL_RE.search(s) for s in c),
    "label parse call": lambda fn, c, a: calls(fn, {"stable_label_major", "per_torch_label_parts", "label_cuda",
                                                    "wheel_label", "_line_of_flavour"}),
    "cu130->13.0 copy": lambda fn, c, a: any(r"cu(\d+)(\d)" in s for s in c),
    "Requires-Dist read": lambda fn, c, a: calls(fn, {"get_all", "startswith"}) and any(
        s in ("Requires-Dist", "Requires-Dist:") for s in c),
    "torch req rule": lambda fn, c, a: calls(fn, {"Requirement"}) and "torch" in c,
    "fact: stable": lambda fn, c, a: calls(fn, {"stable_label_major"}) or any(
        isinstance(n, ast.Attribute) and n.attr == "is_stable_abi" and "record" in ast.unparse(n.value).lower()
        for n in ast.walk(fn)) or any(isinstance(n, ast.Compare) and "torch-stable" in ast.unparse(n)
        or isinstance(n, ast.Compare) and "TORCH_STABLE" in ast.unparse(n) for n in ast.walk(fn)),
    "fact: per-torch-major": lambda fn, c, a: calls(fn, {"per_torch_label_parts"}),
    "fact: built-once/pure": lambda fn, c, a: "any" in c and "none" in c and "platform" in a,
    "fact: ranged (an or of kinds)": lambda fn, c, a: any(isinstance(n, ast.BoolOp) and isinstance(n.op, ast.Or) and sum(
        any(k in ast.unparse(v) for k in ("stable", "per_torch", "built_once", "_pure_python")) for v in n.values) >= 2
        for n in ast.walk(fn)),
}
# the ABI a build *target* gets (plan, --abi auto, farm.toml): not a fact read from a wheel
BUILD_SIDE = {"builder/stages/plan.py", "builder/stages/abichoice.py", "builder/farm/entries.py", "builder/farm/abifold.py"}
def docstrings(tree):
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out
def units(tree):
    """Innermost functions, and the module body outside any function."""
    fns = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    inner = [f for f in fns if not any(g is not f and isinstance(g, (ast.FunctionDef, ast.AsyncFunctionDef))
                                      for g in ast.walk(f))]
    top = ast.Module(body=[s for s in tree.body if not isinstance(s, (ast.FunctionDef, ast.ClassDef))], type_ignores=[])
    classes = [s for s in tree.body if isinstance(s, ast.ClassDef)]
    for cls in classes:  # class bodies outside methods (regex constants)
        top.body += [s for s in cls.body if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return [*inner, top]
owners = set(sys.argv[1:])
found = {k: [] for k in TESTS}
for path in sorted(Path("builder").rglob("*.py")):
    if "probes" in path.parts:  # run by another interpreter, stdlib only: not wheel files
        continue
    tree = ast.parse(path.read_text())
    docs = docstrings(tree)
    for fn in units(tree):
        c, a = consts(fn, docs), attrs(fn)
        for k, t in TESTS.items():
            if k.startswith("fact:") and str(path) in BUILD_SIDE:
                continue
            if t(fn, c, a):
                found[k].append(f"{path}:{getattr(fn, 'name', '<module>')}")
for k, places in found.items():
    out = [p for p in places if p.split(":")[0] not in owners]
    mods = sorted({p.split(":")[0] for p in out})
    print(f"{k:22} places {len(out):3}  modules {len(mods):2}  ({len(places) - len(out)} in owners)")
    if "-v" in owners:
        for p in out:
            print("      ", p)
