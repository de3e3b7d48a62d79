"""Shipped quantization recipes (YAML), installed as quantkit.recipes."""
