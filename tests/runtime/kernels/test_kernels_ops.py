"""The kernels as torch custom ops (quantkit/runtime/kernels/ops.py): each op's schema, fake tensor and CPU
reference pass torch.library.opcheck, and a packed model compiled with torch.compile(fullgraph=True) runs every
GEMM and activation quantization as one op node, with the reference path's logits to fp32 rounding."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402

from quantkit.quant.act import quantize_activation_int  # noqa: E402
from quantkit.runtime.kernels import ops  # noqa: E402
from quantkit.runtime.kernels.reference import int8_reference, w4a16_reference  # noqa: E402
from tests.kernels_helpers import packed  # noqa: E402

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the ops' CPU kernels are the torch reference")


def _args(tensors: dict, meta: dict) -> tuple[list, str]:
    names, spec = ops.layer_spec(tensors, meta)
    return [tensors[n].cpu() for n in names], spec


@cpu_only
@pytest.mark.parametrize("layout,k,act_group", [("w4a8-lqq", 256, -1), ("w8", 300, 128), ("w4a16", 300, 128)])
def test_a8_ops_are_the_reference_and_pass_opcheck(layout, k, act_group):
    _, tensors, meta = packed(layout, 40, k, 128)
    x = torch.randn(3, k)
    codes, scales = ops.act_quant(x, 8, act_group)
    want_codes, want_scales = quantize_activation_int(x, 8, act_group)
    assert torch.equal(codes, want_codes.to(torch.int8)) and torch.equal(scales, want_scales.float())
    torch.library.opcheck(ops.act_quant, (x, 8, act_group))
    packed_list, spec = _args(tensors, meta)
    y = ops.a8_gemm(codes, scales, act_group, layout, packed_list, spec, torch.float16)
    assert torch.equal(y, int8_reference(codes, scales, act_group, layout, tensors, meta).half())
    torch.library.opcheck(ops.a8_gemm, (codes, scales, act_group, layout, packed_list, spec, torch.float16))


@cpu_only
def test_the_fp8_op_is_the_reference_and_passes_opcheck():
    from quantkit.formats import get_layout
    from quantkit.quant import grid
    from quantkit.quant.act import quantize_activation_fp8_codes
    from quantkit.runtime.kernels.fp8_gemm import fp8_reference

    qw = grid.quantize_fp8(torch.randn(40, 256) * 0.05, -1)
    tensors, meta = get_layout("fp8").pack(qw), get_layout("fp8").layout_meta(qw)
    codes, scales = quantize_activation_fp8_codes(torch.randn(3, 256))
    packed_list, spec = _args({name: ops.as_bytes(t) for name, t in tensors.items()}, meta)
    args = (ops.as_bytes(codes), scales, packed_list, spec, torch.float16)
    assert torch.equal(ops.fp8_gemm(*args), fp8_reference(codes, scales, tensors, torch.float16))
    torch.library.opcheck(ops.fp8_gemm, args)


@cpu_only
def test_w4a16_and_mixed_ops_are_the_reference_and_pass_opcheck():
    _, tensors, meta = packed("w4a16", 40, 300, 128)
    x = torch.randn(3, 300).half()
    packed_list, spec = _args(tensors, meta)
    assert torch.equal(ops.w4a16_gemm(x, packed_list, spec), w4a16_reference(x, tensors, meta).half())
    torch.library.opcheck(ops.w4a16_gemm, (x, packed_list, spec))
    _, t4, m4 = packed("w4a16", 36, 300, 128, seed=1)
    _, t8, m8 = packed("w8", 4, 300, 128, seed=2)
    rows4, rows8 = torch.arange(0, 40, 10, dtype=torch.int32), torch.tensor([r for r in range(40) if r % 10],
                                                                             dtype=torch.int32)
    parts = [("w8", t8, m8, rows4), ("w4a16", t4, m4, rows8)]
    packed_list, rows, spec = ops.mixed_spec(parts)
    codes, scales = ops.act_quant(torch.randn(3, 300), 8, 128)
    y = ops.a8_mixed_gemm(codes, scales, 128, packed_list, rows, spec, 40, torch.float16)
    assert torch.equal(y[:, rows4.long()], int8_reference(codes, scales, 128, "w8", t8, m8).half())
    assert torch.equal(y[:, rows8.long()], int8_reference(codes, scales, 128, "w4a16", t4, m4).half())
    torch.library.opcheck(ops.a8_mixed_gemm, (codes, scales, 128, packed_list, rows, spec, 40, torch.float16))


@pytest.fixture(scope="module")
def lqq_sm90(tmp_path_factory):
    """builtin:reference packed with lqq-w4a8-rtn in the sm_90 kernels' layout."""
    from typer.testing import CliRunner

    from quantkit.cli import app

    out = tmp_path_factory.mktemp("ops") / "lqq"
    r = CliRunner().invoke(app, ["pack", "builtin:reference", "--recipe", "lqq-w4a8-rtn", "--target", "sm90", "-o",
                                 str(out)])
    assert r.exit_code == 0, r.output
    return out


def _with_cpu_kernels(kernel_registry, folder):
    """The packed model with the LiquidQuant kernel entry registered for the CPU (under torch.compile: the ops, whose
    CPU kernels are the references)."""
    from quantkit.checkpoint import load_packed
    from quantkit.runtime.kernels.entry import layout_kernel

    kernel_registry.register("w4a8-lqq", layout_kernel("w4a8-lqq"), quantizes_activations=True,
                             shared_activation=True, devices=("cpu",))
    return load_packed(str(folder), device="cpu", load_tokenizer=False).model


@cpu_only
def test_a_compiled_packed_model_runs_each_gemm_as_one_op(lqq_sm90, kernel_registry, monkeypatch):
    import torch._dynamo.testing

    model = _with_cpu_kernels(kernel_registry, lqq_sm90)
    ids = torch.randint(0, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        monkeypatch.setenv(kernel_registry.ENV_SWITCH, "0")
        want = model(ids).logits
        monkeypatch.delenv(kernel_registry.ENV_SWITCH)
        torch._dynamo.reset()
        backend = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
        got = torch.compile(model, backend=backend, fullgraph=True)(ids).logits
    torch._dynamo.reset()
    # the ops' int8 products against the reference path's fake-quant fp32 products: equal up to fp32 rounding
    assert backend.frame_count == 1 and float((got - want).norm() / want.norm()) < 2e-3
    targets = [str(n.target) for g in backend.graphs for n in g.graph.nodes if n.op == "call_function"]
    layers = model.config.num_hidden_layers
    # fused q/k/v, o, fused gate/up, down: four GEMMs a layer, each input quantized once
    assert sum("quantkit.a8_gemm" in t for t in targets) == 4 * layers
    assert sum("quantkit.act_quant" in t for t in targets) == 4 * layers


@cpu_only
def test_hf_generate_with_a_static_cache_compiles_the_packed_model_in_one_graph(lqq_sm90, kernel_registry):
    """transformers' generate with cache_implementation="static" compiles the decode forward (on CUDA by itself;
    here its device check is passed by hand) as one full graph over the ops, with our loop's greedy tokens."""
    from torch._dynamo.utils import counters
    from transformers import CompileConfig

    from quantkit.runtime.generate import Generator

    model = _with_cpu_kernels(kernel_registry, lqq_sm90)
    ids = torch.randint(0, model.config.vocab_size, (1, 10), generator=torch.Generator().manual_seed(0))
    ours, _ = Generator(model, 40).generate(ids, 8)
    model._valid_auto_compile_criteria = lambda *args: True  # what a CUDA device passes
    torch._dynamo.reset()
    counters.clear()
    with torch.inference_mode():
        hf = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                            cache_implementation="static", pad_token_id=0,
                            compile_config=CompileConfig(fullgraph=True, backend="aot_eager", mode=None))
    graphs = counters["stats"]["unique_graphs"]
    torch._dynamo.reset()
    assert torch.equal(hf, ours) and graphs == 1
