"""Train quantkit's embedded reference model: a small Llama (GQA) on the shipped KJV corpus.

    python examples/train_reference.py --out quantkit/assets/reference-model            # GPU if present
    python examples/train_reference.py --tokenizer-only --out quantkit/assets/reference-model

Stage 1 trains a byte-level BPE tokenizer (``tokenizers``) on calibration/kjv-train.txt. Stage 2 trains a
~7.6 M-parameter Llama-architecture model (8 layers, hidden 256, 4 query / 2 KV heads, SwiGLU 640, tied
embeddings) on the train split with AdamW + cosine schedule, evaluates the held-out test split every
``--eval-every`` steps and keeps the best weights (the corpus is ~1 M tokens, so more steps overfit).
Weights are written as fp16 safetensors with the tokenizer, ready for ``quantkit eval-ppl builtin:reference``.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "calibration"


def train_tokenizer(out: Path, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train([str(CORPUS / "kjv-train.txt")], trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                                   unk_token="<|endoftext|>", model_max_length=1024)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return fast


def token_stream(tok, split: str) -> torch.Tensor:
    text = (CORPUS / f"kjv-{split}.txt").read_text(encoding="utf-8")
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    return torch.tensor(tok("\n\n".join(paragraphs))["input_ids"], dtype=torch.long)


@torch.no_grad()
def eval_loss(model, ids: torch.Tensor, seqlen: int, device: str) -> float:
    model.eval()
    n = ids.numel() // seqlen
    x = ids[: n * seqlen].view(n, seqlen).to(device)
    losses = []
    for i in range(0, n, 16):
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            losses.append(model(x[i:i + 16], labels=x[i:i + 16]).loss.float().item() * x[i:i + 16].shape[0])
    model.train()
    return sum(losses) / n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "quantkit" / "assets" / "reference-model")
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--tokenizer-only", action="store_true")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seqlen", type=int, default=512)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if args.tokenizer_only or not (args.out / "tokenizer.json").exists():
        tok = train_tokenizer(args.out, args.vocab_size)
        print(f"tokenizer: vocab {len(tok)} → {args.out}")
        if args.tokenizer_only:
            return
    tok = AutoTokenizer.from_pretrained(args.out)

    torch.manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    train_ids, test_ids = token_stream(tok, "train"), token_stream(tok, "test")
    print(f"tokens: train {train_ids.numel():,}  test {test_ids.numel():,}  device {device}")
    config = LlamaConfig(vocab_size=len(tok), hidden_size=256, intermediate_size=640, num_hidden_layers=8,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=1024,
                         rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, initializer_range=0.02)
    model = LlamaForCausalLM(config).to(device)
    print(f"parameters: {sum(p.numel() for p in model.parameters()):,}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    warmup = max(1, args.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps))))
    gen = torch.Generator().manual_seed(args.seed)
    best, best_state, t0 = float("inf"), None, time.time()
    model.train()
    for step in range(1, args.steps + 1):
        starts = torch.randint(0, train_ids.numel() - args.seqlen - 1, (args.batch,), generator=gen)
        x = torch.stack([train_ids[s:s + args.seqlen] for s in starts.tolist()]).to(device)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = model(x, labels=x).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % args.eval_every == 0 or step == args.steps:
            test = eval_loss(model, test_ids, args.seqlen, device)
            if test < best:
                best, best_state = test, {k: v.detach().clone() for k, v in model.state_dict().items()}
            print(f"step {step:5d}  train {loss.item():.3f}  test {test:.3f} (ppl {math.exp(test):.2f})  "
                  f"best {best:.3f}  {time.time() - t0:.0f}s", flush=True)
    model.load_state_dict(best_state)
    model.to(torch.float16).save_pretrained(args.out, safe_serialization=True)
    tok.save_pretrained(args.out)
    print(f"saved best (test loss {best:.4f}, ppl {math.exp(best):.2f} at seqlen {args.seqlen}) → {args.out}")


if __name__ == "__main__":
    main()
