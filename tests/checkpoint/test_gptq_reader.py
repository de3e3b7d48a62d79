"""An independent GPTQ / AWQ checkpoint reader, written from the published format descriptions (GPTQ:
danieldk.eu/GPTQ-Checkpoint-Format and the AutoGPTQ packing it documents; AWQ: AutoAWQ's GEMM packing order),
in numpy with explicit shifts — it shares no code with quantkit.formats. Reading what our packers wrote must give
exactly grid.dequantize of the original record, for plain and act-order (desc_act) GPTQ weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from quantkit.formats import get_layout
from quantkit.quant import grid
from quantkit.quant.records import QuantizedWeight

SHAPES = [(7, 200), (33, 328)]
AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble i of a word holds output column 8j + AWQ_ORDER[i]


def as_u32(t: torch.Tensor) -> np.ndarray:
    return t.numpy().view(np.uint32).astype(np.int64)


def gptq_unpack_rows(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Codes along dim 0 of a GPTQ-packed int32 array [rows, cols] → [count, cols].
    2/4/8 bits: code i sits at bits (i mod 32/b)·b of row i div (32/b).
    3 bits: every 3 rows form one 96-bit little-endian integer of 32 codes (bits 3j..3j+2 for code j)."""
    mask = (1 << bits) - 1
    if 32 % bits == 0:
        per = 32 // bits
        i = np.arange(count)
        return (packed[i // per, :] >> ((i % per) * bits)[:, None]) & mask
    out = np.zeros((count, packed.shape[1]), dtype=np.int64)
    for block in range(packed.shape[0] // 3):
        for col in range(packed.shape[1]):
            big = (int(packed[3 * block, col]) | int(packed[3 * block + 1, col]) << 32
                   | int(packed[3 * block + 2, col]) << 64)
            for j in range(32):
                if 32 * block + j < count:
                    out[32 * block + j, col] = (big >> (3 * j)) & 7
    return out


def read_gptq(tensors: dict, bits: int, n: int, k: int, v1: bool) -> torch.Tensor:
    """W [N, K] float32 = scales[g_idx[k], n] · (q[k, n] - zero[g_idx[k], n]); v1 zeros are stored minus 1."""
    q = gptq_unpack_rows(as_u32(tensors["qweight"]), bits, k)  # [K, N]
    z = gptq_unpack_rows(as_u32(tensors["qzeros"]).T, bits, n).T  # packed along N → [G, N]
    if v1:
        z = z + 1
    g_idx = tensors["g_idx"].numpy().astype(np.int64)
    s = tensors["scales"].numpy().astype(np.float32)
    w = s[g_idx, :] * (q.astype(np.float32) - z[g_idx, :].astype(np.float32))
    return torch.from_numpy(np.ascontiguousarray(w.T))


def read_awq(tensors: dict, group_size: int, n: int, k: int) -> torch.Tensor:
    """W [N, K] float32 from AutoAWQ GEMM tensors (4-bit, interleaved nibbles, zeros stored as they are)."""
    def unpack(words: np.ndarray) -> np.ndarray:
        out = np.zeros((words.shape[0], words.shape[1] * 8), dtype=np.int64)
        for i, col in enumerate(AWQ_ORDER):
            out[:, col::8] = (words >> (4 * i)) & 0xF
        return out[:, :n]

    q, z = unpack(as_u32(tensors["qweight"])), unpack(as_u32(tensors["qzeros"]))
    g = np.arange(k) // (k if group_size == -1 else group_size)
    s = tensors["scales"].numpy().astype(np.float32)
    w = s[g, :] * (q.astype(np.float32) - z[g, :].astype(np.float32))
    return torch.from_numpy(np.ascontiguousarray(w.T))


def act_order_record(w: torch.Tensor, bits: int, group_size: int, sym: bool,
                     seed: int) -> tuple[QuantizedWeight, torch.Tensor]:
    """A GPTQ desc_act record: groups of consecutive columns in a random sweep order, stored in the original
    column order with g_idx[k] = (sweep position of k) // group_size; also the weights as quantized in sweep
    order, mapped back to the original column order."""
    k = w.shape[1]
    perm = torch.randperm(k, generator=torch.Generator().manual_seed(seed))
    inv = torch.argsort(perm)
    swept = grid.quantize(w[:, perm], bits, group_size, sym)
    qw = QuantizedWeight(codes=swept.codes[:, inv].contiguous(), scales=swept.scales, zeros=swept.zeros,
                         bits=bits, group_size=group_size, sym=sym, g_idx=(inv // group_size).to(torch.int32))
    return qw, grid.dequantize(swept)[:, inv]


@pytest.mark.parametrize("name", ["gptq", "gptq_v2"])
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("sym", [False, True])
@pytest.mark.parametrize("act_order", [False, True])
def test_independent_gptq_reader_matches_dequantize(name, bits, n, k, sym, act_order):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(bits * 7 + n + k))
    if act_order:
        qw, swept_weights = act_order_record(w, bits, 128, sym, seed=k)
    else:
        qw = grid.quantize(w, bits, 128, sym)
    tensors = get_layout(name).pack(qw)
    got = read_gptq(tensors, bits, n, k, v1=(name == "gptq"))
    assert torch.equal(got, grid.dequantize(qw))
    if act_order:
        assert torch.equal(got, swept_weights)  # the weights the sweep-order quantization produced


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("group_size", [128, 64, -1])
@pytest.mark.parametrize("sym", [False, True])
def test_independent_awq_reader_matches_dequantize(n, k, group_size, sym):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k + group_size))
    qw = grid.quantize(w, 4, group_size, sym)
    tensors = get_layout("awq").pack(qw)
    assert torch.equal(read_awq(tensors, group_size, n, k), grid.dequantize(qw))


def test_reader_is_sensitive_to_the_zero_offset():
    """The +1 of GPTQ v1 matters: reading v1 tensors without it (as v2) moves every weight by one step."""
    w = torch.randn(7, 200, generator=torch.Generator().manual_seed(0))
    qw = grid.quantize(w, 4, 128, sym=False)
    tensors = get_layout("gptq").pack(qw)
    wrong = read_gptq(tensors, 4, 7, 200, v1=False)
    step = wrong - grid.dequantize(qw)
    assert torch.allclose(step, qw.scales[:, qw.group_index()])


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("sym", [False, True])
def test_gptq_quantizer_output_reads_back_as_the_swept_weights(act_order, sym):
    """End to end: quant.gptq's record, packed as a GPTQ checkpoint and read by the independent reader, gives
    exactly the weights GPTQ's error compensation used (GPTQResult.weight)."""
    from quantkit.quant.gptq import RowSpec, gptq_solve

    gen = torch.Generator().manual_seed(11)
    n, k = 33, 200
    w = torch.randn(n, k, generator=gen)
    x = torch.randn(256, k, generator=gen) * torch.rand(k, generator=gen) * 3
    result = gptq_solve(w, x.T @ x, [RowSpec(rows=None, bits=4, group_size=64, sym=sym)], act_order=act_order)
    qw = result.parts[0]
    assert (qw.g_idx is not None) == act_order
    for name in ("gptq", "gptq_v2"):
        layout = get_layout(name)
        reason = layout.supports(qw)
        if reason is not None:  # the 8-column tail group can be all-positive: zero point 0, v1 refuses
            assert name == "gptq" and not sym and "zero point 0" in reason
            continue
        got = read_gptq(layout.pack(qw), 4, n, k, v1=(name == "gptq"))
        assert torch.equal(got, result.weight)
