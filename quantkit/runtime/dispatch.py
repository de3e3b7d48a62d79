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
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

KernelFn = Callable[[torch.Tensor, Mapping[str, torch.Tensor], dict, "ActQuant | None"], torch.Tensor]


@dataclass(frozen=True)
class ActQuant:
    """Activation quantization of a recipe (MixLLM Sec. 3.1.2: A8 symmetric, group-wise or per token)."""

    bits: int
    group_size: int
    sym: bool = True

    def to_dict(self) -> dict:
        """The manifest's ``activation`` entry."""
        return {"bits": self.bits, "group_size": self.group_size, "sym": self.sym}


@dataclass(frozen=True)
class Kernel:
    """A registered kernel: the callable, the device types it runs on, whether it quantizes activations."""

    layout: str
    fn: KernelFn
    devices: tuple[str, ...]
    quantizes_activations: bool


_KERNELS: dict[tuple[str, str], Kernel] = {}
ENV_SWITCH = "QUANTKIT_KERNELS"  # "0": every QuantLinear runs the torch reference (exact fake-quant parity)
_LOADED: bool | None = None  # None: the kernel package was not imported yet


def register(layout: str, fn: KernelFn, *, quantizes_activations: bool = False,
             devices: tuple[str, ...] = ("cuda",)) -> Kernel:
    """Make ``fn`` the kernel of ``layout`` on each device type in ``devices`` (a later registration replaces an
    earlier one, so a faster kernel can take over a layout)."""
    kernel = Kernel(layout, fn, tuple(devices), bool(quantizes_activations))
    for dev in kernel.devices:
        _KERNELS[(layout, dev)] = kernel
    return kernel


def unregister(layout: str, devices: tuple[str, ...] = ("cuda",)) -> None:
    """Remove the kernels of ``layout`` on ``devices`` (QuantLinear falls back to the torch reference)."""
    for dev in devices:
        _KERNELS.pop((layout, dev), None)


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


def kernel_for(layout: str, device: torch.device | str) -> Kernel | None:
    """The kernel registered for ``layout`` on the device type of ``device``, or None (→ torch reference;
    always None with the environment variable QUANTKIT_KERNELS=0). The kernel package is imported on the first
    lookup for a non-CPU device (CPU runs never import triton)."""
    if os.environ.get(ENV_SWITCH) == "0":
        return None
    dev = torch.device(device).type
    if dev != "cpu":
        load_kernel_modules()
    return _KERNELS.get((layout, dev))


def registered() -> dict[tuple[str, str], Kernel]:
    """A copy of the registry, (layout, device type) → Kernel, after loading the kernel package."""
    load_kernel_modules()
    return dict(_KERNELS)
