"""W8A8 / MixLLM W4A8 / LiquidQuant W4A8 / mixed W4.4A8 decode GEMV in CUDA C++ (NVRTC via CuPy) over int8
activation codes.

The decode counterpart (M <= 16 tokens, 8 or 16 per launch column) of the Triton kernels in
:mod:`quantkit.runtime.kernels.triton.int8_gemm`, built like the W4A16 GEMV of :mod:`quantkit.runtime.kernels.cuda.gemv`
(a block owns 16 weight rows, its warps split K by 256-column tiles, one tile loaded ahead in registers, partial sums
added through shared memory) but on the int8 tensor cores, ``mma.sync.m16n8k32``:

* ``w8`` rows (MixLLM sym-8 g128): the int8 bytes are the A operand as they are. Lane (g, c) loads 16 bytes at
  column 64j + 16c of rows g and g + 8 and the activation codes of token g at the same columns, so the two mmas
  of a 64-column chunk pair A and B over the same columns in the same register order;
* ``w4a16`` rows (MixLLM asym-4 g128, the W4A16 layout): byte b of the four words a lane holds (columns
  4c … 4c + 3 of a plane's 16-column chunk) is gathered into one register (three PRMT) whose low / high nibbles
  are the codes q of planes b / b + 4 — the unsigned A operand of an ``u8 × s8`` mma. The zero point is taken out
  per group after the products: Σ (q − z)·a = Σ q·a − z·Σ a, with Σ a from an mma of all-ones A over the same B
  (exact integers throughout, MixLLM Sec. 3.3 two-step dequantization: integer sums first);
* ``w4a8-lqq`` rows (LiquidQuant, the same tile-planar words): the gathered codes of four columns become four
  int8 lanes at once as ((q·s_u8 + a) mod 256) XOR 0x80 — one IMAD and one XOR (LiquidGEMM Eq. 12, no carry
  between lanes by Eq. 11) — and the first-level per-channel scale is applied once after the last tile
  (LiquidGEMM Sec. 4);
* per 128-column half-tile the exact int32 sum is converted once and scaled by the weight group's scale and the
  token's activation-group scale (MixLLM Sec. 3.3 group-tile accumulation), as the Triton kernels do; results
  agree with :func:`quantkit.runtime.kernels.reference.int8_reference` to fp32 summation order;
* a mixed-precision layer (MixLLM Sec. 3.4) runs in ONE launch: blocks 0 … nb_first − 1 take the first
  partition's rows (the 8-bit one, so the blocks with twice the bytes start first and the 4-bit blocks fill in
  behind them), the rest the second; each writes through its partition's output-column map.

Requires K a multiple of 256 (the layouts pad K to 256; the activations must cover it), 16-byte aligned
activation rows, a GPU of compute capability >= 8.0 and CuPy: :func:`a8_gemv_problem` says what is missing,
and :func:`quantkit.runtime.kernels.triton.int8_gemm.int8_matmul` / ``mixed_int8_matmul`` then run Triton.
"""

from __future__ import annotations

import torch

from quantkit.runtime.kernels.cuda.common import (BoundLaunch, cuda_source, compile_problem, cxx_bool, device_index,
                                                    device_problem, group_shift, launch, launch_form)
from quantkit.runtime.kernels.cuda.gemv import TOKENS_PER_COLUMN
from quantkit.runtime.kernels.triton.launch import act_groups_in_halves, groups_in_halves

W8_MODE, ASYM4_MODE, LQQ_MODE = 0, 1, 2
MODES = {"w8": W8_MODE, "w4a16": ASYM4_MODE, "w4a8-lqq": LQQ_MODE}
A8_GEMV_MAX_M = 16  # two 8-token launch columns

# the int8 mma and the byte gather of tile-planar words, shared with :mod:`quantkit.runtime.kernels.cuda.lqq_cluster`

SOURCE = cuda_source("prelude.cuh", "imma.cuh", "gemv_a8.cu")

def a8_kernel_name(warps: int, bf16: bool, mode_a: int, mode_b: int, token_sets: int = 1,
                   wait_after_two: bool = False) -> str:
    """The template instance of SOURCE for these warps, output dtype, partition modes, sets of 8 tokens per
    launch column (1 or 2) and place of the wait for the previous grid (after two weight tiles, or one)."""
    return f"a8_gemv<{warps}, {cxx_bool(bf16)}, {mode_a}, {mode_b}, {token_sets}, {cxx_bool(wait_after_two)}>"


def _group_problem(what: str, group_size: int) -> str | None:
    if group_size != -1 and (group_size <= 0 or group_size % 128):
        return f"{what} group size {group_size} is neither -1 nor a multiple of 128"
    return None


def a8_gemv_problem(a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, parts: list,
                    out_dtype: torch.dtype, out: torch.Tensor | None = None) -> str | None:
    """Why :func:`a8_gemv_cuda` cannot run these arguments (None: it can): M in 1..16, one or two partitions of
    layout ``w8`` / ``w4a16`` / ``w4a8-lqq`` whose in_features all equal the codes' K, a multiple of 256, weight
    and activation groups of -1 or a multiple of 128, int8 codes with 16-byte aligned rows, float32 scales with
    unit column stride, an fp16/bf16 output (``out``, if given, of that dtype with unit column stride), contiguous
    16-byte aligned weight tensors (LiquidQuant channel scales fp16) and int32 row maps, everything on the codes'
    CUDA device of compute capability >= 8.0, and CuPy whose NVRTC compiles the kernel instance that would run.
    Cheap checks first (testable on a CPU)."""
    m = a_codes.shape[0] if a_codes.dim() == 2 else 0
    if not 1 <= m <= A8_GEMV_MAX_M:
        return f"M = {m} is outside 1..{A8_GEMV_MAX_M}"
    if len(parts) not in (1, 2):
        return f"{len(parts)} partitions (the A8 GEMV takes 1 or 2)"
    bad = [p[0] for p in parts if p[0] not in MODES]
    if bad:
        return f"no CUDA A8 GEMV for layout {bad[0]}"
    k = a_codes.shape[1]
    if k % 256 or any(int(p[2]["in_features"]) != k for p in parts):
        return f"K = {k} is not a multiple of 256 or not every partition's in_features"
    problem = _group_problem("activation", act_group_size) or next(
        (q for q in (_group_problem("weight", int(p[2]["group_size"])) for p in parts) if q), None)
    if problem:
        return problem
    if out_dtype not in (torch.float16, torch.bfloat16):
        return f"output dtype {out_dtype} is not fp16/bf16"
    if a_codes.dtype != torch.int8 or a_codes.stride(1) != 1 or a_codes.data_ptr() % 16 or a_codes.stride(0) % 16:
        return "activation codes are not int8 rows, 16-byte aligned, with unit column stride"
    if a_scales.dtype != torch.float32 or a_scales.stride(1) != 1:
        return "activation scales are not float32 with unit column stride"
    if out is not None and (out.dtype != out_dtype or out.stride(1) != 1):
        return "out must have the output dtype and unit column stride"
    tensors = [v for p in parts for v in p[1].values()]
    if any(p[1]["channel_scales"].dtype != torch.float16 for p in parts if p[0] == "w4a8-lqq"):
        return "LiquidQuant channel scales are not fp16"
    if not all(v.is_contiguous() and v.data_ptr() % 16 == 0 for v in tensors):
        return "packed tensors are not contiguous and 16-byte aligned"
    rows = [p[3] for p in parts if p[3] is not None]
    if not all(r.dtype == torch.int32 and r.is_contiguous() for r in rows):
        return "partition row maps are not contiguous int32"
    problem = device_problem(a_codes, tensors + rows + [a_scales] + ([out] if out is not None else []), (8, 0),
                             "the GPU is older than compute capability 8.0")
    if problem:
        return problem
    return compile_problem(device_index(a_codes), SOURCE, (_instance(parts, m, out_dtype)[0],), "CUDA A8 GEMV")


def _instance(parts: list, m: int, out_dtype: torch.dtype, warps: int | None = None,
              token_sets: int | None = None, wait_after_two: bool | None = None) -> tuple[str, int, int]:
    """(kernel instance name, warps, token sets) :func:`a8_gemv_cuda` runs for these partitions."""
    modes = sorted(MODES[p[0]] for p in parts)
    modes = modes + modes if len(modes) == 1 else modes
    n_total = sum(int(p[2]["out_features"]) for p in parts)
    k = int(parts[0][2]["in_features"])
    warps = warps or a8_warps(n_total, m)
    token_sets = token_sets or a8_token_sets(n_total, m)
    if wait_after_two is None:
        wait_after_two = a8_wait_after_two(n_total, k, m)
    name = a8_kernel_name(warps, out_dtype == torch.bfloat16, modes[0], modes[1], token_sets, wait_after_two)
    return name, warps, token_sets


def a8_warps(n: int, m: int = 1) -> int:
    """Warps per block (they split K) for a layer of N output rows and M tokens. M <= 8: 8 up to N = 4096, 4 up
    to 8192, 2 up to 16384, else 4 — the fastest of 2/4/8 on an H100 at M = 1 for the five Llama-3.1-8B shapes,
    within 5 % at M = 2-8 but for one point; M = 9-16: 4 (with :func:`a8_token_sets`)."""
    if m > TOKENS_PER_COLUMN:
        return 4
    if n <= 4096:
        return 8
    return 4 if n <= 8192 or n > 16384 else 2


def a8_wait_after_two(n: int, k: int, m: int) -> bool:
    """Whether the A8 GEMV waits for the previous grid after two weight tiles per warp are in flight rather than
    one: at M <= 8 on every layer. On an H100 at the rule's warps: LiquidQuant W4A8 and mixed W4.4A8 1.02-1.26×
    faster at 44 of 48 points (8 shapes × M = 1, 4, 8), 0.96-1.00× at the rest; W8A8 and MixLLM W4A8 1.00-1.10× at
    all 24 points. Unlike the W4A16 GEMV (:func:`quantkit.runtime.kernels.cuda.gemv.wait_after_two`) also on the
    layers of 14336-24576 rows and 14336 columns (0.99-1.09×, 1.02 or more at 17 of 18 LiquidQuant / mixed points).
    Above M = 8 (16-token columns) not measured."""
    return m <= TOKENS_PER_COLUMN


def a8_token_sets(n: int, m: int) -> int:
    """8-token sets per launch column: 1 up to M = 8; above, 2 (every weight fragment shared by 16 tokens) for
    N > 4096 — on 4096-row layers one set per column is as fast."""
    return 2 if m > TOKENS_PER_COLUMN and n > 4096 else 1


def a8_gemv_preferred(m: int, n: int, k: int, mixed: bool = False, layouts: tuple = ()) -> bool:
    """Whether the CUDA A8 GEMV beats the Triton int8 kernels for M tokens on an [N, K] layer of partition
    ``layouts`` (``mixed``: two partitions), measured on an H100 against the Triton kernels with per-split split-K
    slots: at M <= 4 always — LiquidQuant on layers wider than 8192 too, where programmatic dependent launch gives the
    GEMV its lead (14336×4096 M = 1 14.8 vs 18.1 µs, M = 2-4 a tie; 28672×4096 M = 1-4 25.6-27.4 vs 28.8-29.9; at
    M = 8 the Triton kernel wins by 1.11-1.13×); at M = 5-8 for 8-bit weights everywhere (28672×4096 M = 8: 44.1 vs
    50.2 µs), mixed layers up to N = 16384 (14336×4096: 19.4 vs 22.6), 4-bit ones up to N = 8192 (14336×4096 W4A8:
    Triton 18.6 vs 18.8) and LiquidQuant only up to K = 8192 too (4096×14336: Triton 16.8 vs 18.4); at M = 9-16 only
    for 8-bit weights up to N = 8192 (6144×4096 M = 16: 13.4 vs 18.0 µs) — the 4-bit and mixed layers run Triton
    there (4096×14336 mixed M = 16: 22.2 vs 28.9 µs).
    """
    if not 1 <= m <= A8_GEMV_MAX_M:
        return False
    eight_only = bool(layouts) and all(layout == "w8" for layout in layouts)
    if m > 8:
        return eight_only and n <= 8192
    if "w4a8-lqq" in layouts:
        return m <= 4 or (n <= 8192 and k <= 8192)
    if m <= 4 or eight_only:
        return True
    return n <= (16384 if mixed else 8192)


def _part_args(layout: str, tensors: dict, meta: dict, rows: torch.Tensor | None, n_tiles: int) -> list:
    import numpy as np

    mode = MODES[layout]
    w = tensors["qweight"]
    params = tensors["scales"] if mode == W8_MODE else tensors["qparams"]
    hpg = groups_in_halves(meta, n_tiles)
    shift = group_shift(int(meta["group_size"]), hpg)
    cols = 0 if rows is None else rows.data_ptr()
    cs = tensors["channel_scales"].data_ptr() if mode == LQQ_MODE else 0
    return [np.uint64(w.data_ptr()), np.uint64(params.data_ptr()), np.uint64(cs), np.uint64(cols),
            np.int32(int(meta["out_features"])), np.int32(w.shape[1] * w.element_size()), np.int32(hpg),
            np.int32(shift), np.int32(params.shape[0])]


def a8_gemv_cuda(a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, parts: list,
                 out_features: int, out_dtype: torch.dtype = torch.float16, out: torch.Tensor | None = None,
                 warps: int | None = None, token_sets: int | None = None,
                 wait_after_two: bool | None = None) -> torch.Tensor:
    """Y [M, out_features] = dequant(A)·Ŵᵀ for int8 activation codes [M, K] with float32 scales [M, Ga]
    and one or two partitions ``parts`` = [(layout, tensors, meta, rows or None)] of ``w8`` / ``w4a16`` /
    ``w4a8-lqq`` weights (rows: int32 output column of each partition row; None: row i → column i). One launch; an
    8-bit partition runs first (module docstring). ``warps`` (default :func:`a8_warps`) and ``token_sets``, 8-token
    sets per launch column sharing every weight fragment, 1 or 2 (default :func:`a8_token_sets`), ``wait_after_two``
    (default :func:`a8_wait_after_two`). ValueError when :func:`a8_gemv_problem` finds a problem other than the
    device ones, which the caller checks."""
    out = torch.empty(a_codes.shape[0], out_features, dtype=out_dtype, device=a_codes.device) if out is None else out
    fn, pdl, dev, grid, block, args = _launch_args(a_codes, a_scales, act_group_size, parts, out_dtype, out, warps,
                                                   token_sets, wait_after_two)
    launch(fn, pdl, dev, torch.cuda.current_stream(a_codes.device).cuda_stream, grid, block, args)
    return out


def _launch_args(a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, parts: list,
                 out_dtype: torch.dtype, out: torch.Tensor, warps: int | None = None, token_sets: int | None = None,
                 wait_after_two: bool | None = None) -> tuple:
    """(function, pdl, device index, grid, block, arguments) of :func:`a8_gemv_cuda`'s launch."""
    import numpy as np

    m, k = a_codes.shape
    for what, gs in [("activation", act_group_size)] + [("weight", int(p[2]["group_size"])) for p in parts]:
        problem = _group_problem(what, gs)
        if problem:
            raise ValueError(problem)
    if len(parts) not in (1, 2):
        raise ValueError(f"the A8 GEMV takes 1 or 2 partitions, got {len(parts)}")
    if k % 256 or any(int(p[2]["in_features"]) != k for p in parts):
        raise ValueError(f"activation codes [M, {k}] must have K a multiple of 256 equal to every partition's "
                         "in_features")
    if token_sets not in (None, 1, 2):
        raise ValueError(f"token_sets must be 1 or 2, got {token_sets}")
    n_tiles = k // 256
    parts = sorted(parts, key=lambda p: MODES[p[0]])  # w8 (mode 0) first: its blocks carry twice the bytes
    name, warps, token_sets = _instance(parts, m, out_dtype, warps, token_sets, wait_after_two)
    args_parts = [_part_args(lay, t, meta, r, n_tiles) for lay, t, meta, r in parts]
    if len(parts) == 1:
        args_parts.append(args_parts[0])
    nb = [-(-int(meta["out_features"]) // 16) for _, _, meta, _ in parts]
    a_hpg = act_groups_in_halves(act_group_size, k)
    a_shift = group_shift(act_group_size, a_hpg)
    dev = device_index(a_codes)
    fn, pdl = launch_form(dev, SOURCE, name)
    grid = (sum(nb), -(-m // (TOKENS_PER_COLUMN * token_sets)))
    args = (np.uint64(a_codes.data_ptr()), np.uint64(a_scales.data_ptr()), np.int32(m),
            np.int64(a_codes.stride(0)), np.int64(a_scales.stride(0)), np.int32(a_hpg), np.int32(a_shift),
            np.int32(a_scales.shape[1]), np.uint64(out.data_ptr()), np.int64(out.stride(0)), np.int32(n_tiles),
            np.int32(nb[0]), *args_parts[0], *args_parts[1])
    return fn, pdl, dev, grid, (32 * warps,), args


class BoundA8Gemv:
    """:func:`a8_gemv_cuda` of one layer at one token count and output dtype, prepared once
    (:class:`~quantkit.runtime.kernels.cuda.common.BoundLaunch`): a call allocates the output, sets three pointers
    and launches. The codes and scales must have the row strides they were bound with and 16-byte aligned codes,
    and be on the current device; otherwise, or if the driver refuses the launch, the call returns None and the
    caller runs :func:`a8_gemv_cuda`."""

    POINTER_ARGS = (0, 1, 8)  # positions of the codes, scales and output pointers in the GEMV's arguments

    def __init__(self, bound: BoundLaunch, a_codes: torch.Tensor, a_scales: torch.Tensor, out_features: int,
                 out_dtype: torch.dtype):
        self.bound, self.n, self.dtype = bound, out_features, out_dtype
        self.m, self.device = a_codes.shape[0], a_codes.device
        self.strides = (a_codes.stride(0), a_scales.stride(0), a_scales.shape[1])

    @classmethod
    def create(cls, a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, parts: list,
               out_features: int, out_dtype: torch.dtype) -> BoundA8Gemv | None:
        """The bound GEMV for codes and scales shaped and strided like these (which the caller checked with
        :func:`a8_gemv_problem`), or None where a launch cannot be bound on this driver."""
        out = torch.empty(a_codes.shape[0], out_features, dtype=out_dtype, device=a_codes.device)
        bound = BoundLaunch.create(*_launch_args(a_codes, a_scales, act_group_size, parts, out_dtype, out),
                                   cls.POINTER_ARGS)
        return None if bound is None else cls(bound, a_codes, a_scales, out_features, out_dtype)

    def __call__(self, a_codes: torch.Tensor, a_scales: torch.Tensor) -> torch.Tensor | None:
        ptr = a_codes.data_ptr()
        if (a_codes.stride(0), a_scales.stride(0), a_scales.shape[1]) != self.strides or ptr % 16:
            return None
        out = torch.empty(self.m, self.n, dtype=self.dtype, device=self.device)
        return out if self.bound(ptr, a_scales.data_ptr(), out.data_ptr()) else None
