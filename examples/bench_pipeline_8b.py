"""Time quantkit's heavy jobs on a Llama-3.1-8B-architecture model with random weights (timing only — random
weights say nothing about accuracy). Prints wall time and peak GPU memory per job.

    python examples/bench_pipeline_8b.py --job gptq   --samples 128 --seqlen 2048   # issue: GPTQ W4A16 speed
    python examples/bench_pipeline_8b.py --job search --samples 128 --seqlen 2048   # MixLLM salience search speed
    python examples/bench_pipeline_8b.py --job pack   --save-dir /tmp/l8b --pack-dir /tmp/l8b-w4  # RTN pack speed

The model is built on the CPU in fp16 (weights ~ N(0, 0.02)), and the jobs run the same library code as the CLI:
GPTQ goes decoder layer by decoder layer to the GPU (quantkit.quant.apply.quantize_model), the search keeps the
whole model on the GPU with layer recomputation (quantkit.search.salience.compute_salience), and the pack job saves
the model as an ordinary HF folder and times `quantkit pack` on it (quantkit.pack.run_pack: load, RTN on the GPU,
repack for sm90, write shards) — the path a user takes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import torch

LLAMA_31_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                   num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                   rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False)


def build_model(layers: int, device: str):
    from transformers import LlamaConfig, LlamaForCausalLM
    try:
        from transformers.initialization import no_init_weights  # transformers 5
    except ImportError:
        from transformers.modeling_utils import no_init_weights  # transformers 4

    cfg = LlamaConfig(**dict(LLAMA_31_8B, num_hidden_layers=layers))
    with no_init_weights(), torch.device(device):
        model = LlamaForCausalLM(cfg).to(torch.float16)
    gen = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=gen)
    return model.eval()


@contextlib.contextmanager
def layer_printer(desc: str, total: int | None):
    """Progress as plain timestamped lines (the device log has no terminal)."""
    t0 = time.time()

    def update(done: int, tot: int) -> None:
        print(f"{desc}: {done}/{tot} at {time.time() - t0:.1f}s", flush=True)

    yield update


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", choices=["gptq", "search", "pack"], required=True)
    ap.add_argument("--samples", type=int, default=128)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--recipe", default=None)
    ap.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (a smoke test of the script)")
    ap.add_argument("--save-dir", default="/tmp/llama8b-random")
    ap.add_argument("--pack-dir", default="/tmp/llama8b-random-packed")
    args = ap.parse_args()

    from quantkit.quant.recipe import load_recipe

    t0 = time.time()
    recipe = load_recipe(args.recipe or {"gptq": "gptq-w4a16-g128", "search": "mixllm-w4a8",
                                         "pack": "rtn-w4a16-g128"}[args.job])  # fail before the slow build
    # random init is fast on the GPU; GPTQ and pack then start from a model in CPU memory like a real one
    model = build_model(args.layers, args.device)
    if args.job != "search":
        model.to("cpu")
    build_s = time.time() - t0
    extra = {}
    if args.job == "pack":
        from transformers import AutoTokenizer

        from quantkit.model import builtin_model_dir

        t0 = time.time()
        model.save_pretrained(args.save_dir, safe_serialization=True)
        # pack copies a tokenizer along; any will do for timing random weights
        AutoTokenizer.from_pretrained(builtin_model_dir()).save_pretrained(args.save_dir)
        extra["save_fp16_s"] = round(time.time() - t0, 1)
        del model
    ids = torch.randint(0, LLAMA_31_8B["vocab_size"], (args.samples, args.seqlen),
                        generator=torch.Generator().manual_seed(0))
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
    t0 = time.time()
    if args.job == "gptq":
        from quantkit.quant.apply import quantize_model

        res = quantize_model(model, None, recipe, device=args.device, calib_ids=ids, progress_factory=layer_printer)
        extra["linears"] = len(res.weights)
    elif args.job == "search":
        from quantkit.search.run import salience_quantizer
        from quantkit.search.salience import compute_salience

        t_start = time.time()

        def every16(done, total):
            if done % 16 == 0 or done == total:
                print(f"salience samples: {done}/{total} at {time.time() - t_start:.1f}s", flush=True)

        result = compute_salience(model, ids, salience_quantizer(recipe, 4), first_order=True, progress=every16)
        extra["channels"] = sum(s.numel() for s in result.scores.values())
    else:
        from quantkit.pack import run_pack

        summary = run_pack(args.save_dir, recipe.name, args.pack_dir, target="sm90", device=args.device, dtype="fp16",
                           force=True, progress=False, warn=print)
        extra["pack_summary"] = {k: summary[k] for k in list(summary)[:12]}
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.synchronize()
    wall = time.time() - t0
    out = {"job": args.job, "layers": args.layers, "samples": args.samples, "seqlen": args.seqlen,
           "recipe": recipe.name, "wall_s": round(wall, 1), "peak_gpu_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
           "build_model_s": round(build_s, 1), "device": torch.cuda.get_device_name() if cuda else "cpu", **extra}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
