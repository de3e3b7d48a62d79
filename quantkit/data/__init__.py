"""Calibration and evaluation token streams: shipped corpus, local files, hub datasets."""

from quantkit.data.sources import HUB_NAMES, check_source, documents, joined_text, known_sources
from quantkit.data.tokens import calibration_windows, check_sample_count, eval_token_stream

__all__ = ["HUB_NAMES", "calibration_windows", "check_sample_count", "check_source", "documents", "eval_token_stream", "joined_text", "known_sources"]
