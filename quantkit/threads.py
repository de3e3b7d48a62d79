"""CPU threads for torch's kernels, set once before torch starts its thread pools.

torch's OpenMP threads spin while they wait for work (OMP_WAIT_POLICY=ACTIVE behaviour). When another job
shares the cores, the spinning threads of both take turns on them and each job runs many times slower than its
share: a 300-GEMM loop on 2 cores ran 14x its idle time beside a second 2-thread job, and 2.5x with passive
waiting (``docs/BENCHMARKS.md``, "CPU threads"). So ``import quantkit`` makes waiting threads sleep (before torch
starts them), and the command line lets the user choose the thread count (``--threads`` or
``QUANTKIT_THREADS``; default: torch's, one per core).
"""

from __future__ import annotations

import os
import sys

from quantkit.errors import QuantkitError

ENV = "QUANTKIT_THREADS"


def parse_threads(value: str | int | None, where: str = ENV) -> int | None:
    """A thread count from an option or ``QUANTKIT_THREADS``: a positive integer, or None when unset/empty."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n < 1:
        raise QuantkitError(f"{where} must be a positive number of threads, got {value!r}; e.g. {where}=2")
    return n


def prefer_sleeping_threads() -> None:
    """Make idle OpenMP threads sleep instead of spin, unless the user set ``OMP_WAIT_POLICY``; effective when
    torch has not started its thread pools yet (``import quantkit`` calls it, before torch is imported)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def configure_cpu_threads(threads: int | None = None) -> int | None:
    """:func:`prefer_sleeping_threads`, and use ``threads`` CPU threads (else ``QUANTKIT_THREADS``, else torch's
    default). The thread count takes effect before or after torch is imported. Returns the count set, or None."""
    prefer_sleeping_threads()
    n = threads if threads is not None else parse_threads(os.environ.get(ENV))
    if n is None:
        return None
    torch = sys.modules.get("torch")
    if torch is None:  # the pools read these when they start
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(n)
    else:
        torch.set_num_threads(n)
    return n
