#!/usr/bin/env bash
# The drift check: what the newest releases on PyPI would change, and whether the tests that follow a moving
# upstream (pytest marker `drift`: transformers, kernels) still pass on them. Non-gating by design: landing CI runs
# the locked versions (requirements/test.txt); this runs nightly (.github/workflows/drift.yml) and by hand:
#     scripts/drift-check.sh [REPORT.md]          # default report: drift-report.md; exit 1 when a drift test fails
# The report is written whatever happens: exit 3 when PyPI could not be reached (no result: nothing was resolved,
# so nothing is said about the releases), exit 1 when the newest releases do not resolve together.
# It never edits the lock: when the report is green, scripts/lock-tests.sh takes the new releases on purpose.
# Steps: 1. resolve the test requirements again with --upgrade (newest releases, hashed) into a temp lock;
# 2. list every package whose version moved; 3. install that lock in a fresh venv (.venv-drift) beside the same
# CPU torch as landing CI; 4. run `pytest -m drift` (unit and network drift tests); 5. write the report.
set -uo pipefail
cd "$(dirname "$0")/.."
report=${1:-drift-report.md}
UV=${UV:-$(command -v .venv/bin/uv || command -v uv || true)}
[ -n "$UV" ] || { echo "error: no uv: pip install uv (or set UV=/path/to/uv)" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
venv=${DRIFT_VENV:-.venv-drift}

header() {
  echo "# Drift report $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "Locked (requirements/test.txt) against the newest releases on PyPI for CPython 3.11, x86_64 Linux."
  echo
}
# uv's words for a network failure: the index never answered, so the resolution says nothing about the releases
network='error sending request|connection refused|dns error|failed to lookup address|tcp connect error|timed out|network is unreachable|could not connect'

echo "drift: resolving the newest releases" >&2
if ! LOCK_UPGRADE=1 LOCK_OUT="$work/newest.txt" UV="$UV" scripts/lock-tests.sh 2>"$work/lock.log" >&2; then
  cat "$work/lock.log" >&2
  cause=$(grep -v '^\s*$' "$work/lock.log" | tail -1 | sed -E 's/^[[:space:]]*(cause:|╰─▶)?[[:space:]]*//')
  if grep -qiE "$network" "$work/lock.log"; then
    { header
      echo "**PyPI could not be reached: no result.** Nothing was resolved, installed or tested (uv: $cause)."
      echo "Run the check again when the index answers."; } >"$report"
    cat "$report"
    echo "error: PyPI unreachable: the newest releases were not resolved (uv: $cause); report: $report" >&2
    exit 3
  fi
  { header
    echo "**The newest releases do not resolve together.** uv's answer:"
    echo
    echo '```'
    tail -25 "$work/lock.log"
    echo '```'; } >"$report"
  cat "$report"
  echo "error: the newest releases do not resolve together (see above); report: $report" >&2
  exit 1
fi
cp requirements/test.txt "$work/locked.txt"

pins() { sed -nE 's/^([A-Za-z0-9._-]+)==([^ ]+).*/\1 \2/p' "$1" | sort; }
moved=$(join -a1 -a2 -e '-' -o 0,1.2,2.2 <(pins "$work/locked.txt") <(pins "$work/newest.txt") | awk '$2 != $3')

echo "drift: installing the newest releases into $venv" >&2
rm -rf "$venv"
python3 -m venv "$venv" &&
  "$venv/bin/pip" install -q --require-hashes -r "$work/newest.txt" &&
  "$venv/bin/pip" install -q --no-deps --no-build-isolation -e . torch==2.13.0 &&
  "$venv/bin/pip" check >&2
installed=$?

status=1
if [ "$installed" -eq 0 ]; then
  echo "drift: running the drift tests (pytest -m drift)" >&2
  "$venv/bin/python" -m pytest -m drift -p no:cacheprovider -q -o addopts="-ra --import-mode=importlib -n auto --dist loadfile" \
    >"$work/pytest.log" 2>&1
  status=$?
fi

{
  header
  if [ -n "$moved" ]; then
    echo "| package | locked | newest |"
    echo "| --- | --- | --- |"
    echo "$moved" | awk '{print "| " $1 " | " $2 " | " $3 " |"}'
  else
    echo "Nothing moved: the lock is the newest resolution."
  fi
  echo
  if [ "$installed" -ne 0 ]; then
    echo "**The newest releases do not install together** (pip's output is in the job log)."
  else
    echo "Drift tests (\`pytest -m drift\`) on the newest releases: **$([ "$status" -eq 0 ] && echo passed || echo FAILED)**"
    echo
    echo '```'
    grep -E '^(FAILED|ERROR)|^[0-9]+ (passed|failed)|passed|failed' "$work/pytest.log" | tail -25
    echo '```'
  fi
} >"$report"
cat "$report"
exit "$status"
