#!/usr/bin/env bash
# A stable-ABI (or any) wheel on a GPU machine with the machine's own torch: `builder test` with the kernel tests
# required (promoted into the wheelhouse it lies in, else tested without promotion), then, optionally, the
# project's own test suite from its sdist against the installed wheel, and a downstream script of ours.
#
#   scripts/gpu-stable.sh WHEEL [--with WHEEL ...] [--upstream SDIST [-k EXPR]] [--downstream SCRIPT] [--no-bench]
#
# --with WHEEL: installed beside it for the test (`builder test --with`: flash-linear-attention over fla-core).
# --upstream SDIST: the sdist's tests/ run with pytest against the wheel (unpacked into a folder first on
#   PYTHONPATH, away from the sdist's own package); -k EXPR picks cases, e.g. `-k determin`; UPSTREAM_TIMEOUT
#   (seconds, default 600) bounds it; junit XML in $OUT/upstream-junit.xml.
# --downstream SCRIPT: run with the wheel importable, e.g. scripts/downstream_causal_conv1d_cuda.py.
# A torch floor or a per-torch abi3 wheel built elsewhere is tested the same way; several wheels with expected
# outcomes: scripts/gpu-kernel-proof.sh.
# shellcheck source=scripts/gpu-lib.sh
source "$(dirname "$0")/gpu-lib.sh"
case ${1:-} in -h|--help) usage 0 ;; ""|-*) usage ;; esac
wheel=$1; shift
need_file "$wheel"
sdist=""; expr=""; downstream=""; opts=()  # passed to builder test
while [ $# -gt 0 ]; do
  case $1 in
    --upstream) [ $# -ge 2 ] || usage; need_file "$2"; sdist=$2; shift 2 ;;
    -k) [ $# -ge 2 ] || usage; expr=$2; shift 2 ;;
    --downstream) [ $# -ge 2 ] || usage; need_file "$2"; downstream=$2; shift 2 ;;
    --no-bench) opts+=(--no-bench); shift ;;
    --with) [ $# -ge 2 ] || usage; need_file "$2"; opts+=(--with "$2"); shift 2 ;;
    *) die "unknown argument $1" ;;
  esac
done
[ -z "$expr" ] || [ -n "$sdist" ] || die "-k needs --upstream SDIST"
case $sdist in ""|*.tar.gz) ;; *) die "--upstream takes a .tar.gz sdist" ;; esac

start "gpu-stable $(basename "$wheel")"
W=$(wheelhouse_of "$wheel")
if [ -n "$W" ]; then
  step "${B[@]}" test "$wheel" --python "$PY" --require-kernel-tests --wheelhouse "$W" ${opts[@]+"${opts[@]}"}
else
  step "${B[@]}" test "$wheel" --python "$PY" --require-kernel-tests --no-promote --wheelhouse /tmp/gpu-stable-wh \
    ${opts[@]+"${opts[@]}"}
fi
save_reports stable
[ -n "$W" ] && save_wheelhouse "$W" stable
if [ -n "$sdist$downstream" ]; then
  site=$(mktemp -d /tmp/gpu-stable-site.XXXXXX)
  step "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheel" || finish
fi
if [ -n "$downstream" ]; then
  step env PYTHONPATH="$site:$PYTHONPATH" "$PY" "$downstream"
fi
if [ -n "$sdist" ]; then
  # the tests alone, run from a folder without the sdist's unpatched package beside them
  tests=$(mktemp -d /tmp/gpu-upstream-tests.XXXXXX)
  tar xzf "$sdist" -C "$tests" --wildcards '*/tests/*' || die "no tests/ folder in $sdist"
  (cd "$tests" && step timeout "${UPSTREAM_TIMEOUT:-600}" env PYTHONPATH="$site" "$PY" -m pytest -q \
    -p no:cacheprovider ./*/tests ${expr:+-k "$expr"} --junitxml="$OUT/upstream-junit.xml") || failed=$((failed + 1))
fi
finish
