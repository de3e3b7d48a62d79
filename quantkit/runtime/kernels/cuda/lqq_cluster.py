"""LiquidQuant W4A8 for layers with few output tiles: a K split reduced inside a thread-block cluster (CUDA C++ with
wgmma, NVRTC via CuPy; Hopper).

A layer of few weight rows (the 1024-row k/v projection of Llama-3-8B, Qwen2's 512-row one) gives the Gluon kernels
too few output tiles to fill 132 SMs at a few hundred tokens, so they split K. Their split programs each store an
fp32 slot to global memory, fence, take an atomic ticket, and the tile's last program reads every slot back
(:mod:`quantkit.runtime.kernels.triton.splitk`): on the k/v layer at 128 tokens, ~1.7-4.2 µs of a 9-12 µs launch.
Here the S programs that split one output tile's K are one cluster (``__cluster_dims__``), resident together, and
they add their partial tiles through distributed shared memory instead:

* a CTA (one or two warpgroups) owns 64 or 128 weight rows × BT tokens over 1/S of the 256-column tiles, the
  transposed product Y^T = W·X^T (LiquidGEMM Sec. 5.4): ``wgmma.m64nBTk32`` with the dequantized weights as the
  register A operand (each warp its own 16 rows) and the activation codes as the shared-memory B operand, which two
  warpgroups share;
* each tile's weight words, group words and activation codes arrive by ``cp.async`` in a STAGES-deep shared-memory
  ring (the first weight tiles before the wait for the previous grid). The codes sit in the 128-byte swizzle that
  the B descriptor reads, so their copies are contiguous rows and free of bank conflicts; token rows past M are
  zero-filled, not read;
* a lane reads its words from the ring and dequantizes them in registers, four int8 lanes per IMAD, as
  ((q·s + a) mod 256) XOR 0x80 (LiquidGEMM Eq. 11-12; the words, gather and arithmetic of the A8 GEMV,
  :mod:`quantkit.runtime.kernels.cuda.gemv_a8`) — tile t + 1's while tile t's products run (LiquidGEMM Sec. 5's
  overlap of dequantization and MMA). With depth 1 tile t's products complete before tile t + 1's are issued; with
  depth 2 they are issued first and the wait is for tile t − 1's, so the tensor cores always have a tile queued,
  three sets of A registers rotating. Each wait names the A registers of the products it completes as operands so
  that nothing overwrites them early (ptxas does not keep a register operand alive past the wgmma's issue;
  docs/BENCHMARKS.md), which ``quantkit.bench.sass`` checks in the SASS of every launch the rule makes;
* per-token activation scales and one per-channel weight scale (LiquidGEMM Sec. 4) leave the K sum an exact int32,
  so the partial tiles add exactly in any order: each CTA writes its int32 tile into its own shared memory, a
  cluster barrier (release / acquire) publishes it, CTA r adds token rows r·BT/S … of all S tiles over
  ``ld.shared::cluster`` and stores them as (sum · token scale) · channel scale in fp16/bf16 — the Triton and Gluon
  kernels' epilogue on the same exact sum, so the result is bit for bit theirs unsplit;
* a second cluster barrier keeps every CTA's shared memory alive until its peers have read it.

The product is a wgmma, not an ``mma.sync``: an mma.sync form is no faster per tile than the Gluon wgmma kernels.
It serves narrow layers (:func:`quantkit.runtime.kernels.heuristic.lqq_cluster_launch`, or a tuned table), where
the Gluon kernels cannot give every SM a program. It does not reach the Gluon kernels' rate at larger M: Nsight
Compute has it issuing on 22-31 % of cycles with the tensor pipe below that (ALU 21 %) and L2 at 25-31 % — a warp
issues ~440 instructions per tile step (the dequantization, ~14 cp.async with their addresses, the waits) with two
warps per scheduler to hide their latency. wgmma needs the ``sm_90a`` target, which
:func:`quantkit.runtime.kernels.cuda.common.compiled` reads from the source's ``// quantkit-arch:`` line.

Like the decode GEMVs it launches with programmatic dependent launch where the device takes it
(:mod:`quantkit.runtime.kernels.cuda.common`). Requires K a multiple of 256, per-token activations with 16-byte
aligned rows, fp16 channel scales, compute capability 9.0 exactly and CuPy: :func:`lqq_cluster_problem` says what
is missing. The format's pure-torch reference is :func:`quantkit.runtime.kernels.reference.int8_reference`.
"""

from __future__ import annotations

import torch

from quantkit.runtime.kernels.cuda.common import (cuda_source, allow_dynamic_shared, compile_problem, cxx_bool,
                                                    device_index, device_problem, group_shift, launch, launch_form)
from quantkit.runtime.kernels.triton.launch import groups_in_halves, split_plan

W_ROW_BYTES = 192  # one weight row of a stage: a tile's 128 bytes of words + 64 of padding
SWIZZLE_ATOM = 1024  # 8 rows of 128 bytes: the 128-byte swizzle's period, to which stages are aligned
CLUSTER_SPLITS = (1, 2, 4, 8)  # CTAs of a cluster (8: the portable cluster size)
CLUSTER_TOKENS = (64, 128)
CLUSTER_STAGES = (2, 3, 4)
CLUSTER_DEPTHS = (1, 2)  # tiles whose products are in flight (the kernel's two tile loops)
CLUSTER_ROWS = (64, 128)  # weight rows of a CTA: one warpgroup per 64
MAX_SHARED_BYTES = 227 * 1024  # sm_90's opt-in dynamic shared memory per block


# wgmma needs the architecture-specific target: cuda_common.compiled reads the first line
SOURCE = "// quantkit-arch: sm_90a\n" + cuda_source("prelude.cuh", "imma.cuh", "lqq_cluster.cu")


def cluster_kernel_name(split: int, tokens: int, stages: int, bf16: bool, depth: int = 1, rows: int = 64) -> str:
    """The template instance of SOURCE for a cluster of ``split`` CTAs, ``tokens`` per CTA, ``stages``, ``depth``
    tiles' products in flight and ``rows`` weight rows per CTA (64 per warpgroup)."""
    return f"lqq_cluster<{split}, {tokens}, {stages}, {cxx_bool(bf16)}, {depth}, {rows // 64}>"


def cluster_shared_bytes(tokens: int, stages: int, rows: int = 64) -> int:
    """Dynamic shared memory of a CTA: ``stages`` ring stages — a tile's ``tokens`` rows of 256 swizzled codes,
    ``rows`` padded weight rows and their 2 × ``rows`` group words — each rounded up to SWIZZLE_ATOM, and one more
    atom to align the first."""
    stage = tokens * 256 + rows * W_ROW_BYTES + 2 * rows * 4
    return stages * (-(-stage // SWIZZLE_ATOM) * SWIZZLE_ATOM) + SWIZZLE_ATOM


def _check_launch(tokens: int, split: int, stages: int, depth: int = 1, rows: int = 64) -> None:
    if (tokens not in CLUSTER_TOKENS or split not in CLUSTER_SPLITS or stages not in CLUSTER_STAGES
            or depth not in CLUSTER_DEPTHS or rows not in CLUSTER_ROWS):
        raise ValueError(f"tokens must be one of {CLUSTER_TOKENS}, split one of {CLUSTER_SPLITS}, stages one of "
                         f"{CLUSTER_STAGES}, depth one of {CLUSTER_DEPTHS} and rows one of {CLUSTER_ROWS}; got "
                         f"{tokens}, {split}, {stages}, {depth}, {rows}")
    # the kernel's static_asserts, and what a Hopper block can hold
    if depth == 2 and stages < 3:
        raise ValueError(f"depth 2 needs at least 3 stages (a tile's stage is refilled a tile late); got {stages}")
    if rows > 64 and depth == 1:
        raise ValueError(f"{rows} rows (warpgroups sharing each stage) need depth 2")
    if cluster_shared_bytes(tokens, stages, rows) > MAX_SHARED_BYTES:
        raise ValueError(f"{stages} stages of {tokens} tokens and {rows} rows need "
                         f"{cluster_shared_bytes(tokens, stages, rows)} bytes of shared memory, over the "
                         f"{MAX_SHARED_BYTES} of a Hopper block")


def lqq_cluster_problem(a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, layout: str,
                        tensors: dict, meta: dict, out_dtype: torch.dtype, out: torch.Tensor | None = None,
                        launch_cfg: tuple = (64, 4, 3, 1, 64)) -> str | None:
    """Why :func:`lqq_cluster_matmul` cannot run these arguments with ``launch_cfg`` = (tokens, split, stages[,
    depth[, rows]]) (None: it can): a ``w4a8-lqq`` weight of K a multiple of 256, per-token activation codes (int8,
    rows 16-byte aligned, unit column stride) and float32 scales, an fp16/bf16 output (``out``, if given, of that
    dtype with unit column stride), contiguous 16-byte aligned packed tensors with fp16 channel scales, all on one
    CUDA device of compute capability 9.0 exactly (thread-block clusters, wgmma, the table measured on an H100), and
    CuPy whose NVRTC compiles the instance. Cheap checks first (testable on a CPU)."""
    if layout != "w4a8-lqq":
        return f"layout {layout} is not w4a8-lqq"
    if act_group_size != -1:
        return "activations are not per-token"
    try:
        _check_launch(*launch_cfg)
    except ValueError as e:
        return str(e)
    k, n = int(meta["in_features"]), int(meta["out_features"])
    gs = int(meta["group_size"])
    if gs != -1 and (gs <= 0 or gs % 128):
        return f"weight group size {gs} is neither -1 nor a multiple of 128"
    if k % 256 or a_codes.dim() != 2 or a_codes.shape[1] != k or a_codes.shape[0] < 1:
        return f"K = {k} is not a multiple of 256 or not the codes' width, or there are no tokens"
    if out_dtype not in (torch.float16, torch.bfloat16):
        return f"output dtype {out_dtype} is not fp16/bf16"
    if a_codes.dtype != torch.int8 or a_codes.stride(1) != 1 or a_codes.data_ptr() % 16 or a_codes.stride(0) % 16:
        return "activation codes are not int8 rows, 16-byte aligned, with unit column stride"
    if a_scales.dtype != torch.float32 or tuple(a_scales.shape) != (a_codes.shape[0], 1):
        return "activation scales are not float32 [M, 1]"
    if out is not None and (out.dtype != out_dtype or out.stride(1) != 1 or out.stride(0) < n
                            or tuple(out.shape) != (a_codes.shape[0], n)):
        return "out must be [M, N] of the output dtype with unit column stride"
    qweight, qparams, cs = tensors["qweight"], tensors["qparams"], tensors["channel_scales"]
    if cs.dtype != torch.float16 or tuple(cs.shape) != (n,):
        return "LiquidQuant channel scales are not fp16 [N]"
    if (qweight.dtype != torch.int32 or tuple(qweight.shape) != (n, k // 8) or qparams.dtype != torch.int32
            or qparams.dim() != 2 or qparams.shape[1] != n):
        return "packed LiquidQuant tensors are not int32 qweight [N, K/8] and qparams [groups, N]"
    packed = [qweight, qparams, cs]
    if not all(v.is_contiguous() and v.data_ptr() % 16 == 0 for v in packed):
        return "packed tensors are not contiguous and 16-byte aligned"
    # exactly sm_90, as the Gluon kernels: the launches need up to 186 KiB of shared memory a block (consumer Blackwell
    # gives 99 KiB), and the rule was measured on an H100 only
    problem = device_problem(a_codes, packed + [a_scales] + ([out] if out is not None else []), (9, 0),
                             "the cluster kernel is built for Hopper (compute capability 9.0)", exact=True)
    if problem:
        return problem
    tokens, split, stages, depth, rows = tuple(launch_cfg) + (1, 64)[len(launch_cfg) - 3:]  # the defaults
    name = cluster_kernel_name(_cluster_split(int(meta["in_features"]) // 256, split)[1], tokens, stages,
                               out_dtype == torch.bfloat16, depth, rows)
    return compile_problem(device_index(a_codes), SOURCE, (name,),
                           "CUDA LiquidQuant cluster kernel")


def _cluster_split(n_tiles: int, split: int) -> tuple[int, int]:
    """(tiles per CTA, CTAs per cluster) for ``split`` asked on ``n_tiles`` 256-column tiles:
    :func:`quantkit.runtime.kernels.triton.launch.split_plan` (no CTA without a tile), lowered further to a cluster
    size that has an instance (14 tiles asked in 8 come out as 7 of 2, which becomes 4 of 4, 4, 4, 2)."""
    per, split = split_plan(n_tiles, split)
    while split not in CLUSTER_SPLITS:
        per, split = split_plan(n_tiles, split - 1)
    return per, split


def lqq_cluster_matmul(a_codes: torch.Tensor, a_scales: torch.Tensor, tensors: dict, meta: dict, tokens: int = 128,
                       split: int = 4, stages: int = 3, depth: int = 1, rows: int = 64,
                       out: torch.Tensor | None = None,
                       out_dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """Y [M, N] (``out_dtype``, or ``out``'s) = dequant(A)·Ŵᵀ for int8 codes [M, K] with per-token float32 scales
    [M, 1] and a ``w4a8-lqq`` weight (module docstring): ``tokens`` (64 or 128) and ``rows`` (64 or 128: one or two
    warpgroups) per CTA; K split over a cluster of ``split`` CTAs (1, 2, 4 or 8, lowered by :func:`_cluster_split`);
    ``stages`` (2-4) tiles in the ring; ``depth`` (1 or 2) tiles' products in flight. Bit for bit the unsplit
    Triton / Gluon LiquidQuant result.
    The caller checks :func:`lqq_cluster_problem`."""
    import numpy as np

    _check_launch(tokens, split, stages, depth, rows)
    m, k = a_codes.shape
    n = int(meta["out_features"])
    qweight, qparams, cs = tensors["qweight"], tensors["qparams"], tensors["channel_scales"]
    n_tiles = k // 256
    per, split = _cluster_split(n_tiles, split)
    out = torch.empty(m, n, dtype=out_dtype, device=a_codes.device) if out is None else out
    dev = device_index(a_codes)
    fn, pdl = launch_form(dev, SOURCE,
                          cluster_kernel_name(split, tokens, stages, out.dtype == torch.bfloat16, depth, rows))
    shared = cluster_shared_bytes(tokens, stages, rows)
    allow_dynamic_shared(fn, dev, shared)
    hpg = groups_in_halves(meta, n_tiles)
    args = (np.uint64(a_codes.data_ptr()), np.uint64(a_scales.data_ptr()), np.int32(m), np.int64(a_codes.stride(0)),
            np.int64(a_scales.stride(0)), np.uint64(qweight.data_ptr()), np.uint64(qparams.data_ptr()),
            np.uint64(cs.data_ptr()), np.int32(n), np.int32(qweight.shape[1] * qweight.element_size()),
            np.int32(hpg), np.int32(group_shift(int(meta["group_size"]), hpg)), np.int32(qparams.shape[0]),
            np.uint64(out.data_ptr()), np.int64(out.stride(0)), np.int32(n_tiles), np.int32(per))
    grid = (-(-n // rows) * split, -(-m // tokens))
    launch(fn, pdl, dev, torch.cuda.current_stream(a_codes.device).cuda_stream, grid, (128 * rows // 64,), args,
           shared)
    return out


__all__ = ["lqq_cluster_matmul", "lqq_cluster_problem"]
