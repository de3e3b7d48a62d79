"""``quantkit tune --attention``: the launch (cache positions per step, warps, stages) of each decode-attention
kernel on the GPU at hand, written to the table the runtime reads (:mod:`quantkit.runtime.kernels.attention_launch`).

For each cache form (fp16, KV8, KV4) and every (batch, context) point, each candidate launch runs on random caches
(:func:`quantkit.bench.attention.cache_inputs`) and is checked against the form's torch reference before it is
timed (CUDA-graph replays over rotating caches, :func:`quantkit.bench.timing.time_rotating`); a candidate that fails
the check or does not build is out. The launch written is the one whose worst time over the points, relative to the
best candidate at each point, is the smallest: one launch per form and head size serves every batch and context.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence

import torch

from quantkit.runtime.kernels.attention_launch import FORMS, default_launch

CANDIDATES = tuple(itertools.product((32, 64, 128), (4, 8), (2, 3, 4)))  # (BLOCK_N, warps, stages)
TOLERANCE = 2e-2  # relative error a candidate may have against the reference (fp32 sums in another order)


def candidates_for(form: str) -> list[tuple[int, int, int]]:
    """The launches tried for a form: every :data:`CANDIDATES` entry, KV4's at least one KIVI group (32) long."""
    return [c for c in CANDIDATES if form != "kv4" or c[0] >= 32]


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


def _gpu_timer(fn: Callable, inputs: list, reps: int, launch: tuple) -> float:
    from quantkit.bench.timing import time_rotating

    return time_rotating(fn, inputs, reps=reps)["ms"] * 1e3


CHECK_CONTEXT = 8192  # candidates are checked against the reference at a context of at most this many tokens


def form_problem(form: str, heads: tuple[int, int, int], context: int) -> str | None:
    """Why the ``form`` kernel cannot take these heads at this context (None: it can), from the kernels' own
    checks on shape-only tensors."""
    from quantkit.bench.attention import cache_inputs
    from quantkit.quant import kv
    from quantkit.runtime.kernels.triton import decode_attention as da

    hq, hkv, d = heads
    try:
        q = torch.empty(1, hq, d, dtype=torch.float16, device="meta")
        parts = cache_inputs(form, 1, context, hkv, d, None, "meta")
    except (RuntimeError, ValueError, ZeroDivisionError) as e:
        return f"no {form} cache of {hkv} heads of {d} for {context} tokens ({e})"
    if form == "fp16":
        return da.decode_attention_problem(q, *parts)
    if form == "kv8":
        return da.kv8_problem(q, *parts)
    spec = kv.KVSpec(4)
    return da.kv4_problem(q, dict(zip(da.KV4_PARTS, parts)), spec.group_size, spec.residual)


def _budget(device: str) -> float:
    """Bytes of caches a point may allocate: 80 % of the GPU's free memory (no limit off a GPU)."""
    if device != "cuda":
        return float("inf")
    free, _ = torch.cuda.mem_get_info()
    return 0.8 * free


def tune_attention(heads: tuple[int, int, int], batches: Sequence[int], contexts: Sequence[int],
                   forms: Sequence[str] = FORMS, reps: int = 20, device: str = "cuda",
                   timer: Callable[[Callable, list, int, tuple], float] | None = None,
                   candidates: Callable[[str], list] = candidates_for,
                   progress: Callable[[int, int], None] | None = None,
                   on_entry: Callable[[dict], None] | None = None) -> list[dict]:
    """One table entry per form (module docstring): {"form", "head_dim", "launch", "worst_ratio", "points": [{"batch",
    "context", "us", "default_us"}], "skipped": [points over the memory budget]}; ``timer(fn, inputs, reps,
    launch)`` gives µs (default: CUDA-graph replays); ``on_entry`` receives each form's entry when it is done (the
    table is written form by form). A form the heads do not fit is a QuantkitError naming why, before any timing."""
    from quantkit.bench.attention import cache_inputs, form_call
    from quantkit.bench.timing import copies_to_defeat_l2
    from quantkit.errors import QuantkitError
    from quantkit.quant import kv

    timer = timer or _gpu_timer
    hq, hkv, d = heads
    for form in forms:
        for context in contexts:
            why = form_problem(form, heads, context)
            if why:
                raise QuantkitError(f"tune --attention cannot run the {form} kernel at {context} tokens: {why}")
    points = [(b, c) for b in batches for c in contexts]
    total, done = len(forms) * len(points), 0
    entries = []
    for form in forms:
        times: dict[tuple, list[float | None]] = {c: [] for c in candidates(form)}
        timed, skipped = [], []
        spec = None if form == "fp16" else kv.KVSpec(8 if form == "kv8" else 4)
        for b, context in points:
            n = (2 * b * hkv * context * d * 2 if spec is None else b * hkv * kv.cache_bytes(spec, context, d))
            budget = _budget(device)
            done += 1
            if n > budget:
                skipped.append({"batch": b, "context": context})
                if progress:
                    progress(done, total)
                continue
            gen = torch.Generator(device=device).manual_seed(b * 7919 + context)
            q = torch.randn(b, hq, d, device=device, dtype=torch.float16, generator=gen)
            check_len = min(context, CHECK_CONTEXT)
            check = cache_inputs(form, b, check_len, hkv, d, gen, device)
            ref = form_call(form, q, check_len, d ** -0.5, reference=True)(*check)
            copies = 1
            if device == "cuda":
                copies = max(1, min(copies_to_defeat_l2(n), int(budget // n)))
            inputs = [cache_inputs(form, b, context, hkv, d, gen, device) for _ in range(copies)]
            for cand in times:
                try:
                    ok = _rel_err(form_call(form, q, check_len, d ** -0.5, launch=cand)(*check), ref) <= TOLERANCE
                    fn = form_call(form, q, context, d ** -0.5, launch=cand)
                    times[cand].append(timer(fn, inputs, reps, cand) if ok else None)
                except RuntimeError:  # does not build on this GPU (shared memory, registers) or out of memory
                    times[cand].append(None)
            timed.append((b, context))
            del inputs, check, ref
            if device == "cuda":
                torch.cuda.empty_cache()
            if progress:
                progress(done, total)
        k = len(timed)
        best = [min((t[i] for t in times.values() if t[i] is not None), default=None) for i in range(k)]
        worst = {c: max(t[i] / best[i] for i in range(k)) for c, t in times.items()
                 if k and all(x is not None for x in t) and all(bp for bp in best)}
        if not worst:
            continue
        launch = min(worst, key=lambda c: (worst[c], c))
        default = times.get(default_launch(form)) or [None] * k
        entry = {"form": form, "head_dim": d, "launch": list(launch), "worst_ratio": round(worst[launch], 3),
                 "points": [{"batch": b, "context": c, "us": round(times[launch][i], 2),
                             "default_us": None if default[i] is None else round(default[i], 2)}
                            for i, (b, c) in enumerate(timed)], "skipped": skipped}
        entries.append(entry)
        if on_entry is not None:
            on_entry(entry)
    return entries


def run_attention_tune(heads: tuple[int, int, int], batches: Sequence[int], contexts: Sequence[int], out_dir,
                       command: str, reps: int = 20, progress: Callable[[int, int], None] | None = None
                       ) -> tuple[list[dict], object]:
    """:func:`tune_attention` on this GPU, written to its attention table under ``out_dir`` with the device, commit,
    command and date; returns (entries, the table's path)."""
    import datetime

    from quantkit.bench.tune import _commit, require_gpu
    from quantkit.errors import QuantkitError
    from quantkit.runtime.kernels.attention_launch import write_table
    from quantkit.runtime.kernels.registry import device_traits

    require_gpu()
    dev = torch.device("cuda", torch.cuda.current_device())
    cap, sms = device_traits(dev)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    commit, name, paths = _commit(), torch.cuda.get_device_name(dev), []

    def write(entry: dict) -> None:  # form by form, so a run cut short keeps the forms it finished
        try:
            paths.append(write_table(out_dir, name, cap, sms, [entry], command, commit, date))
        except OSError as e:
            raise QuantkitError(f"cannot write the attention table under {out_dir} ({e.strerror or e}); give a "
                                "writable folder with -o") from None

    entries = tune_attention(heads, batches, contexts, reps=reps, progress=progress, on_entry=write)
    if not entries:
        raise QuantkitError("no decode-attention launch passed its check at every point; nothing was written")
    return entries, paths[-1]
