"""The RMSNorms in front of fused projections (quantkit.runtime.fused_norm): replaced at load, transformers' own
forward where no norm kernel is registered (logits unchanged to the bit), and — with the kernels (Triton's
interpreter on CPU here) — their A8 codes taken by the projections instead of a second quantization."""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported (quantkit.runtime.kernels.jit)

import pytest  # noqa: E402

from quantkit.runtime import ActQuant, dispatch  # noqa: E402
from quantkit.runtime.fused_norm import FusedRMSNorm  # noqa: E402
from quantkit.runtime.norm_codes import A8_ATTR, adopt_norm_codes  # noqa: E402

A8 = ActQuant(8, 128)


@pytest.fixture(scope="module")
def w8a8_pack(tiny_model_dir, tmp_path_factory):
    from quantkit.pack import run_pack

    out = tmp_path_factory.mktemp("norm") / "w8a8"
    run_pack(str(tiny_model_dir("llama")), "w8a8", str(out), target="sm90", device="cpu", progress=False)
    return out


def _load(path, **kw):
    from quantkit.checkpoint import load_packed

    return load_packed(path, device="cpu", load_tokenizer=False, **kw).model


def test_norms_are_replaced_and_keep_transformers_results_without_a_kernel(w8a8_pack, monkeypatch):
    fused, plain = _load(w8a8_pack), _load(w8a8_pack, fuse=False)
    layer = fused.model.layers[0]
    assert isinstance(layer.input_layernorm, FusedRMSNorm) and layer.input_layernorm.act == A8
    assert isinstance(layer.post_attention_layernorm, FusedRMSNorm)
    assert not isinstance(fused.model.norm, FusedRMSNorm)  # the final norm feeds lm_head, not quantized linears
    assert {k for k in fused.state_dict() if "layernorm" in k} == {k for k in plain.state_dict() if "layernorm" in k}
    ids = torch.randint(0, fused.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(fused(ids).logits, plain(ids).logits)
    monkeypatch.setenv("QUANTKIT_FUSE_NORM", "0")
    assert not isinstance(_load(w8a8_pack).model.layers[0].input_layernorm, FusedRMSNorm)


def test_projections_take_the_codes_the_norm_kernel_made(w8a8_pack, monkeypatch, kernel_registry):
    """With the norm and w8 kernels registered (interpreted on a CPU, compiled on a GPU), a decoder layer
    quantizes only o_proj's and down_proj's inputs itself, the codes leave the norm's output once taken, and the
    logits match the run without the norm kernel (up to its rounding of the normalized rows)."""
    from quantkit.checkpoint import load_packed
    from quantkit.runtime.kernels import entry
    from tests.kernels_helpers import DEVICE

    kernel_registry._NORMS.clear()
    dispatch.register("w8", entry.layout_kernel("w8"), quantizes_activations=True, shared_activation=True,
                      devices=(DEVICE,))
    quantized = []
    real = entry.quantize_for_kernel
    monkeypatch.setattr(entry, "quantize_for_kernel", lambda x, g: quantized.append(x.shape) or real(x, g))
    model = load_packed(w8a8_pack, device=DEVICE, load_tokenizer=False).model
    ids = torch.randint(0, model.config.vocab_size, (1, 5), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    normed = []  # the attention input: the norm's output
    model.model.layers[0].self_attn.register_forward_pre_hook(
        lambda m, a, kw: normed.append(kw["hidden_states"]), with_kwargs=True)
    with torch.no_grad():
        want = model(ids).logits.float()
        assert len(quantized) == 4 * model.config.num_hidden_layers
        quantized.clear()
        dispatch.register_norm(entry.rms_norm_entry, devices=(DEVICE,))
        got = model(ids).logits.float()
    assert len(quantized) == 2 * model.config.num_hidden_layers  # o_proj and down_proj
    if DEVICE == "cpu":  # fp32: the interpreted kernel's rows and codes equal transformers' norm + the quantizer
        assert torch.equal(got, want)
    else:  # fp16 on a GPU: the kernel's rows may differ by two rounding steps, which moves some codes
        assert (got - want).abs().max() <= 1e-2 * want.abs().max()
    assert len(normed) == 2 and not hasattr(normed[1], A8_ATTR)  # taken by q/k/v, then gone


def test_a_norm_with_forward_hooks_or_in_grad_mode_attaches_no_codes(monkeypatch):
    """A hook could change the norm's output in place unseen (inference tensors have no version counter), and
    the kernel has no backward: either way the projections quantize the output themselves."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from tests.kernels_helpers import DEVICE

    calls = []
    dispatch.load_kernel_modules()  # first, or its import would register the real kernel over the fake one
    monkeypatch.setattr(dispatch, "_NORMS", {})
    def fake(x, w, eps, act):
        calls.append(act)
        return (x.clone(), None, None) if act is None else (x.clone(), x.to(torch.int8), w[:1])
    dispatch.register_norm(fake, devices=(torch.device(DEVICE).type,))
    norm = FusedRMSNorm(LlamaRMSNorm(256).to(DEVICE), A8)
    x = torch.randn(2, 256, device=DEVICE)
    with torch.no_grad():
        assert hasattr(norm(x), A8_ATTR) and calls == [A8]
        handle = norm.register_forward_hook(lambda m, a, y: None)
        assert not hasattr(norm(x), A8_ATTR) and calls == [A8, None]
        handle.remove()
    assert not hasattr(norm(x), A8_ATTR) and len(calls) == 2  # grad mode: transformers' forward


def test_codes_are_refused_for_a_changed_tensor_or_another_quantization():
    from quantkit.runtime.dispatch import SharedActivation

    from quantkit.runtime.norm_codes import output_state as _state

    y = torch.randn(2, 256)
    codes, scales = torch.zeros(2, 256, dtype=torch.int8), torch.ones(2, 2)
    setattr(y, A8_ATTR, (A8, _state(y), codes, scales))
    assert not adopt_norm_codes(SharedActivation(y, ActQuant(8, -1)), y)  # another quantization
    setattr(y, A8_ATTR, (A8, (y._version, ("another stream", False)), codes, scales))
    assert not adopt_norm_codes(SharedActivation(y, A8), y)  # made on another stream / capture state
    setattr(y, A8_ATTR, (A8, _state(y), codes, scales))
    y.add_(1)
    assert not adopt_norm_codes(SharedActivation(y, A8), y)  # changed since
    setattr(y, A8_ATTR, (A8, _state(y), codes, scales))
    shared = SharedActivation(y, A8)
    assert adopt_norm_codes(shared, y) and not hasattr(y, A8_ATTR)  # taken once
    assert shared.computed() == ["a8"] and not adopt_norm_codes(SharedActivation(y, A8), y)


def test_the_fp16_layer_of_the_decode_step_keeps_the_norm_without_quantizing(w8a8_pack):
    from quantkit.bench import decode_step as ds

    layer = _load(w8a8_pack, dtype="fp16").model.layers[0]
    dense = ds.fp16_layer(layer)
    assert isinstance(dense.input_layernorm, FusedRMSNorm) and dense.input_layernorm.act is None
    assert layer.input_layernorm.act == A8
