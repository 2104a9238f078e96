#!/usr/bin/env bash
# The kernel tests' proof on a GPU machine: each wheel is tested with `builder test` against the expectation
# given with it, so a fixed wheel must pass and a planted-fault wheel must fail (or the sanitizer must find its
# bad access). Runs offline from a clone, with the machine's own python3 and torch; uv on PATH (or a carried
# .carry/uv.xz) is the one thing the builder needs beyond what such an image has.
#
#   scripts/gpu-kernel-proof.sh EXPECT:WHEEL [EXPECT:WHEEL ...]
#
# EXPECT: pass | fail (the full kernel suite), memcheck-pass | memcheck-fail | racecheck-pass (the --quick set
# under `builder test --sanitize TOOL`; needs a GPU host that runs compute-sanitizer: the H100 does, gVisor does
# not). Each run's kernel-tests.json (and sanitizer log) lands in $OUT (default /tmp/proof-out) as NN-<what>.*;
# the last lines are a table, and the exit status is the number of unmet expectations.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/proof-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ! command -v uv >/dev/null && [ -f .carry/uv.xz ]; then
  mkdir -p /tmp/uvbin && xz -dc .carry/uv.xz > /tmp/uvbin/uv && chmod +x /tmp/uvbin/uv && export PATH=/tmp/uvbin:$PATH
fi
nvidia-smi -L; python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)'
table=(); unmet=0; n=0
for spec in "$@"; do
  expect=${spec%%:*}; wheel=${spec#*:}; n=$((n + 1)); tag=$(printf '%02d-%s' "$n" "$expect")
  args=(--python python3 --require-kernel-tests --no-promote)
  case $expect in
    pass|fail) ;;
    memcheck-*|racecheck-*) args+=(--sanitize "${expect%%-*}") ;;
    *) echo "unknown expectation $expect (pass, fail, memcheck-pass, memcheck-fail, racecheck-pass)"; exit 2 ;;
  esac
  export BUILDER_CACHE_DIR=/tmp/proof-cache-$n
  echo; echo "######## $tag: builder test $(basename "$wheel") ${args[*]}"
  start=$SECONDS
  python3 -m builder test "$wheel" "${args[@]}" --wheelhouse "/tmp/proof-wh-$n" 2>&1 | tee "$OUT/$tag.log"
  rc=${PIPESTATUS[0]}; took=$((SECONDS - start))
  for f in "$BUILDER_CACHE_DIR"/tests/*/kernel-tests.json; do [ -f "$f" ] && cp "$f" "$OUT/$tag.json"; done
  for f in "$BUILDER_CACHE_DIR"/tests/*/sanitizer-*.log; do [ -f "$f" ] && cp "$f" "$OUT/$tag-sanitizer.log"; done
  [ -f "$OUT/$tag.json" ] && python3 scripts/kernel-report-summary.py "$OUT/$tag.json"
  if { [ "${expect##*-}" = pass ] || [ "$expect" = pass ]; } && [ "$rc" -eq 0 ]; then verdict=met
  elif { [ "${expect##*-}" = fail ] || [ "$expect" = fail ]; } && [ "$rc" -ne 0 ]; then verdict=met
  else verdict=UNMET; unmet=$((unmet + 1)); fi
  table+=("$tag $(basename "$wheel"): exit $rc in ${took}s, expected $expect: $verdict")
done
echo; printf '%s\n' "${table[@]}" | tee "$OUT/table.txt"
exit "$unmet"
