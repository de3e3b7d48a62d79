"""quantkit: offline LLM quantization (MixLLM search, GPTQ, AWQ, LiquidQuant) and packing for GPU kernels."""

__version__ = "0.1.0"

from quantkit.errors import QuantkitError  # noqa: E402
from quantkit.threads import prefer_sleeping_threads  # noqa: E402

prefer_sleeping_threads()  # before torch starts its thread pools (quantkit.threads says why)


def load(path, device: str = "auto", verify: bool = False, dtype: str | None = None):
    """Load a packed checkpoint (``quantkit pack`` output) as a model whose quantized linears are QuantLinear
    modules; see :func:`quantkit.checkpoint.reader.load_packed`. Imported lazily so ``import quantkit`` stays
    light."""
    from quantkit.checkpoint.reader import load as _load

    return _load(path, device=device, verify=verify, dtype=dtype)


def quantize(model: str, recipe: str, output: str, *, plan: str | None = None, target: str | None = None,
             calib_dataset: str | None = None, calib_samples: int | None = None, calib_seqlen: int | None = None,
             device: str = "auto", force: bool = False) -> dict:
    """Quantize a HF causal LM (local folder, hub id or ``builtin:reference``) with a recipe (a shipped name from
    ``quantkit recipes`` or a YAML path), and a MixLLM precision plan from ``quantkit search`` if given, and write
    a packed checkpoint to ``output`` — what ``quantkit pack`` does. ``target`` picks the kernel layout
    (reference, sm80, sm90). Returns the checkpoint's summary; :func:`load` reads it back."""
    from quantkit.pack import run_pack

    return run_pack(model, recipe, output, plan=plan, target=target, calib_dataset=calib_dataset,
                    calib_samples=calib_samples, calib_seqlen=calib_seqlen, device=device, force=force)


__all__ = ["QuantkitError", "__version__", "load", "quantize"]
