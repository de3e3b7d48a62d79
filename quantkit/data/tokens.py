"""Token streams and deterministic calibration windows."""

from __future__ import annotations

import torch

from quantkit.data.sources import documents, joined_text
from quantkit.errors import QuantkitError


def encode(tokenizer, text: str) -> torch.Tensor:
    """Token ids of ``text`` as a 1-D LongTensor (no special tokens added)."""
    # The tokenizer's own max length would warn about long evaluation streams; we window them ourselves.
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    return torch.tensor(ids, dtype=torch.long)


def eval_token_stream(tokenizer, source: str, split: str = "test", text_column: str | None = None) -> torch.Tensor:
    """The whole split joined with "\\n\\n" and tokenized once (GPTQ/MixLLM perplexity protocol); 1-D LongTensor.
    ``text_column`` names the text column of record files and datasets folders (default ``text``)."""
    return encode(tokenizer, joined_text(source, split, text_column))


def check_sample_count(samples: int | None, option: str = "--calib-samples") -> None:
    """Refuse a calibration window count below 1 (None means "the recipe's"); run before any model loads."""
    if samples is not None and samples < 1:
        raise QuantkitError(f"{option} must be at least 1, got {samples}")


def check_calib_seqlen(seqlen: int | None, option: str = "--calib-seqlen") -> None:
    """Refuse a calibration window shorter than 2 tokens (None means "the recipe's"); run before any model loads."""
    if seqlen is not None and seqlen < 2:
        raise QuantkitError(f"{option} must be at least 2 tokens, got {seqlen}; e.g. 512 or 2048")


def calibration_windows(tokenizer, source: str = "kjv", n: int = 128, seqlen: int = 2048, seed: int = 0,
                        split: str = "train", text_column: str | None = None) -> torch.Tensor:
    """``n`` windows of ``seqlen`` tokens, LongTensor [n, seqlen], deterministic in ``seed``.

    Documents are shuffled with the seed and tokenized (joined with "\\n\\n") until the stream holds enough tokens
    for distinct windows (or the source is exhausted); window starts are drawn uniformly from that stream with the
    same seed. Large hub corpora thus cost only the tokens actually needed. ``text_column`` names the text column
    of record files and datasets folders (default ``text``).
    """
    if n < 1 or seqlen < 2:
        raise QuantkitError(f"need at least 1 sample of 2 tokens, got n={n}, seqlen={seqlen}")
    docs = documents(source, split, text_column)
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(docs), generator=gen).tolist()
    want = max(n * seqlen * 2, seqlen + 1)
    pieces, total = [], 0
    for i in order:
        if not docs[i].strip():
            continue
        ids = encode(tokenizer, docs[i] + "\n\n")
        pieces.append(ids)
        total += ids.numel()
        if total >= want:
            break
    stream = torch.cat(pieces) if pieces else torch.zeros(0, dtype=torch.long)
    if stream.numel() < seqlen:
        raise QuantkitError(f"dataset '{source}' ({split}) has only {stream.numel()} tokens, fewer than one window "
                            f"of {seqlen}; use a larger text or a smaller --seqlen")
    starts = torch.randint(0, stream.numel() - seqlen + 1, (n,), generator=gen)
    return torch.stack([stream[s:s + seqlen] for s in starts.tolist()])
