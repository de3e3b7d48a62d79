"""Launch configs (cache positions per step, warps, pipeline stages) of the decode-attention kernels
(:mod:`.triton.decode_attention`): the GPU's tuned table where ``quantkit tune --attention`` wrote one, else the
default rule.

A table is ``<device>/attention.json`` in the tables folders of :mod:`.tables` (``$QUANTKIT_TABLES`` first, then the
ones shipped in this package): the device's name, capability and SM count, the commit, command and date of the
tune run, and one entry per (cache form, head size) with the launch that was fastest in the worst case over the
(batch, context) points it timed, and those timings.

Default rule, for devices and head sizes without a table: 64 cache positions per step for the fp16 cache and 128 for
the packed ones (a block's scale loads and dequantization spread over more positions), 4 warps, 3 stages.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import torch

from quantkit.runtime.kernels import tables

FORMS = ("fp16", "kv8", "kv4")
SCHEMA = "quantkit.attention-launch"
VERSION = 1
TABLE_NAME = "attention.json"


def default_launch(form: str) -> tuple[int, int, int]:
    """The default rule's (BLOCK_N, warps, stages) for a cache form (module docstring)."""
    if form not in FORMS:
        raise ValueError(f"unknown cache form '{form}'; one of {', '.join(FORMS)}")
    return (64 if form == "fp16" else 128), 4, 3


def _power_of_two(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0 and x & (x - 1) == 0


def _valid(e) -> bool:
    """A well-formed entry: a known form, an integer head size, BLOCK_N a power of two from 16, warps a power of two
    up to 32, 1-8 stages (anything else was not written by ``quantkit tune``)."""
    if not isinstance(e, dict):
        return False
    launch = e.get("launch")
    return (e.get("form") in FORMS and isinstance(e.get("head_dim"), int) and isinstance(launch, list)
            and len(launch) == 3 and _power_of_two(launch[0]) and launch[0] >= 16 and _power_of_two(launch[1])
            and launch[1] <= 32 and isinstance(launch[2], int) and 1 <= launch[2] <= 8)


def _read(path: Path) -> dict[tuple[str, int], dict]:
    """The well-formed entries of a table file by (form, head size) ({} for a missing, unreadable or foreign file)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("version") != VERSION:
        return {}
    entries = data.get("entries")
    if not isinstance(entries, list):
        return {}
    return {(e["form"], e["head_dim"]): e for e in entries if _valid(e)}


@functools.lru_cache(maxsize=64)
def _table(device: str, user: Path, generation: int) -> dict[tuple[str, int], tuple[int, int, int]]:
    out: dict[tuple[str, int], tuple[int, int, int]] = {}
    for folder in (tables.SHIPPED_DIR, user):  # the user's entries replace the shipped ones
        table = _read(folder / tables.device_slug(device) / TABLE_NAME)
        out.update({key: tuple(e["launch"]) for key, e in table.items()})
    return out


@functools.lru_cache(maxsize=16)
def _device_name(device: torch.device) -> str:
    if device.type != "cuda" or not torch.cuda.is_available():
        return ""
    return torch.cuda.get_device_name(device)


def launch_for(form: str, head_dim: int, device: torch.device | str | None = None,
               device_name: str | None = None) -> tuple[int, int, int]:
    """(BLOCK_N, warps, stages) for cache ``form`` and ``head_dim`` on ``device`` (or the GPU named
    ``device_name``): its table's entry, else :func:`default_launch`. ``QUANTKIT_TUNED_TABLES=0`` ignores tables."""
    from quantkit.runtime.kernels.registry import ENV_TABLES

    name = device_name if device_name is not None else (
        _device_name(torch.device(device)) if device is not None else "")
    if name and os.environ.get(ENV_TABLES) != "0":
        tuned = _table(name, tables.user_dir(), tables.generation()).get((form, int(head_dim)))
        if tuned is not None:
            return tuned
    return default_launch(form)


def write_table(folder: Path, device: str, capability: tuple[int, int], sms: int, entries: list[dict],
                command: str, commit: str, date: str) -> Path:
    """Write (merge into) ``device``'s attention table under ``folder``: entries of the same (form, head size) are
    replaced; written to a temporary file and renamed."""
    path = Path(folder) / tables.device_slug(device) / TABLE_NAME
    old = _read(path)
    old.update({(e["form"], e["head_dim"]): e for e in entries})
    data = {"schema": SCHEMA, "version": VERSION, "device": device, "capability": list(capability), "sms": sms,
            "commit": commit, "command": command, "date": date,
            "entries": sorted(old.values(), key=lambda e: (e["form"], e["head_dim"]))}
    tables.replace_table(path, data)
    return path
