"""``gptq_v2`` layout: the GPTQ tensors of :mod:`quantkit.formats.gptq` with zero points stored as they are
(no "- 1" offset) — GPTQModel's ``checkpoint_format: "gptq_v2"``, its internal convention and an export option.
It holds every asymmetric zero, including 0, which GPTQ v1 cannot. Which engines read it: docs/formats.md."""

from __future__ import annotations

import torch

from quantkit.formats import gptq
from quantkit.quant.records import QuantizedWeight

NAME = gptq.V2


def supports(qw: QuantizedWeight) -> str | None:
    """None when ``qw`` fits a GPTQ v2 checkpoint, else the reason (see :func:`quantkit.formats.gptq.supports`)."""
    return gptq.supports(qw, gptq.V2)


def layout_meta(qw: QuantizedWeight) -> dict:
    """Manifest metadata of ``qw`` in the v2 layout (``checkpoint_format: "gptq_v2"``)."""
    return gptq.layout_meta(qw, gptq.V2)


def pack(qw: QuantizedWeight) -> dict[str, torch.Tensor]:
    """GPTQ tensors with unshifted zero points (:func:`quantkit.formats.gptq.pack` with the v2 convention)."""
    return gptq.pack(qw, gptq.V2)


def unpack(tensors: dict[str, torch.Tensor], meta: dict) -> QuantizedWeight:
    """Rebuild the QuantizedWeight; ``meta`` carries ``checkpoint_format: "gptq_v2"`` (from :func:`layout_meta`)."""
    return gptq.unpack(tensors, {**meta, "checkpoint_format": gptq.V2})


def quantization_config(metas) -> dict:
    """config.json ``quantization_config`` (:func:`quantkit.formats.gptq.quantization_config`), format gptq_v2."""
    return gptq.quantization_config(metas)
