"""The job behind ``quantkit pack``: check the options, load the model, quantize it per recipe (and plan) layer by
layer on the compute device, choose each partition's layout, and write the checkpoint atomically.

Everything that can be refused from the options, the recipe and the plan alone (unknown target/format, GPTQ/AWQ
export of what those formats cannot hold, an existing output without --force, a bad --max-shard-size) is refused
before the model is loaded; a plan made for another model, or an output file system without room for the
checkpoint, is refused right after loading, before quantizing. Temporary folders that killed packs to the same
output left behind are removed first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import torch

from quantkit import distributed
from quantkit.data.tokens import check_calib_seqlen, check_sample_count
from quantkit.errors import QuantkitError


def _warn_line(msg: str) -> None:
    from quantkit.ui import err_console

    err_console.print(f"[bold yellow]warning:[/] {msg}", highlight=False, soft_wrap=True)


def _warn_expert_coverage(calibration: dict | None, warn: Callable[[str], None]) -> None:
    """One warning naming the MoE experts that calibration reached with too few tokens, and the rule applied."""
    rows = [r for r in (calibration or {}).get("experts", []) if r["under_covered"]]
    if not rows:
        return
    named = "; ".join(f"{r['experts']}: {', '.join(map(str, r['under_covered']))}" for r in rows[:4])
    more = f" (and {len(rows) - 4} more layers)" if len(rows) > 4 else ""
    n = sum(len(r["under_covered"]) for r in rows)
    warn(f"{n} MoE expert(s) saw too few calibration tokens ({named}{more}); {calibration['experts_rule']}. More "
         "calibration samples (--calib-samples) reach more experts")


def _memory_plan(model_ref: str, rec, plan, load_dtype: torch.dtype, compute: str, samples: int | None,
                 seqlen: int | None):
    """pack's :class:`~quantkit.model.memory_plan.MemoryPlan`, refused before the model loads when it does not fit."""
    from quantkit.model.memory_plan import check_plan, model_shape, pack_plan

    calib = rec.calibration
    bits = plan.achieved_bits if plan is not None else rec.weight.bits
    head = None if not rec.lm_head else ("gptq" if rec.weight.method == "gptq" else "rtn")
    memory = pack_plan(model_shape(model_ref), load_dtype, compute, rec.uses_calibration,
                       samples or calib.samples, seqlen or calib.seqlen, bits, head)
    half = ("load it in half precision (--dtype bf16)" if load_dtype == torch.float32 else
            "use a machine with more memory")
    if not (rec.activation.rotate or rec.activation.online_rotate or rec.lm_head):  # what --stream cannot do
        half = f"{half}, or pack one decoder layer at a time (--stream)"
    check_plan(memory, compute, {"cpu": f"the weights stay in CPU memory while packing: {half}",
                                 "gpu": "use fewer or shorter calibration windows (--calib-samples, --calib-seqlen) "
                                        "or --device cpu"})
    return memory


def _manifest_info(model_ref: str, model, rec, plan: str | None, plan_raw: bytes | None, target: str, export: str,
                   source_dtype: torch.dtype, parameters: int | None = None) -> dict:
    """The manifest's descriptive fields that do not depend on the quantization's result: version, source, recipe,
    plan, target, export and the activation entry."""
    from quantkit import __version__

    return {"quantkit_version": __version__,
            "source": {"model": model_ref, "model_type": model.config.model_type,
                       "dtype": str(source_dtype).replace("torch.", ""),
                       "parameters": _parameters(model) if parameters is None else parameters},
            "recipe": rec.to_dict(), "plan_sha256": hashlib.sha256(plan_raw).hexdigest() if plan_raw else None,
            "plan_file": Path(plan).name if plan else None, "target": target, "export": export,
            "activation": _activation_entry(rec)}


def _activation_entry(rec) -> dict | None:
    """The manifest's ``activation`` entry of a recipe (None: weights only)."""
    if not rec.activation.enabled:
        return None
    act = {"bits": rec.activation.bits, "group_size": rec.activation.group_size, "sym": rec.activation.sym}
    if rec.activation.fp8:
        act["fp8"] = True
    return act


def _stream(model_ref: str, rec, plan: str | None, plan_obj, plan_raw: bytes | None, out: Path, target: str,
            max_bytes: int, force: bool, resume: bool, load_dtype: torch.dtype, source_dtype: torch.dtype,
            progress: bool, warn: Callable[[str], None], warnings: list[str], compute: str,
            calib_options: dict) -> dict:
    """``run_pack`` one layer at a time (:func:`quantkit.checkpoint.stream.stream_pack`)."""
    from quantkit.checkpoint.atomic import check_free_space
    from quantkit.checkpoint.report import summarize
    from quantkit.checkpoint.stream import stream_pack
    from quantkit.model.memory_plan import check_plan, meta_model, model_shape, stream_plan

    bits = plan_obj.achieved_bits if plan_obj is not None else rec.weight.bits
    calib = rec.calibration
    memory = stream_plan(model_shape(model_ref), load_dtype, bits, compute, rec.uses_calibration,
                         calib_options["samples"] or calib.samples, calib_options["seqlen"] or calib.seqlen)
    check_plan(memory, compute, {"cpu": "use a machine with more memory",
                                 "gpu": "use fewer or shorter calibration windows (--calib-samples, --calib-seqlen) "
                                        "or --device cpu"})
    check_free_space(out.absolute(), memory.disk_bytes, at_least=True)
    info = _manifest_info(model_ref, meta_model(model_ref), rec, plan, plan_raw, target, "quantkit", source_dtype)
    info["calibration"] = None  # the streamed pack fills it in
    progress_factory = None
    if progress:
        from quantkit.ui import progress_bar

        progress_factory = progress_bar
    try:
        manifest = stream_pack(model_ref, rec, plan_obj, out, target=target, max_bytes=max_bytes, force=force,
                               resume=resume, load_dtype=load_dtype, source_dtype=source_dtype, info=info, warn=warn,
                               progress_factory=progress_factory, device=compute, calibration=calib_options)
    except KeyboardInterrupt:
        from quantkit.checkpoint.stream import partial_dir

        if partial_dir(out.absolute()).exists():
            warn(f"interrupted: the finished layers are in '{partial_dir(out.absolute())}'; run the same command "
                 "with --resume to continue from them")
        raise
    summary = summarize(out, manifest)
    summary["memory_plan"] = memory.to_dict()
    summary["streamed"] = True
    summary["warnings"] = warnings
    return summary


def _plan_bytes(plan: str | None) -> bytes | None:
    if plan is None:
        return None
    try:
        return Path(plan).expanduser().read_bytes()
    except OSError as e:
        raise QuantkitError(f"cannot read plan '{plan}': {e.strerror or e}") from None


def _source_dtype(model_ref: str) -> torch.dtype:
    """The dtype the source checkpoint stores (config.json ``dtype``/``torch_dtype``; float32, HF's default,
    when it says nothing)."""
    from transformers import AutoConfig

    from quantkit.model.loader import DTYPES, quiet_hf, resolve_model_path

    path, _ = resolve_model_path(model_ref)
    quiet_hf()
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError):
        return torch.float32  # load_model reports an unreadable config with its own one-line error
    name = str(getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or "").replace("torch.", "")
    return DTYPES.get(name, torch.float32)


def _load_dtype(dtype: str | None, compute: str, source_dtype: torch.dtype, calibrated: bool) -> torch.dtype:
    """The dtype the model is held in while packing. On the CPU a recipe without calibration data (RTN, LiquidQuant
    without clipping) keeps the source dtype: its quantizers read each weight upcast to fp32 on their own, so the
    codes equal those of an fp32 load at half the memory for an fp16/bf16 source. Calibrated recipes run whole
    decoder layers, whose CPU forwards must stay in fp32 to produce the codes that ``eval-ppl --recipe`` does."""
    from quantkit.model.loader import resolve_dtype

    if dtype not in (None, "auto") or compute != "cpu" or calibrated:
        return resolve_dtype(dtype, compute, source_dtype)
    return source_dtype


def estimate_bytes(model: torch.nn.Module, recipe, plan, source_dtype: torch.dtype) -> int:
    """A lower bound of the checkpoint's size, known before quantizing: each quantized linear's codes at its
    bit-widths (the plan's per channel, else the recipe's), every other tensor in the source dtype (shared ones
    once); scales, zero points and headers come on top."""
    from quantkit.model.walk import iter_linears, output_linear
    from quantkit.quant.recipe import LM_HEAD_BITS

    codes: dict[str, int] = {}
    for name, lin in iter_linears(model):
        spec = recipe.spec_for(name)
        if spec.skip:
            continue
        n, k = lin.weight.shape
        bits = int(plan.row_bits(name).sum()) if plan is not None and name in plan.layers else spec.bits * n
        codes[f"{name}.weight"] = bits * k // 8
    head = output_linear(model) if recipe.lm_head else None
    if head is not None:  # quantize_lm_head: 4-bit codes; a tied embedding stays and is counted below
        name, lin = head
        codes[f"{name}.weight"] = LM_HEAD_BITS * lin.weight.numel() // 8
    total = sum(codes.values())
    elt = torch.empty((), dtype=source_dtype).element_size()
    seen = set()
    for key, t in model.state_dict().items():
        ptr = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
        if key in codes or ptr in seen:
            continue
        seen.add(ptr)
        total += t.numel() * (elt if t.is_floating_point() else t.element_size())
    return total


def _release_weights(model: torch.nn.Module, records: dict) -> None:
    """Free the fake-quant weights of the quantized linears: the checkpoint stores their records instead, and
    nothing after quantizing reads them (``pack_model`` takes only their names), so building and writing the
    checkpoint does not hold both."""
    for name in records:
        lin = model.get_submodule(name)
        lin.weight = torch.nn.Parameter(torch.empty(0, dtype=lin.weight.dtype), requires_grad=False)


def _parameters(model: torch.nn.Module) -> int:
    """Parameter count with shared tensors (tied embeddings) counted once."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def run_pack(model_ref: str, recipe: str, output: str, *, plan: str | None = None, target: str | None = None,
             export: str = "quantkit", max_shard_size: str | int = "2GB", device: str = "auto",
             dtype: str | None = None, calib_samples: int | None = None, calib_seqlen: int | None = None,
             calib_dataset: str | None = None,
             text_column: str | None = None, force: bool = False, progress: bool = True,
             warn: Callable[[str], None] | None = None, stream: bool = False, resume: bool = False) -> dict:
    """Quantize ``model_ref`` with ``recipe`` (and ``plan``) and write a packed checkpoint to ``output``
    (docs/checkpoint-format.md); returns :func:`quantkit.checkpoint.summarize` of what was written plus any
    warnings. ``text_column`` names the text column of a record-file calibration dataset (default ``text``).
    ``stream``: one decoder layer at a time (:mod:`quantkit.checkpoint.stream`); ``resume`` (implies ``stream``)
    continues an interrupted streamed pack."""
    from quantkit.checkpoint.atomic import check_free_space, check_output, remove_stale_temps
    from quantkit.checkpoint.choose import (check_recipe_export, check_target_export, choose_layouts,
                                            fp8_token_activations)
    from quantkit.checkpoint.report import summarize
    from quantkit.checkpoint.shards import parse_size
    from quantkit.checkpoint.writer import build_checkpoint, tokenizer_files, write_checkpoint
    from quantkit.model import load_model
    from quantkit.model.loader import check_not_builtin_name
    from quantkit.model.loader import resolve_device
    from quantkit.quant.apply import quantize_model
    from quantkit.quant.recipe import load_recipe

    warnings: list[str] = []

    def warn_all(msg: str) -> None:
        warnings.append(msg)
        if distributed.is_main():  # data-parallel processes would say it once each
            (warn or _warn_line)(msg)

    rec = load_recipe(recipe)  # the command's main choice: its errors come first
    target = check_target_export(target, export)
    stream = stream or resume
    if stream:
        from quantkit.checkpoint.stream import check_streamable

        check_streamable(rec, export)
    max_bytes = parse_size(max_shard_size)
    check_sample_count(calib_samples)
    check_calib_seqlen(calib_seqlen)
    check_not_builtin_name(output)
    out = Path(output).expanduser()
    check_output(out.absolute(), force)
    for stale in remove_stale_temps(out):
        warn_all(f"removed '{stale}', the temporary folder of an earlier pack to '{out}' that was killed")
    from quantkit.data import check_text_column
    from quantkit.quant.recipe import check_calibration_options

    calib = [o for o, v in (("--calib-samples", calib_samples), ("--calib-seqlen", calib_seqlen),
                            ("--calib-dataset", calib_dataset),
                            ("--text-column", text_column)) if v is not None]
    if check_calibration_options(rec, calib, warn_all):  # ignored: the recipe reads no calibration data
        calib_samples = calib_seqlen = calib_dataset = text_column = None
    if calib_dataset is not None:
        from quantkit.data import check_source

        check_source(calib_dataset, text_column=text_column)
    check_text_column(text_column, [calib_dataset or rec.calibration.dataset])
    plan_raw = _plan_bytes(plan)
    plan_obj = None
    if plan is not None:
        from quantkit.search.plan_check import check_plan_recipe, read_plan

        plan_obj = read_plan(plan)
        check_plan_recipe(plan_obj, rec, f"plan '{plan}'")
        check_recipe_export(rec, export, any(lp.channels for lp in plan_obj.layers.values()))
    else:
        check_recipe_export(rec, export, False)

    compute = resolve_device(device)
    if distributed.launched():  # torchrun: data-parallel calibration (quantkit.distributed)
        if stream:
            raise QuantkitError("--stream runs in one process; drop --stream, or run without torchrun")
        compute = distributed.setup(compute)
        distributed.check_recipe(rec, calib_samples or rec.calibration.samples)
        progress = progress and distributed.is_main()
    # weights stay in CPU memory; run_layerwise moves one decoder layer at a time to the compute device
    source_dtype = _source_dtype(model_ref)
    load_dtype = _load_dtype(dtype, compute, source_dtype, rec.uses_calibration)
    if not stream:
        from quantkit.checkpoint.stream import partial_dir

        if partial_dir(out.absolute()).exists():
            warn_all(f"'{partial_dir(out.absolute())}' holds an interrupted streamed pack to this output, which this "
                     "pack does not use; remove it, or continue it with --resume")
    if stream:
        calib_options = {"dataset": calib_dataset, "samples": calib_samples, "seqlen": calib_seqlen,
                         "text_column": text_column}
        return _stream(model_ref, rec, plan, plan_obj, plan_raw, out, target, max_bytes, force, resume, load_dtype,
                       source_dtype, progress, warn_all, warnings, compute, calib_options)
    memory = _memory_plan(model_ref, rec, plan_obj, load_dtype, compute, calib_samples, calib_seqlen)
    check_free_space(out.absolute(), memory.disk_bytes, at_least=True)
    loaded = load_model(model_ref, device="cpu", dtype=str(load_dtype).replace("torch.", ""))
    if rec.kv is not None:  # the checkpoint's KV-cache scheme must fit its attention heads
        from quantkit.quant.kv import check_fits

        check_fits(loaded.model, rec.kv)
    if plan is not None:
        from quantkit.search.plan_check import check_plan_model

        check_plan_model(plan_obj, loaded.model, f"plan '{plan}'")
    # before the hours a large model may quantize; write_checkpoint checks the exact size again
    check_free_space(out.absolute(), estimate_bytes(loaded.model, rec, plan_obj, source_dtype), at_least=True)
    from quantkit.model.walk import iter_linears

    for pattern in rec.unmatched_overrides(name for name, _ in iter_linears(loaded.model)):
        warn_all(f"recipe override '{pattern}' matches no linear layer of '{model_ref}' and changes nothing "
                 "(patterns are fnmatch on names like model.layers.0.mlp.down_proj)")
    n_params = _parameters(loaded.model)
    progress_factory = None
    if progress:
        from quantkit.ui import progress_bar

        progress_factory = progress_bar
    result = quantize_model(loaded.model, loaded.tokenizer, rec, plan=plan_obj, device=compute,
                            progress_factory=progress_factory, samples=calib_samples, seqlen=calib_seqlen,
                            dataset=calib_dataset,
                            text_column=text_column)
    _release_weights(loaded.model, result.weights)
    _warn_expert_coverage(result.calibration, warn_all)
    layouts = choose_layouts(result.weights, target, export, warn_all, fp8_token_activations(rec))
    if rec.lm_head and export != "quantkit":
        warn_all(f"--format {export} marks the quantized lm_head in quantization_config (lm_head: true), which vLLM "
                 "and GPTQModel read; a loader that keeps lm_head in full precision finds no lm_head.weight")
    info = {**_manifest_info(model_ref, loaded.model, rec, plan, plan_raw, target, export, source_dtype, n_params),
            "calibration": result.calibration, "avg_bits": result.avg_bits, "online_rotation": result.online_rotation,
            "weight_only": result.weight_only}
    if not distributed.is_main():  # every process holds the same records; process 0 writes them
        distributed.barrier()
        return {}
    packed = build_checkpoint(loaded.model, result.weights, layouts, info, source_dtype)
    is_local = Path(loaded.path).is_dir()
    packed.extra_files = tokenizer_files(loaded.path if is_local else None)
    if progress:
        from quantkit.ui import progress_bar

        with progress_bar("write shards") as update:
            write_checkpoint(out, packed, max_bytes, force, loaded.tokenizer, update)
    else:
        write_checkpoint(out, packed, max_bytes, force, loaded.tokenizer)
    summary = summarize(out, packed.manifest)
    summary["memory_plan"] = memory.to_dict()
    if result.calibration and result.calibration.get("experts"):
        summary["expert_coverage"] = result.calibration["experts"]
    summary["warnings"] = warnings
    distributed.barrier()
    return summary
