"""quantkit: offline LLM quantization (MixLLM search, GPTQ, AWQ, LiquidQuant) and packing for GPU kernels."""

__version__ = "0.1.0"

from quantkit.errors import QuantkitError  # noqa: E402

__all__ = ["QuantkitError", "__version__"]
