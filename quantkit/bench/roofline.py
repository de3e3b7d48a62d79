"""The two numbers of every GEMM measurement: the fewest bytes it must move and the operations it must do, and
the ceilings they are divided by — measured on the device in the same run, not taken from a datasheet
(MixLLM Sec. 3.5: a quantized GEMM's roofline is its compressed memory traffic against its compute ceiling).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


@dataclass(frozen=True)
class Ceilings:
    """Measured device ceilings: HBM bytes/s (read + written by a device copy), fp16 matmul flop/s, and
    ``int8_ops``, the 8-bit matmul ceiling every int8-operand kernel is held to: the faster of cuBLAS's int8 GEMM
    (``int_mm_ops``, torch._int_mm) and, on GPUs with fp8 tensor cores, its fp8 e4m3 GEMM (``fp8_ops``,
    torch._scaled_mm). Hopper's (and Ada's) datasheet gives int8 and fp8 the same dense rate, but cuBLAS's int8
    kernels run well below it (measured on an H100: 819-963 TOP/s at 8192³ against fp8's 1334-1417), so the int8
    GEMM alone understates what the 8-bit tensor cores do and a fused int8 kernel could show more than 100 % of it.
    The max assumes that equal rate; on a GPU whose fp8 rate is higher than its int8 rate it overstates the int8
    ceiling."""

    hbm_bytes_per_s: float
    fp16_flops: float
    int8_ops: float
    device: str
    int_mm_ops: float | None = None
    fp8_ops: float | None = None

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


def fp8_matmul_supported(device=None) -> bool:
    """Whether torch._scaled_mm can run fp8 e4m3 products on this CUDA device (NVIDIA tensor cores of sm_89 and
    later; ROCm's capability numbers mean something else, and its fp8 is e4m3fnuz)."""
    return (hasattr(torch, "float8_e4m3fn") and torch.version.hip is None
            and torch.cuda.get_device_capability(device) >= (8, 9))


def fp8_matmul(a: torch.Tensor, b_t: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp16 [M, N] = a [M, K] · b_t [K, N] in fp8 e4m3 on cuBLAS (torch._scaled_mm; ``b_t`` column-major, one
    fp32 ``scale`` for both operands): an 8-bit GEMM with no dequantization, the bench's 8-bit ceiling."""
    return torch._scaled_mm(a, b_t, scale_a=scale, scale_b=scale, out_dtype=torch.float16)


def measure_matmul_peaks(size: int = 8192, reps: int = 10) -> tuple[float, float, float | None]:
    """(fp16 flop/s of torch.matmul, int8 op/s of torch._int_mm, fp8 op/s of torch._scaled_mm or None where the
    GPU has no fp8 tensor cores) on random ``size``³ operands."""
    a = torch.randn(size, size, device="cuda", dtype=torch.float16)
    b = torch.randn(size, size, device="cuda", dtype=torch.float16)
    t16 = _median_seconds(lambda: torch.matmul(a, b), reps)
    ai = torch.randint(-127, 128, (size, size), device="cuda", dtype=torch.int8)
    bi = torch.randint(-127, 128, (size, size), device="cuda", dtype=torch.int8).t()  # column-major: cuBLAS fast path
    t8 = _median_seconds(lambda: torch._int_mm(ai, bi), reps)
    ops = gemm_flops(size, size, size)
    fp8 = None
    if fp8_matmul_supported():
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()  # second operand column-major, as cuBLAS
        one = torch.ones((), device="cuda")
        try:
            fp8 = ops / _median_seconds(lambda: fp8_matmul(a8, b8, one), reps)
        except RuntimeError:  # a torch / cuBLAS build without this fp8 GEMM: the int8 ceiling alone, not a failed run
            fp8 = None
    return ops / t16, ops / t8, fp8


def eight_bit_ceiling(int_mm_ops: float, fp8_ops: float | None) -> float:
    """The 8-bit matmul ceiling of :class:`Ceilings`: the faster of the measured int8 and fp8 GEMMs."""
    return int_mm_ops if fp8_ops is None else max(int_mm_ops, fp8_ops)


def measure_ceilings() -> Ceilings:
    """All ceilings of the current device (module docstring, :class:`Ceilings`)."""
    hbm = measure_hbm_bandwidth()
    f16, i8, f8 = measure_matmul_peaks()
    return Ceilings(hbm, f16, eight_bit_ceiling(i8, f8), torch.cuda.get_device_name(), i8, f8)


def roofline_row(ms: float, flops: int, nbytes: int, ceilings: Ceilings, int8: bool) -> dict:
    """TFLOP/s, GB/s, percent of the measured HBM bandwidth and of the matching matmul ceiling, and the
    roofline floor max(bytes / BW, ops / peak) this time is compared against."""
    s = ms / 1e3
    peak = ceilings.int8_ops if int8 else ceilings.fp16_flops
    floor = max(nbytes / ceilings.hbm_bytes_per_s, flops / peak)
    return {"tflops": flops / s / 1e12, "gbps": nbytes / s / 1e9,
            "pct_hbm": 100 * nbytes / s / ceilings.hbm_bytes_per_s, "pct_peak": 100 * flops / s / peak,
            "roofline_ms": floor * 1e3, "pct_roofline": 100 * floor / s}
