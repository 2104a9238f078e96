"""Scripts that run inside a user's Python environment, with that environment's interpreter.

Each file here is run as ``subprocess.run([python, script, ...])`` by a wrapper in ``builder`` (``builder.user.envprobe``
for ``env.py``). A probe imports nothing from ``builder`` and only the standard library at top level: the user's
environment may not hold builder, packaging or torch, and may be another Python version. Everything else (torch,
transformers, the packages asked about) is imported inside ``try`` blocks. A probe prints exactly one JSON object on
stdout and exits 0 even when things are missing: failures are facts, written into the JSON.
"""

from pathlib import Path

PROBES_DIR = Path(__file__).resolve().parent


def script(name: str) -> Path:
    """The path of probe ``name`` (``"env"`` → ``.../probes/env.py``), to hand to another interpreter."""
    return PROBES_DIR / f"{name}.py"
