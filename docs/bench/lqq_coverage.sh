#!/usr/bin/env bash
# LiquidQuant W4A8 vs cuBLAS fp16 between the bench grid's points: 69 token counts from 1 to 4096 (every ragged
# neighbour of a grid point) on the five Llama-3-8B shapes and the 1024×4096 k/v projection, kernels on quantized
# activations. Two `quantkit bench` calls (each well under the device's 10-minute limit); their rows, joined, are
# docs/logs/lqq_coverage_rule_h100.json. Run from the repository root; results go to $OUT (default ./lqq-coverage).
set -eu
OUT=${OUT:-lqq-coverage}
mkdir -p "$OUT"
S=${SHAPES:-14336x4096,4096x4096,6144x4096,28672x4096,4096x14336,1024x4096}  # SHAPES=... for others
M1=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,24,32,33,48,64,65,80,96,100,112,128,129,144,160,176,192,200,224,256,257
M1=$M1,288,300,320,352,384,416,448,480,512
M2=513,576,640,700,704,768,769,832,896,960,1000,1024,1025,1280,1536,1792,2048,2049,2560,3000,3072,3584,4096
python3 -m quantkit.cli bench --shapes $S --m $M1 --methods fp16,w4a8-lqq --json > "$OUT/coverage_a.json" \
    2> "$OUT/coverage_a.txt"
python3 -m quantkit.cli bench --shapes $S --m $M2 --methods fp16,w4a8-lqq --json > "$OUT/coverage_b.json" \
    2> "$OUT/coverage_b.txt"
