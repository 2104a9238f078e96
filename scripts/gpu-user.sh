#!/usr/bin/env bash
# The user's side on a GPU machine: `builder doctor`, then `builder install` of packages from given wheelhouses
# into the machine's python3 (its torch held), then doctor again; torch, triton and transformers are listed before
# and after, and a changed torch fails the run. doctor's --json answer comes back as $OUT/doctor-after.json.
#
#   scripts/gpu-user.sh --from WHEELHOUSE PACKAGE [PACKAGE ...] [--from WHEELHOUSE PACKAGE ...]
#
# WHEELHOUSE: a folder the builder published or staged into (wheels/ or staging/ with their index pages); each
# PACKAGE is installed from the --from before it; doctor matches against the last one. To check transformers'
# kernel bindings with another transformers than the machine's, put it first on PYTHONPATH.
# shellcheck source=scripts/gpu-lib.sh
source "$(dirname "$0")/gpu-lib.sh"
case ${1:-} in -h|--help) usage 0 ;; --from) ;; *) usage ;; esac
installs=(); from=""
while [ $# -gt 0 ]; do
  case $1 in
    --from) [ $# -ge 2 ] || usage; need_dir "$2"; from=$2; shift 2 ;;
    -*) die "unknown option $1" ;;
    *) installs+=("$from" "$1"); shift ;;
  esac
done
[ ${#installs[@]} -gt 0 ] || die "no PACKAGE after --from $from"

start "gpu-user"
versions() { "$PY" -m pip list 2>/dev/null | grep -iE '^(torch|triton|transformers|kernels) ' | tee "$OUT/$1"; }
versions pip-before.txt
step "${B[@]}" doctor --python "$PY" --from "$from"
for ((i = 0; i < ${#installs[@]}; i += 2)); do
  step "${B[@]}" install "${installs[i + 1]}" --python "$PY" --from "${installs[i]}" --offline
done
versions pip-after.txt
"$PY" -m pip list 2>/dev/null | tee "$OUT/pip-list-after.txt" > /dev/null
step "${B[@]}" doctor --python "$PY" --from "$from"
"${B[@]}" doctor --python "$PY" --from "$from" --json > "$OUT/doctor-after.json" 2>> "$OUT/gpu.log" \
  || failed=$((failed + 1))
if [ "$(grep -i '^torch ' "$OUT/pip-before.txt")" = "$(grep -i '^torch ' "$OUT/pip-after.txt")" ]; then
  echo "torch unchanged" | tee -a "$OUT/gpu.log"
else
  echo "TORCH CHANGED by the installs" | tee -a "$OUT/gpu.log"; failed=$((failed + 1))
fi
finish
