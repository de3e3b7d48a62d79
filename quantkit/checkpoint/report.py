"""Summaries of a packed checkpoint for ``quantkit pack`` and ``quantkit inspect``: layers, bit-width histogram
(weight elements per bit-width), layouts, average bits, and size on disk against the FP16 model."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rich.table import Table

from quantkit.checkpoint.manifest import read_manifest


def summarize(folder: str | Path, manifest: dict | None = None) -> dict:
    """A JSON-serialisable summary of the checkpoint at ``folder``: source, recipe, export/target, linears,
    bits histogram (share of quantized weight elements), layouts (partitions per layout), average bits (codes
    only, and with scales/zeros/indices as stored), bytes on disk (all files) and of the FP16 model."""
    folder = Path(folder).expanduser()
    manifest = manifest or read_manifest(folder)
    elems: Counter = Counter()
    layouts: Counter = Counter()
    for lin in manifest["linears"].values():
        for p in lin["partitions"]:
            elems[int(p["bits"])] += int(p["n_rows"]) * int(lin["in_features"])
            layouts[p["layout"]] += 1
    total = sum(elems.values()) or 1
    quant_bytes = sum(e["nbytes"] for e in manifest["tensors"].values() if "linear" in e)
    disk = sum(f.stat().st_size for f in folder.iterdir() if f.is_file())
    fp16 = int(manifest["source"].get("parameters", 0)) * 2
    return {"path": str(folder), "source": manifest["source"].get("model"), "recipe": manifest["recipe"]["name"],
            "export": manifest["export"], "target": manifest["target"], "plan_sha256": manifest.get("plan_sha256"),
            "format_version": manifest["format_version"], "linears": len(manifest["linears"]),
            "bits_histogram": {str(b): elems[b] / total for b in sorted(elems)},
            "layouts": dict(sorted(layouts.items())),
            "activation_bits": (manifest.get("activation") or {}).get("bits"),
            "avg_bits": sum(b * n for b, n in elems.items()) / total,
            "avg_bits_stored": 8 * quant_bytes / total,
            "tensors": len(manifest["tensors"]),
            "shards": len({e["shard"] for e in manifest["tensors"].values()}),
            "bytes_on_disk": disk, "bytes_fp16": fp16}


def _mb(n: int) -> str:
    return f"{n / 1e6:,.2f} MB"


def summary_table(s: dict, title: str | None = None) -> Table:
    """A two-column rich table of :func:`summarize`'s result."""
    t = Table(title=title or f"packed checkpoint — {s['path']}", show_header=False)
    t.add_column("field", style="bold")
    t.add_column("value")
    hist = ", ".join(f"{b}-bit {share:.1%}" for b, share in s["bits_histogram"].items())
    t.add_row("source", str(s["source"]))
    t.add_row("recipe", s["recipe"] + (f" (activations A{s['activation_bits']})" if s["activation_bits"] else ""))
    t.add_row("format / target", f"{s['export']} / {s['target']}")
    t.add_row("plan sha256", s["plan_sha256"] or "none")
    t.add_row("quantized linears", str(s["linears"]))
    t.add_row("bits histogram", hist)
    t.add_row("layouts", ", ".join(f"{k} ×{v}" for k, v in s["layouts"].items()))
    t.add_row("average bits", f"{s['avg_bits']:.3f} (stored with scales/zeros: {s['avg_bits_stored']:.3f})")
    share = f" ({s['bytes_on_disk'] / s['bytes_fp16']:.1%} of FP16)" if s["bytes_fp16"] else ""
    t.add_row("size on disk", f"{_mb(s['bytes_on_disk'])} vs FP16 {_mb(s['bytes_fp16'])}{share}")
    t.add_row("tensors / shards", f"{s['tensors']} in {s['shards']} shard(s)")
    return t
