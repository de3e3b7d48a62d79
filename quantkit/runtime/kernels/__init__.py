"""quantkit's Triton GPU kernels (W4A16, W8A8, W4A8 MixLLM / LiquidQuant, mixed W4.4A8, activation
quantization, RMSNorm with that quantization folded in), each with a torch reference over the same packed tensors
(:mod:`.reference`).

Importing this package registers the kernels with :mod:`quantkit.runtime.dispatch` for the ``w4a16``,
``w4a8-lqq``, ``w8`` and ``fp8`` layouts on CUDA devices, and the one-launch mixed W4.4A8 kernel for two-partition
layers of those layouts with A8 activations. :mod:`.jit` is imported first: it chooses Triton's CPU
interpreter (before triton itself is imported) on machines without a CUDA device.
"""

from quantkit.runtime.kernels import jit  # noqa: F401  (must precede every triton import)

from quantkit.runtime import dispatch  # noqa: E402
from quantkit.runtime.kernels.entry import (fp8_binder, fp8_kernel, layout_binder, layout_kernel,  # noqa: E402
                                            mixed_binder, mixed_kernel, mixed_supported, rms_norm_entry)
from quantkit.runtime.kernels.registry import selection_state  # noqa: E402

for _layout in ("w4a16", "w4a8-lqq", "w8"):
    dispatch.register(_layout, layout_kernel(_layout), quantizes_activations=True, shared_activation=True,
                      bind=layout_binder(_layout), selection=selection_state)
dispatch.register("fp8", fp8_kernel, quantizes_activations=True, shared_activation=True, bind=fp8_binder,
                  selection=selection_state)
dispatch.register_mixed(mixed_kernel, mixed_supported, bind=mixed_binder, selection=selection_state)
dispatch.register_norm(rms_norm_entry)
