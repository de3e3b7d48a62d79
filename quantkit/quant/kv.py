"""Low-bit KV cache: the quantization schemes, their packed storage, and the attention that reads them as decode
would, for accuracy runs (``eval-ppl --kv-bits``, the recipe's ``kv``).

Schemes (``KVSpec``), all on keys after RoPE, as the cache holds them:

* **KV8**: int8, asymmetric, one scale and minimum per token and head (over head_dim). Every token is read
  quantized, the newest too (decode writes it before it attends).
* **KV4** (KIVI, Liu et al. 2024, Sec. 3.2 and Alg. 1; BitDecoding's residual cache): keys per channel over blocks of
  ``group_size`` tokens (keys have outlier channels, so each channel gets its own range), values per token over
  groups of ``group_size`` channels; the latest ``residual`` tokens stay in fp16 and a block is quantized once it
  leaves that window whole, so a cache of L tokens holds :func:`quantized_prefix` (L) quantized ones.
* **KV-FP8**: e4m3 with one scale per token and head (absmax / 448), what vLLM and TensorRT-LLM users deploy.

Integer codes are stored as unsigned bytes (KV4: two codes a byte along head_dim, low nibble first) with fp16
scale and minimum, x̂ = q·s + m; :func:`pack` / :func:`unpack` are that storage, and :func:`fake_quant` is their
round trip. :func:`attention` computes softmax(q·k̂ᵀ)·v̂ with each query reading the keys and values that its
decode step would find quantized (those below its cache length's quantized prefix) in their dequantized form and
the rest in full precision, so a prefill-only perplexity run scores what decoding with that cache would.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8_MAX = 448.0  # largest finite float8_e4m3fn


@dataclass(frozen=True)
class KVSpec:
    """One KV-cache scheme (module docstring): ``bits`` 8 or 4, ``fp8`` for e4m3 (bits 8), and for KV4 the
    ``group_size`` (key tokens per block, value channels per group) and the fp16 ``residual`` window."""

    bits: int
    fp8: bool = False
    group_size: int = 32
    residual: int = 128

    def __post_init__(self):
        if self.bits not in (4, 8) or (self.fp8 and self.bits != 8):
            raise ValueError(f"a KV cache is int8, int4 or fp8 (bits 8); got bits={self.bits}, fp8={self.fp8}")
        if self.bits == 4 and (self.group_size < 1 or self.residual < 0 or self.residual % self.group_size):
            raise ValueError(f"KV4 needs group_size ≥ 1 and a residual window that is a whole number of groups; got "
                             f"group_size={self.group_size}, residual={self.residual}")

    @property
    def label(self) -> str:
        if self.fp8:
            return "kv-fp8"
        return "kv8" if self.bits == 8 else f"kv4-g{self.group_size}-r{self.residual}"


def parse_kv_bits(text: str) -> KVSpec:
    """The ``--kv-bits`` option: ``8``, ``4`` (KIVI defaults: group 32, residual 128) or ``fp8``."""
    from quantkit.errors import QuantkitError

    key = str(text).strip().lower()
    if key == "fp8":
        return KVSpec(8, fp8=True)
    if key in ("8", "4"):
        return KVSpec(int(key))
    raise QuantkitError(f"--kv-bits is 8, 4 or fp8, got {text!r}")


def quantized_prefix(cache_len: torch.Tensor, spec: KVSpec) -> torch.Tensor:
    """How many of the oldest tokens a cache of ``cache_len`` tokens holds quantized: all of them for KV8 and
    KV-FP8; for KV4 the whole ``group_size`` blocks older than the latest ``residual`` tokens."""
    if spec.bits == 8:
        return cache_len
    g = spec.group_size
    return ((cache_len - spec.residual).clamp(min=0) // g) * g


def cache_bytes(spec: KVSpec | None, tokens: int, head_dim: int) -> int:
    """Bytes that keys and values of ``tokens`` tokens take for one sequence and KV head in :func:`pack`'s form
    (``spec`` None: fp16), scales and the fp16 residual included."""
    if spec is None:
        return tokens * head_dim * 2 * 2
    if spec.bits == 8:
        return 2 * tokens * (head_dim + 4)  # a byte per element; fp16 scale and minimum (fp8: one fp32 scale)
    n = int(quantized_prefix(torch.tensor(tokens), spec))
    g = spec.group_size
    keys = n * head_dim // 2 + (n // g) * head_dim * 4  # nibbles; per block and channel fp16 scale and minimum
    values = n * head_dim // 2 + n * (head_dim // g) * 4  # nibbles; per token and channel group the same
    return keys + values + (tokens - n) * head_dim * 2 * 2


def _affine(x: torch.Tensor, dim: int, bits: int) -> dict:
    """Asymmetric codes of ``x`` with one fp16 scale and minimum per slice along ``dim`` reduced (x̂ = q·s + m)."""
    qmax = 2 ** bits - 1
    xf = x.float()
    lo, hi = xf.amin(dim, keepdim=True), xf.amax(dim, keepdim=True)
    s = ((hi - lo) / qmax).half().clamp(min=2 ** -24)  # a constant slice: codes 0, x̂ = m
    m = lo.half()
    q = torch.round((xf - m.float()) / s.float()).clamp(0, qmax).to(torch.uint8)
    return {"codes": q, "scale": s, "min": m}


def _dequant_affine(p: dict, dtype: torch.dtype) -> torch.Tensor:
    return (p["codes"].float() * p["scale"].float() + p["min"].float()).to(dtype)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes a byte along the last dimension (even length), low nibble first."""
    return (codes[..., 0::2] | (codes[..., 1::2] << 4)).to(torch.uint8)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The codes :func:`pack_nibbles` stored."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def pack(x: torch.Tensor, spec: KVSpec, kind: str) -> dict:
    """The stored form of keys or values ``x`` [B, H, S, D] (``kind`` "k" or "v") under ``spec``: codes (KV4:
    nibble-packed), fp16 scale and minimum (KV-FP8: e4m3 values and an fp32 scale). KV4 keys quantize whole
    ``group_size``-token blocks only (a tail block stays unquantized in ``x``, as the cache keeps it in fp16)."""
    b, h, s, d = x.shape
    if spec.fp8:
        scale = (x.float().abs().amax(-1, keepdim=True) / FP8_MAX).clamp(min=1e-12)
        return {"values": (x.float() / scale).to(torch.float8_e4m3fn), "scale": scale}
    if spec.bits == 8:
        return _affine(x, -1, 8)
    g = spec.group_size
    if kind == "k":
        whole = (s // g) * g
        p = _affine(x[:, :, :whole].reshape(b, h, whole // g, g, d), 3, 4)  # per channel of each block
        p["codes"] = p["codes"].reshape(b, h, whole, d)
    else:
        if d % g:
            raise ValueError(f"KV4 value groups of {g} channels do not divide head_dim {d}")
        p = _affine(x.reshape(b, h, s, d // g, g), -1, 4)
        p["codes"] = p["codes"].reshape(b, h, s, d)
    if d % 2:
        raise ValueError(f"KV4 packs two codes a byte along head_dim; {d} is odd")
    p["codes"] = pack_nibbles(p["codes"])
    return p


def unpack(p: dict, spec: KVSpec, kind: str, like: torch.Tensor) -> torch.Tensor:
    """Dequantized keys or values in ``like``'s shape and dtype from :func:`pack`'s form (KV4 keys: the tail that
    did not fill a block is copied from ``like``)."""
    if spec.fp8:
        return (p["values"].float() * p["scale"]).to(like.dtype)
    if spec.bits == 8:
        return _dequant_affine(p, like.dtype)
    b, h, s, d = like.shape
    g = spec.group_size
    codes = unpack_nibbles(p["codes"])
    if kind == "k":
        whole = codes.shape[2]
        q = {"codes": codes.reshape(b, h, whole // g, g, d), "scale": p["scale"], "min": p["min"]}
        out = like.clone()
        out[:, :, :whole] = _dequant_affine(q, like.dtype).reshape(b, h, whole, d)
        return out
    q = {"codes": codes.reshape(b, h, s, d // g, g), "scale": p["scale"], "min": p["min"]}
    return _dequant_affine(q, like.dtype).reshape(b, h, s, d)


def fake_quant(x: torch.Tensor, spec: KVSpec, kind: str) -> torch.Tensor:
    """``unpack(pack(x))``: keys or values as the cache returns them once quantized."""
    return unpack(pack(x, spec, kind), spec, kind, x)


def _repeat_heads(x: torch.Tensor, rep: int) -> torch.Tensor:
    return x if rep == 1 else x.repeat_interleave(rep, dim=1)


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, spec: KVSpec,
              attention_mask: torch.Tensor | None = None, scaling: float | None = None) -> torch.Tensor:
    """Attention [B, Hq, T, D] of ``query`` [B, Hq, T, D] over a cache of ``key`` / ``value`` [B, Hkv, S, D] whose
    last T positions are the queries' own (module docstring): query i (cache length S − T + i + 1) reads the
    quantized form of keys and values below its quantized prefix. ``attention_mask``: transformers' boolean mask
    (True = attend) or additive float mask [B, 1, T, ≥S], or None for causal."""
    b, hq, t, d = query.shape
    s = key.shape[2]
    rep = hq // key.shape[1]
    scaling = d ** -0.5 if scaling is None else scaling
    pos = torch.arange(s - t, s, device=query.device)
    cols = torch.arange(s, device=query.device)
    quant = cols.unsqueeze(0) < quantized_prefix(pos + 1, spec).unsqueeze(1)  # [T, S]: read quantized
    kq = _repeat_heads(fake_quant(key, spec, "k"), rep).float()
    vq = _repeat_heads(fake_quant(value, spec, "v"), rep).float()
    qf = query.float()
    scores = qf @ kq.transpose(-1, -2)
    full = not bool(quant.all())
    if full:
        k, v = _repeat_heads(key, rep).float(), _repeat_heads(value, rep).float()
        scores = torch.where(quant, scores, qf @ k.transpose(-1, -2))
    scores = scores * scaling
    if attention_mask is None:
        scores = scores.masked_fill(cols.unsqueeze(0) > pos.unsqueeze(1), float("-inf"))
    elif attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask[..., :s], float("-inf"))
    else:
        scores = scores + attention_mask[..., :s].float()
    probs = torch.softmax(scores, dim=-1)
    out = (probs * quant) @ vq + (probs * ~quant) @ v if full else probs @ vq
    return out.to(query.dtype)


def check_fits(model: torch.nn.Module, spec: KVSpec) -> None:
    """A QuantkitError when KV4's value groups (or its two codes a byte) do not divide the model's head_dim."""
    from quantkit.errors import QuantkitError

    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    if spec.bits == 4 and (head_dim % 2 or head_dim % spec.group_size):
        fits = next((g for g in (64, 32, 16, 8, 2) if head_dim % g == 0), None)
        raise QuantkitError(f"a KV4 cache groups value channels by kv.group_size {spec.group_size} and packs two "
                            f"codes a byte, but this model's head_dim is {head_dim}; use a group size that divides "
                            f"{head_dim}" + (f" (e.g. {fits})" if fits else " (an even head_dim)"))


def attach_kv_quant(model: torch.nn.Module, spec: KVSpec) -> str:
    """Make ``model`` (a transformers causal LM) attend through :func:`attention` with ``spec``: an attention
    function and its mask function registered with transformers under a name per scheme, set as the model's
    attention implementation. Returns that name; a QuantkitError when KV4's value groups do not divide the model's
    head_dim."""
    from quantkit.model.attention import use_attention

    check_fits(model, spec)
    name = f"quantkit_{spec.label}".replace("-", "_")

    def attend(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        out = attention(query, key, value, spec, attention_mask, scaling)
        return out.transpose(1, 2).contiguous(), None

    use_attention(model, name, attend)
    return name
