#!/usr/bin/env bash
# Sibling projections fused at load (q/k/v and gate/up as one GEMM each, quantkit/runtime/fused_siblings.py), A/B
# in one machine session: the decode step of the Llama-3.1-8B-shaped packed layers (W4A16, MixLLM W4.4A8,
# LiquidQuant W4A8) with projections and RMSNorms fused (default), projections only (QUANTKIT_FUSE_NORM=0) and
# neither (QUANTKIT_FUSE=0), batch 1, 8, 32, 128 (prefill-like M = 128
# is where the 1024-row k/v GEMMs trailed cuBLAS most). Run from the repository root; results in $OUT (default
# ./fuse-ab); step 4 of docs/bench/issue6_h100.sh builds whichever checkpoints $WORK lacks (DECODE=0).
set -u
OUT=${OUT:-fuse-ab}
export WORK=${WORK:-/dev/shm/qk-issue6}
export PYTHONPATH=$PWD
QK="python3 -m quantkit.cli"
mkdir -p "$OUT"
# all: projections and norms fused (the default); proj: QUANTKIT_FUSE_NORM=0; none: QUANTKIT_FUSE=0
VARIANTS=${VARIANTS:-"all proj none"}
OUT="$OUT/build" STEPS=4 DECODE=0 bash docs/bench/issue6_h100.sh > "$OUT/build.txt" 2>&1  # builds what is missing
for ck in l8b-w4a16 l8b-mixed l8b-lqq; do
    for v in $VARIANTS; do
        case $v in all) env="";; proj) env="QUANTKIT_FUSE_NORM=0";; none) env="QUANTKIT_FUSE=0";;
            *) echo "unknown variant '$v' (all, proj, none)" >&2; exit 2;; esac
        env -u QUANTKIT_FUSE -u QUANTKIT_FUSE_NORM $env $QK bench "$WORK/$ck" --decode-step --batch 1,8,32,128 --context 1024 --json \
            2> "$OUT/decode_${ck}_fuse_$v.txt" | tail -1 > "$OUT/decode_${ck}_fuse_$v.json"
    done
done
python3 docs/bench/decode_summary.py "$OUT" 'decode_*_fuse*.json'
# GEMM time alone (after the decode steps, so a call cut short keeps those; BENCH=0 skips it): the q/k/v shape fused
# (6144x4096) and its parts; docs/bench/fused_gemm_sum.py compares them
if [ "${BENCH:-1}" = 1 ]; then
    $QK bench --shapes 6144x4096,4096x4096,1024x4096 --m 1,2,4,8,16,64,256,1024,4096 \
        --methods fp16,w4a16,w8a8,w4a8,w4a8-lqq,mixed --json > "$OUT/bench_qkv.json" 2> "$OUT/bench_qkv.txt"
    python3 docs/bench/fused_gemm_sum.py "$OUT/bench_qkv.json" > "$OUT/bench_qkv_sum.txt"
fi
