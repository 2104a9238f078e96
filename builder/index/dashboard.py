"""The wheelhouse dashboard: one static page (wheelhouse/index.html) written with the index.

It shows the matrix package × version × CUDA/torch × arch × Python × CPU platform with each wheel's status, the archs found in
its shared objects, the import and kernel test results (passed / skipped with the reason / failed), the kernel
speed against the pure-torch reference, the wheel size and links to the wheel, its metadata, record and build log.
A stable-ABI wheel (one ``cp310-abi3`` wheel per CUDA major, ``+cu13``) shows its torch floor in the torch column
and, with its tests, each torch it was checked on and how, and the channels that list it (checks.wheel_channels).
A channel holds both platforms' wheels (x86_64 and aarch64
files side by side, as on PyPI): the platform column and each matrix cell say which is which.
Everything comes from the wheels' file names and their records (the rows: index/dashrows.py); no JavaScript, so any
browser (or ``chromium --dump-dom``) shows the same thing.
"""

from __future__ import annotations

import html
import math
import time
from collections.abc import Mapping

from builder.core.fsutil import human_size
from builder.core.log import plural
from builder.index.dashrows import Row, version_key
from builder.index.layout import simple_path
from builder.model.records import TorchCheck


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def _e(text: object) -> str:
    return html.escape(str(text))


# ------------------------------------------------------------------------------------------------ rendering


def render_dashboard(rows: list[Row], labels: list[str], *, staging_area: bool = False) -> str:
    rows = sorted(rows, key=lambda r: (r.package, version_key(r.version), r.cuda, r.torch, r.python, r.platform,
                                       r.area))
    title = "Wheelhouse staging" if staging_area else "Wheelhouse"
    order = ["passed", "skipped", "failed", "staged", "import only", "unknown"]
    counts = {s: sum(r.status == s for r in rows) for s in order}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    packages = len({r.package for r in rows})
    channels = "".join(
        f'<li><a href="{_e(simple_path(lab))}"><code>{_e(lab)}</code></a></li>' for lab in labels
    ) or "<li>none yet</li>"
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title}: {plural(len(rows), "wheel")}</title>
<style>{_CSS}</style>
</head>
<body>
<header>
  <h1>{title}</h1>
  <p class="summary" id="summary">{plural(len(rows), "wheel")} of {plural(packages, "package")}{": " + summary if summary else ""}</p>
  <nav>
    <div><b>Combined index</b> <a href="{simple_path()}"><code>{simple_path()}</code></a>
      (PEP 503 HTML + PEP 691 JSON, PEP 658 metadata)</div>
    <div><b>Channels</b> (one per CUDA + torch): <ul class="channels">{channels}</ul></div>
  </nav>
</header>
<main>
<h2>Matrix</h2>
{_matrix(rows)}
<h2>Wheels</h2>
{_table(rows)}
</main>
<footer>generated {stamp} by cuda-wheel-builder from the wheels and their records</footer>
</body>
</html>
"""


def _badge(status: str) -> str:
    return f'<span class="badge {status.replace(" ", "-")}">{_e(status)}</span>'


def _matrix(rows: list[Row]) -> str:
    """Rows: package + version. Columns: CUDA/torch. Cells: one badge per (Python, platform, archs) wheel."""
    if not rows:
        return '<p class="empty">No wheels published yet.</p>'
    columns = sorted({(r.cuda, r.torch) for r in rows}, key=lambda c: (version_key(c[0]), version_key(c[1])))
    lines = ['<table class="matrix" id="matrix"><thead><tr><th>package</th><th>version</th>']
    lines += [f"<th>CUDA {_e(c)}<br><small>torch {_e(t)}</small></th>" for c, t in columns]
    lines.append("</tr></thead><tbody>")
    keys = sorted({(r.package, r.version) for r in rows}, key=lambda k: (k[0], version_key(k[1])))
    for package, version in keys:
        lines.append(f"<tr><th>{_e(package)}</th><td>{_e(version)}</td>")
        for column in columns:
            cells = [r for r in rows if (r.package, r.version, (r.cuda, r.torch)) == (package, version, column)]
            inner = "".join(
                f'<div class="cell" data-status="{_e(r.status)}" data-platform="{_e(r.platform)}">Python '
                f'{_e(r.python)} · {_platform_tag(r.platform)}{_e(", ".join(r.archs_found) or "no GPU code")} '
                f'{_badge(r.status)}</div>'
                for r in cells
            )
            lines.append(f"<td>{inner or '<span class=dim>—</span>'}</td>")
        lines.append("</tr>")
    lines.append("</tbody></table>")
    return "\n".join(lines)


def _platform_tag(platform: str) -> str:
    """``aarch64 · `` in a matrix cell; nothing for a pure-Python wheel (it serves every platform)."""
    return "" if platform == "any" else f'<span class="platform {_e(platform)}">{_e(platform)}</span> · '


def _tests_cell(r: Row) -> str:
    parts = [f"import {_badge(r.import_status)}"]
    counts = r.counts
    total = sum(counts.values())
    if r.kernel_status == "passed":
        skipped = counts.get("skipped", 0)
        parts.append(f"kernel {_badge('passed')} {counts.get('passed', 0)}/{total}" + (f" on {_e(r.gpu)}" if r.gpu else "")
                     + (f" ({skipped} skipped)" if skipped else ""))
        parts.append(_evidence_line(r))
    elif r.kernel_status == "failed":
        detail = f"{counts.get('failed', 0)} of {total} failed" if total else ""
        parts.append(f"kernel {_badge('failed')} {detail}" + (f'<div class="reason">{_e(r.kernel_reason)}</div>'
                                                               if r.kernel_reason else ""))
    elif r.kernel_status == "skipped":
        parts.append(f'kernel {_badge("skipped")}<div class="reason">{_e(r.kernel_reason or "no reason recorded")}</div>')
    else:
        parts.append(f"kernel {_badge('not run')}" + (f'<div class="reason">{_e(r.kernel_reason)}</div>'
                                                      if r.kernel_reason else ""))
    cell = "<br>".join(parts)
    return cell + _stable_cell(r) if r.stable else cell


def _evidence_line(r: Row) -> str:
    """Which of the wheel's archs its kernels ran on: ``kernel evidence: sm_90 (sm_120 untested)``; a record without
    the GPU's capability says the arch is unknown."""
    shipped = list(dict.fromkeys(a if a.startswith("sm_") else f"sm_{a}" for a in r.sass)) or [
        f"sm_{a.split('+')[0]}" for a in r.archs_requested]
    if not r.tested_arch:
        return '<span class="dim">kernel evidence: unknown arch (the record names no GPU capability)</span>'
    rest = [a for a in shipped if a not in r.tested_arch.split(",")]
    return (f"kernel evidence: {_e(r.tested_arch)}"
            + (f' <span class="dim">({_e(",".join(rest))} untested)</span>' if rest else ""))


_HOW = {"import+registration": "import + registration", "gpu-kernel-tests": "GPU kernel tests"}


def _check_line(check: TorchCheck) -> str:
    """``torch 2.11.0 (cu13.0, py3.12): GPU kernel tests passed``, the detail under a failed one."""
    python = ".".join(check.python.split(".")[:2])
    where = ", ".join(x for x in (f"cu{check.cuda}" if check.cuda else "", f"py{python}" if python else "") if x)
    status = check.status or "unknown"
    line = (f"torch {_e(check.torch)}" + (f" ({_e(where)})" if where else "")
            + f": {_e(_HOW.get(check.how, check.how or 'checked'))} {_badge(status)}")
    if check.detail and not check.passed:
        line += f'<div class="reason">{_e(check.detail)}</div>'
    return f'<li class="torch-check" data-torch="{_e(check.torch)}" data-status="{_e(status)}">{line}</li>'


def _stable_cell(r: Row) -> str:
    """A stable-ABI wheel's torch checks and the channels that list it."""
    checks = "".join(_check_line(c) for c in r.torch_checks) + "".join(
        f'<li class="torch-check" data-torch="{_e(c.torch)}" data-status="not checked">torch {_e(c.torch)}: '
        f'{_badge("not checked")}<div class="reason">{_e(c.detail or "not checked (an --offline build)")}</div></li>'
        for c in r.torch_unchecked)
    head = f"stable ABI, torch {_e(r.torch)}"
    checked = (f"{head}, checked on:<ul class=checks>{checks}</ul>" if checks
               else f'{head}, <span class="dim">checked on no torch yet</span><br>')
    channels = (", ".join(f"<code>{_e(c)}</code>" for c in r.channels) if r.channels
                else '<span class="dim">none (only the combined index): no torch check passed</span>')
    return f'<div class="stable">{checked}channels: {channels}</div>'


def _number(value: object, fmt: str, suffix: str = "") -> str:
    """A measured number, or a dash where the benchmark produced none (it failed or was refused)."""
    return f"{float(value):{fmt}}{suffix}" if isinstance(value, (int, float)) else "—"


def _speed_row(s: Mapping[str, str | float | int]) -> str:
    """One benchmark row; a failed benchmark shows its error instead of numbers."""
    if s.get("error"):
        return f"<tr><td>{_e(s.get('name', ''))}</td><td colspan=4 class=dim>{_e(str(s['error']))}</td></tr>"
    return (f"<tr><td>{_e(s.get('name', ''))}</td><td>{_number(s.get('kernel_ms'), '.3f')}</td>"
            f"<td>{_number(s.get('reference_ms'), '.3f')}</td><td>{_number(s.get('speedup'), '.1f', '×')}</td>"
            f"<td>{_number(s.get('kernel_gbps'), '.0f')}</td></tr>")


def _speed_cell(r: Row) -> str:
    speedups = [float(v) for s in r.speed if isinstance(v := s.get("speedup"), (int, float)) and v > 0]
    if not speedups:
        return '<span class="dim">—</span>'
    head = (f'<span class="speedup">{_geomean(speedups):.1f}×</span> geo-mean of {len(speedups)} '
            f'({min(speedups):.1f}–{max(speedups):.1f}×)')
    cases = "".join(_speed_row(s) for s in r.speed)
    return (f"{head}<details><summary>cases</summary><table class=cases><tr><th>case</th><th>kernel ms</th>"
            f"<th>reference ms</th><th>speedup</th><th>GB/s</th></tr>{cases}</table></details>")


def _table(rows: list[Row]) -> str:
    if not rows:
        return ""
    head = ("<tr><th>package</th><th>version</th><th>CUDA</th><th>torch</th><th>Python</th><th>platform</th>"
            "<th>arch asked</th>"
            "<th>archs found</th><th>status</th><th>tests</th><th>kernel speed vs reference</th><th>size</th>"
            "<th>files</th></tr>")
    body = []
    for r in rows:
        links = " · ".join(f'<a href="{_e(href)}">{_e(kind)}</a>' for kind, href in r.links.items())
        found = ", ".join(r.sass + [f"{p} (PTX)" for p in r.ptx]) or '<span class="dim">no GPU code</span>'
        if r.variant:
            found += f'<br><small>variant {_e(r.variant)}: uv picks it for this GPU</small>'
        asked = ", ".join(f"sm_{a}" if a[:1].isdigit() else a for a in r.archs_requested) or "—"
        body.append(
            f'<tr class="wheel" data-wheel="{_e(r.filename)}" data-status="{_e(r.status)}" '
            f'data-platform="{_e(r.platform)}">'
            f"<td>{_e(r.package)}</td><td>{_e(r.version)}<br><small>+{_e(r.label)}</small></td>"
            f"<td>{_e(r.cuda)}</td><td>{_e(r.torch)}"
            + ("<br><small>stable ABI</small>" if r.stable else "")
            + f"</td><td>{_e(r.python)}</td><td class=\"platform\">{_e(r.platform)}</td><td>{_e(asked)}</td>"
            f"<td>{found}</td><td>{_badge(r.status)}"
            + ('<div class="reason">in staging, awaiting GPU tests</div>' if r.status == "staged" else "")
            + f"</td><td>{_tests_cell(r)}</td><td>{_speed_cell(r)}</td>"
            f'<td class="num">{human_size(r.size)}</td><td>{links}</td></tr>'
        )
    return f'<table class="wheels" id="wheels"><thead>{head}</thead><tbody>\n' + "\n".join(body) + "\n</tbody></table>"


_CSS = """
body { font: 14px/1.4 system-ui, -apple-system, "DejaVu Sans", sans-serif; margin: 0; color: #1b1f24; background: #f6f8fa; }
header { background: #0d1117; color: #e6edf3; padding: 14px 24px; }
header a { color: #7cc4ff; }
header h1 { margin: 0 0 4px; font-size: 22px; }
nav { display: flex; gap: 32px; flex-wrap: wrap; margin-top: 6px; }
ul.channels { display: inline; padding: 0; margin: 0; }
ul.channels li { display: inline; margin-right: 10px; list-style: none; }
main { padding: 8px 24px 24px; }
h2 { font-size: 16px; margin: 18px 0 6px; }
table { border-collapse: collapse; background: #fff; box-shadow: 0 1px 2px rgba(0,0,0,.08); }
th, td { border: 1px solid #d0d7de; padding: 5px 8px; vertical-align: top; text-align: left; }
thead th { background: #eaeef2; font-weight: 600; }
td.num { text-align: right; white-space: nowrap; }
table.wheels td:first-child, table.wheels td:nth-child(2), table.wheels td:nth-child(4) { white-space: nowrap; }
.badge { display: inline-block; padding: 0 7px; border-radius: 10px; font-size: 12px; font-weight: 600; color: #fff; background: #6e7781; }
.badge.passed { background: #1a7f37; } .badge.failed { background: #cf222e; }
.badge.skipped { background: #bf8700; } .badge.staged { background: #8250df; }
.badge.import-only { background: #0969da; } .badge.not-run, .badge.unknown { background: #8c959f; }
.reason { color: #57606a; font-size: 12px; max-width: 320px; }
.speedup { font-weight: 700; color: #1a7f37; }
.dim { color: #8c959f; }
.cell { white-space: nowrap; margin: 2px 0; }
span.platform { font-size: 12px; font-weight: 600; }
span.platform.aarch64 { color: #8250df; }
details summary { cursor: pointer; color: #0969da; font-size: 12px; }
table.cases { font-size: 12px; margin-top: 4px; }
ul.checks { margin: 2px 0 4px; padding-left: 18px; }
div.stable { margin-top: 4px; font-size: 12px; }
footer { color: #57606a; font-size: 12px; padding: 0 24px 16px; }
"""
