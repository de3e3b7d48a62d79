#!/usr/bin/env bash
# Programmatic dependent launch, A/B in one machine session: the decode-size kernel bench (activation quantizer
# included: +aq) and the decode step of the Llama-3.1-8B-shaped packed layers (W4A16, MixLLM W4.4A8, LiquidQuant
# W4A8), each with QUANTKIT_PDL=1 (default) and QUANTKIT_PDL=0. Run from the repository root; results in $OUT
# (default ./pdl-ab); step 4 of docs/bench/issue6_h100.sh builds whichever checkpoints $WORK lacks (DECODE=0: no
# decode runs there). The session-8 run packed the LiquidQuant one in this script, before step 4 did.
set -u
OUT=${OUT:-pdl-ab}
export WORK=${WORK:-/dev/shm/qk-issue6}
export PYTHONPATH=$PWD
QK="python3 -m quantkit.cli"
mkdir -p "$OUT"
PDLS=${PDLS:-"1 0"}  # a subset, e.g. PDLS=1, when the other half ran in an earlier call on the same machine
for pdl in $PDLS; do
    QUANTKIT_PDL=$pdl $QK bench --shapes 14336x4096,4096x4096,6144x4096,28672x4096,4096x14336 --m 1,2,4,8,16 \
        --methods fp16,w4a16,w4a8-lqq,w4a8-lqq+aq,mixed,mixed+aq --json > "$OUT/bench_pdl$pdl.json" \
        2> "$OUT/bench_pdl$pdl.txt"
done
OUT="$OUT/build" STEPS=4 DECODE=0 bash docs/bench/issue6_h100.sh > "$OUT/build.txt" 2>&1  # builds what is missing
for ck in l8b-w4a16 l8b-mixed l8b-lqq; do
    for pdl in $PDLS; do
        QUANTKIT_PDL=$pdl $QK bench "$WORK/$ck" --decode-step --batch 1,8,32 --context 1024 --json \
            2> "$OUT/decode_${ck}_pdl$pdl.txt" | tail -1 > "$OUT/decode_${ck}_pdl$pdl.json"
    done
done
python3 docs/bench/decode_summary.py "$OUT" 'decode_*_pdl*.json'
