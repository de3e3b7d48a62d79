"""Sub-block replay (quantkit.model.replay): GPTQ's true-sequential stages give the same bits with and without it,
and a block runs normally whenever replaying it would not be exact."""

from __future__ import annotations

import copy

import pytest
import torch

from quantkit.model import find_decoder_layers, layer_linears, run_layerwise
from quantkit.model.layerwise import LayerBatch, capture_layer_inputs, layer_output
from quantkit.model.replay import BlockReplay
from quantkit.quant.gptq import GPTQConfig, gptq_quantize_layer
from tests.layerquant_helpers import correlated_tiny_model, token_ids


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
def test_replayed_gptq_gives_the_same_bits_and_outputs(arch):
    fp = correlated_tiny_model(arch, seed=0)
    calib = token_ids(fp, 6, 33, seed=0)
    results = {}
    for replay in (False, True):
        model = copy.deepcopy(fp)
        cfg = GPTQConfig(bits=3, group_size=16, replay=replay)
        records = {}

        def on_layer(i, name, layer, batches):
            outputs: list[LayerBatch] = []
            records.update(gptq_quantize_layer(layer, batches, layer_linears(layer, name), cfg, outputs=outputs))
            return outputs

        hidden = run_layerwise(model, calib, "cpu", batch_size=2, on_layer=on_layer)
        results[replay] = (hidden, {n: r.codes for n, r in records.items()}, model.state_dict())
    (h0, c0, s0), (h1, c1, s1) = results[False], results[True]
    assert torch.equal(h0, h1)
    assert c0.keys() == c1.keys() and all(torch.equal(c0[n], c1[n]) for n in c0)
    assert all(torch.equal(s0[k], s1[k]) for k in s0)


def _layer0(arch="llama"):
    model = correlated_tiny_model(arch, seed=1)
    path, layers = find_decoder_layers(model)
    batches = capture_layer_inputs(model, token_ids(model, 3, 17, seed=2), "cpu")
    return layers[0], layer_linears(layers[0], f"{path}.0"), batches


def test_it_finds_attention_and_mlp_with_their_last_linears():
    layer, linears, batches = _layer0()
    blocks = {type(b.module).__name__: b for b in BlockReplay(layer, linears, batches[0]).blocks}
    assert set(blocks) == {"LlamaAttention", "LlamaMLP"}
    assert blocks["LlamaAttention"].last.endswith("self_attn.o_proj") and blocks["LlamaAttention"].trailing_nones == 1
    assert blocks["LlamaMLP"].last.endswith("mlp.down_proj") and blocks["LlamaMLP"].trailing_nones is None
    assert {n.rsplit(".", 1)[-1] for n in blocks["LlamaAttention"].others} == {"q_proj", "k_proj", "v_proj"}


def test_a_block_that_changes_its_last_linears_output_is_not_replayed():
    layer, linears, batches = _layer0()
    layer.mlp.register_forward_hook(lambda m, a, y: y * 2)  # the block's output is no longer down_proj's
    names = {type(b.module).__name__ for b in BlockReplay(layer, linears, batches[0]).blocks}
    assert names == {"LlamaAttention"}


def test_changed_inputs_or_unfinished_linears_run_the_block():
    layer, linears, batches = _layer0()
    by_leaf = {n.rsplit(".", 1)[-1]: n for n in linears}
    replay = BlockReplay(layer, linears, batches[0])
    calls = []
    layer.self_attn.q_proj.register_forward_pre_hook(lambda m, a: calls.append(1))
    # recording needs q/k/v final: without that the o stage records nothing and nothing is replayed
    replay.stage([by_leaf["o_proj"]])
    replay.run(batches, lambda b: layer_output(layer, b))
    replay.finish([by_leaf["o_proj"]])
    calls.clear()
    replay.outputs(batches)
    assert len(calls) == len(batches)
    # recorded with q/k/v final: replayed while the input is the same, recomputed once the norm changes it
    replay.finish([by_leaf[n] for n in ("q_proj", "k_proj", "v_proj")])
    replay.stage([by_leaf["o_proj"]])
    replay.run(batches, lambda b: layer_output(layer, b))
    replay.finish([by_leaf["o_proj"]])
    with torch.no_grad():
        layer.self_attn.o_proj.weight.mul_(0.5)  # the last linear may change: it is called, not cached
        expect = [layer_output(layer, b) for b in batches]
        calls.clear()
        got = [b.hidden for b in replay.outputs(batches)]
        assert not calls and all(torch.equal(e, g) for e, g in zip(expect, got))
        layer.input_layernorm.weight.mul_(1.5)
        expect = [layer_output(layer, b) for b in batches]
        calls.clear()
        got = [b.hidden for b in replay.outputs(batches)]
    assert len(calls) == len(batches) and all(torch.equal(e, g) for e, g in zip(expect, got))


def test_a_block_that_changes_the_linears_output_in_place_is_not_replayed():
    """M(x) returning L's output object after changing it in place is not L(x_L): the probe sees the version."""
    layer, linears, batches = _layer0()

    def double_in_place(module, args, y):
        y.mul_(2)  # the block returns down_proj's output object, with other values

    layer.mlp.register_forward_hook(double_in_place)
    names = {type(b.module).__name__ for b in BlockReplay(layer, linears, batches[0]).blocks}
    assert names == {"LlamaAttention"}


def test_replay_is_skipped_when_its_records_would_crowd_memory(monkeypatch):
    """GPTQ records sub-block inputs only while they fit a quarter of the free memory; the bits are the same."""
    from quantkit.model.replay import record_bytes

    layer, linears, batches = _layer0()
    hidden = batches[0].hidden.shape[-1]
    widest = max(lin.in_features for lin in linears.values())
    assert record_bytes(batches, linears) == sum(b.hidden.shape[1] for b in batches) * (3 * hidden + widest) * 4
    built = []
    real = BlockReplay.__init__
    monkeypatch.setattr(BlockReplay, "__init__", lambda self, *a: (built.append(1), real(self, *a))[1])
    for free, expect in ((0, []), (1 << 40, [1])):
        monkeypatch.setattr("quantkit.model.memory.free_memory", lambda device, _f=free: _f)
        built.clear()
        lyr = copy.deepcopy(layer)
        gptq_quantize_layer(lyr, batches, {n: m for n, m in lyr.named_modules() if isinstance(m, torch.nn.Linear)},
                            GPTQConfig())
        assert built == expect
