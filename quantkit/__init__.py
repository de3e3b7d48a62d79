"""quantkit: offline LLM quantization (MixLLM search, GPTQ, AWQ, LiquidQuant) and packing for GPU kernels."""

__version__ = "0.1.0"

from quantkit.errors import QuantkitError  # noqa: E402


def load(path, device: str = "auto", verify: bool = False, dtype: str | None = None):
    """Load a packed checkpoint (``quantkit pack`` output) as a model whose quantized linears are QuantLinear
    modules; see :func:`quantkit.checkpoint.reader.load_packed`. Imported lazily so ``import quantkit`` stays
    light."""
    from quantkit.checkpoint.reader import load as _load

    return _load(path, device=device, verify=verify, dtype=dtype)


__all__ = ["QuantkitError", "__version__", "load"]
