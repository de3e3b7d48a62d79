"""Timing GPU work honestly (the rules docs/BENCHMARKS.md states for every number in it):

* CUDA events around the timed region, never host clocks;
* warm-up calls first (compilation, autotuning, handle creation stay out);
* the median of many repetitions;
* rotating inputs: several copies of every operand, cycled so that the bytes touched between two uses of the
  same copy exceed the L2 cache — a 29 MB 4-bit weight would otherwise be served from the 50 MB L2 and flatter
  a memory-bound kernel;
* CUDA graphs for small problems: one graph replays ``calls`` launches, so CPU launch overhead (several µs,
  comparable to a decode-size GEMV) is not charged to the kernel.

:func:`time_host` is the CPU counterpart (host clock, same warm-up/median rules) for work that runs on the CPU.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch


def copies_to_defeat_l2(bytes_per_call: int, l2_bytes: int | None = None, factor: float = 2.0,
                        cap: int = 16) -> int:
    """How many input copies to rotate so that one cycle touches ``factor`` × L2 bytes (at least 2, at most
    ``cap``)."""
    if l2_bytes is None:
        l2_bytes = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    need = int(factor * l2_bytes / max(bytes_per_call, 1)) + 1
    return max(2, min(cap, need))


def time_rotating(fn: Callable, inputs: Sequence[tuple], warmup: int = 10, reps: int = 50,
                  use_graph: bool = True, calls_per_graph: int | None = None) -> dict:
    """Median time of one call ``fn(*inputs[i])`` (milliseconds), cycling through ``inputs``.

    With ``use_graph`` each timed sample is one replay of a CUDA graph holding ``calls_per_graph`` calls
    (default: one full rotation, at least 8) and the sample is divided by that count; otherwise each sample is
    one eager call. Returns {"ms": median, "ms_p10", "ms_p90", "samples", "graph"}.
    """
    n_in = len(inputs)
    for i in range(warmup):
        fn(*inputs[i % n_in])
    torch.cuda.synchronize()
    samples: list[float] = []
    if use_graph:
        calls = calls_per_graph or max(8, n_in)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # graph capture must not run on the legacy default stream
            for i in range(calls):
                fn(*inputs[i % n_in])
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                fn(*inputs[i % n_in])
        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / calls)
    else:
        for r in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*inputs[r % n_in])
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
    return _summary(samples, use_graph)


def time_abba(calls: dict[str, Callable], inputs: Sequence[tuple], reps: int) -> dict[str, list[float]]:
    """Per name of ``calls``, ``reps`` timings in µs (:func:`time_rotating`'s median each) after an untimed warm-up
    timing of every call, taken in ABBA order — the calls in order, then reversed, … — so that a machine's drift
    hits every call alike and none always runs first."""
    for fn in calls.values():
        time_rotating(fn, inputs, reps=5)
    names = list(calls)
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            times[name].append(time_rotating(calls[name], inputs)["ms"] * 1e3)
    return times


def _summary(samples: list[float], graph: bool) -> dict:
    samples = sorted(samples)
    return {"ms": statistics.median(samples), "ms_p10": samples[len(samples) // 10],
            "ms_p90": samples[(9 * len(samples)) // 10], "samples": len(samples), "graph": graph}


def time_host(fn: Callable, inputs: Sequence[tuple], warmup: int = 3, reps: int = 20) -> dict:
    """Median wall time of one call ``fn(*inputs[i])`` on the CPU (milliseconds, ``time.perf_counter``), cycling
    through ``inputs`` after ``warmup`` untimed calls; the same dict as :func:`time_rotating` (``graph`` False)."""
    n_in = len(inputs)
    for i in range(warmup):
        fn(*inputs[i % n_in])
    samples = []
    for r in range(reps):
        t0 = time.perf_counter()
        fn(*inputs[r % n_in])
        samples.append((time.perf_counter() - t0) * 1e3)
    return _summary(samples, False)
