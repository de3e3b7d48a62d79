"""A decode loop for any loaded causal LM (packed or not), in the manner of gpt-fast.

* The KV cache is transformers' :class:`~transformers.StaticCache`, allocated once for (batch, max context), so
  decoding allocates no cache memory per token.
* The prompt is prefilled in chunks of at most ``prefill_chunk`` tokens (one forward each, writing the cache).
* Each decode step is one forward of one token per sequence: eager, or with ``compile_decode`` one
  ``torch.compile(fullgraph=True)`` graph (on a GPU with ``mode="reduce-overhead"``, which replays it as a CUDA
  graph: no per-step host work). The kernels enter the compiled graph as custom ops
  (:mod:`quantkit.runtime.kernels.ops`); the static cache's tensors are static addresses, and each call of the
  compiled step is a real step (the warm-up calls too), so the cache's device-side write position advances once
  per step.

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
    per second over all sequences of the batch (from the second decode step on, the third for a compiled step, so
    first-use compiles and graph recording are not counted; the ``on_tokens`` callback's time is left out), and
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


class Generator:
    """Greedy generation for ``model`` (a HF causal LM in eval mode) on its device with a static cache of
    ``max_context`` tokens per sequence; ``compile_decode`` compiles the decode step with torch.compile's
    ``backend`` (module docstring)."""

    def __init__(self, model: nn.Module, max_context: int, prefill_chunk: int = 512, compile_decode: bool = False,
                 backend: str | Callable = "inductor"):
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
        self._decode = self._forward
        if compile_decode:
            if self.device.type == "cuda":
                from quantkit.runtime.kernels.scratch import reserve_graph_tickets

                reserve_graph_tickets(self.device)  # the graphs' split-K tickets, allocated outside any graph
            mode = "reduce-overhead" if self.device.type == "cuda" and backend == "inductor" else None
            self._decode = torch.compile(self._forward, backend=backend, mode=mode, fullgraph=True, dynamic=False)

    def _new_cache(self, batch: int):
        from transformers import StaticCache

        cache = StaticCache(config=self.model.config, max_cache_len=self.max_context)
        cfg = self.model.config
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        cache.early_initialization(batch, heads, head_dim, self.dtype, self.device)
        return cache

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=ids, cache_position=positions, use_cache=True, **{self._cache_kw: self._cache})
        return out.logits[:, -1, :]

    def _reset(self, batch: int) -> None:
        if self._cache is None or self._batch != batch:
            self._cache = self._new_cache(batch)
            self._batch = batch
        else:
            self._cache.reset()

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
        """Logits [B, V] after feeding ``tokens`` [B, 1] at ``position`` (the cache holds positions below it)."""
        return self._decode(tokens, torch.tensor([position], device=self.device))

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
        t_first = None  # after the untimed decode steps: first-use compiles (and graph recording) are not speed
        untimed = 2 if self._decode is not self._forward else 1  # a compiled step records its CUDA graph second

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
