"""Sibling projections fused into one GEMM at load: q/k/v of an attention block and gate/up of an MLP read one
input, so their packed rows are stacked into one QuantLinear (``qkv_proj``, ``gate_up_proj`` — as vLLM's
QKVParallelLinear / MergedColumnParallelLinear and AutoAWQ's fused modules hold them) that runs once per parent
call; each projection becomes a :class:`SiblingSlice` returning its columns of that output.

Why: a decode step then launches 2 GEMMs instead of 5 per decoder layer, and the 1024-row k/v projections of a
Llama-3-8B layer — too few row tiles to fill an H100, the shape where the 4-bit kernels trail cuBLAS most
(docs/BENCHMARKS.md) — run inside the 6144-row GEMM the bench's Llama-3.1-8B preset times; gate/up run as the
preset's 28672-row GEMM. The activation is quantized once for all of them (MixLLM Sec. 3.4, carried one level up,
as :mod:`quantkit.runtime.sibling_inputs` does for unfused siblings).

The fused output is computed by the first sibling called in a parent call and reused by the others through the
parent's :class:`~quantkit.runtime.sibling_inputs.SiblingScope` — only for the very same, unchanged input tensor,
each output handed out once (:meth:`FusedGroup.output`); a sibling called with another input, a second time, or
outside a parent call (a parent whose forward hooks do not run) computes the fused GEMM again and takes its own
columns, which is correct and costs the other siblings' rows.

Memory: loading stacks one group at a time and frees its unfused tensors before the next. At run time an output
is held only until its sibling takes it. On the kernel paths the outputs are column views of one [M, N_fused]
tensor, so a view kept (the KV cache's values, for a transformers that stores them by reference — before 4.56,
hence the requirement) keeps all of it. The loaded model's module tree and ``state_dict`` names differ from the
checkpoint's (``self_attn.qkv_proj.qweight``, no ``q_proj.qweight``; the files are unchanged).

Which siblings fuse (:func:`sibling_groups`, also used on a manifest to report the shapes a loaded model runs):
the largest subset (at least two) of the projections of one :data:`SIBLING_SETS` entry present in one parent that
have the same input width, all or none a bias, and per bit-width the same layout whose rows stack
(:func:`quantkit.formats.row_concat.stack_problem`: GPTQ/AWQ layouts do not) with metadata equal but for the row
count. Mixed-precision siblings (MixLLM Sec. 3.4) fuse per partition: the fused ``part4`` holds every sibling's
4-bit rows, with their output indices offset by the rows before them.

Numerics: on the torch reference path a fused linear multiplies each projection's rows on its own
(:attr:`QuantLinear.row_blocks`), so fusing changes no bit there (fake-quant parity holds); the GPU kernels compute
the same quantized products, possibly in another accumulation order (another tile or split-K choice for the
larger N).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import combinations

import torch
import torch.nn as nn

from quantkit.formats.row_concat import row_axes, stack_problem, stack_rows
from quantkit.runtime.quant_linear import PackedPart, QuantLinear
from quantkit.runtime.sibling_inputs import SiblingScope, scope_of

# projections that read the same input in the supported architectures (llama, mistral, qwen2, qwen3), in the
# order their outputs are stacked
SIBLING_SETS: tuple[tuple[str, ...], ...] = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
ENV_SWITCH = "QUANTKIT_FUSE"  # "0": load_packed keeps every projection its own GEMM


@dataclass
class LinearSpec:
    """What decides whether linears can be fused: widths, bias, activation quantization, and per partition (bits,
    layout, metadata, the tensors its layout shares by all rows — ``ROW_AXES`` None, such as ``g_idx`` — as
    tensors or, read from a manifest, their sha256)."""

    in_features: int
    out_features: int
    has_bias: bool
    parts: list[tuple[int, str, dict, dict]]
    act: object = None


def _shared_names(layout: str) -> list[str]:
    axes = row_axes(layout) or {}
    return [name for name, axis in axes.items() if axis is None]


def spec_of_entry(entry: dict, tensors: dict | None = None, act: dict | None = None) -> LinearSpec:
    """The :class:`LinearSpec` of a manifest ``linears`` entry (docs/checkpoint-format.md); ``tensors`` the
    manifest's ``tensors`` table (for the sha256 of shared tensors), ``act`` its ``activation`` entry."""
    parts = []
    for p in entry["partitions"]:
        names = p.get("tensors", {})
        shared = {n: (tensors or {}).get(names[n], {}).get("sha256") for n in _shared_names(p["layout"]) if n in names}
        parts.append((int(p["bits"]), p["layout"], p.get("meta", {}), shared))
    return LinearSpec(int(entry["in_features"]), int(entry["out_features"]), bool(entry.get("bias")), parts, act)


def spec_of_linear(linear: QuantLinear) -> LinearSpec:
    """The :class:`LinearSpec` of a loaded QuantLinear."""
    parts = []
    for holder, layout, meta, bits in linear._parts:
        held = linear._tensors(holder)
        parts.append((bits, layout, meta, {n: held[n] for n in _shared_names(layout) if n in held}))
    return LinearSpec(linear.in_features, linear.out_features, linear.bias is not None, parts, linear.act)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a, b.to(a.device)))
    return a == b


def fusion_problem(specs: list[LinearSpec]) -> str | None:
    """Why these linears cannot be stacked into one (module docstring), or None."""
    first = specs[0]
    if any(s.in_features != first.in_features for s in specs):
        return "their input widths differ"
    if any(s.has_bias != first.has_bias for s in specs):
        return "some have a bias and some do not"
    if any(s.act != first.act for s in specs):
        return "their activation quantization differs"
    by_bits: dict[int, list[tuple[str, dict, dict]]] = {}
    for s in specs:
        for bits, layout, meta, shared in s.parts:
            by_bits.setdefault(bits, []).append((layout, meta, shared))
    for bits, items in by_bits.items():
        layouts = {layout for layout, _, _ in items}
        if len(layouts) > 1:
            return f"their {bits}-bit rows use different layouts ({', '.join(sorted(layouts))})"
        problem = stack_problem(items[0][0], [meta for _, meta, _ in items])
        if problem is not None:
            return problem
        first_shared = items[0][2]
        for _, _, shared in items[1:]:
            diff = sorted(n for n in set(first_shared) | set(shared)
                          if not _same(first_shared.get(n), shared.get(n)))
            if diff:
                return f"their {bits}-bit rows do not share one {', '.join(diff)}"
    return None


def sibling_groups(names: Iterable[str], spec: Callable[[str], LinearSpec]) -> list[tuple[str, list[str]]]:
    """(parent name, the full names of the projections to fuse, in :data:`SIBLING_SETS` order) per sibling set
    present in a parent among the quantized linears ``names``: its largest subset of at least two that
    :func:`fusion_problem` accepts (the first in set order among equals), if any."""
    by_parent: dict[str, set[str]] = {}
    for name in names:
        parent, _, short = name.rpartition(".")
        by_parent.setdefault(parent, set()).add(short)
    groups = []
    for parent, shorts in by_parent.items():
        for siblings in SIBLING_SETS:
            present = [f"{parent}.{s}" if parent else s for s in siblings if s in shorts]
            for size in range(len(present), 1, -1):  # the largest subset that stacks (the first in set order)
                fit = next((list(c) for c in combinations(present, size)
                            if fusion_problem([spec(n) for n in c]) is None), None)
                if fit is not None:
                    groups.append((parent, fit))
                    break
    return groups


def fused_name(shorts: list[str]) -> str:
    """The fused module's name: ``qkv_proj`` for q/k/v_proj, ``gate_up_proj`` for gate/up_proj (vLLM's names)."""
    if all(s.endswith("_proj") for s in shorts):
        stems = [s[: -len("_proj")] for s in shorts]
        return ("" if all(len(t) == 1 for t in stems) else "_").join(stems) + "_proj"
    return "_".join(shorts)


def stack_linears(members: list[QuantLinear]) -> QuantLinear:
    """One QuantLinear whose output rows are the members' in order (:func:`fusion_problem` must accept them):
    per bit-width the partitions' packed tensors stacked (:func:`quantkit.formats.row_concat.stack_rows`) and their
    output rows offset; biases concatenated; ``row_blocks`` the members' widths."""
    problem = fusion_problem([spec_of_linear(m) for m in members])
    if problem is not None:
        raise ValueError(f"cannot fuse these projections: {problem}")
    grouped: dict[int, tuple[str, list]] = {}
    offset = 0
    for m in members:
        for holder, layout, meta, bits in m._parts:
            local = m._holder(holder).rows.long() if holder else torch.arange(m.out_features)
            rows = local.to(torch.int64).cpu() + offset
            grouped.setdefault(bits, (layout, []))[1].append((m._tensors(holder), meta, rows))
        offset += m.out_features
    parts = []
    for bits in sorted(grouped):
        layout, items = grouped[bits]
        tensors, meta = stack_rows(layout, [(t, meta) for t, meta, _ in items])
        rows = torch.cat([r for _, _, r in items])
        parts.append(PackedPart(layout, meta, tensors, rows.to(torch.int32), bits))
    if len(parts) == 1 and torch.equal(parts[0].rows.long(), torch.arange(offset)):
        parts[0].rows = None  # one bit-width over every row in order: an ordinary linear
    device = next(iter(parts[0].tensors.values())).device
    for p in parts:
        if p.rows is not None:
            p.rows = p.rows.to(device)
    bias = None if members[0].bias is None else torch.cat([m.bias for m in members])
    fused = QuantLinear(members[0].in_features, offset, parts, bias, members[0].act, members[0].cache_dense)
    fused.row_blocks = tuple(m.out_features for m in members)
    return fused


class _Handout:
    """The outputs of one fused GEMM, each handed out once: the memo keeps only those not yet taken."""

    def __init__(self, outputs: list[torch.Tensor]):
        self.outputs: list[torch.Tensor | None] = list(outputs)

    def take(self, index: int) -> torch.Tensor | None:
        out, self.outputs[index] = self.outputs[index], None
        return out

    def empty(self) -> bool:
        return all(o is None for o in self.outputs)


class FusedGroup:
    """The fused GEMM of one parent's siblings and the scope that lets them share its output within one call."""

    def __init__(self, linear: QuantLinear, scope: SiblingScope, slot: str):
        self.linear = linear  # registered on the parent (once), not on the slices
        self.scope = scope
        self.slot = slot

    def output(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """Sibling ``index``'s output for ``x`` [..., K] (:meth:`QuantLinear.forward_blocks`): taken from the
        fused GEMM a sibling ran on this very tensor in this parent call (:meth:`SiblingScope.recall`), each
        output handed out once — the memo lets go of it then, and of the GEMM once all are taken, so nothing
        outlives its unfused lifetime; a sibling asking twice gets a fresh product (never a tensor it may have
        changed in place)."""
        handout = self.scope.recall(self.slot, x, (), lambda: _Handout(self.linear.forward_blocks(x)))
        out = handout.take(index)
        if handout.empty():
            self.scope.forget(self.slot)
        return out if out is not None else self.linear.forward_blocks(x)[index]


class SiblingSlice(nn.Module):
    """Stands in for one fused projection: output ``index`` of its :class:`FusedGroup`, rows [start, stop) of the
    fused linear."""

    def __init__(self, group: FusedGroup, index: int, start: int, stop: int):
        super().__init__()
        self.group = group
        self.index = int(index)  # which of the group's outputs
        self.start, self.stop = int(start), int(stop)
        self.in_features = group.linear.in_features
        self.out_features = self.stop - self.start

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """y [..., out_features]: this projection's output (a column view of the fused GEMM's on the kernel paths)."""
        return self.group.output(x, self.index)

    @property
    def bias(self) -> torch.Tensor | None:
        """This projection's part of the fused bias (None without one)."""
        b = self.group.linear.bias
        return None if b is None else b[self.start:self.stop]

    def dense_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """This projection's dequantized Ŵ [out_features, K] (its rows of the fused linear's)."""
        return self.group.linear.dense_weight(dtype)[self.start:self.stop]

    def extra_repr(self) -> str:
        return f"{self.group.slot}[{self.start}:{self.stop}], in_features={self.in_features}"


def fuse_sibling_projections(model: nn.Module) -> int:
    """Replace every group of :func:`sibling_groups` among the model's QuantLinear modules by one fused QuantLinear
    on the parent (:func:`fused_name`) and a :class:`SiblingSlice` per projection. Returns the number of groups
    fused (0 on a second call: slices are not QuantLinear)."""
    linears = {n: m for n, m in model.named_modules() if isinstance(m, QuantLinear) and m.row_blocks is None}
    fused = 0
    specs = {n: spec_of_linear(m) for n, m in linears.items()}
    for parent_name, names in sibling_groups(list(linears), specs.__getitem__):
        parent = model.get_submodule(parent_name) if parent_name else model
        shorts = [n.rpartition(".")[2] for n in names]
        name = fused_name(shorts)
        while hasattr(parent, name):
            name += "_fused"
        # popped, so a group's unfused tensors are freed as soon as it is fused: one stacked copy at a time
        members = [linears.pop(n) for n in names]
        linear = stack_linears(members)
        parent.add_module(name, linear)
        group = FusedGroup(linear, scope_of(parent), name)
        start = 0
        for index, (short, m) in enumerate(zip(shorts, members)):
            setattr(parent, short, SiblingSlice(group, index, start, start + m.out_features))
            start += m.out_features
        del members, m, linear, group  # the next group is stacked with none of this one's tensors held here
        fused += 1
    return fused


def share_sibling_inputs(model: nn.Module) -> int:
    """Give every module with >= 2 direct QuantLinear children that quantize activations its :func:`scope_of`
    (the children's ``sibling_scope``); fused GEMMs of sibling projections are skipped (they quantize once
    anyway). Returns how many parents got one; calling it again adds nothing."""
    added = 0
    for parent in model.modules():
        children = [c for c in parent.children()
                    if isinstance(c, QuantLinear) and c.act is not None and c.row_blocks is None]
        if len(children) < 2 or any(c.sibling_scope is not None for c in children):
            continue
        scope = scope_of(parent)
        for c in children:
            c.sibling_scope = scope
        added += 1
    return added
