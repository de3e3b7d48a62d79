"""Layout name → layout module. A layout module exposes ``NAME``, ``supports(qw) -> str | None``,
``layout_meta(qw) -> dict``, ``pack(qw) -> dict[str, Tensor]`` and ``unpack(tensors, meta) -> QuantizedWeight``
(engine-facing layouts also ``quantization_config(metas) -> dict``). Modules are imported on first use so a
kernel layout's optional dependencies are only needed by those who ask for it."""

from __future__ import annotations

import importlib
from types import ModuleType

from quantkit.errors import QuantkitError
from quantkit.quant.records import QuantizedWeight

# name → module path; the GPU kernel layouts (w4a16, w4a8-lqq, w8, fp8) register here next to their modules
_LAYOUTS: dict[str, str] = {
    "reference": "quantkit.formats.reference",
    "gptq": "quantkit.formats.gptq",
    "gptq_v2": "quantkit.formats.gptq_v2",
    "awq": "quantkit.formats.awq",
    "w4a16": "quantkit.formats.w4a16",
    "w4a8-lqq": "quantkit.formats.w4a8_lqq",
    "w8": "quantkit.formats.w8",
    "fp8": "quantkit.formats.fp8",
}

REQUIRED = ("NAME", "supports", "layout_meta", "pack", "unpack")


def known_layouts() -> list[str]:
    """Registered layout names, sorted."""
    return sorted(_LAYOUTS)


def register_layout(name: str, module_path: str) -> None:
    """Make ``get_layout(name)`` import ``module_path``; refuses to rebind a name to another module."""
    if _LAYOUTS.get(name, module_path) != module_path:
        raise ValueError(f"layout '{name}' is already registered to {_LAYOUTS[name]}")
    _LAYOUTS[name] = module_path


def get_layout(name: str) -> ModuleType:
    """The layout module registered as ``name``; QuantkitError listing the known names when there is none."""
    if name not in _LAYOUTS:
        raise QuantkitError(f"unknown weight layout '{name}'; known layouts: {', '.join(known_layouts())}")
    module = importlib.import_module(_LAYOUTS[name])
    missing = [attr for attr in REQUIRED if not hasattr(module, attr)]
    if missing or module.NAME != name:
        raise TypeError(f"module {_LAYOUTS[name]} is not a layout '{name}' (missing {missing}, NAME={module.NAME!r})")
    return module


def layouts_for(qw: QuantizedWeight) -> dict[str, str | None]:
    """Every known layout → None if it can hold ``qw``, else its reason (what `quantkit pack` shows a user
    choosing a layout)."""
    return {name: get_layout(name).supports(qw) for name in known_layouts()}
