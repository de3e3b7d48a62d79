"""On-disk / in-kernel weight layouts: one module per layout, each a bit-exact pack()/unpack() pair over a
QuantizedWeight, looked up by name through :mod:`quantkit.formats.registry`. docs/formats.md draws each layout."""

from quantkit.formats.registry import get_layout, known_layouts, layouts_for, register_layout

__all__ = ["get_layout", "known_layouts", "layouts_for", "register_layout"]
