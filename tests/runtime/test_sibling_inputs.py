"""Sibling projections (q/k/v, gate/up) quantize their shared input once per parent call, and only when it is the
very same, unchanged tensor: the outputs equal those of unshared layers bit for bit, and nothing is shared across
parent calls, tensors or in-place changes (inference-mode tensors, which have no version counter, by identity)."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from quantkit.formats.registry import get_layout
from quantkit.quant.rtn import rtn_quantize
from quantkit.runtime import ActQuant, PackedPart, QuantLinear, dispatch
from quantkit.runtime.fused_siblings import share_sibling_inputs

A8 = ActQuant(8, 128)


def _linear(n: int, k: int, seed: int, act=A8) -> QuantLinear:
    qw = rtn_quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(seed)), 4, 128)
    lay = get_layout("reference")
    return QuantLinear(k, n, [PackedPart("reference", lay.layout_meta(qw), lay.pack(qw), None, 4)], act=act)


class Block(nn.Module):
    """q/k/v on one input, then o on another (as in an attention block); ``between`` runs after q."""

    def __init__(self, k: int = 200, act=A8):
        super().__init__()
        self.q, self.k, self.v = _linear(7, k, 1, act), _linear(5, k, 2, act), _linear(3, k, 3, act)
        self.o = _linear(4, 15, 4, act)
        self.between = None

    def forward(self, x):
        q = self.q(x)
        if self.between is not None:
            self.between(x)
        y = torch.cat([q, self.k(x), self.v(x)], dim=-1)
        return self.o(y)


def _expected(block: Block, x: torch.Tensor) -> torch.Tensor:
    """The block computed with plain fake-quant products, no QuantLinear."""
    def lin(ql, inp):
        return F.linear(dispatch.quantize_activation(inp, 8, 128, True), ql.dense_weight())
    y = torch.cat([lin(block.q, x), lin(block.k, x), lin(block.v, x)], dim=-1)
    return lin(block.o, y)


def test_siblings_quantize_their_input_once_per_parent_call(quantizations):
    block = Block()
    assert share_sibling_inputs(block) == 1 and share_sibling_inputs(block) == 0
    assert block.q.sibling_scope is block.k.sibling_scope is block.v.sibling_scope is block.o.sibling_scope
    x = torch.randn(3, 200)
    with torch.no_grad():
        want = _expected(block, x)
        quantizations.clear()
        assert torch.equal(block(x), want)
        assert len(quantizations) == 2          # x once for q/k/v, then o's input
        assert block.q.sibling_scope._entries == {}  # cleared when the call ends: no activation kept
        assert torch.equal(block(x), want)
        assert len(quantizations) == 4          # a new parent call quantizes again (a CUDA graph captures it)


def _lin(ql: QuantLinear, inp: torch.Tensor) -> torch.Tensor:
    return F.linear(dispatch.quantize_activation(inp, 8, 128, True), ql.dense_weight())


def test_an_input_changed_in_place_is_quantized_again(quantizations):
    block = Block()
    share_sibling_inputs(block)
    x = torch.randn(2, 200)
    x0 = x.clone()
    block.between = lambda t: t.mul_(2)          # after q: k and v must see the doubled values
    with torch.no_grad():
        y = block(x)
        assert len(quantizations) == 3           # x for q, 2x for k and v, then o's input
        want = _lin(block.o, torch.cat([_lin(block.q, x0), _lin(block.k, 2 * x0), _lin(block.v, 2 * x0)], -1))
    assert torch.equal(y, want)


def test_other_tensors_and_calls_outside_the_parent_are_not_shared(quantizations):
    block = Block()
    share_sibling_inputs(block)
    x = torch.randn(2, 200)
    with torch.no_grad():
        block.between = lambda t: block.k(t.clone())   # same values, another tensor
        block(x)
        assert len(quantizations) == 4           # x for q, the clone, x again for k (v shares it), o's input
        quantizations.clear()
        block.q(x), block.k(x)                   # no parent call under way: nothing shared
        assert len(quantizations) == 2


def test_inference_mode_tensors_are_shared_by_identity(quantizations):
    """An inference tensor has no version counter: the very same tensor object within one parent call is taken as
    unchanged (the supported blocks call their siblings back to back on it); another tensor is not shared."""
    block = Block()
    share_sibling_inputs(block)
    with torch.inference_mode():
        x = torch.randn(2, 200)
        out = block(x)
        assert len(quantizations) == 2           # x once for q/k/v, then o's input
        block.between = lambda t: block.k(t.clone())
        block(x)
        assert len(quantizations) == 6          # + x for q, the clone, x for k (v shares it), o's input
    with torch.no_grad():
        assert torch.equal(out, _expected(block, x.clone()))


def test_layers_without_activation_quantization_get_no_scope():
    block = Block(act=None)
    assert share_sibling_inputs(block) == 0 and block.q.sibling_scope is None


def test_the_parent_call_releases_the_input():
    block = Block()
    share_sibling_inputs(block)
    x = torch.randn(2, 200)
    with torch.no_grad():
        block(x)
    ref = __import__("weakref").ref(x)
    del x
    gc.collect()
    assert ref() is None


def test_an_exception_in_the_parent_still_clears_the_scope():
    block = Block()
    share_sibling_inputs(block)

    def boom(_):
        raise RuntimeError("boom")
    block.between = boom
    with pytest.raises(RuntimeError, match="boom"), torch.no_grad():
        block(torch.randn(2, 200))
    assert block.q.sibling_scope._entries == {}


def test_adopting_forms_of_another_quantization_is_refused():
    x = torch.randn(2, 200)
    a = dispatch.SharedActivation(x, A8)
    with pytest.raises(ValueError, match="cannot share"):
        dispatch.SharedActivation(x, ActQuant(8, -1)).adopt(a)


def test_packed_a8_model_quantizes_four_inputs_per_layer(tmp_path, tiny_model_dir, quantizations):
    """A loaded A8 checkpoint whose projections are left unfused shares q/k/v's and gate/up's input: 4
    quantizations per decoder layer, not 7, and its logits equal the unshared model's bit for bit."""
    from quantkit.checkpoint import load_packed
    from quantkit.pack import run_pack

    out = tmp_path / "ckpt"
    run_pack(str(tiny_model_dir("llama", intermediate_size=200)), "w8a8", str(out), device="cpu", progress=False)
    model = load_packed(out, device="cpu", load_tokenizer=False, fuse=False).model
    ids = torch.randint(0, model.config.vocab_size, (1, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        quantizations.clear()
        shared = model(ids).logits
        assert len(quantizations) == 4 * model.config.num_hidden_layers
        for m in model.modules():
            if isinstance(m, QuantLinear):
                m.sibling_scope = None
        assert torch.equal(model(ids).logits, shared)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_sibling_on_another_stream_quantizes_again(quantizations):
    """Forms made on one CUDA stream are not reused by a sibling running on another (no ordering between them)."""
    block = Block().cuda()
    share_sibling_inputs(block)
    side = torch.cuda.Stream()

    def on_side(t):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            block.k(t)
        torch.cuda.current_stream().wait_stream(side)
    block.between = on_side
    with torch.no_grad():
        block(torch.randn(2, 200, device="cuda"))
    assert len(quantizations) == 4  # q; k on the side stream; k and v on the main stream again; o's input
