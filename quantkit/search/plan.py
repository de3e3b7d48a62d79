"""The precision plan: which output channel of which linear gets which bit-width (docs/plan-format.md).

A plan is the output of ``quantkit search`` (MixLLM Sec. 3.2, Algorithm 1) and the input of ``pack`` and
``eval-ppl --plan``. It names the model it was made for, how, and per linear the channel indices of every
bit-width other than the default. Writing is deterministic (same inputs ⇒ same bytes) and atomic.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn

from quantkit.errors import QuantkitError
from quantkit.model.walk import iter_linears
from quantkit.search.identity import model_identity, sig
from quantkit.search.salience import linear_weight

SCHEMA = "quantkit.plan"
VERSION = 1


@dataclass
class LayerPlan:
    """One linear: its shape, the sorted channel indices of each non-default width, stats, a weight probe."""

    name: str
    out_features: int
    in_features: int
    channels: dict[int, list[int]]
    stats: dict[str, float]
    probe: list[float]

    def row_bits(self, default_bits: int) -> torch.Tensor:
        """Bit-width of each output channel, int64 [out_features]."""
        out = torch.full((self.out_features,), default_bits, dtype=torch.int64)
        for b, idx in self.channels.items():
            out[torch.tensor(idx, dtype=torch.int64)] = b
        return out

    def to_dict(self) -> dict:
        return {"name": self.name, "out_features": self.out_features, "in_features": self.in_features,
                "channels": {str(b): idx for b, idx in sorted(self.channels.items())},
                "stats": self.stats, "probe": self.probe}


@dataclass
class Plan:
    """A parsed precision plan (schema version :data:`VERSION`)."""

    model: dict  # name, model_type, config, config_sha256, weights_sha256
    calibration: dict | None  # source, samples, seqlen, seed, tokens; None when no data was used
    search: dict  # strategy, first_order, salience quantizer, seed
    bits: list[int]
    default_bits: int
    target_bits: float | None
    fractions: list[float] | None
    achieved_bits: float
    achieved_bits_with_metadata: float
    layers: dict[str, LayerPlan] = field(default_factory=dict)  # model order
    version: int = VERSION

    def layer(self, name: str) -> LayerPlan:
        """The plan of one linear; a QuantkitError when the plan does not cover it."""
        if name not in self.layers:
            raise QuantkitError(f"the plan has no entry for layer '{name}'; re-run `quantkit search` for this model")
        return self.layers[name]

    def row_bits(self, name: str) -> torch.Tensor:
        """Bit-width of each output channel of linear ``name``, int64 [N]."""
        return self.layer(name).row_bits(self.default_bits)

    def partitions(self, name: str) -> dict[int, torch.Tensor]:
        """Sorted output-channel indices per bit-width (every width with at least one channel) — the row sets
        of MixLLM's per-precision sub-GEMMs (Sec. 3.4)."""
        rb = self.row_bits(name)
        return {int(b): torch.nonzero(rb == b).flatten() for b in torch.unique(rb).tolist()}

    def element_shares(self) -> dict[int, float]:
        """Fraction of all planned weight elements at each bit-width."""
        counts = {b: 0 for b in self.bits}
        for lp in self.layers.values():
            hi = sum(len(v) for v in lp.channels.values())
            counts[self.default_bits] += (lp.out_features - hi) * lp.in_features
            for b, idx in lp.channels.items():
                counts[b] += len(idx) * lp.in_features
        total = sum(counts.values()) or 1
        return {b: c / total for b, c in sorted(counts.items())}

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, "version": self.version, "model": self.model, "calibration": self.calibration,
                "search": self.search, "bits": self.bits, "default_bits": self.default_bits,
                "target_bits": self.target_bits, "fractions": self.fractions, "achieved_bits": self.achieved_bits,
                "achieved_bits_with_metadata": self.achieved_bits_with_metadata,
                "layers": [lp.to_dict() for lp in self.layers.values()]}

    def to_json(self) -> str:
        """Canonical text: sorted keys, one line per layer (index lists stay compact), trailing newline."""
        d = self.to_dict()
        layers = d.pop("layers")
        head = json.dumps(d, sort_keys=True, indent=1)
        rows = ",\n".join("  " + json.dumps(lp, sort_keys=True, separators=(",", ":")) for lp in layers)
        return head[:-2] + ',\n "layers": [\n' + rows + "\n ]\n}\n"

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically: a temporary file in the same folder, fsync, then rename over ``path``."""
        path = Path(path)
        if not path.parent.is_dir():
            raise QuantkitError(f"cannot write plan '{path}': folder '{path.parent}' does not exist")
        text = self.to_json()
        # a plain open (not mkstemp) so the file gets the usual umask permissions
        tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise QuantkitError(f"cannot write plan '{path}': {e.strerror or e}") from None
        return path


def build_plan(model: nn.Module, name: str, row_bits: dict[str, torch.Tensor], scores: dict[str, torch.Tensor], *,
               bits: list[int], target_bits: float | None, fractions: list[float] | None, achieved_bits: float,
               achieved_bits_with_metadata: float, calibration: dict | None, search: dict) -> Plan:
    """Assemble a :class:`Plan` from an allocation (bits per channel) and the scores that ranked it.

    The default width is the one held by the most channels (ties → the lower width), so the stored index lists
    are the short ones. Per-layer stats: mean/max score and the share of channels above the default width.
    """
    ident, probes = model_identity(model, name)
    counts = {b: 0 for b in bits}
    for rb in row_bits.values():
        for b in bits:
            counts[b] += int((rb == b).sum())
    default = max(sorted(bits), key=lambda b: counts[b])
    in_features = {n: linear_weight(lin).shape[1] for n, lin in iter_linears(model)}
    layers = {}
    for n, rb in row_bits.items():
        s = scores[n].double()
        channels = {b: torch.nonzero(rb == b).flatten().tolist() for b in sorted(bits) if b != default}
        stats = {"score_mean": sig(s.mean()), "score_max": sig(s.max()),
                 "high_bit_share": sig((rb > default).double().mean())}
        layers[n] = LayerPlan(n, rb.numel(), int(in_features[n]), {b: v for b, v in channels.items() if v},
                              stats, probes[n])
    return Plan(model=ident, calibration=calibration, search=search, bits=sorted(bits), default_bits=default,
                target_bits=None if target_bits is None else sig(target_bits),
                fractions=None if fractions is None else [sig(f) for f in fractions],
                achieved_bits=sig(achieved_bits, 8), achieved_bits_with_metadata=sig(achieved_bits_with_metadata, 8),
                layers=layers)
