"""Tiny random models built locally from transformers configs (no network), shared by the tests."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if not torch.cuda.is_available():
    # the kernel tests run Triton on the CPU interpreter, which must be chosen before any test imports triton
    os.environ.setdefault("TRITON_INTERPRET", "1")

TINY = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256, vocab_size=512)


def tiny_config(arch: str = "llama", **over):
    """A tiny config for one of the supported families (GQA: 4 query heads, 2 KV heads)."""
    from transformers import (LlamaConfig, MistralConfig, MixtralConfig, Qwen2Config, Qwen2MoeConfig, Qwen3Config,
                              Qwen3MoeConfig)

    cls = {"llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config,
           "mixtral": MixtralConfig, "qwen2_moe": Qwen2MoeConfig, "qwen3_moe": Qwen3MoeConfig}[arch]
    kw = dict(TINY)
    if arch in ("qwen3", "qwen3_moe"):
        kw["head_dim"] = 16
    if arch == "mixtral":  # 4 experts, 2 per token
        kw.update(num_local_experts=4, num_experts_per_tok=2)
    if arch in ("qwen2_moe", "qwen3_moe"):  # 4 experts of 96, 2 per token (Qwen2-MoE: a shared expert of 128)
        kw.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=96, decoder_sparse_step=1,
                  mlp_only_layers=[])
        if arch == "qwen2_moe":
            kw["shared_expert_intermediate_size"] = 128
    kw.update(over)
    return cls(**kw)


def build_tiny_model(arch: str = "llama", seed: int = 0, **over):
    """A randomly initialised tiny causal LM of the given family, in eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **over))
    # Random init leaves near-uniform predictions; scale weights up so layers do real work in the tests.
    return model.eval()


def shipped_tokenizer():
    """The embedded reference model's tokenizer (a BPE trained on the shipped corpus)."""
    from transformers import AutoTokenizer

    from quantkit.model import builtin_model_dir

    return AutoTokenizer.from_pretrained(builtin_model_dir())


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """Factory: save a tiny model of a family (with the shipped tokenizer) and return its directory."""
    cache = {}

    def make(arch: str = "llama", **over):
        key = (arch, tuple(sorted(over.items())))
        if key not in cache:
            d = tmp_path_factory.mktemp(f"tiny-{arch}")
            tok = shipped_tokenizer()
            model = build_tiny_model(arch, vocab_size=len(tok), **over)
            model.save_pretrained(d)
            tok.save_pretrained(d)
            cache[key] = d
        return cache[key]

    return make


@pytest.fixture
def quantizations(monkeypatch):
    """The shapes of the activations quantized through quantkit.runtime.dispatch (fake-quant forms), in order."""
    from quantkit.runtime import dispatch

    calls = []
    real = dispatch.quantize_activation
    monkeypatch.setattr(dispatch, "quantize_activation", lambda x, *a: calls.append(x.shape) or real(x, *a))
    return calls


@pytest.fixture
def kernel_registry(monkeypatch):
    """quantkit.runtime.dispatch with kernels allowed (QUANTKIT_KERNELS unset) and its kernel, mixed-kernel and norm
    registries replaced by copies for this test, so registrations and clears stay local to it."""
    from quantkit.runtime import dispatch

    monkeypatch.delenv(dispatch.ENV_SWITCH, raising=False)
    for name in ("_KERNELS", "_MIXED", "_NORMS"):
        monkeypatch.setattr(dispatch, name, dict(getattr(dispatch, name)))
    return dispatch


@pytest.fixture(autouse=True)
def no_tuned_tables(tmp_path_factory, monkeypatch):
    """Tests see no tuned launch tables, neither the user's nor the shipped ones (the runtime's defaults are what
    they test); tests of the tables point QUANTKIT_TABLES or tables.SHIPPED_DIR at tables of their own."""
    try:
        from quantkit.runtime.kernels import tables
    except ImportError:
        return
    empty = tmp_path_factory.mktemp("no-tables")
    monkeypatch.setenv(tables.ENV_DIR, str(empty))
    monkeypatch.setattr(tables, "SHIPPED_DIR", empty)
    tables.clear_cache()


@pytest.fixture(autouse=True)
def fresh_kernel_plans():
    """Every test starts and ends with an empty kernel-plan cache (tests patch launch rules and device traits)."""
    try:
        from quantkit.runtime.kernels import gemm, registry
    except ImportError:
        yield
        return
    registry._plan.cache_clear()
    gemm.problem_for.cache_clear()
    yield
    registry._plan.cache_clear()
    gemm.problem_for.cache_clear()
