#!/bin/bash
# Issue 19 on the lent H200 (16 cores, sm_90): two whole `builder build --toolchain host` runs of one package side
# by side, each on its own half of the machine (taskset: cores 0-7 and 8-15, MAX_JOBS 8 each, the compiler cache
# off, the same sdist, fresh cache and wheelhouse folders), then the two wheels' GPU code compared cubin by cubin
# (bench/compile_profile.py same-code). A and B are bench/build_vs_upstream.py variants of this tree's recipes:
# defaults, no-ptxas-split, issue-19-before (no split, nvcc's default compression: the builder's flags before
# issue 19). One call of the device tool per pair:
#   run(command="bash bench/h200_build_speed.sh causal-conv1d 1.7.0 causal_conv1d-1.7.0.tar.gz issue-19-before defaults",
#       carry=[".carry/src"])
# with .carry/src the sdists. KERNEL_TESTS=--require-kernel-tests or --no-kernel-tests (default).
# Results: $OUT/<package>-<A>-<B>.json and the logs.
set -u
cd "$(dirname "$0")/.."
PKG=$1 VER=$2 SDIST=$PWD/.carry/src/$3 A=$4 B=$5
OUT=${OUT:-/tmp/h200-out}; mkdir -p "$OUT"
TAG=$PKG-$A-$B
exec > >(tee "$OUT/$TAG.log") 2>&1
export PYTHONUNBUFFERED=1 COLUMNS=160
export PATH=$PATH:/usr/local/cuda/bin
date -u; nproc; free -g | head -2; nvcc --version | tail -1; nvidia-smi -L
python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)'
WORK=$(mktemp -d /tmp/speed-XXXXXX)  # a warm machine keeps /tmp: never reuse an earlier run's cache or wheelhouse
python3 bench/build_vs_upstream.py --write-recipes "$WORK" --package "$PKG" --variant "$A" --variant "$B" || exit 1
side() {  # variant cpus
  local name=$1 cpus=$2
  BUILDER_CACHE_DIR=$WORK/bc-$name taskset -c "$cpus" \
    /usr/bin/time -f "WALL %e s, peak RSS of the largest process %M KiB" \
    python3 -m builder build "$PKG" --version "$VER" --cuda 13.0 --arch 90 --toolchain host --python python3 \
      --offline --source "$SDIST" --jobs 8 --compiler-cache off ${KERNEL_TESTS:---no-kernel-tests} \
      --recipes "$WORK/recipes-$name/recipes" --wheelhouse "$WORK/wh-$name" > "$OUT/$TAG-$name.log" 2>&1
  echo "$name exit $?"
}
T0=$(date +%s)
side "$A" 0-7 & a=$!
side "$B" 8-15 & b=$!
wait $a $b  # not a bare wait: it would wait for the tee above too
grep -H "parallel:\|nvcc flags" "$OUT/$TAG-$A.log" "$OUT/$TAG-$B.log" | head -4
echo "both done after $(( $(date +%s) - T0 )) s"
for name in "$A" "$B"; do tail -4 "$OUT/$TAG-$name.log"; done
python3 - "$PKG" "$WORK" "$A" "$B" "$OUT/$TAG.json" <<'EOF'
import json, pathlib, subprocess, sys
pkg, work, a, b, out = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3], sys.argv[4], pathlib.Path(sys.argv[5])
result = {}
for name in (a, b):
    recs = sorted((work / f"wh-{name}/records").glob("*.whl.json"))
    rec = json.loads(recs[0].read_text()) if recs else {}
    wheels = sorted((work / f"wh-{name}/wheels").glob("*.whl"))
    result[name] = {"timings": rec.get("timings"), "toolchain": rec.get("toolchain"), "parallel": rec.get("parallel"),
                    "tests": (rec.get("tests") or {}).get("counts"), "kernel_status": (rec.get("tests") or {}).get("kernel_status"),
                    "wheel": wheels[0].name if wheels else None, "wheel_bytes": wheels[0].stat().st_size if wheels else None}
if all(result[n]["wheel"] for n in (a, b)):
    cmp = subprocess.run([sys.executable, "bench/compile_profile.py", "same-code",
                          *(str(next((work / f"wh-{n}/wheels").glob("*.whl"))) for n in (a, b)),
                          "--work", str(work / "same"), "--out", str(work / "same.json")], capture_output=True, text=True)
    print(cmp.stdout[-1500:], cmp.stderr[-1500:])
    detail = json.loads((work / "same.json").read_text())
    result["same_code"] = {"same_code": detail["same_code"],
                           "cubins": {k: {kk: vv for kk, vv in v.items() if kk != "differing_sections"}
                                      | {"differing": len(v["differing_sections"])} for k, v in detail["cubins"].items()}}
out.write_text(json.dumps(result, indent=1) + "\n")
print(json.dumps(result, indent=1)[:3000])
EOF
echo "all done after $(( $(date +%s) - T0 )) s"
