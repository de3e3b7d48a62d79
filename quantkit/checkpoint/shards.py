"""Sharded safetensors files as HuggingFace writes them: ``model-0000i-of-0000n.safetensors`` split by a maximum
shard size, plus ``model.safetensors.index.json`` ({"metadata": {"total_size"}, "weight_map": name → file}).
Also the byte-level sha256 of a tensor, which the manifest records and ``--verify`` recomputes, and the cheap
check of a shard against the manifest (size, header hash and layout) that every load runs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from quantkit.errors import QuantkitError

INDEX_NAME = "model.safetensors.index.json"
SAFETENSORS_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
                      "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
                      "uint16": "U16", "uint32": "U32", "uint64": "U64", "float8_e4m3fn": "F8_E4M3",
                      "float8_e5m2": "F8_E5M2"}  # torch dtype name → safetensors' code
_MAX_HEADER = 100_000_000  # safetensors refuses larger headers
_UNITS = {"": 1, "B": 1, "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12,
          "KIB": 2 ** 10, "MIB": 2 ** 20, "GIB": 2 ** 30, "TIB": 2 ** 40}


def parse_size(text: str | int, option: str = "--max-shard-size") -> int:
    """Bytes of a size such as "500MB", "2GB", "1.5GiB" or 1048576 (decimal units as HF's max_shard_size,
    binary ones with "iB"); QuantkitError naming ``option`` for anything else."""
    if isinstance(text, int) and not isinstance(text, bool):
        size = text
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(text).upper())
        if m is None or m.group(2) not in _UNITS:
            raise QuantkitError(f"{option} '{text}' is not a size; use e.g. 500MB, 2GB or 1.5GiB")
        size = int(float(m.group(1)) * _UNITS[m.group(2)])
    if size < 1:
        raise QuantkitError(f"{option} must be positive, got '{text}'")
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


def _shard_error(path: Path, e: Exception | str) -> QuantkitError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return QuantkitError(f"shard '{path.name}' of checkpoint '{path.parent}' is corrupt ({first}); "
                         "re-run `quantkit pack` or copy the checkpoint again")


def read_header(path: Path) -> tuple[bytes, dict]:
    """(raw bytes of the length prefix and JSON header, the parsed header) of safetensors file ``path``: an 8-byte
    little-endian length n, then n bytes of JSON mapping each tensor to its dtype, shape and ``data_offsets`` into
    the data that follows; QuantkitError naming the shard when that cannot be read."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        prefix = fh.read(8)
        if len(prefix) < 8:
            raise QuantkitError(f"shard '{path.name}' of checkpoint '{path.parent}' is truncated ({size} bytes, "
                                "shorter than its header); re-run `quantkit pack` or copy the checkpoint again")
        (n,) = struct.unpack("<Q", prefix)
        if n > min(size - 8, _MAX_HEADER):
            raise _shard_error(path, f"its header claims {n} bytes, the file has {size}")
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _shard_error(path, f"its header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise _shard_error(path, "its header is not a JSON object")
    return prefix + raw, header


def shard_record(path: Path) -> dict:
    """What the manifest records of a written shard to check it cheaply on load: its size in bytes and the sha256
    of its length prefix and header (which hold every tensor's name, dtype, shape and offsets)."""
    raw, _ = read_header(path)
    return {"bytes": path.stat().st_size, "header_sha256": hashlib.sha256(raw).hexdigest()}


def _fail(path: Path, what: str) -> QuantkitError:
    return QuantkitError(f"shard '{path.name}' of checkpoint '{path.parent}' {what}; re-run `quantkit pack` or "
                         "copy the checkpoint again")


def check_shard(path: Path, expected: dict[str, dict], record: dict | None = None) -> None:
    """Check shard ``path`` against the manifest without reading tensor data: it exists; its header lists exactly
    the tensors of ``expected`` (name → manifest entry) with the manifest's dtype, shape and byte count, laid end to
    end; the file ends where the last one does; its size and header hash equal ``record`` (the manifest's
    ``shards`` entry, absent in older checkpoints). QuantkitError naming the first problem."""
    if not path.is_file():
        first = next(iter(expected), "?")
        raise QuantkitError(f"shard '{path.name}' of checkpoint '{path.parent}' is missing (it holds '{first}' "
                            f"and {len(expected) - 1} more); re-run `quantkit pack` or copy the checkpoint again")
    size = path.stat().st_size
    raw, header = read_header(path)
    header.pop("__metadata__", None)
    spans = []
    for name, entry in expected.items():
        h = header.get(name)
        if not isinstance(h, dict):
            raise QuantkitError(f"tensor '{name}' is missing from shard '{path.name}'; the checkpoint does not match "
                                "its manifest (re-run `quantkit pack`)")
        try:
            dtype, shape, (begin, end) = h["dtype"], [int(d) for d in h["shape"]], h["data_offsets"]
            begin, end = int(begin), int(end)
        except (KeyError, TypeError, ValueError):
            raise _shard_error(path, f"the header entry of '{name}' is malformed") from None
        if shape != list(entry["shape"]):
            raise QuantkitError(f"tensor '{name}' in shard '{path.name}' has shape {shape}, the manifest says "
                                f"{entry['shape']}; re-run `quantkit pack`")
        want = SAFETENSORS_DTYPES.get(entry["dtype"])
        if want is not None and dtype != want:
            raise QuantkitError(f"tensor '{name}' in shard '{path.name}' is {dtype}, the manifest says "
                                f"{entry['dtype']}; re-run `quantkit pack`")
        if "nbytes" in entry and end - begin != entry["nbytes"]:
            raise _shard_error(path, f"'{name}' spans {end - begin} bytes, the manifest says {entry['nbytes']}")
        spans.append((begin, end, name))
    extra = sorted(set(header) - set(expected))
    if extra:
        raise _shard_error(path, f"it holds tensor '{extra[0]}', which the manifest does not place there")
    position = 0
    for begin, end, name in sorted(spans):
        if begin != position or end < begin:
            raise _shard_error(path, f"the data offsets of '{name}' do not follow the tensor before it")
        position = end
    data_end = len(raw) + position
    if size < data_end:
        raise _fail(path, f"is truncated ({size} bytes, its header needs {data_end})")
    if size > data_end:
        raise _fail(path, f"is corrupt ({size - data_end} bytes after the last tensor)")
    if record is not None and size != record.get("bytes"):
        raise _fail(path, f"is not the file written ({size} bytes, the manifest says {record.get('bytes')})")
    if record is not None and hashlib.sha256(raw).hexdigest() != record.get("header_sha256"):
        raise _fail(path, "is corrupt (its header differs from the one written)")


def read_shard(path: Path, names: Iterable[str]) -> dict[str, torch.Tensor]:
    """Tensors ``names`` of one shard (CPU); QuantkitError naming the shard when safetensors cannot read it."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {n: f.get_tensor(n) for n in names}
    except SafetensorError as e:
        raise _shard_error(path, e) from None
