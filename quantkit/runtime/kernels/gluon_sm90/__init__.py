"""Gluon kernels for Hopper (sm_90): wgmma and warp-specialized GEMMs for LiquidQuant W4A8, W4A16 and W8A8."""
