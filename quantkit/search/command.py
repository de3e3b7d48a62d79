"""The job behind ``quantkit search``: parse list options, load, search with rich progress, write plan and plot."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from quantkit.errors import QuantkitError
from quantkit.search.allocate import BitBudget
from quantkit.search.run import SearchOptions, search
from quantkit.search.strategies import check_strategy, uses_salience

DEFAULT_TARGET = 4.4  # MixLLM W4.4A8: 10% of the weight elements at 8 bits


def parse_list(text: str | None, kind: type, option: str) -> list | None:
    """'4,8' → [4, 8] (``kind`` int or float); a QuantkitError naming ``option`` when an item does not parse."""
    if text is None:
        return None
    try:
        return [kind(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise QuantkitError(f"{option} must be a comma-separated list of {kind.__name__}s, got '{text}'") from None


@contextlib.contextmanager
def _bars(enabled: bool) -> Iterator[tuple]:
    """Two progress bars on stderr in one display (:func:`quantkit.ui.progress_group`): Δ per linear, then
    calibration samples."""
    if not enabled:
        yield None, None
        return
    from quantkit.ui import progress_group

    with progress_group("quantize linears (Δ)", "salience samples") as bars:
        yield bars


def check_salience_options(strategy: str, samples: int | None, seqlen: int | None, seed: int | None,
                           dataset: str | None, first_order: bool, batch_size: int,
                           text_column: str | None = None) -> list[str]:
    """Warn about (one yellow line) and return the calibration options of the salience strategies (MixLLM Eq. 4
    needs data and gradients) given with ``random`` or ``magnitude``, which read none of them (``random`` does use
    ``--seed``): they change nothing in the plan, and the search goes on without them (so a loop over strategies
    can pass the same options to each)."""
    if uses_salience(strategy):
        return []
    given = [opt for opt, v in (("--calib-samples", samples), ("--seqlen", seqlen), ("--calib-dataset", dataset),
                                ("--text-column", text_column),
                                ("--no-first-order", None if first_order else True),
                                ("--batch-size", None if batch_size == 1 else batch_size),
                                ("--seed", seed if strategy == "magnitude" else None)) if v is not None]
    if given:
        from quantkit.ui import warn

        one = len(given) == 1
        warn(f"{', '.join(given)} {'is' if one else 'are'} ignored: --strategy {strategy} reads no calibration data "
             f"({'it is' if one else 'they are'} for the salience strategies global and local)")
    return given


def check_plan_output(output: str, plot: str | None = None, force: bool = False) -> None:
    """Refuse, before the search, an ``-o`` the plan cannot be written to or must not overwrite: an empty path, a
    folder, a missing parent folder, the ``--plot`` file, an existing file without ``force``, and with ``force`` an
    existing file that is not a quantkit plan (the rule of ``pack -o``: ``--force`` replaces a plan, nothing
    else)."""
    from quantkit.model.loader import check_not_builtin_name
    from quantkit.plotting import written_path
    from quantkit.search.plan_check import read_plan

    check_not_builtin_name(output)
    out = Path(output).expanduser()
    if not output.strip() or out.is_dir():
        raise QuantkitError(f"-o '{output}' is not a file path; name the plan file, e.g. -o plan.json")
    if not out.parent.is_dir():
        raise QuantkitError(f"cannot write plan '{out}': folder '{out.parent}' does not exist")
    if plot is not None and written_path(plot).resolve() == out.resolve():  # where savefig puts it
        raise QuantkitError(f"-o and --plot both name '{output}'; give the heatmap its own file, e.g. --plot plan.png")
    if out.exists() or out.is_symlink():
        try:
            read_plan(out)
        except QuantkitError:
            raise QuantkitError(f"-o '{output}' exists and is not a quantkit plan; --force only replaces plans — "
                                "choose another path or remove that file yourself") from None
        if not force:
            raise QuantkitError(f"plan '{output}' already exists; pass --force to replace it or choose another -o")


def _check_streamed(model_ref: str, rec, device: str, dtype: str | None, device_map: str | None, strategy: str,
                    max_gpu_memory: str, batch_size: int, seqlen: int | None, samples: int | None
                    ) -> tuple[str, str, int]:
    """(the GPU to stream the layers to, the dtype to load the weights in, windows per chunk) for
    ``--max-gpu-memory``; a one-line refusal when the options do not combine or the streamed pass needs more GPU
    memory than the cap. A chunk holds as many windows as the free CPU memory
    (:func:`quantkit.search.salience.stream_chunk`) and what the cap leaves on the GPU allow."""
    from quantkit import distributed
    from quantkit.checkpoint.atomic import human_bytes
    from quantkit.checkpoint.shards import parse_size
    from quantkit.model.loader import load_config, resolve_device, resolve_dtype
    from quantkit.model.memory import free_memory
    from quantkit.model.memory_plan import model_shape, streamed_search_plan
    from quantkit.search.salience import stream_chunk

    cap = parse_size(max_gpu_memory, "--max-gpu-memory")
    if not torch.cuda.is_available():
        raise QuantkitError("--max-gpu-memory streams the model's layers to a GPU, and no CUDA GPU is visible here; "
                            "drop --max-gpu-memory")
    dev = resolve_device(device)
    if torch.device(dev).type != "cuda":
        raise QuantkitError("--max-gpu-memory streams the model's layers to a GPU; use --device cuda (or drop it)")
    if device_map is not None or not uses_salience(strategy):
        raise QuantkitError("--max-gpu-memory streams the salience pass (strategies global and local) and places "
                            "the layers itself: drop --device-map, or --max-gpu-memory")
    torch_dtype = resolve_dtype(dtype, dev, getattr(load_config(model_ref), "dtype", None))
    shape = model_shape(model_ref)
    window = seqlen if seqlen is not None else rec.calibration.seqlen
    if shape.positions:
        window = min(window, shape.positions)
    tokens = batch_size * window
    one_batch = streamed_search_plan(shape, torch_dtype, tokens, tokens, batch_size)
    if one_batch.gpu_bytes > cap:
        raise QuantkitError(f"a search streaming one decoder layer at a time still needs about "
                            f"{human_bytes(one_batch.gpu_bytes)} of GPU memory here, more than --max-gpu-memory "
                            f"{max_gpu_memory}; use fewer tokens per backward (--batch-size, --seqlen) or a larger cap")
    free_cpu = free_memory("cpu")
    procs = distributed.local_world_size()  # torchrun: each process of this machine loads the model and its Δ
    if free_cpu and procs * one_batch.cpu_bytes > free_cpu:
        raise QuantkitError(f"a streamed search keeps the model and its Δ in CPU memory: about "
                            f"{human_bytes(procs * one_batch.cpu_bytes)} for {procs} process(es), and "
                            f"{human_bytes(free_cpu)} is free; use a machine with more memory, fewer processes, or "
                            "--dtype bf16 for an fp32 model")
    elt = torch.empty((), dtype=torch_dtype).element_size()
    n = samples if samples is not None else rec.calibration.samples
    # what the models and Δs leave free once loaded, shared by this machine's processes
    left = (free_cpu - procs * one_batch.cpu_bytes) // procs if free_cpu else None
    chunk = stream_chunk(n, batch_size, window * shape.hidden * (shape.layers + 1) * elt, left)
    per_batch_gpu = (streamed_search_plan(shape, torch_dtype, tokens, 2 * tokens, 2 * batch_size).gpu_bytes
                     - one_batch.gpu_bytes)
    gpu_batches = 1 + (cap - one_batch.gpu_bytes) // max(1, per_batch_gpu)
    return dev, str(torch_dtype).replace("torch.", ""), min(chunk, gpu_batches * batch_size)


def _check_memory(model_ref: str, device: str, dtype: str | None, device_map: str | None) -> None:
    """Refuse before loading when the whole model cannot fit where the search keeps it
    (:func:`quantkit.model.memory_plan.search_plan`)."""
    from quantkit.model.loader import load_config, resolve_device, resolve_dtype
    from quantkit.model.memory_plan import check_plan, model_shape, search_plan

    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev, getattr(load_config(model_ref), "dtype", None))
    half = "--dtype bf16 halves it" if torch_dtype == torch.float32 else "use a machine with more memory"
    check_plan(search_plan(model_shape(model_ref), torch_dtype, dev, device_map), dev,
               {"cpu": f"the search keeps the whole model in CPU memory: {half}",
                "gpu": "the search keeps the whole model on the GPU: --device-map auto spreads it over the GPUs and "
                       "CPU memory, or --device cpu"})


def run_search(model_ref: str, output: str, recipe: str = "mixllm-w4a8", *, bits: str = "4,8",
               target_bits: float | None = None, fractions: str | None = None, strategy: str = "global",
               samples: int | None = None, seqlen: int | None = None, seed: int | None = None,
               dataset: str | None = None, first_order: bool = True, batch_size: int = 1, device: str = "auto",
               dtype: str | None = None, device_map: str | None = None, plot: str | None = None,
               text_column: str | None = None,  # the text column of a record-file dataset (None: "text")
               show_progress: bool = True, force: bool = False, max_gpu_memory: str | None = None):
    """Load the model, run the search, write ``output`` (and the heatmap ``plot``); returns the Plan. An existing
    plan at ``output`` is replaced only with ``force``, which is checked before the model loads.
    ``max_gpu_memory`` (e.g. "10GiB"): keep the weights in CPU memory and run one decoder layer at a time on the
    GPU (:func:`quantkit.search.salience.compute_salience`'s streaming), refused before loading when even that
    needs more."""
    from quantkit.data import check_sample_count, check_source, check_text_column
    from quantkit.model import load_model
    from quantkit.quant.recipe import load_recipe
    from quantkit.plotting import check_plot_path
    from quantkit.search.report import save_heatmap

    fr = parse_list(fractions, float, "--fractions")
    budget = BitBudget.parse(parse_list(bits, int, "--bits"),
                             DEFAULT_TARGET if target_bits is None and fr is None else target_bits, fr)
    check_strategy(strategy)
    check_sample_count(samples, "--calib-samples")
    if seqlen is not None and seqlen < 2:
        raise QuantkitError(f"--seqlen must be at least 2 tokens, got {seqlen}")
    if dataset is not None:
        check_source(dataset, text_column=text_column)  # before the model loads
    check_plan_output(output, plot, force)
    out = Path(output).expanduser()
    if plot is not None:
        check_plot_path(plot)  # fail before the search, not after it
    rec = load_recipe(recipe)
    if rec.weight.grid == "fp8":
        raise QuantkitError(f"recipe '{recipe}' quantizes every channel to FP8 E4M3 (one precision): there is no "
                            "plan to search; pack it directly with `quantkit pack --recipe`")
    if uses_salience(strategy):
        check_text_column(text_column, [dataset or rec.calibration.dataset])
    from quantkit import distributed

    if distributed.launched():  # torchrun: each process scores its share of the windows (quantkit.distributed)
        if device_map is not None:
            raise QuantkitError("a data-parallel search (torchrun) holds one whole model per process: drop "
                                "--device-map, or run without torchrun")
        if not uses_salience(strategy):
            raise QuantkitError(f"--strategy {strategy} reads no calibration windows, so there is nothing to split "
                                "across processes; run it without torchrun")
        from quantkit.model.loader import resolve_device

        device = distributed.setup(resolve_device(device))
        n = samples if samples is not None else rec.calibration.samples
        if n < distributed.world_size():
            raise QuantkitError(f"{distributed.world_size()} processes need at least as many calibration windows "
                                f"(got {n}); use more --calib-samples or fewer processes")
        show_progress = show_progress and distributed.is_main()
    stream_device = stream_windows = None
    if max_gpu_memory is not None:
        stream_device, dtype, stream_windows = _check_streamed(model_ref, rec, device, dtype, device_map, strategy,
                                                               max_gpu_memory, batch_size, seqlen, samples)
        device = "cpu"  # where the weights stay
    _check_memory(model_ref, device, dtype, device_map)
    loaded = load_model(model_ref, device=device, dtype=dtype, device_map=device_map,
                        load_tokenizer=uses_salience(strategy))
    opts = SearchOptions(budget=budget, strategy=strategy, dataset=dataset, samples=samples, seqlen=seqlen,
                         seed=seed, first_order=first_order, batch_size=batch_size, text_column=text_column,
                         stream_device=stream_device, stream_windows=stream_windows)
    with _bars(show_progress and uses_salience(strategy)) as (layer_bar, sample_bar):
        plan, _ = search(loaded, rec, opts, progress=sample_bar, layer_progress=layer_bar)
    if distributed.is_main():  # every process holds the same plan
        plan.save(out)
        if plot is not None:
            save_heatmap(plan, plot)
    distributed.barrier()
    return plan
