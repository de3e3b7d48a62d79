"""A decode loop without per-token overhead for any loaded causal LM (packed or not), in the manner of gpt-fast.

* The KV cache is transformers' :class:`~transformers.StaticCache`, allocated once for (batch, max context), so
  decoding allocates nothing per token.
* The prompt is prefilled in chunks of at most ``prefill_chunk`` tokens (one forward each, writing the cache).
* On a CUDA device one decode step (the whole model: embedding, every layer's kernels, lm_head) is captured as a
  CUDA graph per batch size the first time it runs, and each later token is a copy of the token and position into
  the graph's input buffers and one replay: the host work of hundreds of kernel launches per token is paid once.
  Where capture fails (a module that synchronizes with the host), the step runs eagerly and :attr:`Generator.graphed`
  says so.

Greedy decoding gives the tokens of ``model.generate(do_sample=False)`` with the same cache (the tests check it).
"""

from __future__ import annotations

import inspect
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn as nn


@dataclass
class GenerationStats:
    """What one :meth:`Generator.generate` call measured: prompt and new tokens, prefill wall time, decode tokens
    per second (all sequences of the batch), peak GPU memory (None off a GPU), whether decode ran as a CUDA graph."""

    batch: int
    prompt_tokens: int
    new_tokens: int
    prefill_ms: float
    decode_tok_s: float
    peak_memory_bytes: int | None
    graphed: bool

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Generator:
    """Greedy generation for ``model`` (a HF causal LM in eval mode) on its device with a static cache of
    ``max_context`` tokens per sequence (module docstring). ``use_graph`` None: a CUDA graph on CUDA devices."""

    def __init__(self, model: nn.Module, max_context: int, prefill_chunk: int = 512, use_graph: bool | None = None):
        if max_context < 2:
            raise ValueError(f"max_context must be at least 2 tokens, got {max_context}")
        self.model = model
        self.max_context = int(max_context)
        self.prefill_chunk = int(prefill_chunk)
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.use_graph = self.device.type == "cuda" if use_graph is None else bool(use_graph)
        self.graphed = False
        self._cache = None
        self._batch = None
        self._graph: torch.cuda.CUDAGraph | None = None
        self._graph_failed = False
        # transformers renamed forward's past_key_values to cache; pass it under the name this version takes
        params = inspect.signature(model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

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
            self._graph = None  # a graph reads the buffers of one cache and batch size
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

    def _capture(self) -> None:
        """Record one decode step into a CUDA graph reading ``_tok``/``_pos`` and writing ``_out``."""
        s = torch.cuda.Stream(self.device)
        s.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(s):  # warm-up outside capture: kernels compile, lazy state settles
            for _ in range(2):
                self._out = self._forward(self._tok, self._pos)
        torch.cuda.current_stream(self.device).wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._out = self._forward(self._tok, self._pos)
        self._graph = graph

    @torch.inference_mode()
    def decode_step(self, tokens: torch.Tensor, position: int) -> torch.Tensor:
        """Logits [B, V] after feeding ``tokens`` [B, 1] at ``position`` (the cache holds positions below it). The
        warm-up and capture of the first graphed step write this same position, which this step then writes again."""
        pos = torch.tensor([position], device=self.device)
        if not self.use_graph or self._graph_failed:
            return self._forward(tokens, pos)
        if self._graph is None:
            self._tok, self._pos = tokens.clone(), pos.clone()
            try:
                self._capture()
            except Exception as e:  # noqa: BLE001 — a module that cannot be captured: run eagerly, and say so
                self._graph_failed = True
                self._graph = None
                warnings.warn(f"quantkit: the decode step could not be captured as a CUDA graph "
                              f"({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}); "
                              "decoding eagerly", RuntimeWarning, stacklevel=2)
                return self._forward(tokens, pos)
        self._tok.copy_(tokens)
        self._pos.copy_(pos)
        self._graph.replay()
        self.graphed = True
        return self._out

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
        if on_tokens:
            on_tokens(tok[:, 0])
        for i in range(1, new):
            if eos_token_id is not None:
                done |= tok[:, 0] == eos_token_id
                if bool(done.all()):
                    break
            tok = self.decode_step(tok, t + i - 1).argmax(dim=-1, keepdim=True)
            out.append(tok)
            if on_tokens:
                on_tokens(tok[:, 0])
        _sync(self.device)
        t2 = time.perf_counter()
        steps = len(out) - 1  # the first new token came from the prefill
        peak = torch.cuda.max_memory_allocated(self.device) if self.device.type == "cuda" else None
        stats = GenerationStats(batch, t, len(out), (t1 - t0) * 1e3,
                                batch * steps / (t2 - t1) if steps and t2 > t1 else 0.0, peak, self.graphed)
        return torch.cat([ids] + out, dim=1), stats
