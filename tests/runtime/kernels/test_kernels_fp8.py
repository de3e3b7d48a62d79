"""FP8 W8A8 (the ``fp8`` layout and the ``fp8`` operation): the layout stores E4M3 weights bit-exactly, the packer
picks it for per-channel FP8 weights, the per-token codes are the fake-quant values exactly, every kernel of the
priority list computes the reference product (on a GPU: cuBLAS's FP8 GEMM), and a packed linear on the kernel path
matches the torch reference path to fp16 rounding."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402

from quantkit.errors import QuantkitError  # noqa: E402
from quantkit.formats import get_layout  # noqa: E402
from quantkit.quant import grid  # noqa: E402
from quantkit.quant.act import quantize_activation_fp8, quantize_activation_fp8_codes  # noqa: E402
from quantkit.runtime import ActQuant, PackedPart, QuantLinear, dispatch  # noqa: E402
from quantkit.runtime.kernels import fp8_gemm  # noqa: E402
from quantkit.runtime.kernels.registry import plan  # noqa: E402
from tests.kernels_helpers import DEVICE  # noqa: E402

CUDA = torch.cuda.is_available()
FP8_ACT = ActQuant(8, -1, True, fp8=True)


FP8_SUM_BOUND = 2.0 ** -12  # cuBLAS on an H200: at most 3.6e-5 (2^-14.8) of Σ|a·w| (assert_fp8_product)


def assert_fp8_product(got, codes, scales, tensors, want):
    """``got`` is the fp8 product ``want`` (:func:`fp8_gemm.fp8_reference`) up to its fp16 rounding plus
    FP8_SUM_BOUND · Σ_k |a_k·w_k| (scaled): Hopper's FP8 tensor cores add products at less than fp32 precision, so
    the error scales with the sum of magnitudes, not with the result (a near-zero sum of large terms is off by many
    of its own ulps). A wrong scale, operand or order of operands is off by the terms themselves."""
    mag = ((codes.double().abs() @ tensors["qweight"].double().abs().t()) * scales.double()
           * tensors["scales"].double().unsqueeze(0))
    err = (got.double() - want.double()).abs()
    ulp = 2.0 ** -10 if want.dtype == torch.float16 else 2.0 ** -7  # both sides rounded: one ulp of the result
    ratio = float(((err - ulp * want.double().abs()).clamp_min(0) / mag.clamp_min(1e-30)).max())
    assert ratio <= FP8_SUM_BOUND, f"error {ratio:.3g} of the sum of magnitudes"


def _weight(n: int, k: int, seed: int = 0):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05
    qw = grid.quantize_fp8(w, -1)
    lay = get_layout("fp8")
    return qw, {name: t.to(DEVICE) for name, t in lay.pack(qw).items()}, lay.layout_meta(qw)


@pytest.mark.parametrize("n,k", [(7, 200), (1, 1), (48, 4096), (33, 129)])
def test_the_fp8_layout_stores_weights_bit_exactly(n, k):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k)) * 2
    w[0, 0] = -0.0
    qw = grid.quantize_fp8(w, -1)
    lay = get_layout("fp8")
    tensors, meta = lay.pack(qw), lay.layout_meta(qw)
    assert tensors["qweight"].dtype == torch.float8_e4m3fn and tensors["scales"].dtype == torch.float32
    back = lay.unpack(tensors, meta)
    assert torch.equal(back.codes, qw.codes) and torch.equal(back.scales, qw.scales) and back.fp8
    assert torch.equal(grid.dequantize(back), grid.dequantize(qw))


def test_the_fp8_layout_takes_per_channel_fp8_weights_only():
    lay = get_layout("fp8")
    w = torch.randn(8, 256)
    assert "groups of 128" in lay.supports(grid.quantize_fp8(w, 128))
    assert "integer codes" in lay.supports(grid.quantize(w, 8, -1, sym=True))
    with pytest.raises(QuantkitError, match="layout 'fp8' cannot store this weight"):
        lay.pack(grid.quantize_fp8(w, 128))


def test_the_packer_picks_fp8_for_sm90_with_fp8_activations_only():
    from quantkit.checkpoint.choose import choose_layouts

    records = {"x.q_proj": grid.quantize_fp8(torch.randn(4, 64), -1)}
    said = []
    assert choose_layouts(records, "sm90", "quantkit", said.append, fp8_activations=True) == {"x.q_proj": ["fp8"]}
    assert not said
    for target, act in (("sm80", True), ("sm90", False)):  # no FP8 tensor cores / FP8 weights with 16-bit inputs
        assert choose_layouts(records, target, "quantkit", said.append, act) == {"x.q_proj": ["reference"]}
        assert "needs --target sm90 and FP8 activations" in said[-1]


def test_only_per_token_fp8_activations_count_as_the_fp8_gemms():
    from quantkit.checkpoint.choose import fp8_token_activations
    from quantkit.quant.recipe import load_recipe, parse_recipe

    weight = {"method": "rtn", "grid": "fp8", "bits": 8, "sym": True, "group_size": -1}
    assert fp8_token_activations(load_recipe("fp8-w8a8"))
    assert not fp8_token_activations(parse_recipe({"weight": weight}))  # FP8 weights, 16-bit activations
    assert not fp8_token_activations(parse_recipe({"weight": weight, "activation": {"bits": 8, "group_size": 128,
                                                                                    "fp8": True}}))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_fp8_codes_times_scales_are_the_fake_quant_values(dtype):
    x = (torch.randn(6, 300, generator=torch.Generator().manual_seed(3)) * 4).to(dtype)
    x[1] = 0
    x[2] = 1e-40
    codes, scales = quantize_activation_fp8_codes(x)
    assert codes.dtype == torch.float8_e4m3fn and scales.shape == (6, 1)
    assert torch.equal((codes.float() * scales).to(dtype), quantize_activation_fp8(x, -1))


@pytest.mark.parametrize("m,n,k", [(1, 48, 256), (5, 32, 4096), (16, 7, 200)])
def test_the_fp8_operation_computes_the_reference_product(m, n, k):
    _, tensors, meta = _weight(n, k)
    codes, scales = quantize_activation_fp8_codes(torch.randn(m, k, device=DEVICE, dtype=torch.float16))
    want = fp8_gemm.fp8_reference(codes, scales, tensors, torch.float16)
    exact = ((codes.double() @ tensors["qweight"].double().t()) * scales.double()
             * tensors["scales"].double().unsqueeze(0))
    torch.testing.assert_close(want.double(), exact, rtol=1e-3, atol=1e-5)  # one fp16 rounding of the exact value
    assert torch.equal(fp8_gemm.fp8_matmul(codes, scales, tensors, meta, kernel="torch.fp8"), want)
    assert_fp8_product(fp8_gemm.fp8_matmul(codes, scales, tensors, meta), codes, scales, tensors, want)


def test_the_plan_names_why_cublas_declines():
    from quantkit.runtime.kernels.gemm import device_name, toolchains
    from quantkit.runtime.kernels.registry import GemmProblem, device_traits

    cap, sms = device_traits(torch.device(DEVICE))
    p = GemmProblem("fp8", ("fp8",), 4, 7, 200, -1, torch.float16, cap, sms, toolchains(),
                    device_name(torch.device(DEVICE)))
    first = plan(p)[0]
    assert first.kernel.name == "cublas.scaled_mm" and not first.ok
    assert ("multiples of 16" if CUDA else "needs a CUDA GPU") in first.reason
    assert plan(p)[-1].kernel.name == "torch.fp8" and plan(p)[-1].ok


def test_the_cublas_form_of_the_product_on_the_cpu_build():
    """torch's CPU _scaled_mm takes the same operands: the layout's transpose, the row scales."""
    _, tensors, _ = _weight(48, 256)
    codes, scales = quantize_activation_fp8_codes(torch.randn(8, 256, dtype=torch.float16))
    cpu = {name: t.cpu() for name, t in tensors.items()}
    got = fp8_gemm.scaled_mm_fp8(codes.cpu(), scales.cpu(), cpu, torch.float16)
    torch.testing.assert_close(got.float(), fp8_gemm.fp8_reference(codes.cpu(), scales.cpu(), cpu,
                                                                   torch.float16).float(), rtol=2e-3, atol=1e-5)


def test_the_dispatch_entry_runs_fp8_activations_and_keeps_the_fake_quant_form():
    from quantkit.runtime.dispatch import SharedActivation
    from quantkit.runtime.kernels.entry import fp8_kernel

    _, tensors, meta = _weight(32, 256)
    x = torch.randn(3, 256, device=DEVICE, dtype=torch.float16)
    shared = SharedActivation(x, FP8_ACT)
    y = fp8_kernel(x, tensors, meta, FP8_ACT, shared=shared)
    codes, scales = quantize_activation_fp8_codes(x)
    assert_fp8_product(y, codes, scales, tensors, fp8_gemm.fp8_reference(codes, scales, tensors, torch.float16))
    assert torch.equal(shared.fake_quant(), quantize_activation_fp8(x, -1))  # derived from the codes, not requantized
    assert shared.computed() == ["fp8", "fake"]


@pytest.fixture
def fp8_on_this_device(monkeypatch):
    """The fp8 layout's kernel registered for the device the tests run on (the CPU runs the torch form)."""
    dispatch.load_kernel_modules()
    kernel = dispatch.kernel_for("fp8", "cuda")
    if not CUDA:
        monkeypatch.setitem(dispatch._KERNELS, ("fp8", "cpu"), kernel)
    return kernel


@pytest.mark.parametrize("m", [1, 16])
def test_a_packed_fp8_linear_on_the_kernel_path_matches_the_reference_path(fp8_on_this_device, monkeypatch, m):
    qw, tensors, meta = _weight(64, 256)
    ql = QuantLinear(256, 64, [PackedPart("fp8", meta, tensors, None, 8)], act=FP8_ACT).to(DEVICE)
    x = torch.randn(2, m, 256, device=DEVICE, dtype=torch.float16)
    with torch.no_grad():
        y = ql(x)
        y2 = ql(x)  # the prepared launch
        monkeypatch.setenv(dispatch.ENV_SWITCH, "0")
        ref = ql(x)
    assert y.shape == (2, m, 64) and torch.equal(y, y2)
    # the reference rounds the fake-quant activations and Ŵ to fp16 before its GEMM; the kernels multiply e4m3
    # values exactly and round once
    torch.testing.assert_close(y.float(), ref.float(), rtol=1e-2, atol=2e-3)


@pytest.mark.skipif(not CUDA, reason="cuBLAS FP8 needs a GPU")
def test_cublas_fp8_on_the_gpu_computes_the_reference_product():
    cap = torch.cuda.get_device_capability()
    if cap < fp8_gemm.FP8_MIN_CAPABILITY:
        pytest.skip("no FP8 tensor cores")
    _, tensors, meta = _weight(4096, 1024)
    for dtype, m in ((torch.float16, 64), (torch.bfloat16, 64), (torch.float16, 1), (torch.float16, 5)):
        codes, scales = quantize_activation_fp8_codes(torch.randn(m, 1024, device="cuda", dtype=dtype))
        got = fp8_gemm.fp8_matmul(codes, scales, tensors, meta, out_dtype=dtype, kernel="cublas.scaled_mm")
        assert_fp8_product(got, codes, scales, tensors, fp8_gemm.fp8_reference(codes, scales, tensors, dtype))


def test_an_fp8_checkpoint_for_sm90_holds_the_fp8_layout_and_runs_the_reference_numbers(tiny_model_dir, tmp_path):
    import json

    from quantkit.checkpoint import load_packed
    from quantkit.checkpoint.atomic import MANIFEST_NAME
    from quantkit.pack import run_pack

    src = str(tiny_model_dir("llama"))
    outs = {}
    for target in ("reference", "sm90"):
        run_pack(src, "fp8-w8a8", str(tmp_path / target), target=target, device="cpu", progress=False)
        outs[target] = tmp_path / target
    manifest = json.loads((outs["sm90"] / MANIFEST_NAME).read_text())
    layouts = {p["layout"] for e in manifest["linears"].values() for p in e["partitions"]}
    assert layouts == {"fp8"}
    ids = torch.randint(0, 100, (1, 12), generator=torch.Generator().manual_seed(0))
    logits = [load_packed(str(outs[t]), device="cpu", load_tokenizer=False).model(ids).logits for t in outs]
    assert torch.equal(logits[0], logits[1])  # the CPU runs the torch reference of either layout: the same Ŵ


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_the_fused_fp8_quantizer_is_bit_identical_to_torch(dtype):
    from quantkit.runtime.kernels.triton.act_quant import quantize_activation_fp8_triton

    finite = torch.arange(256, dtype=torch.uint8)
    values = finite[(finite & 0x7F) != 0x7F].view(torch.float8_e4m3fn).float().sort().values
    row = torch.cat([values, (values[:-1] + values[1:]) / 2])  # every e4m3 value and every tie (scale 1: 448 in it)
    x = torch.stack([row, -row, row * 0.999, row * 1.001, torch.zeros_like(row), torch.full_like(row, 1e-41)])
    x = torch.cat([x, torch.randn(7, row.numel(), generator=torch.Generator().manual_seed(0)) * 3]).to(dtype)
    for rows in (x, x[:1], x[:, :300]):
        rows = rows.contiguous().to(DEVICE)
        codes, scales = quantize_activation_fp8_triton(rows)
        want_codes, want_scales = quantize_activation_fp8_codes(rows)
        assert torch.equal(scales, want_scales)
        assert torch.equal(codes.view(torch.uint8), want_codes.view(torch.uint8))


def test_a_compiled_fp8_linear_is_one_graph_with_the_eager_bits(fp8_on_this_device):
    qw, tensors, meta = _weight(64, 256)
    ql = QuantLinear(256, 64, [PackedPart("fp8", meta, tensors, None, 8)], act=FP8_ACT).to(DEVICE)
    x = torch.randn(4, 256, device=DEVICE, dtype=torch.float16)
    with torch.no_grad():
        compiled = torch.compile(ql, fullgraph=True, backend="aot_eager")
        assert torch.equal(compiled(x), ql(x))
