"""``quantkit bench MODEL|PACKED --e2e``: whole-model speed, the number a user of the packed checkpoint feels.

For each model (a packed checkpoint and its FP source, or one FP model) and under one harness
(:class:`quantkit.runtime.generate.Generator`: a static KV cache allocated once, prefill in one chunk):

* **prefill**: milliseconds of one forward over a prompt of T tokens (batch 1), median of ``reps``;
* **decode**: tokens per second of greedy decode steps at batch B with C tokens in the cache (the cache is
  prefilled with C - steps random tokens, then ``steps`` steps are timed after two untimed ones), on a GPU each
  step a CUDA graph of the compiled step unless ``graph`` is off (``"graph"`` in the row), with the weight
  bytes each step reads per second and that rate as a share of the device's measured copy bandwidth
  (:func:`quantkit.bench.roofline.measure_hbm_bandwidth`), the roofline of a memory-bound decode, and the peak
  GPU memory of the point (weights, cache, compiled step and graph);
* with ``kv`` (``--kv-bits 8`` or ``4``) the packed model prefills and decodes with a packed KV cache
  (:mod:`quantkit.runtime.kv_cache`) while its FP source keeps an fp16 cache;
* **HF generate**: transformers' own ``model.generate`` (greedy, its default cache, eager) from a 128-token prompt,
  new tokens per second of wall time including the prefill — what a user who does not use quantkit's loop sees.

A packed model's rows carry ``speedup`` over the FP rows of the same measure and size. Points that do not fit
(context beyond the model's positions, or out of GPU memory) are rows with ``skipped`` and the reason.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn

PREFILL_TOKENS = (128, 512, 2048)
DECODE_BATCHES = (1, 8, 16, 32, 64)
DECODE_CONTEXTS = (1024, 4096)
DECODE_STEPS = 32
HF_PROMPT, HF_NEW = 128, 64


@dataclass(frozen=True)
class E2EPlan:
    """What one ``--e2e`` run measures (module docstring)."""

    prefill: tuple[int, ...] = PREFILL_TOKENS
    batches: tuple[int, ...] = DECODE_BATCHES
    contexts: tuple[int, ...] = DECODE_CONTEXTS
    steps: int = DECODE_STEPS
    reps: int = 5
    hf_batches: tuple[int, ...] = (1,)
    hf_prompt: int = HF_PROMPT
    hf_new: int = HF_NEW
    graph: bool = True  # decode steps compiled into CUDA graphs on a GPU (Generator's compile_decode)
    kv: object = None  # a quantkit.quant.kv.KVSpec: prefill and decode with the packed cache (runtime.kv_cache)


def weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers (packed weights, scales, norms, embeddings): what a decode step
    reads at most, the embedding table included once (as the tied or separate LM head reads it)."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_ms(fn: Callable[[], object], device: torch.device, reps: int) -> float:
    fn()  # first use: kernel compiles and autotuning are not speed
    times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _random_ids(model: nn.Module, batch: int, tokens: int, device: torch.device, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, int(model.config.vocab_size), (batch, tokens), generator=gen).to(device)


def _fits(model: nn.Module, tokens: int) -> str | None:
    from quantkit.model.loader import max_positions

    limit = max_positions(model)
    return None if limit is None or tokens <= limit else f"beyond the model's {limit} positions"


def _guarded(row: dict, measure: Callable[[], dict], device: torch.device) -> dict:
    """``row`` with ``measure()``'s fields, or with ``skipped`` where the GPU ran out of memory."""
    try:
        row.update(measure())
    except torch.OutOfMemoryError:
        row["skipped"] = "out of GPU memory"
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row


def measure_model(label: str, model: nn.Module, plan: E2EPlan, hbm_bytes_s: float | None = None,
                  progress: Callable[[dict], None] | None = None) -> list[dict]:
    """The prefill, decode and HF-generate rows of one model (module docstring); ``progress`` sees each row as it
    is measured."""
    from quantkit.runtime.generate import Generator

    device = next(model.parameters()).device
    wbytes = weight_bytes(model)
    graph = plan.graph and device.type == "cuda"
    rows: list[dict] = []

    def add(row: dict) -> None:
        rows.append(row)
        if progress:
            progress(row)
    for t in plan.prefill:
        row = {"model": label, "measure": "prefill", "tokens": t}
        why = _fits(model, t + 1)
        if why:
            add({**row, "skipped": why})
            continue
        gen = Generator(model, t + 1, prefill_chunk=t, kv=plan.kv)
        ids = _random_ids(model, 1, t, device, seed=t)
        add(_guarded(row, lambda: {"ms": round(_median_ms(lambda: gen.prefill(ids), device, plan.reps), 3)}, device))
    for context in plan.contexts:
        for batch in plan.batches:
            row = {"model": label, "measure": "decode", "batch": batch, "context": context, "graph": graph,
                   "kv": plan.kv.label if plan.kv is not None else "fp"}
            why = _fits(model, context) or (None if context > plan.steps + 2 else
                                            f"a {context}-token context holds no {plan.steps}-step decode")
            if why:
                add({**row, "skipped": why})
                continue

            def decode(batch=batch, context=context) -> dict:
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                gen = Generator(model, context, prefill_chunk=min(context, 2048), compile_decode=graph, kv=plan.kv)
                ids = _random_ids(model, batch, context - plan.steps - 2, device, seed=batch)
                tok = gen.prefill(ids).argmax(-1, keepdim=True)
                pos = ids.shape[1]
                for i in range(2):  # untimed: first use (compiles and captures the graph), then one replay
                    tok = gen.decode_step(tok, pos + i).argmax(-1, keepdim=True)
                _sync(device)
                t0 = time.perf_counter()
                for i in range(plan.steps):
                    tok = gen.decode_step(tok, pos + 2 + i).argmax(-1, keepdim=True)
                _sync(device)
                step_s = (time.perf_counter() - t0) / plan.steps
                out = {"tok_s": round(batch / step_s, 2), "step_ms": round(step_s * 1e3, 4),
                       "weight_gb_s": round(wbytes / step_s / 1e9, 1)}
                if hbm_bytes_s:
                    out["hbm_pct"] = round(100 * wbytes / step_s / hbm_bytes_s, 1)
                if device.type == "cuda":
                    out["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2 ** 30, 2)
                return out

            add(_guarded(row, decode, device))
    for batch in plan.hf_batches:
        row = {"model": label, "measure": "hf_generate", "batch": batch, "prompt": plan.hf_prompt,
               "new": plan.hf_new}
        why = _fits(model, plan.hf_prompt + plan.hf_new)
        if why:
            add({**row, "skipped": why})
            continue
        ids = _random_ids(model, batch, plan.hf_prompt, device, seed=7)

        def hf(ids=ids, batch=batch) -> dict:
            kw = dict(max_new_tokens=plan.hf_new, min_new_tokens=plan.hf_new, do_sample=False,
                      attention_mask=torch.ones_like(ids), pad_token_id=0)
            with torch.inference_mode():
                ms = _median_ms(lambda: model.generate(ids, **kw), device, max(1, plan.reps // 2))
            return {"tok_s": round(batch * plan.hf_new / (ms / 1e3), 2), "ms": round(ms, 1)}

        add(_guarded(row, hf, device))
    for r in rows:
        r["weight_bytes"] = wbytes
    return rows


def _key(r: dict) -> tuple:
    return tuple(r.get(f) for f in ("measure", "tokens", "batch", "context", "prompt", "new"))


def add_speedups(rows: list[dict], baseline: str) -> list[dict]:
    """Give every row of another model than ``baseline`` a ``speedup`` over the baseline's row of the same measure
    and size: its time over theirs (prefill), or its tokens per second over theirs (decode, HF generate)."""
    base = {_key(r): r for r in rows if r["model"] == baseline and "skipped" not in r}
    for r in rows:
        b = base.get(_key(r))
        if r["model"] == baseline or b is None or "skipped" in r:
            continue
        r["speedup"] = round(b["ms"] / r["ms"], 3) if r["measure"] == "prefill" else round(r["tok_s"] / b["tok_s"], 3)
    return rows


def points(plan: E2EPlan) -> int:
    """Rows one model gets from ``plan``."""
    return len(plan.prefill) + len(plan.batches) * len(plan.contexts) + len(plan.hf_batches)


def run_e2e(models: Sequence[tuple[str, Callable[[], nn.Module]]], plan: E2EPlan,
            progress: Callable[[dict], None] | None = None) -> list[dict]:
    """Rows of :func:`measure_model` for each (label, loader) in turn — each model is loaded, measured and freed
    before the next, so the GPU holds one at a time — with speedups over the first model's rows when there are
    two. Every row names the device."""
    rows: list[dict] = []
    hbm = None
    for label, load in models:
        torch._dynamo.reset()  # each compiled decode shape of the previous model is gone with it
        model = load()
        device = next(model.parameters()).device
        if device.type == "cuda" and hbm is None:
            from quantkit.bench.roofline import measure_hbm_bandwidth

            hbm = measure_hbm_bandwidth()
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
        # one compiled decode step per (batch, context) point, all on Generator's one forward
        # with a packed KV cache the baseline (the first of two models) keeps its fp16 cache: the speedup is the
        # user's, weights and cache together
        model_plan = dataclasses.replace(plan, kv=None) if len(models) > 1 and label == models[0][0] else plan
        with torch._dynamo.config.patch(recompile_limit=max(8, len(plan.batches) * len(plan.contexts) + 2)):
            measured = measure_model(label, model, model_plan, hbm, progress)
        rows += [{**r, "device": name} for r in measured]
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if len(models) > 1:
        add_speedups(rows, models[0][0])
    return rows


def e2e_table(rows: list[dict]):
    """A rich table of :func:`run_e2e`'s rows."""
    from rich.table import Table

    device = next((r["device"] for r in rows if r.get("device")), "")
    table = Table(title=f"whole-model speed{' on ' + device if device else ''} (quantkit decode loop; HF generate "
                        "eager)")
    for col in ("model", "measure", "size", "result", "speedup", "weight GB/s", "% HBM", "peak GiB"):
        table.add_column(col, justify="left" if col in ("model", "measure", "size") else "right")
    for r in rows:
        if r["measure"] == "prefill":
            size = f"{r['tokens']} tokens"
        elif r["measure"] == "decode":
            size = f"batch {r['batch']}, context {r['context']}"
        else:
            size = f"batch {r['batch']}, {r['prompt']} + {r['new']} tokens"
        if "skipped" in r:
            result = f"skipped: {r['skipped']}"
        elif r["measure"] == "prefill":
            result = f"{r['ms']:.2f} ms"
        else:
            result = f"{r['tok_s']:.1f} tok/s"
        table.add_row(r["model"], r["measure"], size, result,
                      f"{r['speedup']:.2f}×" if "speedup" in r else "",
                      f"{r['weight_gb_s']:.0f}" if "weight_gb_s" in r else "",
                      f"{r['hbm_pct']:.0f}" if "hbm_pct" in r else "",
                      f"{r['peak_gib']:.2f}" if "peak_gib" in r else "")
    return table


def save_e2e_plot(rows: list[dict], path) -> None:
    """Decode tokens/s against batch (one panel per context, one line per model) and prefill ms per prompt length,
    written to ``path`` (needs matplotlib)."""
    from quantkit.errors import QuantkitError
    from quantkit.plotting import require_matplotlib, save_figure

    plt = require_matplotlib()
    ok = [r for r in rows if "skipped" not in r]
    contexts = sorted({r["context"] for r in ok if r["measure"] == "decode"})
    if not ok:
        raise QuantkitError("--plot has nothing to draw: every point was skipped")
    models = list(dict.fromkeys(r["model"] for r in ok))
    fig, axes = plt.subplots(1, len(contexts) + 1, figsize=(4.2 * (len(contexts) + 1), 3.4), squeeze=False)
    for ax, context in zip(axes[0], contexts):
        for model in models:
            pts = sorted((r["batch"], r["tok_s"]) for r in ok
                         if r["model"] == model and r["measure"] == "decode" and r["context"] == context)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=model)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"decode, context {context}")
        ax.set_xlabel("batch")
        ax.set_ylabel("tokens/s")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    ax = axes[0][-1]
    lengths = sorted({r["tokens"] for r in ok if r["measure"] == "prefill"})
    width = 0.8 / max(1, len(models))
    for i, model in enumerate(models):
        ms = {r["tokens"]: r["ms"] for r in ok if r["model"] == model and r["measure"] == "prefill"}
        ax.bar([j + i * width for j in range(len(lengths))], [ms.get(t, 0) for t in lengths], width, label=model)
    ax.set_xticks([j + width * (len(models) - 1) / 2 for j in range(len(lengths))], [str(t) for t in lengths])
    ax.set_title("prefill")
    ax.set_xlabel("prompt tokens")
    ax.set_ylabel("ms")
    ax.legend(fontsize="small")
    device = next((r["device"] for r in rows if r.get("device")), None)
    fig.suptitle("whole-model speed" + (f" — {device}" if device else ""))
    fig.tight_layout()
    save_figure(fig, path, "plot")
