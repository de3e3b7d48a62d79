"""Evaluation: perplexity."""

from quantkit.eval.ppl import PplResult, choose_seqlen, perplexity

__all__ = ["PplResult", "choose_seqlen", "perplexity"]
