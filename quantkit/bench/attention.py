"""``quantkit bench --attention``: decode attention over a KV cache, quantkit's kernel against SDPA's.

For each (batch B, context L) point and one model's heads (Hq query, Hkv KV heads of size D), one decode step's
attention — one query token per sequence over an fp16 cache of L tokens — timed as CUDA-graph replays with rotating
caches (:func:`quantkit.bench.timing.time_rotating`):

* ``kernel``: :func:`quantkit.runtime.kernels.triton.decode_attention.decode_attention` (split-KV, grouped query
  heads as tile rows), always;
* ``chosen``: what a compiled decode step runs (``quantkit::decode_attention``: the kernel or SDPA by
  :func:`~quantkit.runtime.kernels.triton.decode_attention.kernel_preferred`);
* ``sdpa_flash``: SDPA restricted to its flash backend, grouped KV heads (``enable_gqa``) and no mask — FlashAttention-2's
  decode path, which splits the cache across the GPU as flash-decoding does;
* ``sdpa``: SDPA as PyTorch picks the backend, with the boolean cache mask a static cache needs.

* ``kv8`` / ``kv4``: the kernel over a packed KV8 cache and a KV4 cache (KIVI groups of 32 with a 128-token fp16
  window; :mod:`quantkit.runtime.kv_cache`'s layouts), random codes (the time does not depend on the values).

The bytes a step must read are the cache's keys and values (2·B·Hkv·L·D·2 in fp16; :func:`quantkit.quant.kv.cache_bytes`
packed); GB/s and % of the device's measured copy bandwidth are those bytes over the ``kernel`` time; ``speedup``,
``kv8_x`` and ``kv4_x`` are the flash time over the kernel's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def cache_bytes(batch: int, context: int, kv_heads: int, head_dim: int) -> int:
    """Bytes of an fp16 KV cache's keys and values for ``batch`` sequences of ``context`` tokens (one layer)."""
    return 2 * batch * kv_heads * context * head_dim * 2


def _calls(q, hkv: int, scale: float) -> dict[str, Callable]:
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from quantkit.runtime.kernels import ops
    from quantkit.runtime.kernels.triton.decode_attention import decode_attention

    def flash(k, v, mask):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q[:, :, None], k, v, scale=scale, enable_gqa=True)

    return {
        "kernel": lambda k, v, mask: decode_attention(q, k, v, mask, scale),
        "chosen": lambda k, v, mask: ops.decode_attention(q, k, v, mask, scale),
        "sdpa_flash": flash,
        "sdpa": lambda k, v, mask: F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=mask[:, None, None],
                                                                  scale=scale, enable_gqa=True),
    }


def measure_point(heads: tuple[int, int, int], batch: int, context: int, reps: int, hbm_bytes_s: float | None,
                  budget_bytes: int) -> dict:
    """One row (module docstring); ``skipped`` where the rotated caches would pass ``budget_bytes``."""
    from quantkit.bench.timing import copies_to_defeat_l2, time_rotating

    hq, hkv, d = heads
    row = {"batch": batch, "context": context, "q_heads": hq, "kv_heads": hkv, "head_dim": d}
    nbytes = cache_bytes(batch, context, hkv, d)
    copies = copies_to_defeat_l2(nbytes)
    if nbytes * copies > budget_bytes:
        copies = 1
    if nbytes * copies > budget_bytes:
        return {**row, "skipped": f"a {nbytes / 2 ** 30:.1f} GiB cache is over the GPU memory budget"}
    gen = torch.Generator(device="cuda").manual_seed(batch * 131 + context)
    q = torch.randn(batch, hq, d, device="cuda", dtype=torch.float16, generator=gen)
    mask = torch.ones(batch, context, dtype=torch.bool, device="cuda")
    mask[:, context - 1:] = False  # the static cache's next slot is not yet written
    inputs = []
    for _ in range(copies):
        k = torch.randn(batch, hkv, context, d, device="cuda", dtype=torch.float16, generator=gen)
        inputs.append((k, torch.randn_like(k), mask))
    scale = d ** -0.5
    out = {**row, "cache_mb": round(nbytes / 1e6, 2)}
    for name, fn in _calls(q, hkv, scale).items():
        try:
            out[f"{name}_us"] = round(time_rotating(fn, inputs, reps=reps)["ms"] * 1e3, 2)
        except RuntimeError as exc:  # e.g. no flash kernel for this head size on this GPU
            out[f"{name}_skipped"] = str(exc).strip().splitlines()[0][:120]
    del inputs
    torch.cuda.empty_cache()
    out.update(_packed_times(q, batch, context, hkv, d, scale, reps))
    us = out.get("kernel_us")
    flash = out.get("sdpa_flash_us")
    for name in ("kv8", "kv4"):
        if flash and out.get(f"{name}_us"):
            out[f"{name}_x"] = round(flash / out[f"{name}_us"], 3)
    if us:
        out["gb_s"] = round(nbytes / us / 1e3, 1)
        if hbm_bytes_s:
            out["hbm_pct"] = round(100 * nbytes / (us * 1e-6) / hbm_bytes_s, 1)
        if out.get("sdpa_flash_us"):
            out["speedup"] = round(out["sdpa_flash_us"] / us, 3)
    torch.cuda.empty_cache()
    return out


def cache_inputs(form: str, batch: int, context: int, kv_heads: int, head_dim: int, gen: torch.Generator,
                 device: str = "cuda", dtype: torch.dtype = torch.float16) -> tuple:
    """One random cache of ``form`` (fp16, kv8, kv4: :mod:`quantkit.runtime.kv_cache`'s layouts, KIVI groups of 32
    with a 128-token window) as the arguments :func:`form_call`'s callable takes; the codes are random (a kernel's
    time does not depend on them). On the ``meta`` device: the shapes alone (``gen`` unused), for checks."""
    from quantkit.quant import kv
    from quantkit.runtime.kernels.triton.decode_attention import KV4_PARTS

    meta = device == "meta"

    def codes(*shape):
        if meta:
            return torch.empty(shape, dtype=torch.uint8, device=device)
        return torch.randint(0, 256, shape, dtype=torch.uint8, device=device, generator=gen)

    def small(*shape):
        if meta:
            return torch.empty(shape, dtype=dtype, device=device)
        return (torch.rand(*shape, device=device, generator=gen) * 0.01).to(dtype)

    mask = torch.ones(batch, context, dtype=torch.bool, device=device)
    bh = (batch, kv_heads)
    if form == "fp16":
        k = (torch.empty(*bh, context, head_dim, device=device, dtype=dtype) if meta else
             torch.randn(*bh, context, head_dim, device=device, dtype=dtype, generator=gen))
        return k, torch.randn_like(k) if not meta else torch.empty_like(k), mask
    if form == "kv8":
        def part():
            return {"codes": codes(*bh, context, head_dim), "scale": small(*bh, context, 1).half(),
                    "min": small(*bh, context, 1).half()}
        return part(), part(), mask
    spec = kv.KVSpec(4)
    g, ring = spec.group_size, spec.residual + 2 * spec.group_size
    parts = {"k_codes": codes(*bh, context, head_dim // 2), "k_scale": small(*bh, context // g, head_dim).half(),
             "k_min": small(*bh, context // g, head_dim).half(), "v_codes": codes(*bh, context, head_dim // 2),
             "v_scale": small(*bh, context, head_dim // g).half(), "v_min": small(*bh, context, head_dim // g).half(),
             "k_ring": small(*bh, ring, head_dim), "v_ring": small(*bh, ring, head_dim)}
    return tuple(parts[n] for n in KV4_PARTS)


def form_call(form: str, q: torch.Tensor, context: int, scale: float, launch: tuple | None = None,
              reference: bool = False) -> Callable:
    """The decode-attention kernel of ``form`` (or its torch reference) over :func:`cache_inputs`' arguments."""
    from quantkit.quant import kv
    from quantkit.runtime.kernels.triton import decode_attention as da

    if form == "fp16":
        if reference:
            return lambda k, v, m: da.decode_attention_reference(q, k, v, m, scale)
        return lambda k, v, m: da.decode_attention(q, k, v, m, scale, launch=launch)
    if form == "kv8":
        if reference:
            return lambda k, v, m: da.kv8_reference(q, k, v, m, scale)
        return lambda k, v, m: da.decode_attention_kv8(q, k, v, m, scale, launch=launch)
    spec = kv.KVSpec(4)
    g, r = spec.group_size, spec.residual
    if reference:
        return lambda *t: da.kv4_reference(q, dict(zip(da.KV4_PARTS, t)), context, g, r, scale)
    tokens = torch.tensor([context], device=q.device)
    return lambda *t: da.decode_attention_kv4(q, dict(zip(da.KV4_PARTS, t)), tokens, g, r, scale, launch=launch)


def _packed_times(q: torch.Tensor, batch: int, context: int, hkv: int, d: int, scale: float, reps: int) -> dict:
    """µs of the KV8 and KV4 kernels at this point, each over rotating random caches of its own layout."""
    from quantkit.bench.timing import copies_to_defeat_l2, time_rotating
    from quantkit.quant import kv

    gen = torch.Generator(device="cuda").manual_seed(context + batch)
    out: dict = {}
    for form, spec in (("kv8", kv.KVSpec(8)), ("kv4", kv.KVSpec(4))):
        if form == "kv4" and (context % spec.group_size or d % spec.group_size):
            continue
        n = batch * hkv * kv.cache_bytes(spec, context, d)
        caches = [cache_inputs(form, batch, context, hkv, d, gen) for _ in range(copies_to_defeat_l2(n))]
        out[f"{form}_us"] = round(time_rotating(form_call(form, q, context, scale), caches, reps=reps)["ms"] * 1e3, 2)
        out[f"{form}_mb"] = round(n / 1e6, 2)
        del caches
    return out


def run_attention(heads: tuple[int, int, int], batches: Sequence[int], contexts: Sequence[int], reps: int = 20,
                  progress: Callable[[dict], None] | None = None) -> list[dict]:
    """The rows of every (batch, context) point on the current CUDA device (module docstring)."""
    from quantkit.bench.roofline import measure_hbm_bandwidth

    hbm = measure_hbm_bandwidth()
    name = torch.cuda.get_device_name()
    free, _ = torch.cuda.mem_get_info()
    rows = []
    for context in contexts:
        for batch in batches:
            row = {**measure_point(heads, batch, context, reps, hbm, int(free * 0.6)), "device": name}
            rows.append(row)
            if progress:
                progress(row)
    return rows


def attention_table(rows: list[dict]):
    """A rich table of :func:`run_attention`'s rows."""
    from rich.table import Table

    r0 = rows[0] if rows else {}
    title = (f"decode attention, {r0.get('q_heads')} query / {r0.get('kv_heads')} KV heads of {r0.get('head_dim')}"
             f"{' on ' + r0['device'] if r0.get('device') else ''} (µs per layer and step; × over SDPA flash)")
    table = Table(title=title)
    cols = ("batch", "context", "cache MB", "kernel", "chosen", "SDPA flash", "SDPA", "speedup", "GB/s", "% HBM",
            "KV8", "KV8 ×", "KV4", "KV4 ×")
    for col in cols:
        table.add_column(col, justify="right")
    for r in rows:
        if "skipped" in r:
            table.add_row(str(r["batch"]), str(r["context"]), f"skipped: {r['skipped']}", *[""] * (len(cols) - 3))
            continue
        cell = lambda key: f"{r[key]:.1f}" if key in r else "—"  # noqa: E731
        times = lambda key: f"{r[key]:.2f}×" if key in r else ""  # noqa: E731
        table.add_row(str(r["batch"]), str(r["context"]), f"{r['cache_mb']:.0f}", cell("kernel_us"),
                      cell("chosen_us"), cell("sdpa_flash_us"), cell("sdpa_us"), times("speedup"), cell("gb_s"),
                      cell("hbm_pct"), cell("kv8_us"), times("kv8_x"), cell("kv4_us"), times("kv4_x"))
    return table
