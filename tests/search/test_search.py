"""MixLLM Eq. 4 salience (probe method vs brute-force per-sample weight gradients), Algorithm 1 allocation and the
baseline strategies."""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import build_tiny_model
from quantkit.errors import QuantkitError
from quantkit.model import iter_linears
from quantkit.quant.grid import fake_quantize
from quantkit.search.allocate import BitBudget, allocate, assign_ranked, average_bits
from quantkit.search.salience import compute_salience, sample_loss
from quantkit.search.strategies import check_strategy, magnitude_scores, random_scores

# awkward shapes: K = 64 and 200 are not multiples of the group size 48, N = 200/64/32 rows
SHAPES = dict(hidden_size=64, intermediate_size=200)


def quantizer(name, w):
    return fake_quantize(w, 4, 48, False)


def brute_force(model, ids, quant, first_order=True):
    """Eq. 4 straight from its definition: a full backward per sample, the weight gradient G_d, s1 = ΣG_d⊙Δ."""
    model = copy.deepcopy(model)
    lins = dict(iter_linears(model))
    for p in model.parameters():
        p.requires_grad_(True)
    total = {n: torch.zeros(lin.weight.shape[0], dtype=torch.float64) for n, lin in lins.items()}
    for d in range(ids.shape[0]):
        model.zero_grad()
        sample_loss(model(input_ids=ids[d:d + 1]).logits, ids[d:d + 1]).backward()
        for n, lin in lins.items():
            w = lin.weight.detach()
            s1 = (lin.weight.grad.double() * (quant(n, w.float()) - w.float()).double()).sum(1)
            total[n] += (s1 + 0.5 * s1 * s1).abs() if first_order else 0.5 * s1 * s1
    return {n: t / ids.shape[0] for n, t in total.items()}


@pytest.fixture(scope="module")
def tiny():
    model = build_tiny_model("llama", seed=0, **SHAPES).float()
    ids = torch.randint(0, model.config.vocab_size, (3, 19), generator=torch.Generator().manual_seed(1))
    return model, ids


def _assert_scores_equal(got, want):
    assert list(got) == list(want)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=1e-5, atol=1e-6 * want[n].abs().max().item())


@pytest.mark.parametrize("batch_size,checkpoint", [(1, True), (2, False), (3, True)])
def test_eq4_matches_brute_force(tiny, batch_size, checkpoint):
    model, ids = tiny
    got = compute_salience(model, ids, quantizer, batch_size=batch_size, checkpoint_layers=checkpoint)
    assert got.samples == 3 and got.first_order
    _assert_scores_equal(got.scores, brute_force(model, ids, quantizer))


def test_first_order_toggle(tiny):
    model, ids = tiny
    without = compute_salience(model, ids, quantizer, first_order=False, batch_size=2)
    _assert_scores_equal(without.scores, brute_force(model, ids, quantizer, first_order=False))
    with_first = compute_salience(model, ids, quantizer, batch_size=2)
    # the first-order term dominates for small s1, so dropping it changes the scores
    name = next(iter(with_first.scores))
    assert not torch.allclose(without.scores[name], with_first.scores[name], rtol=0.1)


@pytest.mark.parametrize("arch", ["qwen3", "mistral"])
def test_eq4_other_families(arch):
    model = build_tiny_model(arch, seed=2, hidden_size=64, intermediate_size=96).float()
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    _assert_scores_equal(compute_salience(model, ids, quantizer, batch_size=2).scores,
                         brute_force(model, ids, quantizer))


def test_checkpointing_recomputes_and_leaves_model_unchanged(tiny):
    model, ids = tiny
    calls = []
    lin = next(mod for _, mod in iter_linears(model))
    h = lin.register_forward_hook(lambda *a: calls.append(1))
    compute_salience(model, ids[:1], quantizer, checkpoint_layers=True)
    h.remove()
    assert len(calls) == 2  # the forward and its recomputation in backward
    assert all(not p.requires_grad or p.grad is None for p in model.parameters())
    assert all("forward" not in layer.__dict__ for layer in model.model.layers)
    assert not any(m._forward_hooks for m in model.modules())
    with torch.no_grad():
        before = model(input_ids=ids).logits
    assert torch.isfinite(before).all()


def test_offloaded_weights_give_the_same_scores(tiny):
    accelerate = pytest.importorskip("accelerate")
    model, ids = tiny
    off = copy.deepcopy(model)
    accelerate.cpu_offload(off, execution_device="cpu")
    assert next(mod for _, mod in iter_linears(off)).weight.device.type == "meta"
    _assert_scores_equal(compute_salience(off, ids, quantizer).scores, compute_salience(model, ids, quantizer).scores)


def _top_overlap(a, b, frac=0.1):
    fa = torch.cat(list(a.values()))
    fb = torch.cat(list(b.values()))
    k = max(1, int(frac * fa.numel()))
    ta, tb = set(fa.topk(k).indices.tolist()), set(fb.topk(k).indices.tolist())
    return len(ta & tb) / k


def test_half_precision_ranks_like_fp32(tiny):
    model, ids = tiny
    ids = ids[:2]
    ref = compute_salience(model, ids, quantizer).scores
    bf = compute_salience(model, ids, quantizer, autocast_dtype=torch.bfloat16).scores
    fp16 = compute_salience(copy.deepcopy(model).half(), ids, quantizer).scores  # loss-scaled fp16 backward
    for got in (bf, fp16):
        assert all(torch.isfinite(v).all() for v in got.values())
        assert _top_overlap(ref, got) >= 0.8


def test_skip_and_progress(tiny):
    model, ids = tiny
    seen, lin_seen = [], []
    names = [n for n, _ in iter_linears(model)]
    res = compute_salience(model, ids, quantizer, batch_size=2, skip={names[0]},
                           progress=lambda d, n: seen.append((d, n)), on_linear=lambda d, n: lin_seen.append(d))
    assert names[0] not in res.scores and len(res.scores) == len(names) - 1
    assert seen == [(2, 3), (3, 3)]
    assert lin_seen == list(range(1, len(names)))


def test_bad_calibration_shape(tiny):
    model, _ = tiny
    with pytest.raises(QuantkitError, match="seqlen >= 2"):
        compute_salience(model, torch.zeros(2, 1, dtype=torch.long), quantizer)


# ---------------------------------------------------------------------------------------------- allocation

def random_layers(seed=0, shapes=((33, 200), (7, 328), (64, 64), (40, 128))):
    g = torch.Generator().manual_seed(seed)
    scores = {f"layers.{i}.proj": torch.rand(n, generator=g, dtype=torch.float64) ** 3 for i, (n, _) in
              enumerate(shapes)}
    in_features = {f"layers.{i}.proj": k for i, (_, k) in enumerate(shapes)}
    return scores, in_features


def _elements(row_bits, in_features, bits):
    return sum(int((rb == bits).sum()) * in_features[n] for n, rb in row_bits.items())


@pytest.mark.parametrize("target", [4.0, 4.1, 4.4, 5.0, 7.3, 8.0])
def test_target_within_one_channel(target):
    scores, kf = random_layers()
    rb = allocate(scores, kf, BitBudget.parse([8, 4], target))
    avg = average_bits(rb, kf)
    total = sum(s.numel() * kf[n] for n, s in scores.items())
    assert avg <= target + 1e-12
    assert target - avg < max(kf.values()) * 4 / total
    # global: every 8-bit channel outranks every 4-bit one (Algorithm 1, lines 11-12)
    flat_s = torch.cat([scores[n] for n in scores])
    flat_b = torch.cat([rb[n] for n in scores])
    if (flat_b == 8).any() and (flat_b == 4).any():
        assert flat_s[flat_b == 8].min() >= flat_s[flat_b == 4].max()


def test_target_exact_fit_is_not_lost_to_rounding():
    scores = {"a": torch.tensor([3.0, 2.0, 1.0, 0.5, 0.25]), "b": torch.tensor([2.5, 0.1])}
    kf = {"a": 10, "b": 30}
    # 50 + 60 = 110 elements; 8 bits for channels a0, b0, a1 = 50 elements -> 4 + 4·50/110
    rb = allocate(scores, kf, BitBudget.parse([4, 8], 4 + 4 * 50 / 110))
    assert rb["a"].tolist() == [8, 8, 4, 4, 4] and rb["b"].tolist() == [8, 4]


def test_fractions_three_widths():
    scores, kf = random_layers(1)
    budget = BitBudget.parse([3, 4, 6], fractions=[0.3, 0.6, 0.1])
    rb = allocate(scores, kf, budget)
    total = sum(s.numel() * kf[n] for n, s in scores.items())
    slack = max(kf.values()) / total
    share6 = _elements(rb, kf, 6) / total
    share46 = (_elements(rb, kf, 4) + _elements(rb, kf, 6)) / total
    assert 0.1 - slack < share6 <= 0.1 + 1e-12
    assert 0.7 - slack < share46 <= 0.7 + 1e-12
    flat_s = torch.cat([scores[n] for n in scores])
    flat_b = torch.cat([rb[n] for n in scores])
    assert flat_s[flat_b == 6].min() >= flat_s[flat_b == 4].max()
    assert flat_s[flat_b == 4].min() >= flat_s[flat_b == 3].max()


def test_fractions_order_follows_bits_argument():
    scores, kf = random_layers(2)
    a = allocate(scores, kf, BitBudget.parse([3, 4, 6], fractions=[0.3, 0.6, 0.1]))
    b = allocate(scores, kf, BitBudget.parse([6, 3, 4], fractions=[0.1, 0.3, 0.6]))
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_target_three_widths_greedy_fill():
    scores, kf = random_layers(3)
    rb = allocate(scores, kf, BitBudget.parse([3, 4, 6], 3.9))
    avg = average_bits(rb, kf)
    total = sum(s.numel() * kf[n] for n, s in scores.items())
    assert 3.9 - 3 * max(kf.values()) / total < avg <= 3.9 + 1e-12
    flat_s = torch.cat([scores[n] for n in scores])
    flat_b = torch.cat([rb[n] for n in scores])
    assert len(set(flat_b.tolist())) == 3
    # monotone: a more salient channel never gets fewer bits
    order = torch.argsort(flat_s, descending=True)
    assert (flat_b[order][1:] <= flat_b[order][:-1]).all()


def test_greedy_fill_matches_the_marginal_gain_rule():
    # two equal-weight channels, bits 3/4/6, budget for three extra bits: gains per bit are S·1/16 (3→4) and
    # S·3/128 (4→6); S=(10, 1): 10/16, then 10·3/128 (=0.234) beats 1/16 (=0.0625) → channel 0 at 6, channel 1 at 3
    bits = assign_ranked(torch.tensor([10.0, 1.0]), torch.tensor([1.0, 1.0]), BitBudget.parse([3, 4, 6], 4.5))
    assert bits.tolist() == [6, 3]
    bits = assign_ranked(torch.tensor([1.0, 1.0]), torch.tensor([1.0, 1.0]), BitBudget.parse([3, 4, 6], 4.0))
    assert bits.tolist() == [4, 4]


def test_local_gives_every_layer_the_same_share():
    scores, kf = random_layers(4, shapes=((40, 64), (80, 200), (20, 328)))
    rb = allocate(scores, kf, BitBudget.parse([4, 8], 4.4), local=True)
    for n, r in rb.items():
        n_hi = int((r == 8).sum())
        assert n_hi == int(0.1 * r.numel() + 1e-9)
        assert scores[n][r == 8].min() >= scores[n][r == 4].max()


def test_ties_are_reproducible():
    scores = {"a": torch.ones(6, dtype=torch.float64), "b": torch.ones(4, dtype=torch.float64)}
    kf = {"a": 10, "b": 10}
    rb = allocate(scores, kf, BitBudget.parse([4, 8], 4.0 + 4 * 0.3))
    # equal scores: model order (layer a first, then channel index) decides
    assert rb["a"].tolist() == [8, 8, 8, 4, 4, 4] and rb["b"].tolist() == [4, 4, 4, 4]


def test_average_bits_with_metadata():
    rb = {"x": torch.tensor([4, 4, 8]), "y": torch.tensor([4])}
    kf = {"x": 200, "y": 64}

    def spec(name, bits):
        return (bits, 128, bits == 8)  # 4-bit asym g128, 8-bit sym g128 (MixLLM Sec. 4.1)

    elements = 3 * 200 + 64
    plain = (2 * 200 * 4 + 200 * 8 + 64 * 4) / elements
    assert average_bits(rb, kf) == pytest.approx(plain)
    # x: 2 groups per row (K=200, short last group); y: 1 group. 4-bit asym: fp16 scale + 4-bit zero per group
    meta = (2 * 2 * (16 + 4) + 1 * 2 * 16 + 1 * (16 + 4)) / elements
    assert average_bits(rb, kf, spec) == pytest.approx(plain + meta)


@pytest.mark.parametrize("kwargs,match", [
    (dict(bits=[4]), "two distinct"), (dict(bits=[4, 4], target=4.2), "lists a bit-width twice"),
    (dict(bits=[4, 8], fractions=[float("nan"), float("nan")]), "sum to 1"),
    (dict(bits=[4, 9], target=4.4), "2..8"), (dict(bits=[4, 8]), "exactly one"),
    (dict(bits=[4, 8], target=4.4, fractions=[0.5, 0.5]), "exactly one"),
    (dict(bits=[4, 8], target=3.5), "outside"), (dict(bits=[4, 8], fractions=[0.5]), "one fraction"),
    (dict(bits=[4, 8], fractions=[0.5, 0.6]), "sum to 1")])
def test_budget_errors(kwargs, match):
    with pytest.raises(QuantkitError, match=match):
        BitBudget.parse(kwargs.pop("bits"), **kwargs)


# ---------------------------------------------------------------------------------------------- baselines

def test_random_scores_seeded():
    shapes = {"a": 7, "b": 33}
    a, b, c = random_scores(shapes, 0), random_scores(shapes, 0), random_scores(shapes, 1)
    assert all(torch.equal(a[n], b[n]) for n in shapes)
    assert not torch.equal(a["b"], c["b"])
    assert [v.numel() for v in a.values()] == [7, 33]


def test_magnitude_scores_are_row_norms(tiny):
    model, _ = tiny
    got = magnitude_scores(model)
    for n, lin in iter_linears(model):
        torch.testing.assert_close(got[n], lin.weight.double().norm(dim=1))


def test_unknown_strategy():
    with pytest.raises(QuantkitError, match="unknown strategy 'best'"):
        check_strategy("best")


def test_layers_are_recomputed_only_when_activations_would_crowd_memory(tiny, monkeypatch):
    """checkpoint_layers=None: no recomputation while the saved activations fit a quarter of free memory."""
    import quantkit.search.salience as sal

    model, ids = tiny
    lin = next(mod for _, mod in iter_linears(model))
    for free, expect in ((1 << 40, 1), (1, 2)):
        monkeypatch.setattr("quantkit.model.memory.free_memory", lambda device, _f=free: _f)
        calls = []
        h = lin.register_forward_hook(lambda *a: calls.append(1))
        got = compute_salience(model, ids[:1], quantizer)
        h.remove()
        assert len(calls) == expect
        _assert_scores_equal(got.scores, brute_force(model, ids[:1], quantizer))
    assert sal.activation_bytes(model, 100) > 0
