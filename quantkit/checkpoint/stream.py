"""Streamed packing (``quantkit pack --stream``): a model larger than CPU memory is read, quantized and written one
decoder layer at a time, and an interrupted run continues where it stopped (``--resume``).

The model is built on the meta device for its names and shapes only; tensors are read from the source's
safetensors files (memory-mapped, one at a time) as a layer needs them. Each group of tensors — the ones outside
the decoder layers (embeddings, final norm, LM head), then every decoder layer in order — is quantized with the
recipe's data-free quantizers (the ones :func:`quantkit.quant.apply.quantize_model` runs without calibration, so a
streamed checkpoint holds the same tensors as an ordinary ``pack``), packed by its layouts and written to its own
shard files in ``OUT.partial`` before the next group is read; ``stream-progress.json`` there records what each
finished group wrote. Memory stays at about one decoder layer in the load dtype plus its packed form.

At the end the shard files are linked into a temporary directory under their final names
(``model-0000k-of-0000n.safetensors``, groups in order), with the index, the manifest, config.json and the
tokenizer files, which then replaces ``OUT`` atomically (:mod:`.atomic`) before ``OUT.partial`` is removed. A
group's files depend only on the source, the recipe, the plan and the shard size, so a resumed run writes the same
bytes as an uninterrupted one; a partial directory started with other settings is refused, never mixed in.

Recipes that calibrate (GPTQ, AWQ, clipping searches, SmoothQuant) or fold a rotation into the whole model, and
engine exports, are refused with ``--stream``: they need more than one layer at a time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from quantkit.errors import QuantkitError

PARTIAL_SUFFIX = ".partial"
PROGRESS_NAME = "stream-progress.json"
REST = "rest"  # the group of tensors outside the decoder layers
STATE_VERSION = 1


def partial_dir(out: Path) -> Path:
    """Where a streamed pack to ``out`` keeps its finished groups until the checkpoint is complete."""
    return out.parent / f"{out.name}{PARTIAL_SUFFIX}"


def check_streamable(rec, export: str) -> None:
    """Refuse, in one line, what a layer-at-a-time pack cannot do: calibrated recipes, whole-model rotations and
    engine exports."""
    if rec.uses_calibration:
        raise QuantkitError(f"--stream packs data-free recipes (rtn-w4a16-g128, lqq-w4a8-rtn, fp8-w8a8, ...); recipe "
                            f"'{rec.name}' calibrates (GPTQ, AWQ, a clipping search or SmoothQuant), which needs "
                            "activations across layers: drop --stream")
    if rec.activation.rotate or rec.activation.online_rotate:
        raise QuantkitError(f"--stream cannot fold recipe '{rec.name}''s rotations (they change every layer and the "
                            "embeddings together): drop --stream")
    if export != "quantkit":
        raise QuantkitError(f"--stream writes quantkit checkpoints; drop --stream to export --format {export}")


def source_folder(model_ref: str) -> Path:
    """The local folder holding ``model_ref``'s config and safetensors (a hub id is fetched to the HF cache)."""
    from quantkit.model.loader import resolve_model_path

    path, is_local = resolve_model_path(model_ref)
    if is_local:
        return Path(path)
    from huggingface_hub import snapshot_download

    from quantkit.model.loader import check_safetensors_files
    from quantkit.checkpoint.writer import TOKENIZER_FILES

    try:
        folder = Path(snapshot_download(path, allow_patterns=["*.json", "*.safetensors", *TOKENIZER_FILES]))
    except Exception as e:  # noqa: BLE001 — network, auth or a missing repo: one line either way
        raise QuantkitError(f"could not fetch '{model_ref}' from the hub ({type(e).__name__}: "
                            f"{str(e).splitlines()[0] if str(e) else 'no detail'})") from None
    check_safetensors_files(folder)
    return folder


class SourceTensors:
    """The tensors of a model folder's safetensors files, read one at a time (memory-mapped by safetensors)."""

    def __init__(self, folder: Path):
        from safetensors import safe_open

        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise QuantkitError(f"'{folder}' has no .safetensors files; --stream reads safetensors checkpoints")
        self._open = {f.name: safe_open(str(f), framework="pt") for f in files}
        self.file_of = {name: fname for fname, h in self._open.items() for name in h.keys()}
        self.fingerprint = hashlib.sha256(json.dumps(
            sorted((f.name, f.stat().st_size) for f in files)).encode()).hexdigest()

    def read(self, name: str) -> torch.Tensor:
        """Tensor ``name`` as stored."""
        return self._open[self.file_of[name]].get_tensor(name)


def _groups(model) -> tuple[dict[str, list[str]], dict[str, str]]:
    """(group → the state-dict keys it writes, in state-dict order; aliases: a key → the key it shares its tensor
    with). Groups: :data:`REST`, then "0", "1", … for the decoder layers."""
    from quantkit.model.walk import find_decoder_layers

    path, layers = find_decoder_layers(model)
    groups: dict[str, list[str]] = {REST: []}
    groups.update({str(i): [] for i in range(len(layers))})
    first_of: dict[int, str] = {}
    aliases: dict[str, str] = {}
    for key, t in model.state_dict(keep_vars=True).items():
        if id(t) in first_of:  # a tied LM head: written once, under the first name
            aliases[key] = first_of[id(t)]
            continue
        first_of[id(t)] = key
        group = REST
        if key.startswith(f"{path}."):
            group = key[len(path) + 1:].split(".", 1)[0]
        groups[group].append(key)
    return groups, aliases


def _fingerprint(src: SourceTensors, model_ref: str, info: dict, max_bytes: int, load_dtype: torch.dtype) -> str:
    """What a group's bytes depend on: the source files, the recipe, plan and target, the shard size, the load
    dtype and the quantkit version."""
    what = {"source": src.fingerprint, "model": model_ref, "recipe": info["recipe"], "plan": info["plan_sha256"],
            "target": info["target"], "max_shard_bytes": max_bytes, "load_dtype": str(load_dtype),
            "quantkit": info["quantkit_version"], "version": STATE_VERSION}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()


def _write_json_atomic(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj), encoding="utf-8")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _open_partial(partial: Path, fingerprint: str, resume: bool) -> dict:
    """The progress state of ``partial`` (a fresh one where none exists); refuses a partial directory without
    ``resume`` or one started with other settings."""
    state_file = partial / PROGRESS_NAME
    if partial.exists():
        if not resume:
            raise QuantkitError(f"'{partial}' holds an interrupted streamed pack to this output; pass --resume to "
                                "continue it, or remove that folder to start over")
        try:
            state = json.loads(state_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise QuantkitError(f"'{partial}' has no readable {PROGRESS_NAME}; remove that folder to start "
                                "over") from None
        if state.get("fingerprint") != fingerprint:
            raise QuantkitError(f"'{partial}' was started with another source, recipe, plan, target, shard size or "
                                "quantkit version; remove that folder to start over, or pack with the first "
                                "run's settings")
        return state
    partial.mkdir(parents=True)
    state = {"fingerprint": fingerprint, "groups": {}}
    _write_json_atomic(state_file, state)
    return state


def _pack_group(keys: list[str], src: SourceTensors, records_for: Callable, target: str,
                warn: Callable[[str], None], load_dtype: torch.dtype, source_dtype: torch.dtype,
                linear_names: set[str]) -> tuple[dict[str, torch.Tensor], dict[str, dict], list[int]]:
    """(tensors to write, linear entries, [Σ bits × elements, elements]) of one group, in state-dict order."""
    from quantkit.checkpoint.choose import choose_layouts
    from quantkit.checkpoint.writer import _pack_linear, keep_dtype
    from quantkit.quant.partition import record_bits

    weights = [k[:-len(".weight")] for k in keys if k.endswith(".weight") and k[:-len(".weight")] in linear_names]
    records = {name: records_for(name, src.read(f"{name}.weight").to(load_dtype)) for name in weights}
    layouts = choose_layouts(records, target, "quantkit", warn)
    tensors: dict[str, torch.Tensor] = {}
    linears: dict[str, dict] = {}
    bits = [0, 0]
    for key in keys:
        name = key[:-len(".weight")]
        if key.endswith(".weight") and name in records:
            bias = f"{name}.bias" if f"{name}.bias" in keys else None
            linears[name] = _pack_linear(name, records[name], layouts[name], bias, tensors)
            total, elems = record_bits(records[name])
            bits = [bits[0] + total, bits[1] + elems]
            continue
        if key not in src.file_of:
            raise QuantkitError(f"the source checkpoint has no tensor '{key}' (its names differ from the model's "
                                "modules, e.g. fused MoE experts); --stream reads checkpoints whose tensor names "
                                "are the model's: drop --stream")
        tensors[key] = keep_dtype(src.read(key).to(load_dtype), source_dtype)
    return tensors, linears, bits


def _write_group(partial: Path, group: str, tensors: dict[str, torch.Tensor], max_bytes: int) -> dict[str, str]:
    """Write one group's tensors as safetensors files ``<group>-NNN.safetensors`` in ``partial``; name → file."""
    from safetensors.torch import save_file

    from quantkit.checkpoint.shards import current_umask, nbytes, plan_shards

    mode = 0o666 & ~current_umask()
    where: dict[str, str] = {}
    for j, names in enumerate(plan_shards(((n, nbytes(t)) for n, t in tensors.items()), max_bytes)):
        if not names:
            continue
        fname = f"{group}-{j:03d}.safetensors"
        save_file({n: tensors[n].detach().contiguous() for n in names}, partial / fname, metadata={"format": "pt"})
        os.chmod(partial / fname, mode)
        with open(partial / fname, "rb") as f:
            os.fsync(f.fileno())
        where.update({n: fname for n in names})
    return where


def stream_pack(model_ref: str, rec, plan_obj, out: Path, *, target: str, max_bytes: int, force: bool, resume: bool,
                load_dtype: torch.dtype, source_dtype: torch.dtype, info: dict, warn: Callable[[str], None],
                progress_factory=None) -> dict:
    """Pack ``model_ref`` with the data-free recipe ``rec`` (and ``plan_obj``) one layer at a time into ``out``
    (module docstring); returns the manifest written. ``info`` holds the manifest's descriptive fields as
    :func:`quantkit.checkpoint.writer.build_checkpoint` takes them (avg_bits is filled in here)."""
    from quantkit.checkpoint.atomic import MANIFEST_NAME, atomic_directory, check_output
    from quantkit.checkpoint.manifest import FORMAT
    from quantkit.checkpoint.shards import INDEX_NAME, shard_names, shard_record, write_json
    from quantkit.checkpoint.writer import quantization_config, tensor_entries, tokenizer_files
    from quantkit.model.memory_plan import meta_model
    from quantkit.model.walk import iter_linears
    from quantkit.quant.apply import _row_bits_for, _rows_quantizer
    from quantkit.quant.partition import quantize_partitioned

    out = out.absolute()
    check_output(out, force)
    folder = source_folder(model_ref)
    src = SourceTensors(folder)
    model = meta_model(str(folder))
    if rec.kv is not None:
        from quantkit.quant.kv import check_fits

        check_fits(model, rec.kv)
    if plan_obj is not None:
        from quantkit.search.plan_check import check_plan_model

        check_plan_model(plan_obj, model, "the plan")
    linears = {n: lin for n, lin in iter_linears(model) if not rec.spec_for(n).skip}
    for pattern in rec.unmatched_overrides(name for name, _ in iter_linears(model)):
        warn(f"recipe override '{pattern}' matches no linear layer of '{model_ref}' and changes nothing")

    def records_for(name: str, weight: torch.Tensor):
        rb = _row_bits_for(plan_obj, name, linears[name], rec.spec_for(name).bits)
        return quantize_partitioned(weight.float(), rb, _rows_quantizer(rec, name))

    groups, aliases = _groups(model)
    partial = partial_dir(out)
    state = _open_partial(partial, _fingerprint(src, model_ref, info, max_bytes, load_dtype), resume)
    seen_warnings: set[str] = set(w for g in state["groups"].values() for w in g.get("warnings", []))
    todo = [g for g in groups if g not in state["groups"]]
    ctx = progress_factory("quantize and write layers", len(groups)) if progress_factory else None
    update = ctx.__enter__() if ctx else None
    try:
        for g in todo:
            said: list[str] = []
            tensors, lin_entries, bits = _pack_group(groups[g], src, records_for, target, said.append, load_dtype,
                                                     source_dtype, set(linears))
            files = _write_group(partial, g, tensors, max_bytes)
            state["groups"][g] = {"tensors": tensor_entries(tensors, lin_entries), "files": files,
                                  "linears": lin_entries, "bits": bits, "warnings": said}
            _write_json_atomic(partial / PROGRESS_NAME, state)
            del tensors
            if update:
                update(len(state["groups"]), len(groups))
    finally:
        if ctx:
            ctx.__exit__(None, None, None)
    for g in groups:  # a layout fallback is said once, not once per layer
        for w in state["groups"][g].get("warnings", []):
            if w not in seen_warnings:
                seen_warnings.add(w)
                warn(w)

    order = [(g, f) for g in groups for f in sorted(set(state["groups"][g]["files"].values()))]
    final = dict(zip(order, shard_names(len(order))))
    entries: dict[str, dict] = {}
    all_linears: dict[str, dict] = {}
    total = elems = 0
    for g in groups:
        done = state["groups"][g]
        for name, entry in done["tensors"].items():
            entries[name] = {**entry, "shard": final[(g, done["files"][name])]}
        all_linears.update(done["linears"])
        total, elems = total + done["bits"][0], elems + done["bits"][1]
    info = {**info, "avg_bits": total / max(elems, 1)}
    manifest = {"format": FORMAT, "format_version": 1, **info, "linears": all_linears, "tensors": entries,
                "aliases": {k: v for k, v in aliases.items()}}
    config = model.config
    config.dtype = source_dtype
    config.quantization_config = quantization_config("quantkit", all_linears, info, 1)
    needed = sum(e["nbytes"] for e in entries.values())
    with atomic_directory(out, force) as tmp:  # the shards are links: little new space
        for (g, fname), final_name in final.items():
            try:
                os.link(partial / fname, tmp / final_name)  # the partial copy stays until the checkpoint is in place
            except OSError:
                shutil.copyfile(partial / fname, tmp / final_name)
        write_json(tmp / INDEX_NAME, {"metadata": {"total_size": needed},
                                      "weight_map": {n: e["shard"] for n, e in entries.items()}})
        manifest["shards"] = {f: shard_record(tmp / f) for f in sorted(final.values())}
        config.save_pretrained(tmp)
        for name, path in tokenizer_files(str(folder)).items():
            shutil.copyfile(path, tmp / name)
        write_json(tmp / MANIFEST_NAME, manifest)
    shutil.rmtree(partial, ignore_errors=True)
    return manifest
