"""W4A16 Triton kernel against its torch reference over the same packed tensors (and the reference against the
dense product of the QuantizedWeight). Without a GPU the kernel runs in Triton's CPU interpreter; tests marked
gpu also compare the inline-PTX dequantization with the plain-Triton one bit for bit."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402

from quantkit.quant import grid  # noqa: E402
from quantkit.runtime.kernels.reference import w4a16_reference, w4a16_weight  # noqa: E402
from quantkit.runtime.kernels.gemm import TritonW4a16, problem_for, w4a16_matmul  # noqa: E402
from quantkit.runtime.kernels.triton.launch import TileConfig  # noqa: E402
from quantkit.runtime.kernels.triton.w4a16 import w4a16_dequantize  # noqa: E402
from tests.kernels_helpers import DEVICE, packed, poisoned, rel_err  # noqa: E402

TOL = {torch.float16: 1e-3, torch.bfloat16: 8e-3}


@pytest.mark.parametrize("m,n,k,group_size,split", [(1, 33, 200, 128, 1), (3, 33, 328, -1, 2), (16, 7, 200, 128, 2),
                                                    (33, 33, 512, 256, 1)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_w4a16_matches_reference(m, n, k, group_size, split, dtype):
    qw, tensors, meta = packed("w4a16", n, k, group_size, seed=m + k)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype).to(DEVICE)
    out = w4a16_matmul(x, tensors, meta, TileConfig(16, 16, split), out=poisoned(m, n, dtype))
    ref = w4a16_reference(x, tensors, meta)
    assert out.dtype == dtype and out.shape == (m, n)
    assert rel_err(out, ref) < TOL[dtype]
    # the reference reads the packed tensors exactly as the record dequantizes (fp16: bit-identical weights)
    dense = grid.dequantize(qw).to(dtype)
    if dtype == torch.float16:
        assert torch.equal(w4a16_weight(tensors, meta, dtype).cpu(), dense)
    assert rel_err(ref, x.double().cpu() @ dense.double().t()) < TOL[dtype]


@pytest.mark.parametrize("n,k,group_size", [(33, 328, 128), (7, 256, 256), (100, 512, -1)])
def test_w4a16_dequantize_then_matmul_matches_reference(n, k, group_size):
    """The prefill path: Ŵ dequantized by a kernel (the GEMM kernel's bits; fp16 exactly — the CPU interpreter
    truncates instead of rounding to bf16, so bf16 is checked to one bf16 step there), then one matmul."""
    _, tensors, meta = packed("w4a16", n, k, group_size, seed=n)
    assert torch.equal(w4a16_dequantize(tensors, meta, torch.float16), w4a16_weight(tensors, meta, torch.float16))
    wb, ref = w4a16_dequantize(tensors, meta, torch.bfloat16).float(), w4a16_weight(tensors, meta, torch.bfloat16)
    if DEVICE == "cuda":
        assert torch.equal(wb, ref.float())
    assert ((wb - ref.float()).abs() <= ref.float().abs() * 2.0 ** -7).all()
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(k)).half().to(DEVICE)
    out = w4a16_matmul(x, tensors, meta, dequant=True, out=poisoned(5, n, torch.float16))
    assert rel_err(out, w4a16_reference(x, tensors, meta)) < TOL[torch.float16]


def test_w4a16_symmetric_and_strided_activations():
    """Symmetric 4-bit (zero 8) weights and activations that are a column slice of a wider tensor."""
    _, tensors, meta = packed("w4a16", 9, 328, 128, seed=5, sym=True)
    wide = torch.randn(4, 400).half().to(DEVICE)
    x = wide[:, 10:338]
    out = w4a16_matmul(x, tensors, meta, TileConfig(16, 16, 1))
    assert rel_err(out, w4a16_reference(x, tensors, meta)) < TOL[torch.float16]


def test_w4a16_rejects_bad_inputs():
    _, tensors, meta = packed("w4a16", 8, 256)
    with pytest.raises(ValueError, match="fp16/bf16"):
        w4a16_matmul(torch.randn(2, 256, device=DEVICE), tensors, meta)
    with pytest.raises(ValueError, match=r"\[M, 256\]"):
        w4a16_matmul(torch.randn(2, 255, device=DEVICE).half(), tensors, meta)


def _default_and_tune_tiles(m: int, n: int, k: int, dtype: torch.dtype) -> list:
    """The Triton W4A16 kernel's default tile for this product on DEVICE and every tile of its tune space."""
    p = problem_for("a16", ("w4a16",), m, n, k, 0, dtype, torch.device(DEVICE))
    kernel = TritonW4a16()
    return list(dict.fromkeys(kernel.configs(p) + kernel.candidates(p)))


@pytest.mark.parametrize("m,dtype", [(3, torch.float16), (40, torch.bfloat16)])
def test_every_default_and_tune_tile_builds_and_matches_the_reference(m, dtype):
    """Selection rules are checked by invariants: every tile the default rule or the tune space gives runs and stays
    within the reference's tolerance."""
    n, k = 40, 2048
    _, tensors, meta = packed("w4a16", n, k, 128, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(dtype).to(DEVICE)
    ref = w4a16_reference(x, tensors, meta)
    tiles = _default_and_tune_tiles(m, n, k, dtype)
    assert len(tiles) > 1
    for cfg in tiles:
        out = w4a16_matmul(x, tensors, meta, cfg, out=poisoned(m, n, dtype))
        assert rel_err(out, ref) < TOL[dtype], cfg


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 16, 200])
def test_w4a16_ptx_equals_plain_triton_and_reference_on_gpu(m, dtype):
    _, tensors, meta = packed("w4a16", 1000, 2048 + 256, 128, seed=m)
    x = torch.randn(m, 2048 + 256, device="cuda").to(dtype)
    cfg = _default_and_tune_tiles(m, 1000, 2304, dtype)[0]  # the default tile
    fast = w4a16_matmul(x, tensors, meta, cfg, use_asm=True)
    plain = w4a16_matmul(x, tensors, meta, cfg, use_asm=False)
    assert torch.equal(fast, plain)  # split-K sums too: its slots are added in split order
    assert rel_err(fast, w4a16_reference(x, tensors, meta)) < TOL[dtype]


def test_split_k_sums_in_split_order_and_leaves_its_tickets_zeroed():
    """Each split-K program stores its partial sums in its own workspace slot and the last of a tile adds the
    slots in split order (quantkit.runtime.kernels.triton.splitk): repeated and differently-shaped launches, which reuse
    the workspace with stale slots, give bit-identical sums, and every ticket is back at zero."""
    from quantkit.runtime.kernels import scratch as splitk
    from quantkit.runtime.kernels.scratch import split_workspace

    _, tensors, meta = packed("w4a16", 33, 1024, 128, seed=3)
    x = torch.randn(3, 1024, generator=torch.Generator().manual_seed(0)).half().to(DEVICE)
    splitk._WORKSPACES.clear()  # a workspace too short for 4 slots must not hide behind an earlier, larger one
    first = w4a16_matmul(x, tensors, meta, TileConfig(16, 16, 4))
    _, small_t, small_meta = packed("w4a16", 7, 328, 128, seed=4)
    w4a16_matmul(x[:1, :328].contiguous(), small_t, small_meta, TileConfig(16, 16, 2))
    for _ in range(3):
        again = w4a16_matmul(x, tensors, meta, TileConfig(16, 16, 4))
        assert torch.equal(first, again)
    assert rel_err(first, w4a16_reference(x, tensors, meta)) < TOL[torch.float16]
    _, tickets = split_workspace(x.device, 1, 1, 1)
    assert not tickets.any()


def test_split_workspace_only_for_split_launches_and_within_32_bit_offsets():
    """An unsplit launch never touches the workspace, so it must not allocate one (at prefill sizes that would be
    M·N fp32 kept alive per stream); slots addressed past 2^31 elements are refused, not wrapped."""
    from quantkit.runtime.kernels import scratch as splitk

    _, tensors, meta = packed("w4a16", 33, 512, 128, seed=5)
    x = torch.randn(40, 512, generator=torch.Generator().manual_seed(2)).half().to(DEVICE)
    splitk._WORKSPACES.clear()
    w4a16_matmul(x, tensors, meta, TileConfig(16, 16, 1))
    assert all(ws.numel() == 1 for ws, _ in splitk._WORKSPACES.values())
    with pytest.raises(ValueError, match="32-bit"):
        splitk.split_workspace(x.device, 2**30, 2, 1)


def _cupy_ok() -> bool:
    from quantkit.runtime.kernels.cuda.common import cupy_available

    return torch.cuda.is_available() and cupy_available()


def test_cuda_gemv_declines_inputs_it_cannot_read():
    """The CUDA decode GEMV names why it cannot take an input (w4a16_matmul then runs the Triton kernel); the
    shape and layout reasons come before the device ones, so they are checked here without a GPU."""
    from quantkit.runtime.kernels.cuda.gemv import cuda_gemv_problem, cuda_gemv_supported

    _, t200, meta200 = packed("w4a16", 8, 200)
    _, t, meta = packed("w4a16", 8, 256)
    x = torch.randn(2, 256).half()
    assert "multiple of 256" in cuda_gemv_problem(torch.randn(1, 200).half(), t200, meta200)
    assert "fp16/bf16" in cuda_gemv_problem(x.float(), t, meta)
    assert cuda_gemv_problem(x[:0], t, meta) == "no tokens"
    assert "8-byte aligned" in cuda_gemv_problem(torch.randn(2, 260).half()[:, 1:257], t, meta)
    assert "dtype" in cuda_gemv_problem(x, t, meta, out=torch.empty(2, 8))
    assert "unit column stride" in cuda_gemv_problem(x, t, meta, out=torch.empty(8, 2).half().t())
    assert "contiguous" in cuda_gemv_problem(x, {"qweight": t["qweight"].t().contiguous().t(),
                                                 "qparams": t["qparams"]}, meta)
    assert "CUDA device" in cuda_gemv_problem(x, t, meta)  # everything else fine, but not on a GPU
    assert not cuda_gemv_supported(x, t, meta)


@pytest.mark.gpu
@pytest.mark.skipif(not _cupy_ok(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("m,n,k,group_size,warps,l2_prefetch,sets,wait2", [
    (1, 33, 256, 128, 2, 0, 1, False), (3, 1000, 1024, -1, 4, 256, 1, False), (8, 4103, 512, 256, 8, 128, 1, False),
    (12, 257, 768, 128, 8, 0, 1, False), (2, 65, 2304, 384, 2, 256, 1, False), (5, 65, 2304, 128, 2, 0, 1, False),
    (1, 40, 1792, 128, 4, 128, 1, False), (4, 40, 2560, 1280, 2, 0, 1, False), (7, 17, 3072, 512, 4, 256, 1, False),
    (9, 257, 3840, 384, 2, 128, 1, False), (2, 40, 7168, 512, 4, 128, 1, False), (16, 257, 4096, 128, 4, 128, 2, False),
    (12, 33, 2304, -1, 2, 128, 2, False), (37, 40, 1024, 256, 8, 0, 2, False), (3, 65, 512, 128, 4, 128, 2, False),
    (1, 33, 256, 128, 8, 128, 1, True), (3, 1000, 1024, -1, 2, 128, 1, True), (5, 65, 2304, 128, 2, 0, 1, True),
    (7, 17, 3072, 512, 4, 256, 1, True), (2, 40, 7168, 512, 4, 128, 1, True), (1, 4103, 1280, 256, 8, 128, 1, True)])
def test_cuda_gemv_matches_reference_on_gpu(m, n, k, group_size, warps, l2_prefetch, sets, wait2, dtype, monkeypatch):
    """Odd N (a partial 16-row block), per-channel, 256-, 512- (shifted group index), 384- and
    1280-column groups (divided), M beyond one 8-token launch column, activations that are a row-strided view, and
    K long enough that every warp loops over several tiles (odd and even counts: both register tiles in turn);
    sets = 2: 16 tokens per launch column sharing each dequantized fragment (M of 3, 12, 16 and 37); wait2: the
    wait for the previous grid after two tiles, with warps of no tile, one, two, three, five and seven."""
    from quantkit.runtime.kernels.cuda.gemv import GemvVariant, w4a16_gemv_cuda

    _, tensors, meta = packed("w4a16", n, k, group_size, seed=m + n)
    wide = torch.randn(m, k + 64, device="cuda").to(dtype)
    x = wide[:, :k]
    variant = GemvVariant(warps, l2_prefetch, sets, wait2)
    out = w4a16_gemv_cuda(x, tensors, meta, variant, out=poisoned(m, n, dtype))
    assert rel_err(out, w4a16_reference(x, tensors, meta)) < TOL[dtype]
    # the wait's place changes no arithmetic: the other placement gives the same bits
    assert torch.equal(out, w4a16_gemv_cuda(x, tensors, meta, GemvVariant(warps, l2_prefetch, sets, not wait2)))
    # w4a16_matmul's default path (no tuned tables) is the CUDA GEMV (its default variant) wherever its plan says so
    from tests.kernels_helpers import planned_launch

    if planned_launch(monkeypatch, "a16", ("w4a16",), m, n, k, 0, dtype)[0] == "cuda.w4a16_gemv":
        assert torch.equal(w4a16_matmul(x, tensors, meta), w4a16_gemv_cuda(x, tensors, meta))


def test_split_k_inside_a_graph_owns_its_slots_and_shares_fixed_tickets():
    """Under graph_owned_scratch (the custom ops' calls, which CUDA graphs capture) split launches take fresh slots
    and the device's one fixed ticket array: nothing is cached or grown there, the bits equal an eager call's, and
    the tickets are back at zero."""
    from quantkit.runtime.kernels import scratch

    _, tensors, meta = packed("w4a16", 33, 1024, 128, seed=3)
    x = torch.randn(3, 1024, generator=torch.Generator().manual_seed(0)).half().to(DEVICE)
    eager = w4a16_matmul(x, tensors, meta, TileConfig(16, 16, 4))
    scratch._WORKSPACES.clear()
    with scratch.graph_owned_scratch():
        graphed = w4a16_matmul(x, tensors, meta, TileConfig(16, 16, 4))
    assert not scratch._WORKSPACES
    assert torch.equal(eager, graphed)
    tickets = scratch.reserve_graph_tickets(x.device)
    assert tickets.numel() == scratch.GRAPH_TICKET_CAPACITY and not tickets.any()
    with scratch.graph_owned_scratch(), pytest.raises(ValueError, match="tickets"):
        scratch.split_workspace(x.device, 1, 2, scratch.GRAPH_TICKET_CAPACITY + 1)
