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

Tied embeddings are untied (lm_head gets its own copy): the checkpoint grows by one embedding matrix.

The inputs of o_proj and down_proj cannot be rotated offline: a nonlinearity (attention's softmax, the MLP's SiLU)
sits between them and the residual stream. QuaRot (Sec. 4, "R3/R4": online Hadamard transforms inside attention and
before down_proj) rotates them at run time; :class:`InputRotation` does the same for each of those linears'
inputs, x ↦ x·Q with W ← W·Q folded (x·Q·(W·Q)ᵀ = x·Wᵀ), Q = diag(s)·(H ⊗ … ⊗ H ⊗ C): random signs s,
Walsh–Hadamard factors of at most 128 and, for the odd part of the width, the orthonormal DCT-II matrix C
(deterministic, so a loader rebuilds Q from the width and the seed). x·Q costs one small matmul per factor
(Kronecker-product matrix-vector products) against the linear's own GEMM: 3 × (128 + 16 + 7) multiply-adds per
input element for down_proj of Llama-3.1-8B (14336 = 128·16·7) against 4096 for the GEMM. The kernels read the
folded weights unchanged; the packed model applies the same transform before them (QuantLinear.input_rotation).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from quantkit.errors import QuantkitError
from quantkit.model.walk import find_decoder_layers, untie_output_embeddings


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


ONLINE_MAX_FACTOR = 128  # Hadamard factors of the online rotation: one small dense matmul each
ONLINE_TARGETS = ("self_attn.o_proj", "mlp.down_proj")  # the linears whose inputs rotate online (QuaRot R3/R4)


def dct_matrix(n: int) -> torch.Tensor:
    """The orthonormal DCT-II matrix of order n (float64): row k is √(2/n)·cos(π(2j+1)k / 2n), row 0 scaled by
    1/√2."""
    k = torch.arange(n, dtype=torch.float64).unsqueeze(1)
    j = torch.arange(n, dtype=torch.float64).unsqueeze(0)
    c = torch.cos(torch.pi * (2 * j + 1) * k / (2 * n)) * (2.0 / n) ** 0.5
    c[0] /= 2 ** 0.5
    return c


def online_factors(n: int) -> list[torch.Tensor]:
    """The Kronecker factors of the online rotation of width n (float64): Walsh–Hadamard matrices of at most
    :data:`ONLINE_MAX_FACTOR`, largest first, whose orders multiply to n's largest power-of-two divisor, then the
    DCT-II of the odd remainder (none when n is a power of two)."""
    two, factors = n & -n, []
    while two > 1:
        f = min(two, ONLINE_MAX_FACTOR)
        factors.append(hadamard(f))
        two //= f
    if n // (n & -n) > 1:
        factors.append(dct_matrix(n // (n & -n)))
    return factors


class InputRotation(nn.Module):
    """x ↦ x·Q on the last dimension (module docstring: QuaRot's online rotation of a linear's input), in x's dtype;
    :meth:`fold` gives the weight W·Q that reads the rotated input."""

    def __init__(self, width: int, seed: int = 0, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.width, self.seed = int(width), int(seed)
        gen = torch.Generator().manual_seed(self.seed)
        signs = torch.randint(0, 2, (self.width,), generator=gen, dtype=torch.float64) * 2 - 1
        self.register_buffer("signs", signs.to(dtype), persistent=False)
        self._names = []
        for i, f in enumerate(online_factors(self.width)):
            self.register_buffer(f"factor{i}", f.to(dtype), persistent=False)
            self._names.append(f"factor{i}")

    def extra_repr(self) -> str:
        return f"width={self.width}, seed={self.seed}, factors={[getattr(self, n).shape[0] for n in self._names]}"

    @staticmethod
    def _rotate(x: torch.Tensor, signs: torch.Tensor, factors: list[torch.Tensor]) -> torch.Tensor:
        # (F1 ⊗ … ⊗ Fk) applied mode by mode: contracting the leading mode and appending the result as the last
        # mode cycles the modes back to their order after k steps
        lead, n = x.shape[:-1], x.shape[-1]
        y = (x * signs).reshape(-1, n)
        for f in factors:
            y = torch.matmul(y.reshape(y.shape[0], f.shape[0], -1).transpose(1, 2), f).reshape(y.shape[0], n)
        return y.reshape(*lead, n)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.width:
            raise ValueError(f"InputRotation of width {self.width} got an input of width {x.shape[-1]}")
        factors = [getattr(self, n) for n in self._names]
        if self.signs.dtype != x.dtype:
            return self._rotate(x, self.signs.to(x.dtype), [f.to(x.dtype) for f in factors])
        return self._rotate(x, self.signs, factors)

    def fold(self, weight: torch.Tensor) -> torch.Tensor:
        """W·Q (float64) for a weight W [N, width] that reads this rotation's input."""
        gen = torch.Generator().manual_seed(self.seed)
        signs = torch.randint(0, 2, (self.width,), generator=gen, dtype=torch.float64) * 2 - 1
        return self._rotate(weight.detach().double().cpu(), signs, online_factors(self.width))


def _rotate_input(module: nn.Module, args: tuple) -> tuple:
    return (module.input_rotation(args[0]), *args[1:])


@torch.no_grad()
def rotate_inputs_online(model: nn.Module, seed: int = 0, skipped: set[str] = frozenset()) -> list[str]:
    """Give the o_proj and down_proj of every decoder layer an online input rotation (module docstring), in place:
    W ← W·Q, and a forward pre-hook (ahead of any other) that maps the input x to x·Q. Returns the linears' names.
    A QuantkitError names a layer that is not Llama-like, or a target in ``skipped`` (a linear the recipe leaves
    unquantized, which a packed checkpoint stores as a plain linear with no place for the rotation)."""
    prefix, layers = find_decoder_layers(model)
    names = []
    for i, layer in enumerate(layers):
        for target in ONLINE_TARGETS:
            try:
                lin = layer.get_submodule(target)
            except AttributeError:
                lin = None
            if not isinstance(lin, nn.Linear):
                raise QuantkitError(f"activation.online_rotate rotates the inputs of {' and '.join(ONLINE_TARGETS)}; "
                                    f"{type(layer).__name__} has no linear '{target}' — drop it for this model")
            name = f"{prefix}.{i}.{target}"
            if name in skipped:
                raise QuantkitError(f"activation.online_rotate needs '{name}' quantized, but the recipe skips it; "
                                    "remove that skip or the online rotation")
            rot = InputRotation(lin.in_features, seed, lin.weight.dtype).to(lin.weight.device)
            _set(lin.weight, rot.fold(lin.weight))
            lin.input_rotation = rot
            lin.register_forward_pre_hook(_rotate_input, prepend=True)
            names.append(name)
    return names


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
        dense_mlp = mlp is not None and all(isinstance(getattr(mlp, n, None), nn.Linear)
                                            for n in ("gate_proj", "up_proj", "down_proj"))  # not a MoE block
        if attn is None or not dense_mlp or any(getattr(getattr(layer, n, None), "bias", None) is not None
                                                for n in names):
            raise QuantkitError(f"the residual rotation needs Llama-like layers (bias-free RMSNorms, one gate/up/down "
                                f"MLP); {type(layer).__name__} is not — drop activation.rotate for this model "
                                "(a recipe without 'rotated' or quarot)")
    hidden = embed.weight.shape[1]
    q = rotation_matrix(hidden, seed)
    untie_output_embeddings(model)  # tied: lm_head gets its own copy before the two diverge
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
