"""Host time per call of a packed linear on the GPU: the Python and launch work that eager decoding pays for each
layer (transformers' own ``generate`` loop runs host-bound at decode sizes), beside ``nn.Linear``'s.

    python benchmarks/host_overhead.py [--shape 6144x4096] [--m 1,16] [--calls 300]

One JSON line per (layer kind, M): the mean host µs of ``calls`` back-to-back calls after 20 untimed ones (the time
until the last call returns, before the GPU finishes) and the wall µs including the GPU. Layer kinds: ``fp16``
(``nn.Linear``), ``act-quant`` (the per-token A8 quantizer alone), ``w4a16``, ``w4a8-lqq``, ``w8a8-ch`` (each a
QuantLinear of random weights packed for the kernels).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from quantkit.formats import get_layout
from quantkit.quant import grid
from quantkit.quant.lqq import lqq_quantize
from quantkit.runtime import ActQuant, PackedPart, QuantLinear, dispatch


def host_us(fn, x: torch.Tensor, calls: int) -> tuple[float, float]:
    """(host µs, wall µs) per call of ``fn(x)``, the mean of ``calls`` calls after 20 untimed ones."""
    with torch.no_grad():
        for _ in range(20):
            fn(x)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn(x)
        host = time.perf_counter() - start
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    return host / calls * 1e6, wall / calls * 1e6


def packed_linear(layout: str, n: int, k: int) -> QuantLinear:
    """A QuantLinear of a random [n, k] weight quantized and packed for ``layout`` on the GPU."""
    w = torch.randn(n, k) * 0.05
    if layout == "w4a8-lqq":
        qw, act = lqq_quantize(w, 128), ActQuant(8, -1)
    elif layout == "w8":
        qw, act = grid.quantize(w, 8, -1, sym=True), ActQuant(8, -1)
    else:
        qw, act = grid.quantize(w, 4, 128), None
    lay = get_layout(layout)
    return QuantLinear(k, n, [PackedPart(layout, lay.layout_meta(qw), lay.pack(qw), None, qw.bits)], act=act).cuda()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="6144x4096", help="NxK of the layer")
    parser.add_argument("--m", default="1,16", help="token counts, comma-separated")
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("host_overhead.py times GPU launches: no CUDA device here")
    n, k = (int(v) for v in args.shape.lower().split("x"))
    dispatch.load_kernel_modules()
    from quantkit.runtime.kernels.triton.act_quant import quantize_activation_triton

    layers = {"fp16": torch.nn.Linear(k, n, bias=False, dtype=torch.float16, device="cuda"),
              "act-quant": lambda x: quantize_activation_triton(x, 8, -1),
              "w4a16": packed_linear("w4a16", n, k), "w4a8-lqq": packed_linear("w4a8-lqq", n, k),
              "w8a8-ch": packed_linear("w8", n, k)}
    for m in (int(v) for v in args.m.split(",")):
        x = torch.randn(m, k, dtype=torch.float16, device="cuda")
        for name, fn in layers.items():
            host, wall = host_us(fn, x, args.calls)
            print(json.dumps({"layer": name, "n": n, "k": k, "m": m, "host_us": round(host, 1),
                              "wall_us": round(wall, 1), "device": torch.cuda.get_device_name()}), flush=True)


if __name__ == "__main__":
    main()
