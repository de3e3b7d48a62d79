"""Loading a HuggingFace causal LM from a local directory, the hub, or the embedded reference model.

Every user mistake (missing path, a folder without config.json, a truncated weight file, a model that is not a
supported causal LM) becomes a one-line :class:`QuantkitError`.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from quantkit.errors import QuantkitError

BUILTIN_PREFIX = "builtin:"
BUILTIN_MODELS = {"reference": "reference-model"}
DTYPES = {"fp32": torch.float32, "float32": torch.float32, "fp16": torch.float16, "float16": torch.float16,
          "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}


@dataclass
class LoadedModel:
    """A loaded causal LM with its tokenizer, where it came from, and where it runs."""

    model: torch.nn.Module
    tokenizer: object
    source: str  # what the user typed
    path: str  # resolved local dir or hub id
    device: str
    dtype: torch.dtype


def builtin_model_dir(name: str = "reference") -> Path:
    """Directory of an embedded model shipped inside the package (``builtin:reference``)."""
    if name not in BUILTIN_MODELS:
        raise QuantkitError(f"unknown built-in model '{name}'; available: "
                            + ", ".join(BUILTIN_PREFIX + k for k in BUILTIN_MODELS))
    path = Path(__file__).resolve().parent.parent / "assets" / BUILTIN_MODELS[name]
    if not (path / "config.json").is_file():
        raise QuantkitError(f"the built-in model is missing from this install ({path}); reinstall quantkit")
    return path


def check_not_builtin_name(output: str, option: str = "-o") -> None:
    """Refuse an output path that reads as a built-in model name (``builtin:reference``): that name always means
    the embedded model, so a folder or file written under it could never be read back by the same name."""
    if os.path.normpath(output).startswith(BUILTIN_PREFIX):
        raise QuantkitError(f"{option} '{output}' is a built-in model name, which always means the model shipped "
                            "with quantkit; choose another output path")


def resolve_device(device: str = "auto") -> str:
    """'auto' → 'cuda' when a GPU is visible, else 'cpu'; 'cuda'/'cuda:N'/'cpu' are checked."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise QuantkitError(f"--device {device} asked for, but no CUDA GPU is visible; use --device cpu")
        return device
    if device == "cpu":
        return device
    raise QuantkitError(f"unknown device '{device}'; use cpu, cuda, cuda:N or auto")


def resolve_dtype(dtype: str | None, device: str, config_dtype: object = None) -> torch.dtype:
    """The compute dtype: as asked, else fp32 on CPU and the checkpoint's fp16/bf16 (fp16 if unknown) on GPU."""
    if dtype is not None and dtype != "auto":
        if dtype not in DTYPES:
            raise QuantkitError(f"unknown dtype '{dtype}'; use fp32, fp16 or bf16")
        return DTYPES[dtype]
    if not device.startswith("cuda"):
        return torch.float32
    if str(config_dtype).replace("torch.", "") in ("bfloat16", "bf16"):
        return torch.bfloat16
    return torch.float16


def resolve_model_path(name_or_path: str) -> tuple[str, bool]:
    """Map what the user typed to (local dir or hub id, is_local) and check a local dir is a model dir.

    Order: ``builtin:NAME`` is always the embedded model (a folder of that name never shadows it); then an
    existing local path; then a name that can only be a path fails at once ("no such folder"); anything else is a
    hub id, looked up without waiting on huggingface_hub's retries: with the hub off (HF_HUB_OFFLINE) transformers
    reads the local HF cache, with the hub unreachable a cached snapshot folder is used, and with neither the
    error says that the local folder does not exist and the hub could not be reached.
    """
    from quantkit import hub

    if name_or_path.startswith(BUILTIN_PREFIX):
        return str(builtin_model_dir(name_or_path[len(BUILTIN_PREFIX):])), True
    p = Path(name_or_path).expanduser()
    if p.exists():
        return str(_check_model_dir(p, name_or_path)), True
    fix = "pass a HuggingFace model directory, a hub id (org/name) or builtin:reference"
    if hub.looks_like_path(name_or_path) or not hub.is_repo_id(name_or_path):
        raise QuantkitError(f"model path '{name_or_path}' does not exist (no such folder: {p.absolute()}); {fix}")
    missing = f"'{name_or_path}' is not a local folder (no such folder: {p.absolute()})"
    if hub.hub_offline():
        if hub.cached_model_folder(name_or_path) is None:
            raise QuantkitError(f"{missing}, and the hub is off (HF_HUB_OFFLINE) with no copy in the local HF "
                                f"cache; check the path, or fetch the model once with network access")
        return name_or_path, False  # transformers reads the cached copy in offline mode
    reason = hub.hub_unreachable_reason()
    if reason is None:
        return name_or_path, False  # a hub id such as meta-llama/Llama-3.1-8B
    cached = hub.cached_model_folder(name_or_path)
    if cached is not None:
        return str(_check_model_dir(cached, name_or_path)), True
    raise QuantkitError(f"{missing}, and the hub {hub.hub_endpoint()} could not be reached ({reason}); check the "
                        "path, or the network for a hub id")


def _check_model_dir(p: Path, name_or_path: str) -> Path:
    """``p`` when it is a folder holding config.json and whole safetensors files; else a one-line QuantkitError."""
    if not p.is_dir():
        raise QuantkitError(f"model path '{name_or_path}' is a file; pass the directory that holds config.json")
    if not (p / "config.json").is_file():
        raise QuantkitError(f"'{name_or_path}' has no config.json; pass a HuggingFace model directory "
                            "(save_pretrained output)")
    check_safetensors_files(p)
    return p


def check_safetensors_files(folder: Path) -> None:
    """Fail with a one-line error when a .safetensors file is truncated or its header is unreadable.

    A safetensors file is an 8-byte little-endian header length, a JSON header whose tensors carry
    ``data_offsets`` into the byte buffer that follows; the file must be at least as long as the largest offset.
    """
    for f in sorted(folder.glob("*.safetensors")):
        size = f.stat().st_size
        try:
            with open(f, "rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n <= 0 or 8 + n > size:
                    raise ValueError("header runs past the end of the file")
                header = json.loads(fh.read(n))
        except (struct.error, ValueError, UnicodeDecodeError) as e:
            raise QuantkitError(f"weight file '{f}' is truncated or corrupt ({e}); re-download or re-save it") from None
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        if 8 + n + end > size:
            raise QuantkitError(f"weight file '{f}' is truncated ({size} bytes, needs {8 + n + end}); "
                                "re-download or re-save it")


def quiet_hf() -> None:
    """Silence transformers/datasets/hub progress bars and info chatter; quantkit draws its own progress. With
    ``quantkit -v`` their warnings and progress bars stay on."""
    import logging

    from transformers.utils import logging as hf_logging

    from quantkit.ui import verbose

    if verbose():
        hf_logging.set_verbosity_warning()
        hf_logging.enable_progress_bar()
        level = logging.WARNING
    else:
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        level = logging.ERROR
    for name in ("huggingface_hub", "datasets", "filelock", "accelerate"):
        logging.getLogger(name).setLevel(level)


def _config(path: str, is_local: bool):
    from transformers import AutoConfig

    quiet_hf()

    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        where = "local directory" if is_local else "hub (there is no local folder of that name)"
        raise QuantkitError(f"could not read the model config of '{path}' from the {where}: {first}") from None


def load_config(name_or_path: str):
    """The transformers config of a model folder, hub name, ``builtin:`` model or packed checkpoint (its config.json,
    quantization_config and all), or a one-line QuantkitError."""
    path, is_local = resolve_model_path(name_or_path)
    return _config(path, is_local)


def check_not_quantized(config, name_or_path: str) -> None:
    """Refuse a model whose config.json carries a ``quantization_config`` (a quantkit, GPTQ or AWQ checkpoint):
    transformers would load its linears without their quantized weights, at random, or need another engine."""
    qc = getattr(config, "quantization_config", None)
    if not qc:  # absent, null or an empty mapping: nothing quantized
        return
    method = (qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)) or "unknown"
    if str(method) == "quantkit":
        from quantkit.checkpoint.atomic import MANIFEST_NAME

        if Path(name_or_path).expanduser().is_dir() and not (Path(name_or_path).expanduser() / MANIFEST_NAME).exists():
            raise QuantkitError(f"'{name_or_path}' is a packed quantkit checkpoint without its {MANIFEST_NAME} "
                                "manifest (incomplete); copy the whole folder again or re-run `quantkit pack`")
        raise QuantkitError(f"'{name_or_path}' is a packed quantkit checkpoint (already quantized); quantize the "
                            "full-precision model it came from (`quantkit inspect` names it), or evaluate this one "
                            "with `quantkit eval-ppl`")
    raise QuantkitError(f"'{name_or_path}' is already quantized ({method} quantization_config in its config.json); "
                        "quantkit quantizes and evaluates full-precision models and its own packed checkpoints — "
                        f"give the original model, or evaluate this one with an engine that loads {method} "
                        "checkpoints (GPTQModel, AutoAWQ, vLLM)")


def load_model(name_or_path: str, device: str = "auto", dtype: str | None = None,
               device_map: str | dict | None = None, load_tokenizer: bool = True) -> LoadedModel:
    """Load a causal LM and its tokenizer for quantization or evaluation.

    ``device`` is where compute runs; ``device_map`` (e.g. 'auto') hands placement to accelerate for models that
    do not fit one GPU. The model is returned in eval mode.
    """
    from transformers import AutoModelForCausalLM

    from quantkit.model.walk import check_supported

    path, is_local = resolve_model_path(name_or_path)
    dev = resolve_device(device)
    config = _config(path, is_local)
    check_not_quantized(config, name_or_path)
    check_supported(config)
    torch_dtype = resolve_dtype(dtype, dev, getattr(config, "dtype", None))
    kwargs = {"dtype": torch_dtype}
    if device_map is not None:
        kwargs["device_map"] = device_map
    try:
        model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    except (OSError, ValueError, RuntimeError) as e:
        if isinstance(e, torch.cuda.OutOfMemoryError):  # a RuntimeError, but the weights are fine: the CLI's OOM line
            raise
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "size mismatch" in str(e) or "ignore_mismatched_sizes" in str(e):
            msg = "its weights' shapes do not match its config.json (a config from another model size?)"
        raise QuantkitError(f"could not load the weights of '{name_or_path}': {msg}; fix config.json or the "
                            "weight files") from None
    from quantkit.model.moe import unfuse_experts

    unfuse_experts(model)  # MoE: one Linear per expert projection, on the devices its fused weights had
    if device_map is None:
        model.to(dev)
    model.eval()
    tokenizer = load_tokenizer_of(path, f"'{name_or_path}'") if load_tokenizer else None
    return LoadedModel(model, tokenizer, name_or_path, path, dev, torch_dtype)


def load_tokenizer_of(path: str, what: str):
    """The tokenizer saved with a model (``what`` names it in errors), or a one-line QuantkitError saying which files
    to copy. transformers 5 builds an empty tokenizer of the model's family where the folder has no tokenizer files
    (Qwen2's: one token, every text encoded to nothing), so a tokenizer of fewer than two tokens is refused too."""
    from transformers import AutoTokenizer

    fix = ("copy the model's tokenizer files (tokenizer.json / tokenizer.model, tokenizer_config.json) into its "
           "folder")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as e:
        msg = " ".join(str(e).split()).rstrip(": ") or type(e).__name__  # HF's messages run over several lines
        if len(msg) > 200:
            msg = msg[:197] + "..."
        raise QuantkitError(f"could not load the tokenizer of {what} ({msg}); {fix}") from None
    if len(tokenizer) < 2:
        raise QuantkitError(f"the tokenizer of {what} has {len(tokenizer)} token(s): its tokenizer files are missing "
                            f"or empty; {fix}")
    return tokenizer


def max_positions(model) -> int | None:
    """The longest sequence the model's position encoding allows (config.max_position_embeddings)."""
    return getattr(model.config, "max_position_embeddings", None)
