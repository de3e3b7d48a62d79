"""Writing a packed checkpoint (docs/checkpoint-format.md): the quantized linears' records packed by their
layouts, every other tensor of the model as it is (in the source checkpoint's dtype), config.json with a
``quantization_config``, the ``quantkit.json`` manifest, sharded safetensors with an HF index, and the
tokenizer files — all into a temporary directory renamed into place at the end (:mod:`.atomic`)."""

from __future__ import annotations

import copy
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from quantkit.checkpoint.atomic import MANIFEST_NAME, atomic_directory
from quantkit.checkpoint.choose import record_parts
from quantkit.checkpoint.manifest import DENSE, FORMAT, LINEAR_ACTIVATION_VERSION, ROTATION_VERSION
from quantkit.checkpoint.shards import nbytes, shard_record, tensor_sha256, write_json, write_shards
from quantkit.quant.partition import WeightRecord, record_bits
from quantkit.quant.records import QuantizedWeight

QUANTIZE_CONFIG_NAME = "quantize_config.json"  # GPTQ exports: AutoGPTQ's own copy of quantization_config
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "spiece.model", "vocab.json", "vocab.txt", "merges.txt", "added_tokens.json",
                   "chat_template.jinja", "chat_template.json", "generation_config.json")
JSON_BYTES_PER_TENSOR = 1536  # its entries in a shard header, the index and the manifest, generously
JSON_BYTES = 64 * 1024  # config.json, quantize_config.json and the manifest's fixed part
SAVED_TOKENIZER_BYTES = 4 * 10 ** 6  # a tokenizer saved from a hub model rather than copied, generously


@dataclass
class PackedModel:
    """Everything a checkpoint holds, in memory: tensors by checkpoint name (file order) and the manifest."""

    tensors: dict[str, torch.Tensor]
    manifest: dict
    config: object  # the HF PretrainedConfig to write (with quantization_config)
    extra_files: dict[str, Path] = field(default_factory=dict)  # file name → source path to copy


def _storage_key(t: torch.Tensor) -> tuple:
    return (t.device.type, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()))


def keep_dtype(t: torch.Tensor, source_dtype: torch.dtype) -> torch.Tensor:
    """``t`` in the source checkpoint's dtype when that is lossless (weights loaded upcast come back exactly);
    values the quantizer changed beyond it (e.g. AWQ-scaled norms) keep the dtype they were computed in, so the
    reloaded model equals the fake-quant one."""
    if not t.is_floating_point() or t.dtype == source_dtype:
        return t
    cast = t.to(source_dtype)
    return cast if torch.equal(cast.to(t.dtype), t) else t


def _pack_linear(name: str, record: WeightRecord, layouts: list[str], bias_name: str | None,
                 tensors: dict[str, torch.Tensor]) -> dict:
    """Pack one linear's partitions into ``tensors``; returns its manifest entry."""
    from quantkit.formats.registry import get_layout

    parts = record_parts(record)
    rows_of = [None] if isinstance(record, QuantizedWeight) else [p.rows for p in record.partitions]
    mixed = len(parts) > 1
    entries = []
    for qw, rows, layout_name in zip(parts, rows_of, layouts):
        layout = get_layout(layout_name)
        prefix = f"{name}.part{qw.bits}" if mixed else name
        names = {}
        for tname, t in layout.pack(qw).items():
            names[tname] = f"{prefix}.{tname}"
            tensors[names[tname]] = t
        rows_name = None
        if mixed:
            rows_name = f"{prefix}.rows"
            tensors[rows_name] = rows.to(torch.int32).contiguous()
        entries.append({"bits": int(qw.bits), "layout": layout_name, "group_size": int(qw.group_size),
                        "sym": bool(qw.sym), "method": qw.meta.get("method"), "n_rows": int(qw.codes.shape[0]),
                        "meta": layout.layout_meta(qw), "tensors": names, "rows": rows_name})
    total, elems = record_bits(record)
    n, k = (record.codes.shape if isinstance(record, QuantizedWeight)
            else (record.out_features, record.in_features))
    return {"out_features": int(n), "in_features": int(k), "bias": bias_name,
            "bits": entries[0]["bits"] if not mixed else [e["bits"] for e in entries],
            "avg_bits": total / elems, "partitions": entries}


def pack_model(model: nn.Module, records: dict[str, WeightRecord], layouts: dict[str, list[str]],
               source_dtype: torch.dtype) -> tuple[dict[str, torch.Tensor], dict[str, dict], dict[str, str]]:
    """(tensors by checkpoint name, linear entries, aliases) of a fake-quantized ``model`` and its records.

    Tensors follow the model's state_dict order; a quantized linear's ``weight`` is replaced by its layout's
    tensors (``<linear>.qweight`` …, or ``<linear>.part{bits}.<tensor>`` + ``.rows`` for mixed precision).
    A tensor shared by two names (tied embeddings) is written once; the second name becomes an alias.
    """
    weight_of = {f"{n}.weight": n for n in records}
    tensors: dict[str, torch.Tensor] = {}
    linears: dict[str, dict] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    state = model.state_dict()
    for key, t in state.items():
        if key in weight_of:
            lin = weight_of[key]
            bias = f"{lin}.bias" if f"{lin}.bias" in state else None
            linears[lin] = _pack_linear(lin, records[lin], layouts[lin], bias, tensors)
            continue
        sk = _storage_key(t)
        if sk in seen:
            aliases[key] = seen[sk]
            continue
        seen[sk] = key
        tensors[key] = keep_dtype(t.detach(), source_dtype)
    missing = sorted(set(records) - set(linears))
    if missing:
        raise ValueError(f"records for linears the model does not have: {missing[:3]}")
    return tensors, linears, aliases


def tensor_entries(tensors: dict[str, torch.Tensor], linears: dict[str, dict]) -> dict[str, dict]:
    """The manifest's entry of each tensor (shard still None): dtype, shape, bytes, sha256, the layout it belongs
    to (``dense`` for the model's other tensors) and the linear that owns it."""
    owner = {}
    for lin, entry in linears.items():
        for p in entry["partitions"]:
            for tname in list(p["tensors"].values()) + ([p["rows"]] if p["rows"] else []):
                owner[tname] = (lin, p["layout"])
    entries = {}
    for name, t in tensors.items():
        lin, layout = owner.get(name, (None, DENSE))
        entries[name] = {"shard": None, "dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape),
                         "nbytes": nbytes(t), "sha256": tensor_sha256(t), "layout": layout}
        if lin is not None:
            entries[name]["linear"] = lin
    return entries


def quantization_config(export: str, linears: dict[str, dict], info: dict, version: int = 1,
                        lm_head: bool = False) -> dict:
    """config.json ``quantization_config``: the GPTQ/AWQ layout's own (what transformers/vLLM read; ``lm_head``: the
    output projection is quantized too, the key vLLM and GPTQModel read) or quantkit's."""
    if export != "quantkit":
        from quantkit.formats.registry import get_layout

        layout = next(iter(linears.values()))["partitions"][0]["layout"]
        qc = get_layout(layout).quantization_config([p["meta"] for lin in linears.values()
                                                     for p in lin["partitions"]])
        return {**qc, "lm_head": True} if lm_head else qc
    return {"quant_method": "quantkit", "format_version": version, "recipe": info["recipe"]["name"],
            "target": info["target"], "bits": info["recipe"]["weight"]["bits"],
            "group_size": info["recipe"]["weight"]["group_size"], "activation": info["activation"],
            "avg_bits": info["avg_bits"], "manifest": MANIFEST_NAME}


def build_checkpoint(model: nn.Module, records: dict[str, WeightRecord], layouts: dict[str, list[str]],
                     info: dict, source_dtype: torch.dtype) -> PackedModel:
    """Assemble tensors, manifest and config of a checkpoint. ``info`` carries the manifest's descriptive fields:
    quantkit_version, source, recipe (dict), plan_sha256, plan_file, target, export, activation, calibration,
    avg_bits, and optionally online_rotation ({"seed", "linears"}: each of those linears' entry gets its
    ``input_rotation``, and the manifest format version 2) and weight_only (linear names whose entry gets
    ``"activation": null``: their inputs stay unquantized whatever the manifest's ``activation``)."""
    tensors, linears, aliases = pack_model(model, records, layouts, source_dtype)
    entries = tensor_entries(tensors, linears)
    info = dict(info)
    online = info.pop("online_rotation", None)
    version = 1
    weight_only = info.pop("weight_only", None) or ()
    for name in weight_only:  # the manifest's activation entry does not apply to it
        linears[name]["activation"] = None
        version = LINEAR_ACTIVATION_VERSION  # older readers would quantize its inputs or not know the recipe field
    if online:  # the linear's kernels read W·Q, so its input must rotate first: readers before version 2 cannot
        version = max(version, ROTATION_VERSION)
        for name in online["linears"]:
            width = model.get_submodule(name).in_features
            linears[name]["input_rotation"] = {"seed": int(online["seed"]), "width": int(width)}
    manifest = {"format": FORMAT, "format_version": version, **info, "linears": linears,
                "tensors": entries, "aliases": aliases}
    config = copy.deepcopy(model.config)
    config.dtype = source_dtype
    config.quantization_config = quantization_config(info["export"], linears, info, version, bool(weight_only))
    return PackedModel(tensors, manifest, config)


def tokenizer_files(source_dir: str | None) -> dict[str, Path]:
    """Tokenizer and generation-config files of a local source model dir, by name (empty for hub models)."""
    if source_dir is None:
        return {}
    src = Path(source_dir)
    return {n: src / n for n in TOKENIZER_FILES if (src / n).is_file()}


def _saves_tokenizer(packed: PackedModel, tokenizer) -> bool:
    return tokenizer is not None and not set(packed.extra_files) - {"generation_config.json"}


def checkpoint_bytes(packed: PackedModel, tokenizer=None) -> int:
    """Bytes the checkpoint will take on disk, slightly from above: tensor data, the JSON that describes it, the
    copied files, and an allowance for a tokenizer saved from ``tokenizer``."""
    data = sum(nbytes(t) for t in packed.tensors.values())
    copied = sum(p.stat().st_size for p in packed.extra_files.values())
    saved = SAVED_TOKENIZER_BYTES if _saves_tokenizer(packed, tokenizer) else 0
    return data + JSON_BYTES_PER_TENSOR * len(packed.tensors) + JSON_BYTES + copied + saved


def write_checkpoint(out: str | Path, packed: PackedModel, max_shard_bytes: int, force: bool = False,
                     tokenizer=None, progress: Callable[[int, int], None] | None = None) -> Path:
    """Write ``packed`` to ``out`` atomically (see :mod:`quantkit.checkpoint.atomic`; too little free space is
    refused before the first byte); tokenizer files are copied from ``packed.extra_files``, or saved from
    ``tokenizer`` when that holds none (hub sources). The manifest records each shard's size and header hash."""
    out = Path(out)
    with atomic_directory(out, force, needed=checkpoint_bytes(packed, tokenizer)) as tmp:
        weight_map = write_shards(tmp, packed.tensors, max_shard_bytes, progress)
        for name, shard in weight_map.items():
            packed.manifest["tensors"][name]["shard"] = shard
        packed.manifest["shards"] = {f: shard_record(tmp / f) for f in sorted(set(weight_map.values()))}
        packed.config.save_pretrained(tmp)
        qc = getattr(packed.config, "quantization_config", None)
        if isinstance(qc, dict) and qc.get("quant_method") == "gptq":
            # AutoGPTQ reads its config from this file only; GPTQModel writes it beside config.json's copy too
            write_json(tmp / QUANTIZE_CONFIG_NAME, qc)
        for name, src in packed.extra_files.items():
            shutil.copyfile(src, tmp / name)
        if _saves_tokenizer(packed, tokenizer):
            tokenizer.save_pretrained(tmp)
        write_json(tmp / MANIFEST_NAME, packed.manifest)
    return out
