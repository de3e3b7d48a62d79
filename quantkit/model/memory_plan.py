"""A memory plan before a long run: how much CPU memory, GPU memory and disk ``pack`` and ``search`` need at least,
from the model's config alone, and a refusal before any work when that does not fit, naming the flag that helps.

The figures are lower bounds built from tensors the run must hold at once (nothing is loaded to compute them; the
model is built on the meta device):

* ``pack`` keeps the weights in CPU memory in the load dtype while it quantizes, plus the 8-bit codes of every
  quantized weight (one byte each, the records before packing); a calibrated recipe on a GPU holds the largest
  decoder layer there with the calibration windows' hidden states going in and out. The checkpoint's codes must
  fit on disk (``quantkit.pack.estimate_bytes`` checks the exact lower bound again once the model is loaded).
* ``search`` on a GPU without ``--device-map`` keeps the whole model there; on the CPU, in CPU memory.

Interpreter, libraries and activations inside a layer come on top. Measured on SmolLM2-135M on the CPU (peak
resident set, of which 0.25 GB is the interpreter with torch): an RTN pack, bound 0.64 GB, peak 1.35 GB; a GPTQ pack
on 16 windows of 2048 tokens, bound 0.80 GB, peak 2.04 GB.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantkit.errors import QuantkitError

GIB = 2 ** 30


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a model: parameter counts (all, in quantizable linears, in the largest decoder layer),
    the hidden size and the longest sequence its positions allow (None: unbounded)."""

    parameters: int
    linear_parameters: int
    layer_parameters: int
    hidden: int
    positions: int | None = None
    vocab: int = 0
    layers: int = 0
    linear_rows: int = 0  # output features summed over the quantizable linears
    tied_head: bool = False  # the LM head reads the input embedding's matrix


def meta_model(model_ref: str, dtype: torch.dtype | None = None):
    """The causal LM of ``model_ref`` built from its config on the meta device (no weights read), its LM head tied
    where the config ties it and MoE experts unfused as :func:`quantkit.model.loader.load_model` leaves them;
    ``dtype``: its parameters' and buffers' dtype, as ``load_model(dtype=...)`` would give them."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    from quantkit.model.loader import load_config
    from quantkit.model.moe import unfuse_experts

    config = load_config(model_ref)
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config)
    if dtype is not None:
        model.to(dtype)  # meta parameters change dtype; the real buffers (rotary frequencies) are cast as a load does
    model.tie_weights()  # a tied LM head shares the embedding's parameter
    unfuse_experts(model)
    return model


def model_shape(model_ref: str) -> ModelShape:
    """:class:`ModelShape` of a model from its config (built on the meta device: no weights read)."""
    from quantkit.model.walk import find_decoder_layers, iter_linears

    model = meta_model(model_ref)
    config = model.config
    params = sum(p.numel() for p in model.parameters())
    linears = sum(lin.weight.numel() for _, lin in iter_linears(model))
    rows = sum(lin.weight.shape[0] for _, lin in iter_linears(model))
    blocks = find_decoder_layers(model)[1]
    layer = max(sum(p.numel() for p in block.parameters()) for block in blocks)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = embed is not None and head is not None and head.weight is embed.weight
    return ModelShape(params, linears, layer, int(text.hidden_size), getattr(text, "max_position_embeddings", None),
                      int(getattr(text, "vocab_size", 0) or 0), len(blocks), rows, tied)


@dataclass(frozen=True)
class MemoryPlan:
    """At least this many bytes of CPU memory, GPU memory (0: no GPU used) and disk, for one job."""

    job: str
    cpu_bytes: int
    gpu_bytes: int
    disk_bytes: int

    def describe(self) -> str:
        """One line: ``pack needs at least 1.2 GiB CPU memory, 0.3 GiB GPU memory, 0.1 GiB disk``."""
        parts = [f"{self.cpu_bytes / GIB:.1f} GiB CPU memory"]
        if self.gpu_bytes:
            parts.append(f"{self.gpu_bytes / GIB:.1f} GiB GPU memory")
        if self.disk_bytes:
            parts.append(f"{self.disk_bytes / GIB:.1f} GiB disk")
        return f"{self.job} needs at least {', '.join(parts)}"

    def to_dict(self) -> dict:
        return {"cpu_bytes": self.cpu_bytes, "gpu_bytes": self.gpu_bytes, "disk_bytes": self.disk_bytes}


def _size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def pack_plan(shape: ModelShape, load_dtype: torch.dtype, compute: str, calibrated: bool, samples: int,
              seqlen: int, code_bits: float, lm_head: str | None = None) -> MemoryPlan:
    """The lower bounds of ``quantkit pack`` (module docstring); ``code_bits`` the recipe's average weight bits.
    ``lm_head`` "rtn" or "gptq": the recipe quantizes the LM head too (recipe ``lm_head: true``): a tied head's own
    copy in CPU memory, its 4-bit codes on disk, and for GPTQ its float32 weight and solution with the last layer's
    outputs on the compute device."""
    b = _size(load_dtype)
    seqlen = min(seqlen, shape.positions or seqlen)  # calibration windows are cut to the model's positions
    cpu = shape.parameters * b + shape.linear_parameters
    gpu = 0
    hidden = 2 * samples * seqlen * shape.hidden * b  # a layer's inputs and outputs for every window
    if calibrated and compute != "cpu":
        gpu = shape.layer_parameters * b + hidden
    elif calibrated:
        cpu += hidden
    head = shape.vocab * shape.hidden
    disk = int(shape.linear_parameters * code_bits / 8)
    if lm_head is not None:
        disk += head // 2
        cpu += head * b if shape.tied_head else 0
        if lm_head == "gptq" and calibrated:
            step = 8 * head + hidden // 2
            if compute != "cpu":
                gpu = max(gpu, step)
            else:
                cpu += 8 * head
    return MemoryPlan("pack", cpu, gpu, disk)


def stream_plan(shape: ModelShape, load_dtype: torch.dtype, code_bits: float, compute: str = "cpu",
                calibrated: bool = False, samples: int = 0, seqlen: int = 0) -> MemoryPlan:
    """The lower bounds of ``quantkit pack --stream``: the largest decoder layer in the load dtype and its float32
    working copy in CPU memory, with a calibrated recipe the layer and its inputs and outputs for every window on
    the compute device; the packed weights once on disk (the final files are links to the partial ones)."""
    b = _size(load_dtype)
    cpu = shape.layer_parameters * (b + 4)
    gpu = 0
    if calibrated:
        seqlen = min(seqlen, shape.positions or seqlen)
        hidden = 2 * samples * seqlen * shape.hidden * b
        if compute != "cpu":
            gpu = shape.layer_parameters * b + hidden
        else:
            cpu += hidden
    return MemoryPlan("pack", cpu, gpu, int(shape.linear_parameters * code_bits / 8))


ACTIVATION_PER_HIDDEN = 48  # elements a decoder layer keeps per token for its backward, in hidden sizes (generous)


def streamed_search_plan(shape: ModelShape, dtype: torch.dtype, tokens: int, chunk_tokens: int = 0,
                         chunk_windows: int = 0) -> MemoryPlan:
    """The lower bounds of ``quantkit search --max-gpu-memory``: the model and its Δ (MixLLM Eq. 4) in CPU memory,
    with the layer-boundary activations of a chunk of ``chunk_tokens`` tokens in ``chunk_windows`` windows; on the
    GPU one decoder layer and its Δ, that layer's activations for ``tokens`` tokens (a batch of windows), the LM
    head with its float32 logits and their gradient, the chunk's hidden states and their gradients at the current
    layer, and every linear's float32 probe row and its gradient per window of the chunk."""
    b = _size(dtype)
    gpu = (2 * shape.layer_parameters * b + tokens * shape.hidden * (ACTIVATION_PER_HIDDEN + 2) * b
           + shape.vocab * shape.hidden * b + 2 * tokens * shape.vocab * 4 + 2 * chunk_tokens * shape.hidden * b
           + 2 * 4 * chunk_windows * shape.linear_rows)
    cpu = 2 * shape.parameters * b + chunk_tokens * shape.hidden * (shape.layers + 1) * b
    return MemoryPlan("search", cpu, gpu, 0)


def search_plan(shape: ModelShape, dtype: torch.dtype, device: str, device_map: str | None) -> MemoryPlan:
    """The lower bounds of ``quantkit search``: the whole model on its device (with ``device_map`` accelerate places
    it, and only the CPU copy is counted)."""
    weights = shape.parameters * _size(dtype)
    if device != "cpu" and device_map is None:
        return MemoryPlan("search", 0, weights, 0)
    return MemoryPlan("search", weights, 0, 0)


def check_plan(plan: MemoryPlan, compute: str, fixes: dict[str, str]) -> None:
    """A QuantkitError before any work when ``plan`` exceeds the free CPU or GPU memory (quantkit.model.memory),
    naming the need, what is free and ``fixes[resource]`` ("cpu", "gpu")."""
    from quantkit.model.memory import free_memory

    checks = [("cpu", "CPU memory", plan.cpu_bytes, "cpu")]
    if plan.gpu_bytes and compute != "cpu" and torch.cuda.is_available():
        checks.append(("gpu", "GPU memory", plan.gpu_bytes, compute))
    for key, what, need, device in checks:
        free = free_memory(device)
        if need and free and need > free:
            raise QuantkitError(f"{plan.job} needs at least {need / GIB:.1f} GiB of {what} and {free / GIB:.1f} GiB "
                                f"is free; {fixes[key]}")
