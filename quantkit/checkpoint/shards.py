"""Sharded safetensors files as HuggingFace writes them: ``model-0000i-of-0000n.safetensors`` split by a maximum
shard size, plus ``model.safetensors.index.json`` ({"metadata": {"total_size"}, "weight_map": name → file}).
Also the byte-level sha256 of a tensor, which the manifest records and ``--verify`` recomputes."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from quantkit.errors import QuantkitError

INDEX_NAME = "model.safetensors.index.json"
_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
          "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40}


def parse_size(text: str | int) -> int:
    """Bytes of a size such as "500MB", "2GB", "1.5GiB" or 1048576 (decimal units as HF's max_shard_size,
    binary ones with "iB"); QuantkitError for anything else."""
    if isinstance(text, int) and not isinstance(text, bool):
        size = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(text).upper())
        if m is None or m.group(2) not in _UNITS:
            raise QuantkitError(f"--max-shard-size '{text}' is not a size; use e.g. 500MB, 2GB or 1.5GiB")
        size = int(float(m.group(1)) * _UNITS[m.group(2)])
    if size < 1:
        raise QuantkitError(f"--max-shard-size must be positive, got '{text}'")
    return size


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The bytes safetensors stores for ``t``: contiguous, little-endian (the host order of every platform torch
    ships for), in its own dtype."""
    flat = t.detach().contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).cpu().numpy())


def tensor_sha256(t: torch.Tensor) -> str:
    """sha256 hex digest of :func:`tensor_bytes` of ``t``."""
    return hashlib.sha256(tensor_bytes(t)).hexdigest()


def nbytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s data as stored (elements × element size)."""
    return t.numel() * t.element_size()


def shard_names(n: int) -> list[str]:
    """HF shard file names for ``n`` shards: model-00001-of-0000n.safetensors …"""
    return [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]


def plan_shards(sizes: Iterable[tuple[str, int]], max_bytes: int) -> list[list[str]]:
    """Greedy split of (name, bytes) in order into shards of at most ``max_bytes`` each; a tensor larger than the
    limit gets a shard of its own (as HF save_pretrained does)."""
    shards: list[list[str]] = []
    current: list[str] = []
    used = 0
    for name, size in sizes:
        if current and used + size > max_bytes:
            shards.append(current)
            current, used = [], 0
        current.append(name)
        used += size
    if current or not shards:
        shards.append(current)
    return shards


def write_shards(folder: Path, tensors: dict[str, torch.Tensor], max_bytes: int,
                 progress: Callable[[int, int], None] | None = None) -> dict[str, str]:
    """Write ``tensors`` (insertion order) as sharded safetensors + index into ``folder``; returns name → file."""
    from safetensors.torch import save_file

    groups = plan_shards(((n, nbytes(t)) for n, t in tensors.items()), max_bytes)
    files = shard_names(len(groups))
    mode = 0o666 & ~current_umask()
    weight_map: dict[str, str] = {}
    for i, (names, fname) in enumerate(zip(groups, files)):
        save_file({n: tensors[n].detach().contiguous().cpu() for n in names}, folder / fname,
                  metadata={"format": "pt"})
        os.chmod(folder / fname, mode)  # safetensors creates 0600; shards are read by whoever serves the model
        weight_map.update({n: fname for n in names})
        if progress is not None:
            progress(i + 1, len(files))
    index = {"metadata": {"total_size": sum(nbytes(t) for t in tensors.values())}, "weight_map": weight_map}
    write_json(folder / INDEX_NAME, index)
    return weight_map


def current_umask() -> int:
    """The process umask (read by setting and restoring it; Python has no getter)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_json(path: Path, obj: dict) -> None:
    """Write ``obj`` as indented JSON (sorted keys: same inputs, same bytes)."""
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def _shard_error(path: Path, e: Exception) -> QuantkitError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return QuantkitError(f"shard '{path.name}' of checkpoint '{path.parent}' is corrupt ({first}); "
                         "re-run `quantkit pack` or copy the checkpoint again")


def check_shard(path: Path, expected: dict[str, dict]) -> None:
    """Check that shard ``path`` exists and holds every tensor of ``expected`` (name → manifest entry) with the
    manifest's shape; QuantkitError naming the problem. (Truncation: :func:`quantkit.model.loader.
    check_safetensors_files`, which the reader runs over the folder first.)"""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        first = next(iter(expected), "?")
        raise QuantkitError(f"shard '{path.name}' of checkpoint '{path.parent}' is missing (it holds '{first}' "
                            f"and {len(expected) - 1} more); re-run `quantkit pack` or copy the checkpoint again")
    try:
        with safe_open(str(path), framework="pt") as f:
            have = set(f.keys())
            for name, entry in expected.items():
                if name not in have:
                    raise QuantkitError(f"tensor '{name}' is missing from shard '{path.name}'; the checkpoint "
                                        "does not match its manifest (re-run `quantkit pack`)")
                sl = f.get_slice(name)
                shape = list(sl.get_shape())
                if shape != list(entry["shape"]):
                    raise QuantkitError(f"tensor '{name}' in shard '{path.name}' has shape {shape}, the manifest "
                                        f"says {entry['shape']}; re-run `quantkit pack`")
    except SafetensorError as e:
        raise _shard_error(path, e) from None


def read_shard(path: Path, names: Iterable[str]) -> dict[str, torch.Tensor]:
    """Tensors ``names`` of one shard (CPU); QuantkitError naming the shard when safetensors cannot read it."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {n: f.get_tensor(n) for n in names}
    except SafetensorError as e:
        raise _shard_error(path, e) from None
