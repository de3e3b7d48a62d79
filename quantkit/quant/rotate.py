"""Residual-stream rotation: an orthogonal Q folded into the weights so that per-token A8 meets no outlier channels.

QuaRot (Ashkboos et al. 2024, Sec. 4, "R1") and SpinQuant (Liu et al. 2024, R1): the hidden state h of every
decoder layer is replaced by h·Q for one orthogonal Q. RMSNorm(h·Q) = RMSNorm(h)·Q once the norm's scale γ is
folded into the linears that read it, so the model computes the same function with

* the token embeddings E ← E·Q,
* every linear that reads the residual stream (q/k/v, gate/up, lm_head) W ← W·diag(γ)·Q, its norm's γ ← 1,
* every linear that writes it (o_proj, down_proj) W ← Qᵀ·W (and its bias b ← b·Q).

A random Hadamard Q spreads each outlier channel over all channels (incoherence processing), which is what per-token
8-bit activations need; it costs nothing at run time because every factor is folded offline, and the kernels read
the rotated weights unchanged. Q is a Walsh–Hadamard matrix with random signs when the hidden size is a power of
two, else the Kronecker product of the largest such Hadamard factor with a random orthogonal matrix of the odd
remainder (QuaRot pairs powers of two with known Hadamard orders; a random orthogonal factor serves any order).

The inputs of o_proj and down_proj stay unrotated: QuaRot rotates them online (a Hadamard transform inside
attention and before down_proj), which the kernels do not do; SmoothQuant (:mod:`quantkit.quant.smooth`) covers them
when both are on. Tied embeddings are untied (lm_head gets its own copy): the checkpoint grows by one embedding
matrix.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from quantkit.errors import QuantkitError
from quantkit.model.walk import find_decoder_layers


def hadamard(n: int) -> torch.Tensor:
    """The n × n Walsh–Hadamard matrix (Sylvester construction) divided by √n, n a power of two (float64)."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Sylvester Hadamard matrices have power-of-two orders, got {n}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / n ** 0.5


def rotation_matrix(n: int, seed: int = 0) -> torch.Tensor:
    """An n × n orthogonal matrix (float64): random-sign Hadamard ⊗ random orthogonal of the odd part of n
    (module docstring), deterministic in ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    two = n & -n  # the largest power of two dividing n
    odd = n // two
    signs = torch.randint(0, 2, (n,), generator=gen, dtype=torch.float64) * 2 - 1
    q = hadamard(two)
    if odd > 1:
        r, upper = torch.linalg.qr(torch.randn(odd, odd, generator=gen, dtype=torch.float64))
        r = r * torch.sign(torch.diagonal(upper)).unsqueeze(0)  # a uniformly random orthogonal matrix (Haar)
        q = torch.kron(q, r.contiguous())
    return signs.unsqueeze(1) * q


def _set(param: torch.Tensor, value: torch.Tensor) -> None:
    param.data.copy_(value.to(dtype=param.dtype, device=param.device))


def _fold_norm(norm: nn.Module, readers: list[nn.Linear]) -> None:
    """W ← W·diag(γ) for every reader of the norm, then γ ← 1 (RMSNorm without a scale commutes with Q)."""
    gamma = norm.weight.detach().double()
    for lin in readers:
        _set(lin.weight, lin.weight.detach().double() * gamma.to(lin.weight.device).unsqueeze(0))
    _set(norm.weight, torch.ones_like(gamma))


def _reads(lin: nn.Linear, q: torch.Tensor) -> None:
    _set(lin.weight, lin.weight.detach().double() @ q.to(lin.weight.device))


def _writes(lin: nn.Linear, q: torch.Tensor) -> None:
    q = q.to(lin.weight.device)
    _set(lin.weight, q.T @ lin.weight.detach().double())
    if lin.bias is not None:
        _set(lin.bias, lin.bias.detach().double() @ q)


@torch.no_grad()
def rotate_model(model: nn.Module, seed: int = 0) -> torch.Tensor:
    """Fold the residual rotation Q (module docstring) into a Llama-like causal LM in place; returns Q.

    A QuantkitError names what is missing when the model is not of that shape (a norm with a bias, say, does not
    commute with Q)."""
    inner = getattr(model, "model", None)
    embed = model.get_input_embeddings()
    head = model.get_output_embeddings()
    final_norm = getattr(inner, "norm", None)
    if embed is None or head is None or final_norm is None:
        raise QuantkitError("the residual rotation needs a causal LM with input embeddings, an lm_head and a final "
                            "norm (model.model.norm); drop activation.rotate for this model")
    _, layers = find_decoder_layers(model)
    for layer in layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        names = ("input_layernorm", "post_attention_layernorm")
        if attn is None or mlp is None or any(getattr(getattr(layer, n, None), "bias", None) is not None
                                              for n in names):
            raise QuantkitError(f"the residual rotation needs Llama-like layers with bias-free RMSNorms; "
                                f"{type(layer).__name__} is not — drop activation.rotate for this model")
    hidden = embed.weight.shape[1]
    q = rotation_matrix(hidden, seed)
    if head.weight is embed.weight:  # tied: lm_head gets its own copy before the two diverge
        head.weight = nn.Parameter(embed.weight.detach().clone())
        model.config.tie_word_embeddings = False
        text_config = getattr(model.config, "get_text_config", None)
        if text_config is not None:
            text_config().tie_word_embeddings = False
    _set(embed.weight, embed.weight.detach().double() @ q.to(embed.weight.device))
    for layer in layers:
        attn, mlp = layer.self_attn, layer.mlp
        _fold_norm(layer.input_layernorm, [attn.q_proj, attn.k_proj, attn.v_proj])
        _fold_norm(layer.post_attention_layernorm, [mlp.gate_proj, mlp.up_proj])
        for lin in (attn.q_proj, attn.k_proj, attn.v_proj, mlp.gate_proj, mlp.up_proj):
            _reads(lin, q)
        _writes(attn.o_proj, q)
        _writes(mlp.down_proj, q)
    _fold_norm(final_norm, [head])
    _reads(head, q)
    return q
