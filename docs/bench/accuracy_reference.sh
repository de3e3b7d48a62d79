#!/usr/bin/env bash
# Accuracy figures of docs/BENCHMARKS.md on the embedded reference model (CPU or GPU; --device auto).
# Every line of the output is one `quantkit ... --json` result; the command that produced it is echoed before it.
set -euo pipefail
OUT=${1:-bench-out}
mkdir -p "$OUT"
M=builtin:reference
run() { echo "\$ $*" >&2; "$@" 2>/dev/null | tail -n 1; }

run quantkit eval-ppl $M --json
for r in rtn-w4a16-g128 gptq-w4a16-g128 awq-w4a16-g128 mixllm-w4a8-rtn mixllm-w4a8 lqq-w4a8 w8a8; do
  run quantkit eval-ppl $M --recipe $r --no-baseline --json
done
# MixLLM Tab. 1-style sequence p0 -> p10 -> p20 -> p50 -> p100 (share of 8-bit weight elements), global search
for t in 4.4 4.8 6.0 8.0; do
  run quantkit search $M --recipe mixllm-w4a8 --bits 4,8 --target-bits $t -o "$OUT/plan-global-$t.json" --json
  run quantkit eval-ppl $M --recipe mixllm-w4a8 --plan "$OUT/plan-global-$t.json" --no-baseline --json
done
# the ablation at p10: local top-k per layer, random, magnitude
for s in local random magnitude; do
  run quantkit search $M --recipe mixllm-w4a8 --bits 4,8 --target-bits 4.4 --strategy $s -o "$OUT/plan-$s-4.4.json" --json
  run quantkit eval-ppl $M --recipe mixllm-w4a8 --plan "$OUT/plan-$s-4.4.json" --no-baseline --json
done
