"""The eval-ppl job: load an FP model or a packed checkpoint, optionally fake-quantize it with a recipe (and a
MixLLM plan), and measure perplexity the way GPTQ/MixLLM report it. Used by ``quantkit eval-ppl`` and the demo;
every user error is raised before the model loads where the inputs allow."""

from __future__ import annotations

from quantkit.errors import QuantkitError
from quantkit.ui import progress_bar

DTYPE_LABELS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
DTYPE_BITS = {"float32": 32, "float16": 16, "bfloat16": 16}


def dtype_label(dtype: str) -> str:
    """The short name of a torch dtype name as the options spell it: float32 → fp32, bfloat16 → bf16."""
    return DTYPE_LABELS.get(dtype, dtype)


def _ppl_of(model, ids, seqlen, max_windows, label):
    from quantkit.eval import perplexity

    with progress_bar(f"ppl {label}") as update:
        return perplexity(model, ids, seqlen, max_windows, progress=update)


def evaluate_ppl(model_ref: str, dataset: str = "kjv", seqlen: int | None = None, max_windows: int | None = None,
                 device: str = "auto", dtype: str | None = None, recipe: str | None = None,
                 plan: str | None = None, *, baseline: bool = True, calib_samples: int | None = None,
                 calib_seqlen: int | None = None, calib_dataset: str | None = None, text_column: str | None = None,
                 device_map: str | None = None, verify: bool = False, kv_bits: str | None = None) -> dict:
    """Run the eval-ppl job and return its result record (used by the CLI and the demo); ``verify`` recomputes a
    packed checkpoint's sha256s before loading it. ``kv_bits`` (8, 4 or fp8) quantizes the KV cache
    (:mod:`quantkit.quant.kv`), as does a recipe's or a packed checkpoint's ``kv``; the baseline keeps the unquantized
    cache."""
    from quantkit.checkpoint import is_checkpoint, load_packed
    from quantkit.data import check_calib_seqlen, check_sample_count, joined_text
    from quantkit.data.tokens import encode
    from quantkit.eval.ppl import choose_seqlen
    from quantkit.model import load_model
    from quantkit.model.loader import max_positions, quiet_hf

    quiet_hf()
    packed = is_checkpoint(model_ref)
    if verify and not packed:
        raise QuantkitError(f"--verify checks a packed checkpoint's sha256s; '{model_ref}' is not one, so drop "
                            "--verify")
    kv = None
    if kv_bits is not None:
        from quantkit.quant.kv import parse_kv_bits

        kv = parse_kv_bits(kv_bits)
    if packed and (recipe or plan):
        raise QuantkitError(f"'{model_ref}' is a packed checkpoint (already quantized); drop --recipe/--plan")
    calib = given_options(("--calib-samples", calib_samples), ("--calib-seqlen", calib_seqlen),
                          ("--calib-dataset", calib_dataset))
    if calib and recipe is None:
        raise QuantkitError(f"{', '.join(calib)} set{'s' if len(calib) == 1 else ''} the calibration of --recipe; "
                            "add --recipe or drop " + ("it" if len(calib) == 1 else "them"))
    check_sample_count(calib_samples)
    check_calib_seqlen(calib_seqlen)
    check_sample_count(max_windows, "--max-windows")  # before the model loads and the baseline runs
    if seqlen is not None:
        choose_seqlen(seqlen, None)  # its lower bound now; the model's own limit once it is loaded
    if packed and device_map is not None:
        raise QuantkitError("--device-map places an HF model's layers; a packed checkpoint loads on --device, so "
                            "drop --device-map")
    text = joined_text(dataset, "test", text_column)  # a bad or empty --dataset fails before the model loads
    if plan is not None and recipe is None:
        raise QuantkitError("--plan needs --recipe (the plan says which bits, the recipe how to quantize)")
    rec = plan_obj = None
    if recipe is not None:  # a bad recipe or plan, or one that does not fit the other, fails before the model loads
        from quantkit.quant.recipe import check_calibration_options, load_recipe

        rec = load_recipe(recipe)
        kv = kv or rec.kv
        if check_calibration_options(rec, calib):  # warned: the recipe reads no calibration data
            calib_samples = calib_seqlen = calib_dataset = None
        if calib_dataset is not None:
            from quantkit.data import check_source

            check_source(calib_dataset, text_column=text_column)  # before the model loads and the baseline runs
        if plan is not None:
            from quantkit.search.plan_check import check_plan_recipe, read_plan

            plan_obj = read_plan(plan)
            check_plan_recipe(plan_obj, rec, f"plan '{plan}'")
    from quantkit.data import check_text_column

    check_text_column(text_column, [dataset, (calib_dataset or rec.calibration.dataset)
                                    if rec is not None and rec.uses_calibration else None])
    loaded = (load_packed(model_ref, device=device, dtype=dtype, verify=verify) if packed
              else load_model(model_ref, device=device, dtype=dtype, device_map=device_map))
    seqlen = choose_seqlen(seqlen, max_positions(loaded.model))
    if kv is None and packed:
        from quantkit.checkpoint.manifest import read_manifest
        from quantkit.quant.recipe import parse_recipe

        kv = parse_recipe(read_manifest(model_ref)["recipe"]).kv
    if kv is not None:  # before any ppl runs
        from quantkit.quant.kv import check_fits

        check_fits(loaded.model, kv)
    ids = encode(loaded.tokenizer, text)
    result = {"model": model_ref, "dataset": dataset, "device": loaded.device,
              "dtype": str(loaded.dtype).replace("torch.", "")}
    from quantkit.ui import detail

    detail(f"loaded {model_ref} on {loaded.device} in {result['dtype']}; {ids.numel():,} test tokens, windows of "
           f"{seqlen}")
    if rec is None:
        label = "packed" if packed else dtype_label(result["dtype"])
        if kv is not None and baseline:
            r0 = _ppl_of(loaded.model, ids, seqlen, max_windows, f"{label}, unquantized cache")
            result.update(ppl_baseline=r0.ppl, nll_baseline=r0.nll, baseline=f"{label}, unquantized cache")
        if kv is not None:
            _use_kv(loaded.model, kv, result)
            label = f"{label} + {kv.label}"
        r = _ppl_of(loaded.model, ids, seqlen, max_windows, label)
        result.update(r.as_dict())
        return result
    from quantkit.quant.apply import quantize_model

    if plan_obj is not None:
        from quantkit.search.plan_check import check_plan_model

        check_plan_model(plan_obj, loaded.model, f"plan '{plan}'")
    if baseline:  # the unquantized model in the dtype it was loaded in (result["dtype"])
        r0 = _ppl_of(loaded.model, ids, seqlen, max_windows, dtype_label(result["dtype"]))
        result.update(ppl_baseline=r0.ppl, nll_baseline=r0.nll)
    qres = quantize_model(loaded.model, loaded.tokenizer, rec, plan=plan_obj, device=loaded.device,
                          progress_factory=progress_bar, dataset=calib_dataset, samples=calib_samples,
                          seqlen=calib_seqlen,
                          text_column=text_column)
    label = rec.name
    if kv is not None:
        _use_kv(loaded.model, kv, result)
        label = f"{label} + {kv.label}"
    r = _ppl_of(loaded.model, ids, seqlen, max_windows, label)
    result.update(r.as_dict())
    result.update(recipe=rec.name, plan=plan, avg_bits=qres.avg_bits, calibration=qres.calibration)
    return result


def _use_kv(model, kv, result: dict) -> None:
    from quantkit.quant.kv import attach_kv_quant

    attach_kv_quant(model, kv)
    result["kv"] = kv.label


def given_options(*pairs: tuple[str, object]) -> list[str]:
    """The option names of the (name, value) pairs whose value was given (not None)."""
    return [name for name, value in pairs if value is not None]
