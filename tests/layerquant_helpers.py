"""Inputs with the structure real LLM activations have (correlated channels, a few outlier channels), shared by
the GPTQ and AWQ tests. Isotropic random inputs would hide exactly what these methods exploit: GPTQ the
off-diagonal Hessian, AWQ the channels of large magnitude."""

from __future__ import annotations

import torch

from tests.conftest import build_tiny_model


def correlated_inputs(t: int, k: int, seed: int, sample_seed: int | None = None, outliers: int = 3,
                      outlier_gain: float = 8.0) -> torch.Tensor:
    """X [t, k] = Z·A (A a random mixing matrix) + small noise, with ``outliers`` channels amplified. ``seed``
    fixes the distribution (A, outlier channels), ``sample_seed`` (default: seed) the samples drawn from it."""
    gen = torch.Generator().manual_seed(seed)
    mixing = torch.randn(k, k, generator=gen) / k ** 0.5
    loud = torch.randperm(k, generator=gen)[:outliers]
    gen = torch.Generator().manual_seed(seed if sample_seed is None else sample_seed)
    x = torch.randn(t, k, generator=gen) @ mixing + 0.1 * torch.randn(t, k, generator=gen)
    x[:, loud] *= outlier_gain
    return x


def correlated_tiny_model(arch: str, seed: int = 0, **over):
    """A tiny model (conftest) whose token embeddings are correlated with outlier channels and whose matrices
    and biases are random with unit-gain scale, so every layer does real work on structured inputs."""
    model = build_tiny_model(arch, seed=seed, **over)
    gen = torch.Generator().manual_seed(seed + 1000)
    emb = model.get_input_embeddings().weight
    with torch.no_grad():
        emb.copy_(0.5 * correlated_inputs(emb.shape[0], emb.shape[1], seed))
        for name, p in model.named_parameters():
            if p is emb:
                continue
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:  # norm weights: not all ones, so folding into them is exercised
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
    return model


def token_ids(model, n: int, seqlen: int, seed: int) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (n, seqlen), generator=torch.Generator().manual_seed(seed))
