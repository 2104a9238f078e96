#!/bin/bash
# Issue 19 part 3, prepared, NOT yet run: module load time of each fatbin compression variant on the H200.
#   mkdir -p .carry/s5-speed/wheels && cp the sm_90 causal_conv1d and mamba_ssm wheels there (22 + 37 MB), with
#   bench/compile_profile.py beside them as in .carry/s5-speed/bench/; then one device call:
#   run(command="cd .carry/s5-speed && WHEELS=wheels bash bench/h200_fatbin_load.sh", carry=[".carry/s5-speed"])
# About 2-3 minutes: 6 distinct variants x 2 loading modes x 5 processes x 10 loads per wheel.
set -u
OUT=${OUT:-/tmp/h200-out}; mkdir -p "$OUT"; cd "$(dirname "$0")/.."
exec > >(tee "$OUT/load.log") 2>&1
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; which cuobjdump fatbinary
for w in "${WHEELS:-.carry}"/*.whl; do
  n=$(basename "$w" | cut -d- -f1)
  timeout 250 python3 -u bench/compile_profile.py load --object "$w" --arch 90 --work "/tmp/fb-$n" \
    --processes 5 --repeats 10 --out "$OUT/load-$n.json"
done
