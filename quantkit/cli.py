"""The ``quantkit`` command line. Thin: parse options, call the library, render with rich. No numerics here."""

from __future__ import annotations

import functools
import inspect
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table
from rich.text import Text

from quantkit.bench.command import (ATTENTION_PRESETS, DEFAULT_BATCH, DEFAULT_CONTEXT, DEFAULT_M, DEFAULT_METHODS,
                                    PRESETS)
from quantkit.errors import QuantkitError
from quantkit.ui import err_console, info, out_console

app = typer.Typer(name="quantkit", no_args_is_help=True, add_completion=True, pretty_exceptions_enable=False,
                  help="Offline LLM quantization: MixLLM search, GPTQ/AWQ/LiquidQuant, packed GPU checkpoints.")


def _plain_flags() -> None:
    """Show flags (``--json``, ``--force``, ``--help``) without a value placeholder in ``--help``: they take no
    value, but typer's rich help (0.2x) prints the ``<bool>`` type after each one. A no-op on typers without
    ``display_type_rich`` (older ones print no type for flags)."""
    from typer.core import TyperOption

    shown = getattr(TyperOption, "display_type_rich", None)
    if shown is None or getattr(shown, "plain_flags", False):
        return

    def display_type_rich(self, ctx):
        if self.is_flag or self.count:
            return None
        return shown(self, ctx)

    display_type_rich.plain_flags = True
    TyperOption.display_type_rich = display_type_rich


_plain_flags()


def _flat_help(doc: str | None) -> str:
    """A command's ``--help`` text from its docstring, each paragraph on one line: typer's rich help keeps a
    docstring's single line breaks, which cut sentences wherever the source wraps (the command list shows the
    first paragraph, so it is one short sentence)."""
    paragraphs = inspect.cleandoc(doc or "").split("\n\n")
    return "\n\n".join(" ".join(line.strip() for line in p.splitlines()) for p in paragraphs)


def command(name: str):
    """``@app.command(name)`` with the help text of :func:`_flat_help`."""

    def register(fn):
        return app.command(name, help=_flat_help(fn.__doc__))(fn)

    return register


def _show_version(value: bool) -> None:
    if value:
        from quantkit import __version__

        sys.stdout.write(f"quantkit {__version__}\n")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_show_version,
                                          help="print the version and exit")] = False,
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="print more: details of each step and the "
                                                                  "HF/transformers warnings quantkit "
                                                                  "silences")] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="print less: no progress or informational lines "
                                                              "(results, warnings and errors still print)")] = False,
    threads: Annotated[Optional[int], typer.Option(help="CPU threads for torch (default: QUANTKIT_THREADS, else "
                                                        "one per core)")] = None,
):
    """Offline LLM quantization: MixLLM search, GPTQ/AWQ/LiquidQuant, packed GPU checkpoints. Global options go
    before the command: ``quantkit -q pack ...``."""
    from quantkit.ui import NORMAL, QUIET, VERBOSE, set_verbosity

    if verbose and quiet:
        _error_line("-v/--verbose and -q/--quiet contradict each other; give one of them")
        raise typer.Exit(QuantkitError.exit_code)
    set_verbosity(VERBOSE if verbose else QUIET if quiet else NORMAL)
    if threads is not None:
        from quantkit.threads import configure_cpu_threads, parse_threads

        configure_cpu_threads(parse_threads(threads, "--threads"))


def _error_line(message: str) -> None:
    import os

    if os.environ.get("RANK", "0") != "0":  # torchrun: every process fails alike; process 0 says it once
        return
    err_console.print(Text.assemble(("error: ", "bold red"), message), highlight=False, soft_wrap=True)


DATA_PARALLEL_COMMANDS = ("pack", "search")  # the commands that split their calibration across torchrun processes


def _check_launcher() -> None:
    """Under torchrun (WORLD_SIZE > 1) only :data:`DATA_PARALLEL_COMMANDS` run: any other would run N times."""
    import os

    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return
    name = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    if name is not None and name not in DATA_PARALLEL_COMMANDS:
        raise QuantkitError(f"quantkit {name} runs in one process; run it without torchrun (data-parallel "
                            f"calibration: quantkit {' and '.join(DATA_PARALLEL_COMMANDS)})")


def out_of_memory_message(e: BaseException) -> str | None:
    """The one-line error for a CUDA out-of-memory error (a size the user chose was too large for this GPU), or
    None for any other exception. torch is looked up, not imported: a run that never imported it cannot run out."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(e, torch.cuda.OutOfMemoryError):
        return None
    text = str(e).strip()
    first = text.splitlines()[0].rstrip(".") if text else "CUDA out of memory"
    return (f"out of GPU memory ({first[:160]}); hold less at once — a smaller batch, sequence length or token "
            "count (see this command's --help) — or use a GPU with more memory")


def user_errors(fn):
    """Turn a QuantkitError — and a CUDA out-of-memory error — into one red line on stderr and exit code 2 (no
    traceback)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except QuantkitError as e:
            _error_line(str(e))
            raise typer.Exit(QuantkitError.exit_code) from None
        except RuntimeError as e:
            message = out_of_memory_message(e)
            if message is None:
                raise
            _error_line(message)
            raise typer.Exit(QuantkitError.exit_code) from None

    return wrapper


Device = Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto (GPU when present)")]
Dtype = Annotated[Optional[str], typer.Option(help="fp32, fp16 or bf16 (default: fp32 on CPU, fp16/bf16 on GPU)")]
Dataset = Annotated[str, typer.Option(help="kjv or pydoc (shipped), wikitext2, c4, pile, a .txt/.jsonl/.json/.csv/"
                                           ".parquet file, a folder (datasets save_to_disk, or train.*/test.* "
                                           "files), or several joined with + (e.g. kjv+pydoc)")]
TextColumn = Annotated[Optional[str], typer.Option(help="the column that holds the text in .jsonl/.json/.csv/.parquet "
                                                        "files and datasets folders (default: text)")]
CalibSeqlen = Annotated[Optional[int], typer.Option(help="tokens per calibration window (default: the recipe's, "
                                                        "capped at the model's context)")]
Json = Annotated[bool, typer.Option("--json", help="print one JSON object on stdout (tables go to stderr)")]
CalibDataset = Annotated[Optional[str], typer.Option("--calib-dataset", help="calibration text: kjv or pydoc "
                                                     "(shipped), wikitext2, c4, pile, a .txt/.jsonl/.json/.csv/"
                                                     ".parquet file, a folder, or several joined with + (default: "
                                                     "the recipe's, kjv+pydoc)")]


def renamed_option(old: str, old_value, new: str, new_value):
    """The value of an option given under its deprecated name ``old`` (a warning says to use ``new``) or under
    ``new``; both at once is an error."""
    if old_value is None:
        return new_value
    if new_value is not None:
        raise QuantkitError(f"{old} is the old name of {new}; give {new} only")
    from quantkit.ui import warn

    warn(f"{old} is deprecated: use {new} (same meaning)")
    return old_value


def _ppl_table(title: str, rows: list[tuple[str, dict]]) -> Table:
    bits = any(r.get("avg_bits") is not None for _, r in rows)
    t = Table(title=title)
    for col in ("model", "dataset", "windows × seqlen") + (("avg bits",) if bits else ()) + ("nll", "ppl"):
        t.add_column(col, justify="right" if col in ("avg bits", "nll", "ppl") else "left")
    for label, r in rows:
        cells = [label, r["dataset"], f"{r['windows']} × {r['seqlen']}"]
        if bits:
            cells.append(f"{r['avg_bits']:.2f}" if r.get("avg_bits") is not None else "")
        t.add_row(*cells, f"{r['nll']:.4f}", f"{r['ppl']:.3f}")
    return t


def ppl_rows(res: dict) -> list[tuple[str, dict]]:
    """The rows of the eval-ppl table for an :func:`evaluate_ppl` record: the unquantized baseline, labelled with
    the dtype it ran in and that dtype's bits, then the evaluated model (the recipe, and plan, with their average
    weight bits)."""
    from quantkit.eval.job import DTYPE_BITS, dtype_label

    rows = []
    if "ppl_baseline" in res:
        packed = res.get("baseline", "").startswith("packed")  # a packed model's own weights, its cache unquantized
        rows.append((res.get("baseline", dtype_label(res["dtype"])),
                     dict(res, ppl=res["ppl_baseline"], nll=res["nll_baseline"],
                          avg_bits=None if packed else DTYPE_BITS.get(res["dtype"]))))
    label = res["model"]
    if res.get("recipe"):
        label = res["recipe"] + (f" + plan {Path(res['plan']).name}" if res.get("plan") else "")
    if res.get("kv"):
        label += f" + {res['kv']} cache"
    rows.append((label, res))
    return rows


@command("eval-ppl")
@user_errors
def eval_ppl(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="HF model dir, hub id, packed quantkit checkpoint or "
                                                               "builtin:reference")],
    dataset: Dataset = "kjv",
    text_column: TextColumn = None,
    seqlen: Annotated[Optional[int], typer.Option(help="window length (default 2048, capped at the model's)")] = None,
    max_windows: Annotated[Optional[int], typer.Option(help="evaluate only the first N windows")] = None,
    recipe: Annotated[Optional[str], typer.Option(help="fake-quantize in memory with this recipe first")] = None,
    plan: Annotated[Optional[str], typer.Option(help="precision plan from `quantkit search` (needs --recipe)")] = None,
    no_baseline: Annotated[bool, typer.Option("--no-baseline", help="with --recipe: skip the unquantized model's "
                                                                    "ppl")] = False,
    calib_samples: Annotated[Optional[int], typer.Option(help="calibration windows (default: the recipe's)")] = None,
    calib_seqlen: CalibSeqlen = None,
    calib_dataset: CalibDataset = None,
    device: Device = "auto",
    dtype: Dtype = None,
    device_map: Annotated[Optional[str], typer.Option(help="accelerate device_map (e.g. auto) for models that do "
                                                          "not fit one GPU")] = None,
    verify: Annotated[bool, typer.Option("--verify", help="packed checkpoint: recompute every tensor's sha256 "
                                                          "first (shard sizes and headers are always checked)")] = False,
    kv_bits: Annotated[Optional[str], typer.Option(help="quantize the KV cache: 8, 4 (KIVI keys per channel, values "
                                                        "per token, latest 128 tokens fp16) or fp8; default: the "
                                                        "recipe's or checkpoint's kv, else fp16")] = None,
    json_out: Json = False,
):
    """Perplexity of a model, a packed checkpoint or a recipe applied in memory.

    Measured the way GPTQ/MixLLM report it: non-overlapping windows of the test split joined with blank lines.
    With --recipe the unquantized model's ppl comes first, in the dtype it ran in."""
    from quantkit.eval.job import evaluate_ppl

    res = evaluate_ppl(model, dataset, seqlen, max_windows, device, dtype, recipe, plan, baseline=not no_baseline,
                       text_column=text_column,
                       calib_samples=calib_samples, calib_seqlen=calib_seqlen, calib_dataset=calib_dataset,
                       device_map=device_map, verify=verify, kv_bits=kv_bits)
    console = err_console if json_out else out_console
    console.print(_ppl_table(f"perplexity — {res['model']} ({res['device']}, {res['dtype']})", ppl_rows(res)))
    if json_out:
        sys.stdout.write(json.dumps(res) + "\n")


@command("demo")
@user_errors
def demo(
    full: Annotated[bool, typer.Option("--full", help="the protocol of the accuracy tables in docs/BENCHMARKS.md "
                                                     "(40 test windows, 32 calibration windows, p20 too)")] = False,
    max_windows: Annotated[Optional[int], typer.Option(help="test windows per evaluation (90 = the whole split; "
                                                            "default 16, 40 with --full)")] = None,
    calib_samples: Annotated[Optional[int], typer.Option(help="calibration windows for GPTQ/AWQ/search (default "
                                                              "16, 32 with --full)")] = None,
    device: Device = "auto",
):
    """Tour of quantkit on the embedded reference model (builtin:reference), in under two minutes on a laptop.

    The reference model is trained on the shipped corpus: FP against RTN/GPTQ/AWQ W4A16, MixLLM W4A8 with 0 and
    10 % 8-bit channels from the global search, LiquidQuant W4A8 and W8A8."""
    from quantkit.data import check_sample_count
    from quantkit.demo import run_demo

    check_sample_count(max_windows, "--max-windows")
    check_sample_count(calib_samples)
    run_demo(full=full, device=device, max_windows=max_windows, calib_samples=calib_samples)


@command("search")
@user_errors
def search(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="HF model dir, hub id or builtin:reference")],
    output: Annotated[str, typer.Option("-o", "--output", help="where to write the plan (plan.json)")],
    recipe: Annotated[str, typer.Option(help="recipe giving the quantizer of each bit-width")] = "mixllm-w4a8",
    target_bits: Annotated[Optional[float], typer.Option(help="average bits per weight element "
                                                               "(default 4.4 unless --fractions)")] = None,
    bits: Annotated[str, typer.Option(help="bit-widths to mix, e.g. 4,8 or 3,4,6")] = "4,8",
    fractions: Annotated[Optional[str], typer.Option(help="element share of each --bits entry, e.g. 0.3,0.6,0.1 "
                                                          "(most salient channels get the highest bits)")] = None,
    strategy: Annotated[str, typer.Option(help="global (MixLLM), local (per layer), random, magnitude")] = "global",
    samples: Annotated[Optional[int], typer.Option("--calib-samples", help="calibration windows (default: the "
                                                                        "recipe's, 128)")] = None,
    seqlen: Annotated[Optional[int], typer.Option(help="tokens per window (default: the recipe's, capped at "
                                                       "the model's context)")] = None,
    seed: Annotated[Optional[int], typer.Option(help="window sampling / random-strategy seed")] = None,
    dataset: CalibDataset = None,
    text_column: TextColumn = None,
    no_first_order: Annotated[bool, typer.Option("--no-first-order", help="drop the first-order Taylor term "
                                                                          "of Eq. 4 (ablation)")] = False,
    batch_size: Annotated[int, typer.Option(help="windows per backward (each keeps its own gradient)")] = 1,
    device: Device = "auto",
    dtype: Dtype = None,
    device_map: Annotated[Optional[str], typer.Option(help="accelerate device_map (e.g. auto) for models that "
                                                           "do not fit one GPU")] = None,
    max_gpu_memory: Annotated[Optional[str], typer.Option(help="keep the weights in CPU memory and run one decoder "
                                                               "layer at a time on the GPU, within this much (e.g. "
                                                               "10GiB)")] = None,
    plot: Annotated[Optional[str], typer.Option(help="write a layer × projection heatmap PNG (needs "
                                                     "matplotlib)")] = None,
    force: Annotated[bool, typer.Option("--force", help="replace an existing plan at -o")] = False,
    json_out: Json = False,
    old_samples: Annotated[Optional[int], typer.Option("--samples", hidden=True)] = None,
    old_dataset: Annotated[Optional[str], typer.Option("--dataset", hidden=True)] = None,
):
    """MixLLM precision search: which output channels get more bits, written as a plan.

    Global search: Eq. 4 salience per output channel, ranked over the whole model, written as a precision plan for
    `pack` and `eval-ppl --plan`. Under `torchrun --nproc-per-node N -m quantkit search ...` each process scores its
    share of the windows."""
    from quantkit.search.command import check_salience_options, run_search
    from quantkit.search.report import summary, summary_table

    samples = renamed_option("--samples", old_samples, "--calib-samples", samples)
    dataset = renamed_option("--dataset", old_dataset, "--calib-dataset", dataset)
    ignored = check_salience_options(strategy, samples, seqlen, seed, dataset, not no_first_order, batch_size,
                                     text_column)
    if ignored:  # warned: the strategy reads no calibration data, so nothing checks or loads it
        samples = seqlen = dataset = text_column = None
    plan = run_search(model, output, recipe, bits=bits, target_bits=target_bits, fractions=fractions,
                      strategy=strategy, samples=samples, seqlen=seqlen, seed=seed, dataset=dataset,
                      text_column=text_column,
                      first_order=not no_first_order, batch_size=batch_size, device=device, dtype=dtype,
                      device_map=device_map, plot=plot, force=force, max_gpu_memory=max_gpu_memory)
    from quantkit import distributed

    if not distributed.is_main():  # a data-parallel process other than 0: process 0 reports the plan
        return
    console = err_console if json_out else out_console
    console.print(summary_table(plan))
    info(f"plan written to {output}", console)
    if plot is not None:
        from quantkit.plotting import written_path

        info(f"heatmap written to {written_path(plot)}", console)
    if json_out:
        sys.stdout.write(json.dumps(summary(plan, output)) + "\n")


@command("pack")
@user_errors
def pack(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="HF model dir, hub id or builtin:reference")],
    output: Annotated[str, typer.Option("-o", "--output", help="checkpoint directory to write (atomically)")],
    recipe: Annotated[str, typer.Option(help="shipped recipe name or YAML path")],
    plan: Annotated[Optional[str], typer.Option(help="precision plan from `quantkit search`")] = None,
    target: Annotated[Optional[str], typer.Option(help="reference, sm80 or sm90 (kernel layouts; --format "
                                                       "quantkit only; default reference)")] = None,
    export_format: Annotated[str, typer.Option("--format", help="quantkit, gptq, gptq_v2 or awq")] = "quantkit",
    max_shard_size: Annotated[str, typer.Option(help="largest shard, e.g. 500MB or 2GB")] = "2GB",
    calib_samples: Annotated[Optional[int], typer.Option(help="calibration windows (default: the "
                                                              "recipe's)")] = None,
    calib_seqlen: CalibSeqlen = None,
    calib_dataset: CalibDataset = None,
    text_column: TextColumn = None,
    force: Annotated[bool, typer.Option("--force", help="replace an existing checkpoint at -o")] = False,
    stream: Annotated[bool, typer.Option("--stream", help="read, quantize and write one decoder layer at a time "
                                                          "(models larger than CPU memory; quantkit format, no "
                                                          "rotated recipes; a shard file per layer at least)")
                      ] = False,
    resume: Annotated[bool, typer.Option("--resume", help="continue an interrupted --stream pack to -o from its "
                                                          "last finished layer (implies --stream)")] = False,
    device: Device = "auto",
    dtype: Dtype = None,
    json_out: Json = False,
):
    """Quantize a model with a recipe (and plan) and write a packed checkpoint.

    The checkpoint folder holds config.json with a quantization_config, the quantkit.json manifest, sharded
    safetensors and the tokenizer. GPTQ and AWQ recipes calibrate data-parallel over several GPUs under `torchrun
    --nproc-per-node N -m quantkit pack ...`."""
    from quantkit.checkpoint.report import summary_table
    from quantkit.pack import run_pack

    res = run_pack(model, recipe, output, plan=plan, target=target, export=export_format,
                   max_shard_size=max_shard_size, device=device, dtype=dtype, calib_samples=calib_samples,
                   calib_seqlen=calib_seqlen, calib_dataset=calib_dataset, text_column=text_column, force=force,
                   stream=stream, resume=resume)
    if not res:  # a data-parallel process other than 0: process 0 wrote the checkpoint and reports it
        return
    console = err_console if json_out else out_console
    console.print(summary_table(res, f"packed — {output}"))
    if json_out:
        sys.stdout.write(json.dumps(res) + "\n")


@command("inspect")
@user_errors
def inspect_checkpoint(
    checkpoint: Annotated[str, typer.Argument(metavar="CHECKPOINT", help="packed checkpoint directory")],
    verify: Annotated[bool, typer.Option("--verify", help="recompute every tensor's sha256 (exit 2 on a "
                                                          "mismatch)")] = False,
    json_out: Json = False,
):
    """Summary of a packed checkpoint (source, recipe, layers, bits, layouts, size); --verify checks its bytes."""
    from quantkit.checkpoint import read_manifest, summarize, verify_checkpoint
    from quantkit.checkpoint.reader import check_config, check_files
    from quantkit.checkpoint.report import summary_table

    manifest = read_manifest(checkpoint)
    folder = Path(checkpoint).expanduser()
    check_files(folder, manifest)  # shard sizes and headers against the manifest, without reading the tensors
    check_config(folder, manifest)
    res = summarize(checkpoint, manifest)
    if verify:
        res["mismatches"] = verify_checkpoint(checkpoint, manifest)
    console = err_console if json_out else out_console
    console.print(summary_table(res))
    for m in res.get("mismatches", []):
        err_console.print(f"[bold red]sha256 mismatch:[/] tensor '{m['tensor']}' in {m['shard']}", highlight=False,
                          soft_wrap=True)
    if verify and not res["mismatches"]:
        info(f"verified: all {res['tensors']} tensors match their sha256", console)
    if json_out:
        sys.stdout.write(json.dumps(res) + "\n")
    if res.get("mismatches"):
        n = len(res["mismatches"])
        err_console.print(Text.assemble(("error: ", "bold red"), f"{n} tensor{'s' if n > 1 else ''} of "
                                        f"'{checkpoint}' fail their sha256 check: the checkpoint is corrupt; copy it "
                                        "again or re-run `quantkit pack`"), highlight=False, soft_wrap=True)
        raise typer.Exit(QuantkitError.exit_code)


def first_sentence(text: str) -> str:
    """The first sentence of a description (up to a full stop followed by a capital letter), on one line."""
    import re

    text = " ".join(text.split())
    m = re.search(r"\.\s+(?=[A-Z])", text)
    return text[:m.start() + 1] if m else text


def recipe_rows() -> list[dict]:
    """One record per shipped recipe: name, scheme (W/A bits and group), method, whether it reads calibration
    data, and the first sentence of its description."""
    from quantkit.quant.recipe import load_recipe, shipped_recipes

    rows = []
    for name in shipped_recipes():
        r = load_recipe(name)
        a = r.activation.bits if r.activation.enabled else 16
        group = "per-channel" if r.weight.group_size == -1 else f"g{r.weight.group_size}"
        fp8 = "FP8 " if r.weight.grid == "fp8" else ""
        rows.append({"name": name, "scheme": f"{fp8}W{r.weight.bits}A{a} {group}", "method": r.weight.method,
                     "calibration": r.uses_calibration, "description": first_sentence(r.description)})
    return rows


@command("recipes")
@user_errors
def recipes(json_out: Annotated[bool, typer.Option("--json", help="print one JSON list on stdout (the table goes "
                                                                  "to stderr)")] = False):
    """List the shipped recipes (for --recipe) with a one-line description of each.

    A YAML file path works as --recipe too: copy a shipped recipe (recipes/*.yaml in the source tree) and edit it."""
    rows = recipe_rows()
    t = Table(title="shipped recipes (--recipe NAME)")
    for col in ("name", "scheme", "calibration data", "description"):
        t.add_column(col, overflow="fold")
    for r in rows:
        t.add_row(r["name"], r["scheme"], "yes" if r["calibration"] else "no", r["description"])
    (err_console if json_out else out_console).print(t)
    if json_out:
        sys.stdout.write(json.dumps(rows) + "\n")


@command("bench")
@user_errors
def bench(
    packed: Annotated[Optional[str], typer.Argument(
        metavar="PACKED", help="a `quantkit pack` checkpoint folder: time its linears' shapes with its methods "
                               "(or --decode-step, --e2e); with --e2e also an FP model")] = None,
    shapes: Annotated[Optional[str], typer.Option(help="NxK (out × in features), comma-separated")] = None,
    preset: Annotated[Optional[str], typer.Option(help=f"a model's linear shapes: {', '.join(PRESETS)}")] = None,
    m: Annotated[Optional[str], typer.Option("--m", help=f"token counts M, comma-separated (default "
                                                         f"{DEFAULT_M})")] = None,
    methods: Annotated[Optional[str], typer.Option(help="fp16, int_mm, fp8, w4a16, w8a8, w8a8-ch, fp8-w8a8, w4a8, "
                                                        "w4a8-lqq, mixed, act-quant and the +aq variants "
                                                        "(activation quantization timed in); "
                                                        f"default: PACKED's own, else {DEFAULT_METHODS}")] = None,
    reps: Annotated[Optional[int], typer.Option(help="timed samples per point, median reported (default 50; "
                                                     "--e2e: 5)")] = None,
    plot: Annotated[Optional[str], typer.Option(help="write speedup vs M per method, one panel per shape, to this "
                                                     "PNG (needs matplotlib)")] = None,
    decode_step: Annotated[bool, typer.Option("--decode-step", help="time one decode step of a decoder layer of "
                                                                   "PACKED against its FP16 layer")] = False,
    batch: Annotated[Optional[str], typer.Option(help="--decode-step batch sizes B, comma-separated (default "
                                                      f"{DEFAULT_BATCH})")] = None,
    context: Annotated[Optional[int], typer.Option(help="--decode-step tokens already in the KV cache (default "
                                                        f"{DEFAULT_CONTEXT}, or the model's positions - 1 if "
                                                        "fewer)")] = None,
    layer: Annotated[Optional[int], typer.Option(help="--decode-step decoder layer index (default 0)")] = None,
    device: Annotated[str, typer.Option(help="--decode-step device: cuda, cuda:N, cpu (no kernels: a check of the "
                                             "mode only) or auto (cuda when present)")] = "auto",
    graph: Annotated[bool, typer.Option("--graph/--no-graph", help="--decode-step, --e2e: time CUDA graph replays "
                                                                   "(--e2e: the compiled decode step) or eager "
                                                                   "calls")] = True,
    json_out: Annotated[bool, typer.Option("--json", help="print the rows as one JSON list on stdout (tables go "
                                                          "to stderr)")] = False,
    explain: Annotated[bool, typer.Option("--explain", help="time nothing: print which kernel runs each point, its "
                                                            "launch config and why the kernels ahead of it "
                                                            "declined")] = False,
    assume_gpu: Annotated[Optional[str], typer.Option(help="--explain for a GPU that is not here, MAJOR.MINOR:SMS "
                                                           "(e.g. 9.0:132 for an H100)")] = None,
    e2e: Annotated[bool, typer.Option("--e2e", help="time the whole model: prefill ms, decode tok/s by batch and "
                                                    "context, HF generate; a packed model beside its FP source")] = False,
    prefill_tokens: Annotated[Optional[str], typer.Option(help="--e2e prompt lengths, comma-separated (default "
                                                               "128,512,2048)")] = None,
    contexts: Annotated[Optional[str], typer.Option(help="--e2e decode contexts (tokens in the KV cache), "
                                                         "comma-separated (default 1024,4096)")] = None,
    steps: Annotated[int, typer.Option(help="--e2e timed decode steps per point")] = 32,
    source: Annotated[Optional[str], typer.Option(help="--e2e: the FP model of PACKED (default: the one its "
                                                       "manifest names)")] = None,
    hf: Annotated[bool, typer.Option("--hf/--no-hf", help="--e2e: also time transformers' generate")] = True,
    kv_bits: Annotated[Optional[str], typer.Option(help="--e2e: the packed model decodes with a packed KV cache, 8 "
                                                        "or 4 (its FP source keeps fp16)")] = None,
    attention: Annotated[bool, typer.Option("--attention", help="time decode attention over an fp16 KV cache "
                                                                "(quantkit's kernel vs SDPA) for the heads of "
                                                                "PACKED/MODEL or an attention --preset, by --batch "
                                                                "and --contexts")] = False,
):
    """Kernel speed on this GPU against torch FP16 (cuBLAS), or one decode step of a packed model.

    Median µs (CUDA events, rotating inputs, CUDA graphs), TFLOP/s, GB/s, % of the HBM and matmul ceilings
    measured in the same run, speedup vs FP16 — for the linear shapes of PACKED, a --preset or --shapes.

    With --decode-step: one decode step of one decoder layer of PACKED (batch B, KV cache of --context tokens)
    against the FP16 layer of its dequantized weights."""
    from quantkit.bench import command

    console = err_console if json_out else out_console
    if reps is not None:
        command.check_reps(reps)
    if attention:
        _bench_attention(packed, preset, batch, contexts, reps, json_out, console, {
            "--e2e": e2e or None, "--decode-step": decode_step or None, "--explain": explain or None,
            "--shapes": shapes, "--m": m, "--methods": methods, "--plot": plot, "--context": context,
            "--layer": layer, "--source": source, "--prefill-tokens": prefill_tokens,
            "--assume-gpu": assume_gpu, "--steps": None if steps == 32 else steps, "--no-hf": None if hf else True,
            "--no-graph": None if graph else True, "--device": None if device == "auto" else device,
            "--kv-bits": kv_bits})
        return
    if e2e:
        from quantkit.bench.e2e import e2e_table, run_e2e, save_e2e_plot

        if explain or decode_step:
            raise QuantkitError("--e2e times the whole model; drop --explain/--decode-step")
        a = command.e2e_args(packed, source, shapes, preset, m, methods, batch, context, layer, prefill_tokens,
                             contexts, steps, reps, device, hf, graph, kv_bits)
        if plot is not None:
            from quantkit.plotting import require_matplotlib

            require_matplotlib()
        from quantkit.bench.e2e import points
        from quantkit.ui import progress_bar

        models = e2e_loaders(a)
        total = points(a.plan) * len(models)
        done = [0]

        with progress_bar("whole-model speed", total) as update:
            def advance(row):
                done[0] += 1
                update(done[0], total)

            rows = run_e2e(models, a.plan, progress=advance)
        console.print(e2e_table(rows))
        if plot is not None:
            from quantkit.plotting import written_path

            save_e2e_plot(rows, plot)
            info(f"plot written to {written_path(plot)}", console)
        if json_out:
            sys.stdout.write(json.dumps(rows) + "\n")
        return
    command.check_no_e2e_options(prefill_tokens, contexts, steps, source, hf, kv_bits)
    reps = 50 if reps is None else reps
    if assume_gpu is not None and not explain:
        raise QuantkitError("--assume-gpu goes with --explain (timings need the GPU itself)")
    if explain:
        from quantkit.bench.explain import device_gpu, explain_rows, explain_table

        if decode_step or plot is not None:
            raise QuantkitError("--explain times nothing: drop --decode-step/--plot")
        bench_shapes, wanted = command.kernel_targets(packed, shapes, preset, methods)
        ms = command.parse_ints(DEFAULT_M if m is None else m, "--m")
        cap, sms, tools, name = device_gpu(assume_gpu)
        rows = explain_rows(bench_shapes, ms, wanted, cap, sms, tools, "" if assume_gpu else name)
        console.print(explain_table(rows, f"kernel choice on {name}"))
        if json_out:
            sys.stdout.write(json.dumps(rows) + "\n")
        return
    if decode_step:
        from quantkit.bench.decode_step import run_decode_step
        from quantkit.bench.report import decode_step_table

        a = command.decode_step_args(packed, shapes, preset, m, methods, plot, batch, context, layer, device)
        rows = run_decode_step(a.packed, a.batches, a.context, a.layer, a.device, reps=reps, use_graph=graph)
        console.print(decode_step_table(rows))
    else:
        from quantkit.bench.report import format_table
        from quantkit.bench.runner import run_bench

        command.check_kernel_only(batch, context, layer, device, graph)
        bench_shapes, wanted = command.kernel_targets(packed, shapes, preset, methods)
        ms = command.parse_ints(DEFAULT_M if m is None else m, "--m")
        if plot is not None:
            command.check_plot(plot, wanted)  # fail before the timing, not after it
        rows = run_bench(bench_shapes, ms, wanted, reps=reps)
        console.print(format_table(rows), markup=False, highlight=False)
        if plot is not None:
            from quantkit.bench.plot import save_speedup_plot
            from quantkit.plotting import written_path

            save_speedup_plot(rows, plot)
            info(f"plot written to {written_path(plot)}", console)
    if json_out:
        sys.stdout.write(json.dumps(rows) + "\n")


def _bench_attention(target, preset, batch, contexts, reps, json_out, console, others) -> None:
    """``quantkit bench --attention`` (:mod:`quantkit.bench.attention`)."""
    from quantkit.bench import command

    a = command.attention_args(target, preset, batch, contexts, reps, others)
    import torch

    if not torch.cuda.is_available():
        raise QuantkitError("--attention times GPU kernels and needs a CUDA GPU; run it on a GPU machine")
    from quantkit.bench.attention import attention_table, run_attention
    from quantkit.ui import progress_bar

    total = len(a.batches) * len(a.contexts)
    done = [0]
    with progress_bar(f"decode attention ({a.source})", total) as update:
        def advance(row):
            done[0] += 1
            update(done[0], total)

        rows = run_attention(a.heads, a.batches, a.contexts, a.reps, progress=advance)
    console.print(attention_table(rows))
    if json_out:
        sys.stdout.write(json.dumps(rows) + "\n")


def e2e_loaders(a) -> list:
    """(label, loader) of the models ``bench --e2e`` times: the FP source first (the speedups' baseline), then the
    packed checkpoint; or the one FP model."""
    from quantkit.checkpoint import load_packed
    from quantkit.model import load_model

    fp = a.source or a.target
    out = [(f"FP ({Path(fp).name or fp})", lambda: load_model(fp, device=a.device, load_tokenizer=False).model)]
    if a.source is not None:
        out.append((f"packed ({Path(a.target).name})",
                    lambda: load_packed(a.target, device=a.device, load_tokenizer=False).model))
    return out


@command("generate")
@user_errors
def generate(
    model: Annotated[str, typer.Argument(help="a `quantkit pack` checkpoint, an HF model folder or name, or "
                                              "builtin:reference")],
    prompt: Annotated[str, typer.Option(help="the text to continue")],
    max_new_tokens: Annotated[int, typer.Option(help="tokens to generate (greedy)")] = 64,
    context: Annotated[Optional[int], typer.Option(help="KV-cache length per sequence (default: prompt + new "
                                                        "tokens, capped at the model's positions)")] = None,
    device: Device = "auto",
    dtype: Dtype = None,
    compile_decode: Annotated[bool, typer.Option("--compile", help="compile the decode step with torch.compile "
                                                                  "(a CUDA graph a step on a GPU; the first steps "
                                                                  "compile)")] = False,
    kv_bits: Annotated[Optional[str], typer.Option(help="decode with a packed KV cache: 8 (int8 per token and head) or "
                                                        "4 (KIVI, fp16 window of 128 tokens): 0.52x / 0.32x the "
                                                        "cache memory, decoding slower than an fp16 cache on the GPU "
                                                        "for now; default: a packed checkpoint's recipe kv")] = None,
    json_out: Json = False,
):
    """Continue a prompt with a packed or FP model through quantkit's static-cache decode loop, streaming the text;
    then print prefill ms, decode tokens/s and peak GPU memory."""
    from quantkit.generate_job import run_generate

    rec = run_generate(model, prompt, max_new_tokens, context, device, dtype, stream=None if json_out else out_console,
                       compile_decode=compile_decode, kv_bits=kv_bits)
    line = (f"prefill {rec['prefill_ms']:.1f} ms ({rec['prompt_tokens']} tokens), decode {rec['decode_tok_s']:.1f} "
            f"tok/s ({rec['new_tokens']} tokens{', ' + rec['kv'] + ' cache' if rec['kv'] != 'fp' else ''})"
            + (f", peak {rec['peak_memory_bytes'] / 2**30:.2f} GiB" if rec["peak_memory_bytes"] else ""))
    info(line, err_console if json_out else out_console)
    if json_out:
        sys.stdout.write(json.dumps(rec) + "\n")


@command("tune")
@user_errors
def tune(
    packed: Annotated[Optional[str], typer.Argument(
        metavar="PACKED", help="a `quantkit pack` checkpoint folder: tune its linears' shapes and methods (with "
                               "--attention, any model folder: its attention heads)")] = None,
    shapes: Annotated[Optional[str], typer.Option(help="NxK (out × in features), comma-separated")] = None,
    preset: Annotated[Optional[str], typer.Option(help=f"a model's linear shapes: {', '.join(PRESETS)}; with "
                                                       "--attention its heads: "
                                                       f"{', '.join(ATTENTION_PRESETS)}")] = None,
    m: Annotated[Optional[str], typer.Option("--m", help="token counts M to tune, comma-separated (default: the "
                                                         "powers of two 1-4096; an entry serves the M above the "
                                                         "previous tuned one)")] = None,
    methods: Annotated[Optional[str], typer.Option(help="w4a16, w8a8, w8a8-ch, w4a8, w4a8-lqq, mixed (default: "
                                                        "PACKED's own, else all six)")] = None,
    reps: Annotated[Optional[int], typer.Option(help="timed samples per candidate (median; default 30, "
                                                     "--attention 20)")] = None,
    output: Annotated[Optional[str], typer.Option("-o", "--output", help="tables folder (default $QUANTKIT_TABLES "
                                                                       "or ~/.cache/quantkit/tables, which the "
                                                                       "runtime reads)")] = None,
    attention: Annotated[bool, typer.Option("--attention", help="tune the decode-attention kernels (fp16, KV8, KV4 "
                                                                "caches) for PACKED/MODEL's or an attention "
                                                                "--preset's heads, by --batch and --contexts")
                         ] = False,
    batch: Annotated[Optional[str], typer.Option(help="--attention batch sizes (default 1,8,32,64)")] = None,
    contexts: Annotated[Optional[str], typer.Option(help="--attention cache lengths (default "
                                                         "1024,4096,32768,131072)")] = None,
    json_out: Json = False,
):
    """Time every kernel and launch config that can run each shape and M on this GPU, check each against the
    torch reference, and write the fastest to the launch tables the runtime reads (one JSON per GPU and method)."""
    from pathlib import Path as _Path

    from quantkit.bench import command
    from quantkit.bench.tune import require_gpu, run_tune
    from quantkit.runtime.kernels.tables import user_dir
    from quantkit.ui import progress_bar

    if attention:
        _tune_attention(packed, preset, batch, contexts, reps, output, json_out,
                        {"--shapes": shapes, "--m": m, "--methods": methods})
        return
    if batch is not None or contexts is not None:
        raise QuantkitError("--batch and --contexts apply to --attention only; add --attention or remove them")
    reps = 30 if reps is None else reps

    command.check_reps(reps)
    default_methods = "w4a16,w8a8,w8a8-ch,w4a8,w4a8-lqq,mixed"
    bench_shapes, wanted = command.kernel_targets(packed, shapes, preset,
                                                  methods if methods or packed else default_methods)
    ms = command.parse_ints(",".join(str(2 ** i) for i in range(13)) if m is None else m, "--m")
    folder = _Path(output).expanduser() if output else user_dir()
    require_gpu()
    cmd = "quantkit tune " + " ".join(sys.argv[2:]) if len(sys.argv) > 1 else "quantkit tune"
    with progress_bar("tune", len(bench_shapes) * len(ms) * len(wanted)) as update:
        entries, paths = run_tune(bench_shapes, ms, wanted, folder, cmd, reps=reps, progress=update)
    table = Table(title="tuned launches")
    for col in ("method", "shape", "M", "kernel", "µs", "default kernel", "default µs"):
        table.add_column(col)
    for e in entries:
        table.add_row(e["method"], f"{e['n']}x{e['k']}", str(e["m"]), e["kernel"], f"{e['us']:.2f}",
                      e["default_kernel"], f"{e['default_us']:.2f}")
    (err_console if json_out else out_console).print(table)
    for p in paths:
        info(f"table written to {p}")
    if json_out:
        sys.stdout.write(json.dumps(entries) + "\n")


def _tune_attention(target, preset, batch, contexts, reps, output, json_out, others) -> None:
    """``quantkit tune --attention`` (:mod:`quantkit.bench.attention_tune`)."""
    from pathlib import Path as _Path

    from quantkit.bench import command
    from quantkit.bench.attention_tune import run_attention_tune
    from quantkit.bench.tune import require_gpu
    from quantkit.runtime.kernels.tables import user_dir
    from quantkit.ui import progress_bar

    if reps is not None:
        command.check_reps(reps)
    a = command.attention_args(target, preset, batch, contexts, reps, others)
    require_gpu()
    folder = _Path(output).expanduser() if output else user_dir()
    cmd = "quantkit tune " + " ".join(sys.argv[2:]) if len(sys.argv) > 1 else "quantkit tune --attention"
    with progress_bar(f"tune decode attention ({a.source})", 3 * len(a.batches) * len(a.contexts)) as update:
        entries, path = run_attention_tune(a.heads, a.batches, a.contexts, folder, cmd, a.reps, progress=update)
    table = Table(title="tuned decode-attention launches")
    for col in ("cache", "head size", "launch", "worst ratio to the best per point"):
        table.add_column(col)
    for e in entries:
        table.add_row(e["form"], str(e["head_dim"]), "/".join(map(str, e["launch"])), f"{e['worst_ratio']:.3f}")
    (err_console if json_out else out_console).print(table)
    info(f"table written to {path}")
    if json_out:
        sys.stdout.write(json.dumps(entries) + "\n")


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


def main() -> None:
    """Console-script entry point. SIGTERM (a job scheduler's or `timeout`'s kill) exits through Python's unwinding,
    so a checkpoint or plan being written leaves no temporary folder behind, as Ctrl-C does. Click's usage errors
    (an option value of the wrong type, an unknown option or command) print one error line like quantkit's own,
    not click's usage box."""
    import signal

    from quantkit.threads import configure_cpu_threads

    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    usage_error, no_args_is_help = _click_usage_errors()
    try:
        configure_cpu_threads()  # before any command imports torch
        _check_launcher()
        code = app(standalone_mode=False)
    except usage_error as e:  # a bad option value, an unknown option or command: one line, as quantkit's own
        if no_args_is_help is not None and isinstance(e, no_args_is_help):
            sys.exit(0)  # `quantkit` alone: the help was printed
        where = e.ctx.command_path if e.ctx is not None else "quantkit"
        _error_line(f"{_all_missing(e) or e.format_message().rstrip('.')} (see `{where} --help`)")
        code = e.exit_code
    except typer.Abort:  # Ctrl-C
        err_console.print("Aborted.")
        code = 1
    except QuantkitError as e:  # outside a command: a bad QUANTKIT_THREADS
        _error_line(str(e))
        code = QuantkitError.exit_code
    sys.exit(code if type(code) is int else 0)  # a command's return value is not an exit code


def _all_missing(e) -> str | None:
    """One message naming every required argument and option the command line lacks, where click stops at the
    first (so --recipe was reported only once -o was given); None for other usage errors or one missing parameter.
    Click processes the given parameters first, so those not in ``ctx.params`` when it stops were not given."""
    ctx = e.ctx
    if type(e).__name__ != "MissingParameter" or ctx is None:
        return None
    missing = [p for p in ctx.command.params if p.required and p.name not in ctx.params]
    if len(missing) < 2:
        return None

    def hint(p) -> str:
        try:
            return p.get_error_hint(ctx)  # click
        except TypeError:
            return p.get_error_hint()  # typer's own click

    def named(kind: str, hints: list[str]) -> str:
        listed = hints[0] if len(hints) == 1 else ", ".join(hints[:-1]) + " and " + hints[-1]
        return f"{kind}{'s' if len(hints) > 1 else ''} {listed}"

    groups = [named(kind, [hint(p) for p in missing if p.param_type_name == kind])
              for kind in ("argument", "option") if any(p.param_type_name == kind for p in missing)]
    return "Missing " + "; ".join(groups)


def _click_usage_errors() -> tuple[type, type | None]:
    """(UsageError, NoArgsIsHelpError or None) of the click this typer runs on (recent typer vendors its own)."""
    usage_error = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")
    return usage_error, getattr(sys.modules[usage_error.__module__], "NoArgsIsHelpError", None)


if __name__ == "__main__":
    main()
