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

Calibrated recipes (GPTQ, AWQ, clipping searches, SmoothQuant) stream too: the calibration windows run up to the
first decoder layer with only the tensors outside the layers read, then each layer is read, quantized by the same
per-layer step as an ordinary pack (:class:`quantkit.quant.apply.LayerQuantizer`) on the compute device, and its
outputs — the next layer's inputs — are saved in ``OUT.partial`` (``inputs-NNNNN.pt``) before the layer is marked
done, so a resumed run starts from them. Recipes that fold a rotation into the whole model, and engine exports, are
refused with ``--stream``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import torch

from quantkit.checkpoint.choose import fp8_token_activations
from quantkit.errors import QuantkitError

PARTIAL_SUFFIX = ".partial"
PROGRESS_NAME = "stream-progress.json"
REST = "rest"  # the group of tensors outside the decoder layers
STATE_VERSION = 1


def partial_dir(out: Path) -> Path:
    """Where a streamed pack to ``out`` keeps its finished groups until the checkpoint is complete."""
    return out.parent / f"{out.name}{PARTIAL_SUFFIX}"


def check_streamable(rec, export: str) -> None:
    """Refuse, in one line, what a layer-at-a-time pack cannot do: whole-model rotations, engine exports and a
    quantized output projection."""
    if rec.activation.rotate or rec.activation.online_rotate:
        raise QuantkitError(f"--stream/--resume cannot fold the rotations of recipe '{rec.name}' (they change every "
                            "layer and the embeddings together): drop --stream/--resume")
    if export != "quantkit":
        raise QuantkitError(f"--stream/--resume write quantkit checkpoints; drop them to export --format {export}")
    if rec.lm_head:
        raise QuantkitError(f"--stream/--resume quantize the decoder layers only; recipe '{rec.name}' also quantizes "
                            "the output projection (lm_head: true): drop --stream/--resume, or lm_head")


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


# checkpoint names of modules that transformers renames at load, by model type: (module name pattern, checkpoint
# name); Mixtral's checkpoints keep its original block_sparse_moe names, w1 / w3 / w2 for gate / up / down
CHECKPOINT_NAMES = {
    "mixtral": [(r"\.mlp\.experts\.(\d+)\.gate_proj\.", r".block_sparse_moe.experts.\1.w1."),
                (r"\.mlp\.experts\.(\d+)\.up_proj\.", r".block_sparse_moe.experts.\1.w3."),
                (r"\.mlp\.experts\.(\d+)\.down_proj\.", r".block_sparse_moe.experts.\1.w2."),
                (r"\.mlp\.gate\.", r".block_sparse_moe.gate.")],
}


class SourceTensors:
    """The tensors of a model folder's safetensors files, read one at a time. Each read maps the file only while it
    copies that tensor out, so the pages of tensors already read do not stay in this process's memory."""

    def __init__(self, folder: Path):
        from safetensors import safe_open

        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise QuantkitError(f"'{folder}' has no .safetensors files; --stream reads safetensors checkpoints")
        self.file_of: dict[str, Path] = {}
        self.stored: dict[str, str] = {}  # a model tensor's name → the checkpoint's name for it, where they differ
        for f in files:
            with safe_open(str(f), framework="pt") as h:
                self.file_of.update({name: f for name in h.keys()})
        index = folder / "model.safetensors.index.json"  # where a tensor sits in more than one file, the index says
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
            except (OSError, ValueError):
                weight_map = {}
            self.file_of.update({n: folder / f for n, f in weight_map.items()
                                 if n in self.file_of and (folder / f).is_file()})
        self.fingerprint = hashlib.sha256(json.dumps(
            sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files)).encode()).hexdigest()

    def map_names(self, model_type: str, names) -> None:
        """Read each model tensor of ``names`` the checkpoint stores under another name (:data:`CHECKPOINT_NAMES`)
        from that name."""
        import re

        for name in names:
            if name in self.file_of:
                continue
            for pattern, repl in CHECKPOINT_NAMES.get(model_type, []):
                stored = re.sub(pattern, repl, name)
                if stored != name and stored in self.file_of:
                    self.stored[name] = stored
                    self.file_of[name] = self.file_of[stored]
                    break

    def read(self, name: str) -> torch.Tensor:
        """Tensor ``name`` (a model tensor's name) as stored."""
        from safetensors import safe_open

        with safe_open(str(self.file_of[name]), framework="pt") as h:
            return h.get_tensor(self.stored.get(name, name)).clone()

    def read_as(self, name: str, dtype: torch.dtype) -> torch.Tensor:
        """Tensor ``name`` in ``dtype`` where it is floating point (as a load in that dtype gives it), else as
        stored."""
        t = self.read(name)
        return t.to(dtype) if t.is_floating_point() else t


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


# the settings a group's bytes depend on, by the words a mismatch names them with
SETTING_NAMES = {"source": "source files", "model": "model", "recipe": "recipe", "plan": "plan", "target": "target",
                 "max_shard_bytes": "--max-shard-size", "load_dtype": "--dtype", "quantkit": "quantkit version",
                 "version": "partial-folder format", "calibration": "calibration windows", "device": "device"}


def _settings(src: SourceTensors, model_ref: str, info: dict, max_bytes: int, load_dtype: torch.dtype,
              calibration: dict | None, device: str) -> dict:
    """What a group's bytes depend on (:data:`SETTING_NAMES`), each as a short hash: the source files, the recipe,
    plan and target, the shard size, the load dtype, the quantkit version and, for a calibrated recipe, the
    calibration windows and the compute device."""
    what = {"source": src.fingerprint, "model": model_ref, "recipe": info["recipe"], "plan": info["plan_sha256"],
            "target": info["target"], "max_shard_bytes": max_bytes, "load_dtype": str(load_dtype),
            "quantkit": info["quantkit_version"], "version": STATE_VERSION, "calibration": calibration,
            "device": torch.device(device).type if calibration else None}
    return {k: hashlib.sha256(json.dumps(v, sort_keys=True, default=str).encode()).hexdigest()[:16]
            for k, v in what.items()}


def _replace_with(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` beside ``path``, synced to disk, then renamed over it: a reader (a resumed run) sees the old
    file or the new one, never half of one."""
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_json_atomic(path: Path, obj: dict) -> None:
    _replace_with(path, lambda tmp: tmp.write_text(json.dumps(obj), encoding="utf-8"))


def _open_partial(partial: Path, settings: dict, resume: bool, force: bool, warn: Callable[[str], None]) -> dict:
    """The progress state of ``partial`` (a fresh one where none exists); without ``resume`` a partial directory is
    refused, or with ``force`` discarded; one started with other settings is refused, naming them."""
    state_file = partial / PROGRESS_NAME
    if partial.exists() and not resume and force:
        shutil.rmtree(partial)
        warn(f"removed '{partial}', an interrupted streamed pack to this output (--force starts over)")
    if partial.exists():
        if not resume:
            raise QuantkitError(f"'{partial}' holds an interrupted streamed pack to this output; pass --resume to "
                                "continue it, or --force to start over")
        try:
            state = json.loads(state_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raise QuantkitError(f"'{partial}' has no readable {PROGRESS_NAME}; remove that folder to start "
                                "over") from None
        old = state.get("settings") if isinstance(state.get("settings"), dict) else {}
        changed = [SETTING_NAMES[k] for k, v in settings.items() if old.get(k) != v]
        if changed:
            raise QuantkitError(f"'{partial}' was started with another {', '.join(changed)}; resume with the first "
                                "run's settings, or pass --force without --resume to start over")
        return state
    partial.mkdir(parents=True)
    state = {"settings": settings, "groups": {}}
    _write_json_atomic(state_file, state)
    return state


def _pack_group(keys: list[str], read: Callable[[str], torch.Tensor], records: dict, target: str,
                warn: Callable[[str], None], source_dtype: torch.dtype, fp8_activations: bool = False
                ) -> tuple[dict[str, torch.Tensor], dict[str, dict], list[int]]:
    """(tensors to write, linear entries, [Σ bits × elements, elements]) of one group, in state-dict order: the
    linears of ``records`` packed by their layouts, every other key ``read(key)`` in the source dtype."""
    from quantkit.checkpoint.choose import choose_layouts
    from quantkit.checkpoint.writer import _pack_linear, keep_dtype
    from quantkit.quant.partition import record_bits

    layouts = choose_layouts(records, target, "quantkit", warn, fp8_activations)
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
        tensors[key] = keep_dtype(read(key), source_dtype)
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


def _materialize(model, keys: list[str], src: SourceTensors, dtype: torch.dtype) -> None:
    """Give the meta-device parameters and buffers ``keys`` of ``model`` their source values (CPU, ``dtype``)."""
    from accelerate.utils import set_module_tensor_to_device

    for key in keys:
        set_module_tensor_to_device(model, key, "cpu", value=src.read_as(key, dtype))


def _release(model, keys: list[str]) -> None:
    """Send ``keys`` back to the meta device (their memory is freed)."""
    from accelerate.utils import set_module_tensor_to_device

    for key in keys:
        set_module_tensor_to_device(model, key, "meta")


def _check_names(groups: dict[str, list[str]], src: SourceTensors) -> None:
    missing = next((k for keys in groups.values() for k in keys if k not in src.file_of), None)
    if missing is not None:
        raise QuantkitError(f"the source checkpoint has no tensor '{missing}' (its names differ from the model's "
                            "modules, e.g. fused MoE experts); --stream reads checkpoints whose tensor names are "
                            "the model's: drop --stream")


def _save_atomic(obj, path: Path) -> None:
    _replace_with(path, lambda tmp: torch.save(obj, tmp))


def stream_pack(model_ref: str, rec, plan_obj, out: Path, *, target: str, max_bytes: int, force: bool, resume: bool,
                load_dtype: torch.dtype, source_dtype: torch.dtype, info: dict, warn: Callable[[str], None],
                progress_factory=None, device: str = "cpu", calibration: dict | None = None) -> dict:
    """Pack ``model_ref`` with ``rec`` (and ``plan_obj``) one layer at a time into ``out`` (module docstring);
    returns the manifest written. ``info`` holds the manifest's descriptive fields as
    :func:`quantkit.checkpoint.writer.build_checkpoint` takes them (avg_bits and calibration are filled in here).
    A calibrated recipe runs its layers on ``device`` over the windows ``calibration`` asks for (dataset,
    samples, seqlen, text_column: :func:`quantkit.quant.apply.calibration_inputs`' options)."""
    from quantkit.checkpoint.atomic import check_output
    from quantkit.model.memory_plan import meta_model
    from quantkit.model.walk import iter_linears

    out = out.absolute()
    check_output(out, force)
    folder = source_folder(model_ref)
    src = SourceTensors(folder)
    model = meta_model(str(folder), load_dtype)  # the dtype an ordinary pack loads in (the calibration runs in it)
    if rec.kv is not None:
        from quantkit.quant.kv import check_fits

        check_fits(model, rec.kv)
    if plan_obj is not None:
        from quantkit.search.plan_check import check_plan_model

        check_plan_model(plan_obj, model, "the plan")
    linears = {n: lin for n, lin in iter_linears(model) if not rec.spec_for(n).skip}
    for pattern in rec.unmatched_overrides(name for name, _ in iter_linears(model)):
        warn(f"recipe override '{pattern}' matches no linear layer of '{model_ref}' and changes nothing")
    groups, aliases = _groups(model)
    src.map_names(model.config.model_type, [k for keys in groups.values() for k in keys])
    _check_names(groups, src)
    calibrated = rec.uses_calibration
    calib_options = None
    if calibrated:  # as they take effect, so --calib-samples 128 and the recipe's 128 resume each other
        from quantkit.model.loader import max_positions
        from quantkit.quant.apply import calibration_options

        calib_options = calibration_options(rec, max_positions(model), **(calibration or {}))
    partial = partial_dir(out)
    state = _open_partial(partial, _settings(src, model_ref, info, max_bytes, load_dtype, calib_options, device),
                          resume, force, warn)
    ctx = progress_factory("quantize and write layers", len(groups)) if progress_factory else None
    update = ctx.__enter__() if ctx else None

    def finish(group: str, tensors: dict, lin_entries: dict, bits: list, said: list, extra: dict | None = None):
        from quantkit.checkpoint.writer import tensor_entries

        files = _write_group(partial, group, tensors, max_bytes)
        state["groups"][group] = {"tensors": tensor_entries(tensors, lin_entries), "files": files,
                                  "linears": lin_entries, "bits": bits, "warnings": said, **(extra or {})}
        _write_json_atomic(partial / PROGRESS_NAME, state)
        if update:
            update(len(state["groups"]), len(groups))

    try:
        if REST not in state["groups"]:
            said: list[str] = []
            finish(REST, *_pack_group(groups[REST], lambda k: src.read_as(k, load_dtype), {}, target, said.append,
                                      source_dtype), said)
        if calibrated:
            calib_info = _stream_calibrated(model, rec, plan_obj, linears, groups, src, partial, state, finish,
                                            target, load_dtype, source_dtype, device, calib_options, folder)
        else:
            calib_info = None
            _stream_data_free(rec, plan_obj, linears, groups, src, state, finish, target, load_dtype, source_dtype)
    finally:
        if ctx:
            ctx.__exit__(None, None, None)
    return _finalize(out, force, partial, state, groups, aliases, model, info, calib_info, source_dtype, folder,
                     warn)


def _stream_data_free(rec, plan_obj, linears, groups, src, state, finish, target, load_dtype, source_dtype) -> None:
    """The decoder layers of a data-free recipe: each weight quantized as it is read."""
    from quantkit.quant.apply import _row_bits_for, _rows_quantizer
    from quantkit.quant.partition import quantize_partitioned

    for g, keys in groups.items():
        if g == REST or g in state["groups"]:
            continue
        records = {}
        for key in keys:
            name = key[:-len(".weight")]
            if key.endswith(".weight") and name in linears:
                rb = _row_bits_for(plan_obj, name, linears[name], rec.spec_for(name).bits)
                weight = src.read_as(key, load_dtype).float()
                records[name] = quantize_partitioned(weight, rb, _rows_quantizer(rec, name))
        said: list[str] = []
        finish(g, *_pack_group(keys, lambda k: src.read_as(k, load_dtype), records, target, said.append,
                               source_dtype, fp8_token_activations(rec)), said)


@torch.no_grad()
def _stream_calibrated(model, rec, plan_obj, linears, groups, src, partial, state, finish, target, load_dtype,
                       source_dtype, device, calib_options, folder) -> dict:
    """The decoder layers of a calibrated recipe (module docstring); returns the manifest's calibration record."""
    from quantkit.model.layerwise import LayerBatch, capture_layer_inputs, layer_output
    from quantkit.model.loader import load_tokenizer_of, max_positions
    from quantkit.model.walk import find_decoder_layers
    from quantkit.quant.apply import LayerQuantizer, calibration_batch_size, calibration_inputs, expert_calibration

    path, layers = find_decoder_layers(model)
    tokenizer = load_tokenizer_of(str(folder), "calibration")
    ids, calib_info = calibration_inputs(tokenizer, rec, max_positions(model), calib_options["dataset"],
                                         calib_options["samples"], calib_options["seqlen"],
                                         calib_options.get("text_column"))
    step = LayerQuantizer(rec, plan_obj, linears, rec.weight.method)
    todo = [i for i in range(len(layers)) if str(i) not in state["groups"]]
    if todo:
        first = todo[0]
        saved = partial / f"inputs-{first:05d}.pt"
        if first == 0:
            _materialize(model, groups[REST], src, load_dtype)
            model.tie_weights()  # a tied LM head follows its embedding
            try:
                batches = capture_layer_inputs(model, ids, device, calibration_batch_size(ids.shape[1]))
            finally:
                _release(model, groups[REST])
                model.tie_weights()
        elif saved.is_file():
            batches = torch.load(saved, map_location=device, weights_only=False)
        else:
            raise QuantkitError(f"'{partial}' lacks the inputs of layer {first} ({saved.name}); remove that folder to "
                                "start over")
        for i in todo:
            g, prefix = str(i), f"{path}.{i}"
            _materialize(model, groups[g], src, load_dtype)
            layer = layers[i]
            layer.to(device)
            given = step(i, prefix, layer, batches)
            batches = given if isinstance(given, list) else [LayerBatch(layer_output(layer, b), b.kwargs)
                                                             for b in batches]
            layer.to("cpu")
            records = {n: step.records.pop(n) for n in list(step.records) if n.startswith(prefix + ".")}
            coverage = {n: [c.tolist(), need] for n, (c, need) in step.coverage.items() if n.startswith(prefix + ".")}
            current = dict(model.state_dict())
            said: list[str] = []
            packed = _pack_group(groups[g], lambda k: current[k].detach().to("cpu"), records, target, said.append,
                                 source_dtype, fp8_token_activations(rec))
            if i + 1 < len(layers):
                _save_atomic(batches, partial / f"inputs-{i + 1:05d}.pt")
            finish(g, *packed, said, {"coverage": coverage})
            (partial / f"inputs-{i:05d}.pt").unlink(missing_ok=True)
            del current, packed
            _release(model, groups[g])
    coverage = {n: (torch.tensor(c), need) for g in groups if g != REST
                for n, (c, need) in state["groups"][g].get("coverage", {}).items()}
    if coverage:
        calib_info.update(expert_calibration(coverage, rec.weight.method))
    return calib_info


def _finalize(out: Path, force: bool, partial: Path, state: dict, groups: dict, aliases: dict, model, info: dict,
              calib_info: dict | None, source_dtype: torch.dtype, folder: Path, warn: Callable[[str], None]) -> dict:
    """Link the finished groups' files into the checkpoint under their final names, write the index, config,
    manifest and tokenizer, replace ``out`` atomically and remove the partial folder; returns the manifest."""
    from quantkit.checkpoint.atomic import MANIFEST_NAME, atomic_directory
    from quantkit.checkpoint.manifest import FORMAT
    from quantkit.checkpoint.shards import INDEX_NAME, shard_names, shard_record, write_json
    from quantkit.checkpoint.writer import quantization_config, tokenizer_files

    said: set[str] = set()
    for g in groups:  # a layout fallback is said once, not once per layer
        for w in state["groups"][g].get("warnings", []):
            if w not in said:
                said.add(w)
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
    info = {**info, "calibration": calib_info, "avg_bits": total / max(elems, 1)}
    manifest = {"format": FORMAT, "format_version": 1, **info, "linears": all_linears, "tensors": entries,
                "aliases": dict(aliases)}
    config = model.config
    config.dtype = source_dtype
    config.quantization_config = quantization_config("quantkit", all_linears, info, 1)
    with atomic_directory(out, force) as tmp:  # the shards are links: little new space
        for (g, fname), final_name in final.items():
            try:
                os.link(partial / fname, tmp / final_name)  # the partial copy stays until the checkpoint is in place
            except OSError:
                shutil.copyfile(partial / fname, tmp / final_name)
        write_json(tmp / INDEX_NAME, {"metadata": {"total_size": sum(e["nbytes"] for e in entries.values())},
                                      "weight_map": {n: e["shard"] for n, e in entries.items()}})
        manifest["shards"] = {f: shard_record(tmp / f) for f in sorted(final.values())}
        config.save_pretrained(tmp)
        for name, path in tokenizer_files(str(folder)).items():
            shutil.copyfile(path, tmp / name)
        write_json(tmp / MANIFEST_NAME, manifest)
    shutil.rmtree(partial, ignore_errors=True)
    return manifest
