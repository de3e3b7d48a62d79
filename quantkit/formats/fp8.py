"""``fp8`` layout: FP8 E4M3 weights with one scale per output channel, as cuBLAS's FP8 GEMM (``torch._scaled_mm``)
reads them — the layout of vLLM's and llm-compressor's FP8 W8A8 checkpoints (a float8 weight and an fp32 scale per
output channel).

Tensors (N = out_features, K = in_features):

* ``qweight`` float8_e4m3fn [N, K]: the e4m3 codes, row-major along K (its transpose is the column-major [K, N]
  operand the GEMM takes);
* ``scales`` float32 [N]: the record's fp16 scale of each output channel, in 32 bits (the GEMM's row scale).

Dequantization: W[n, k] = float(qweight[n, k]) · scales[n]. Group-wise FP8 weights have no kernel and stay in
``reference``.
"""

from __future__ import annotations

import torch

from quantkit.formats.common import fp16, meta_field, record_problem, refuse_unsupported, require
from quantkit.formats.kernel_common import base_meta
from quantkit.quant.records import QuantizedWeight

NAME = "fp8"
FORMAT_VERSION = 1
# the axis of each tensor that indexes output rows (rows are packed independently): quantkit.formats.row_concat
ROW_AXES = {"qweight": 0, "scales": 0}


def supports(qw: QuantizedWeight) -> str | None:
    """None when ``qw`` is an FP8 E4M3 weight with one scale per output channel, else the reason."""
    if not qw.fp8:
        return "fp8 holds FP8 E4M3 weights; integer codes go to 'w8', 'w4a16' or 'w4a8-lqq'"
    if qw.group_size != -1:
        return (f"fp8 holds one scale per output channel, this weight has groups of {qw.group_size}; use "
                "group_size: -1 or the 'reference' layout")
    if qw.g_idx is not None:
        return "fp8 holds weights without act-order's g_idx"
    return record_problem(qw)


def layout_meta(qw: QuantizedWeight) -> dict:
    """The JSON-serialisable facts :func:`unpack` and the kernel need besides the tensors."""
    return {**base_meta(qw, NAME, FORMAT_VERSION, qw.codes.shape[1]), "fp8": True}


def pack(qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    """{"qweight", "scales"} of ``qw`` (module docstring); QuantkitError when :func:`supports` refuses it."""
    refuse_unsupported(NAME, supports(qw))
    return {"qweight": qw.codes.contiguous().view(torch.float8_e4m3fn),
            "scales": fp16(qw.scales[:, 0]).float().contiguous()}


def unpack(tensors: dict[str, torch.Tensor], meta: dict) -> QuantizedWeight:
    """Rebuild the QuantizedWeight :func:`pack` stored (codes the e4m3 bit patterns, zeros 0, scales float32)."""
    n = int(meta_field(meta, "out_features", NAME))
    k = int(meta_field(meta, "in_features", NAME))
    qweight = require(tensors, "qweight", (n, k), torch.float8_e4m3fn, NAME)
    scales = require(tensors, "scales", (n,), torch.float32, NAME)
    return QuantizedWeight(codes=qweight.view(torch.uint8).contiguous(), scales=scales.half().float().unsqueeze(1),
                           zeros=torch.zeros(n, 1, dtype=torch.uint8, device=qweight.device), bits=8,
                           group_size=-1, sym=True, fp8=True)
