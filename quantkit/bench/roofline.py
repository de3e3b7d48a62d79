"""The two numbers of every GEMM measurement: the fewest bytes it must move and the operations it must do, and
the ceilings they are divided by — measured on the device in the same run, not taken from a datasheet
(MixLLM Sec. 3.5: a quantized GEMM's roofline is its compressed memory traffic against its compute ceiling).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class Ceilings:
    """Measured device ceilings: HBM bytes/s (read + written by a device copy), fp16 and int8 matmul op/s."""

    hbm_bytes_per_s: float
    fp16_flops: float
    int8_ops: float
    device: str

    def to_dict(self) -> dict:
        return asdict(self)


def gemm_flops(m: int, n: int, k: int) -> int:
    """Multiply-adds of an [M, K] × [K, N] product, counted as 2 operations each."""
    return 2 * m * n * k


def tensor_bytes(tensors: dict) -> int:
    """Bytes of a dict of packed tensors (what a weight-streaming kernel must read once)."""
    return int(sum(t.numel() * t.element_size() for t in tensors.values()))


def traffic_bytes(weight_bytes: int, m: int, k: int, n: int, act_bytes_per_elem: float,
                  out_bytes_per_elem: float = 2.0) -> int:
    """Fewest bytes a GEMM moves: the weight once, the activations once, the output once."""
    return int(weight_bytes + m * k * act_bytes_per_elem + m * n * out_bytes_per_elem)


def measure_hbm_bandwidth(nbytes: int = 1 << 30, reps: int = 20) -> float:
    """Device-to-device copy bandwidth, bytes read plus bytes written per second (median of ``reps``)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return 2 * nbytes / times[len(times) // 2]


def _median_seconds(fn, reps: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times.sort()
    return times[len(times) // 2]


def measure_matmul_peaks(size: int = 8192, reps: int = 10) -> tuple[float, float]:
    """(fp16 flop/s of torch.matmul, int8 op/s of torch._int_mm) on random ``size``³ operands."""
    a = torch.randn(size, size, device="cuda", dtype=torch.float16)
    b = torch.randn(size, size, device="cuda", dtype=torch.float16)
    t16 = _median_seconds(lambda: torch.matmul(a, b), reps)
    ai = torch.randint(-127, 128, (size, size), device="cuda", dtype=torch.int8)
    bi = torch.randint(-127, 128, (size, size), device="cuda", dtype=torch.int8).t()  # column-major: cuBLAS fast path
    t8 = _median_seconds(lambda: torch._int_mm(ai, bi), reps)
    return gemm_flops(size, size, size) / t16, gemm_flops(size, size, size) / t8


def measure_ceilings() -> Ceilings:
    """All three ceilings of the current device (module docstring)."""
    hbm = measure_hbm_bandwidth()
    f16, i8 = measure_matmul_peaks()
    return Ceilings(hbm, f16, i8, torch.cuda.get_device_name())


def roofline_row(ms: float, flops: int, nbytes: int, ceilings: Ceilings, int8: bool) -> dict:
    """TFLOP/s, GB/s, percent of the measured HBM bandwidth and of the matching matmul ceiling, and the
    roofline floor max(bytes / BW, ops / peak) this time is compared against."""
    s = ms / 1e3
    peak = ceilings.int8_ops if int8 else ceilings.fp16_flops
    floor = max(nbytes / ceilings.hbm_bytes_per_s, flops / peak)
    return {"tflops": flops / s / 1e12, "gbps": nbytes / s / 1e9,
            "pct_hbm": 100 * nbytes / s / ceilings.hbm_bytes_per_s, "pct_peak": 100 * flops / s / peak,
            "roofline_ms": floor * 1e3, "pct_roofline": 100 * floor / s}
