"""``quantkit bench`` option checking: which shapes and methods a kernel sweep times (``PACKED``, ``--preset`` or
``--shapes``), and which options the ``--decode-step`` mode takes. Every misuse is a one-line QuantkitError naming
the fix, raised before anything is loaded or timed. No torch import here (the CLI's --help stays fast)."""

from __future__ import annotations

from dataclasses import dataclass

from quantkit.errors import QuantkitError

ATTENTION_PRESETS = {  # (query heads, KV heads, head size) of --attention's presets
    "llama-3.1-8b": (32, 8, 128),
    "llama-2-7b": (32, 32, 128),
    "qwen2.5-7b": (28, 4, 128),
    "llama-3.1-70b": (64, 8, 128),
}
ATTENTION_CONTEXTS = (1024, 4096, 32768, 131072)  # --attention's default cache lengths
ATTENTION_BATCHES = (1, 8, 32, 64)  # ... and batch sizes


def heads_of(config) -> tuple[int, int, int]:
    """(query heads, KV heads, head size) of a transformers config."""
    hq = int(config.num_attention_heads)
    hkv = int(getattr(config, "num_key_value_heads", None) or hq)
    d = int(getattr(config, "head_dim", None) or config.hidden_size // hq)
    return hq, hkv, d

PRESETS = {  # (N, K) of every distinct GEMM of one decoder layer, q/k/v and gate/up fused (as load_packed runs them)
    "llama-3.1-8b": "6144x4096,4096x4096,28672x4096,4096x14336",
    "llama-2-7b": "12288x4096,4096x4096,22016x4096,4096x11008",
    "qwen2.5-7b": "4608x3584,3584x3584,37888x3584,3584x18944",
}
DEFAULT_M = "1,16,64,256,1024,4096"
DEFAULT_METHODS = "fp16,w4a16,w8a8,w4a8,w4a8-lqq,mixed"
DEFAULT_BATCH = "1"
DEFAULT_CONTEXT = 1024


def parse_ints(text: str, option: str, minimum: int = 1) -> list[int]:
    """Comma-separated integers ≥ ``minimum`` of a list option (``--m 1,16``), each once in the order given (a
    repeated value would time and print the same point twice), or a one-line QuantkitError."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise QuantkitError(f"{option} takes comma-separated integers, got '{text}'") from None
    if not values or min(values) < minimum:
        raise QuantkitError(f"{option} takes comma-separated integers ≥ {minimum}, got '{text}'")
    return list(dict.fromkeys(values))


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """(N, K) pairs of a ``--shapes 14336x4096,4096x4096`` option, or a one-line QuantkitError."""
    try:
        shapes = [tuple(int(v) for v in s.strip().lower().split("x")) for s in text.split(",") if s.strip()]
    except ValueError:
        shapes = []
    if not shapes or any(len(s) != 2 or min(s) < 1 for s in shapes):
        raise QuantkitError(f"--shapes takes NxK pairs of positive integers like 14336x4096,4096x4096, got '{text}'")
    return shapes  # type: ignore[return-value]


def _methods(text: str) -> list[str]:
    from quantkit.bench.problems import METHODS

    wanted = [x.strip() for x in text.split(",") if x.strip()]
    if not wanted:
        raise QuantkitError(f"--methods takes comma-separated method names, got '{text}'; known: {', '.join(METHODS)}")
    unknown = [x for x in wanted if x not in METHODS]
    if unknown:
        raise QuantkitError(f"unknown --methods {', '.join(unknown)}; known: {', '.join(METHODS)}")
    return wanted


def check_reps(reps: int) -> None:
    """Refuse a ``--reps`` that leaves nothing to take a median of."""
    if reps < 1:
        raise QuantkitError(f"--reps is the number of timed samples per point (≥ 1), got {reps}")


def check_plot(path: str, methods: list[str]) -> None:
    """Refuse, before any timing, a ``--plot`` that could not be drawn or written: only the fp16 baseline timed (the
    plot shows speedups over it), no matplotlib, a missing folder or a file type matplotlib does not write."""
    from quantkit.plotting import check_plot_path

    if all(mth == "fp16" for mth in methods):
        raise QuantkitError("--plot draws each method's speedup over fp16, and only fp16 is timed; add --methods "
                            "(e.g. fp16,w4a16) or drop --plot")
    check_plot_path(path)


def kernel_targets(packed: str | None, shapes: str | None, preset: str | None,
                   methods: str | None) -> tuple[list[tuple[int, int]], list[str]]:
    """(shapes (N, K), methods) of a kernel sweep from exactly one of a packed checkpoint folder, ``--preset`` or
    ``--shapes``. Without ``--methods``: a checkpoint's own methods
    (:func:`quantkit.bench.packed_targets.checkpoint_methods`), else :data:`DEFAULT_METHODS`."""
    if sum(x is not None for x in (packed, shapes, preset)) != 1:
        raise QuantkitError("give exactly one of PACKED (a `quantkit pack` folder), --preset "
                            f"{'|'.join(PRESETS)} or --shapes NxK,...")
    if preset is not None and preset not in PRESETS:
        raise QuantkitError(f"unknown --preset '{preset}'; known: {', '.join(PRESETS)}")
    if packed is None:
        return (parse_shapes(shapes if shapes is not None else PRESETS[preset]),
                _methods(DEFAULT_METHODS if methods is None else methods))
    from quantkit.bench.packed_targets import checkpoint_methods, checkpoint_shapes
    from quantkit.checkpoint import read_manifest

    manifest = read_manifest(packed)
    wanted = _methods(methods) if methods is not None else checkpoint_methods(manifest, f"checkpoint '{packed}'")
    return checkpoint_shapes(manifest), wanted


def _verb(items: list, one: str, many: str) -> str:
    return one if len(items) == 1 else many


@dataclass
class DecodeStepArgs:
    """The parsed options of ``quantkit bench PACKED --decode-step``."""

    packed: str
    batches: list[int]
    context: int | None  # None: DEFAULT_CONTEXT, or the model's positions - 1 where it has fewer
    layer: int
    device: str  # resolved: cuda, cuda:N or cpu


def decode_step_args(packed: str | None, shapes: str | None, preset: str | None, m: str | None,
                     methods: str | None, plot: str | None, batch: str | None, context: int | None,
                     layer: int | None, device: str | None) -> DecodeStepArgs:
    """Check the options of the ``--decode-step`` mode (it times a whole decoder layer of PACKED, so the kernel
    sweep's shape/method/plot options do not apply) and fill in the defaults. ``device`` auto (or None) is cuda
    when a GPU is visible, else cpu, where the step runs the torch reference path — a check of the mode, not a
    kernel timing — which a warning line says."""
    if packed is None:
        raise QuantkitError("--decode-step times a decoder layer of a packed model; give PACKED (a `quantkit pack` "
                            "folder)")
    given = [opt for opt, v in (("--shapes", shapes), ("--preset", preset), ("--m", m), ("--methods", methods),
                                ("--plot", plot)) if v is not None]
    if given:
        raise QuantkitError(f"{', '.join(given)} {_verb(given, 'is', 'are')} for the kernel sweep, not --decode-step; "
                            f"remove {_verb(given, 'it', 'them')} (--decode-step takes --batch, --context, --layer, "
                            "--device)")
    if context is not None and context < 1:
        raise QuantkitError(f"--context is the number of tokens already in the KV cache (≥ 1), got {context}")
    if layer is not None and layer < 0:
        raise QuantkitError(f"--layer is a decoder layer index (≥ 0), got {layer}")
    batches = parse_ints(batch or DEFAULT_BATCH, "--batch")
    from quantkit.model.loader import resolve_device

    resolved = resolve_device(device or "auto")
    if device in (None, "auto") and resolved == "cpu":
        from quantkit.ui import warn

        warn("no CUDA GPU is visible, so --decode-step runs on the CPU: the torch reference path, no kernels (a check "
             "of the mode, not a timing); run it on a GPU machine to time the kernels")
    return DecodeStepArgs(packed, batches, context, layer or 0, resolved)


def check_kernel_only(batch: str | None, context: int | None, layer: int | None, device: str | None,
                      graph: bool = True) -> None:
    """Refuse the ``--decode-step`` options in a kernel sweep (the sweep runs on the current CUDA device and times
    small M with CUDA graphs, always). ``--device auto``, the default, is no choice and passes."""
    given = [opt for opt, v in (("--batch", batch), ("--context", context), ("--layer", layer),
                                ("--device", None if device == "auto" else device),
                                ("--no-graph", None if graph else True)) if v is not None]
    if given:
        raise QuantkitError(f"{', '.join(given)} {_verb(given, 'is', 'are')} for --decode-step only; add "
                            f"--decode-step or remove {_verb(given, 'it', 'them')}")


@dataclass
class E2EArgs:
    """The parsed options of ``quantkit bench MODEL|PACKED --e2e``."""

    target: str
    source: str | None  # the FP model timed beside a packed one (None: the target is an FP model, timed alone)
    plan: object  # quantkit.bench.e2e.E2EPlan
    device: str


def e2e_args(target: str | None, source: str | None, shapes: str | None, preset: str | None, m: str | None,
             methods: str | None, batch: str | None, context: int | None, layer: int | None, prefill: str | None,
             contexts: str | None, steps: int, reps: int | None, device: str | None, hf: bool,
             graph: bool = True, kv_bits: str | None = None) -> E2EArgs:
    """Check the options of the ``--e2e`` mode and fill in the defaults: the kernel sweep's and ``--decode-step``'s
    options do not apply; a packed target is timed beside its FP source (``--source``, else the manifest's)."""
    from quantkit.bench.e2e import DECODE_BATCHES, DECODE_CONTEXTS, PREFILL_TOKENS, E2EPlan
    from quantkit.checkpoint import is_checkpoint

    if target is None:
        raise QuantkitError("--e2e times a whole model: give PACKED (a `quantkit pack` folder) or an FP model")
    given = [opt for opt, v in (("--shapes", shapes), ("--preset", preset), ("--m", m), ("--methods", methods),
                                ("--context", context), ("--layer", layer)) if v is not None]
    if given:
        raise QuantkitError(f"{', '.join(given)} {_verb(given, 'does', 'do')} not apply to --e2e; remove "
                            f"{_verb(given, 'it', 'them')} (--e2e takes --batch, --prefill-tokens, --contexts, "
                            "--steps, --source, --device)")
    if steps < 1:
        raise QuantkitError(f"--steps is the number of timed decode steps (≥ 1), got {steps}")
    packed = is_checkpoint(target)
    if source is not None and not packed:
        raise QuantkitError(f"--source names the FP model of a packed checkpoint, but '{target}' is not one; drop "
                            "--source")
    if packed and source is None:
        from quantkit.checkpoint.manifest import read_manifest

        source = read_manifest(target)["source"].get("model")
        if not source:
            raise QuantkitError(f"'{target}' does not record its source model; give --source MODEL (its FP model)")
    plan = E2EPlan(prefill=tuple(parse_ints(prefill, "--prefill-tokens", 2)) if prefill else PREFILL_TOKENS,
                   batches=tuple(parse_ints(batch, "--batch")) if batch else DECODE_BATCHES,
                   contexts=tuple(parse_ints(contexts, "--contexts", 2)) if contexts else DECODE_CONTEXTS,
                   steps=steps, reps=reps or 5, hf_batches=(1,) if hf else (), graph=graph, kv=_packed_kv(kv_bits))
    from quantkit.model.loader import resolve_device

    resolved = resolve_device(device or "auto")
    if device in (None, "auto") and resolved == "cpu":
        from quantkit.ui import warn

        warn("no CUDA GPU is visible, so --e2e runs on the CPU: the torch reference path, no kernels (a check of the "
             "mode, not a speed); run it on a GPU machine")
    return E2EArgs(target, source if packed else None, plan, resolved)


def _packed_kv(kv_bits: str | None):
    """The ``--kv-bits`` of ``--e2e``: a KV8 or KV4 spec (the packed decode cache), or None."""
    if kv_bits is None:
        return None
    from quantkit.runtime.kv_cache import packed_kv_spec

    return packed_kv_spec(kv_bits)


def check_no_e2e_options(prefill: str | None, contexts: str | None, steps: int, source: str | None,
                         hf: bool, kv_bits: str | None = None) -> None:
    """Refuse the ``--e2e`` options in the other modes."""
    given = [opt for opt, v in (("--prefill-tokens", prefill), ("--contexts", contexts),
                                ("--steps", None if steps == 32 else steps), ("--source", source),
                                ("--no-hf", None if hf else True), ("--kv-bits", kv_bits)) if v is not None]
    if given:
        raise QuantkitError(f"{', '.join(given)} {_verb(given, 'is', 'are')} for --e2e only; add --e2e or remove "
                            f"{_verb(given, 'it', 'them')}")


@dataclass
class AttentionArgs:
    """The parsed options of ``quantkit bench --attention``."""

    heads: tuple[int, int, int]  # query heads, KV heads, head size
    source: str  # where the heads came from: a preset name or a model path
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    reps: int


def attention_args(target: str | None, preset: str | None, batch: str | None, contexts: str | None,
                   reps: int | None, others: dict[str, object]) -> AttentionArgs:
    """Check the options of the ``--attention`` mode: head shapes from a model (PACKED or an FP model's config)
    or an attention ``--preset``; ``--batch`` and ``--contexts`` lists; nothing of the other modes."""

    given = [opt for opt, v in others.items() if v is not None]
    if given:
        raise QuantkitError(f"{', '.join(given)} {_verb(given, 'does', 'do')} not apply to --attention; remove "
                            f"{_verb(given, 'it', 'them')} (--attention takes MODEL or --preset, --batch, "
                            "--contexts, --reps)")
    if (target is None) == (preset is None):
        raise QuantkitError("--attention needs the head shapes: give a model (PACKED or an FP model) or --preset "
                            f"({', '.join(ATTENTION_PRESETS)}), not both")
    if preset is not None:
        if preset not in ATTENTION_PRESETS:
            raise QuantkitError(f"unknown --preset '{preset}' for --attention; known: {', '.join(ATTENTION_PRESETS)}")
        heads, source = ATTENTION_PRESETS[preset], preset
    else:
        from quantkit.model.loader import load_config

        heads, source = heads_of(load_config(target)), target
    return AttentionArgs(heads, source, tuple(parse_ints(batch, "--batch")) if batch else ATTENTION_BATCHES,
                         tuple(parse_ints(contexts, "--contexts", 2)) if contexts else ATTENTION_CONTEXTS,
                         20 if reps is None else reps)
