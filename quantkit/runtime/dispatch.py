"""Kernel dispatch: layout name → the GEMM kernel that reads that layout's packed tensors directly.

:class:`quantkit.runtime.quant_linear.QuantLinear` asks :func:`kernel_for` before every forward; with no kernel
registered for its layout and device it runs the torch reference (unpack → dequantize → matmul). Kernel modules
(``quantkit/runtime/kernels/``) register themselves when that package is imported (on the first lookup for a GPU
device)::

    from quantkit.runtime import dispatch
    dispatch.register("w4a16", w4a16_matmul)                          # fp16 activations
    dispatch.register("w4a8-lqq", w4a8_matmul, quantizes_activations=True)

A kernel is called as ``fn(x, tensors, meta, act)``: ``x`` [M, K] activations in the compute dtype, ``tensors``
the layout's packed tensors by layout name (``qweight``, ``scales`` …, on x's device), ``meta`` the layout
metadata from the manifest, ``act`` the :class:`ActQuant` of the recipe or None. It returns y [M, N_part] = x·Ŵᵀ
without bias. A kernel registered with ``quantizes_activations=True`` receives raw activations and applies
``act`` itself (integer A8 tensor-core paths, MixLLM Sec. 3.3 / LiquidGEMM Sec. 5); otherwise QuantLinear passes
activations already fake-quantized with ``act`` (so every path computes the same quantized product).

Every forward quantizes its activation at most once per form (MixLLM Sec. 3.4: one activation for all partitions
of a mixed-precision layer): QuantLinear wraps its input in a :class:`SharedActivation` that computes each form
(fake-quant, the kernels' int8 codes + scales …) on first use. A kernel registered with
``shared_activation=True`` is called as ``fn(x, tensors, meta, act, shared=shared)`` and takes its quantized
activations from ``shared``, so the partitions of one layer reuse them.

A mixed-precision layer can also run as one launch: :func:`register_mixed` installs a kernel called as
``fn(x, parts, out_features, act, shared=shared)`` with ``parts`` a list of ``(layout, tensors, meta, rows)``
(``rows`` int32 output indices); it returns y [M, out_features] without bias. :func:`mixed_kernel_for` offers
it only when its ``supports(layouts, act)`` accepts the layer; otherwise QuantLinear runs one sub-GEMM per
partition.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from quantkit.quant.act import quantize_activation

KernelFn = Callable[[torch.Tensor, Mapping[str, torch.Tensor], dict, "ActQuant | None"], torch.Tensor]


@dataclass(frozen=True)
class ActQuant:
    """Activation quantization of a recipe (MixLLM Sec. 3.1.2: A8 symmetric, group-wise or per token)."""

    bits: int
    group_size: int
    sym: bool = True
    fp8: bool = False  # dynamic E4M3 (quantkit.quant.act.quantize_activation_fp8) instead of int8

    def to_dict(self) -> dict:
        """The manifest's ``activation`` entry."""
        d = {"bits": self.bits, "group_size": self.group_size, "sym": self.sym}
        if self.fp8:
            d["fp8"] = True
        return d


FAKE_FORM = "fake"  # SharedActivation's name of the fake-quantized input
A8_FORM = "a8"  # ... of the int8 kernels' (codes int8 [M, K], scales float32 [M, G])


class SharedActivation:
    """One forward's input x [M, K] and its quantization ``act``, with each quantized form computed on first use
    and reused by every partition of the layer (MixLLM Sec. 3.4: the activation is quantized once). A path that
    quantized x in one form can :meth:`offer` how to derive another from its result (the fake-quant tensor from
    int8 codes and scales), so a layer needing both forms still quantizes once."""

    def __init__(self, x: torch.Tensor, act: ActQuant | None):
        self.x = x
        self.act = act
        self._forms: dict[str, object] = {}
        self._offers: dict[str, Callable[[], object]] = {}

    def adopt(self, other: SharedActivation) -> None:
        """Share ``other``'s forms and offers from now on (both see what either computes): ``other`` quantized
        the same input with the same ``act`` (quantkit.runtime.sibling_inputs)."""
        if other.act != self.act:
            raise ValueError(f"cannot share activation forms quantized with {other.act} as {self.act}")
        self._forms, self._offers = other._forms, other._offers

    def form(self, name: str, compute: Callable[[torch.Tensor, ActQuant | None], object]) -> object:
        """Form ``name``: on the first request derived from an :meth:`offer` if there is one, else
        ``compute(x, act)``; cached for the later requests."""
        if name not in self._forms:
            derive = self._offers.pop(name, None)
            self._forms[name] = derive() if derive is not None else compute(self.x, self.act)
        return self._forms[name]

    def provide(self, name: str, value: object) -> None:
        """Form ``name`` is ``value`` (computed elsewhere from this very x — a norm kernel that quantized its output,
        :mod:`quantkit.runtime.fused_norm`); it must be exactly what ``compute`` would give."""
        self._forms.setdefault(name, value)

    def offer(self, name: str, derive: Callable[[], object]) -> None:
        """Register ``derive()`` as the way to obtain form ``name`` if it is requested later; it must give the
        very values ``compute`` would."""
        if name not in self._forms:
            self._offers.setdefault(name, derive)

    def fake_quant(self) -> torch.Tensor:
        """x quantized and dequantized with ``act`` (:func:`quantkit.quant.act.quantize_activation`, MixLLM
        Sec. 3.1.2), x itself without activation quantization."""
        if self.act is None:
            return self.x
        return self.form(FAKE_FORM, lambda x, a: quantize_activation(x, a.bits, a.group_size, a.sym, a.fp8))

    def computed(self) -> list[str]:
        """Names of the forms obtained so far, in order (which quantizations this forward has run)."""
        return list(self._forms)


@dataclass(frozen=True)
class Kernel:
    """A registered kernel: the callable, the device types it runs on, whether it quantizes activations, whether
    it takes the forward's :class:`SharedActivation` (keyword ``shared``)."""

    layout: str
    fn: KernelFn
    devices: tuple[str, ...]
    quantizes_activations: bool
    shared_activation: bool = False
    bind: Callable | None = None  # bind(x, tensors, meta, act, shared) -> f(x, shared) -> y | None, or None
    selection: Callable[[], object] | None = None  # what the choice bind made depends on besides the call


MixedFn = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class MixedKernel:
    """A one-launch kernel for a layer's partitions (module docstring): the callable, the predicate
    ``supports(layouts, act)`` saying which layers it can run, the device types it runs on, and optionally the
    prepared form of :func:`register`'s ``bind`` (here ``bind(x, parts, out_features, act, shared)``) with its
    ``selection``."""

    fn: MixedFn
    supports: Callable[[tuple[str, ...], ActQuant | None], bool]
    devices: tuple[str, ...]
    bind: Callable | None = None
    selection: Callable[[], object] | None = None


_KERNELS: dict[tuple[str, str], Kernel] = {}
_MIXED: dict[str, MixedKernel] = {}
_NORMS: dict[str, Callable] = {}
ENV_SWITCH = "QUANTKIT_KERNELS"  # "0": every QuantLinear runs the torch reference (exact fake-quant parity)
_LOADED: bool | None = None  # None: the kernel package was not imported yet


def register(layout: str, fn: KernelFn, *, quantizes_activations: bool = False, shared_activation: bool = False,
             devices: tuple[str, ...] = ("cuda",), bind: Callable | None = None,
             selection: Callable[[], object] | None = None) -> Kernel:
    """Make ``fn`` the kernel of ``layout`` on each device type in ``devices`` (a later registration replaces an
    earlier one, so a faster kernel can take over a layout). ``shared_activation``: ``fn`` accepts the keyword
    ``shared`` (a :class:`SharedActivation`) and takes its quantized activations from there.

    ``bind(x, tensors, meta, act, shared)``, where given, makes the choice ``fn`` would make for this layer and
    token count once: it returns ``f(x, shared) -> y`` that a QuantLinear calls for its later inputs of the same
    token count and dtype instead of ``fn`` (None from ``f``: ``fn`` serves that call), or None where ``fn``
    should always serve. ``selection()`` returns what that choice depends on besides the call (overrides, tuned
    tables); a layer binds again when it changes."""
    kernel = Kernel(layout, fn, tuple(devices), bool(quantizes_activations), bool(shared_activation), bind,
                    selection)
    for dev in kernel.devices:
        _KERNELS[(layout, dev)] = kernel
    return kernel


def unregister(layout: str, devices: tuple[str, ...] = ("cuda",)) -> None:
    """Remove the kernels of ``layout`` on ``devices`` (QuantLinear falls back to the torch reference)."""
    for dev in devices:
        _KERNELS.pop((layout, dev), None)


def register_mixed(fn: MixedFn, supports: Callable[[tuple[str, ...], ActQuant | None], bool], *,
                   devices: tuple[str, ...] = ("cuda",), bind: Callable | None = None,
                   selection: Callable[[], object] | None = None) -> MixedKernel:
    """Make ``fn`` the one-launch kernel of mixed-precision layers on each device type in ``devices``, for the
    layers whose (partition layouts, activation quantization) ``supports`` accepts (MixLLM Sec. 3.4). ``bind`` and
    ``selection`` as for :func:`register`, with ``bind(x, parts, out_features, act, shared)``."""
    kernel = MixedKernel(fn, supports, tuple(devices), bind, selection)
    for dev in kernel.devices:
        _MIXED[dev] = kernel
    return kernel


def unregister_mixed(devices: tuple[str, ...] = ("cuda",)) -> None:
    """Remove the one-launch mixed kernel on ``devices`` (mixed layers run one sub-GEMM per partition)."""
    for dev in devices:
        _MIXED.pop(dev, None)


def register_norm(fn: Callable, *, devices: tuple[str, ...] = ("cuda",)) -> None:
    """Make ``fn(x [M, K], weight [K], eps, act) -> (y, codes | None, scales | None)`` the RMSNorm kernel on
    ``devices``: y the normalized rows, codes and scales the A8 form of y for ``act`` when it can make it
    (:mod:`quantkit.runtime.fused_norm`)."""
    for dev in devices:
        _NORMS[dev] = fn


def norm_kernel_for(device: torch.device | str) -> Callable | None:
    """The RMSNorm kernel registered for the device type of ``device``, or None (QUANTKIT_KERNELS=0 included)."""
    dev = _device_type(device)
    return None if dev is None else _NORMS.get(dev)


def load_kernel_modules() -> bool:
    """Import quantkit.runtime.kernels once so its modules register their kernels; returns whether they loaded.
    Kernels are optional (they need triton and a GPU): when the package cannot be imported, a warning names the
    reason and every layout runs the torch reference."""
    global _LOADED
    if _LOADED is None:
        try:
            importlib.import_module("quantkit.runtime.kernels")
            _LOADED = True
        except ImportError as e:
            warnings.warn(f"quantkit GPU kernels are unavailable ({e}); QuantLinear uses the torch reference",
                          RuntimeWarning, stacklevel=2)
            _LOADED = False
    return _LOADED


def _device_type(device: torch.device | str) -> str | None:
    """The device type to look kernels up for, None when QUANTKIT_KERNELS=0; imports the kernel package on the
    first lookup for a non-CPU device (CPU runs never import triton)."""
    if os.environ.get(ENV_SWITCH) == "0":
        return None
    dev = torch.device(device).type
    if dev != "cpu":
        load_kernel_modules()
    return dev


def kernel_for(layout: str, device: torch.device | str) -> Kernel | None:
    """The kernel registered for ``layout`` on the device type of ``device``, or None (→ torch reference;
    always None with the environment variable QUANTKIT_KERNELS=0)."""
    dev = _device_type(device)
    return None if dev is None else _KERNELS.get((layout, dev))


def mixed_kernel_for(layouts: tuple[str, ...], act: ActQuant | None,
                     device: torch.device | str) -> MixedKernel | None:
    """The one-launch kernel for a mixed-precision layer with partitions in ``layouts`` and activation
    quantization ``act`` on ``device``, or None when none is registered, it does not support the layer, or
    QUANTKIT_KERNELS=0 (→ one sub-GEMM per partition)."""
    dev = _device_type(device)
    kernel = None if dev is None else _MIXED.get(dev)
    if kernel is None or not kernel.supports(tuple(layouts), act):
        return None
    return kernel


def registered() -> dict[tuple[str, str], Kernel]:
    """A copy of the registry, (layout, device type) → Kernel, after loading the kernel package."""
    load_kernel_modules()
    return dict(_KERNELS)


def registered_mixed() -> dict[str, MixedKernel]:
    """A copy of the one-launch mixed registry, device type → MixedKernel, after loading the kernel package."""
    load_kernel_modules()
    return dict(_MIXED)
