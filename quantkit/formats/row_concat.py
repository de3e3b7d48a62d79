"""Stacking the output rows of packed weights of one layout into one packed weight — what fusing sibling
projections (q/k/v, gate/up: :mod:`quantkit.runtime.fused_siblings`) needs at load, without unpacking.

A layout can be stacked when its module declares ``ROW_AXES``: for each tensor the axis that indexes output rows,
every row packed on its own (``None``: one tensor shared by all rows, such as the reference layout's ``g_idx``,
which must then be equal). The GPU kernel layouts and ``reference`` do; GPTQ and AWQ pack codes or zero points of
several rows into one word, so they do not. Stacking concatenates each tensor along its row axis; the metadata
must agree except ``out_features``, which becomes the sum. The result is exactly what packing the row-stacked
record gives (tests pin it bit for bit for every layout that declares ``ROW_AXES``).
"""

from __future__ import annotations

import torch

from quantkit.formats.registry import get_layout

ROWS_KEY = "out_features"


def row_axes(layout: str) -> dict[str, int | None] | None:
    """The layout's ``ROW_AXES`` (tensor name → axis of output rows, None = shared by all rows), or None when its
    packing mixes rows and it cannot be stacked."""
    return getattr(get_layout(layout), "ROW_AXES", None)


def stack_problem(layout: str, metas: list[dict]) -> str | None:
    """Why weights of ``layout`` with these metadata cannot be stacked (the layout packs rows together, or the
    metadata differ in something besides ``out_features``), or None."""
    if row_axes(layout) is None:
        return f"layout '{layout}' packs several rows into one word"
    first = {k: v for k, v in metas[0].items() if k != ROWS_KEY}
    for meta in metas[1:]:
        other = {k: v for k, v in meta.items() if k != ROWS_KEY}
        if other != first:
            diff = sorted(k for k in set(first) | set(other) if first.get(k) != other.get(k))
            return f"their {layout} metadata differ in {', '.join(diff)}"
    return None


def stack_rows(layout: str, packed: list[tuple[dict[str, torch.Tensor], dict]]) -> tuple[dict[str, torch.Tensor],
                                                                                         dict]:
    """(tensors, meta) of one weight whose output rows are those of ``packed`` [(tensors, meta), …] in order: each
    tensor concatenated along its ``ROW_AXES`` axis, ``out_features`` summed. ValueError when
    :func:`stack_problem` objects, the weights hold different tensors, or a shared tensor differs."""
    if not packed:
        raise ValueError("nothing to stack")
    problem = stack_problem(layout, [meta for _, meta in packed])
    if problem is not None:
        raise ValueError(f"cannot stack these weights: {problem}")
    axes = row_axes(layout)
    names = set(packed[0][0])
    if any(set(t) != names for t, _ in packed) or not names <= set(axes):
        raise ValueError(f"cannot stack these {layout} weights: they hold different tensors "
                         f"({sorted(names)} vs {sorted(set().union(*(t for t, _ in packed)))})")
    out: dict[str, torch.Tensor] = {}
    for name in packed[0][0]:
        parts = [t[name] for t, _ in packed]
        if axes[name] is None:
            if any(not torch.equal(p, parts[0]) for p in parts[1:]):
                raise ValueError(f"cannot stack these {layout} weights: their shared tensor '{name}' differs")
            out[name] = parts[0]
        else:
            out[name] = torch.cat(parts, dim=axes[name]).contiguous()
    meta = dict(packed[0][1])
    meta[ROWS_KEY] = sum(int(m[ROWS_KEY]) for _, m in packed)
    return out, meta
