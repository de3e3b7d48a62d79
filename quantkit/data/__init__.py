"""Calibration and evaluation token streams: shipped corpus, local files, hub datasets."""

from quantkit.data.sources import (DEFAULT_TEXT_COLUMN, HUB_NAMES, check_source, check_text_column, documents,
                                   joined_text, known_sources)
from quantkit.data.tokens import calibration_windows, check_calib_seqlen, check_sample_count, eval_token_stream

__all__ = ["DEFAULT_TEXT_COLUMN", "HUB_NAMES", "calibration_windows", "check_calib_seqlen", "check_sample_count",
           "check_source",
           "check_text_column", "documents", "eval_token_stream", "joined_text", "known_sources"]
