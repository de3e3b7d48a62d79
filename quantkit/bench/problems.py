"""Benchmark problems: for one method and shape, random weights quantized and packed in the method's layout,
several copies of every operand (:func:`quantkit.bench.timing.copies_to_defeat_l2`), and the call to time.

Methods (activations fp16; "+aq" variants include the activation quantization kernel in the timed call):

=================  ==========================================================================================
fp16               torch F.linear (cuBLAS), the baseline every speedup is quoted against
int_mm             torch._int_mm int8 × int8 → int32 (cuBLAS, no scales: a lower bound for any W8A8), M > 16
fp8                torch._scaled_mm fp8 e4m3 × e4m3 → fp16 (cuBLAS, one scale; sm_89+): an 8-bit GEMM with no
                   dequantization at all, the same tensor-core rate as int8 on Hopper — the ceiling of any W4A8
w4a16              quantkit W4A16 kernel, 4-bit asym g128 weights (``w4a16`` layout)
w8a8[+aq]          int8 kernel, sym-8 g128 weights (``w8``), A8 g128 activations (MixLLM W8A8)
w8a8-ch[+aq]       int8 kernel, sym-8 per-channel weights (``w8``), A8 per-token activations (SmoothQuant's W8A8)
fp8-w8a8[+aq]      the ``fp8`` operation: E4M3 per-channel weights (``fp8``), E4M3 per-token activations (vLLM's FP8
                   W8A8)
w4a8[+aq]          int8 kernel, asym-4 g128 weights (``w4a16``), A8 g128 activations (MixLLM W4A8)
w4a8-lqq[+aq]      int8 kernel, LiquidQuant weights (``w4a8-lqq``), A8 per-token activations (LiquidGEMM)
mixed[+aq]         one launch over a MixLLM W4.4A8 layer: 10 % of rows sym-8 (``w8``), 90 % asym-4
mixed-lqq[+aq]     the same over a ``mixllm-lqq-w4a8`` layer: 90 % LiquidQuant rows, 10 % sym-8 per channel, A8 per
                   token
act-quant          the Triton activation quantizer alone (fp16 [M, K] → int8 + g128 scales)
=================  ==========================================================================================
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from quantkit.bench.roofline import tensor_bytes
from quantkit.bench.timing import copies_to_defeat_l2
from quantkit.errors import QuantkitError

METHODS = ("fp16", "int_mm", "fp8", "w4a16", "w8a8", "w8a8+aq", "w8a8-ch", "w8a8-ch+aq", "fp8-w8a8", "fp8-w8a8+aq",
           "w4a8", "w4a8+aq", "w4a8-lqq", "w4a8-lqq+aq", "mixed", "mixed+aq", "mixed-lqq", "mixed-lqq+aq",
           "act-quant")
MIXED_8BIT_SHARE = 0.10  # MixLLM W4.4A8 (p10): 10 % of output channels at 8 bits


@dataclass
class Problem:
    """What to time: ``fn(*inputs[i])`` for rotating copies, and the byte/op counts of one call. The quantkit
    kernels read their TileConfig from ``state["config"]`` at call time, so one problem (its weights quantized
    and packed once) can be timed under several configs; likewise ``state["dequant"]`` (w4a16) and
    ``state["launches"]`` / ``state["bn_b"]`` (mixed), and ``state["kernel"]`` / ``state["launch_config"]`` (one
    registry kernel, and one launch of it), None meaning the default choice."""

    fn: Callable
    inputs: list[tuple]
    weight_bytes: int
    act_bytes_per_elem: float
    int8: bool
    state: dict = field(default_factory=dict)


def _quantize(kind: str, w: torch.Tensor, group_size: int = 128):
    from quantkit.quant import grid
    from quantkit.quant.lqq import lqq_quantize

    if kind == "w4a8-lqq":
        return lqq_quantize(w, 128)
    if kind == "w8":
        return grid.quantize(w, 8, group_size, sym=True)
    if kind == "fp8":
        return grid.quantize_fp8(w, -1)
    return grid.quantize(w, 4, 128, sym=False)


def _packed(layout: str, w: torch.Tensor, group_size: int = 128) -> tuple[dict, dict]:
    from quantkit.formats.registry import get_layout

    qw = _quantize(layout, w, group_size)
    lay = get_layout(layout)
    return lay.pack(qw), lay.layout_meta(qw)


def _fp8_problem(m: int, n: int, k: int, randn) -> Problem:
    """The ``fp8`` method: cuBLAS's fp8 GEMM on e4m3 operands (weight column-major, as cuBLAS wants it)."""
    from quantkit.bench.roofline import fp8_matmul, fp8_matmul_supported

    if not fp8_matmul_supported():
        raise QuantkitError("torch._scaled_mm fp8 needs a GPU with fp8 tensor cores (sm_89 or later)")
    e4m3 = torch.float8_e4m3fn
    one = torch.ones((), device="cuda")
    copies = copies_to_defeat_l2(n * k + m * k + 2 * m * n)
    inputs = [(randn(m, k).to(e4m3), randn(n, k).to(e4m3).t()) for _ in range(copies)]
    try:  # cuBLAS's shape rules for fp8 (dimensions multiples of 16) vary with the torch release: ask it
        fp8_matmul(*inputs[0], one)
    except RuntimeError as e:
        raise QuantkitError(f"torch._scaled_mm fp8 cannot run M={m}, N={n}, K={k}: {str(e).splitlines()[0]}") from e
    return Problem(lambda a, b: fp8_matmul(a, b, one), inputs, n * k, 1.0, True)


def _fp8_w8a8_problem(m: int, n: int, k: int, randn, with_aq: bool, state: dict) -> Problem:
    """The ``fp8-w8a8`` method: per-token E4M3 activations × an ``fp8`` weight through the ``fp8`` priority list
    ("+aq": with the fused FP8 activation quantizer the packed model runs)."""
    from quantkit.runtime.kernels.entry import fp8_codes
    from quantkit.runtime.kernels.fp8_gemm import fp8_matmul

    t, meta = _packed("fp8", randn(n, k, dtype=torch.float32))
    state["meta"] = meta
    wb = tensor_bytes(t)
    copies = copies_to_defeat_l2(wb + 2 * m * k + 2 * m * n)
    inputs = []
    for _ in range(copies):
        x, tt = randn(m, k), {key: v.clone() for key, v in t.items()}
        inputs.append((x, tt) if with_aq else (*fp8_codes(x), tt))

    def call(a, s, tt):
        return fp8_matmul(a, s, tt, meta, kernel=state.get("kernel"))
    if with_aq:
        return Problem(lambda x, tt: call(*fp8_codes(x), tt), inputs, wb, 2.0, True, state)
    return Problem(call, inputs, wb, 1.0 + 4.0 / k, True, state)


def build_problem(method: str, m: int, n: int, k: int, config=None, seed: int = 0) -> Problem:
    """The :class:`Problem` of ``method`` (module docstring) at [M, K] × [K, N]; ``config`` a TileConfig for
    the quantkit kernels (None: the default rule)."""
    from quantkit.runtime.kernels.triton.act_quant import quantize_activation_triton
    from quantkit.runtime.kernels.gemm import int8_matmul, mixed_int8_matmul, w4a16_matmul

    if method not in METHODS:
        raise QuantkitError(f"unknown benchmark method '{method}'; known: {', '.join(METHODS)}")
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(seed)
    state = {"config": config}

    def randn(*shape, dtype=torch.float16):
        return torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32).to(dtype)

    if method == "fp16":
        copies = copies_to_defeat_l2(2 * n * k + 2 * m * k + 2 * m * n)
        inputs = [(randn(m, k), randn(n, k)) for _ in range(copies)]
        return Problem(lambda x, w: F.linear(x, w), inputs, 2 * n * k, 2.0, False)
    if method == "int_mm":
        if m <= 16:
            raise QuantkitError("torch._int_mm needs M > 16")
        copies = copies_to_defeat_l2(n * k + m * k + 4 * m * n)
        mk = lambda *s: torch.randint(-127, 128, s, generator=gen, device=dev, dtype=torch.int8)  # noqa: E731
        inputs = [(mk(m, k), mk(n, k).t()) for _ in range(copies)]
        try:  # cuBLAS's shape rules (K and N multiples of 8 in the releases seen) vary with the torch release: ask it
            torch._int_mm(*inputs[0])
        except RuntimeError as e:
            raise QuantkitError(f"torch._int_mm cannot run M={m}, N={n}, K={k}: {str(e).splitlines()[0]}") from e
        return Problem(lambda a, b: torch._int_mm(a, b), inputs, n * k, 1.0, True)
    if method == "fp8":
        return _fp8_problem(m, n, k, randn)
    if method == "act-quant":
        copies = copies_to_defeat_l2(3 * m * k)
        inputs = [(randn(m, k),) for _ in range(copies)]
        return Problem(lambda x: quantize_activation_triton(x, 8, 128), inputs, 0, 3.0, False)
    if method == "w4a16":
        t, meta = _packed("w4a16", randn(n, k, dtype=torch.float32))
        state["meta"] = meta
        wb = tensor_bytes(t)
        copies = copies_to_defeat_l2(wb + 2 * m * k + 2 * m * n)
        inputs = [(randn(m, k), {key: v.clone() for key, v in t.items()}) for _ in range(copies)]
        return Problem(lambda x, tt: w4a16_matmul(x, tt, meta, state["config"], dequant=state.get("dequant"),
                                                  kernel=state.get("kernel"),
                                                  launch_config=state.get("launch_config")), inputs, wb, 2.0, False,
                       state)
    base, with_aq = method.split("+")[0], method.endswith("+aq")
    if base == "fp8-w8a8":
        return _fp8_w8a8_problem(m, n, k, randn, with_aq, state)
    act_group = -1 if base in ("w4a8-lqq", "w8a8-ch", "mixed-lqq") else 128
    if base in ("mixed", "mixed-lqq"):
        if n < 2:
            raise QuantkitError(f"{base} needs N >= 2 (a 4-bit and an 8-bit partition), got N={n}")
        n8 = max(1, int(round(MIXED_8BIT_SHARE * n)))
        perm = torch.randperm(n, generator=gen, device=dev)
        rows8, rows4 = perm[:n8].sort().values, perm[n8:].sort().values
        w = randn(n, k, dtype=torch.float32)
        four = "w4a16" if base == "mixed" else "w4a8-lqq"  # mixed-lqq: mixllm-lqq-w4a8's partitions
        parts_t = [(four,) + _packed(four, w[rows4]) + (rows4.to(torch.int32),),
                   ("w8",) + _packed("w8", w[rows8], 128 if base == "mixed" else -1) + (rows8.to(torch.int32),)]
        wb = sum(tensor_bytes(p[1]) + p[3].numel() * 4 for p in parts_t)
        state["meta"] = {"out_features": n, "in_features": k}

        def call(a, s, parts):
            return mixed_int8_matmul(a, s, act_group, parts, n, config=state["config"], bn_b=state.get("bn_b"),
                                     launches=state.get("launches"), kernel=state.get("kernel"),
                                     launch_config=state.get("launch_config"))
        clone = lambda: [(p[0], {key: v.clone() for key, v in p[1].items()}, p[2], p[3]) for p in parts_t]  # noqa
    else:
        layout = {"w8a8": "w8", "w8a8-ch": "w8", "w4a8": "w4a16", "w4a8-lqq": "w4a8-lqq"}[base]
        t, meta = _packed(layout, randn(n, k, dtype=torch.float32), -1 if base == "w8a8-ch" else 128)
        state["meta"] = meta
        wb = tensor_bytes(t)

        def call(a, s, tt):
            return int8_matmul(a, s, act_group, layout, tt, meta, config=state["config"], kernel=state.get("kernel"),
                               launch_config=state.get("launch_config"))
        clone = lambda: {key: v.clone() for key, v in t.items()}  # noqa: E731
    copies = copies_to_defeat_l2(wb + 2 * m * k + 2 * m * n)
    inputs = []
    for _ in range(copies):
        x = randn(m, k)
        if with_aq:
            inputs.append((x, clone()))
        else:
            a, s = quantize_activation_triton(x, 8, act_group)
            inputs.append((a, s, clone()))
    if with_aq:
        def fn(x, tt):
            a, s = quantize_activation_triton(x, 8, act_group)
            return call(a, s, tt)
        return Problem(fn, inputs, wb, 2.0, True, state)
    return Problem(call, inputs, wb, 1.0 + 4.0 / (128 if act_group == 128 else k), True, state)
