"""FP8 W8A8 products: per-token dynamic E4M3 activations × an ``fp8`` weight (E4M3, one scale per output channel),
the scheme vLLM and llm-compressor users deploy on Hopper.

One operation, ``fp8``, with its priority list in the kernel registry (:mod:`.registry`):
``cublas.scaled_mm`` → ``torch.fp8``.

* ``cublas.scaled_mm``: ``torch._scaled_mm`` on the FP8 tensor cores (sm_89 and newer; K and N multiples of 16),
  with the activation's per-token scales and the weight's per-channel scales applied by cuBLAS to the fp32
  accumulator (row-wise scaling). Where this torch build's row-wise scaling cannot write the output dtype, it
  writes fp32 with unit scales and the two scales are applied after, the same arithmetic in one more pass.
* ``torch.fp8``: the same product in fp32 torch ops on any device (:func:`fp8_reference`), for shapes and GPUs
  cuBLAS does not take.

Y[m, n] = (Σ_k a[m, k] · w[n, k]) · sa[m] · sw[n], with a, w the e4m3 values. Each product is exact in fp32, but
Hopper's FP8 tensor cores add them at less than fp32 precision: cuBLAS's result is off the fp32 sum by up to
3.6e-5 of Σ|a·w| on an H200 (measured by the tests), so it is checked against that bound, not to the ulp.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from quantkit.runtime.kernels.registry import GemmKernel, GemmProblem, bind, forced_kernel, register, run

HALF = (torch.float16, torch.bfloat16)
FP8_MIN_CAPABILITY = (8, 9)  # Ada and Hopper: the first GPUs with FP8 tensor cores
_REFUSED: set[tuple] = set()  # (M, N, K, dtype, capability) the build's _scaled_mm refused: not asked again


@dataclass
class Fp8Call:
    """The arguments of an ``fp8`` call: activation codes float8_e4m3fn [M, K] and float32 scales [M, 1], the
    ``fp8`` layout's tensors (``qweight`` float8_e4m3fn [N, K], ``scales`` float32 [N]) and meta, the output dtype."""

    a_codes: torch.Tensor
    a_scales: torch.Tensor
    tensors: dict
    meta: dict
    out_dtype: torch.dtype
    ACTIVATIONS = ("a_codes", "a_scales")  # what a prepared launch's calls replace (registry.GemmKernel.bind)


def fp8_reference(a_codes: torch.Tensor, a_scales: torch.Tensor, tensors: dict, out_dtype: torch.dtype
                  ) -> torch.Tensor:
    """Y [M, N] in ``out_dtype``: the e4m3 product summed in fp32, times the token and channel scales in fp32, one
    rounding (module docstring)."""
    acc = a_codes.float() @ tensors["qweight"].float().t()
    return (acc * a_scales.float() * tensors["scales"].float().unsqueeze(0)).to(out_dtype)


@functools.lru_cache(maxsize=16)
def _rowwise_writes(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether this torch build's ``_scaled_mm`` takes row-wise scales with a ``dtype`` output on ``device`` (some
    releases write only bf16 there): asked once with a 16×16×16 product."""
    a = torch.zeros(16, 16, device=device).to(torch.float8_e4m3fn)
    ones = torch.ones(16, 1, device=device)
    try:
        torch._scaled_mm(a, a.t(), scale_a=ones, scale_b=ones.t(), out_dtype=dtype)
    except RuntimeError:
        return False
    return True


def scaled_mm_fp8(a_codes: torch.Tensor, a_scales: torch.Tensor, tensors: dict, out_dtype: torch.dtype
                  ) -> torch.Tensor:
    """Y [M, N] from cuBLAS's FP8 GEMM (module docstring): the weight [N, K] row-major is the column-major [K, N]
    operand cuBLAS takes, its scales the [1, N] row scale."""
    w = tensors["qweight"].t()
    sw = tensors["scales"].unsqueeze(0)
    if _rowwise_writes(a_codes.device, out_dtype):
        return torch._scaled_mm(a_codes, w, scale_a=a_scales, scale_b=sw, out_dtype=out_dtype)
    one = torch.ones((), device=a_codes.device)
    acc = torch._scaled_mm(a_codes, w, scale_a=one, scale_b=one, out_dtype=torch.float32)
    return (acc * a_scales * sw).to(out_dtype)


class CublasScaledMm(GemmKernel):
    """cuBLAS's FP8 GEMM through ``torch._scaled_mm`` (module docstring)."""

    name, ops = "cublas.scaled_mm", ("fp8",)

    def can_implement(self, p):
        if p.capability == (0, 0):
            return False, "needs a CUDA GPU"
        if p.capability < FP8_MIN_CAPABILITY:
            return False, "needs FP8 tensor cores (sm_89 or newer)"
        if p.k % 16 or p.n % 16:
            return False, f"cuBLAS FP8 takes K and N in multiples of 16, got K={p.k}, N={p.n}"
        if p.dtype not in HALF:
            return False, f"writes fp16 or bf16, not {p.dtype}"
        return True, ""

    def accepts(self, p, c, cfg):
        if c.a_codes.stride(1) != 1 or c.a_codes.data_ptr() % 16:
            return "the activation codes must be row-major with 16-byte aligned rows"
        if (p.m, p.n, p.k, p.dtype, p.capability) in _REFUSED:
            return "this torch build's cuBLAS FP8 GEMM refused the shape"
        return None

    def launch(self, p, c, cfg):
        try:
            return scaled_mm_fp8(c.a_codes, c.a_scales, c.tensors, c.out_dtype)
        except (torch.OutOfMemoryError, getattr(torch, "AcceleratorError", torch.OutOfMemoryError)):
            raise  # not a shape rule: a fallback would hide it (or need more memory)
        except RuntimeError:  # a shape rule of this torch build's cuBLAS path: the next kernel of the list runs it
            _REFUSED.add((p.m, p.n, p.k, p.dtype, p.capability))
            return None


class TorchFp8(GemmKernel):
    """The product in fp32 torch ops (:func:`fp8_reference`): every device and shape."""

    name, ops = "torch.fp8", ("fp8",)

    def can_implement(self, p):
        return True, ""

    def launch(self, p, c, cfg):
        return fp8_reference(c.a_codes, c.a_scales, c.tensors, c.out_dtype)


for _k in (CublasScaledMm(), TorchFp8()):
    register(_k)


def _call(a_codes: torch.Tensor, a_scales: torch.Tensor, tensors: dict, meta: dict, out_dtype: torch.dtype
          ) -> tuple[GemmProblem, Fp8Call]:
    """(the problem, the call) of an ``fp8`` product, its arguments checked."""
    from quantkit.runtime.kernels.gemm import problem_for

    n, k = int(meta["out_features"]), int(meta["in_features"])
    if a_codes.dtype != torch.float8_e4m3fn or a_codes.dim() != 2 or a_codes.shape[1] != k:
        raise ValueError(f"fp8 activation codes must be float8_e4m3fn [M, {k}], got {a_codes.dtype} "
                         f"{tuple(a_codes.shape)}")
    if a_scales.dtype != torch.float32 or tuple(a_scales.shape) != (a_codes.shape[0], 1):
        raise ValueError(f"fp8 activation scales must be float32 [M, 1], got {a_scales.dtype} "
                         f"{tuple(a_scales.shape)}")
    if tuple(tensors["qweight"].shape) != (n, k):
        raise ValueError(f"fp8 weight must be [{n}, {k}], got {tuple(tensors['qweight'].shape)}")
    p = problem_for("fp8", ("fp8",), a_codes.shape[0], n, k, -1, out_dtype, a_codes.device)
    return p, Fp8Call(a_codes, a_scales, tensors, meta, out_dtype)


def fp8_matmul(a_codes: torch.Tensor, a_scales: torch.Tensor, tensors: dict, meta: dict,
               out_dtype: torch.dtype = torch.float16, kernel: str | None = None) -> torch.Tensor:
    """Y [M, N] (``out_dtype``) of per-token FP8 activations (:func:`quantkit.quant.act.quantize_activation_fp8_codes`)
    and an ``fp8`` weight, by the kernel the ``fp8`` priority list picks; ``kernel`` (or ``QUANTKIT_KERNEL``) names
    one. Reference: :func:`fp8_reference`."""
    p, call = _call(a_codes, a_scales, tensors, meta, out_dtype)
    return run(p, call, forced_kernel("fp8", kernel))


def bind_fp8(a_codes: torch.Tensor, a_scales: torch.Tensor, tensors: dict, meta: dict, out_dtype: torch.dtype):
    """:func:`fp8_matmul` of this weight for activations like these with the kernel chosen once
    (:func:`.registry.bind`): ``f(codes, scales) -> Y | None``."""
    p, call = _call(a_codes, a_scales, tensors, meta, out_dtype)
    return bind(p, call, forced_kernel("fp8", None))
