#!/usr/bin/env bash
# Issue 6 on one GPU, in one call: the GPU tests, the kernel benchmark (`quantkit bench`, table + JSON + plot),
# packed-model perplexity with the kernels vs the torch reference (`eval-ppl --device cuda`), and the decode step
# of one decoder layer of a Llama-3.1-8B-shaped packed model (`quantkit bench PACKED --decode-step`).
# Run from the repository root; results go to $OUT (default ./issue6-out). docs/BENCHMARKS.md quotes them.
set -u
OUT=${OUT:-issue6-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD
QK="python3 -m quantkit.cli"
WORK=${WORK:-/dev/shm/qk-issue6}
STEPS=${STEPS:-"1 2 3 4"}  # a subset, e.g. STEPS="3 4", when one call has a time limit
step() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }
mkdir -p "$WORK"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv | tee "$OUT/gpu.txt"

if step 1; then
echo "== 1. GPU tests"
python3 -m pytest -q -p no:cacheprovider tests/test_kernels_w4a16.py tests/test_kernels_int8.py \
    tests/test_kernels_act.py tests/test_kernels_bench.py tests/test_eval_ppl_cuda.py tests/test_checkpoint.py \
    tests/test_quant_linear_kernels.py tests/test_kernels_a8_gemv.py tests/test_kernels_lqq_wgmma.py \
    tests/test_kernels_w8a8_wgmma.py tests/test_fused_siblings.py tests/test_sibling_inputs.py \
    tests/test_kernels_rms_norm.py tests/test_fused_norm.py tests/test_kernels_w4a16_wgmma.py \
    tests/test_kernels_lqq_ws.py tests/test_kernels_w4a16_ws.py tests/test_gluon_sass.py tests/test_kernels_lqq_cluster.py \
    2>&1 | tail -15 \
    | tee "$OUT/tests.txt"
# the SASS of every Gluon kernel the tests compiled: no write to a register a running wgmma reads
python3 docs/bench/sass_hazards.py > "$OUT/sass_hazards.txt" 2>&1; tail -1 "$OUT/sass_hazards.txt"
fi

if step 2; then
echo "== 2. packed reference model: eval-ppl with kernels vs torch reference (fp16, cuda)"
$QK search builtin:reference --recipe mixllm-w4a8 --bits 4,8 --target-bits 4.4 -o "$WORK/p10.json" --device cuda \
    > /dev/null 2>&1
for r in gptq-w4a16-g128 w8a8 lqq-w4a8 mixllm-w4a8; do
    plan=""; [ "$r" = mixllm-w4a8 ] && plan="--plan $WORK/p10.json"
    $QK pack builtin:reference --recipe $r $plan -o "$WORK/ref-$r" --target sm90 --device cuda > /dev/null 2>&1 \
        || echo "pack $r failed"
    k=$($QK eval-ppl "$WORK/ref-$r" --device cuda --dtype fp16 --json 2>/dev/null | tail -1)
    t=$(QUANTKIT_KERNELS=0 $QK eval-ppl "$WORK/ref-$r" --device cuda --dtype fp16 --json 2>/dev/null | tail -1)
    echo "{\"recipe\": \"$r\", \"kernels\": $k, \"reference\": $t}" | tee -a "$OUT/eval_ppl_cuda.jsonl"
done
fi

if step 3; then
echo "== 3. kernel benchmark"
$QK bench --shapes 14336x4096,4096x4096,6144x4096,28672x4096,4096x14336 --m 1,2,4,8,16,64,256,1024,4096 \
    --methods fp16,int_mm,fp8,w4a16,w8a8,w4a8,w4a8-lqq,mixed,w4a8-lqq+aq,mixed+aq --json --plot "$OUT/bench.png" \
    > "$OUT/bench.json" 2> "$OUT/bench.txt"
tail -5 "$OUT/bench.txt"
fi

if step 4; then
echo "== 4. decode step of one decoder layer, Llama-3.1-8B shapes (2 random layers, vocab of the shipped tokenizer)"
# what $WORK already holds is kept (a second call on the same machine); DECODE=0 only builds the checkpoints
[ -d "$WORK/l8b" ] || python3 - "$WORK/l8b" <<'EOF'
import shutil, sys, torch
from pathlib import Path
from transformers import LlamaConfig, LlamaForCausalLM
out = Path(sys.argv[1])
cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
                  num_hidden_layers=2, vocab_size=8192, max_position_embeddings=4096, rope_theta=500000.0)
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).to(torch.float16)
model.save_pretrained(out)
for f in (Path('quantkit') / 'assets' / 'reference-model').iterdir():
    if "token" in f.name:
        shutil.copy(f, out / f.name)
EOF
[ -d "$WORK/l8b-w4a16" ] || $QK pack "$WORK/l8b" --recipe rtn-w4a16-g128 -o "$WORK/l8b-w4a16" --target sm90 \
    --device cuda > /dev/null 2>&1 || echo "pack l8b rtn failed"
[ -f "$WORK/l8b-p10.json" ] || $QK search "$WORK/l8b" --recipe mixllm-w4a8 --bits 4,8 --target-bits 4.4 --calib-samples 8 \
    --seqlen 512 -o "$WORK/l8b-p10.json" --device cuda --dtype fp16 > /dev/null 2>&1 || echo "search l8b failed"
[ -d "$WORK/l8b-mixed" ] || $QK pack "$WORK/l8b" --recipe mixllm-w4a8-rtn --plan "$WORK/l8b-p10.json" \
    -o "$WORK/l8b-mixed" --target sm90 --device cuda > /dev/null 2>&1 || echo "pack l8b mixed failed"
[ -d "$WORK/l8b-lqq" ] || $QK pack "$WORK/l8b" --recipe lqq-w4a8 -o "$WORK/l8b-lqq" --target sm90 --device cuda \
    > /dev/null 2>&1 || echo "pack l8b lqq failed"
[ "${DECODE:-1}" = 1 ] && for ck in l8b-w4a16 l8b-mixed l8b-lqq; do
    $QK bench "$WORK/$ck" --decode-step --batch 1,8,32 --context 1024 --json 2> "$OUT/decode_$ck.txt" \
        | tail -1 > "$OUT/decode_$ck.json"
    cat "$OUT/decode_$ck.txt" | tail -12
done
fi
echo "== done"
