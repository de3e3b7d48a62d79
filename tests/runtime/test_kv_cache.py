"""The packed KV8 cache (quantkit.runtime.kv_cache): decoding with it gives what the fake-quantized cache of
``eval-ppl --kv-bits 8`` gives, it holds the bytes quant.kv.cache_bytes counts, schemes and models without a packed
path are refused in one line, and the model outside the generator attends as before."""

from __future__ import annotations

import pytest
import torch

from quantkit.errors import QuantkitError
from quantkit.quant import kv
from quantkit.runtime.generate import Generator
from quantkit.runtime.kv_cache import PackedKVCache, check_packable
from tests.conftest import build_tiny_model

KV8 = kv.KVSpec(8)


def test_decoding_with_the_packed_cache_equals_the_fake_quantized_cache():
    ids = torch.randint(1, 500, (2, 13), generator=torch.Generator().manual_seed(3))
    fake = build_tiny_model("llama", seed=5)
    kv.attach_kv_quant(fake, KV8)  # eval-ppl --kv-bits 8: every query reads the cache quantized
    packed = Generator(build_tiny_model("llama", seed=5), max_context=40, prefill_chunk=5, kv=KV8)
    with torch.inference_mode():
        want_logits = fake(ids).logits[:, -1]
        want = fake.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0,
                             attention_mask=torch.ones_like(ids))
    torch.testing.assert_close(packed.prefill(ids), want_logits, rtol=1e-4, atol=1e-4)  # three chunks
    got, stats = packed.generate(ids, 12)
    assert torch.equal(got, want) and stats.new_tokens == 12
    again, _ = packed.generate(ids, 12)  # a second prompt of the same batch reuses the cache
    assert torch.equal(again, want)


def test_the_cache_holds_the_counted_bytes():
    model = build_tiny_model("llama", seed=1)
    cfg = model.config
    cache = PackedKVCache(model, batch=3, max_context=50, spec=KV8, device=torch.device("cpu"))
    per_head = kv.cache_bytes(KV8, 50, cfg.hidden_size // cfg.num_attention_heads)
    assert cache.nbytes() == 3 * cfg.num_key_value_heads * cfg.num_hidden_layers * per_head


@pytest.mark.parametrize("spec,message", [(kv.KVSpec(8, fp8=True), "KV8 or KV4"),
                                          (kv.KVSpec(4, group_size=64, residual=128), "head_dim is 16")])
def test_schemes_without_a_packed_path_are_refused(spec, message):
    with pytest.raises(QuantkitError, match=message):
        Generator(build_tiny_model("llama"), max_context=16, kv=spec)


def test_sliding_window_layers_are_refused():
    model = build_tiny_model("llama")
    model.config.layer_types = ["sliding_attention"] * model.config.num_hidden_layers
    with pytest.raises(QuantkitError, match="sliding-window"):
        check_packable(model, KV8)


def test_the_model_called_outside_the_generator_attends_as_before():
    ids = torch.randint(1, 500, (1, 9), generator=torch.Generator().manual_seed(4))
    plain = build_tiny_model("llama", seed=6)
    want = plain(ids).logits
    model = build_tiny_model("llama", seed=6)
    Generator(model, max_context=20, kv=KV8).generate(ids, 3)
    torch.testing.assert_close(model(ids).logits, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_a_compiled_decode_step_writes_and_reads_the_packed_cache(backend):
    ids = torch.randint(1, 500, (2, 7), generator=torch.Generator().manual_seed(8))
    want, _ = Generator(build_tiny_model("llama", seed=2), max_context=24, kv=KV8).generate(ids, 8)
    torch._dynamo.reset()
    gen = Generator(build_tiny_model("llama", seed=2), max_context=24, kv=KV8, compile_decode=True, backend=backend)
    got, _ = gen.generate(ids, 8)
    assert torch.equal(got, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the decode kernel over the packed cache needs a GPU")
@pytest.mark.parametrize("spec,over", [(KV8, {}), (kv.KVSpec(4, group_size=8, residual=8), {}),
                                       (kv.KVSpec(4, group_size=8, residual=8),
                                        {"num_attention_heads": 2, "num_key_value_heads": 1})])
def test_on_a_gpu_decode_runs_the_kernels_compiled_and_eager_alike(spec, over):
    """Head size 32 takes the KV4 kernel; 16 (below the kernel's smallest) the torch form."""
    ids = torch.randint(1, 500, (3, 9), generator=torch.Generator().manual_seed(9)).cuda()
    fake = build_tiny_model("llama", seed=3, **over).half().cuda()
    kv.attach_kv_quant(fake, spec)
    with torch.inference_mode():
        want = fake.generate(ids, max_new_tokens=10, min_new_tokens=10, do_sample=False, pad_token_id=0,
                             attention_mask=torch.ones_like(ids))
    eager, _ = Generator(build_tiny_model("llama", seed=3, **over).half().cuda(), max_context=32,
                         kv=spec).generate(ids, 10)
    torch._dynamo.reset()
    graphed = Generator(build_tiny_model("llama", seed=3, **over).half().cuda(), max_context=32, kv=spec,
                        compile_decode=True)
    got, _ = graphed.generate(ids, 10)
    assert torch.equal(got, eager)
    assert (eager == want).float().mean() > 0.9  # fp16 sums in another order may flip a near-tie


@pytest.mark.parametrize("chunk", [5, 30])  # prompt chunks shorter and longer than the fp16 window's ring
def test_kv4_decoding_equals_the_fake_quantized_cache(chunk):
    spec = kv.KVSpec(4, group_size=8, residual=8)  # small blocks and window: the tiny run quantizes many blocks
    ids = torch.randint(1, 500, (2, 37), generator=torch.Generator().manual_seed(11))
    fake = build_tiny_model("llama", seed=12)
    kv.attach_kv_quant(fake, spec)
    with torch.inference_mode():
        want_logits = fake(ids).logits[:, -1]
        want = fake.generate(ids, max_new_tokens=20, min_new_tokens=20, do_sample=False, pad_token_id=0,
                             attention_mask=torch.ones_like(ids))
    packed = Generator(build_tiny_model("llama", seed=12), max_context=60, prefill_chunk=chunk, kv=spec)
    torch.testing.assert_close(packed.prefill(ids), want_logits, rtol=1e-4, atol=1e-4)
    got, _ = packed.generate(ids, 20)
    assert torch.equal(got, want)
    torch._dynamo.reset()
    graphed = Generator(build_tiny_model("llama", seed=12), max_context=60, prefill_chunk=chunk, kv=spec,
                        compile_decode=True, backend="eager")
    assert torch.equal(graphed.generate(ids, 20)[0], want)


def test_kv4_cache_bytes():
    model = build_tiny_model("llama", seed=1)
    spec = kv.KVSpec(4, group_size=8, residual=16)
    cache = PackedKVCache(model, batch=2, max_context=64, spec=spec, device=torch.device("cpu"))
    cfg = model.config
    d = cfg.hidden_size // cfg.num_attention_heads
    per_head = 64 * d // 2 * 2 + 64 // 8 * d * 4 + 64 * (d // 8) * 4 + (16 + 16) * d * 2 * 2
    assert cache.nbytes() == 2 * cfg.num_key_value_heads * cfg.num_hidden_layers * per_head


def test_kv4_takes_the_kernel_only_for_head_sizes_it_serves():
    spec = kv.KVSpec(4, group_size=8, residual=8)
    small = PackedKVCache(build_tiny_model("llama"), 1, 32, spec, torch.device("cpu"))  # head size 16
    wide = PackedKVCache(build_tiny_model("llama", num_attention_heads=2, num_key_value_heads=1), 1, 32, spec,
                         torch.device("cpu"))  # head size 32
    assert not small.kernel and wide.kernel
