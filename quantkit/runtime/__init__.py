"""Inference over packed checkpoints: QuantLinear (output-channel partitions + scatter, MixLLM Sec. 3.4) and the
layout → kernel dispatch that GPU kernels register into (torch reference otherwise)."""

from quantkit.runtime.dispatch import ActQuant, Kernel, kernel_for, register, unregister
from quantkit.runtime.quant_linear import PackedPart, QuantLinear

__all__ = ["ActQuant", "Kernel", "PackedPart", "QuantLinear", "kernel_for", "register", "unregister"]
