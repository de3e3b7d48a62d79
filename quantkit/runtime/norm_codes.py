"""The A8 codes an RMSNorm kernel attaches to its output, and their adoption by the QuantLinear that reads it.

:class:`quantkit.runtime.fused_norm.FusedRMSNorm` quantizes its output for the projections it feeds (MixLLM Sec.
3.1.2's A8, made in the norm's own pass) and attaches (act, state, codes, scales) as :data:`A8_ATTR`; the first
QuantLinear reading that very tensor, unchanged, takes them instead of quantizing again. Between the norm and the
linears in the import order: both use this module, neither imports the other through it.
"""

from __future__ import annotations

import torch

from quantkit.runtime.dispatch import A8_FORM, FAKE_FORM, SharedActivation
from quantkit.runtime.sibling_inputs import input_key

A8_ATTR = "_quantkit_a8"  # on a FusedRMSNorm output: (act, version or None, codes, scales)


def adopt_norm_codes(shared: SharedActivation, source: torch.Tensor) -> bool:
    """Give ``shared`` (the input of a QuantLinear, ``source`` as it was called with) the codes and scales a
    FusedRMSNorm attached to ``source`` — when they were made for the same activation quantization and
    ``source`` has not changed since (its version counter; an inference tensor has none and is taken as is), on
    the same stream and capture state; the codes leave ``source`` then. Returns whether it did."""
    attached = getattr(source, A8_ATTR, None)
    if attached is None or shared.act is None:
        return False
    act, state, codes, scales = attached
    if act != shared.act or state != output_state(source) or codes.shape != shared.x.shape:
        return False
    delattr(source, A8_ATTR)  # taken once (module docstring)
    shared.provide(A8_FORM, (codes, scales))
    from quantkit.runtime.kernels.entry import dequantize_a8  # codes exist only where the kernels were loaded

    dtype = shared.x.dtype
    shared.offer(FAKE_FORM, lambda: dequantize_a8(codes, scales, act.group_size, dtype))
    return True


def output_state(y: torch.Tensor) -> tuple:
    """What must still hold of y when its codes are adopted: the sibling scope's reuse key
    (:func:`quantkit.runtime.sibling_inputs.input_key`: version counter, storage, shape, stream, capture state)."""
    return input_key(y)
