"""Tables of benchmark rows: plain text for kernel sweeps (what docs/BENCHMARKS.md pastes), rich for the decode
step of :mod:`quantkit.bench.decode_step`."""

from __future__ import annotations

from rich.table import Table

COLUMNS = (("method", "{}"), ("m", "{}"), ("n", "{}"), ("k", "{}"), ("ms", "{:.4f}"), ("tflops", "{:.1f}"),
           ("gbps", "{:.0f}"), ("pct_hbm", "{:.0f}"), ("pct_peak", "{:.0f}"), ("speedup_vs_fp16", "{:.2f}"))


def run_header(rows: list[dict]) -> str | None:
    """One line on what the rows were measured against: the device, the ceilings measured in the same run (the
    8-bit one with the int8 and fp8 GEMMs it is the faster of, where the rows carry both), and
    whether the CUDA decode GEMVs launched with programmatic dependent launch (their back-to-back calls in the timed
    graph then overlap); None without timed rows that carry the ceilings."""
    timed = [r for r in rows if "ms" in r and "hbm_tbps" in r]
    if not timed:
        return None
    r = timed[0]
    pdl = {t.get("gemv_pdl") for t in timed} - {None}
    launch = ("" if not pdl else "; decode GEMVs: programmatic dependent launch "
              + ("on" if pdl == {True} else "off" if pdl == {False} else "on, then off"))
    eight = f"int8 {r['int8_peak_tops']:.0f} TOP/s"
    if r.get("fp8_peak_tops") is not None and r.get("int_mm_peak_tops") is not None:
        eight = (f"8-bit {r['int8_peak_tops']:.0f} TOP/s [cuBLAS int8 {r['int_mm_peak_tops']:.0f}, fp8 "
                 f"{r['fp8_peak_tops']:.0f}]")
    return (f"{r['device']}: HBM {r['hbm_tbps']:.2f} TB/s, fp16 {r['fp16_peak_tflops']:.0f} TFLOP/s, {eight} "
            f"(measured in this run){launch}")


def format_table(rows: list[dict]) -> str:
    """A fixed-width table, one line per row, under :func:`run_header`; skipped rows show their reason."""
    head = " | ".join(name for name, _ in COLUMNS)
    first = run_header(rows)
    lines = ([first] if first else []) + [head, "-" * len(head)]
    for r in rows:
        if "skipped" in r:
            lines.append(f"{r['method']} | {r['m']} | {r['n']} | {r['k']} | skipped: {r['skipped']}")
            continue
        cells = []
        for name, fmt in COLUMNS:
            v = r.get(name)
            cells.append("-" if v is None else fmt.format(v))
        lines.append(" | ".join(cells))
    return "\n".join(lines)


def decode_step_table(rows: list[dict]) -> Table:
    """One line per batch size: FP16-layer and packed-layer µs per decode step, speedup, max relative output
    difference (:func:`quantkit.bench.decode_step.max_rel_diff`)."""
    first = rows[0] if rows else {}
    t = Table(title=f"decode step — layer {first.get('layer')}, KV cache {first.get('context')} tokens, "
                    f"{first.get('recipe')} on {first.get('device')}"
                    + ("" if first.get("graph", True) else " (no CUDA graph)")
                    + (", decode GEMVs with programmatic dependent launch" if first.get("gemv_pdl") else "")
                    + (f", {first['fused_gemms']} fused projection GEMMs" if first.get("fused_gemms") else "")
                    + (f", {first['fused_norms']} quantkit RMSNorms" if first.get("fused_norms") else "")
                    + (" — CPU: the torch reference path, a check of the mode, not kernel timings"
                       if first.get("device") == "cpu" else ""))
    for name in ("batch", "fp16 layer µs", "packed layer µs", "speedup", "max rel diff"):
        t.add_column(name, justify="right")
    for r in rows:
        t.add_row(str(r["batch"]), f"{r['fp16_us']:.1f}", f"{r['packed_us']:.1f}", f"{r['speedup']:.2f}×",
                  f"{r['max_rel_diff']:.2e}")
    return t
