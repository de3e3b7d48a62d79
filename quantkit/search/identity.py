"""Model identity recorded in a plan (docs/plan-format.md "Model identity"): the parsed config minus bookkeeping
keys, and a probe of each linear's weights that survives a change of load dtype (fp32/fp16/bf16)."""

from __future__ import annotations

import hashlib
import json

import torch
import torch.nn as nn

from quantkit.model.walk import iter_linears
from quantkit.search.salience import linear_weight

PROBE_POINTS = 16
# A re-saved checkpoint, another load dtype or transformers version changes these keys but not the model.
_CONFIG_BOOKKEEPING = {"_name_or_path", "architectures", "dtype", "torch_dtype", "transformers_version", "use_cache",
                       "output_attentions", "output_hidden_states", "return_dict", "id2label", "label2id",
                       "problem_type", "chunk_size_feed_forward", "is_encoder_decoder"}
# bf16 keeps 8 mantissa bits (relative step 2^-8 ≈ 0.4%): a probe read at another dtype must still match.
PROBE_RTOL = 1e-2


def sig(x: float, digits: int = 6) -> float:
    """A float rounded to ``digits`` significant digits, so the JSON text does not depend on last-bit noise."""
    x = float(x)
    if x != x or x in (float("inf"), float("-inf")):
        raise ValueError(f"non-finite value {x} in a plan")
    return float(f"{x:.{digits}g}")


def identity_config(model: nn.Module) -> dict:
    """The model config as transformers parses it, minus bookkeeping keys (what the plan's config hash covers)."""
    d = model.config.to_dict()
    out = {k: v for k, v in d.items() if k not in _CONFIG_BOOKKEEPING and not k.startswith("_")}
    return json.loads(json.dumps(out, sort_keys=True, default=str))


def weight_probe(w: torch.Tensor, points: int = PROBE_POINTS) -> list[float]:
    """``points`` weight values at evenly spaced flat positions (0 … numel−1), 4 significant digits."""
    flat = w.detach().reshape(-1)
    idx = torch.linspace(0, flat.numel() - 1, points, dtype=torch.float64).round().long()
    return [sig(v, 4) for v in flat[idx.to(flat.device)].float().cpu().tolist()]


def _sha256(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def model_identity(model: nn.Module, name: str) -> tuple[dict, dict[str, list[float]]]:
    """(model section of a plan, weight probe per linear) — see docs/plan-format.md "Model identity"."""
    config = identity_config(model)
    probes = {n: weight_probe(linear_weight(lin)) for n, lin in iter_linears(model)}
    shapes = {n: list(linear_weight(lin).shape) for n, lin in iter_linears(model)}
    ident = {"name": name, "model_type": config.get("model_type"), "config": config,
             "config_sha256": _sha256(config),
             "weights_sha256": _sha256([[n, shapes[n], probes[n]] for n in probes])}
    return ident, probes
