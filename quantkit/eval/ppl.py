"""Perplexity as GPTQ (Frantar et al., Sec. 4 "Language generation") and MixLLM (Sec. 4.1) report it: the test
split joined with "\\n\\n", tokenized once, cut into non-overlapping windows of ``seqlen`` tokens (the tail that does
not fill a window is dropped), mean next-token NLL over the windows, ppl = exp(mean NLL)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from quantkit.errors import QuantkitError

DEFAULT_SEQLEN = 2048


@dataclass
class PplResult:
    """One perplexity measurement."""

    ppl: float
    nll: float
    windows: int
    seqlen: int
    tokens: int

    def as_dict(self) -> dict:
        return asdict(self)


def choose_seqlen(requested: int | None, max_positions: int | None) -> int:
    """The window length: as requested (checked against the model's max positions), else 2048 capped at it."""
    if requested is None:
        return min(DEFAULT_SEQLEN, max_positions or DEFAULT_SEQLEN)
    if requested < 2:
        raise QuantkitError(f"--seqlen must be at least 2, got {requested}")
    if max_positions is not None and requested > max_positions:
        raise QuantkitError(f"--seqlen {requested} is larger than the model allows (max_position_embeddings="
                            f"{max_positions}); use --seqlen {max_positions} or less")
    return requested


def num_windows(n_tokens: int, seqlen: int, max_windows: int | None = None) -> int:
    """How many full non-overlapping windows the stream holds (at most ``max_windows``); errors if none."""
    n = n_tokens // seqlen
    if n == 0:
        raise QuantkitError(f"the evaluation text has {n_tokens} tokens, fewer than one window of {seqlen}; "
                            "use a smaller --seqlen or a longer text")
    if max_windows is not None:
        if max_windows < 1:
            raise QuantkitError(f"--max-windows must be at least 1, got {max_windows}")
        n = min(n, max_windows)
    return n


@torch.no_grad()
def perplexity(model: torch.nn.Module, token_ids: torch.Tensor, seqlen: int, max_windows: int | None = None,
               progress: Callable[[int, int], None] | None = None) -> PplResult:
    """Perplexity of ``model`` over a 1-D token stream (see module doc)."""
    n = num_windows(token_ids.numel(), seqlen, max_windows)
    device = next(model.parameters()).device
    nll_sum = 0.0
    for i in range(n):
        window = token_ids[i * seqlen:(i + 1) * seqlen].unsqueeze(0).to(device)
        logits = model(window, use_cache=False).logits.float()
        loss = F.cross_entropy(logits[0, :-1], window[0, 1:], reduction="mean")
        nll_sum += loss.item()
        if progress is not None:
            progress(i + 1, n)
    nll = nll_sum / n
    return PplResult(ppl=math.exp(nll), nll=nll, windows=n, seqlen=seqlen, tokens=n * seqlen)
