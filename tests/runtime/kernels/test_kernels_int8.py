"""Int8 tensor-core Triton kernels — W8A8 (w8), MixLLM W4A8 (w4a16 asym), LiquidQuant W4A8 (w4a8-lqq), the
one-launch mixed W4.4A8 scatter — against the torch reference over the same packed tensors, and the reference
against the dense fake-quant product. The dispatch entry is checked against QuantLinear's reference numbers."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402

from quantkit.quant import grid  # noqa: E402
from quantkit.quant.act import quantize_activation, quantize_activation_int  # noqa: E402
from quantkit.runtime.dispatch import ActQuant  # noqa: E402
from quantkit.runtime.kernels.entry import layout_kernel  # noqa: E402
from quantkit.runtime.kernels.gemm import TritonInt8, int8_matmul, mixed_int8_matmul, problem_for  # noqa: E402
from quantkit.runtime.kernels.reference import int8_reference, int8_weight  # noqa: E402
from quantkit.runtime.kernels.triton.launch import TileConfig  # noqa: E402
from tests.kernels_helpers import DEVICE, packed, poisoned, rel_err  # noqa: E402

TOL = 1e-3  # fp16 output rounding; the sums themselves are exact integers times fp32 scales
CASES = [  # layout, M, N, K, weight group, activation group, split-K
    ("w8", 1, 33, 200, 128, 128, 1), ("w8", 33, 20, 300, 128, -1, 2), ("w8", 5, 9, 512, 256, 128, 1),
    ("w8", 17, 40, 1000, -1, -1, 1), ("w8", 1, 33, 520, -1, -1, 2),  # per-channel: one int32 sum over K
    ("w4a16", 3, 33, 328, 128, 128, 2), ("w4a16", 16, 7, 200, -1, 128, 1),
    ("w4a8-lqq", 1, 33, 328, 128, -1, 1), ("w4a8-lqq", 33, 9, 200, 128, 128, 1), ("w4a8-lqq", 16, 33, 512, -1, -1, 2),
]


def _acts(m: int, k: int, act_group: int, seed: int):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * 3
    codes, scales = quantize_activation_int(x, 8, act_group)
    return x, codes.to(DEVICE), scales.float().to(DEVICE)


@pytest.mark.parametrize("layout,m,n,k,group_size,act_group,split", CASES)
def test_int8_kernel_matches_reference_and_dense(layout, m, n, k, group_size, act_group, split):
    qw, tensors, meta = packed(layout, n, k, group_size, seed=m * n)
    x, codes, scales = _acts(m, k, act_group, seed=k)
    out = int8_matmul(codes, scales, act_group, layout, tensors, meta, config=TileConfig(16, 16, split),
                      out=poisoned(m, n, torch.float16))
    ref = int8_reference(codes, scales, act_group, layout, tensors, meta)
    assert rel_err(out, ref) < TOL
    dense = quantize_activation(x, 8, act_group).double() @ grid.dequantize(qw).double().t()
    assert rel_err(ref, dense) < 1e-12


def test_int8_operand_is_liquidquant_eq12_and_mixllm_q_minus_z():
    from quantkit.quant.lqq import lqq_int8_codes

    qw, tensors, meta = packed("w4a8-lqq", 5, 200, 128)
    assert torch.equal(int8_weight("w4a8-lqq", tensors, meta)[:, :200].cpu(), lqq_int8_codes(qw))
    qw, tensors, meta = packed("w4a16", 5, 200, 128)
    expect = qw.codes.to(torch.int16) - qw.zeros.to(torch.int16)[:, qw.group_index()]
    assert torch.equal(int8_weight("w4a16", tensors, meta)[:, :200].cpu().to(torch.int16), expect)


def _mixed_layer(m: int, n: int, k: int, act_group: int, rows8: torch.Tensor, seed: int, eight_first: bool = False):
    """(parts, float64 reference [M, N], codes, scales) of a W4.4A8 layer: ``rows8`` sym-8, the rest asym-4 g128."""
    from quantkit.formats import get_layout

    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed))
    rows4 = torch.tensor([r for r in range(n) if r not in set(rows8.tolist())])
    x, codes, scales = _acts(m, k, act_group, seed=seed)
    specs = [("w4a16", grid.quantize(w[rows4], 4, 128), rows4), ("w8", grid.quantize(w[rows8], 8, 128, sym=True), rows8)]
    parts, ref = [], torch.empty(m, n, dtype=torch.float64)
    for layout, qw, rows in (specs[::-1] if eight_first else specs):
        lay = get_layout(layout)
        tensors = {key: t.to(DEVICE) for key, t in lay.pack(qw).items()}
        parts.append((layout, tensors, lay.layout_meta(qw), rows.to(DEVICE)))
        ref[:, rows] = int8_reference(codes, scales, act_group, layout, tensors, lay.layout_meta(qw)).cpu()
    return parts, ref, codes, scales


@pytest.mark.parametrize("m,act_group,split", [(1, 128, 1), (5, 128, 2), (17, -1, 1)])
def test_mixed_one_launch_scatters_both_partitions(m, act_group, split):
    """A W4.4A8 layer: rows {1, 4, 30} at 8 bits, the rest asymmetric 4-bit, one launch, one activation."""
    n = 33
    parts, ref, codes, scales = _mixed_layer(m, n, 328, act_group, torch.tensor([1, 4, 30]), seed=m)
    out = mixed_int8_matmul(codes, scales, act_group, parts, n, config=TileConfig(16, 16, split),
                            out=poisoned(m, n, torch.float16), launches=1)
    assert rel_err(out, ref) < TOL
    with pytest.raises(ValueError, match="launches"):
        mixed_int8_matmul(codes, scales, act_group, parts, n, launches=2)


def test_split_k_workspace_rows_do_not_follow_the_output_stride():
    """A [1, N] output may report row stride 1 (torch calls it contiguous): split-K slots keep rows N apart in a
    workspace sized for them, allocated afresh here so a short one cannot hide behind an earlier, larger one."""
    from quantkit.runtime.kernels import scratch as splitk

    n, k = 33, 1024
    _, tensors, meta = packed("w4a8-lqq", n, k, 128, seed=11)
    _, codes, scales = _acts(1, k, -1, seed=3)
    out = torch.full((n, 1), float("nan"), dtype=torch.float16, device=DEVICE).t()
    assert out.stride(0) == 1
    splitk._WORKSPACES.clear()
    int8_matmul(codes, scales, -1, "w4a8-lqq", tensors, meta, config=TileConfig(16, 16, 4), out=out)
    assert rel_err(out, int8_reference(codes, scales, -1, "w4a8-lqq", tensors, meta)) < TOL
    assert splitk._WORKSPACES[next(iter(splitk._WORKSPACES))][0].numel() >= 4 * n


def test_mixed_split_k_partitions_keep_their_own_workspace_rows():
    """Split-K over a mixed layer into an output wider than the layer: partition B's partial sums sit after
    partition A's in the workspace; with several tiles in flight (a GPU) an overlap would mix tiles' sums.
    Three calls in a row also reuse the workspace's stale slots."""
    m, n, act_group = 4, 150, 128
    parts, ref, codes, scales = _mixed_layer(m, n, 1024, act_group, torch.arange(3, n, 7), seed=7)
    wide = poisoned(m, n + 40, torch.float16)
    for _ in range(3):
        out = mixed_int8_matmul(codes, scales, act_group, parts, n, config=TileConfig(16, 16, 4), out=wide[:, :n])
        assert rel_err(out, ref) < TOL
    assert torch.isnan(wide[:, n:]).all()
    with pytest.raises(ValueError, match="rows"):
        mixed_int8_matmul(codes, scales, act_group, parts, n + 1, config=TileConfig(16, 16, 4))


@pytest.mark.parametrize("bn,bn_b", [(32, 16), (16, 32)])
def test_mixed_second_partition_with_its_own_rows_per_program(bn, bn_b):
    """The 8-bit partition's programs with another BN than the 4-bit ones (MixLLM Sec. 3.4 one launch): 20 rows
    of 8 bits span several programs of either size, so a grid or tile computed with the wrong BN misses rows;
    the partitions are passed 8-bit first, which the kernel reorders."""
    m, n, act_group = 3, 70, 128
    parts, ref, codes, scales = _mixed_layer(m, n, 328, act_group, torch.arange(0, n, 3)[:20], seed=bn,
                                             eight_first=True)
    out = mixed_int8_matmul(codes, scales, act_group, parts, n, config=TileConfig(bn, 16, 1), bn_b=bn_b,
                            out=poisoned(m, n, torch.float16))
    assert rel_err(out, ref) < TOL


def test_int8_kernel_rejects_bad_activations():
    _, tensors, meta = packed("w8", 8, 256)
    codes = torch.zeros(2, 256, dtype=torch.int8, device=DEVICE)
    scales = torch.ones(2, 2, device=DEVICE)
    with pytest.raises(ValueError, match="int8"):
        int8_matmul(codes.float(), scales, 128, "w8", tensors, meta)
    with pytest.raises(ValueError, match="multiple of 128"):
        int8_matmul(codes, scales, 64, "w8", tensors, meta)
    with pytest.raises(ValueError, match="no int8 kernel reads layout 'awq'"):
        int8_matmul(codes, scales, 128, "awq", tensors, meta)


@pytest.mark.parametrize("layout,act", [("w4a16", ActQuant(8, 128)), ("w4a16", None), ("w8", ActQuant(8, -1)),
                                        ("w4a8-lqq", ActQuant(8, 64)), ("w8", None)])
def test_dispatch_entry_computes_the_quantlinear_reference(layout, act):
    """The registered entry gives QuantLinear's reference numbers: F.linear(fake_quant(x), Ŵ) — through the int8
    kernel (A8 g128 / per token), the W4A16 kernel (A16), or the torch fallback (A8 g64, A16 int8 layouts)."""
    qw, tensors, meta = packed(layout, 33, 256, 128, seed=7)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(1)).half()
    xq = x if act is None else quantize_activation(x, act.bits, act.group_size, act.sym)
    ref = xq.double() @ grid.dequantize(qw).half().double().t()
    out = layout_kernel(layout)(x.to(DEVICE), tensors, meta, act)
    assert out.shape == (3, 33) and out.dtype == torch.float16
    assert rel_err(out, ref) < 2e-3


def _default_and_tune_tiles(layout: str, m: int, n: int, k: int, act_group: int) -> list:
    """The Triton int8 kernel's default tile for this product on DEVICE and every tile of its tune space."""
    p = problem_for("a8", (layout,), m, n, k, act_group, torch.float16, torch.device(DEVICE))
    kernel = TritonInt8()
    return list(dict.fromkeys(kernel.configs(p) + kernel.candidates(p)))


@pytest.mark.parametrize("layout,m,act_group", [("w4a8-lqq", 40, -1), ("w8", 3, 128), ("w4a16", 17, 128)])
def test_every_default_and_tune_tile_builds_and_gives_the_same_bits_at_its_split(layout, m, act_group):
    """Selection rules are checked by invariants: every tile the default rule or the tune space gives runs, within
    the reference's tolerance, and tiles of one K split give one result bit for bit (exact int32 products, the
    fp32 sums in K order whatever the tile)."""
    n, k = 40, 2048
    _, tensors, meta = packed(layout, n, k, 128, seed=m)
    _, codes, scales = _acts(m, k, act_group, seed=m)
    ref = int8_reference(codes, scales, act_group, layout, tensors, meta)
    by_split = {}
    tiles = _default_and_tune_tiles(layout, m, n, k, act_group)
    assert len(tiles) > 1
    for cfg in tiles:
        out = int8_matmul(codes, scales, act_group, layout, tensors, meta, config=cfg,
                          out=poisoned(m, n, torch.float16))
        assert rel_err(out, ref) < TOL, cfg
        assert torch.equal(out, by_split.setdefault(cfg.split_k, out)), cfg


def test_every_default_and_tune_tile_of_the_mixed_kernel_builds_and_gives_the_same_bits_at_its_split():
    """The same invariant for the one-launch mixed kernel (its second partition's rows per program follow BN)."""
    from quantkit.runtime.kernels.gemm import TritonInt8Mixed

    m, n, k, act_group = 17, 70, 2048, 128
    parts, ref, codes, scales = _mixed_layer(m, n, k, act_group, torch.arange(0, n, 5), seed=5)
    p = problem_for("a8_mixed", ("w4a16", "w8"), m, n, k, act_group, torch.float16, torch.device(DEVICE))
    kernel = TritonInt8Mixed()
    tiles = list(dict.fromkeys(kernel.configs(p) + kernel.candidates(p)))
    assert len(tiles) > 1
    by_split = {}
    for cfg in tiles:
        out = mixed_int8_matmul(codes, scales, act_group, parts, n, config=cfg, out=poisoned(m, n, torch.float16))
        assert rel_err(out, ref) < TOL, cfg
        assert torch.equal(out, by_split.setdefault(cfg.split_k, out)), cfg


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("layout,act_group", [("w8", 128), ("w4a16", 128), ("w4a8-lqq", -1), ("w4a8-lqq", 128)])
@pytest.mark.parametrize("m", [1, 16, 300])
def test_int8_ptx_equals_plain_triton_and_reference_on_gpu(layout, act_group, m):
    n, k = 1000, 2048 + 256
    _, tensors, meta = packed(layout, n, k, 128, seed=m)
    _, codes, scales = _acts(m, k, act_group, seed=m)
    cfg = _default_and_tune_tiles(layout, m, n, k, act_group)[0]  # the default tile
    fast = int8_matmul(codes, scales, act_group, layout, tensors, meta, config=cfg, use_asm=True)
    plain = int8_matmul(codes, scales, act_group, layout, tensors, meta, config=cfg, use_asm=False)
    if cfg.split_k == 1:
        assert torch.equal(fast, plain)
    assert rel_err(fast, plain) < 1e-3
    assert rel_err(fast, int8_reference(codes, scales, act_group, layout, tensors, meta)) < TOL
