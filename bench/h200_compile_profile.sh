#!/bin/bash
# Issue 19 on the lent H200 (16 cores, sm_90): bench/compile_profile.py's compiles side by side, each variant given
# its own cores (1 + 8 + 4 + 3 = 16), then SASS comparisons and fatbin load times. One call of the device tool:
#   run(command="bash bench/h200_compile_profile.sh", carry=[".carry"], timeout_s=590)
# with .carry/ holding the two sdists (cp ~/.cache/cuda-wheel-builder/sources/{causal_conv1d-1.7.0,mamba_ssm-2.3.2.post1}.tar.gz .carry/).
# Everything lands in $OUT/h200-compile-profile.json (merged) and $OUT/log.
set -u
OUT=${OUT:-/tmp/h200-out}; W=/tmp/cp; R=$W/results; mkdir -p "$W" "$R" "$OUT"
exec > >(tee "$OUT/log") 2>&1
P="python3 -u bench/compile_profile.py"
C=bench/results/nvcc-causal-conv1d-1.7.0.json; M=bench/results/nvcc-mamba-ssm-2.3.2.post1.json
cd "$(dirname "$0")/.."; S=${SDISTS:-.carry}
CS=$S/causal_conv1d-1.7.0.tar.gz; MS=$S/mamba_ssm-2.3.2.post1.tar.gz
CAND=${CAND:-selective_scan_bwd_fp32_complex}   # mamba's longest TU, guessed before the run; the plain runs say

date -u; nproc; uptime; free -g | head -2; nvcc --version | tail -1; which cuobjdump nvdisasm fatbinary objcopy
grep -m1 'model name' /proc/cpuinfo; grep -c ^processor /proc/cpuinfo
tar xzf $CS -C $W; tar xzf $MS -C $W
cc() { $P compile --template "$1" --tu "$2" --sdist "$3" --arch 90 --work $W --variant "$4" --out "$R/$5.json"; }
T0=$(date +%s)
cc $C causal_conv1d_bwd $CS plain c-plain &
(cc $C causal_conv1d_bwd $CS "split8=--split-compile=8@8" c-split8; cc $M $CAND $MS "split8=--split-compile=8@8" m-split8) &
(cc $C causal_conv1d_bwd $CS "split4=--split-compile=4@4" c-split4; cc $M $CAND $MS "split4=--split-compile=4@4" m-split4) &
for chain in "$CAND selective_scan_bwd_bf16_real selective_scan_fwd_fp32" \
             "selective_scan_bwd_bf16_complex selective_scan_bwd_fp16_real selective_scan_fwd_bf16" \
             "selective_scan_bwd_fp16_complex selective_scan_bwd_fp32_real selective_scan_fwd_fp16"; do
  (for tu in $chain; do cc $M $tu $MS plain m-plain-$tu; done) &
done
wait
echo "compiles done after $(( $(date +%s) - T0 )) s"; uptime
o() { echo $W/$1-$2/build/temp.linux-x86_64-cpython-312/csrc/${3:-}$1.o; }
for v in split8 split4; do
  $P compare "$(o causal_conv1d_bwd plain)" "$(o causal_conv1d_bwd $v)" --out $R/cmp-c-plain-$v.json | grep -E 'differ|ident'
  $P compare "$(o $CAND plain selective_scan/)" "$(o $CAND $v selective_scan/)" --out $R/cmp-m-plain-$v.json | grep -E 'differ|ident'
done
$P compare "$(o causal_conv1d_bwd split4)" "$(o causal_conv1d_bwd split8)" --out $R/cmp-c-split4-split8.json | grep -E 'differ|ident'
timeout 100 $P load --object "$(o causal_conv1d_bwd plain)" --arch 90 --work $W/fb-c --processes 3 --repeats 10 --out $R/load-causal.json
timeout 60 $P load --object "$(o $CAND plain selective_scan/)" --arch 90 --work $W/fb-m --processes 3 --repeats 10 --out $R/load-mamba.json
python3 - "$R" "$OUT/h200-compile-profile.json" <<'EOF'
import json, sys, pathlib
r = pathlib.Path(sys.argv[1])
merged = {p.stem: json.loads(p.read_text()) for p in sorted(r.glob("*.json"))}
pathlib.Path(sys.argv[2]).write_text(json.dumps(merged, indent=1) + "\n")
print("merged", sorted(merged))
EOF
echo "all done after $(( $(date +%s) - T0 )) s"
