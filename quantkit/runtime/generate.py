"""A decode loop for any loaded causal LM (packed or not), in the manner of gpt-fast.

* The KV cache is transformers' :class:`~transformers.StaticCache`, allocated once for (batch, max context), so
  decoding allocates no cache memory per token.
* The prompt is prefilled in chunks of at most ``prefill_chunk`` tokens (one forward each, writing the cache;
  the LM head runs at the last position only).
* Each decode step is one forward of one token per sequence: eager, or with ``compile_decode`` one
  ``torch.compile(fullgraph=True)`` graph. On a GPU that compiled step is captured once per cache (batch size and
  context) as a raw CUDA graph (:class:`CapturedStep`, as gpt-fast and vLLM capture theirs) and each later step is
  one replay: no dynamo guards, no CUDA-graph-tree bookkeeping, no allocation. The kernels enter the compiled graph
  as custom ops (:mod:`quantkit.runtime.kernels.ops`); the static cache's tensors keep their addresses, so the
  replays write the cache where the capture did. A compiled step attends by KV head
  (:mod:`quantkit.runtime.decode_attention`) where the model uses transformers' SDPA.
* With ``kv`` (a KV8 or KV4 :class:`~quantkit.quant.kv.KVSpec`) the cache is
  :class:`quantkit.runtime.kv_cache.PackedKVCache`
  instead: prefill and decode write quantized keys and values, and decode attends over the packed bytes.

Greedy decoding gives the tokens of ``model.generate(do_sample=False, cache_implementation="static")`` (the tests
check it), compiled or not.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass
class GenerationStats:
    """What one :meth:`Generator.generate` call measured: prompt and new tokens, prefill wall time, decode tokens
    per second over all sequences of the batch (from the second decode step on, so first-use compiles and the
    graph capture are not counted; the ``on_tokens`` callback's time is left out), and
    peak GPU memory (None off a GPU)."""

    batch: int
    prompt_tokens: int
    new_tokens: int
    prefill_ms: float
    decode_tok_s: float
    peak_memory_bytes: int | None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class CapturedStep:
    """``step(ids [B, 1], positions [1]) -> logits [B, V]`` replayed as a CUDA graph, captured anew for each new
    ``cache`` object.

    The first call for a cache runs the step once on a side stream (first use compiles and autotunes; it is that
    step's real forward: the cache's write position advances once) and returns its logits; then it captures the
    step into a :class:`torch.cuda.CUDAGraph` with static ``ids`` and ``positions`` buffers (capture runs nothing,
    so the cache is untouched; where capture raises, ``refused`` holds the error and no graph is kept). Later calls
    copy the tokens in, fill the position and replay: a few µs of host time where a compiled call with
    ``mode="reduce-overhead"`` spends its guards and graph-tree checks (docs/BENCHMARKS.md, whole-model speed).
    Split-K scratch inside the capture belongs to the graph (:func:`quantkit.runtime.kernels.scratch
    .graph_owned_scratch`). A replay's logits live in the graph's output buffer: read them before the next step."""

    def __init__(self, step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]):
        self.step = step
        self.graph = None
        self.refused: Exception | None = None
        self._cache = None

    def release(self) -> None:
        """Drop the graph (and its memory pool) and the cache it was captured on."""
        self.graph = self._cache = None

    def __call__(self, tokens: torch.Tensor, position: int, cache) -> torch.Tensor:
        if self.graph is None or self._cache is not cache:
            return self._capture(tokens, position, cache)
        self._ids.copy_(tokens)
        self._positions.fill_(position)
        self.graph.replay()
        return self._logits

    def _capture(self, tokens: torch.Tensor, position: int, cache) -> torch.Tensor:
        from quantkit.runtime.kernels.scratch import graph_owned_scratch, reserve_graph_tickets

        self.release()  # the previous cache's graph and its memory pool go first
        device = tokens.device
        reserve_graph_tickets(device)
        self._ids = tokens.clone()
        self._positions = torch.full((1,), position, dtype=torch.long, device=device)
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side), graph_owned_scratch():
            logits = self.step(self._ids, self._positions)
        torch.cuda.current_stream(device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph), graph_owned_scratch():
                self._logits = self.step(self._ids, self._positions)
        except RuntimeError as exc:
            self.refused = exc
            return logits
        self.graph, self._cache = graph, cache
        return logits


class Generator:
    """Greedy generation for ``model`` (a HF causal LM in eval mode) on its device with a static cache of
    ``max_context`` tokens per sequence; ``compile_decode`` compiles the decode step with torch.compile's
    ``backend``; ``kv`` (a KV8 or KV4 :class:`~quantkit.quant.kv.KVSpec`) packs the cache (module docstring)."""

    def __init__(self, model: nn.Module, max_context: int, prefill_chunk: int = 512, compile_decode: bool = False,
                 backend: str | Callable = "inductor", kv=None):
        if max_context < 2:
            raise ValueError(f"max_context must be at least 2 tokens, got {max_context}")
        self.model = model
        self.max_context = int(max_context)
        self.prefill_chunk = int(prefill_chunk)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self._cache = None
        self._batch = None
        # transformers renamed forward's past_key_values to cache; pass it under the name this version takes
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        # a prompt's logits are needed at its last position only: without this the LM head runs over every token
        self._last_only = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self._decode = self._forward
        self._captured = None
        self.kv = kv
        self._in_forward = False
        if kv is not None:
            from quantkit.model.attention import use_attention
            from quantkit.runtime.kv_cache import NAME, check_packable

            check_packable(model, kv)
            use_attention(model, NAME, self._packed_attention)
        if compile_decode:
            from quantkit.runtime.decode_attention import use_decode_attention

            from quantkit.model.moe import warm_experts

            if kv is None:
                use_decode_attention(model)  # grouped-query heads share their KV head's read (no repeat_kv when traced)
            warm_experts(model)  # the compiled step runs every expert: their lazy first-call work happens here
            self._decode = torch.compile(self._forward, backend=backend, fullgraph=True, dynamic=False)
            if self.device.type == "cuda":
                self._captured = CapturedStep(self._decode)

    def _new_cache(self, batch: int):
        from transformers import StaticCache

        if self.kv is not None:
            from quantkit.runtime.kv_cache import PackedKVCache

            return PackedKVCache(self.model, batch, self.max_context, self.kv, self.device, self.dtype)

        cache = StaticCache(config=self.model.config, max_cache_len=self.max_context)
        cfg = self.model.config
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        cache.early_initialization(batch, heads, head_dim, self.dtype, self.device)
        return cache

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.kv is None:
            out = self.model(input_ids=ids, cache_position=positions, use_cache=True, **self._last_only,
                             **{self._cache_kw: self._cache})
            return out.logits[:, -1, :]
        self._in_forward = True  # the packed cache is written by the attention function, not by transformers
        try:
            out = self.model(input_ids=ids, cache_position=positions, position_ids=positions[None], use_cache=False,
                             **self._last_only)
        finally:
            self._in_forward = False
        return out.logits[:, -1, :]

    def _packed_attention(self, module, query, key, value, attention_mask, dropout: float = 0.0,
                          scaling: float | None = None, **kwargs):
        """transformers' attention-function signature over this generator's packed cache; outside its forwards
        (the model called some other way) transformers' SDPA attention."""
        positions = kwargs.get("cache_position")
        if not self._in_forward or positions is None or self._cache is None:
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)
        return self._cache.attend(module, query, key, value, positions, scaling), None

    def _reset(self, batch: int) -> None:
        if self._cache is None or self._batch != batch:
            if self._captured is not None:
                self._captured.release()  # the old cache and graph go before the new cache is allocated
            self._cache = None
            self._cache = self._new_cache(batch)
            self._batch = batch
        elif self.kv is None:
            self._cache.reset()  # a packed cache needs none: positions are rewritten and attention masks by position

    @torch.inference_mode()
    def prefill(self, ids: torch.Tensor) -> torch.Tensor:
        """Write the prompts ``ids`` [B, T] into a fresh cache, in chunks; returns the last position's logits."""
        batch, t = ids.shape
        if t + 1 > self.max_context:
            raise ValueError(f"a {t}-token prompt leaves no room to generate in a {self.max_context}-token context")
        self._reset(batch)
        logits = None
        for start in range(0, t, self.prefill_chunk):
            chunk = ids[:, start:start + self.prefill_chunk]
            pos = torch.arange(start, start + chunk.shape[1], device=self.device)
            logits = self._forward(chunk, pos)
        return logits

    @torch.inference_mode()
    def decode_step(self, tokens: torch.Tensor, position: int) -> torch.Tensor:
        """Logits [B, V] after feeding ``tokens`` [B, 1] at ``position`` (the cache holds positions below it); a
        captured step's logits are overwritten by the next step."""
        if self._captured is not None:
            logits = self._captured(tokens, position, self._cache)
            if self._captured.refused is not None:
                self._fall_back_from_capture(self._captured.refused)
            return logits
        return self._decode(tokens, torch.tensor([position], device=self.device))

    def _fall_back_from_capture(self, exc: Exception) -> None:
        """Later steps run as torch.compile's own CUDA graphs (slower host side) once CUDA-graph capture refused the
        step; the refused call's step itself already ran."""
        from quantkit.ui import warn

        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        warn(f"capturing the decode step as one CUDA graph failed ({first[:200]}); using torch.compile's "
             "mode='reduce-overhead' instead")
        self._captured = None
        self._decode = torch.compile(self._forward, mode="reduce-overhead", fullgraph=True, dynamic=False)

    @torch.inference_mode()
    def generate(self, ids: torch.Tensor, max_new_tokens: int, eos_token_id: int | None = None,
                 on_tokens: Callable[[torch.Tensor], None] | None = None) -> tuple[torch.Tensor, GenerationStats]:
        """Greedy continuation of the prompts ``ids`` [B, T] by up to ``max_new_tokens`` tokens (fewer where the
        context ends, or every sequence has produced ``eos_token_id``); ``on_tokens`` sees each step's [B] tokens.
        Returns (prompt + new tokens [B, T + n], stats)."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
        ids = ids.to(self.device)
        batch, t = ids.shape
        new = min(int(max_new_tokens), self.max_context - t)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        _sync(self.device)
        t0 = time.perf_counter()
        logits = self.prefill(ids)
        tok = logits.argmax(dim=-1, keepdim=True)
        _sync(self.device)
        t1 = time.perf_counter()
        out = [tok]
        done = torch.zeros(batch, dtype=torch.bool, device=self.device)
        callback_s = 0.0
        t_first = None  # after the first decode step: its compile and graph capture are not speed
        untimed = 1

        def report(tokens: torch.Tensor) -> float:
            if not on_tokens:
                return 0.0
            c0 = time.perf_counter()
            on_tokens(tokens)
            return time.perf_counter() - c0

        callback_s += report(tok[:, 0])
        for i in range(1, new):
            if eos_token_id is not None:
                done |= tok[:, 0] == eos_token_id
                if bool(done.all()):
                    break
            tok = self.decode_step(tok, t + i - 1).argmax(dim=-1, keepdim=True)
            out.append(tok)
            if t_first is None and len(out) == 1 + untimed:
                _sync(self.device)
                t_first, callback_s = time.perf_counter(), 0.0
            callback_s += report(tok[:, 0])
        _sync(self.device)
        t2 = time.perf_counter()
        steps = len(out) - 1 - untimed  # timed decode steps (the first new token came from the prefill)
        elapsed = (t2 - t_first - callback_s) if t_first is not None else 0.0
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        stats = GenerationStats(batch, t, len(out), (t1 - t0) * 1e3,
                                batch * steps / elapsed if steps > 0 and elapsed > 0 else 0.0, peak)
        return torch.cat([ids] + out, dim=1), stats
