"""A 4-bit layout's int8 tensor-core operand, materialized: prefill of MixLLM W4A8 and mixed W4.4A8 layers through
the W8A8 kernel (:mod:`.w8a8_wgmma`), as W4A16 prefill dequantizes and calls cuBLAS.

At prefill sizes the products dominate and the MixLLM g128 kernels are bound by their per-group epilogues, which
the W8A8 TMA kernel overlaps better (docs/BENCHMARKS.md). MixLLM's two-step dequantization makes that exact:
step 1 turns a 4-bit code into the int8 q − z (MixLLM Sec. 3.3) — the operand the W4A8 kernel multiplies anyway —
and step 2 is the same per-group float scale. So writing q − z once per call (N·Kp bytes; reading the 4-bit words) and
running the W8A8 kernel with the fp16 group scales widened to fp32 gives the W4A8 kernel's bits. A mixed layer's two
partitions land in one [N, Kp] operand in output-row order, so one launch covers the layer with no scatter.
"""

from __future__ import annotations

import torch
import triton.language as tl

from quantkit.runtime.kernels.dequant import planes_i8, side_by_side
from quantkit.runtime.kernels.jit import USE_ASM, check_device, kernel
from quantkit.runtime.kernels.launch import groups_in_halves


@kernel
def _asym4_to_int8_kernel(w_ptr, p_ptr, rows_ptr, out_ptr, N, w_row, out_row, hpg, groups, BN: tl.constexpr,
                          SCATTER: tl.constexpr, USE_ASM: tl.constexpr):
    """int8 q − z of rows [BN] × one 256-column tile of a ``w4a16`` weight: ((q·1 + 128 − z) mod 256) XOR 0x80,
    stored to row ``rows[n]`` of the output when SCATTER, else row n."""
    pid_n = tl.program_id(0)
    t = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    rn_in = tl.minimum(rn, N - 1)
    words = tl.load(w_ptr + rn_in[:, None] * w_row + t * 32 + tl.arange(0, 32)[None, :])
    z_lo = (tl.load(p_ptr + tl.minimum((2 * t) // hpg, groups - 1) * N + rn_in) >> 16) & 0xFF
    z_hi = (tl.load(p_ptr + tl.minimum((2 * t + 1) // hpg, groups - 1) * N + rn_in) >> 16) & 0xFF
    one = tl.full((BN, 1), 1, tl.int32)
    w = side_by_side(planes_i8(words, one, (128 - z_lo)[:, None], one, (128 - z_hi)[:, None], USE_ASM), 0, 8)
    k = t * 256 + tl.arange(0, 256)
    if SCATTER:
        dest = tl.load(rows_ptr + rn_in).to(tl.int64)
    else:
        dest = rn.to(tl.int64)
    tl.store(out_ptr + dest[:, None] * out_row + k[None, :], w, mask=(rn < N)[:, None])


def asym4_int8_operand(tensors: dict, meta: dict, out: torch.Tensor | None = None, rows: torch.Tensor | None = None,
                       use_asm: bool | None = None) -> torch.Tensor:
    """int8 [N, Kp] q − z of a ``w4a16`` weight (Kp = K padded to 256), computed on the weights' device with the
    W4A8 kernels' arithmetic: equal to :func:`.reference.int8_weight` ("w4a16"). With ``rows`` (int32 [N]) row n
    goes to row rows[n] of ``out`` (a mixed layer's operand)."""
    qweight, qparams = tensors["qweight"], tensors["qparams"]
    check_device(qweight, qparams)
    n = int(meta["out_features"])
    n_tiles = qweight.shape[1] // 32
    out = torch.empty(n, n_tiles * 256, dtype=torch.int8, device=qweight.device) if out is None else out
    bn = 64
    _asym4_to_int8_kernel[(-(-n // bn), n_tiles)](qweight, qparams, qparams if rows is None else rows, out, n,
                                                  qweight.shape[1], out.stride(0), groups_in_halves(meta, n_tiles),
                                                  qparams.shape[0], BN=bn, SCATTER=rows is not None,
                                                  USE_ASM=USE_ASM if use_asm is None else use_asm, num_warps=4)
    return out


def group_scales_fp32(layout: str, tensors: dict) -> torch.Tensor:
    """The fp32 weight scale of every (group, row) [G, N]: stored (``w8``) or the fp16 bits 0-15 of each ``w4a16``
    group word, widened exactly (the W4A8 kernels' ``_weight_scale``)."""
    if layout == "w8":
        return tensors["scales"]
    return (tensors["qparams"] & 0xFFFF).to(torch.int16).view(torch.float16).float()


def w8_operand(layout: str, tensors: dict, meta: dict) -> dict:
    """``w8``-layout tensors {"qweight": int8 [N, Kp], "scales": fp32 [G, N]} holding the same int8 operand and
    group scales as a ``w8`` or ``w4a16`` weight (module docstring)."""
    if layout == "w8":
        return tensors
    return {"qweight": asym4_int8_operand(tensors, meta), "scales": group_scales_fp32(layout, tensors)}


def mixed_w8_operand(parts: list, out_features: int) -> tuple[dict, dict] | None:
    """One ``w8``-layout (tensors, meta) for a mixed layer's partitions ((layout, tensors, meta, rows) of ``w8`` /
    ``w4a16`` rows), rows in output order; None when the partitions' K or group sizes differ (then each keeps its
    own kernel)."""
    metas = [p[2] for p in parts]
    if len({int(m["in_features"]) for m in metas}) != 1 or len({int(m["group_size"]) for m in metas}) != 1:
        return None
    meta0 = metas[0]
    dev = parts[0][1]["qweight"].device
    kp = -(-int(meta0["in_features"]) // 256) * 256
    groups = int(meta0["num_groups"])
    weight = torch.empty(out_features, kp, dtype=torch.int8, device=dev)
    scales = torch.empty(groups, out_features, dtype=torch.float32, device=dev)
    for layout, tensors, meta, rows in parts:
        if layout == "w8":
            weight.index_copy_(0, rows.long(), tensors["qweight"])
        else:  # written straight to its rows (an indexed assignment of the whole operand cost ~300 µs at 14336 rows)
            asym4_int8_operand(tensors, meta, weight, rows.to(torch.int32).contiguous())
        scales.index_copy_(1, rows.long(), group_scales_fp32(layout, tensors))
    meta = {"out_features": out_features, "in_features": int(meta0["in_features"]),
            "group_size": int(meta0["group_size"]), "num_groups": groups}
    return {"qweight": weight, "scales": scales}, meta
