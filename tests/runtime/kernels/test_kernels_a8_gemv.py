"""CUDA decode GEMV over int8 activation codes (quantkit.runtime.kernels.cuda.gemv_a8): W8A8, MixLLM W4A8 and the
one-launch mixed W4.4A8 against the torch reference over the same packed tensors, and the reasons it declines an
input (checked without a GPU)."""

from __future__ import annotations

import warnings

import pytest
import torch

from quantkit.formats import get_layout
from quantkit.quant import grid
from quantkit.quant.act import quantize_activation_int
from quantkit.runtime.kernels.reference import int8_reference
from tests.kernels_helpers import packed, poisoned, rel_err

TOL = 1e-3  # fp16 output rounding; the sums are exact integers times fp32 scales


def _gpu_ok() -> bool:
    from quantkit.runtime.kernels.cuda.common import cupy_available

    return torch.cuda.is_available() and cupy_available()


def _acts(m: int, k: int, act_group: int, seed: int, device: str = "cuda"):
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(seed)) * 3
    codes, scales = quantize_activation_int(x, 8, act_group)
    return codes.to(device), scales.float().to(device)


def test_a8_gemv_declines_inputs_it_cannot_read():
    """Shape, layout, group, dtype, layout-of-memory and device reasons, checked on the CPU in the order
    a8_gemv_problem takes them (the CUDA ones come last)."""
    from quantkit.runtime.kernels.cuda.gemv_a8 import a8_gemv_problem

    codes, scales = _acts(2, 512, 128, 0, "cpu")
    _, t8, meta8 = packed("w8", 40, 512, sym=True)
    _, t4, meta4 = packed("w4a16", 24, 512)
    part8, part4 = ("w8", t8, meta8, None), ("w4a16", t4, meta4, None)
    _, tl, metal = packed("w4a8-lqq", 8, 512)

    def problem(c=codes, s=scales, group=128, parts=(part8,), dtype=torch.float16, out=None):
        return a8_gemv_problem(c, s, group, list(parts), dtype, out)

    assert "outside 1..16" in problem(c=codes[:0], s=scales[:0])
    big, big_s = _acts(17, 512, 128, 0, "cpu")
    assert "outside 1..16" in problem(c=big, s=big_s)
    assert "3 partitions" in problem(parts=(part8, part4, part4))
    assert "reference" in problem(parts=(part4, ("reference", tl, metal, None)))
    short, short_s = _acts(2, 384, 128, 0, "cpu")
    assert "multiple of 256" in problem(c=short, s=short_s)
    assert "multiple of 128" in problem(group=64)
    assert "weight group size 192" in problem(parts=(("w8", t8, {**meta8, "group_size": 192}, None),))
    assert "fp16/bf16" in problem(dtype=torch.float32)
    wide = torch.zeros(2, 520, dtype=torch.int8)
    assert "16-byte aligned" in problem(c=wide[:, :512])
    assert "float32" in problem(s=scales.double())
    assert "unit column stride" in problem(out=torch.empty(40, 2).half().t())
    t_strided = {**t8, "qweight": t8["qweight"].t().contiguous().t()}
    assert "contiguous" in problem(parts=(("w8", t_strided, meta8, None),))
    assert "int32" in problem(parts=(("w8", t8, meta8, torch.arange(40)),))
    assert "CUDA device" in problem(parts=(("w8", t8, meta8, torch.arange(40, dtype=torch.int32)), part4))


def test_a8_gemv_cuda_refuses_bad_groups_and_shapes():
    """Direct callers get a ValueError before anything reaches the GPU."""
    from quantkit.runtime.kernels.cuda.gemv_a8 import a8_gemv_cuda

    codes, scales = _acts(2, 512, 128, 0, "cpu")
    _, t8, meta8 = packed("w8", 40, 512, sym=True)
    with pytest.raises(ValueError, match="multiple of 128"):
        a8_gemv_cuda(codes, scales, 64, [("w8", t8, meta8, None)], 40)
    with pytest.raises(ValueError, match="1 or 2 partitions"):
        a8_gemv_cuda(codes, scales, 128, [("w8", t8, meta8, None)] * 3, 120)
    with pytest.raises(ValueError, match="in_features"):
        a8_gemv_cuda(codes[:, :256], scales[:, :2], 128, [("w8", t8, meta8, None)], 40)
    with pytest.raises(ValueError, match="token_sets"):
        a8_gemv_cuda(codes, scales, 128, [("w8", t8, meta8, None)], 40, token_sets=3)


def test_decode_dispatch_rules():
    """The measured launch rules keep their shape: the A8 GEMV never past M = 16 and above M = 8 only for 8-bit
    weights on layers up to 8192 rows; at M = 5-8 mixed layers up to N = 16384, 4-bit ones up to 8192, and
    LiquidQuant only with short rows; the W4A16 GEMV takes M <= 8 everywhere and nothing above."""
    from quantkit.runtime.kernels.cuda.gemv import cuda_gemv_preferred, default_variant
    from quantkit.runtime.kernels.cuda.gemv_a8 import a8_gemv_preferred, a8_token_sets

    assert a8_gemv_preferred(1, 28672, 4096) and not a8_gemv_preferred(17, 4096, 4096, layouts=("w8",))
    assert a8_gemv_preferred(8, 28672, 4096, layouts=("w8",))
    assert not a8_gemv_preferred(16, 14336, 4096, layouts=("w8",))
    assert a8_gemv_preferred(16, 6144, 4096, layouts=("w8",))
    assert not a8_gemv_preferred(8, 14336, 4096, layouts=("w4a16",))
    assert a8_gemv_preferred(8, 4096, 14336, layouts=("w4a16",))
    assert a8_gemv_preferred(8, 14336, 4096, mixed=True, layouts=("w4a16", "w8"))
    assert not a8_gemv_preferred(8, 28672, 4096, mixed=True, layouts=("w4a16", "w8"))
    assert not a8_gemv_preferred(12, 4096, 4096, mixed=True, layouts=("w4a16", "w8"))
    assert a8_gemv_preferred(8, 6144, 4096, layouts=("w4a8-lqq",))
    assert not a8_gemv_preferred(8, 4096, 14336, layouts=("w4a8-lqq",))
    assert a8_gemv_preferred(4, 4096, 14336, layouts=("w4a8-lqq",))
    assert a8_gemv_preferred(4, 28672, 4096, layouts=("w4a8-lqq",))  # since PDL (lqq_gemv_wide_h100.json)
    assert not a8_gemv_preferred(5, 14336, 4096, layouts=("w4a8-lqq",))
    assert not a8_gemv_preferred(16, 6144, 4096, layouts=("w4a8-lqq",))  # Triton's one product per tile wins
    assert a8_token_sets(6144, 16) == 2 and a8_token_sets(4096, 16) == 1 and a8_token_sets(14336, 8) == 1
    assert cuda_gemv_preferred(8, 28672, 4096) and not cuda_gemv_preferred(16, 14336, 4096)
    assert not cuda_gemv_preferred(9, 4096, 4096) and not cuda_gemv_preferred(0, 4096, 4096)
    assert default_variant(6144, 4096, 16).token_sets == 2 and default_variant(6144, 4096, 8).token_sets == 1


def test_decode_gemv_warps_and_wait_rules():
    """Session 13's measured GEMV rules: 4 warps again above 16384 rows (2 from 8193 to 16384, as the A8 GEMV),
    and the wait for the previous grid after two weight tiles at decode sizes — for the W4A16 GEMV only on layers
    of <= 8192 rows and columns, for the A8 GEMV on all."""
    from quantkit.runtime.kernels.cuda.gemv import cuda_gemv_warps, default_variant
    from quantkit.runtime.kernels.cuda.gemv_a8 import a8_kernel_name, a8_wait_after_two, a8_warps

    assert [cuda_gemv_warps(n, 4096) for n in (1024, 4096, 6144, 8192, 14336, 16384, 24576, 28672)] == \
        [8, 8, 4, 4, 2, 2, 4, 4]
    assert all(cuda_gemv_warps(n, 4096) == a8_warps(n) for n in (1024, 6144, 14336, 24576, 37888))
    assert default_variant(4096, 4096, 1).wait_after_two and default_variant(6144, 4096, 8).wait_after_two
    assert default_variant(3584, 3584, 1).wait_after_two and default_variant(1024, 4096, 4).wait_after_two
    assert not default_variant(14336, 4096, 1).wait_after_two and not default_variant(4096, 14336, 1).wait_after_two
    assert not default_variant(8193, 4096, 1).wait_after_two and not default_variant(4096, 8448, 1).wait_after_two
    assert not default_variant(4096, 4096, 16).wait_after_two  # 16-token columns: not measured, the old wait
    assert default_variant(4096, 4096, 1).kernel_name(False) == "w4a16_gemv_mma<8, false, 128, 1, true>"
    assert a8_wait_after_two(6144, 4096, 8) and not a8_wait_after_two(6144, 4096, 9)
    assert a8_wait_after_two(14336, 4096, 1) and a8_wait_after_two(4096, 14336, 1)  # unlike the W4A16 GEMV
    assert a8_kernel_name(4, False, 2, 0, 1, True) == "a8_gemv<4, false, 2, 0, 1, true>"
    assert a8_kernel_name(8, True, 1, 1, 2) == "a8_gemv<8, true, 1, 1, 2, false>"


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("layout,m,n,k,group_size,act_group,warps,sets,wait2", [
    ("w8", 1, 33, 256, 128, 128, 2, 1, False), ("w8", 5, 1000, 2304, 128, -1, 4, 1, False),
    ("w8", 8, 4103, 1024, 256, 256, 8, 1, False), ("w8", 12, 65, 3840, 384, 128, 2, 1, False),
    ("w8", 12, 65, 3840, 384, 128, 4, 2, False), ("w8", 37, 40, 512, 128, -1, 2, 2, False),
    ("w4a16", 1, 33, 256, 128, 128, 2, 1, False), ("w4a16", 3, 1000, 2304, -1, 128, 4, 1, False),
    ("w4a16", 8, 4103, 1024, 256, -1, 8, 1, False), ("w4a16", 12, 65, 3840, 384, 384, 2, 1, False),
    ("w4a16", 2, 40, 7168, 128, 128, 4, 1, False), ("w4a16", 16, 257, 4096, 128, 128, 4, 2, False),
    ("w4a16", 13, 33, 2304, -1, -1, 8, 2, False),
    ("w4a8-lqq", 1, 33, 256, 128, -1, 2, 1, False), ("w4a8-lqq", 6, 1000, 2304, 256, 128, 4, 1, False),
    ("w4a8-lqq", 12, 257, 3840, 128, -1, 4, 2, False), ("w4a8-lqq", 16, 65, 1024, 384, 256, 8, 1, False),
    ("w8", 5, 1000, 2304, 128, -1, 4, 1, True), ("w4a16", 1, 33, 256, 128, 128, 8, 1, True),
    ("w4a16", 2, 40, 7168, 128, 128, 4, 1, True), ("w4a8-lqq", 6, 1000, 2304, 256, 128, 2, 1, True)])
def test_a8_gemv_matches_reference_on_gpu(layout, m, n, k, group_size, act_group, warps, sets, wait2, out_dtype):
    """W8A8, MixLLM W4A8 and LiquidQuant W4A8: odd N (a partial block), per-channel / 256- / 384-column weight
    groups, per-token and grouped activation scales, M past one launch column of 8 or 16 tokens (two 8-token sets
    sharing each weight fragment), every warp looping over several tiles (odd and even counts); wait2: the wait for
    the previous grid after two weight tiles (warps of no tile, three, five and seven)."""
    from quantkit.runtime.kernels.cuda.gemv_a8 import a8_gemv_cuda

    _, tensors, meta = packed(layout, n, k, group_size, seed=m + n, sym=layout == "w8")
    codes, scales = _acts(m, k, act_group, seed=k + m)
    ref = int8_reference(codes, scales, act_group, layout, tensors, meta)
    out = a8_gemv_cuda(codes, scales, act_group, [(layout, tensors, meta, None)], n, out_dtype,
                       out=poisoned(m, n, out_dtype), warps=warps, token_sets=sets, wait_after_two=wait2)
    assert rel_err(out, ref) < (TOL if out_dtype == torch.float16 else 8e-3)
    # the wait's place changes no arithmetic: the other placement gives the same bits
    assert torch.equal(out, a8_gemv_cuda(codes, scales, act_group, [(layout, tensors, meta, None)], n, out_dtype,
                                         warps=warps, token_sets=sets, wait_after_two=not wait2))
    from quantkit.runtime.kernels.cuda.gemv_a8 import a8_gemv_preferred

    if a8_gemv_preferred(m, n, k, layouts=(layout,)):  # int8_matmul's default path at decode sizes is this kernel
        from quantkit.runtime.kernels.gemm import int8_matmul

        default = a8_gemv_cuda(codes, scales, act_group, [(layout, tensors, meta, None)], n, out_dtype)
        assert torch.equal(int8_matmul(codes, scales, act_group, layout, tensors, meta, out_dtype), default)


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu_ok(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("m,n,k,act_group,order,sets,out_dtype,gs8", [
    (1, 70, 512, 128, "w8-first", 1, torch.float16, 128), (4, 300, 2304, -1, "w4-first", 1, torch.float16, 128),
    (8, 1030, 4096, 128, "w4-first", 1, torch.float16, 128), (16, 300, 2304, 128, "w8-first", 1, torch.float16, 128),
    (16, 300, 2304, 128, "w4-first", 2, torch.bfloat16, 256), (11, 130, 1024, -1, "w8-first", 2, torch.float16, -1)])
def test_mixed_a8_gemv_scatters_both_partitions_on_gpu(m, n, k, act_group, order, sets, out_dtype, gs8):
    """A W4.4A8 layer in one launch: every third row (a partial 16-row block of them) at 8 bits, the rest asym
    4-bit, output columns scattered through each partition's row map into an output whose rows are wider than
    the layer; 8- or 16-token launch columns, fp16 or bf16, the 8-bit rows with their own group size; the Triton
    one-launch kernel agrees."""
    from quantkit.runtime.kernels.cuda.gemv_a8 import a8_gemv_cuda, a8_gemv_preferred
    from quantkit.runtime.kernels.gemm import mixed_int8_matmul

    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n))
    rows8 = torch.arange(1, n, 3)
    rows4 = torch.tensor(sorted(set(range(n)) - set(rows8.tolist())))
    codes, scales = _acts(m, k, act_group, seed=m)
    parts, ref = [], torch.empty(m, n, dtype=torch.float64)
    for layout, qw, rows in (("w4a16", grid.quantize(w[rows4], 4, 128), rows4),
                             ("w8", grid.quantize(w[rows8], 8, gs8, sym=True), rows8)):
        lay = get_layout(layout)
        tensors = {key: t.cuda() for key, t in lay.pack(qw).items()}
        parts.append((layout, tensors, lay.layout_meta(qw), rows.to(torch.int32).cuda()))
        ref[:, rows] = int8_reference(codes, scales, act_group, layout, tensors, lay.layout_meta(qw)).cpu()
    if order == "w8-first":
        parts.reverse()
    wide = poisoned(m, n + 24, out_dtype)
    out = a8_gemv_cuda(codes, scales, act_group, parts, n, out_dtype, out=wide[:, :n], token_sets=sets)
    tol = TOL if out_dtype == torch.float16 else 8e-3
    assert rel_err(out, ref) < tol and torch.isnan(wide[:, n:]).all()  # the padding columns stay untouched
    triton = mixed_int8_matmul(codes, scales, act_group, parts, n, out_dtype, bn_b=16)  # bn_b: the Triton kernel
    assert rel_err(out, triton) < tol
    default = mixed_int8_matmul(codes, scales, act_group, parts, n, out_dtype)
    if a8_gemv_preferred(m, n, k, mixed=True, layouts=tuple(p[0] for p in parts)):  # the default path is the GEMV
        assert torch.equal(default, a8_gemv_cuda(codes, scales, act_group, parts, n, out_dtype))
    else:
        assert rel_err(default, ref) < tol


def test_kernel_params_point_at_typed_values():
    """The void** array cuLaunchKernelEx takes: one pointer per argument, to a value of the argument's C type."""
    import ctypes

    import numpy as np

    from quantkit.runtime.kernels.cuda.common import _LaunchAttribute, _LaunchConfig, kernel_params

    params, values = kernel_params((np.uint64(2 ** 40 + 3), np.int32(-7), np.int64(-2 ** 35)))
    assert [type(v) for v in values] == [ctypes.c_uint64, ctypes.c_int32, ctypes.c_int64]
    assert ctypes.cast(params[1], ctypes.POINTER(ctypes.c_int32)).contents.value == -7
    assert ctypes.cast(params[0], ctypes.POINTER(ctypes.c_uint64)).contents.value == 2 ** 40 + 3
    with pytest.raises(TypeError, match="NumPy"):
        kernel_params((3,))
    # CUlaunchConfig / CUlaunchAttribute as cuda.h lays them out on 64-bit hosts
    assert (ctypes.sizeof(_LaunchConfig), _LaunchConfig.stream.offset, ctypes.sizeof(_LaunchAttribute)) == (56, 32, 72)


def test_pdl_form_that_does_not_compile_falls_back_to_the_plain_form(monkeypatch):
    """launch_form: where programmatic dependent launch applies it compiles the QK_PDL source; if that fails (an
    NVRTC below sm_90 hits its #error) the plain form runs, launched the ordinary way, and PDL stays off for the
    device in this process, with one warning; QUANTKIT_PDL=0 never tries."""
    from quantkit.runtime.kernels.cuda import common as cuda_common

    monkeypatch.setattr(cuda_common, "_PDL_OFF", {})
    monkeypatch.setattr(cuda_common, "_PDL_FORM_FAILED", set())
    monkeypatch.setattr(cuda_common, "_pdl_device", lambda dev: True)
    compiled = []

    def fake_compiled(dev, source, name):
        compiled.append(source.startswith(cuda_common.PDL_DEFINE))
        if source.startswith(cuda_common.PDL_DEFINE):
            raise RuntimeError("#error programmatic dependent launch needs sm_90 code")
        return f"plain {name}"
    monkeypatch.setattr(cuda_common, "compiled", fake_compiled)
    monkeypatch.delenv(cuda_common.PDL_SWITCH, raising=False)
    assert cuda_common.pdl_supported(0)
    with pytest.warns(RuntimeWarning, match="griddepcontrol form did not compile"):
        assert cuda_common.launch_form(0, "src", "k") == ("plain k", False)
    assert not cuda_common.pdl_supported(0) and "did not compile" in cuda_common.pdl_off_reason(0)
    assert cuda_common.launch_form(0, "src", "k") == ("plain k", False) and compiled == [True, False, False]
    monkeypatch.setattr(cuda_common, "_PDL_OFF", {})
    monkeypatch.setattr(cuda_common, "_PDL_FORM_FAILED", set())
    monkeypatch.setenv(cuda_common.PDL_SWITCH, "0")
    assert not cuda_common.pdl_supported(0)
    assert cuda_common.launch_form(0, "src", "k") == ("plain k", False) and compiled[-1] is False

    def nothing_compiles(dev, source, name):
        raise RuntimeError(f"nvrtc: {source[:9]}")
    monkeypatch.delenv(cuda_common.PDL_SWITCH)
    monkeypatch.setattr(cuda_common, "compiled", nothing_compiles)
    with pytest.raises(RuntimeError, match="nvrtc: src"):  # the plain form's error; PDL is not blamed
        cuda_common.launch_form(0, "src", "k")
    assert cuda_common.pdl_off_reason(0) is None


def test_launch_error_paths(monkeypatch):
    """cuda_common.launch without a GPU (CuPy and the driver call stubbed): success needs no ordinary launch; a
    refused attribute launches the ordinary way and turns PDL off only when that launch works; other driver errors
    raise; an empty grid never takes the attribute path."""
    import contextlib
    import sys
    import types

    from quantkit.runtime.kernels.cuda import common as cuda_common

    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(Device=lambda i: contextlib.nullcontext()))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setattr(cuda_common, "stream", lambda dev, handle: contextlib.nullcontext())
    monkeypatch.setattr(cuda_common, "_pdl_device", lambda dev: True)
    monkeypatch.setattr(cuda_common, "_PDL_OFF", {})
    monkeypatch.delenv(cuda_common.PDL_SWITCH, raising=False)
    result = {"err": 0}
    ex_calls, plain_calls, shared = [], [], []
    monkeypatch.setattr(cuda_common, "_cu_launch_kernel_ex",
                        lambda: lambda cfg, f, params, extra: ex_calls.append(f) or shared.append(
                            cfg._obj.shared_bytes) or result["err"])

    class Fn:
        kernel = types.SimpleNamespace(ptr=1234)
        fail = False

        def __call__(self, grid, block, args, shared_mem=0):
            plain_calls.append(grid)
            shared.append(shared_mem)
            if self.fail:
                raise ValueError("bad launch arguments")

    import numpy as np

    fn, args = Fn(), (np.int32(1),)
    cuda_common.launch(fn, True, 0, 0, (4, 1), (128,), args)
    assert ex_calls == [1234] and plain_calls == []
    result["err"] = 999
    with pytest.raises(RuntimeError, match="CUresult 999"):
        cuda_common.launch(fn, True, 0, 0, (4, 1), (128,), args)
    result["err"] = 1
    fn.fail = True
    with pytest.raises(ValueError, match="bad launch"):
        cuda_common.launch(fn, True, 0, 0, (4, 1), (128,), args)
    assert cuda_common.pdl_off_reason(0) is None
    fn.fail = False
    ex_calls.clear(), plain_calls.clear()
    cuda_common.launch(fn, True, 0, 0, (0, 1), (128,), args)   # empty grid: the ordinary launch reports it
    assert ex_calls == [] and plain_calls == [(0, 1)]
    with pytest.warns(RuntimeWarning, match="refused"):
        cuda_common.launch(fn, True, 0, 0, (4, 1), (128,), args)
    assert "CUDA_ERROR_INVALID_VALUE" in cuda_common.pdl_off_reason(0) and plain_calls[-1] == (4, 1)
    ex_calls.clear()
    cuda_common.launch(fn, True, 0, 0, (4, 1), (128,), args)   # off now: ordinary launches only
    assert ex_calls == [] and plain_calls[-1] == (4, 1)
    # dynamic shared memory reaches both launch forms
    shared.clear()
    cuda_common.launch(fn, False, 0, 0, (4, 1), (128,), args, shared_mem=70000)
    monkeypatch.setattr(cuda_common, "_PDL_OFF", {})
    result["err"] = 0
    cuda_common.launch(fn, True, 0, 0, (4, 1), (128,), args, shared_mem=90000)
    assert shared == [70000, 90000]


@pytest.mark.skipif(not _gpu_ok(), reason="needs a CUDA GPU and CuPy")
@pytest.mark.parametrize("layout,group", [("w4a8-lqq", -1), ("w4a16", 128)])
def test_programmatic_launch_after_the_quantizer_gives_the_same_bits(monkeypatch, layout, group):
    """Quantizer + A8 GEMV (and W4A16 GEMV after it) with programmatic dependent launch, eagerly and replayed from
    a CUDA graph, equal the ordinary launches bit for bit (on GPUs before Hopper both are ordinary)."""
    from quantkit.runtime.kernels.cuda import common as cuda_common
    from quantkit.runtime.kernels.triton.act_quant import quantize_activation_triton
    from quantkit.runtime.kernels.cuda.gemv import cuda_gemv_problem, w4a16_gemv_cuda
    from quantkit.runtime.kernels.cuda.gemv_a8 import a8_gemv_cuda

    # K = 4096: two weight tiles per warp of the A8 GEMV (8 warps) and the W4A16 one (2 warps), so both load their
    # second tile before the wait where the rule says so
    _, t, meta = packed(layout, 4096, 4096, seed=3)
    t = {k: v.cuda() for k, v in t.items()}
    _, t16, meta16 = packed("w4a16", 520, 4096, seed=4)
    t16 = {k: v.cuda() for k, v in t16.items()}
    x = torch.randn(3, 4096, device="cuda").half()

    def step(inp):
        a, s = quantize_activation_triton(inp, 8, group)
        y = a8_gemv_cuda(a, s, group, [(layout, t, meta, None)], 4096)
        return w4a16_gemv_cuda(y, t16, meta16)

    assert cuda_gemv_problem(torch.zeros(3, 4096, device="cuda").half(), t16, meta16) is None
    hopper = torch.cuda.get_device_capability() >= (9, 0)
    results = {}
    for pdl in ("1", "0"):
        monkeypatch.setenv(cuda_common.PDL_SWITCH, pdl)
        assert cuda_common.pdl_supported(torch.cuda.current_device()) == (hopper and pdl == "1")
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # a refused attribute launch would warn and fall back
            eager = step(x)
        static = x.clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step(static)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = step(static)
        static.copy_(x * 2)
        graph.replay()
        torch.cuda.synchronize()
        results[pdl] = (eager, out.clone(), step(x * 2))
        assert cuda_common.pdl_off_reason(torch.cuda.current_device()) is None
    for a, b in zip(results["1"], results["0"]):
        assert torch.equal(a, b)
    assert torch.equal(results["1"][1], results["1"][2])  # the graph re-quantized the new input
