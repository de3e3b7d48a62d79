"""quantkit.bench: the byte/op counting and roofline arithmetic, L2-defeating copy counts, the report table and
the CLI's refusals run on CPU; a tiny real benchmark runs on a GPU (marked gpu)."""

from __future__ import annotations

import os

import pytest
import torch

from quantkit.bench.report import format_table
from quantkit.bench.roofline import Ceilings, gemm_flops, roofline_row, tensor_bytes, traffic_bytes
from quantkit.bench.timing import copies_to_defeat_l2
from quantkit.errors import QuantkitError

CEIL = Ceilings(hbm_bytes_per_s=3e12, fp16_flops=750e12, int8_ops=950e12, device="test")


def test_gemm_counts_and_traffic():
    assert gemm_flops(1, 14336, 4096) == 2 * 14336 * 4096
    assert tensor_bytes({"a": torch.zeros(3, 4, dtype=torch.int32), "b": torch.zeros(5, dtype=torch.float16)}) == 58
    # weight once + fp16 activations [M, K] + fp16 output [M, N]
    assert traffic_bytes(1000, 2, 8, 16, 2.0) == 1000 + 2 * 8 * 2 + 2 * 16 * 2


def test_roofline_row_memory_bound_and_compute_bound():
    mem = roofline_row(ms=0.010, flops=2 * 14336 * 4096, nbytes=30_000_000, ceilings=CEIL, int8=False)
    assert mem["gbps"] == pytest.approx(3000.0) and mem["pct_hbm"] == pytest.approx(100.0)
    assert mem["roofline_ms"] == pytest.approx(0.010) and mem["pct_roofline"] == pytest.approx(100.0)
    comp = roofline_row(ms=1.0, flops=int(950e9), nbytes=1000, ceilings=CEIL, int8=True)
    assert comp["tflops"] == pytest.approx(950.0) and comp["pct_peak"] == pytest.approx(100.0)
    assert comp["roofline_ms"] == pytest.approx(1.0)


def test_rotation_copies_exceed_l2():
    l2 = 50 * 2 ** 20
    for per_call in (2 ** 20, 30 * 2 ** 20, 200 * 2 ** 20):
        copies = copies_to_defeat_l2(per_call, l2_bytes=l2)
        assert copies >= 2 and (copies * per_call >= 2 * l2 or copies == 16)


def test_report_table_lists_rows_and_skips():
    rows = [{"method": "w4a16", "m": 1, "n": 8, "k": 256, "ms": 0.01, "tflops": 1.0, "gbps": 10.0, "pct_hbm": 1.0,
             "pct_peak": 0.1, "speedup_vs_fp16": 2.0},
            {"method": "int_mm", "m": 1, "n": 8, "k": 256, "skipped": "torch._int_mm needs M > 16"}]
    text = format_table(rows)
    assert "w4a16 | 1 | 8 | 256 | 0.0100" in text and "2.00" in text
    assert "skipped: torch._int_mm needs M > 16" in text
    assert text.splitlines()[0].startswith("method | m")  # rows without ceilings: no header line
    run = {"device": "H100", "hbm_tbps": 2.98, "fp16_peak_tflops": 759.0, "int8_peak_tops": 905.0}
    rows[0].update(run, gemv_pdl=True)
    assert format_table(rows).splitlines()[0] == ("H100: HBM 2.98 TB/s, fp16 759 TFLOP/s, int8 905 TOP/s (measured in "
                                                  "this run); decode GEMVs: programmatic dependent launch on")
    rows.append({**rows[0], "gemv_pdl": False})
    assert format_table(rows).splitlines()[0].endswith("launch on, then off")
    rows[0].update(int8_peak_tops=1431.0, int_mm_peak_tops=905.0, fp8_peak_tops=1431.0)  # a run with fp8 GEMMs
    assert format_table(rows).splitlines()[0].startswith("H100: HBM 2.98 TB/s, fp16 759 TFLOP/s, 8-bit 1431 TOP/s "
                                                         "[cuBLAS int8 905, fp8 1431] (measured in this run)")


def test_the_8bit_ceiling_is_the_faster_of_int8_and_fp8():
    from quantkit.bench.roofline import eight_bit_ceiling

    assert eight_bit_ceiling(905e12, None) == 905e12  # no fp8 tensor cores (A100): cuBLAS int8 alone
    assert eight_bit_ceiling(905e12, 1431e12) == 1431e12
    assert eight_bit_ceiling(1200e12, 1000e12) == 1200e12
    # a fused int8 kernel at 969.8 TOP/s (LiquidQuant 4096×14336 M = 4096) is below the 8-bit ceiling
    ceil = Ceilings(3e12, 750e12, eight_bit_ceiling(905e12, 1431e12), "test", 905e12, 1431e12)
    assert roofline_row(1.0, int(969.8e9), 1000, ceil, int8=True)["pct_peak"] == pytest.approx(100 * 969.8 / 1431)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only refusal")
def test_bench_refuses_without_a_gpu_and_cli_reports_it(capsys):
    from quantkit.bench.__main__ import main
    from quantkit.bench.runner import run_bench

    with pytest.raises(QuantkitError, match="need a CUDA GPU"):
        run_bench([(8, 256)], [1], ["w4a16"])
    assert main(["--shapes", "8x256", "--ms", "1", "--methods", "w4a16"]) == 2
    assert "need a CUDA GPU" in capsys.readouterr().out
    assert main(["--methods", "w4a17"]) == 2
    assert "unknown --methods" in capsys.readouterr().out
    assert main(["--shapes", "8by256"]) == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_run_bench_on_gpu():
    from quantkit.bench.runner import run_bench

    rows = run_bench([(1024, 512)], [1, 32], ["w4a16", "w4a8-lqq", "mixed+aq", "int_mm", "fp8"], ceilings=CEIL,
                     reps=5)
    timed = [r for r in rows if "ms" in r]
    assert {r["method"] for r in timed} >= {"w4a16", "w4a8-lqq", "mixed+aq"}
    assert all(r["ms"] > 0 and r["speedup_vs_fp16"] > 0 for r in timed)
    assert any(r.get("skipped") for r in rows if r["method"] == "int_mm" and r["m"] == 1)
    fp8 = {r["m"]: r for r in rows if r["method"] == "fp8"}
    if torch.cuda.get_device_capability() >= (8, 9):  # fp8 tensor cores: timed where cuBLAS takes the shape
        assert "ms" in fp8[32] and fp8[32]["speedup_vs_fp16"] > 0
        assert "ms" in fp8[1] or "torch._scaled_mm fp8 cannot run M=1" in fp8[1]["skipped"]
    else:
        assert all("sm_89" in r["skipped"] for r in fp8.values())
    hopper = torch.cuda.get_device_capability() >= (9, 0) and os.environ.get("QUANTKIT_PDL", "1") != "0"
    assert {r["gemv_pdl"] for r in timed} == {hopper}  # the timed rows say whether the GEMVs' calls could overlap


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_shapes_a_method_cannot_run_are_skipped_rows_not_tracebacks():
    """Odd N and K (cuBLAS int8 wants multiples of 8) and a one-row layer (mixed has no 4-bit partition) give
    ``skipped`` rows with the reason; the quantkit kernels time them."""
    from quantkit.bench.runner import run_bench

    rows = run_bench([(100, 260), (1, 256)], [32], ["int_mm", "mixed", "w4a16"], ceilings=CEIL, reps=3)
    by = {(r["method"], r["n"]): r for r in rows}
    assert "torch._int_mm cannot run M=32, N=100, K=260" in by["int_mm", 100]["skipped"]
    assert by["mixed", 1]["skipped"] == "mixed needs N >= 2 (a 4-bit and an 8-bit partition), got N=1"
    assert "ms" in by["mixed", 100] and "ms" in by["w4a16", 100] and "ms" in by["w4a16", 1]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_measured_8bit_ceiling_is_the_faster_of_cublas_int8_and_fp8():
    from quantkit.bench.roofline import fp8_matmul, fp8_matmul_supported, measure_ceilings

    c = measure_ceilings()
    assert c.int_mm_ops > 0 and c.fp16_flops > 0 and c.hbm_bytes_per_s > 0
    if fp8_matmul_supported():
        assert c.fp8_ops > 0 and c.int8_ops == max(c.int_mm_ops, c.fp8_ops)
        a, b = torch.randn(64, 256, device="cuda"), torch.randn(128, 256, device="cuda")
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn)
        want = a8.float() @ b8.float().t()
        got = fp8_matmul(a8, b8.t(), torch.ones((), device="cuda")).float()
        # the product of the e4m3 values; Hopper's fp8 tensor cores add with fewer bits than fp32, hence the slack
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2 * want.abs().max().item())
    else:
        assert c.fp8_ops is None and c.int8_ops == c.int_mm_ops


def test_time_problem_refuses_kernel_options_it_does_not_know():
    from quantkit.bench.runner import time_problem

    with pytest.raises(ValueError, match="unknown kernel options"):
        time_problem("w4a16", 1, 64, 256, dequantize=True)  # a typo would silently time the default path


def test_decode_step_table_title_says_how_the_gemvs_launched():
    from rich.console import Console

    from quantkit.bench.report import decode_step_table

    row = {"layer": 0, "context": 1024, "recipe": "rtn-w4a16-g128", "device": "H100", "graph": True, "batch": 1,
           "fp16_us": 294.8, "packed_us": 155.9, "speedup": 1.89, "max_rel_diff": 1.6e-3}

    def title(r):
        console = Console(record=True, width=100)
        console.print(decode_step_table([r]))
        return " ".join(console.export_text().split("batch")[0].split())  # the title, however it wrapped
    assert "programmatic dependent launch" in title({**row, "gemv_pdl": True})
    assert "programmatic" not in title({**row, "gemv_pdl": False})
    fused = title({**row, "fused_gemms": 2, "fused_norms": 2})
    assert "2 fused projection GEMMs" in fused and "2 quantkit RMSNorms" in fused
    assert "fused" not in title({**row, "fused_gemms": 0, "fused_norms": 0})
