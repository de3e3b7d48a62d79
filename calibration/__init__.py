"""Shipped public-domain calibration/evaluation corpus (see README.md in this folder)."""
