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
# not). Each run's log, kernel-tests.json and sanitizer log land in $OUT/runs/ (default OUT=/tmp/proof-out) as
# NN-<what>.*, packed into $OUT/runs.tgz at the end; $OUT/table.txt grows a line per run (so a run cut short keeps
# the lines of those that ended), and the exit status is the number of unmet expectations.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/proof-out}; RUNS=$OUT/runs; mkdir -p "$RUNS"
pack() { tar czf "$OUT/runs.tgz" -C "$OUT" runs && rm -rf "$RUNS"; }
trap pack EXIT
export PYTHONUNBUFFERED=1 COLUMNS=160 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if ! command -v uv >/dev/null && [ -f .carry/uv.xz ]; then
  mkdir -p /tmp/uvbin && xz -dc .carry/uv.xz > /tmp/uvbin/uv && chmod +x /tmp/uvbin/uv && export PATH=/tmp/uvbin:$PATH
fi
nvidia-smi -L; python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)'
table=(); unmet=0; n=0
for spec in "$@"; do
  expect=${spec%%:*}; wheel=${spec#*:}; n=$((n + 1)); tag=$(printf '%02d-%s' "$n" "$expect")
  args=(--python "${PROOF_PYTHON:-python3}" --require-kernel-tests --no-promote)
  case $expect in
    pass|fail) ;;
    memcheck-*|racecheck-*) args+=(--sanitize "${expect%%-*}") ;;
    *) echo "unknown expectation $expect (pass, fail, memcheck-pass, memcheck-fail, racecheck-pass)"; exit 2 ;;
  esac
  left=$(( ${DEADLINE:-3600} - SECONDS - 20 ))  # DEADLINE: seconds for the whole script (a lease's call limit)
  if [ "$left" -lt 30 ]; then
    table+=("$tag $(basename "$wheel"): not run (DEADLINE reached)"); echo "${table[-1]}" >> "$OUT/table.txt"
    unmet=$((unmet + 1)); continue
  fi
  export BUILDER_CACHE_DIR=/tmp/proof-cache-$n
  echo; echo "######## $tag: builder test $(basename "$wheel") ${args[*]}"
  start=$SECONDS
  timeout "$left" python3 -m builder test "$wheel" "${args[@]}" --wheelhouse "/tmp/proof-wh-$n" > "$RUNS/$tag.log" 2>&1
  rc=$?; took=$((SECONDS - start))
  grep -v '^passed \|^skipped ' "$RUNS/$tag.log" | tail -n 25
  for f in "$BUILDER_CACHE_DIR"/tests/*/kernel-tests.json; do [ -f "$f" ] && cp "$f" "$RUNS/$tag.json"; done
  for f in "$BUILDER_CACHE_DIR"/tests/*/sanitizer-*.log; do [ -f "$f" ] && cp "$f" "$RUNS/$tag-sanitizer.log"; done
  [ -f "$RUNS/$tag.json" ] && python3 scripts/kernel-report-summary.py "$RUNS/$tag.json" | tee -a "$OUT/summary.txt"
  [ -f "$RUNS/$tag-sanitizer.log" ] && grep -m 12 -E 'ERROR SUMMARY|Invalid|Address|at .*kernel|Device not' "$RUNS/$tag-sanitizer.log"
  if { [ "${expect##*-}" = pass ] || [ "$expect" = pass ]; } && [ "$rc" -eq 0 ]; then verdict=met
  elif { [ "${expect##*-}" = fail ] || [ "$expect" = fail ]; } && [ "$rc" -ne 0 ]; then verdict=met
  else verdict=UNMET; unmet=$((unmet + 1)); fi
  table+=("$tag $(basename "$wheel"): exit $rc in ${took}s, expected $expect: $verdict")
  echo "${table[-1]}" >> "$OUT/table.txt"
done
echo; printf '%s\n' "${table[@]}"
exit "$unmet"
