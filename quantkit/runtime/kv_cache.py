"""A packed low-bit KV cache for decoding: the cache holds :func:`quantkit.quant.kv.pack`'s bytes, not fp16.

:class:`PackedKVCache` preallocates, per decoder layer, (batch, max context) keys and values in one of two forms:

* **KV8**: uint8 codes [B, Hkv, L, D] and an fp16 scale and minimum per token and head (x̂ = code · scale + min),
  0.516× an fp16 cache at head size 128;
* **KV4** (KIVI keys per channel over blocks of G tokens, values per token over G channels, two codes a byte) with
  BitDecoding's fp16 window: the latest tokens stay in an fp16 ring of R + 2G slots, and a block of keys is
  quantized from the ring once it is older than the latest R tokens (each decode step re-quantizes the newest such
  block from the same fp16 tokens, which gives the same codes and keeps the step free of host decisions);
  0.315× fp16 at 32K tokens with G = 32.

It takes transformers' place for the cache: the model runs with ``use_cache=False`` and
explicit positions, and the attention function :meth:`PackedKVCache.attend` (registered with transformers under
:data:`NAME`) quantizes each forward's new keys and values, writes them at their positions (prefill and decode
alike, so prefill writes the quantized cache), and attends:

* one query token per sequence (decode) on a GPU: the split-KV kernels that dequantize the codes in registers
  (:func:`quantkit.runtime.kernels.ops.decode_attention_kv8`, ``decode_attention_kv4``);
* otherwise (prefill chunks, or off a GPU): the cache dequantized in torch, each query reading the keys and values
  its own decode step would find quantized (the whole cache for KV8; below :func:`quantkit.quant.kv.quantized_prefix`
  of its length for KV4, the rest in fp16) — what ``eval-ppl --kv-bits`` scores.

The cache serves unpadded batches (quantkit's :class:`~quantkit.runtime.generate.Generator`): transformers' padding
mask is not read. KV-FP8 is evaluated with ``eval-ppl --kv-bits fp8`` and has no packed decode path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from quantkit.errors import QuantkitError
from quantkit.quant import kv

NAME = "quantkit_packed_kv"


def packed_kv_spec(kv_bits: str) -> kv.KVSpec:
    """The ``--kv-bits`` of a decoding command (``generate``, ``bench --e2e``): KV8 or KV4, or a one-line
    QuantkitError naming where KV-FP8 is scored."""
    spec = kv.parse_kv_bits(kv_bits)
    if spec.fp8:
        raise QuantkitError(f"--kv-bits {kv_bits}: decoding packs KV8 and KV4 caches ({spec.label} is scored with "
                            "`quantkit eval-ppl --kv-bits`); use --kv-bits 8 or 4")
    return spec


def check_packable(model: torch.nn.Module, spec: kv.KVSpec) -> None:
    """A one-line QuantkitError when ``model`` or ``spec`` has no packed decode path: KV8 or KV4 (whose value groups
    and two codes a byte must fit the head size), and only models whose layers all attend over the whole cache (no
    sliding windows) with transformers' per-layer ``layer_idx``."""
    if spec.fp8:
        raise QuantkitError(f"a packed KV cache for decoding is KV8 or KV4; {spec.label} is evaluated with "
                            "`quantkit eval-ppl --kv-bits`; use --kv-bits 8 or 4 here")
    kv.check_fits(model, spec)
    cfg = _text_config(model)
    kinds = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"} or getattr(cfg, "use_sliding_window", False):
        raise QuantkitError(f"this model has sliding-window layers ({', '.join(sorted(kinds))}); the packed KV8 cache "
                            "serves full-attention models only: drop --kv-bits")


def _text_config(model: torch.nn.Module):
    cfg = model.config
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


class PackedKVCache:
    """KV8 or KV4 keys and values of ``batch`` sequences of up to ``max_context`` tokens for every decoder layer of
    ``model`` (module docstring), on ``device``; the KV4 fp16 window in ``dtype``."""

    def __init__(self, model: torch.nn.Module, batch: int, max_context: int, spec: kv.KVSpec,
                 device: torch.device, dtype: torch.dtype = torch.float16):
        check_packable(model, spec)
        cfg = _text_config(model)
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        d = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.spec, self.batch, self.max_context = spec, int(batch), int(max_context)
        b, layers = self.batch, cfg.num_hidden_layers

        def zeros(*shape, dtype=torch.float16):
            return torch.zeros(*shape, dtype=dtype, device=device)

        if spec.bits == 8:
            def part() -> dict:
                shape = (b, heads, self.max_context)
                return {"codes": zeros(*shape, d, dtype=torch.uint8), "scale": zeros(*shape, 1),
                        "min": zeros(*shape, 1)}

            self.keys = [part() for _ in range(layers)]
            self.values = [part() for _ in range(layers)]
            return
        g = spec.group_size
        self.length = -(-self.max_context // g) * g  # whole key blocks
        self.ring = spec.residual + 2 * g  # the window, and the newest block due for quantization
        # the decode kernel's head sizes (quantkit.runtime.kernels.triton.decode_attention.kv4_problem); others
        # decode through the torch form on any device
        self.kernel = 32 <= d <= 256 and d & (d - 1) == 0 and g >= 2

        def layer() -> dict:
            n = self.length
            return {"k_codes": zeros(b, heads, n, d // 2, dtype=torch.uint8), "k_scale": zeros(b, heads, n // g, d),
                    "k_min": zeros(b, heads, n // g, d), "v_codes": zeros(b, heads, n, d // 2, dtype=torch.uint8),
                    "v_scale": zeros(b, heads, n, d // g), "v_min": zeros(b, heads, n, d // g),
                    "k_ring": zeros(b, heads, self.ring, d, dtype=dtype),
                    "v_ring": zeros(b, heads, self.ring, d, dtype=dtype)}

        self.layers = [layer() for _ in range(layers)]

    def nbytes(self) -> int:
        """Bytes the cache holds (codes, scales, minima and the KV4 window of every layer)."""
        parts = self.keys + self.values if self.spec.bits == 8 else self.layers
        return sum(t.numel() * t.element_size() for p in parts for t in p.values())

    def attend(self, module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, positions: torch.Tensor,
               scaling: float | None) -> torch.Tensor:
        """Write this forward's ``key`` / ``value`` of layer ``module.layer_idx`` and return the attention output
        [B, T, Hq, D] of ``query`` [B, Hq, T, D] at token ``positions`` [T] (module docstring)."""
        scale = query.shape[-1] ** -0.5 if scaling is None else float(scaling)
        if self.spec.bits == 8:
            return self._attend8(module.layer_idx, query, key, value, positions, scale)
        return self._attend4(module.layer_idx, query, key, value, positions, scale)

    def _attend8(self, layer, query, key, value, positions, scale) -> torch.Tensor:
        for store, x, kind in ((self.keys[layer], key, "k"), (self.values[layer], value, "v")):
            packed = kv.pack(x, self.spec, kind)
            for name in ("codes", "scale", "min"):
                store[name].index_copy_(2, positions, packed[name])
        b, hq, t, d = query.shape
        k, v = self.keys[layer], self.values[layer]
        cols = torch.arange(self.max_context, device=query.device)
        if t == 1 and query.is_cuda:
            from quantkit.runtime.kernels import ops

            mask = (cols <= positions[0]).expand(b, self.max_context)
            out = ops.decode_attention_kv8(query[:, :, 0], k["codes"], k["scale"], k["min"], v["codes"],
                                           v["scale"], v["min"], mask, scale)
            return out[:, None]
        end = int(positions[-1]) + 1 if t > 1 else self.max_context  # decode: no host sync (captured step)
        like = torch.empty(b, k["codes"].shape[1], end, d, dtype=query.dtype, device=query.device)
        kh = kv.unpack({n: t[:, :, :end] for n, t in k.items()}, self.spec, "k", like)
        vh = kv.unpack({n: t[:, :, :end] for n, t in v.items()}, self.spec, "v", like)
        return _attend_gqa(query, kh, vh, cols[None, :end] <= positions[:, None], scale)  # causal by position

    def _attend4(self, layer, query, key, value, positions, scale) -> torch.Tensor:
        c, spec, g = self.layers[layer], self.spec, self.spec.group_size
        t = key.shape[2]
        packed_v = kv.pack(value, spec, "v")  # values are per token: quantized as they arrive
        c["v_codes"].index_copy_(2, positions, packed_v["codes"])
        c["v_scale"].index_copy_(2, positions, packed_v["scale"][..., 0])
        c["v_min"].index_copy_(2, positions, packed_v["min"][..., 0])
        if t == 1:  # decode: no host decisions (the step is captured as a graph)
            slot = positions % self.ring
            c["k_ring"].index_copy_(2, slot, key)
            c["v_ring"].index_copy_(2, slot, value)
            due = (kv.quantized_prefix(positions + 1, spec) - g).clamp(min=0)  # the newest quantized block
            self._quantize_keys(c, c["k_ring"].index_select(2, (due + torch.arange(g, device=due.device)) %
                                                               self.ring), due)
            if query.is_cuda and self.kernel:
                from quantkit.runtime.kernels import ops

                out = ops.decode_attention_kv4(query[:, :, 0], *(c[n] for n in _KV4_PARTS), positions + 1, g,
                                               spec.residual, scale)
                return out[:, None]
            cols = torch.arange(self.length, device=query.device)  # the ring read at every position: _mixed's
            return self._mixed(query, c, c["k_ring"][:, :, cols % self.ring],  # mask keeps the window's
                               c["v_ring"][:, :, cols % self.ring], 0, positions, self.length, scale)
        # a prompt chunk (eager): its own fp16 keys and values, and the window's from before it
        start, end = int(positions[0]), int(positions[-1]) + 1
        low = max(0, start - self.ring)
        before = torch.arange(low, start, device=key.device) % self.ring
        fp_k = torch.cat([c["k_ring"].index_select(2, before), key], dim=2)  # positions [low, end)
        fp_v = torch.cat([c["v_ring"].index_select(2, before), value], dim=2)
        done, due = (int(kv.quantized_prefix(torch.tensor(n), spec)) for n in (start, end))
        if due > done:
            self._quantize_keys(c, fp_k[:, :, done - low:due - low], torch.tensor([done], device=key.device))
        keep = min(t, self.ring)
        slots = positions[t - keep:] % self.ring
        c["k_ring"].index_copy_(2, slots, key[:, :, t - keep:])
        c["v_ring"].index_copy_(2, slots, value[:, :, t - keep:])
        return self._mixed(query, c, fp_k, fp_v, low, positions, end, scale)

    def _quantize_keys(self, c: dict, keys: torch.Tensor, start: torch.Tensor) -> None:
        """KIVI's per-channel quantization of whole blocks of ``keys`` [B, Hkv, n·G, D] starting at token ``start``
        ([1], a multiple of G), written into the codes and the block scales."""
        g = self.spec.group_size
        packed = kv.pack(keys, self.spec, "k")
        rows = start + torch.arange(keys.shape[2], device=start.device)
        blocks = start // g + torch.arange(keys.shape[2] // g, device=start.device)
        c["k_codes"].index_copy_(2, rows, packed["codes"])
        c["k_scale"].index_copy_(2, blocks, packed["scale"][:, :, :, 0])
        c["k_min"].index_copy_(2, blocks, packed["min"][:, :, :, 0])

    def _mixed(self, query, c, fp_k, fp_v, low: int, positions, end: int, scale: float) -> torch.Tensor:
        """Attention [B, T, Hq, D] over tokens [0, end): each query reads the tokens below its quantized prefix from
        the codes and the rest from ``fp_k`` / ``fp_v`` [B, Hkv, end − low, D], positions [low, end)
        (quantkit.quant.kv.attention's rule). One SDPA over both key sets, each query's mask choosing a token's
        quantized or fp16 form, so no [T, L] score matrix is built in torch."""
        spec, g = self.spec, self.spec.group_size
        kq = (kv.unpack_nibbles(c["k_codes"][:, :, :end]).float()
              * c["k_scale"].float().repeat_interleave(g, dim=2)[:, :, :end]
              + c["k_min"].float().repeat_interleave(g, dim=2)[:, :, :end]).to(query.dtype)
        vq = (kv.unpack_nibbles(c["v_codes"][:, :, :end]).float()
              * c["v_scale"].float().repeat_interleave(g, dim=3)[:, :, :end]
              + c["v_min"].float().repeat_interleave(g, dim=3)[:, :, :end]).to(query.dtype)
        prefix = kv.quantized_prefix(positions + 1, spec)[:, None]  # [T, 1]
        cols = torch.arange(end, device=query.device)[None, :]
        fp_cols = torch.arange(low, end, device=query.device)[None, :]
        visible = torch.cat([cols < prefix, (fp_cols >= prefix) & (fp_cols <= positions[:, None])], dim=1)
        return _attend_gqa(query, torch.cat([kq, fp_k.to(query.dtype)], 2), torch.cat([vq, fp_v.to(query.dtype)], 2),
                           visible, scale)


def _attend_gqa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, visible: torch.Tensor,
                scale: float) -> torch.Tensor:
    """SDPA [B, T, Hq, D] of ``query`` [B, Hq, T, D] over ``key`` / ``value`` [B, Hkv, S, D] with a boolean
    ``visible`` [T, S]. The query heads of a KV head are folded into the token axis, so the masked kernels (which
    take no ``enable_gqa``) read each KV head once instead of a repeated copy."""
    b, hq, t, d = query.shape
    hkv = key.shape[1]
    rep = hq // hkv
    q = query.reshape(b, hkv, rep * t, d)
    mask = visible.expand(rep, *visible.shape).reshape(rep * t, visible.shape[1]) if rep > 1 else visible
    out = F.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scale)
    return out.reshape(b, hq, t, d).transpose(1, 2)


_KV4_PARTS = ("k_codes", "k_scale", "k_min", "v_codes", "v_scale", "v_min", "k_ring", "v_ring")  # the kernel's order
