"""Tuned launch tables: for a GPU, an operation and its weight layouts, the (kernel, launch config) that
``quantkit tune`` measured fastest at each (N, K, M) it timed.

One JSON file per device name and operation: ``<device>/<op>-<layouts>-act<group>.json``, holding the device's
name, capability and SM count, the commit, command and date of the tune run, and its entries. The registry
(:func:`.registry.plan`) tries a table's choice ahead of the priority list when the problem's device, operation,
layouts, activation group, N and K match an entry; M takes the entry tuned at the smallest M at or above it, and
above the largest tuned M the launch rules decide. Tables are read from ``$QUANTKIT_TABLES`` (default
``~/.cache/quantkit/tables``, where ``quantkit tune`` writes) and then from the ones shipped in this package; a
user's table for a (device, operation, N, K) replaces the shipped one.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

SHIPPED_DIR = Path(__file__).with_name("tuned")
ENV_DIR = "QUANTKIT_TABLES"
SCHEMA = "quantkit.launch-table"
VERSION = 1


def user_dir() -> Path:
    """Where ``quantkit tune`` writes and the registry looks first: ``$QUANTKIT_TABLES`` or
    ``~/.cache/quantkit/tables``."""
    return Path(os.environ.get(ENV_DIR) or Path.home() / ".cache" / "quantkit" / "tables").expanduser()


def device_slug(name: str) -> str:
    """A device name as a folder name: ``NVIDIA H100 80GB HBM3`` → ``NVIDIA_H100_80GB_HBM3``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_") or "unknown"


def table_name(op: str, layouts: tuple[str, ...], act_group: int) -> str:
    """The file name of an operation's table, e.g. ``a8-w4a8-lqq-act-1.json`` (``a8_mixed-w4a16_w8-act128.json``)."""
    return f"{op}-{'_'.join(layouts)}-act{act_group}.json"


def _valid(e) -> bool:
    return (isinstance(e, dict) and all(isinstance(e.get(f), int) and e[f] > 0 for f in ("n", "k", "m"))
            and isinstance(e.get("kernel"), str))


def _read(path: Path) -> list[dict]:
    """The well-formed entries of a table file ([] for a missing, unreadable or foreign file)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or data.get("version") != VERSION:
        return []
    entries = data.get("entries", [])
    return [e for e in entries if _valid(e)] if isinstance(entries, list) else []


@functools.lru_cache(maxsize=256)
def _entries(device: str, op: str, layouts: tuple[str, ...], act_group: int,
             user: Path) -> dict[tuple[int, int], list[dict]]:
    """(N, K) → entries sorted by M, the ``user`` folder's table replacing the shipped one per (N, K)."""
    out: dict[tuple[int, int], list[dict]] = {}
    name = table_name(op, layouts, act_group)
    for folder in (SHIPPED_DIR, user):  # later folders replace earlier ones per (N, K)
        by_shape: dict[tuple[int, int], list[dict]] = {}
        for e in _read(folder / device_slug(device) / name):
            by_shape.setdefault((int(e["n"]), int(e["k"])), []).append(e)
        out.update({s: sorted(v, key=lambda e: int(e["m"])) for s, v in by_shape.items()})
    return out


_GENERATION = [0]  # bumped whenever tables may have changed: part of the registry's plan-cache key


def generation() -> int:
    """A counter that changes whenever the tables read so far were forgotten (the registry re-plans then)."""
    return _GENERATION[0]


def clear_cache() -> None:
    """Forget the tables read so far (after ``quantkit tune`` wrote one, or in tests)."""
    _entries.cache_clear()
    _GENERATION[0] += 1


def lookup(p) -> dict | None:
    """The table entry for problem ``p`` (:class:`.registry.GemmProblem`), or None (module docstring)."""
    if not p.device:
        return None
    entries = _entries(p.device, p.op, p.layouts, p.act_group, user_dir()).get((p.n, p.k))
    if not entries:
        return None
    for e in entries:  # the entry tuned at the smallest M at or above p.m; beyond the tuned range the rules decide
        if int(e["m"]) >= p.m:
            return e
    return None


def write_table(folder: Path, device: str, capability: tuple[int, int], sms: int, op: str,
                layouts: tuple[str, ...], act_group: int, entries: list[dict], command: str, commit: str,
                date: str) -> Path:
    """Write (merge into) the table of ``device``/``op``/``layouts`` under ``folder``: entries of the same (N, K, M)
    are replaced. Written to a temporary file and renamed, so a reader never sees half a table."""
    path = Path(folder) / device_slug(device) / table_name(op, layouts, act_group)
    old = {(e["n"], e["k"], e["m"]): e for e in _read(path)}
    old.update({(e["n"], e["k"], e["m"]): e for e in entries})
    data = {"schema": SCHEMA, "version": VERSION, "device": device, "capability": list(capability), "sms": sms,
            "op": op, "layouts": list(layouts), "act_group": act_group, "commit": commit, "command": command,
            "date": date, "entries": sorted(old.values(), key=lambda e: (e["n"], e["k"], e["m"]))}
    replace_table(path, data)
    return path


def replace_table(path: Path, data: dict) -> None:
    """Write a launch table's JSON to a temporary file beside ``path`` and rename it over ``path`` (a reader never
    sees half a table), then forget the tables read so far."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    clear_cache()
