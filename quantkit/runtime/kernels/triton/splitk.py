"""Split-K without extra kernels: each program of one output tile stores its fp32 partial sums in its own slot
of a workspace, takes an atomic ticket, and the last one to arrive adds the tile's slots in split order (so the
result does not depend on which program finished last), writes the output in its dtype and leaves the ticket
at zero for the next call.

Why slots: a zeroed fp32 result per call with atomics and a cast into the output costs two more kernels per GEMM
(a memset and the cast), a few µs each against a ~15 µs decode GEMV; fp32 atomics into one shared slot cost little
for a decode tile but up to 4× the GEMM above M = 64 (H100, LiquidQuant 6144×4096 M = 256, 64×256 tiles: 26 µs
unsplit, 103 µs split 2; docs/BENCHMARKS.md, Measured and dropped), and their sums depend on arrival order.

The workspace and tickets come from :func:`quantkit.runtime.kernels.scratch.split_workspace`.
"""

from __future__ import annotations

import triton.language as tl

from quantkit.runtime.kernels.jit import kernel


@kernel
def store_tile(out_ptr, out_ptrs, ws_ptrs, acc, mask, ticket_ptr, pid_k, slot, SPLIT_K: tl.constexpr):
    """Write a finished [BN, BM] fp32 tile: directly, or through split-K slot ``pid_k`` of the workspace
    (``ws_ptrs`` point into slot 0; slots are ``slot`` elements apart; module docstring)."""
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        tl.store(ws_ptrs + pid_k * slot, acc, mask=mask)
        # One thread takes the ticket, and its release covers only what it has observed: the barrier first makes
        # every warp's stores part of that (Triton releases without triton-lang/triton#10816 insert no barrier of
        # their own). acq_rel then makes all of the tile's slots visible to the last program.
        tl.debug_barrier()
        if tl.atomic_add(ticket_ptr, 1) == SPLIT_K - 1:
            # every slot read back, this program's own too (its stores precede its loads): acc is dead by now,
            # so the sum reuses its registers instead of doubling them (64×256 tiles spilled)
            total = tl.full(acc.shape, 0.0, tl.float32)
            for s in tl.static_range(SPLIT_K):
                # .cg: from L2, not from a line this SM may hold from an earlier call
                total += tl.load(ws_ptrs + s * slot, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptrs, total.to(out_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(ticket_ptr, 0)
