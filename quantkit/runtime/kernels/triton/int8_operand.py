"""A 4-bit layout's int8 tensor-core operand, materialized: prefill of MixLLM W4A8 and mixed W4.4A8 layers through
the W8A8 kernel (:mod:`quantkit.runtime.kernels.gluon_sm90.w8a8_wgmma`), as W4A16 prefill dequantizes and calls cuBLAS.

At prefill sizes the products dominate and the MixLLM g128 kernels are bound by their per-group epilogues, which
the W8A8 TMA kernel overlaps better (docs/BENCHMARKS.md). MixLLM's two-step dequantization makes that exact: step
1 turns a 4-bit code into the int8 q − z (MixLLM Sec. 3.3) — the operand the W4A8 kernel multiplies anyway — and
step 2 is the same per-group float scale. So writing q − z once per call (N·Kp bytes; reading the 4-bit words)
and running the W8A8 kernel with the fp16 group scales widened to fp32 gives the W4A8 kernel's bits. A mixed
layer's two partitions land in one [N, Kp] operand in output-row order, so one launch covers the layer with no
scatter.

LiquidQuant's two-level codes expand the same way to their first level, the per-channel int8 codes
((q·s_u8 + a) mod 256) XOR 0x80 (LiquidGEMM Eq. 12), with the per-channel scale s_c as the one float scale: a mixed
LiquidQuant layer (LiquidQuant rows next to per-channel 8-bit rows, ``mixllm-lqq-w4a8``) becomes one per-channel
W8A8 product, whose int32 sums span K.
"""

from __future__ import annotations

import torch
import triton.language as tl

from quantkit.formats.nibble_planes import padded_k
from quantkit.runtime.kernels.triton.dequant import group_scale_f32, planes_i8, side_by_side
from quantkit.runtime.kernels.jit import USE_ASM, check_device, kernel, launch_kernel
from quantkit.runtime.kernels.triton.int8_gemm import LQQ, MODES, W8
from quantkit.runtime.kernels.triton.launch import groups_in_halves


_W8, _LQQ = tl.constexpr(W8), tl.constexpr(LQQ)  # int8_gemm.MODES, readable in @jit code


@kernel
def _operand_kernel(w_ptr, p_ptr, cs_ptr, rows_ptr, out_ptr, scales_ptr, N, n_out, w_row, out_row, hpg, groups,
                    BN: tl.constexpr, MODE: tl.constexpr, SCATTER: tl.constexpr, USE_ASM: tl.constexpr):
    """Rows [BN] × one 256-column tile of a weight's int8 operand — ``w8``: its stored bytes; ``w4a16``: q − z as
    ((q·1 + 128 − z) mod 256) XOR 0x80; ``w4a8-lqq``: ((q·s_u8 + a) mod 256) XOR 0x80 (LiquidGEMM Eq. 12) — and
    its fp32 scales (the tile's two groups; LiquidQuant's one per-channel scale s_c), stored to output row
    ``rows[n]`` when SCATTER, else row n."""
    pid_n = tl.program_id(0)
    t = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    rn_in = tl.minimum(rn, N - 1)
    g_lo = tl.minimum((2 * t) // hpg, groups - 1)
    g_hi = tl.minimum((2 * t + 1) // hpg, groups - 1)
    p_lo = tl.load(p_ptr + g_lo * N + rn_in)
    p_hi = tl.load(p_ptr + g_hi * N + rn_in)
    if MODE == _W8:
        w = tl.load(w_ptr + rn_in[:, None] * w_row + t * 256 + tl.arange(0, 256)[None, :])
        s_lo = p_lo
        s_hi = p_hi
    else:
        words = tl.load(w_ptr + rn_in[:, None] * w_row + t * 32 + tl.arange(0, 32)[None, :])
        if MODE == _LQQ:
            planes = planes_i8(words, (p_lo & 0xFF)[:, None], ((p_lo >> 8) & 0xFF)[:, None], (p_hi & 0xFF)[:, None],
                               ((p_hi >> 8) & 0xFF)[:, None], USE_ASM)
            s_lo = tl.load(cs_ptr + rn_in).to(tl.float32)
            s_hi = s_lo
        else:
            one = tl.full((BN, 1), 1, tl.int32)
            planes = planes_i8(words, one, (128 - ((p_lo >> 16) & 0xFF))[:, None], one,
                               (128 - ((p_hi >> 16) & 0xFF))[:, None], USE_ASM)
            s_lo = group_scale_f32(p_lo, False)
            s_hi = group_scale_f32(p_hi, False)
        w = side_by_side(planes, 0, 8)
    if SCATTER:
        dest = tl.load(rows_ptr + rn_in).to(tl.int64)
    else:
        dest = rn.to(tl.int64)
    ok = rn < N
    k = t * 256 + tl.arange(0, 256)
    tl.store(out_ptr + dest[:, None] * out_row + k[None, :], w, mask=ok[:, None])
    if MODE == _LQQ:  # one scale a row, from the row's first tile
        if t == 0:
            tl.store(scales_ptr + dest, s_lo, mask=ok)
    else:
        tl.store(scales_ptr + g_lo * n_out + dest, s_lo, mask=ok)
        tl.store(scales_ptr + g_hi * n_out + dest, s_hi, mask=ok)


def write_operand(layout: str, tensors: dict, meta: dict, weight: torch.Tensor, scales: torch.Tensor,
                  rows: torch.Tensor | None = None, use_asm: bool | None = None) -> None:
    """Write a ``w8``, ``w4a16`` or ``w4a8-lqq`` weight's int8 operand into ``weight`` [N_out, Kp] and its fp32
    scales into ``scales`` [G, N_out] (:func:`scale_groups`), at rows ``rows`` (int32 [N], a mixed layer's
    partition) or 0..N-1 — one launch. The operand equals :func:`.reference.int8_weight`; the scales are the W4A8
    kernels' widened fp16 group scales, LiquidQuant's per-channel s_c."""
    w = tensors["qweight"]
    p = tensors["scales"] if layout == "w8" else tensors["qparams"]
    cs = tensors["channel_scales"] if MODES[layout] == LQQ else p
    check_device(w, p, cs, weight, scales, *(() if rows is None else (rows,)))
    n = int(meta["out_features"])
    n_tiles = weight.shape[1] // 256
    bn = 64
    launch_kernel(_operand_kernel, (-(-n // bn), n_tiles), w, p, cs, p if rows is None else rows, weight, scales, n,
                  weight.shape[0], w.shape[1], weight.stride(0), groups_in_halves(meta, n_tiles), p.shape[0], BN=bn,
                  MODE=MODES[layout], SCATTER=rows is not None, USE_ASM=USE_ASM if use_asm is None else use_asm,
                  num_warps=4)


def scale_group(layout: str, meta: dict) -> int:
    """The columns each float scale of the layout's int8 operand covers: the group size, -1 (the whole row) for
    LiquidQuant, whose groups are integers inside the int8 codes and whose one float scale is per channel."""
    return -1 if MODES[layout] == LQQ else int(meta["group_size"])


def scale_groups(layout: str, meta: dict) -> int:
    """How many scale rows the layout's int8 operand has (:func:`scale_group`)."""
    return 1 if scale_group(layout, meta) == -1 else int(meta["num_groups"])


def _empty_operand(n: int, layout: str, meta: dict, device) -> tuple[torch.Tensor, torch.Tensor]:
    kp = padded_k(int(meta["in_features"]))
    return (torch.empty(n, kp, dtype=torch.int8, device=device),
            torch.empty(scale_groups(layout, meta), n, dtype=torch.float32, device=device))


def w8_operand(layout: str, tensors: dict, meta: dict) -> dict:
    """``w8``-layout tensors {"qweight": int8 [N, Kp], "scales": fp32 [G, N]} holding the same int8 operand and
    scales as a ``w8``, ``w4a16`` or ``w4a8-lqq`` weight (module docstring; LiquidQuant's are per channel)."""
    if layout == "w8":
        return tensors
    weight, scales = _empty_operand(int(meta["out_features"]), layout, meta, tensors["qweight"].device)
    write_operand(layout, tensors, meta, weight, scales)
    return {"qweight": weight, "scales": scales}


def mixed_w8_operand(parts: list, out_features: int) -> tuple[dict, dict] | None:
    """One ``w8``-layout (tensors, meta) for a mixed layer's partitions ((layout, tensors, meta, rows) of ``w8``,
    ``w4a16`` or ``w4a8-lqq`` rows), rows in output order, written by one launch per partition; None when the
    partitions' K or scale groups (:func:`scale_group`) differ (then each keeps its own kernel): MixLLM's
    ``w4a16`` + ``w8`` g128 rows, or LiquidQuant rows next to per-channel ``w8`` rows."""
    metas = [p[2] for p in parts]
    if sum(int(m["out_features"]) for m in metas) != out_features:
        raise ValueError(f"the partitions have {[int(m['out_features']) for m in metas]} rows, the layer "
                         f"{out_features}")
    groups = {scale_group(layout, meta) for layout, _, meta, _ in parts}
    if len({int(m["in_features"]) for m in metas}) != 1 or len(groups) != 1:
        return None
    layout0, tensors0, meta0, _ = parts[0]
    weight, scales = _empty_operand(out_features, layout0, meta0, tensors0["qweight"].device)
    for layout, tensors, meta, rows in parts:
        write_operand(layout, tensors, meta, weight, scales, rows.to(torch.int32).contiguous())
    meta = {"out_features": out_features, "in_features": int(meta0["in_features"]), "group_size": groups.pop(),
            "num_groups": scales.shape[0]}
    return {"qweight": weight, "scales": scales}, meta
