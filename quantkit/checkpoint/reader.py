"""Loading a packed checkpoint back into a runnable model: the HF architecture from config.json (no weights,
accelerate's ``init_empty_weights``), each quantized linear replaced by a
:class:`~quantkit.runtime.quant_linear.QuantLinear` holding its packed tensors, everything else loaded as stored.
Shards are checked before use against the manifest (missing, truncated or extended, a header that changed,
tensors laid out otherwise) without reading tensor data; ``verify`` also recomputes every tensor's sha256."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.nn as nn

from quantkit.checkpoint.manifest import linear_activation, read_manifest, shard_contents
from quantkit.checkpoint.shards import check_shard, read_shard, tensor_sha256
from quantkit.errors import QuantkitError


def check_files(folder: Path, manifest: dict) -> None:
    """Every shard the manifest names exists, has the size and header written (when the manifest records them),
    and its header lays out the listed tensors with their dtypes and shapes — without reading tensor data."""
    records = manifest.get("shards") or {}
    for shard, entries in shard_contents(manifest).items():
        check_shard(folder / shard, entries, records.get(shard))


def check_config(folder: Path, manifest: dict | None = None) -> dict:
    """config.json of checkpoint ``folder`` as a dict: it exists, is a JSON object with a ``model_type`` — the
    manifest's, when given; QuantkitError naming the problem otherwise."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise QuantkitError(f"checkpoint '{folder}' has no config.json; re-run `quantkit pack` to write it whole")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise QuantkitError(f"config.json of checkpoint '{folder}' is not readable JSON ({e}); re-run "
                            "`quantkit pack` or copy the checkpoint again") from None
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(model_type, str) or not model_type:
        raise QuantkitError(f"config.json of checkpoint '{folder}' has no model_type; re-run `quantkit pack` or "
                            "copy the checkpoint again")
    want = (manifest or {}).get("source", {}).get("model_type")
    if want and model_type != want:
        raise QuantkitError(f"config.json of checkpoint '{folder}' is for model_type '{model_type}', its manifest "
                            f"for '{want}'; the manifest and config.json do not belong together")
    return config


def verify_checkpoint(folder: str | Path, manifest: dict | None = None) -> list[dict]:
    """Recompute the sha256 of every tensor; returns the mismatches as {tensor, shard, expected, actual}
    (empty when all match). Missing or truncated shards raise QuantkitError."""
    folder = Path(folder).expanduser()
    manifest = manifest or read_manifest(folder)
    check_files(folder, manifest)
    bad = []
    for shard, entries in shard_contents(manifest).items():
        for name, t in read_shard(folder / shard, entries).items():
            digest = tensor_sha256(t)
            if digest != entries[name]["sha256"]:
                bad.append({"tensor": name, "shard": shard, "expected": entries[name]["sha256"], "actual": digest})
    return bad


def read_tensors(folder: Path, manifest: dict, verify: bool = False) -> dict[str, torch.Tensor]:
    """All tensors of the checkpoint by name (CPU), dtype-checked against the manifest; with ``verify`` a sha256
    mismatch raises QuantkitError naming the tensor and its shard."""
    check_files(folder, manifest)
    out: dict[str, torch.Tensor] = {}
    for shard, entries in shard_contents(manifest).items():
        for name, t in read_shard(folder / shard, entries).items():
            want = entries[name]
            if str(t.dtype).replace("torch.", "") != want["dtype"]:
                raise QuantkitError(f"tensor '{name}' in shard '{shard}' is {t.dtype}, the manifest says "
                                    f"{want['dtype']}; re-run `quantkit pack`")
            if verify and tensor_sha256(t) != want["sha256"]:
                raise QuantkitError(f"tensor '{name}' in shard '{shard}' fails its sha256 check (the file is "
                                    "corrupt); re-run `quantkit pack` or copy the checkpoint again")
            out[name] = t
    return out


def _act_spec(a: dict | None):
    """The ActQuant of an activation entry (:func:`.manifest.linear_activation`; None: weights only)."""
    from quantkit.runtime.dispatch import ActQuant

    return None if not a else ActQuant(int(a["bits"]), int(a["group_size"]), bool(a.get("sym", True)),
                                       bool(a.get("fp8", False)))


def build_quant_linear(entry: dict, tensors: dict[str, torch.Tensor], act, dtype: torch.dtype,
                       cache_dense: bool = True):
    """A QuantLinear from one manifest linear entry and the checkpoint tensors (bias cast to ``dtype``)."""
    from quantkit.runtime.quant_linear import PackedPart, QuantLinear

    parts = []
    for p in entry["partitions"]:
        local = {short: tensors[full] for short, full in p["tensors"].items()}
        rows = tensors[p["rows"]] if p["rows"] else None
        parts.append(PackedPart(p["layout"], p["meta"], local, rows, int(p["bits"])))
    bias = tensors[entry["bias"]].to(dtype) if entry.get("bias") else None
    lin = QuantLinear(entry["in_features"], entry["out_features"], parts, bias, act, cache_dense)
    rot = entry.get("input_rotation")
    if rot is not None:
        from quantkit.quant.rotate import InputRotation

        lin.input_rotation = InputRotation(int(rot["width"]), int(rot["seed"]), dtype)
    return lin


def _empty_model(folder: Path, dtype: torch.dtype) -> nn.Module:
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    from quantkit.model.loader import quiet_hf
    from quantkit.model.walk import check_supported

    quiet_hf()
    check_config(folder)
    try:
        config = AutoConfig.from_pretrained(folder)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise QuantkitError(f"could not read config.json of checkpoint '{folder}': {first}; re-run `quantkit pack`") \
            from None
    check_supported(config)
    # parameters on the meta device (no memory, no init); buffers such as rotary inv_freq are real
    from quantkit.model.moe import unfuse_experts

    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    unfuse_experts(model)  # the packed names are per expert (quantkit.model.moe)
    return model


def build_model(folder: Path, manifest: dict, tensors: dict[str, torch.Tensor], dtype: torch.dtype,
                cache_dense: bool = True) -> nn.Module:
    """The HF model with QuantLinear modules and all other weights from ``tensors`` (on CPU, eval mode)."""
    from quantkit.model.walk import set_module

    model = _empty_model(folder, dtype)
    owned: set[str] = set()
    for name, entry in manifest["linears"].items():
        try:
            model.get_submodule(name)
        except AttributeError:
            raise QuantkitError(f"checkpoint '{folder}' quantizes '{name}', which its config.json model does not "
                                "have; the manifest and config.json do not belong together") from None
        act = _act_spec(linear_activation(entry, manifest))
        set_module(model, name, build_quant_linear(entry, tensors, act, dtype, cache_dense))
        owned.update(k for k, v in manifest["tensors"].items() if v.get("linear") == name)
        if entry.get("bias"):
            owned.add(entry["bias"])
    rest = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in tensors.items() if k not in owned}
    for alias, target in manifest["aliases"].items():
        rest.setdefault(alias, rest[target])
    result = model.load_state_dict(rest, strict=False, assign=True)
    if result.unexpected_keys:
        raise QuantkitError(f"checkpoint '{folder}' has tensor '{result.unexpected_keys[0]}' that its config.json "
                            "model does not; the manifest and config.json do not belong together")
    model.tie_weights()
    empty = [n for n, p in list(model.named_parameters()) + list(model.named_buffers()) if p.is_meta]
    if empty:
        raise QuantkitError(f"checkpoint '{folder}' lacks tensor '{empty[0]}' ({len(empty)} missing); "
                            "re-run `quantkit pack`")
    return model.eval()


def load_packed(path: str | Path, device: str = "auto", dtype: str | None = None, verify: bool = False,
                load_tokenizer: bool = True, cache_dense: bool = True, fuse: bool = True):
    """Load a packed checkpoint as a :class:`quantkit.model.LoadedModel` (model with QuantLinear modules, its
    tokenizer). ``device`` cpu|cuda|cuda:N|auto, ``dtype`` the compute dtype (default fp32 on CPU, the source's
    fp16/bf16 on GPU), ``verify`` recomputes every tensor's sha256 first. ``fuse`` stacks q/k/v and gate/up into
    one GEMM each (:mod:`quantkit.runtime.fused_siblings`) and runs the RMSNorms in front of them as one kernel
    that also quantizes for them (:mod:`quantkit.runtime.fused_norm`; QUANTKIT_FUSE_NORM=0 leaves the norms;
    QUANTKIT_FUSE=0 turns both off);
    siblings left unfused share their activation quantization (:mod:`quantkit.runtime.sibling_inputs`)."""
    from quantkit.model.loader import LoadedModel, resolve_device, resolve_dtype
    from quantkit.runtime.fused_norm import ENV_SWITCH as NORM_SWITCH
    from quantkit.runtime.fused_norm import fuse_norms
    from quantkit.runtime.fused_siblings import ENV_SWITCH, fuse_sibling_projections
    from quantkit.runtime.fused_siblings import share_sibling_inputs

    folder = Path(path).expanduser()
    manifest = read_manifest(folder)
    check_config(folder, manifest)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, dev, manifest["source"].get("dtype"))
    tensors = read_tensors(folder, manifest, verify=verify)
    model = build_model(folder, manifest, tensors, torch_dtype, cache_dense)
    del tensors  # so each group's unfused tensors are freed once it is fused (model.to on the CPU keeps the same ones)
    model.to(dev)
    if fuse and os.environ.get(ENV_SWITCH) != "0":
        fuse_sibling_projections(model)  # on the device: a stacked copy of one group at a time
        if os.environ.get(NORM_SWITCH) != "0":
            fuse_norms(model)
    share_sibling_inputs(model)
    if torch.device(dev).type == "cuda":
        from quantkit.runtime.kernels.scratch import reserve_graph_tickets

        reserve_graph_tickets(dev)  # outside any CUDA graph, for a compiled forward's split-K launches
    tokenizer = None
    if load_tokenizer:
        from quantkit.model.loader import load_tokenizer_of

        tokenizer = load_tokenizer_of(str(folder), f"checkpoint '{folder}'")
    return LoadedModel(model, tokenizer, str(path), str(folder), dev, torch_dtype)


def load(path: str | Path, device: str = "auto", verify: bool = False, dtype: str | None = None) -> nn.Module:
    """The model of a packed checkpoint, ready for inference (``quantkit.load``); see :func:`load_packed`."""
    return load_packed(path, device=device, dtype=dtype, verify=verify, load_tokenizer=False).model
