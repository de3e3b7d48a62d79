"""W4A16 decode GEMV in CUDA C++ (compiled at run time by NVRTC through CuPy), reading the ``w4a16`` layout.

Why CUDA next to the Triton kernels: a decode GEMV (M <= 16 tokens) is a weight stream (MixLLM Sec. 3.5
roofline), and Triton's smallest tensor-core operand wastes most of each program on a 16-token activation tile.
This kernel is warp-level, in the manner of TurboMind's GEMV path (TurboMind Sec. 4):

* a block owns 16 weight rows; its NWARPS warps split K by 256-column tiles (warp w takes tiles w, w + NWARPS,
  …, one tile loaded ahead into the other of two register tiles) and add their partial sums through shared
  memory at the end; under programmatic dependent launch a warp requests its first tile, or at M <= 8 on layers
  of <= 8192 rows and columns its first two (:func:`wait_after_two`), before it waits for the previous grid;
* lane (g, c) — the coordinates of the ``mma.sync.m16n8k16`` fragments — loads 16-byte vectors c and c + 4 of
  rows g and g + 8 of the tile (``ld.global.nc.L1::no_allocate``: each weight byte is read once); every word
  feeds the same fragment slot of all 8 planes (the tile-planar order of :mod:`quantkit.formats.nibble_planes`);
* dequantization in registers, per pair of adjacent columns: PRMT gathers byte b of two adjacent words, a mask
  | 0x6400 forms the fp16 pair 1024 + q and one sub.f16x2 of 1024 + z (high nibbles: fma by 1/16 and
  −(64 + z)) gives q − z *exactly* — the magic-number int→float of MixLLM Sec. 3.3 / TurboMind Fig. 6
  (bf16: 128 + q with the 0x4300 exponent);
* tensor cores multiply (q − z) by up to 8 tokens (the mma's N side; the GEMV's one token wastes nothing that
  the memory-bound kernel needs; or two sets of 8 by the same dequantized fragment, a launch column of 16)
  into an fp32 partial sum per 128-column group, which is scaled once by the group's fp32 scale (MixLLM Sec. 3.3
  group-tile accumulation). Ŵ is therefore never rounded to fp16: the result is the exact Σ (q − z)·s·x up to fp32
  summation, within the fp16 rounding of the weight of :func:`quantkit.runtime.kernels.reference.w4a16_reference`
  (which rounds Ŵ to the activation dtype as the tensor-core kernels do).

On an H100 it runs close to a pure read of the same bytes and beats the Triton kernel's 128-row tiles at M <= 8
(docs/BENCHMARKS.md). The tile loop is kept to ~270 instructions (a shift for the group index, a one-instruction
mask, no tile copy or token predicate), since its instruction count shows directly in the time (Nsight Compute).
Staging activations in shared memory, streaming weights through a shared-memory ring (TMA bulk copies or cp.async:
whole blocks wait for their chunk, then compute while nothing of theirs loads), a TMA L2 prefetch of the block's rows,
per-element fp16 scaling before the mma, a CUDA-core FMA form, register caps and a second tile in flight all measured
slower (docs/BENCHMARKS.md, Measured and dropped).

Requires K a multiple of 256 and 8-byte aligned activation rows (every real model's hidden sizes are);
:func:`cuda_gemv_supported` says when; :func:`quantkit.runtime.kernels.triton.w4a16.w4a16_matmul` uses it where
:func:`cuda_gemv_preferred` says it is faster and runs the Triton kernel otherwise. The pure-torch reference of the
format is :func:`quantkit.runtime.kernels.reference.w4a16_reference`; this kernel runs only with CuPy and a CUDA GPU.
"""

from __future__ import annotations

import dataclasses

import torch

from quantkit.runtime.kernels.cuda.common import (BoundLaunch, cuda_source, compile_problem, cxx_bool, device_index, device_problem,
                                                    group_shift, launch, launch_form)
from quantkit.runtime.kernels.triton.launch import groups_in_halves

TOKENS_PER_COLUMN = 8  # the mma's N side: tokens of one launch column
CUDA_GEMV_MAX_M = 8  # the most tokens w4a16_matmul's default path sends here (cuda_gemv_preferred); the kernel takes 16

SOURCE = cuda_source("prelude.cuh", "gemv_w4a16.cu")


@dataclasses.dataclass(frozen=True)
class GemvVariant:
    """One compiled form of the decode GEMV: ``warps`` per block (they split K) and the L2 sector prefetch its
    weight loads ask for (``l2_prefetch`` 0, 128 or 256 bytes)."""

    warps: int = 4
    l2_prefetch: int = 128
    token_sets: int = 1  # 8-token sets per launch column sharing every dequantized weight fragment (1 or 2)
    wait_after_two: bool = False  # the previous grid is waited for after two tiles are in flight, not one

    def kernel_name(self, bf16: bool) -> str:
        return (f"w4a16_gemv_mma<{self.warps}, {cxx_bool(bf16)}, {self.l2_prefetch}, {self.token_sets}, "
                f"{cxx_bool(self.wait_after_two)}>")

    @property
    def key(self) -> str:
        """Short name, as GEMV sweep results spell it."""
        return (f"cuda_w{self.warps}_pf{self.l2_prefetch}" + (f"_j{self.token_sets}" if self.token_sets > 1 else "")
                + ("_w2" if self.wait_after_two else ""))


# the candidate variants of a GEMV sweep (warps × L2 prefetch, and the two-tile wait)
VARIANTS = [GemvVariant(w, pf) for w in (2, 4, 8) for pf in (0, 128, 256)] + [
    GemvVariant(w, 128, 1, True) for w in (2, 4, 8)]
VARIANTS_M16 = [GemvVariant(w, 128, j) for w in (2, 4, 8) for j in (1, 2)]  # --m16 of the sweep


def cuda_gemv_problem(x: torch.Tensor, tensors: dict, meta: dict, out: torch.Tensor | None = None) -> str | None:
    """Why :func:`w4a16_gemv_cuda` cannot run ``x`` [M, K] against these ``w4a16`` tensors (None: it can): it
    needs M >= 1, fp16/bf16 activations with unit column stride and 8-byte aligned rows, K a multiple of 256,
    contiguous 16-byte aligned ``qweight`` and contiguous ``qparams`` on x's CUDA device, an ``out`` (if any) of
    x's dtype with unit column stride, a GPU of compute capability >= 8.0 (mma.sync m16n8k16) and CuPy whose
    NVRTC compiles the kernel. Checked in that order, so the shape reasons are testable without a GPU."""
    qweight, qparams = tensors["qweight"], tensors["qparams"]
    if x.dim() != 2 or x.shape[0] == 0:
        return "no tokens"
    if x.dtype not in (torch.float16, torch.bfloat16):
        return f"activations are {x.dtype}, not fp16/bf16"
    if int(meta["in_features"]) % 256:
        return f"K = {meta['in_features']} is not a multiple of 256"
    if x.stride(1) != 1 or x.data_ptr() % 8 or (x.stride(0) * x.element_size()) % 8:
        return "activation rows are not 8-byte aligned with unit column stride"
    if out is not None and (out.dtype != x.dtype or out.stride(1) != 1):
        return "out must have the activations' dtype and unit column stride"
    if not (qweight.is_contiguous() and qparams.is_contiguous() and qweight.data_ptr() % 16 == 0):
        return "packed tensors are not contiguous and 16-byte aligned"
    problem = device_problem(x, [qweight, qparams], (8, 0), "the GPU is older than compute capability 8.0")
    if problem:
        return problem
    variant = default_variant(int(meta["out_features"]), int(meta["in_features"]), x.shape[0])
    return compile_problem(device_index(x), SOURCE, (variant.kernel_name(x.dtype == torch.bfloat16),), "CUDA GEMV")


def cuda_gemv_supported(x: torch.Tensor, tensors: dict, meta: dict, out: torch.Tensor | None = None) -> bool:
    """True when :func:`cuda_gemv_problem` finds nothing in the way."""
    return cuda_gemv_problem(x, tensors, meta, out) is None


def cuda_gemv_warps(n: int, k: int) -> int:
    """Warps per block (they split K) of the register variant for an [N, K] weight: 8 for N <= 4096 (few 16-row
    blocks), 4 up to N = 8192, 2 up to 16384, else 4 — on an H100 the fastest of 2/4/8 per Llama-3.1-8B shape at
    M = 1, 2, 4 and 8, or within 6 % of it. Above 16384 rows 4 warps are faster than 2 or tie: at 111 registers nine
    2-warp blocks fit an SM, so past ~19000 rows the 2-warp launch needs a second, ragged wave (the A8 GEMV's rule
    too)."""
    return 8 if n <= 4096 else (4 if n <= 8192 or n > 16384 else 2)


def wait_after_two(n: int, k: int) -> bool:
    """Whether the decode GEMV of an [N, K] weight waits for the previous grid (programmatic dependent launch)
    after two weight tiles per warp are in flight rather than one: on layers of at most 8192 rows and columns, where
    it is 1.01-1.13× faster on an H100 (0.98-1.07× on 4608×3584); on the wider or longer layers (14336-37888 rows,
    12288-18944 columns) it measures 0.95-1.02×, not explained (the A8 GEMV, same loop, gains there:
    :func:`quantkit.runtime.kernels.cuda.gemv_a8.a8_wait_after_two`). Only at M <= 8 (one 8-token set per launch
    column); the 16-token variant waits after one tile."""
    return n <= 8192 and k <= 8192


def cuda_gemv_preferred(m: int, n: int, k: int) -> bool:
    """Whether the CUDA GEMV beats the Triton W4A16 kernel for M tokens on an [N, K] weight (H100): M <= 8 — it
    wins or ties on every Llama-3.1-8B shape there (M = 8: 6144×4096 10.6 vs 12.7 µs, 14336×4096 16.6 vs 17.2;
    28672×4096 and 4096×14336 within 2 %) — and Triton above, with its split-K slots (4096×4096 M = 16: 9.6 vs
    10.7 µs; 14336×4096: 19.4 vs 28.6)."""
    return 1 <= m <= CUDA_GEMV_MAX_M


def default_variant(n: int, k: int, m: int = 1) -> GemvVariant:
    """The GEMV variant :func:`w4a16_gemv_cuda` runs for M tokens on an [N, K] weight when none is named: M <= 8:
    warps by :func:`cuda_gemv_warps`, 128-byte L2 prefetch (2-4 % faster than none, as fast as 256 on an H100), the
    wait of :func:`wait_after_two`; above: 4 warps, two 8-token sets per launch column (the fastest or within 4 % of
    it at M = 12 and 16 on layers up to 8192 × 8192)."""
    if m > TOKENS_PER_COLUMN:
        return GemvVariant(4, 128, 2)
    return GemvVariant(cuda_gemv_warps(n, k), 128, 1, wait_after_two(n, k))


def _launch_args(x: torch.Tensor, tensors: dict, meta: dict, variant: GemvVariant | None,
                 out: torch.Tensor) -> tuple:
    """(function, pdl, device index, grid, block, arguments) of :func:`w4a16_gemv_cuda`'s launch."""
    import numpy as np

    m, k = x.shape
    n = int(meta["out_features"])
    if k != int(meta["in_features"]):
        raise ValueError(f"x must be [M, {meta['in_features']}], got {tuple(x.shape)}")
    qweight, qparams = tensors["qweight"], tensors["qparams"]
    n_tiles, n_groups = qweight.shape[1] // 32, qparams.shape[0]
    dev = device_index(x)
    variant = variant or default_variant(n, k, m)
    if variant.token_sets not in (1, 2):
        raise ValueError(f"token_sets must be 1 or 2, got {variant.token_sets}")
    fn, pdl = launch_form(dev, SOURCE, variant.kernel_name(x.dtype == torch.bfloat16))
    hpg = groups_in_halves(meta, n_tiles)
    shift = group_shift(int(meta["group_size"]), hpg)
    grid = (-(-n // 16), -(-m // (TOKENS_PER_COLUMN * variant.token_sets)))
    args = (np.uint64(x.data_ptr()), np.uint64(qweight.data_ptr()), np.uint64(qparams.data_ptr()),
            np.uint64(out.data_ptr()), np.int32(m), np.int32(n), np.int64(x.stride(0)), np.int64(out.stride(0)),
            np.int32(qweight.shape[1] // 4), np.int32(n_tiles), np.int32(hpg), np.int32(shift), np.int32(n_groups))
    return fn, pdl, dev, grid, (32 * variant.warps,), args


def w4a16_gemv_cuda(x: torch.Tensor, tensors: dict, meta: dict, variant: GemvVariant | None = None,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Y = X·Ŵᵀ [M, N] in x's dtype for a ``w4a16`` weight (module docstring), on x's current CUDA stream (so it
    can be captured in a CUDA graph once it has run outside capture: the first call compiles); 8 or 16 tokens
    per launch column. Ŵ is not rounded to the activation dtype (module docstring), so results differ from the
    Triton kernels and :func:`quantkit.runtime.kernels.reference.w4a16_reference` by that rounding (≈ 3e-4
    relative in fp16). The caller checks :func:`cuda_gemv_supported`; ``variant`` defaults to
    :func:`default_variant`."""
    out = torch.empty(x.shape[0], int(meta["out_features"]), dtype=x.dtype, device=x.device) if out is None else out
    fn, pdl, dev, grid, block, args = _launch_args(x, tensors, meta, variant, out)
    launch(fn, pdl, dev, torch.cuda.current_stream(x.device).cuda_stream, grid, block, args)
    return out


class BoundW4a16Gemv:
    """:func:`w4a16_gemv_cuda` of one layer at one token count and dtype, prepared once
    (:class:`~quantkit.runtime.kernels.cuda.common.BoundLaunch`): a call allocates the output, sets the two
    pointers and launches. ``x`` must have the row stride of the activations it was bound with, unit column stride
    and 8-byte alignment, and be on the current device; otherwise, or if the driver refuses the launch, the call
    returns None and the caller runs :func:`w4a16_gemv_cuda`."""

    POINTER_ARGS = (0, 3)  # positions of the activation and output pointers in the GEMV's arguments

    def __init__(self, bound: BoundLaunch, x: torch.Tensor, n: int):
        self.bound, self.n = bound, n
        self.m, self.dtype, self.device, self.x_stride = x.shape[0], x.dtype, x.device, x.stride(0)

    @classmethod
    def create(cls, x: torch.Tensor, tensors: dict, meta: dict) -> BoundW4a16Gemv | None:
        """The bound GEMV for activations shaped, strided and typed like ``x`` (which the caller checked with
        :func:`cuda_gemv_problem`), or None where a launch cannot be bound on this driver."""
        n = int(meta["out_features"])
        out = torch.empty(x.shape[0], n, dtype=x.dtype, device=x.device)
        bound = BoundLaunch.create(*_launch_args(x, tensors, meta, None, out), cls.POINTER_ARGS)
        return None if bound is None else cls(bound, x, n)

    def __call__(self, x: torch.Tensor) -> torch.Tensor | None:
        ptr = x.data_ptr()
        if x.stride(0) != self.x_stride or x.stride(1) != 1 or ptr % 8:
            return None
        out = torch.empty(self.m, self.n, dtype=self.dtype, device=self.device)
        return out if self.bound(ptr, out.data_ptr()) else None
