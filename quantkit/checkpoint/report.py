"""Summaries of a packed checkpoint for ``quantkit pack`` and ``quantkit inspect``: layers, bit-width histogram
(weight elements per bit-width), layouts with the scheme each runs (the ``w4a16`` layout of an A8 checkpoint runs
W4A8), average bits, and size on disk against the FP16 model."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rich.table import Table

from quantkit.checkpoint.manifest import linear_activation, read_manifest


def summarize(folder: str | Path, manifest: dict | None = None) -> dict:
    """A JSON-serialisable summary of the checkpoint at ``folder``: source, recipe, export/target, linears,
    bits histogram (share of quantized weight elements), layouts (partitions per layout), average bits (codes
    only, and with scales/zeros/indices as stored), bytes on disk (all files) and of the FP16 model."""
    folder = Path(folder).expanduser()
    manifest = manifest or read_manifest(folder)
    elems: Counter = Counter()
    layouts: Counter = Counter()
    schemes: Counter = Counter()
    for lin in manifest["linears"].values():
        lin_act_bits = (linear_activation(lin, manifest) or {}).get("bits")
        for p in lin["partitions"]:
            elems[int(p["bits"])] += int(p["n_rows"]) * int(lin["in_features"])
            layouts[p["layout"]] += 1
            fp8 = bool((p.get("meta") or {}).get("fp8"))
            schemes[(p["layout"], ("FP8 " if fp8 else "") + scheme(int(p["bits"]), lin_act_bits))] += 1
    total = sum(elems.values()) or 1
    quant_bytes = sum(e["nbytes"] for e in manifest["tensors"].values() if "linear" in e)
    disk = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    fp16 = int(manifest["source"].get("parameters", 0)) * 2
    return {"path": str(folder), "source": manifest["source"].get("model"), "recipe": manifest["recipe"]["name"],
            "export": manifest["export"],
            "target": manifest["target"] if manifest["export"] == "quantkit" else None,  # engine formats have none
            "plan_sha256": manifest.get("plan_sha256"),
            "format_version": manifest["format_version"], "linears": len(manifest["linears"]),
            "bits_histogram": {str(b): elems[b] / total for b in sorted(elems)},
            "layouts": dict(sorted(layouts.items())),
            "layout_schemes": {f"{layout} {sch}": n for (layout, sch), n in sorted(schemes.items())},
            "activation_bits": (manifest.get("activation") or {}).get("bits"),
            "activation_fp8": bool((manifest.get("activation") or {}).get("fp8")),
            "online_rotations": sum("input_rotation" in lin for lin in manifest["linears"].values()),
            "kv": (manifest["recipe"].get("kv") or None),
            "avg_bits": sum(b * n for b, n in elems.items()) / total,
            "avg_bits_stored": 8 * quant_bytes / total,
            "tensors": len(manifest["tensors"]),
            "shards": len({e["shard"] for e in manifest["tensors"].values()}),
            "bytes_on_disk": disk, "bytes_fp16": fp16}


def scheme(weight_bits: int, activation_bits: int | None) -> str:
    """The W/A scheme a partition runs: ``W4A16`` (weights only), ``W4A8`` (activations quantized too)."""
    a = activation_bits if activation_bits is not None and activation_bits < 16 else 16
    return f"W{weight_bits}A{a}"


def layout_label(layout: str, sch: str) -> str:
    """A layout with the scheme it runs where its name does not say it: the ``w4a16`` weight layout in an A8
    checkpoint is ``w4a16 (runs W4A8)``; ``w4a8-lqq`` and a ``w4a16`` A16 layout are their own name."""
    if layout.lower().startswith(sch.lower()):
        return layout
    return f"{layout} (runs {sch})"


def _mb(n: int) -> str:
    return f"{n / 1e6:,.2f} MB"


def summary_table(s: dict, title: str | None = None) -> Table:
    """A two-column rich table of :func:`summarize`'s result."""
    t = Table(title=title or f"packed checkpoint — {s['path']}", show_header=False)
    t.add_column("field", style="bold")
    t.add_column("value")
    hist = ", ".join(f"{b}-bit {share:.1%}" for b, share in s["bits_histogram"].items())
    t.add_row("source", str(s["source"]))
    act = f" (activations {'FP8 ' if s.get('activation_fp8') else ''}A{s['activation_bits']})"
    t.add_row("recipe", s["recipe"] + (act if s["activation_bits"] else ""))
    if s.get("target") is None:  # an engine format (gptq, awq): its own layout, no quantkit kernel target
        t.add_row("format", s["export"])
    else:
        t.add_row("format / target", f"{s['export']} / {s['target']}")
    t.add_row("plan sha256", s["plan_sha256"] or "none")
    t.add_row("quantized linears", str(s["linears"]))
    t.add_row("bits histogram", hist)
    if s.get("online_rotations"):
        t.add_row("online rotation", f"inputs of {s['online_rotations']} linears rotated at run time (QuaRot)")
    if s.get("kv"):
        kv = s["kv"]
        t.add_row("KV cache", "fp8 (e4m3)" if kv.get("fp8") else f"int{kv['bits']}"
                  + (f", groups of {kv['group_size']}, latest {kv['residual']} tokens fp16" if kv["bits"] == 4 else ""))
    if "layout_schemes" in s:
        labels = [(layout_label(*k.split(" ", 1)), n) for k, n in s["layout_schemes"].items()]
    else:
        labels = list(s["layouts"].items())
    t.add_row("layouts", ", ".join(f"{k} ×{v}" for k, v in labels))
    t.add_row("average bits", f"{s['avg_bits']:.3f} (stored with scales/zeros: {s['avg_bits_stored']:.3f})")
    share = f" ({s['bytes_on_disk'] / s['bytes_fp16']:.1%} of FP16)" if s["bytes_fp16"] else ""
    t.add_row("size on disk", f"{_mb(s['bytes_on_disk'])} vs FP16 {_mb(s['bytes_fp16'])}{share}")
    t.add_row("tensors / shards", f"{s['tensors']} in {s['shards']} shard(s)")
    return t
