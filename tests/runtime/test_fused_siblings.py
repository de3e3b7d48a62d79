"""Sibling projections fused at load (quantkit.runtime.fused_siblings): q/k/v and gate/up become one stacked
QuantLinear computed once per parent call; on the torch reference path every output equals the unfused model's bit
for bit (mixed precision and A8 included), the fused GEMM is reused only for the very same unchanged input, and
what cannot be stacked stays separate."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from quantkit.formats.registry import get_layout
from quantkit.quant import grid
from quantkit.runtime import ActQuant, PackedPart, QuantLinear, dispatch
from quantkit.runtime.fused_siblings import (SiblingSlice, fuse_sibling_projections, fused_name, fusion_problem,
                                             sibling_groups, spec_of_linear)

A8 = ActQuant(8, 128)
K = 200  # not a multiple of 128: a short last group


def _part(layout: str, bits: int, rows: list[int] | None, n: int, seed: int, group_size: int = 128) -> PackedPart:
    count = n if rows is None else len(rows)
    w = torch.randn(count, K, generator=torch.Generator().manual_seed(seed))
    qw = grid.quantize(w, bits, group_size, sym=bits == 8)
    lay = get_layout(layout)
    return PackedPart(layout, lay.layout_meta(qw), lay.pack(qw),
                      None if rows is None else torch.tensor(rows, dtype=torch.int32), bits)


def _linear(n: int, parts: list[PackedPart], act, bias: bool, seed: int) -> QuantLinear:
    b = torch.randn(n, generator=torch.Generator().manual_seed(seed)) if bias else None
    return QuantLinear(K, n, parts, b, act)


class Attention(nn.Module):
    """q/k/v on one input, o on their outputs (as in an attention block); ``between`` runs after q."""

    def __init__(self, act=A8, bias=True):
        super().__init__()
        self.q_proj = _linear(7, [_part("w4a16", 4, None, 7, 1)], act, bias, 11)
        self.k_proj = _linear(5, [_part("w4a16", 4, [0, 2, 3], 5, 2), _part("w8", 8, [1, 4], 5, 3)], act, bias, 12)
        self.v_proj = _linear(3, [_part("w8", 8, None, 3, 4)], act, bias, 13)
        self.o_proj = QuantLinear(15, 4, [_quick(4, 15)], None, act)
        self.between = None

    def forward(self, x):
        q = self.q_proj(x)
        if self.between is not None:
            self.between(x)
        return self.o_proj(torch.cat([q, self.k_proj(x), self.v_proj(x)], dim=-1))


def _quick(n: int, k: int) -> PackedPart:
    qw = grid.quantize(torch.randn(n, k, generator=torch.Generator().manual_seed(n * k)), 4, 128, sym=False)
    lay = get_layout("reference")
    return PackedPart("reference", lay.layout_meta(qw), lay.pack(qw), None, 4)


def _pair(act=A8, bias=True):
    import copy

    torch.manual_seed(0)
    unfused = Attention(act, bias)
    fused = copy.deepcopy(unfused)
    assert fuse_sibling_projections(fused) == 1 and fuse_sibling_projections(fused) == 0
    return unfused, fused


@pytest.mark.parametrize("act", [None, A8])
@pytest.mark.parametrize("bias", [False, True])
def test_fused_block_equals_the_unfused_one_bit_for_bit(act, bias, quantizations):
    unfused, fused = _pair(act, bias)
    qkv = fused.qkv_proj
    assert isinstance(fused.q_proj, SiblingSlice) and isinstance(qkv, QuantLinear) and qkv.row_blocks == (7, 5, 3)
    assert [(b, layout) for _, layout, _, b in qkv._parts] == [(4, "w4a16"), (8, "w8")]
    assert qkv.part4.rows.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 9, 10] and qkv.part8.rows.tolist() == [8, 11, 12, 13, 14]
    for name in ("q_proj", "k_proj", "v_proj"):
        assert torch.equal(getattr(fused, name).dense_weight(), getattr(unfused, name).dense_weight())
        assert (getattr(fused, name).bias is None) == (not bias)
    x = torch.randn(2, 3, K)
    with torch.no_grad():
        want = unfused(x)
        quantizations.clear()
        got = fused(x)
        assert torch.equal(got, want)
        assert len(quantizations) == (2 if act else 0)  # one for q/k/v, one for o
        assert torch.equal(fused.k_proj(x), unfused.k_proj(x))  # a projection called on its own, outside the block


def test_the_fused_gemm_runs_once_per_parent_call_and_only_for_the_same_input(monkeypatch):
    unfused, fused = _pair()
    calls = []
    real = QuantLinear.forward_blocks
    monkeypatch.setattr(QuantLinear, "forward_blocks", lambda self, x: calls.append(x.shape) or real(self, x))
    x = torch.randn(4, K)
    with torch.no_grad():
        fused(x)
        assert len(calls) == 1
        fused(x)
        assert len(calls) == 2                    # a new parent call computes again
        fused.between = lambda t: fused.k_proj(t.clone())   # same values, another tensor
        unfused.between = lambda t: unfused.k_proj(t.clone())
        assert torch.equal(fused(x), unfused(x))
        assert len(calls) == 5                    # x for q, the clone, x again for k (v reuses it)
        fused.between = unfused.between = lambda t: t.mul_(2)   # after q: k and v must see the doubled values
        x1, x2 = x.clone(), x.clone()
        assert torch.equal(fused(x1), unfused(x2))
        assert len(calls) == 7
    assert fused.__dict__["_quantkit_sibling_scope"]._entries == {}  # nothing held after the call


def test_inference_tensors_reuse_the_fused_gemm_by_identity(monkeypatch):
    unfused, fused = _pair()
    calls = []
    real = QuantLinear.forward_blocks
    monkeypatch.setattr(QuantLinear, "forward_blocks", lambda self, x: calls.append(1) or real(self, x))
    with torch.inference_mode():
        x = torch.randn(3, K)
        assert torch.equal(fused(x), unfused(x))
    assert len(calls) == 1


def test_the_kernel_path_runs_one_gemm_and_hands_out_views(kernel_registry):
    """With a kernel for the layout (a plain CPU one here), q/k/v are column views of one product of all rows."""
    kernel_registry._MIXED.clear()
    seen = []

    def plain(x, tensors, meta, act):
        seen.append(int(meta["out_features"]))
        return F.linear(x, grid.dequantize(get_layout("reference").unpack(tensors, meta), x.dtype))

    block = Attention(None, bias=True)
    for name, n in (("q_proj", 7), ("k_proj", 5), ("v_proj", 3)):
        setattr(block, name, QuantLinear(K, n, [_quick(n, K)], torch.randn(n), None))
    fuse_sibling_projections(block)
    dispatch.register("reference", plain, devices=("cpu",))
    x = torch.randn(2, K)
    outs = {}
    for name in ("q", "k", "v"):
        getattr(block, f"{name}_proj").register_forward_hook(lambda m, a, y, _n=name: outs.setdefault(_n, y))
    with torch.no_grad():
        block(x)
    assert seen.count(15) == 1                  # one GEMM of 7 + 5 + 3 rows for q, k and v
    assert outs["q"].untyped_storage().data_ptr() == outs["v"].untyped_storage().data_ptr()
    for name in ("q", "k", "v"):
        proj = getattr(block, f"{name}_proj")
        want = F.linear(x, proj.dense_weight(), proj.bias)
        assert torch.allclose(outs[name], want, rtol=1e-5, atol=1e-5)


def test_what_cannot_be_stacked_stays_separate():
    block = Attention()
    block.v_proj = _linear(3, [_part("w8", 8, None, 3, 4, group_size=-1)], A8, True, 13)  # per-channel
    assert "group_size" in fusion_problem([spec_of_linear(block.k_proj), spec_of_linear(block.v_proj)])
    assert fuse_sibling_projections(block) == 1 and block.qk_proj.row_blocks == (7, 5)  # q and k fuse, v not
    assert isinstance(block.v_proj, QuantLinear)
    block = Attention()
    block.k_proj = _linear(5, [_part("w4a16", 4, None, 5, 2)], A8, False, 0)
    assert fusion_problem([spec_of_linear(block.q_proj), spec_of_linear(block.k_proj)]) == \
        "some have a bias and some do not"
    gptq = [_part("gptq", 4, None, 8, s) for s in (1, 2)]
    assert "packs several rows" in fusion_problem([spec_of_linear(_linear(8, [p], None, False, 0)) for p in gptq])
    other = Attention()
    other.k_proj = _linear(5, [_part("reference", 4, None, 5, 2)], A8, True, 0)
    assert "different layouts" in fusion_problem([spec_of_linear(other.q_proj), spec_of_linear(other.k_proj)])


def test_names_and_groups():
    assert fused_name(["q_proj", "k_proj", "v_proj"]) == "qkv_proj"
    assert fused_name(["gate_proj", "up_proj"]) == "gate_up_proj"
    assert fused_name(["q_proj", "v_proj"]) == "qv_proj"
    spec = spec_of_linear(Attention().v_proj)
    names = ["m.0.attn.v_proj", "m.0.attn.q_proj", "m.0.attn.o_proj", "m.0.mlp.up_proj", "m.1.mlp.up_proj",
             "m.1.mlp.gate_proj"]
    assert sibling_groups(names, lambda n: spec) == [("m.0.attn", ["m.0.attn.q_proj", "m.0.attn.v_proj"]),
                                                     ("m.1.mlp", ["m.1.mlp.gate_proj", "m.1.mlp.up_proj"])]


@pytest.fixture(scope="module")
def mixed_pack(tiny_model_dir, tmp_path_factory):
    """A tiny llama packed as MixLLM W4.4A8 with kernel layouts (w4a16 + w8 partitions, random 4.4-bit plan)."""
    from quantkit.pack import run_pack
    from quantkit.search.command import run_search

    src = str(tiny_model_dir("llama", intermediate_size=200))
    plan = tmp_path_factory.mktemp("plan") / "plan.json"
    run_search(src, str(plan), "mixllm-w4a8-rtn", strategy="random", target_bits=4.4, samples=1, seqlen=16,
               device="cpu", show_progress=False)
    out = tmp_path_factory.mktemp("fused") / "mixed"
    run_pack(src, "mixllm-w4a8-rtn", str(out), plan=str(plan), target="sm90", device="cpu", progress=False)
    return out


def test_a_loaded_checkpoint_fuses_and_keeps_every_logit(mixed_pack, quantizations, monkeypatch):
    from quantkit.bench.packed_targets import runtime_linears
    from quantkit.checkpoint import load_packed, read_manifest

    fused = load_packed(mixed_pack, device="cpu", load_tokenizer=False).model
    unfused = load_packed(mixed_pack, device="cpu", load_tokenizer=False, fuse=False).model
    layer = fused.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, QuantLinear) and isinstance(layer.mlp.gate_up_proj, QuantLinear)
    assert not any(isinstance(m, SiblingSlice) for m in unfused.modules())
    ids = torch.randint(0, fused.config.vocab_size, (2, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        quantizations.clear()
        logits = fused(ids).logits
        assert len(quantizations) == 4 * fused.config.num_hidden_layers  # qkv, o, gate_up, down
        assert torch.equal(logits, unfused(ids).logits)
    running = runtime_linears(read_manifest(mixed_pack))
    mixed = [n for n, e in running.items() if len(e["partitions"]) == 2]
    assert "model.layers.0.self_attn.qkv_proj" in running and "model.layers.0.self_attn.q_proj" not in running
    assert mixed, "a 4.4-bit random plan leaves some fused GEMM with an 8-bit partition"
    for name in mixed:
        assert isinstance(fused.get_submodule(name), QuantLinear) and fused.get_submodule(name)._parts[0][0]
    monkeypatch.setenv("QUANTKIT_FUSE", "0")
    plain = load_packed(mixed_pack, device="cpu", load_tokenizer=False).model
    assert not hasattr(plain.model.layers[0].self_attn, "qkv_proj")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("recipe", ["rtn-w4a16-g128", "w8a8", "lqq-w4a8-rtn", "mixllm-w4a8-rtn"])
def test_fused_kernels_agree_with_the_unfused_ones_on_the_gpu(tmp_path, recipe):
    """builtin:reference packed for sm90: with the GPU kernels the fused model runs q/k/v as one GEMM (the slices
    are views of one output) and its perplexity is the unfused model's within 1e-3 relative (the kernels may
    accumulate the larger GEMM in another order); the mixed recipe with a random 4.4-bit plan."""
    from quantkit.checkpoint import load_packed
    from quantkit.data import joined_text
    from quantkit.data.tokens import encode
    from quantkit.eval import perplexity
    from quantkit.pack import run_pack
    from quantkit.search.command import run_search

    if not dispatch.load_kernel_modules():
        pytest.skip("quantkit.runtime.kernels is not importable here")
    plan = None
    if recipe.startswith("mixllm"):
        plan = str(tmp_path / "plan.json")
        run_search("builtin:reference", plan, recipe, strategy="random", target_bits=4.4, samples=2, seqlen=64,
                   device="cuda", show_progress=False)
    out = tmp_path / "ck"
    run_pack("builtin:reference", recipe, str(out), plan=plan, target="sm90", device="cuda", progress=False)
    fused = load_packed(out, device="cuda", dtype="fp16")
    unfused = load_packed(out, device="cuda", dtype="fp16", fuse=False)
    attn = fused.model.model.layers[0].self_attn
    x = torch.randn(5, attn.q_proj.in_features, device="cuda", dtype=torch.float16)
    with torch.no_grad():
        q, k, v = attn.qkv_proj.forward_blocks(x)
    assert q.untyped_storage().data_ptr() == v.untyped_storage().data_ptr()  # one GEMM's output
    ids = encode(fused.tokenizer, joined_text("kjv", "test"))
    a = perplexity(fused.model, ids, 256, 8).ppl
    b = perplexity(unfused.model, ids, 256, 8).ppl
    assert abs(a - b) <= 1e-3 * b, (a, b)


def test_each_output_is_handed_out_once_and_the_memo_lets_go():
    """The memo drops an output once its sibling took it and the GEMM once all did (nothing outlives its unfused
    lifetime); a sibling asking twice in one call gets a fresh product, not the tensor it may have changed."""
    unfused, fused = _pair()
    scope = fused.__dict__["_quantkit_sibling_scope"]
    seen = {}

    def between(t):
        seen["held"] = [o is not None for o in scope._entries["qkv_proj"][2].outputs]
        seen["again"] = fused.q_proj(t)
    fused.between = between
    fused.o_proj.register_forward_pre_hook(lambda m, a: seen.update(entries=dict(scope._entries)))
    x = torch.randn(3, K)
    with torch.no_grad():
        assert torch.equal(fused(x), unfused(x))
        first = fused.q_proj(x)
    assert seen["held"] == [False, True, True] and seen["entries"] == {}
    assert torch.equal(seen["again"], first) and seen["again"] is not first


def test_siblings_with_different_shared_tensors_or_activations_stay_apart():
    lay = get_layout("reference")
    parts = []
    for seed in (1, 2):
        qw = grid.quantize(torch.randn(6, K, generator=torch.Generator().manual_seed(seed)), 4, 128, sym=False)
        qw.g_idx = (torch.randperm(K, generator=torch.Generator().manual_seed(seed)) // 128).to(torch.int32)
        parts.append(PackedPart("reference", lay.layout_meta(qw), lay.pack(qw), None, 4))
    block = Attention()
    block.q_proj, block.k_proj = (QuantLinear(K, 6, [p], None, A8) for p in parts)
    del block.v_proj
    assert "do not share one g_idx" in fusion_problem([spec_of_linear(block.q_proj), spec_of_linear(block.k_proj)])
    assert fuse_sibling_projections(block) == 0
    block.k_proj = QuantLinear(K, 6, [parts[0]], None, ActQuant(8, -1))
    assert fusion_problem([spec_of_linear(block.q_proj), spec_of_linear(block.k_proj)]) == \
        "their activation quantization differs"


def test_fusing_frees_each_groups_unfused_tensors_before_the_next(monkeypatch):
    """Loading holds one group's stacked copy at a time: when a group is stacked, no earlier group's unfused
    packed tensors are alive any more."""
    import weakref

    from quantkit.runtime import fused_siblings

    blocks = nn.ModuleList(Attention() for _ in range(3))
    refs = [weakref.ref(b.q_proj.part4.qweight if hasattr(b.q_proj, "part4") else b.q_proj.qweight) for b in blocks]
    alive_at_stack = []
    real = fused_siblings.stack_linears

    def stack(members):
        alive_at_stack.append(sum(r() is not None for r in refs))
        return real(members)
    monkeypatch.setattr(fused_siblings, "stack_linears", stack)
    assert fuse_sibling_projections(blocks) == 3
    assert alive_at_stack == [3, 2, 1] and all(r() is None for r in refs)


def test_manifest_groups_compare_shared_tensors_by_sha256():
    from quantkit.bench.packed_targets import runtime_linears

    def entry(sha):
        return {"in_features": 64, "out_features": 8, "partitions": [
            {"layout": "reference", "bits": 4, "rows": None, "meta": {"in_features": 64, "out_features": 8},
             "tensors": {"qweight": "w", "g_idx": f"g{sha}"}}]}
    manifest = {"activation": None, "tensors": {"g1": {"sha256": "a"}, "g2": {"sha256": "b"}, "g3": {"sha256": "a"}},
                "linears": {"l.q_proj": entry(1), "l.k_proj": entry(2), "l.v_proj": entry(3)}}
    assert list(runtime_linears(manifest, fuse=True)) == ["l.k_proj", "l.qv_proj"]


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "qwen3"])
@pytest.mark.parametrize("recipe", ["rtn-w4a16-g128", "lqq-w4a8-rtn"])
def test_other_families_fuse_at_load_and_keep_every_logit(tmp_path, arch, recipe):
    """Mistral (Llama's layout), Qwen2 (q/k/v biases, concatenated when fused) and Qwen3 (q_norm / k_norm after the
    q and k projections: they read the fused GEMM's slices) load fused with the same logits as unfused."""
    from quantkit.checkpoint import load_packed
    from quantkit.pack import run_pack
    from quantkit.runtime.fused_norm import FusedRMSNorm
    from tests.conftest import build_tiny_model, shipped_tokenizer

    tok = shipped_tokenizer()
    model = build_tiny_model(arch, seed=7, vocab_size=len(tok))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("_proj.bias"):  # transformers initialises them to zero: a swapped bias would not show
                param.copy_(torch.randn(param.shape, generator=gen))
    src, out = tmp_path / "src", tmp_path / "packed"
    model.save_pretrained(src)
    tok.save_pretrained(src)
    run_pack(str(src), recipe, str(out), device="cpu", progress=False)
    fused = load_packed(out, device="cpu", load_tokenizer=False).model
    unfused = load_packed(out, device="cpu", load_tokenizer=False, fuse=False).model
    for layer in fused.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        assert isinstance(attn.qkv_proj, QuantLinear) and isinstance(mlp.gate_up_proj, QuantLinear)
        assert isinstance(attn.q_proj, SiblingSlice) and isinstance(layer.input_layernorm, FusedRMSNorm)
        assert (attn.qkv_proj.bias is not None) == (arch == "qwen2")
        if arch == "qwen3":
            assert not isinstance(attn.q_norm, FusedRMSNorm)  # per-head norms after the projections stay
    ids = torch.randint(0, fused.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(fused(ids).logits, unfused(ids).logits)
