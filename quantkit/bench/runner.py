"""``run_bench``: time methods × shapes × token counts against ceilings measured in the same run, with the
speedup over torch fp16 (cuBLAS)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from quantkit.bench.problems import build_problem
from quantkit.bench.roofline import Ceilings, gemm_flops, measure_ceilings, roofline_row, traffic_bytes
from quantkit.bench.timing import time_rotating
from quantkit.errors import QuantkitError
from quantkit.runtime.kernels.triton.launch import TileConfig
from quantkit.runtime.kernels.cuda.common import pdl_supported


def _require_cuda() -> None:
    if not torch.cuda.is_available():
        raise QuantkitError("kernel benchmarks need a CUDA GPU (none is visible); run them on a GPU machine")


def time_problem(method: str, m: int, n: int, k: int, config: TileConfig | None = None, reps: int = 50,
                 use_graph: bool = True, **state) -> tuple[dict, object]:
    """(timing dict of :func:`quantkit.bench.timing.time_rotating`, the Problem) of one method at one size;
    ``state``: the problem's kernel options besides ``config`` (``dequant``, ``launches``, ``bn_b``; see
    :func:`quantkit.bench.problems.build_problem`)."""
    unknown = set(state) - {"dequant", "launches", "bn_b"}
    if unknown:
        raise ValueError(f"unknown kernel options {sorted(unknown)}")
    prob = build_problem(method, m, n, k, config)
    prob.state.update(state)
    return time_rotating(prob.fn, prob.inputs, reps=reps, use_graph=use_graph), prob


def run_bench(shapes: Iterable[tuple[int, int]], ms: Sequence[int], methods: Sequence[str],
              ceilings: Ceilings | None = None, configs: dict | None = None, reps: int = 50) -> list[dict]:
    """One row per (method, N, K, M): median ms, TFLOP/s, GB/s, % of measured HBM bandwidth and matmul ceiling
    (fp16's, or for 8-bit operands the faster of cuBLAS's int8 and fp8 GEMMs: :class:`.roofline.Ceilings`),
    % of the roofline floor, and ``speedup_vs_fp16`` (the fp16 method is always timed as the baseline).
    ``shapes`` are (N, K) = (out_features, in_features); ``configs`` optionally maps (method, M, N, K) to a
    TileConfig. Methods that cannot run a size (torch._int_mm with M <= 16) get a row with ``skipped``. ``gemv_pdl``:
    whether this device launched the CUDA decode GEMVs with programmatic dependent launch when the row was timed —
    for the rows of methods that run one (quantkit's kernels at decode sizes), back-to-back calls in the timed
    graph overlapped (:mod:`quantkit.runtime.kernels.cuda.common`; ``QUANTKIT_PDL=0`` times them in isolation)."""
    _require_cuda()
    ceilings = ceilings or measure_ceilings()
    rows = []
    for n, k in shapes:
        for m in ms:
            base_ms = None
            for method in ["fp16"] + [x for x in methods if x != "fp16"]:
                cfg = (configs or {}).get((method, m, n, k))
                row = {"method": method, "m": m, "n": n, "k": k, "device": ceilings.device,
                       "hbm_tbps": ceilings.hbm_bytes_per_s / 1e12, "fp16_peak_tflops": ceilings.fp16_flops / 1e12,
                       "int8_peak_tops": ceilings.int8_ops / 1e12}
                if ceilings.int_mm_ops is not None:  # what the 8-bit ceiling was the faster of
                    row["int_mm_peak_tops"] = ceilings.int_mm_ops / 1e12
                if ceilings.fp8_ops is not None:
                    row["fp8_peak_tops"] = ceilings.fp8_ops / 1e12
                try:
                    timing, prob = time_problem(method, m, n, k, cfg, reps)
                except QuantkitError as e:
                    rows.append({**row, "skipped": str(e)})
                    continue
                if method == "act-quant":  # reads fp16 [M, K], writes int8 codes and fp32 g128 scales
                    nbytes, flops = m * k * 3 + m * (-(-k // 128)) * 4, 0
                else:
                    nbytes = traffic_bytes(prob.weight_bytes, m, k, n, prob.act_bytes_per_elem)
                    flops = gemm_flops(m, n, k)
                row.update(timing)
                row["gemv_pdl"] = pdl_supported(torch.cuda.current_device())  # after the calls: they may turn it off
                row.update(roofline_row(timing["ms"], flops, nbytes, ceilings, prob.int8))
                row["bytes"] = nbytes
                if cfg is not None:
                    row["config"] = cfg.to_dict()
                if method == "fp16":
                    base_ms = timing["ms"]
                row["speedup_vs_fp16"] = base_ms / timing["ms"] if base_ms else None
                if method in methods:
                    rows.append(row)
                del prob
                torch.cuda.empty_cache()
    return rows

