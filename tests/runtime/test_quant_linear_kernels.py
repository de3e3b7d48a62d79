"""QuantLinear on the kernel path (Triton's CPU interpreter here, the GPU where there is one): a mixed-precision
layer runs the one-launch W4.4A8 kernel (MixLLM Sec. 3.4) or, where that does not apply, per-partition sub-GEMMs
— in every case the activation is quantized exactly once per forward and the result agrees with the torch
reference forward (QUANTKIT_KERNELS=0) to 1e-3 relative; kernels that do not quantize activations still get
fake-quantized ones."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from quantkit.formats import get_layout  # noqa: E402
from quantkit.quant import grid  # noqa: E402
from quantkit.quant.act import quantize_activation  # noqa: E402
from quantkit.runtime import ActQuant, PackedPart, QuantLinear, dispatch  # noqa: E402
from quantkit.runtime.kernels import entry  # noqa: E402
from quantkit.runtime.kernels.triton.int8_gemm import MODES  # noqa: E402
from tests.kernels_helpers import DEVICE, packed, rel_err  # noqa: E402

TOL = 1e-3
ROWS8 = (1, 4, 17, 30)  # the 8-bit output channels of the 33-row test layers (~12 %)
A8G = ActQuant(8, 128)
A8T = ActQuant(8, -1)


@pytest.fixture
def kernels_on(monkeypatch):
    """The kernel entries registered for DEVICE (CPU: the Triton interpreter) in a private copy of the registry,
    so the test sees exactly these and leaves the real registry as it was."""
    monkeypatch.delenv(dispatch.ENV_SWITCH, raising=False)
    monkeypatch.setattr(dispatch, "_KERNELS", dict(dispatch._KERNELS))
    monkeypatch.setattr(dispatch, "_MIXED", dict(dispatch._MIXED))
    for layout in MODES:
        dispatch.register(layout, entry.layout_kernel(layout), quantizes_activations=True, shared_activation=True,
                          devices=(DEVICE,))
    dispatch.register_mixed(entry.mixed_kernel, entry.mixed_supported, devices=(DEVICE,))


@pytest.fixture
def counts(monkeypatch):
    """Calls per forward of the two activation quantizers (int8 codes for the kernels, fake-quant) and of the
    int8 GEMM launchers."""
    calls = {"a8": 0, "fake": 0, "int8_matmul": 0, "mixed_int8_matmul": 0}

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapper

    monkeypatch.setattr(entry, "quantize_for_kernel", counted("a8", entry.quantize_for_kernel))
    monkeypatch.setattr(dispatch, "quantize_activation", counted("fake", dispatch.quantize_activation))
    monkeypatch.setattr(entry, "int8_matmul", counted("int8_matmul", entry.int8_matmul))
    monkeypatch.setattr(entry, "mixed_int8_matmul", counted("mixed_int8_matmul", entry.mixed_int8_matmul))
    return calls


def _mixed_linear(four_layout: str, k: int, act: ActQuant | None, eight_layout: str = "w8",
                  n: int = 33, seed: int = 0) -> QuantLinear:
    """A QuantLinear [n, k] with rows ROWS8 in ``eight_layout`` (8-bit symmetric g128), the rest 4-bit in
    ``four_layout``, a bias, activations ``act``, on DEVICE."""
    rows8 = torch.tensor(ROWS8)
    rows4 = torch.tensor([r for r in range(n) if r not in ROWS8])
    parts = []
    for layout, rows, bits in ((four_layout, rows4, 4), (eight_layout, rows8, 8)):
        if layout in MODES:
            qw, tensors, meta = packed(layout, len(rows), k, 128, seed=seed + bits)
        else:
            qw = grid.quantize(torch.randn(len(rows), k, generator=torch.Generator().manual_seed(seed)), bits, 128,
                               sym=True)
            lay = get_layout(layout)
            tensors, meta = {key: t.to(DEVICE) for key, t in lay.pack(qw).items()}, lay.layout_meta(qw)
        parts.append(PackedPart(layout, meta, tensors, rows.to(torch.int32).to(DEVICE), qw.bits))
    bias = torch.randn(n, generator=torch.Generator().manual_seed(seed + 1)).half().to(DEVICE)
    return QuantLinear(k, n, parts, bias=bias, act=act)


def _x(shape: tuple[int, ...], seed: int = 3) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2).half().to(DEVICE)


def _reference(ql: QuantLinear, x: torch.Tensor, monkeypatch) -> torch.Tensor:
    """QuantLinear's torch reference forward (every kernel switched off by QUANTKIT_KERNELS=0)."""
    with monkeypatch.context() as m:
        m.setenv(dispatch.ENV_SWITCH, "0")
        return ql(x)


@pytest.mark.parametrize("four_layout,act,k,shape", [
    ("w4a16", A8G, 328, (1, 328)),          # MixLLM W4.4A8: asymmetric 4-bit + 8-bit rows, A8 g128
    ("w4a16", A8T, 200, (3, 200)),
    ("w4a8-lqq", A8T, 328, (1, 3, 328)),    # LiquidQuant 4-bit + 8-bit rows, A8 per token
    ("w4a8-lqq", A8G, 200, (3, 200)),
])
def test_mixed_layer_is_one_launch_with_one_quantization(kernels_on, counts, monkeypatch, four_layout, act, k,
                                                         shape):
    ql = _mixed_linear(four_layout, k, act)
    x = _x(shape)
    y = ql(x)
    assert counts == {"a8": 1, "fake": 0, "int8_matmul": 0, "mixed_int8_matmul": 1}
    assert y.shape == (*shape[:-1], 33) and y.dtype == torch.float16
    assert rel_err(y, _reference(ql, x, monkeypatch)) < TOL


@pytest.mark.parametrize("case", ["no one-launch kernel", "A8 g64", "8-bit rows without kernel"])
def test_mixed_layer_sub_gemms_share_one_quantization(kernels_on, counts, monkeypatch, case):
    """Where the one-launch kernel does not apply, each partition runs its own sub-GEMM on the same quantized
    activation: int8 codes for both int8 kernels; fake-quant for A8 groups the int8 kernels do not take; the int8
    codes (dequantized) for a partition in a layout without kernel ('reference')."""
    eight_layout, act, want = "w8", A8G, {"a8": 1, "fake": 0, "int8_matmul": 2, "mixed_int8_matmul": 0}
    if case == "no one-launch kernel":
        dispatch.unregister_mixed(devices=(DEVICE,))
    elif case == "A8 g64":
        act, want = ActQuant(8, 64), {"a8": 0, "fake": 1, "int8_matmul": 0, "mixed_int8_matmul": 0}
    else:
        eight_layout, want = "reference", {"a8": 1, "fake": 0, "int8_matmul": 1, "mixed_int8_matmul": 0}
    ql = _mixed_linear("w4a16", 328, act, eight_layout=eight_layout)
    x = _x((3, 328))
    y = ql(x)
    assert counts == want
    assert rel_err(y, _reference(ql, x, monkeypatch)) < TOL


def test_a8_codes_stand_in_for_fake_quant_bit_exactly():
    """The fake-quant form derived from the kernels' int8 codes equals quantize_activation's, bit for bit."""
    for group_size, k in ((128, 328), (-1, 200)):
        x = _x((3, k), seed=k)
        shared = dispatch.SharedActivation(x, ActQuant(8, group_size))
        entry.a8_activation(shared)
        assert torch.equal(shared.fake_quant(), quantize_activation(x, 8, group_size, True))
        assert shared.computed() == ["a8", dispatch.FAKE_FORM]


def test_kernel_without_own_quantization_gets_fake_quantized_activations(monkeypatch, kernel_registry):
    """A kernel registered with quantizes_activations=False receives act(x), quantized once for all partitions."""
    kernel_registry._MIXED.clear()
    seen = []

    def plain(x, tensors, meta, act):
        seen.append(x.clone())
        return F.linear(x, grid.dequantize(get_layout("reference").unpack(tensors, meta), x.dtype))

    dispatch.register("reference", plain, devices=("cpu",))
    fake_calls = []
    real = dispatch.quantize_activation
    monkeypatch.setattr(dispatch, "quantize_activation", lambda *a: fake_calls.append(1) or real(*a))
    parts = []
    for bits, rows in ((4, torch.tensor([0, 2, 3, 5, 6])), (8, torch.tensor([1, 4]))):
        qw = grid.quantize(torch.randn(len(rows), 200), bits, 128, sym=bits == 8)
        lay = get_layout("reference")
        parts.append(PackedPart("reference", lay.layout_meta(qw), lay.pack(qw), rows.to(torch.int32), bits))
    act = ActQuant(8, 128)
    ql = QuantLinear(200, 7, parts, act=act)
    x = torch.randn(2, 3, 200)
    y = ql(x)
    xq = quantize_activation(x, 8, 128, True).reshape(6, 200)
    assert len(seen) == 2 and all(torch.equal(s, xq) for s in seen)
    assert len(fake_calls) == 1
    assert torch.allclose(y, _reference(ql, x, monkeypatch), rtol=1e-5, atol=1e-5)
