"""The ``quantkit generate`` job: load a packed checkpoint or an FP model, run the prompt through
:class:`quantkit.runtime.generate.Generator` and stream the continuation. User errors are raised before the model
loads where the inputs allow."""

from __future__ import annotations

from quantkit.errors import QuantkitError


def run_generate(model_ref: str, prompt: str, max_new_tokens: int, context: int | None, device: str,
                 dtype: str | None, stream=None, compile_decode: bool = False, kv_bits: str | None = None) -> dict:
    """Greedy continuation of ``prompt`` by ``max_new_tokens`` tokens; the text is printed to ``stream`` (a rich
    console) as it is generated; ``compile_decode`` compiles the decode step (:class:`Generator`); ``kv_bits`` "8"
    or "4" decodes with a packed KV cache (:mod:`quantkit.runtime.kv_cache`), as does a packed checkpoint whose
    recipe names one. Returns the text, the token counts, the cache scheme and the :class:`GenerationStats`
    fields."""
    from quantkit.checkpoint import is_checkpoint, load_packed
    from quantkit.model import load_model
    from quantkit.model.loader import max_positions
    from quantkit.runtime.generate import Generator

    if not prompt.strip():
        raise QuantkitError("--prompt is empty; give the text to continue, e.g. --prompt 'In the beginning'")
    if max_new_tokens < 1:
        raise QuantkitError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if context is not None and context < 2:
        raise QuantkitError(f"--context is the KV-cache length in tokens (at least 2), got {context}")
    kv = _kv_spec(model_ref, kv_bits)
    loaded = (load_packed(model_ref, device=device, dtype=dtype) if is_checkpoint(model_ref)
              else load_model(model_ref, device=device, dtype=dtype))
    tok = loaded.tokenizer
    ids = tok(prompt, return_tensors="pt").input_ids
    limit = max_positions(loaded.model) or (ids.shape[1] + max_new_tokens)
    ctx = min(context or ids.shape[1] + max_new_tokens, limit)
    if ids.shape[1] + 1 > ctx:
        raise QuantkitError(f"the prompt is {ids.shape[1]} tokens, which leaves no room to generate in a {ctx}-token "
                            f"context (the model's positions: {limit}); shorten it or raise --context")
    gen = Generator(loaded.model, ctx, compile_decode=compile_decode, kv=kv)
    new: list[int] = []
    shown = ""
    if stream is not None:
        stream.print(prompt, end="", markup=False, highlight=False, soft_wrap=True)

    def show(tokens):
        nonlocal shown
        new.append(int(tokens[0]))
        if stream is not None:
            text = tok.decode(new, skip_special_tokens=True)
            stream.print(text[len(shown):], end="", markup=False, highlight=False, soft_wrap=True)
            shown = text

    out, stats = gen.generate(ids, max_new_tokens, eos_token_id=tok.eos_token_id, on_tokens=show)
    if stream is not None:
        stream.print()
    text = tok.decode(out[0].tolist(), skip_special_tokens=True)
    return {"model": model_ref, "device": str(loaded.device), "text": text, "kv": kv.label if kv else "fp",
            **stats.as_dict()}


def _kv_spec(model_ref: str, kv_bits: str | None):
    """The packed cache scheme: ``--kv-bits`` (8 or 4), else a packed checkpoint's recipe ``kv`` (KV-FP8 decodes
    with an fp16 cache, with a warning), else None."""
    from quantkit.checkpoint import is_checkpoint
    from quantkit.runtime.kv_cache import packed_kv_spec

    if kv_bits is not None:
        return packed_kv_spec(kv_bits)
    if not is_checkpoint(model_ref):
        return None
    from quantkit.checkpoint.manifest import read_manifest
    from quantkit.quant.recipe import parse_recipe

    kv = parse_recipe(read_manifest(model_ref)["recipe"]).kv
    if kv is not None and kv.fp8:
        from quantkit.ui import warn

        warn(f"the recipe's {kv.label} KV cache has no packed decode path yet; generating with an fp16 cache")
        return None
    return kv
