"""A packed low-bit KV cache for decoding: the cache holds :func:`quantkit.quant.kv.pack`'s bytes, not fp16.

:class:`PackedKVCache` preallocates, per decoder layer, the KV8 form of (batch, max context) keys and values —
uint8 codes [B, Hkv, L, D] and an fp16 scale and minimum per token and head (x̂ = code · scale + min) — 0.516× an
fp16 cache at head size 128. It takes transformers' place for the cache: the model runs with ``use_cache=False`` and
explicit positions, and the attention function :meth:`PackedKVCache.attend` (registered with transformers under
:data:`NAME`) quantizes each forward's new keys and values, writes them at their positions (prefill and decode
alike, so prefill writes the quantized cache), and attends:

* one query token per sequence (decode) on a GPU: :func:`quantkit.runtime.kernels.ops.decode_attention_kv8`, the
  split-KV kernel that dequantizes the codes in registers;
* otherwise (prefill chunks, or off a GPU): the written prefix dequantized (:func:`quantkit.quant.kv.unpack`) and
  SDPA with a causal mask by position — every query reads the keys and values quantized, as decode does and as
  ``eval-ppl --kv-bits 8`` scores it.

The cache serves unpadded batches (quantkit's :class:`~quantkit.runtime.generate.Generator`): transformers' padding
mask is not read. KV4 and KV-FP8 are evaluated with ``eval-ppl --kv-bits`` and have no packed decode path yet.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quantkit.errors import QuantkitError
from quantkit.quant import kv

NAME = "quantkit_packed_kv8"


def packed_kv_spec(kv_bits: str) -> kv.KVSpec:
    """The ``--kv-bits`` of a decoding command (``generate``, ``bench --e2e``): KV8, or a one-line QuantkitError
    naming where the other schemes are scored."""
    spec = kv.parse_kv_bits(kv_bits)
    if spec.bits != 8 or spec.fp8:
        raise QuantkitError(f"--kv-bits {kv_bits}: decoding packs KV8 caches only ({spec.label} is scored with "
                            "`quantkit eval-ppl --kv-bits`); use --kv-bits 8")
    return spec


def check_packable(model: torch.nn.Module, spec: kv.KVSpec) -> None:
    """A one-line QuantkitError when ``model`` or ``spec`` has no packed decode path: only KV8, and only models whose
    layers all attend over the whole cache (no sliding windows) with transformers' per-layer ``layer_idx``."""
    if spec.bits != 8 or spec.fp8:
        raise QuantkitError(f"a packed KV cache for decoding is KV8 only; {spec.label} is evaluated with "
                            "`quantkit eval-ppl --kv-bits`; use --kv-bits 8 here")
    cfg = _text_config(model)
    kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"} or getattr(cfg, "use_sliding_window", False):
        raise QuantkitError(f"this model has sliding-window layers ({', '.join(sorted(kinds))}); the packed KV8 cache "
                            "serves full-attention models only: drop --kv-bits")


def _text_config(model: torch.nn.Module):
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


class PackedKVCache:
    """KV8 keys and values of ``batch`` sequences of up to ``max_context`` tokens for every decoder layer of
    ``model`` (module docstring), on ``device``."""

    def __init__(self, model: torch.nn.Module, batch: int, max_context: int, spec: kv.KVSpec,
                 device: torch.device):
        check_packable(model, spec)
        cfg = _text_config(model)
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.spec, self.batch, self.max_context = spec, int(batch), int(max_context)

        def part() -> dict:
            shape = (self.batch, heads, self.max_context)
            return {"codes": torch.zeros(*shape, head_dim, dtype=torch.uint8, device=device),
                    "scale": torch.zeros(*shape, 1, dtype=torch.float16, device=device),
                    "min": torch.zeros(*shape, 1, dtype=torch.float16, device=device)}

        self.keys = [part() for _ in range(cfg.num_hidden_layers)]
        self.values = [part() for _ in range(cfg.num_hidden_layers)]

    def nbytes(self) -> int:
        """Bytes the cache holds (codes, scales and minima of every layer)."""
        return sum(t.numel() * t.element_size() for p in self.keys + self.values for t in p.values())

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor, positions: torch.Tensor) -> None:
        """Quantize ``key`` / ``value`` [B, Hkv, T, D] (:func:`quantkit.quant.kv.pack`) into ``layer`` at token
        ``positions`` [T]."""
        for store, x, kind in ((self.keys[layer], key, "k"), (self.values[layer], value, "v")):
            packed = kv.pack(x, self.spec, kind)
            for name in ("codes", "scale", "min"):
                store[name].index_copy_(2, positions, packed[name])

    def attend(self, module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, positions: torch.Tensor,
               scaling: float | None) -> torch.Tensor:
        """Write this forward's ``key`` / ``value`` of layer ``module.layer_idx`` and return the attention output
        [B, T, Hq, D] of ``query`` [B, Hq, T, D] at token ``positions`` [T] (module docstring)."""
        layer = module.layer_idx
        self.write(layer, key, value, positions)
        b, hq, t, d = query.shape
        scale = d ** -0.5 if scaling is None else float(scaling)
        k, v = self.keys[layer], self.values[layer]
        cols = torch.arange(self.max_context, device=query.device)
        if t == 1 and query.is_cuda:
            from quantkit.runtime.kernels import ops

            mask = (cols <= positions[0]).expand(b, self.max_context)
            out = ops.decode_attention_kv8(query[:, :, 0], k["codes"], k["scale"], k["min"], v["codes"],
                                           v["scale"], v["min"], mask, scale)
            return out[:, None]
        like = torch.empty(b, k["codes"].shape[1], self.max_context, d, dtype=query.dtype, device=query.device)
        kh, vh = kv.unpack(k, self.spec, "k", like), kv.unpack(v, self.spec, "v", like)
        visible = cols[None, :] <= positions[:, None]  # [T, L]: causal by position
        out = F.scaled_dot_product_attention(query, kh, vh, attn_mask=visible, scale=scale,
                                             enable_gqa=hq != kh.shape[1])
        return out.transpose(1, 2)
