"""Int8 tensor-core Triton kernels over A8 activations: W8A8 (``w8``), MixLLM W4A8 (``w4a16`` asymmetric 4-bit
weights), LiquidQuant W4A8 (``w4a8-lqq``), and a one-launch mixed-precision W4.4A8 (MixLLM Sec. 3.4).

One tile body serves all three weight kinds; a program owns BN weight rows × BM tokens and walks K in 256-column
tiles, each two 128-column halves:

* weights → int8 operand in registers: ``w8`` loads its int8 bytes as they are; the 4-bit layouts dequantize
  the 8 planes of a tile with :func:`quantkit.runtime.kernels.triton.dequant.planes_i8` — (q·s + a) XOR 0x80 with
  (s, a) = (s_u8, a) for LiquidQuant (LiquidGEMM Eq. 12) or (1, 128 - z) for MixLLM's q - z (MixLLM Sec. 3.3
  two-step dequantization, step 1);
* int8 × int8 → int32 tensor-core products (tl.dot), transposed Y^T = W·X^T (LiquidGEMM Sec. 5.4): one
  product per 128-column half wherever a per-group float scale follows (``w8``, MixLLM W4A8, LiquidQuant with
  group-wise activations), else one per 256-column tile (LiquidQuant with per-token activations), the 4-bit
  planes placed side by side (:func:`quantkit.runtime.kernels.triton.dequant.side_by_side`);
* group-tile accumulation (MixLLM Sec. 3.3, Fig. 3): each half's int32 partial sum starts at the bit pattern
  0x4b400000, so after the products ``bitcast(acc) - 12582912.0`` is its exact float value (the fast I2F,
  valid while |sum| < 2^22: 128·127·128 < 2^21), then it is scaled by weight-group × activation-group scale
  (step 2) into the fp32 accumulator;
* LiquidQuant weights and per-channel ``w8`` weights with per-token activations have no per-group float scale at
  all: one int32 accumulator spans K and the per-channel scale (s_c, the w8 row's scale) and the token scale are
  applied once in the epilogue (LiquidGEMM Sec. 4);
* the epilogue stores to ``cols[n]`` — the output column of the partition's row n — so partitions of a
  mixed-precision layer scatter into one output (MixLLM Sec. 3.4, "fused epilogue … basically costless").
"""

from __future__ import annotations

import torch
import triton.language as tl

from quantkit.formats.nibble_planes import padded_k
from quantkit.runtime.kernels.heuristic import mixed_second_bn, sms_of, triton_tile
from quantkit.runtime.kernels.jit import USE_ASM, PreparedLaunch, check_device, kernel, launch_kernel
from quantkit.runtime.kernels.triton.dequant import group_scale_f32, planes_i8, side_by_side
from quantkit.runtime.kernels.triton.launch import (TileConfig, act_groups_in_halves, groups_in_halves,
                                                    split_plan)
from quantkit.runtime.kernels.scratch import split_workspace
from quantkit.runtime.kernels.triton.splitk import store_tile

W8, ASYM4, LQQ = 0, 1, 2
MODES = {"w8": W8, "w4a16": ASYM4, "w4a8-lqq": LQQ}
_W8, _LQQ = tl.constexpr(W8), tl.constexpr(LQQ)  # the same, readable inside @jit code
I2F_BIAS_INT = tl.constexpr(0x4B400000)  # bit pattern of 12582912.0 = 1.5·2^23 (MixLLM Sec. 3.3, Fig. 4)
I2F_BIAS_FLOAT = tl.constexpr(12582912.0)
MAX_CHANNEL_SUM_K = 2**31 // 128**2  # the widest K whose int32 sum of int8 products cannot overflow


def per_channel_sum(act_group_size: int, weight_groups: int, kp: int) -> bool:
    """Whether a product of int8 codes has one scale per token (per-token activations) and one per weight row
    (``weight_groups`` 1), so its int32 sum spans the padded K ``kp`` (exact while ``kp`` ≤
    :data:`MAX_CHANNEL_SUM_K`) and is scaled once: the condition both int8 kernels share, so they keep the same bits."""
    return act_group_size == -1 and weight_groups == 1 and kp <= MAX_CHANNEL_SUM_K


@kernel
def _load_act(a_ptr, rm_in, stride_am, K, k0, WIDTH: tl.constexpr, EVEN_K: tl.constexpr):
    """Activation codes [WIDTH, BM] of columns k0 .. k0 + WIDTH - 1 (zero past K) of tokens ``rm_in``."""
    k = k0 + tl.arange(0, WIDTH)
    ptrs = a_ptr + rm_in[None, :] * stride_am + k[:, None]
    if EVEN_K:
        return tl.load(ptrs)
    return tl.load(ptrs, mask=(k < K)[:, None], other=0)


@kernel
def _half_dot(a_ptr, rm_in, stride_am, K, t, h: tl.constexpr, w_lo, w_hi, planes, part, MODE: tl.constexpr,
              EVEN_K: tl.constexpr):
    """``part`` + the int8 × int8 → int32 products of half h (128 columns) of tile t: one tensor-core product
    per half (the 4-bit planes side by side, :func:`quantkit.runtime.kernels.triton.dequant.side_by_side`)."""
    a = _load_act(a_ptr, rm_in, stride_am, K, t * 256 + h * 128, 128, EVEN_K)
    if MODE == _W8:
        if h == 0:
            part = tl.dot(w_lo, a, part, out_dtype=tl.int32)
        else:
            part = tl.dot(w_hi, a, part, out_dtype=tl.int32)
    else:
        part = tl.dot(side_by_side(planes, 4 * h, 4), a, part, out_dtype=tl.int32)
    return part


@kernel
def _half_epilogue(acc, part, sa_ptr, rm_in, stride_sm, act_hpg, act_groups, half, p, MODE: tl.constexpr):
    """acc + float(part) · weight scale · activation scale of one half-tile (MixLLM Sec. 3.3 step 2; ``part``
    started at 0x4b400000, so its float value is bitcast - 1.5·2^23, the fast I2F)."""
    f = part.to(tl.float32, bitcast=True) - I2F_BIAS_FLOAT
    ga = tl.minimum(half // act_hpg, act_groups - 1)
    sa = tl.load(sa_ptr + rm_in * stride_sm + ga)
    if MODE == _LQQ:
        acc += f * sa[None, :]
    else:
        acc += f * (group_scale_f32(p, MODE == _W8)[:, None] * sa[None, :])
    return acc


@kernel
def _int8_tile(a_ptr, sa_ptr, w_ptr, p_ptr, cs_ptr, cols_ptr, out_ptr, ws_ptr, ticket_ptr, pid_n, pid_m, pid_k,
               M, N, K, stride_am, stride_sm, act_hpg, act_groups, w_row, n_tiles, tiles_per_split, hpg, groups,
               stride_om, stride_wm, MODE: tl.constexpr, HALF_EPI: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
               SPLIT_K: tl.constexpr, SCATTER: tl.constexpr, EVEN_K: tl.constexpr,
               USE_ASM: tl.constexpr):
    """One [BN, BM] output tile (module docstring). p: the layout's per-group words — float32 scales (w8),
    fp16 scale | zero << 16 (w4a16), s_u8 | a << 8 (LiquidQuant); cs: LiquidQuant channel scales; hpg/act_hpg:
    weight/activation group size in 128-column halves, groups/act_groups their counts (group indices are
    clamped: a half-tile past K has no group of its own, and its zero activations make any finite scale
    harmless)."""
    rn = pid_n * BN + tl.arange(0, BN)
    rm = pid_m * BM + tl.arange(0, BM)
    # rows past N / tokens past M read row N-1 / tokens from the start again (never stored): no masks in the main
    # loop. (Clamped to M - 1, every program of a ragged last token tile read that one row many times over, the
    # same lines from all SMs: 0.88-1.49x the wrapped time for this kernel, up to 4x for the Gluon one; BENCHMARKS.)
    rn_in = tl.minimum(rn, N - 1)
    rm_in = rm % M
    acc = tl.full((BN, BM), 0.0, tl.float32)
    if not HALF_EPI:
        acc_i = tl.full((BN, BM), 0, tl.int32)
    t_begin = pid_k * tiles_per_split
    t_end = tl.minimum(t_begin + tiles_per_split, n_tiles)
    for t in range(t_begin, t_end):
        g_lo = tl.minimum((2 * t) // hpg, groups - 1)
        g_hi = tl.minimum((2 * t + 1) // hpg, groups - 1)
        p_lo = tl.load(p_ptr + g_lo * N + rn_in)
        p_hi = tl.load(p_ptr + g_hi * N + rn_in)
        if MODE == _W8:
            w_rows = w_ptr + rn_in[:, None] * w_row + t * 256 + tl.arange(0, 128)[None, :]
            w_lo = tl.load(w_rows)
            w_hi = tl.load(w_rows + 128)
            planes = (w_lo,)  # unused: w8 multiplies its stored int8 directly
        else:
            w_lo = 0  # unused by the 4-bit modes
            w_hi = 0
            words = tl.load(w_ptr + rn_in[:, None] * w_row + t * 32 + tl.arange(0, 32)[None, :])
            if MODE == _LQQ:
                s_lo = (p_lo & 0xFF)[:, None]
                s_hi = (p_hi & 0xFF)[:, None]
                a_lo = ((p_lo >> 8) & 0xFF)[:, None]
                a_hi = ((p_hi >> 8) & 0xFF)[:, None]
            else:  # MixLLM q - z == ((q·1 + 128 - z) mod 256) XOR 0x80
                s_lo = tl.full((BN, 1), 1, tl.int32)
                s_hi = s_lo
                a_lo = 128 - ((p_lo >> 16) & 0xFF)[:, None]
                a_hi = 128 - ((p_hi >> 16) & 0xFF)[:, None]
            planes = planes_i8(words, s_lo, a_lo, s_hi, a_hi, USE_ASM)
        if HALF_EPI:
            bias = tl.full((BN, BM), I2F_BIAS_INT, tl.int32)
            # Triton waits for each half's products before its epilogue (issuing the second half first was
            # measured to compile to the same wgmma waits in Triton 3.6, so the halves run back to back)
            part = _half_dot(a_ptr, rm_in, stride_am, K, t, 0, w_lo, w_hi, planes, bias, MODE, EVEN_K)
            acc = _half_epilogue(acc, part, sa_ptr, rm_in, stride_sm, act_hpg, act_groups, 2 * t, p_lo, MODE)
            part = _half_dot(a_ptr, rm_in, stride_am, K, t, 1, w_lo, w_hi, planes, bias, MODE, EVEN_K)
            acc = _half_epilogue(acc, part, sa_ptr, rm_in, stride_sm, act_hpg, act_groups, 2 * t + 1, p_hi, MODE)
        elif MODE != _W8:  # one product over the tile's 8 planes side by side
            a = _load_act(a_ptr, rm_in, stride_am, K, t * 256, 256, EVEN_K)
            acc_i = tl.dot(side_by_side(planes, 0, 8), a, acc_i, out_dtype=tl.int32)
        else:
            acc_i = _half_dot(a_ptr, rm_in, stride_am, K, t, 0, w_lo, w_hi, planes, acc_i, MODE, EVEN_K)
            acc_i = _half_dot(a_ptr, rm_in, stride_am, K, t, 1, w_lo, w_hi, planes, acc_i, MODE, EVEN_K)
    if not HALF_EPI:
        acc = acc_i.to(tl.float32) * tl.load(sa_ptr + rm_in * stride_sm)[None, :]
    if MODE == _LQQ or (MODE == _W8 and not HALF_EPI):  # the per-channel scale: LiquidQuant's s_c, a w8 row's
        acc = acc * tl.load(cs_ptr + rn_in).to(tl.float32)[:, None]
    if SCATTER:
        cols = tl.load(cols_ptr + rn_in)
    else:
        cols = rn
    n_ok = rn < N
    m_ok = rm < M
    mask = m_ok[None, :] & n_ok[:, None]
    store_tile(out_ptr, out_ptr + rm[None, :] * stride_om + cols[:, None],
               ws_ptr + rm[None, :] * stride_wm + rn[:, None], acc, mask,
               ticket_ptr + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0), pid_k, M * stride_wm, SPLIT_K)


@kernel
def _int8_kernel(a_ptr, sa_ptr, w_ptr, p_ptr, cs_ptr, cols_ptr, out_ptr, ws_ptr, ticket_ptr, M, N, K, stride_am,
                 stride_sm,
                 act_hpg, act_groups, w_row, n_tiles, tiles_per_split, hpg, groups, stride_om, stride_wm,
                 MODE: tl.constexpr, HALF_EPI: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                 SPLIT_K: tl.constexpr, SCATTER: tl.constexpr, EVEN_K: tl.constexpr, USE_ASM: tl.constexpr):
    _int8_tile(a_ptr, sa_ptr, w_ptr, p_ptr, cs_ptr, cols_ptr, out_ptr, ws_ptr, ticket_ptr, tl.program_id(0),
               tl.program_id(1),
               tl.program_id(2), M, N, K, stride_am, stride_sm, act_hpg, act_groups, w_row, n_tiles, tiles_per_split,
               hpg, groups, stride_om, stride_wm, MODE, HALF_EPI, BN, BM, SPLIT_K, SCATTER, EVEN_K, USE_ASM)


@kernel
def _int8_mixed_kernel(a_ptr, sa_ptr, M, K, stride_am, stride_sm, act_hpg, act_groups, n_tiles, tiles_per_split,
                       stride_om, stride_wm, out_ptr, ws_ptr, ticket_ptr, tiles_a,
                       w_a, p_a, cs_a, cols_a, N_a, w_row_a, hpg_a, groups_a,
                       w_b, p_b, cs_b, cols_b, N_b, w_row_b, hpg_b, groups_b,
                       MODE_A: tl.constexpr, HALF_EPI_A: tl.constexpr, MODE_B: tl.constexpr,
                       HALF_EPI_B: tl.constexpr, BN: tl.constexpr, BN_B: tl.constexpr, BM: tl.constexpr,
                       SPLIT_K: tl.constexpr,
                       EVEN_K: tl.constexpr, USE_ASM: tl.constexpr):
    pid_n = tl.program_id(0)
    if pid_n < tiles_a:
        _int8_tile(a_ptr, sa_ptr, w_a, p_a, cs_a, cols_a, out_ptr, ws_ptr, ticket_ptr, pid_n, tl.program_id(1),
                   tl.program_id(2),
                   M, N_a, K, stride_am, stride_sm, act_hpg, act_groups, w_row_a, n_tiles, tiles_per_split, hpg_a,
                   groups_a, stride_om, stride_wm, MODE_A, HALF_EPI_A, BN, BM, SPLIT_K, True, EVEN_K, USE_ASM)
    else:
        # split-K partial sums of partition B sit after A's in the workspace, each program's rows contiguous
        # there (as in a single-partition launch); only the last program of a tile scatters it to its columns
        _int8_tile(a_ptr, sa_ptr, w_b, p_b, cs_b, cols_b, out_ptr, ws_ptr + N_a, ticket_ptr, pid_n - tiles_a,
                   tl.program_id(1),
                   tl.program_id(2), M, N_b, K, stride_am, stride_sm, act_hpg, act_groups, w_row_b, n_tiles,
                   tiles_per_split, hpg_b, groups_b, stride_om, stride_wm, MODE_B, HALF_EPI_B, BN_B, BM, SPLIT_K, True,
                   EVEN_K,
                   USE_ASM)


def check_layout(layout: str) -> None:
    """A ValueError unless an int8 kernel reads weights of ``layout``."""
    if layout not in MODES:
        raise ValueError(f"no int8 kernel reads layout '{layout}' (known: {sorted(MODES)})")


def _weight_args(layout: str, tensors: dict, meta: dict, n_tiles: int, act_group_size: int) -> dict:
    """Kernel arguments of one weight: pointers, row stride, group size in halves, mode, epilogue kind."""
    check_layout(layout)
    mode = MODES[layout]
    w = tensors["qweight"]
    params = tensors["scales"] if mode == W8 else tensors["qparams"]
    cs = tensors["channel_scales"] if mode == LQQ else params
    return {"w": w, "p": params, "cs": cs, "n": int(meta["out_features"]), "w_row": w.shape[1],
            "hpg": groups_in_halves(meta, n_tiles), "groups": int(meta["num_groups"]), "mode": mode,
            "half_epi": not ((mode == LQQ and act_group_size == -1)
                             or (mode == W8 and per_channel_sum(act_group_size, params.shape[0], n_tiles * 256)))}


def check_act(a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, k: int) -> None:
    if a_codes.dtype != torch.int8 or a_codes.dim() != 2 or a_codes.shape[1] != k or a_codes.stride(1) != 1:
        raise ValueError(f"activation codes must be int8 [M, {k}] with unit column stride, got "
                         f"{a_codes.dtype} {tuple(a_codes.shape)}")
    if act_group_size != -1 and (act_group_size <= 0 or act_group_size % 128):
        raise ValueError(f"the int8 kernels need activation groups of a multiple of 128 or -1, got {act_group_size}")
    if a_scales.dtype != torch.float32 or a_scales.shape[0] != a_codes.shape[0]:
        raise ValueError(f"activation scales must be float32 [M, G], got {a_scales.dtype} {tuple(a_scales.shape)}")


def triton_int8_matmul(a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, layout: str,
                       tensors: dict, meta: dict, out_dtype: torch.dtype = torch.float16,
                       config: TileConfig | None = None, out: torch.Tensor | None = None,
                       use_asm: bool | None = None) -> torch.Tensor:
    """Y [M, N] (``out_dtype``) = dequant(A)·Ŵᵀ on the Triton kernel (module docstring) for int8 activation codes
    [M, K] with float32 scales [M, G] and a ``w8``, ``w4a16`` (MixLLM W4A8) or ``w4a8-lqq`` weight; ``config`` the
    tile (default :func:`.heuristic.triton_tile`), ``out`` an optional [M, N] result, ``use_asm`` False forces the
    plain-Triton dequantization. Reference: :func:`quantkit.runtime.kernels.reference.int8_reference`."""
    if out is None:
        out = torch.empty(a_codes.shape[0], int(meta["out_features"]), dtype=out_dtype, device=a_codes.device)
    fn, grid, *args, kwargs = _launch(a_codes, a_scales, act_group_size, layout, tensors, meta, config, out, use_asm)
    launch_kernel(fn, grid, *args, **kwargs)
    return out


def _launch(a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, layout: str, tensors: dict,
            meta: dict, config: TileConfig | None, out: torch.Tensor, use_asm: bool | None) -> tuple:
    """(kernel, grid, *arguments, {constexprs and options}) of :func:`triton_int8_matmul`'s launch, the codes at
    argument 0, the scales at 1 and out at 6 (:data:`BoundTritonInt8.SLOTS`)."""
    k = int(meta["in_features"])
    check_act(a_codes, a_scales, act_group_size, k)
    m = a_codes.shape[0]
    n_tiles = padded_k(k) // 256
    wa = _weight_args(layout, tensors, meta, n_tiles, act_group_size)
    check_device(a_codes, a_scales, wa["w"], wa["p"], wa["cs"])
    cfg = config or triton_tile(m, wa["n"], k, sms_of(a_codes.device))
    tiles_per_split, split = split_plan(n_tiles, cfg.split_k)
    grid = (-(-wa["n"] // cfg.bn), -(-m // cfg.bm), split)
    # split-K slots hold [M, N] partial sums with rows N apart, whatever out's row stride (a [1, N] out may
    # report stride 1)
    ws, tickets = split_workspace(a_codes.device, m * wa["n"], split, grid[0] * grid[1])
    return (_int8_kernel, grid, a_codes, a_scales, wa["w"], wa["p"], wa["cs"], wa["w"], out, ws, tickets, m,
            wa["n"], k, a_codes.stride(0), a_scales.stride(0), act_groups_in_halves(act_group_size, k),
            a_scales.shape[1], wa["w_row"], n_tiles, tiles_per_split, wa["hpg"], wa["groups"], out.stride(0),
            wa["n"], dict(MODE=wa["mode"], HALF_EPI=wa["half_epi"], BN=cfg.bn, BM=cfg.bm, SPLIT_K=split,
                          SCATTER=False, EVEN_K=k % 256 == 0, USE_ASM=USE_ASM if use_asm is None else use_asm,
                          num_warps=cfg.num_warps, num_stages=cfg.num_stages))


class BoundTritonInt8:
    """:func:`triton_int8_matmul` (or :func:`triton_mixed_int8_matmul`) of one layer at one token count, with its
    launch prepared once (:class:`~quantkit.runtime.kernels.jit.PreparedLaunch`): a call checks the codes and scales
    against the first call's shape, strides and dtype, allocates the output and launches; a call that differs, or
    one the prepared launch turns down, returns None (the caller then runs the unprepared entry)."""

    SLOTS = (0, 1, 6)  # the codes', the scales' and the output's positions in the kernel's arguments
    MIXED_SLOTS = (0, 1, 12)  # the same in the one-launch mixed kernel's

    def __init__(self, prepared: PreparedLaunch, a_codes: torch.Tensor, a_scales: torch.Tensor, n: int,
                 out_dtype: torch.dtype):
        self.prepared, self.n, self.out_dtype, self.device = prepared, n, out_dtype, a_codes.device
        self.codes = (a_codes.shape, a_codes.stride(), a_codes.dtype)
        self.scales = (a_scales.shape, a_scales.stride(), a_scales.dtype)

    @classmethod
    def create(cls, a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, layout: str,
               tensors: dict, meta: dict, out_dtype: torch.dtype, config: TileConfig | None = None
               ) -> BoundTritonInt8 | None:
        """The bound launch for activations like these with the tile ``config`` (default: the launch rule's), or
        None where launches cannot be prepared here (the interpreter, an old Triton)."""
        n = int(meta["out_features"])
        out = torch.empty(a_codes.shape[0], n, dtype=out_dtype, device=a_codes.device)
        fn, grid, *args, kwargs = _launch(a_codes, a_scales, act_group_size, layout, tensors, meta, config, out,
                                          None)
        prepared = PreparedLaunch.create(fn, grid, tuple(args), kwargs, cls.SLOTS)
        return None if prepared is None else cls(prepared, a_codes, a_scales, n, out_dtype)

    @classmethod
    def create_mixed(cls, a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, parts: list,
                     out_features: int, out_dtype: torch.dtype, config: TileConfig | None = None,
                     bn_b: int | None = None) -> BoundTritonInt8 | None:
        """The bound one-launch mixed kernel for activations like these (:func:`triton_mixed_int8_matmul`), or
        None where launches cannot be prepared here."""
        out = torch.empty(a_codes.shape[0], out_features, dtype=out_dtype, device=a_codes.device)
        fn, grid, *args, kwargs = _mixed_launch(a_codes, a_scales, act_group_size, parts, out_features, config, out,
                                                bn_b)
        prepared = PreparedLaunch.create(fn, grid, tuple(args), kwargs, cls.MIXED_SLOTS)
        return None if prepared is None else cls(prepared, a_codes, a_scales, out_features, out_dtype)

    def __call__(self, a_codes: torch.Tensor, a_scales: torch.Tensor) -> torch.Tensor | None:
        if ((a_codes.shape, a_codes.stride(), a_codes.dtype) != self.codes
                or (a_scales.shape, a_scales.stride(), a_scales.dtype) != self.scales):
            return None
        out = torch.empty(self.codes[0][0], self.n, dtype=self.out_dtype, device=self.device)
        return out if self.prepared(a_codes, a_scales, out) else None


def triton_mixed_int8_matmul(a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, parts: list,
                             out_features: int, out_dtype: torch.dtype = torch.float16,
                             config: TileConfig | None = None, out: torch.Tensor | None = None,
                             bn_b: int | None = None) -> torch.Tensor:
    """Y [M, out_features] of a mixed-precision layer in ONE Triton launch (MixLLM Sec. 3.4): ``parts`` is two
    (layout, tensors, meta, rows) partitions — e.g. the 4-bit ``w4a16`` and 8-bit ``w8`` rows of a W4.4A8
    layer — sharing the activation codes (quantized once); programs 0..tiles_a-1 run the first partition
    (the 4-bit one, whichever order ``parts`` has), the rest the second, and each epilogue scatters into its rows
    (int32 [N_part] output indices). ``bn_b``: rows per program of the second partition (default
    :func:`.heuristic.mixed_second_bn`: half of BN for 8-bit rows at small M)."""
    out = torch.empty(a_codes.shape[0], out_features, dtype=out_dtype, device=a_codes.device) if out is None else out
    fn, grid, *args, kwargs = _mixed_launch(a_codes, a_scales, act_group_size, parts, out_features, config, out, bn_b)
    launch_kernel(fn, grid, *args, **kwargs)
    return out


def _mixed_launch(a_codes: torch.Tensor, a_scales: torch.Tensor, act_group_size: int, parts: list,
                  out_features: int, config: TileConfig | None, out: torch.Tensor, bn_b: int | None) -> tuple:
    """(kernel, grid, *arguments, {constexprs and options}) of :func:`triton_mixed_int8_matmul`'s launch, the codes
    at argument 0, the scales at 1 and out at 12 (:data:`BoundTritonInt8.MIXED_SLOTS`)."""
    if len(parts) != 2:
        raise ValueError(f"the one-launch mixed kernel takes 2 partitions, got {len(parts)}")
    k = int(parts[0][2]["in_features"])
    check_act(a_codes, a_scales, act_group_size, k)
    m = a_codes.shape[0]
    n_tiles = padded_k(k) // 256
    args = []
    for layout, tensors, meta, rows in parts:
        if int(meta["in_features"]) != k:
            raise ValueError("partitions of one layer must share in_features")
        wa = _weight_args(layout, tensors, meta, n_tiles, act_group_size)
        wa["cols"] = rows.to(torch.int32).contiguous()
        check_device(a_codes, a_scales, wa["w"], wa["p"], wa["cs"], wa["cols"])
        args.append(wa)
    if args[0]["n"] + args[1]["n"] != out_features:
        raise ValueError(f"the partitions have {args[0]['n']} + {args[1]['n']} rows, the layer {out_features}")
    if args[0]["mode"] == W8 and args[1]["mode"] != W8:
        args.reverse()  # the wider 8-bit rows go second, where their programs may get fewer rows (bn_b)
    a, b = args
    cfg = config or triton_tile(m, a["n"] + b["n"], k, sms_of(a_codes.device))
    tiles_per_split, split = split_plan(n_tiles, cfg.split_k)
    # the second partition's programs get fewer rows when it has more bytes per row (MixLLM's 8-bit rows next to
    # 4-bit ones): per-program work stays balanced instead of the 8-bit programs finishing last
    bn_b = mixed_second_bn(cfg, b["mode"] == W8 and a["mode"] != W8, m) if bn_b is None else bn_b
    tiles_a = -(-a["n"] // cfg.bn)
    grid = (tiles_a + -(-b["n"] // bn_b), -(-m // cfg.bm), split)
    # split-K slots: [M, out_features] partial sums, partition B's after A's in each row
    ws, tickets = split_workspace(a_codes.device, m * out_features, split, grid[0] * grid[1])
    return (_int8_mixed_kernel, grid, a_codes, a_scales, m, k, a_codes.stride(0), a_scales.stride(0),
            act_groups_in_halves(act_group_size, k), a_scales.shape[1], n_tiles, tiles_per_split, out.stride(0),
            out_features, out, ws, tickets, tiles_a, a["w"], a["p"], a["cs"], a["cols"], a["n"], a["w_row"],
            a["hpg"], a["groups"], b["w"], b["p"], b["cs"], b["cols"], b["n"], b["w_row"], b["hpg"], b["groups"],
            dict(MODE_A=a["mode"], HALF_EPI_A=a["half_epi"], MODE_B=b["mode"], HALF_EPI_B=b["half_epi"], BN=cfg.bn,
                 BN_B=bn_b, BM=cfg.bm, SPLIT_K=split, EVEN_K=k % 256 == 0, USE_ASM=USE_ASM,
                 num_warps=cfg.num_warps, num_stages=cfg.num_stages))
