"""QuantLinear: an nn.Linear replacement that holds packed weights, optionally split into output-channel
partitions of different bit-widths (MixLLM Sec. 3.4: each partition is an ordinary quantized sub-matrix whose
results scatter to their output columns).

Buffers are named as in the checkpoint: a linear with one partition holds the layout's tensors directly
(``qweight``, ``scales`` …, so its state_dict keys are ``<linear>.qweight`` …); a mixed-precision linear holds one
child module ``part{bits}`` per partition with the layout's tensors and ``rows`` (int32 output indices).

Forward: the input is wrapped in a :class:`~quantkit.runtime.dispatch.SharedActivation`, so the activation is
quantized lazily — only by the path that needs it — and at most once per form whichever partitions share it:
fake-quant (:func:`quantkit.quant.act.quantize_activation`, the same computation as the fake-quant pre-hooks)
for the torch reference and for kernels that take quantized activations, the kernels' own int8 codes for those
that quantize themselves. Projections that read one input (q/k/v, gate/up) are stacked into one QuantLinear at
load (:mod:`quantkit.runtime.fused_siblings`; ``row_blocks`` holds their widths and :meth:`QuantLinear.forward_blocks`
their outputs); where they cannot be, they share these forms within one call of their parent module through a
:class:`~quantkit.runtime.sibling_inputs.SiblingScope` the checkpoint reader gave them.
Paths, first that applies (:mod:`quantkit.runtime.dispatch` on the input's device):

* a mixed-precision linear whose partitions the registered one-launch mixed kernel supports → that kernel
  (MixLLM Sec. 3.4: one activation quantization, each partition's epilogue scattering into its output columns),
  through the launch it prepared for the token count like a single-partition layer's, bias added once after;
* a kernel registered for some partition's layout → every partition runs as its own sub-GEMM (kernel, or torch
  for a partition without one) and its outputs are scattered to its rows; a single-partition layer keeps, per
  token count and dtype, the launch its kernel prepared (``bind`` of :func:`quantkit.runtime.dispatch.register`),
  so a repeated call is a lookup and a launch;
* no kernel → the torch reference: one ``F.linear(x, Ŵ, bias)`` with the dense Ŵ (layouts' unpack →
  dequantize, partition rows scattered into it) — the product fake-quant evaluation computes, so packed and
  fake-quant logits are bit-identical, mixed precision too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn as nn
import torch.nn.functional as F

from quantkit.quant.records import QuantizedWeight
from quantkit.runtime.dispatch import ActQuant, Kernel, MixedKernel, SharedActivation, kernel_for, mixed_kernel_for
from quantkit.runtime.norm_codes import adopt_norm_codes


_UNBOUND = object()  # QuantLinear._launches: no launch prepared for this key yet
MAX_LAUNCHES = 32  # prepared launches a QuantLinear keeps (token counts × dtypes) before it starts again


@dataclass
class PackedPart:
    """One partition as stored: its layout name and metadata, the layout's tensors, the output rows (None = all)."""

    layout: str
    meta: dict
    tensors: dict[str, torch.Tensor]
    rows: torch.Tensor | None = None
    bits: int = 0


class _PartHolder(nn.Module):
    """Container of one partition's buffers inside a mixed-precision QuantLinear (``part{bits}``)."""


def _layout(name: str) -> ModuleType:
    from quantkit.formats.registry import get_layout

    return get_layout(name)


class QuantLinear(nn.Module):
    """y = x·Ŵᵀ + b with Ŵ held packed in one or more layouts (see the module docstring)."""

    def __init__(self, in_features: int, out_features: int, parts: list[PackedPart],
                 bias: torch.Tensor | None = None, act: ActQuant | None = None, cache_dense: bool = True):
        super().__init__()
        if not parts:
            raise ValueError("QuantLinear needs at least one partition")
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.act = act
        self.cache_dense = cache_dense
        self.sibling_scope = None  # a SiblingScope shared with the other projections of one input (sibling_inputs)
        self.input_rotation = None  # quant.rotate.InputRotation: the weight reads x·Q (QuaRot's online rotation)
        # out_features of the projections fused into this linear (fused_siblings), None for an ordinary linear: the
        # torch reference multiplies each block of rows on its own, as the unfused projections did
        self.row_blocks: tuple[int, ...] | None = None
        self._parts: list[tuple[str, str, dict, int]] = []  # (holder name, layout, meta, bits)
        self._dense: dict[str, torch.Tensor] = {}
        self._launches: dict[tuple, object] = {}  # (kernel, M, dtype, device, selection) -> prepared launch or None
        mixed = len(parts) > 1 or parts[0].rows is not None
        covered = 0
        for p in parts:
            holder_name = f"part{p.bits}" if mixed else ""
            holder = self
            if mixed:
                if p.rows is None:
                    raise ValueError("every partition of a mixed-precision linear needs its output rows")
                holder = _PartHolder()
                self.add_module(holder_name, holder)
                holder.register_buffer("rows", p.rows.to(torch.int32))
                covered += p.rows.numel()
            for tname, t in p.tensors.items():
                holder.register_buffer(tname, t)
            self._parts.append((holder_name, p.layout, dict(p.meta), int(p.bits)))
        # a mixed layer's partition holders, whose buffers a prepared launch reads too (_bound_forward); not self: a
        # reference cycle would keep a replaced layer's tensors alive until the garbage collector runs
        self.__dict__["_part_holders"] = tuple(self._holder(h) for h, *_ in self._parts if h)
        if mixed and covered != self.out_features:
            raise ValueError(f"partitions cover {covered} output rows, the linear has {self.out_features}")
        if bias is not None:
            self.register_buffer("bias", bias)
        else:
            self.bias = None

    def _holder(self, name: str) -> nn.Module:
        return getattr(self, name) if name else self

    def _tensors(self, holder_name: str) -> dict[str, torch.Tensor]:
        """The layout's packed tensors of one partition (its buffers minus ``rows`` and the linear's ``bias``)."""
        holder = self._holder(holder_name)
        skip = {"rows"} if holder_name else {"bias"}
        return {n: b for n, b in holder.named_buffers(recurse=False) if n not in skip}

    def quantized_weights(self) -> list[tuple[torch.Tensor | None, QuantizedWeight]]:
        """(output rows or None, the unpacked QuantizedWeight) per partition — the layouts' ``unpack``."""
        out = []
        for holder_name, layout, meta, _ in self._parts:
            qw = _layout(layout).unpack(self._tensors(holder_name), meta)
            rows = self._holder(holder_name).rows.long() if holder_name else None
            out.append((rows, qw))
        return out

    def dense_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The full dequantized Ŵ [N, K] (partitions scattered to their rows), for checks and export."""
        from quantkit.quant.partition import dequantize_record

        out = None
        for rows, qw in self.quantized_weights():
            w = dequantize_record(qw, dtype)
            if rows is None:
                return w
            if out is None:
                out = torch.empty(self.out_features, self.in_features, dtype=dtype, device=w.device)
            out[rows.to(out.device)] = w
        return out

    def _reference_weight(self, holder_name: str | None, dtype: torch.dtype) -> torch.Tensor:
        """Ŵ in ``dtype`` — of the whole linear (``holder_name`` None: partitions' rows scattered into one dense
        matrix) or of one partition — dequantized in fp32 then cast, as fake-quant writes it; cached lazily."""
        from quantkit.quant.partition import dequantize_record

        key = "*" if holder_name is None else holder_name
        cached = self._dense.get(key)
        if cached is not None and cached.dtype == dtype:
            return cached
        if holder_name is None:
            w = self.dense_weight(torch.float32).to(dtype)
        else:
            _, layout, meta, _ = next(p for p in self._parts if p[0] == holder_name)
            w = dequantize_record(_layout(layout).unpack(self._tensors(holder_name), meta), torch.float32).to(dtype)
        if self.cache_dense:
            self._dense[key] = w
        return w

    def clear_cache(self) -> None:
        """Drop the cached dense weights (they are rebuilt lazily on the next reference forward)."""
        self._dense.clear()

    def _apply(self, fn, recurse=True):
        self._dense.clear()  # .to()/.half() move the packed buffers; a cached Ŵ would be stale
        self._forget_launches()  # ... and a prepared launch holds them
        return super()._apply(fn, recurse)

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        if isinstance(value, torch.Tensor) and "_launches" in self.__dict__:
            self._forget_launches()  # a replaced buffer: the prepared launches read the old one

    def register_buffer(self, name: str, tensor: torch.Tensor | None, persistent: bool = True) -> None:
        super().register_buffer(name, tensor, persistent)
        if "_launches" in self.__dict__:
            self._forget_launches()

    def _forget_launches(self) -> None:
        """Drop the prepared launches after the module itself moved or replaced its buffers (not a hook's swap,
        which :meth:`_bound_forward` detects)."""
        if "_launches" in self.__dict__:
            self._launches.clear()
        self.__dict__.pop("_launch_ptrs", None)

    def _bound_forward(self, kernel: Kernel | MixedKernel, shared: SharedActivation,
                       bind: Callable[[], Callable | None]) -> torch.Tensor | None:
        """The product through the launch the kernel prepared for this token count and dtype (``bind`` of
        :func:`quantkit.runtime.dispatch.register` / ``register_mixed``, called as ``bind()`` on the first call and
        kept); None where the kernel prepares none or this call does not fit it (the kernel's entry then runs it)."""
        if torch.compiler.is_compiling():
            return None
        x = shared.x
        if x.is_cuda:
            from quantkit.runtime.kernels.jit import in_graph

            if in_graph():  # a capture or its warm-up: a launch prepared there would outlive the graph's memory
                return None
        # hooks (accelerate's offload) swap buffers in _buffers without going through setattr, and a prepared launch
        # holds the tensors it was made with: addresses that change under it drop the layer's launches for good
        # (keeping them would keep every old copy alive; rebinding each call would cost more than it saves)
        ptrs = tuple(t.data_ptr() for m in (self, *self._part_holders) for t in m._buffers.values() if t is not None)
        last = self.__dict__.get("_launch_ptrs")
        if ptrs != last:
            self._launches.clear()
            self.__dict__["_launch_ptrs"] = ptrs
            if last is not None:
                self.__dict__["_unbindable"] = True
        if self.__dict__.get("_unbindable"):
            return None
        key = (kernel, x.shape[0], x.dtype, x.device, None if kernel.selection is None else kernel.selection())
        run = self._launches.get(key, _UNBOUND)
        if run is _UNBOUND:
            if len(self._launches) >= MAX_LAUNCHES:  # many prompt lengths: keep the cache small
                self._launches.clear()
            run = self._launches[key] = bind()
        return None if run is None else run(x, shared)

    def _kernel_forward(self, kernel: Kernel, shared: SharedActivation, holder_name: str,
                        meta: dict) -> torch.Tensor:
        """One partition's sub-GEMM [M, N_part] through its kernel, in the input's dtype, without bias."""
        tensors = self._tensors(holder_name)
        if not kernel.quantizes_activations:
            y = kernel.fn(shared.fake_quant(), tensors, meta, self.act)
        elif kernel.shared_activation:
            y = kernel.fn(shared.x, tensors, meta, self.act, shared=shared)
        else:
            y = kernel.fn(shared.x, tensors, meta, self.act)
        return y.to(shared.x.dtype)

    def _mixed_parts(self) -> list[tuple[str, dict[str, torch.Tensor], dict, torch.Tensor]]:
        """(layout, tensors, meta, rows int32) per partition, as a one-launch mixed kernel takes them."""
        return [(layout, self._tensors(holder_name), meta, self._holder(holder_name).rows)
                for holder_name, layout, meta, _ in self._parts]

    def _reference_blocks(self, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None) -> list[torch.Tensor]:
        """[x·Ŵᵀ + b] with the dense Ŵ; a fused linear gives one output per projection, each multiplied on its own
        (a GEMM's results can depend on N through its blocking, and the unfused projections — and fake-quant
        evaluation — multiplied each alone, into contiguous outputs), so fusing changes no reference-path bit."""
        if self.row_blocks is None:
            return [F.linear(x, w, bias)]
        outs, start = [], 0
        for n in self.row_blocks:
            outs.append(F.linear(x, w[start:start + n], None if bias is None else bias[start:start + n]))
            start += n
        return outs

    def _on_reference_path(self, device: torch.device) -> bool:
        """Whether a forward on ``device`` runs the torch reference (no one-launch mixed kernel, no partition with
        a kernel)."""
        layouts = tuple(layout for _, layout, _, _ in self._parts)
        if bool(self._parts[0][0]) and mixed_kernel_for(layouts, self.act, device) is not None:
            return False
        return all(kernel_for(layout, device) is None for layout in layouts)

    def forward_blocks(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The outputs of the projections fused into this linear (``row_blocks``), in order: on the torch
        reference path each its own product (bit-identical to the unfused projections), on the kernel paths
        column views of one fused GEMM (one launch, one activation quantization)."""
        blocks = self.row_blocks or (self.out_features,)
        if self._on_reference_path(x.device):
            if self.input_rotation is not None:
                x = self.input_rotation(x)
            shared = SharedActivation(x.reshape(-1, self.in_features), self.act)
            adopt_norm_codes(shared, x)
            bias = None if self.bias is None else self.bias.to(x.dtype)
            return self._reference_blocks(shared.fake_quant().reshape(x.shape),
                                          self._reference_weight(None, x.dtype), bias)
        y = self.forward(x)
        bounds = [0]
        for n in blocks:
            bounds.append(bounds[-1] + n)
        return [y[..., a:b] for a, b in zip(bounds, bounds[1:])]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """y [..., N] = act(x) · Ŵᵀ + b for x [..., K] (module docstring: one-launch mixed kernel, kernels per
        partition, else the dense torch reference); x is first rotated where the weight reads x·Q."""
        if self.input_rotation is not None:
            x = self.input_rotation(x)
        lead = x.shape[:-1]
        x2d = x.reshape(-1, self.in_features)
        scope = self.sibling_scope
        shared = SharedActivation(x2d, self.act) if scope is None else scope.shared(x, x2d, self.act)
        adopt_norm_codes(shared, x)  # the A8 codes a fused RMSNorm made of this very x, if any (fused_norm)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        mixed = bool(self._parts[0][0])
        layouts = tuple(layout for _, layout, _, _ in self._parts)
        one_launch = mixed_kernel_for(layouts, self.act, x.device) if mixed else None
        if one_launch is not None:
            y = None if one_launch.bind is None else self._bound_forward(one_launch, shared, lambda: one_launch.bind(
                shared.x, self._mixed_parts(), self.out_features, self.act, shared))
            if y is None:
                y = one_launch.fn(shared.x, self._mixed_parts(), self.out_features, self.act, shared=shared)
            y = y.to(x.dtype)
            return (y if bias is None else y + bias).reshape(*lead, self.out_features)
        kernels = [kernel_for(layout, x.device) for layout in layouts]
        if all(k is None for k in kernels):
            # torch reference: one GEMM with the dense Ŵ (a mixed linear's partition rows scattered into it, which
            # equals scattering the partitions' outputs) — the very product fake-quant evaluation computes
            outs = self._reference_blocks(shared.fake_quant().reshape(x.shape), self._reference_weight(None, x.dtype),
                                          bias)
            return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
        if not mixed:
            y = None if kernels[0].bind is None else self._bound_forward(kernels[0], shared, lambda: kernels[0].bind(
                shared.x, self._tensors(""), self._parts[0][2], self.act, shared))
            if y is None:
                y = self._kernel_forward(kernels[0], shared, "", self._parts[0][2])
            y = y if bias is None else y + bias
            return y.reshape(*lead, self.out_features)
        # MixLLM Sec. 3.4: each partition is its own sub-GEMM on the shared activation; outputs land on its rows.
        # Kernels that quantize x themselves go first: their int8 codes can stand in for the fake-quant form the
        # others need (SharedActivation.offer), so x is quantized once whatever the order of the partitions.
        y = x.new_empty(shared.x.shape[0], self.out_features)
        order = sorted(zip(self._parts, kernels), key=lambda pk: pk[1] is None or not pk[1].quantizes_activations)
        for (holder_name, _, meta, _), kernel in order:
            rows = self._holder(holder_name).rows.long()
            part_bias = None if bias is None else bias[rows]
            if kernel is None:
                y[:, rows] = F.linear(shared.fake_quant(), self._reference_weight(holder_name, x.dtype), part_bias)
            else:
                out = self._kernel_forward(kernel, shared, holder_name, meta)
                y[:, rows] = out if part_bias is None else out + part_bias
        return y.reshape(*lead, self.out_features)

    def extra_repr(self) -> str:
        parts = ", ".join(f"{layout}:{bits}b" for _, layout, _, bits in self._parts)
        act = f", act=A{self.act.bits}" if self.act else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, parts=[{parts}]{act}, " \
               f"bias={self.bias is not None}"
