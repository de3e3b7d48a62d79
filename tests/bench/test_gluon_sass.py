"""The SASS check of the Gluon wgmma kernels (quantkit/bench/sass.py): its walk over a listing finds a write to a
register that a running product reads — and none once a DEPBAR has retired that product — and every launch the
registry may run, compiled for sm_90 with the installed Triton (no GPU needed), has no such write."""

from __future__ import annotations

import subprocess
import sys

import pytest

from quantkit.bench.sass import cuobjdump, hazards_in, register_products

# the shape of a racy LiquidQuant loop (its SASS, shortened): two products, a wait that retires only the
# older, then (where a test inserts it) a loop-top write to the newer one's A registers (R88-R91): the race
RACY = [
    (0x100, "PRMT R100, R4, 0x40, R5"),
    (0x110, "IGMMA.64x128x32.S8.S8 R24, R116, gdesc[UR20], R24, gsb0"),
    (0x120, "IGMMA.64x128x32.S8.S8 R24, R88, gdesc[UR20], R24, gsb0"),
    (0x130, "WARPGROUP.DEPBAR.LE gsb0, 0x1"),
    (0x140, "IADD3 R116, P2, R138, UR9, RZ"),  # the older product is retired: not a hazard
    (0x150, "@P0 BRA 0x100"),
    (0x160, "EXIT"),
]


def test_walk_finds_a_write_to_a_running_products_registers_across_the_loop_edge():
    # the loop top's R100 is no product's A register: nothing to report
    assert hazards_in(RACY) == []
    # a write to R90-R91 at the loop top, before the products in address order: on the second pass the product at
    # 0x120 (A = R88-R91) may still run
    racy = RACY[:1] + [(0x104, "IMAD.WIDE R90, R91, 0x4, R2")] + RACY[1:]
    found = hazards_in(racy)
    assert len(found) == 1 and "0x0104 IMAD.WIDE R90" in found[0] and "products from 0x0120" in found[0]
    # the same write after a wait for every product: none
    fixed = [x if x[0] != 0x130 else (0x130, "WARPGROUP.DEPBAR.LE gsb0, 0x0") for x in racy]
    assert hazards_in(fixed) == []
    # a store is not a write to the register it names
    stored = RACY[:1] + [(0x104, "STG.E desc[UR4][R88.64], R2")] + RACY[1:]
    assert hazards_in(stored) == []
    assert register_products(racy) == 2


def test_walk_counts_wgmma_groups_follows_both_edges_and_reads_predicate_outputs():
    # one wgmma group of two HGMMAs (only the second marks gsb0): DEPBAR.LE 1 keeps that group running
    pair = [(0x10, "HGMMA.64x128x16.F32 R24, R88, gdesc[UR4], R24"),
            (0x20, "HGMMA.64x128x16.F32 R24, R92, gdesc[UR8], R24, gsb0"),
            (0x30, "WARPGROUP.DEPBAR.LE gsb0, 0x1"),
            (0x40, "MOV R89, R2"),
            (0x50, "EXIT")]
    assert len(hazards_in(pair)) == 1
    # a branch that skips the full wait: the path through the branch writes while the products run
    skip = [(0x10, "IGMMA.64x128x32.S8.S8 R24, R88, gdesc[UR4], R24, gsb0"),
            (0x20, "@P0 BRA 0x40"),
            (0x30, "WARPGROUP.DEPBAR.LE gsb0, 0x0"),
            (0x40, "MOV R88, R2"),
            (0x50, "EXIT")]
    assert len(hazards_in(skip)) == 1
    # a predicated wait may not run: no product counts as retired by it
    maybe = [skip[0], (0x20, "@P0 WARPGROUP.DEPBAR.LE gsb0, 0x0"), skip[3], skip[4]]
    assert len(hazards_in(maybe)) == 1
    # a write after predicate outputs (ATOMG's PT, LOP3's P0) is a write; ISETP writes only predicates
    for text in ("ATOMG.E.ADD.STRONG.GPU PT, R88, desc[UR4][R2.64], R5", "LOP3.LUT P0, R89, R1, R2, RZ, 0xfe, !PT"):
        assert len(hazards_in([skip[0], (0x20, text), skip[4]])) == 1, text
    assert hazards_in([skip[0], (0x20, "ISETP.GE.AND P0, PT, R88, R3, PT"), skip[4]]) == []
    # code after an exit (a slow path reached by a branch) is walked too
    tail = [(0x10, "EXIT"), (0x20, "IGMMA.64x128x32.S8.S8 R24, R88, gdesc[UR4], R24, gsb0"),
            (0x30, "IADD3 R90, R1, R2, RZ"), (0x40, "EXIT")]
    assert len(hazards_in(tail)) == 1


def _gluon_available() -> bool:
    try:
        from triton.experimental import gluon  # noqa: F401
    except ImportError:
        return False
    return True


def test_sass_check_covers_every_warp_specialized_launch_the_registry_may_run():
    """The SASS check compiles one lqq_ws launch per (tail, warpgroups, programs an SM, stages) of
    quantkit.bench.sass.lqq_ws_kinds: every lqq_ws launch of the LiquidQuant Gluon kernel's default rule and tune
    space — on other layers, K and SM counts too — is of one of those kinds (their register budgets and rings are
    what the check compiles)."""
    import torch

    from quantkit.bench.sass import lqq_ws_kinds
    from quantkit.runtime.kernels.gemm import GluonLqq
    from quantkit.runtime.kernels.gluon_sm90 import lqq_ws
    from quantkit.runtime.kernels.registry import GemmProblem

    kinds = set(lqq_ws_kinds())
    kernel = GluonLqq()
    for sms in (78, 114, 132):
        for n in (512, 1000, 4096, 6144, 14336, 28672):
            for k in (3584, 4096, 14336):
                for m in (17, 32, 33, 64, 65, 96, 97, 128, 129, 256, 257, 512, 513, 700, 1025, 2049, 4096):
                    p = GemmProblem("a8", ("w4a8-lqq",), m, n, k, -1, torch.float16, (9, 0), sms,
                                    frozenset({"cupy", "gluon"}))
                    for c in kernel.configs(p) + kernel.candidates(p):
                        if c.kernel in (lqq_ws.KERNEL, lqq_ws.HALVES_KERNEL):
                            _, stages, tail, wg, per_sm, _ = c.args
                            assert (tail, wg, per_sm, stages) in kinds, (sms, n, k, m, c)


@pytest.mark.skipif(not _gluon_available() or cuobjdump() is None,
                    reason="needs Triton with Gluon and its bundled cuobjdump/ptxas")
def test_the_gluon_kernels_launches_write_no_register_of_a_running_product():
    import torch

    from quantkit.bench.sass import _lqq_launches, _w4a16_launches, lqq_ws_kinds
    from quantkit.runtime.kernels.gemm import GluonLqqKPair
    from quantkit.runtime.kernels.registry import GemmProblem

    # a process of its own: the check swaps Triton's driver for an sm_90 stand-in while it compiles
    run = subprocess.run([sys.executable, "-m", "quantkit.bench.sass"], capture_output=True, text=True, timeout=600)
    lines = [line for line in run.stdout.splitlines() if "hazard" in line]
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # every launch the check enumerates (the lqq_wgmma / w4a16 ones, lqq_ws's of every lqq_ws_kinds kind, the
    # 256-token launch with its later tiles halved, the K-pair launches) compiled, products parsed, no hazard
    names = [name for name, *_ in [*_lqq_launches(), *_w4a16_launches()]]
    assert lines[-1] == f"{len(names)} launch(es), 0 with hazards or no products parsed", lines
    for name in names:
        assert any(line.startswith(f"{name}: ") for line in lines), name
    for tail, wg, per_sm, stages in lqq_ws_kinds():
        kind = f"lqq_ws tail={tail} wg={wg} per_sm={per_sm} stages={stages}"
        assert any(line.startswith(kind + " split=1:") for line in lines), kind
        if tail == 128:
            assert any(line.startswith(kind + " halves:") for line in lines), kind
    # the K-pair kernel's stage counts (its default and tune space)
    p = GemmProblem("a8", ("w4a8-lqq",), 769, 1024, 4096, -1, torch.float16, (9, 0), 132, frozenset({"gluon"}))
    for _, stages in GluonLqqKPair().configs(p) + GluonLqqKPair().candidates(p):
        assert any(line.startswith(f"lqq_ws k_pair stages={stages} split=1:") for line in lines), stages
