"""Shared pieces of the Gluon kernels for Hopper's wgmma (:mod:`quantkit.runtime.kernels.gluon_sm90.lqq_wgmma`,
:mod:`quantkit.runtime.kernels.gluon_sm90.lqq_ws`, :mod:`quantkit.runtime.kernels.gluon_sm90.w4a16_wgmma`,
:mod:`quantkit.runtime.kernels.gluon_sm90.w8a8_wgmma`): the import guard and the few Gluon operations whose names
changed between Triton releases, the activation-tile ring of the register-operand kernels (cp.async into
128-byte-swizzled shared memory), their output store (direct or through split-K slots as
:mod:`quantkit.runtime.kernels.triton.splitk`), and the checks every such launch needs — including a kernel that did
not compile with the installed Triton, after which the Triton kernels run instead.

Why Gluon: Triton 3.6's ``tl.dot`` waits for each int8 product whose operand sits in registers before the
program goes on (``wgmma.wait_group 0``); Gluon exposes ``warpgroup_mma(is_async=True)`` and
``warpgroup_mma_wait(num_outstanding)``, TMA, mbarriers and warp specialization (docs/BENCHMARKS.md). Overlapping a
warpgroup's own products with its next tile's dequantization is unsafe (ptxas does not keep a register A operand
alive while its product runs; :mod:`quantkit.bench.sass` checks for it): the kernels issue a tile's products
together and wait for them, and the overlap comes from other warpgroups — two per program, programs sharing an SM,
and in :mod:`quantkit.runtime.kernels.gluon_sm90.lqq_ws` a TMA producer warp.
"""

from __future__ import annotations

import warnings

import torch

try:  # Gluon (Triton >= 3.5) and its Hopper ops; absent with older Triton
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                                  warpgroup_mma_wait)
    HAVE_GLUON = True
except ImportError:  # pragma: no cover - depends on the installed Triton
    HAVE_GLUON = False

BN = 64  # weight rows per warpgroup of the register-operand kernels (wgmma's M = 64); a program has one or two
OUT_DTYPES = (torch.float16, torch.bfloat16)
_FAILED: dict[tuple, str] = {}  # (kernel name, launch config) → why it did not build here
_LAUNCHED: set[tuple] = set()  # (kernel name, launch config) that have run here
BROKEN_AFTER = 2  # failed configs, with none that ran, after which the whole kernel counts as not building here
PRODUCER_REGS = 24  # registers of a warp-specialized kernel's producer warp (setmaxnreg's minimum: a few scalars)
# setmaxnreg of the second consumer warpgroup of a two-warpgroup (or K-pair) warp-specialized launch; the first gets
# the rest (lqq_ws, w4a16_ws)
PART_REGS = 232
REGISTER_FILE = 65536  # 32-bit registers per SM (Hopper)

__all__ = ["BN", "HAVE_GLUON", "OUT_DTYPES", "PART_REGS", "PRODUCER_REGS", "config_declined", "hopper_problem",
           "kernel_broken", "launch_or_decline", "ws_maxnreg"]


def hopper_problem(a_codes: torch.Tensor, k: int, out: torch.Tensor | None, out_dtype: torch.dtype,
                   kernel: str | None, k_multiple: int = 256) -> str | None:
    """Why Gluon wgmma kernel ``kernel`` cannot run on these activations (None: it can): K a multiple of
    ``k_multiple`` (256 for the cp.async kernel's whole tiles, 16 for TMA), activations (int8 codes, or W4A16's
    fp16/bf16) with unit column stride and 16-byte aligned rows (cp.async and TMA move 16 bytes), an fp16/bf16
    output with unit column stride, Gluon, a Hopper GPU (compute capability 9.0: wgmma), and a kernel that compiled
    with this Triton. The cheap shape checks come first, so they are testable without a GPU."""
    if k % k_multiple:
        return f"K = {k} is not a multiple of {k_multiple}"
    if a_codes.stride(1) != 1 or a_codes.data_ptr() % 16 or (a_codes.stride(0) * a_codes.element_size()) % 16:
        return "activation rows are not 16-byte aligned with unit column stride"
    dtype = out.dtype if out is not None else out_dtype
    if dtype not in OUT_DTYPES or (out is not None and out.stride(1) != 1):
        return "the output must be fp16 or bf16 with unit column stride"
    if not HAVE_GLUON:
        return "this Triton has no Gluon"
    if not a_codes.is_cuda or torch.cuda.get_device_capability(a_codes.device) != (9, 0):
        return "not a Hopper (sm_90) GPU"
    broken = kernel_broken(kernel) if kernel is not None else None  # None: the caller asks each kernel itself
    if broken:
        return f"the Gluon kernel did not build with this Triton ({broken})"
    return None


def ws_maxnreg(warpgroups: int, per_sm: int) -> int:
    """``maxnreg`` of a warp-specialized launch (:mod:`quantkit.runtime.kernels.gluon_sm90.lqq_ws`,
    :mod:`quantkit.runtime.kernels.gluon_sm90.w4a16_ws`): registers a thread at launch such that ``per_sm`` programs
    of ``warpgroups`` consumer warpgroups plus the producer's (a warpgroup: registers are allocated by warpgroups) fit
    the register file; setmaxnreg then moves the producer's share above :data:`PRODUCER_REGS` to the consumers."""
    threads = 128 * (warpgroups + 1) * per_sm
    return min(256, REGISTER_FILE // threads // 8 * 8)


def kernel_broken(kernel: str) -> str | None:
    """Why Gluon kernel ``kernel`` counts as not building with the installed Triton — :data:`BROKEN_AFTER` of its
    launch configs failed to build and none has run (an operation the release renamed fails every config) — or
    None. One config failing next to configs that ran (say a shared-memory ring too large for this build) only
    declines that config (:func:`launch_or_decline`)."""
    if any(name == kernel for name, _ in _LAUNCHED):
        return None
    failed = [why for (name, _), why in _FAILED.items() if name == kernel]
    return failed[-1] if len(failed) >= BROKEN_AFTER else None


def config_declined(kernel: str, config: tuple) -> bool:
    """True when ``config`` of Gluon kernel ``kernel`` failed to build here (:func:`launch_or_decline` returns None
    for it without a try), so a caller can skip the work it would do only to launch it."""
    return (kernel, config) in _FAILED


def launch_or_decline(kernel: str, config: tuple, launch, fallback: str = "the Triton kernel"):
    """``launch()``'s result, or None when the Gluon kernel does not build with the installed Triton for this ``config``
    (Gluon is an experimental dialect whose operations change between releases): any error from the first launch of a
    config that never ran here counts as that, is remembered — that config is declined from then on without another try,
    and :func:`hopper_problem` declines the whole kernel once :func:`kernel_broken` says so — and is reported once per
    kernel as a warning naming ``fallback``, what the caller runs instead. Errors of a config that has run, and CUDA
    out-of-memory errors, are raised."""
    if (kernel, config) in _FAILED:
        return None
    try:
        y = launch()
    except Exception as e:  # noqa: BLE001 — compile errors of any stage: frontend, MLIR passes, ptxas
        if (kernel, config) in _LAUNCHED or isinstance(e, torch.cuda.OutOfMemoryError):  # memory is not a build
            raise
        msg = str(e).strip().splitlines()[-1][:200] if str(e).strip() else type(e).__name__
        first = not any(name == kernel for name, _ in _FAILED)
        _FAILED[(kernel, config)] = f"{type(e).__name__}: {msg}"
        if first:
            warnings.warn(f"quantkit: Gluon kernel {kernel} did not build for launch config {config} "
                          f"({_FAILED[(kernel, config)]}); using {fallback} there", RuntimeWarning,
                          stacklevel=2)
        return None
    _LAUNCHED.add((kernel, config))
    return y


if HAVE_GLUON:
    # the operations renamed between Triton releases (3.6: async_copy_global_to_shared / thread_barrier /
    # _reinterpret; 3.9: async_load / barrier / reinterpret), picked once here so the kernels compile with either
    if hasattr(async_copy, "async_load"):
        @gluon.jit
        def cp_async(smem, pointer, mask):
            """cp.async of ``pointer``'s elements into ``smem`` (masked lanes write zeros)."""
            async_copy.async_load(smem, pointer, mask=mask)
    else:
        @gluon.jit
        def cp_async(smem, pointer, mask):
            """cp.async of ``pointer``'s elements into ``smem`` (masked lanes write zeros)."""
            async_copy.async_copy_global_to_shared(smem, pointer, mask=mask)

    if hasattr(tma, "async_load"):
        @gluon.jit
        def tma_load(desc, coord, bar, smem):
            """TMA copy of ``desc``'s block at ``coord`` into ``smem``, completing on mbarrier ``bar``."""
            tma.async_load(desc, coord, bar, smem)
    else:
        @gluon.jit
        def tma_load(desc, coord, bar, smem):
            """TMA copy of ``desc``'s block at ``coord`` into ``smem``, completing on mbarrier ``bar``."""
            tma.async_copy_global_to_shared(desc, coord, bar, smem)

    if hasattr(gl.shared_memory_descriptor, "reinterpret"):
        @gluon.jit
        def stacked_int8_view(buf, STAGES: gl.constexpr, ROWS: gl.constexpr, layout: gl.constexpr):
            """``buf`` [2·STAGES, ROWS, 128] int8 seen as [STAGES, 2·ROWS, 128] (the same bytes, :func:`issue_x`)."""
            return buf.reinterpret(gl.int8, [STAGES, 2 * ROWS, 128], layout)
    else:
        @gluon.jit
        def stacked_int8_view(buf, STAGES: gl.constexpr, ROWS: gl.constexpr, layout: gl.constexpr):
            """``buf`` [2·STAGES, ROWS, 128] int8 seen as [STAGES, 2·ROWS, 128] (the same bytes, :func:`issue_x`)."""
            return buf._reinterpret(gl.int8, [STAGES, 2 * ROWS, 128], layout)

    if hasattr(gl, "barrier"):
        @gluon.jit
        def cta_barrier():
            """All threads of the program meet (bar.sync)."""
            gl.barrier()
    else:
        @gluon.jit
        def cta_barrier():
            """All threads of the program meet (bar.sync)."""
            gl.thread_barrier()

    @gluon.constexpr_function
    def mma_layout(BM, WG):
        """Accumulator layout of a [64·WG, BM] wgmma tile of WG warpgroups, each its own 64 rows (int8: instruction
        k 32, n <= 128)."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4 * WG, 1],
                                         instr_shape=[16, min(BM, 128), 32])

    @gluon.constexpr_function
    def a_layout(BM, WG):
        """Register layout of the int8 A operand of that tile (4 consecutive K bytes per 32-bit register)."""
        return gl.DotOperandLayout(operand_index=0, parent=mma_layout(BM, WG), k_width=4)

    @gluon.constexpr_function
    def x_layout(WG, VEC=16):
        """Activation rows of 128 bytes ([rows, 128] int8, [rows, 64] fp16) as the program's 4·WG warps' cp.async
        read them: 16 bytes, VEC elements, a thread."""
        return gl.BlockedLayout(size_per_thread=[1, VEC], threads_per_warp=[4, 8], warps_per_cta=[4 * WG, 1],
                                order=[1, 0])

    # an activation slice [BM, 128] int8 as it sits in shared memory
    X_SMEM = gl.constexpr(gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2))

    @gluon.jit
    def x_tile_ptrs(x_ptr, row0, M, stride_xm, BM: gl.constexpr, S: gl.constexpr, W: gl.constexpr,
                    layout: gl.constexpr):
        """Pointers [S·BM, W] to the first S slices of W columns (128 bytes) of activation tile 0 of token rows
        row0 … row0 + BM − 1 (rows past M wrap to the start: their products are never stored), stacked: row
        j·BM + r is slice j of token r, columns W·j … W·j + W − 1 (tile t: + 256·t). A 128-byte-swizzled
        [S·BM, W] buffer holds the same bytes as S swizzled [BM, W] ones (BM a multiple of the 8-row swizzle
        period), so one cp.async can fill the S slices that wgmma reads (:func:`issue_x`)."""
        rr = gl.arange(0, S * BM, layout=gl.SliceLayout(1, layout))
        rows = (row0 + rr % BM) % M
        c = gl.arange(0, W, layout=gl.SliceLayout(0, layout))
        return x_ptr + (rows * stride_xm + W * (rr // BM))[:, None] + c[None, :]

    @gluon.jit
    def issue_x(xs, x_ptrs, i, t_begin, t_end, STAGES: gl.constexpr, COPIES: gl.constexpr, W: gl.constexpr):
        """Start the cp.async of activation tile t_begin + i into ring slot i % STAGES, empty past t_end so that
        wait_group counts stay uniform; the caller commits the group (one per tile, which may hold several token
        tiles' copies). COPIES > 0: one copy per slice of W columns into ``xs`` [COPIES·STAGES, BM, W] from
        :func:`x_tile_ptrs` with S = 1; COPIES = 0: the whole tile in one copy into the stacked view ``xs``
        [STAGES, slices·BM, W] from x_tile_ptrs with S = slices. The compiler puts a CTA barrier before each copy;
        which is faster depends on the launch (docs/BENCHMARKS.md)."""
        # a tile is 256 columns: COPIES slices of W, or (COPIES = 0) the stacked slices of x_tile_ptrs
        gl.static_assert(COPIES == 0 or COPIES * W == 256, "issue_x: COPIES x W must cover a 256-column tile")
        s = i % STAGES
        t = t_begin + i
        ok = t < t_end
        tt = gl.where(ok, t, t_begin)
        if COPIES == 0:
            cp_async(xs.index(s), x_ptrs + tt * 256, ok)
        else:
            for j in gl.static_range(COPIES):
                cp_async(xs.index(COPIES * s + j), x_ptrs + tt * 256 + W * j, ok)

    @gluon.jit
    def ring_barriers(STAGES: gl.constexpr, CONSUMERS: gl.constexpr = 1):
        """(ready, empty): the mbarriers of a warp-specialized kernel's STAGES-slot ring — the producer's expect-tx
        arrival completes ``ready[s]`` with its TMA bytes; ``empty[s]`` completes with one arrival (after its
        products) from each of the CONSUMERS partitions that read the slot."""
        ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=CONSUMERS)
        return ready, empty

    @gluon.jit
    def weight_rows(w_ptr, pid_n, ROWS: gl.constexpr, N, w_row, layout: gl.constexpr):
        """(row indices clamped to N − 1 [ROWS], pointers [ROWS, 32] to tile 0's words) of program pid_n's ROWS
        weight rows, in ``layout`` (the A operand's: the kernels load the words straight into it)."""
        rn = pid_n * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
        rn_in = gl.minimum(rn, N - 1)
        return rn_in, w_ptr + rn_in[:, None] * w_row + gl.arange(0, 32, layout=gl.SliceLayout(0, layout))[None, :]

    @gluon.jit
    def load_words(w_ptrs, p_ptr, t, t_end, hpg, groups, N, rn_in):
        """Weight tile t's words [rows, 32] (in whatever register layout ``w_ptrs`` has: the kernels load them in
        their A operand's) and its two half-tiles' group words (the last tile again past t_end, so the loop needs
        no predicate)."""
        t = gl.minimum(t, t_end - 1)
        words = gl.load(w_ptrs + t * 32)
        p_lo = gl.load(p_ptr + gl.minimum((2 * t) // hpg, groups - 1) * N + rn_in)
        p_hi = gl.load(p_ptr + gl.minimum((2 * t + 1) // hpg, groups - 1) * N + rn_in)
        return words, p_lo, p_hi

    @gluon.jit
    def wait_x(STAGES: gl.constexpr):
        """Wait until the oldest activation tile in flight has landed for every thread and is visible to wgmma."""
        async_copy.wait_group(STAGES - 2)  # this thread's copies
        cta_barrier()  # ... and every other thread's
        fence_async_shared()  # generic-proxy writes before the async-proxy reads of wgmma

    @gluon.jit
    def _store_out(out_ptr, y, rm, rn, M, N, stride_om):
        mask = (rm < M)[None, :] & (rn < N)[:, None]
        gl.store(out_ptr + rm[None, :] * stride_om + rn[:, None], y.to(out_ptr.dtype.element_ty), mask=mask)

    @gluon.constexpr_function
    def slot_layout(ROWS):
        """A [ROWS, tokens] fp32 split-K tile as the program's 4·ROWS/64 warps load and store it: four consecutive
        weight rows (16 contiguous bytes of a slot row) a thread, a warp's 16 × 4 rows of two tokens a line each.
        The accumulator's own layout puts 4 tokens × 8 rows of 4 bytes in each warp access: there the tile's last
        program takes 1.35-1.8 µs a slot to add them, in this one 0.5-0.85 µs (H100, globaltimer stamps)."""
        return gl.BlockedLayout(size_per_thread=[4, 1], threads_per_warp=[16, 2], warps_per_cta=[ROWS // 64, 4],
                                order=[0, 1])

    @gluon.jit
    def _slot_view(rm, rn, like):
        """Token and row indices in :func:`slot_layout` for tiles shaped like ``like``."""
        L: gl.constexpr = slot_layout(like.shape[0])
        return gl.convert_layout(rm, gl.SliceLayout(0, L)), gl.convert_layout(rn, gl.SliceLayout(1, L))

    @gluon.jit
    def _store_slot_from(ws_ptr, y, rm, rn, first, M, N, pid_k):
        # tokens first … M − 1 of y into split-K slot pid_k (slots M·N apart, rows N apart)
        rm, rn = _slot_view(rm, rn, y)
        y = gl.convert_layout(y, slot_layout(y.shape[0]))
        mask = ((rm >= first) & (rm < M))[None, :] & (rn < N)[:, None]
        gl.store(ws_ptr + rm[None, :] * N + rn[:, None] + pid_k * (M * N), y, mask=mask)

    @gluon.jit
    def sum_slots(total, ws_ptrs, mask, slot, SPLIT_K: gl.constexpr):
        """``total`` (zeros) plus the SPLIT_K split-K slots ``ws_ptrs`` points into (slot 0; slots ``slot`` elements
        apart), added in split order (:mod:`quantkit.runtime.kernels.triton.splitk`'s scheme, so the sum does not
        depend on which program came last); .cg: from L2, not from a line this SM may hold from an earlier call."""
        if SPLIT_K <= 2:
            for s in gl.static_range(SPLIT_K):
                total += gl.load(ws_ptrs + s * slot, mask=mask, other=0.0, cache_modifier=".cg")
        else:  # a loop: unrolled, every slot's loads are hoisted together and spill (ptxas)
            for s in range(SPLIT_K):
                total += gl.load(ws_ptrs + s * slot, mask=mask, other=0.0, cache_modifier=".cg")
        return total

    @gluon.jit
    def _sum_slots_from(out_ptr, ws_ptr, like, rm, rn, first, M, N, stride_om, SPLIT_K: gl.constexpr):
        # like: a tile of the sum's shape (only that is used)
        rm, rn = _slot_view(rm, rn, like)
        mask = ((rm >= first) & (rm < M))[None, :] & (rn < N)[:, None]
        total = sum_slots(gl.full(like.shape, 0.0, gl.float32, slot_layout(like.shape[0])),
                          ws_ptr + rm[None, :] * N + rn[:, None], mask, M * N, SPLIT_K)
        gl.store(out_ptr + rm[None, :] * stride_om + rn[:, None], total.to(out_ptr.dtype.element_ty), mask=mask)

    @gluon.jit
    def _take_ticket(ticket_ptr, SPLIT_K: gl.constexpr):
        """After this program's slot stores: whether it is the split tile's last program (then it adds the slots
        and resets the ticket with :func:`_release_ticket`)."""
        cta_barrier()  # every warp's slot stores precede the ticket's release
        ticket = ticket_ptr + gl.program_id(1) * gl.num_programs(0) + gl.program_id(0)
        return gl.atomic_add(ticket, 1) == SPLIT_K - 1

    @gluon.jit
    def _release_ticket(ticket_ptr):
        gl.atomic_xchg(ticket_ptr + gl.program_id(1) * gl.num_programs(0) + gl.program_id(0), 0)

    @gluon.jit
    def store_rows(out_ptr, y, rm, rn, first, M, N, stride_om):
        """Store y [rows, tokens] (weight rows rn, tokens rm) of Y [M, N] in out's dtype: tokens first … M − 1 only
        (the warp-specialized kernels move a ragged last token tile back to end at M − 1; its rows below ``first``
        belong to the tile before), straight from y's layout (W4A16's:
        :mod:`quantkit.runtime.kernels.gluon_sm90.w4a16_ws`)."""
        mask = ((rm >= first) & (rm < M))[None, :] & (rn < N)[:, None]
        gl.store(out_ptr + rm[None, :] * stride_om + rn[:, None], y.to(out_ptr.dtype.element_ty), mask=mask)

    # rows of y as :func:`store_rows_coalesced` stores them: 8 consecutive weight rows a thread (16 bytes of Y),
    # lanes down the rows, the 4 warps of a consumer partition side by side along the tokens
    STORE_ROWS_LAYOUT = gl.constexpr(gl.BlockedLayout(size_per_thread=[8, 1], threads_per_warp=[8, 4],
                                                      warps_per_cta=[1, 4], order=[0, 1]))

    @gluon.jit
    def store_rows_coalesced(out_ptr, y, rm, rn, first, M, N, stride_om):
        """:func:`store_rows` through :data:`STORE_ROWS_LAYOUT`: in a wgmma accumulator's layout a thread holds two
        adjacent *tokens* — rows of Y N elements apart — so each store writes 2 bytes; converted, they are 16-byte
        stores along Y's rows. Same values. It makes the LiquidQuant kernel's launches 1.05x faster (geometric mean;
        :mod:`quantkit.runtime.kernels.gluon_sm90.lqq_ws` uses it) and the W4A16 kernel's 0.999x, so that one keeps
        :func:`store_rows`. Called from a 4-warp partition (the warp-specialized consumers)."""
        store_rows(out_ptr, gl.convert_layout(y.to(out_ptr.dtype.element_ty), STORE_ROWS_LAYOUT),
                   gl.convert_layout(rm, gl.SliceLayout(0, STORE_ROWS_LAYOUT)),
                   gl.convert_layout(rn, gl.SliceLayout(1, STORE_ROWS_LAYOUT)), first, M, N, stride_om)

    @gluon.jit
    def store_tile(out_ptr, ws_ptr, ticket_ptr, y, rm, rn, M, N, stride_om, pid_k, SPLIT_K: gl.constexpr):
        """Write a finished fp32 tile y [rows, BM] (weight rows rn, tokens rm) of Y [M, N]: directly, or through
        split-K slot pid_k of the workspace (slots M·N apart, rows N apart), the last program of the tile adding the
        slots in split order (:func:`quantkit.runtime.kernels.triton.splitk.store_tile`, the same bits)."""
        if SPLIT_K == 1:
            _store_out(out_ptr, y, rm, rn, M, N, stride_om)
        else:
            store_rows_split(out_ptr, ws_ptr, ticket_ptr, y, rm, rn, 0, M, N, stride_om, pid_k, SPLIT_K)

    @gluon.jit
    def store_split_pair(out_ptr, ws_ptr, ticket_ptr, y, rm, rn, y2, rm2, rn2, M, N, stride_om, pid_k,
                         SPLIT_K: gl.constexpr):
        """:func:`store_tile`'s split-K path (SPLIT_K > 1) for a program that finished two tiles (a token tile and
        its tail): both go to slot pid_k, and one ticket covers both. (Unsplit, store each with store_tile.)"""
        store_rows_split_pair(out_ptr, ws_ptr, ticket_ptr, y, rm, rn, y2, rm2, rn2, 0, M, N, stride_om, pid_k, SPLIT_K)

    @gluon.jit
    def store_rows_split(out_ptr, ws_ptr, ticket_ptr, y, rm, rn, first, M, N, stride_om, pid_k,
                         SPLIT_K: gl.constexpr):
        """:func:`store_rows` for split-K launches of the warp-specialized kernels: tokens ``first`` … M − 1 of the
        tile go to slot pid_k, and the tile's last program adds the slots in split order (:func:`store_tile`'s
        scheme, the same bits). (Unsplit, store with store_rows.)"""
        _store_slot_from(ws_ptr, y, rm, rn, first, M, N, pid_k)
        if _take_ticket(ticket_ptr, SPLIT_K):
            _sum_slots_from(out_ptr, ws_ptr, y, rm, rn, first, M, N, stride_om, SPLIT_K)
            _release_ticket(ticket_ptr)

    @gluon.jit
    def store_rows_split_pair(out_ptr, ws_ptr, ticket_ptr, y, rm, rn, y2, rm2, rn2, first, M, N, stride_om, pid_k,
                              SPLIT_K: gl.constexpr):
        """:func:`store_rows_split` for a program that finished a token tile and its tail tile: both go to slot
        pid_k, and one ticket covers both."""
        _store_slot_from(ws_ptr, y, rm, rn, first, M, N, pid_k)
        _store_slot_from(ws_ptr, y2, rm2, rn2, first, M, N, pid_k)
        if _take_ticket(ticket_ptr, SPLIT_K):
            _sum_slots_from(out_ptr, ws_ptr, y, rm, rn, first, M, N, stride_om, SPLIT_K)
            _sum_slots_from(out_ptr, ws_ptr, y2, rm2, rn2, first, M, N, stride_om, SPLIT_K)
            _release_ticket(ticket_ptr)

    __all__ += ["X_SMEM", "a_layout", "ring_barriers", "stacked_int8_view", "store_rows", "store_rows_coalesced", "weight_rows", "async_copy", "cta_barrier", "fence_async_shared", "gl",
                "gluon", "issue_x", "load_words", "mbarrier", "mma_layout", "store_rows_split", "store_rows_split_pair",
                "store_split_pair", "store_tile", "sum_slots",
                "tma_load", "wait_x", "warpgroup_mma", "warpgroup_mma_wait", "x_layout", "x_tile_ptrs"]
