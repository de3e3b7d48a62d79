"""What the docs/bench sweep scripts share: their JSON log, rewritten after every row (so a run cut short keeps
what it measured), and the one-line summary of their bit-exactness checks."""

from __future__ import annotations

import json

import torch


def save_sweep(path: str, rows: list, checks: list) -> None:
    """Write {device, checks, rows, unit "us"} to ``path`` (the current CUDA device's name)."""
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "checks": checks, "rows": rows, "unit": "us"}, f, indent=1)


def record_check(checks: list, entry: dict, got: torch.Tensor, want: torch.Tensor) -> None:
    """Append ``entry`` with ``equal_triton`` (``got`` bit for bit ``want``) to ``checks``; print it if not equal."""
    checks.append({**entry, "equal_triton": bool(torch.equal(got, want))})
    if not checks[-1]["equal_triton"]:
        print("MISMATCH", json.dumps(checks[-1]), flush=True)


def print_checks(checks: list) -> None:
    """Print how many of ``checks`` (dicts with ``equal_triton``) were bit-identical."""
    print("checks:", sum(c["equal_triton"] for c in checks), "of", len(checks), "bit-identical", flush=True)


def log_row(path: str, rows: list, row: dict, quiet: tuple = ()) -> None:
    """Print ``row`` (floats to 3 decimals, keys in ``quiet`` left out), append it to ``rows`` and rewrite ``path``
    (:func:`save_sweep`, no separate checks: the A/B scripts keep theirs in each row)."""
    print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if k not in quiet}),
          flush=True)
    rows.append(row)
    save_sweep(path, rows, [])
